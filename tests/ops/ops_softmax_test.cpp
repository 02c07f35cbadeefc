// softmax and log-softmax along every axis, large magnitudes.
#include "ops_reference.hpp"

namespace tpuhal::ops_test {
namespace {

TEST_P(Ops, SoftmaxAndLogSoftmaxAlongEveryAxis) {
  const std::vector<Shape> shapes{{5}, {3, 7}, {2, 3, 4}, {2, 2, 3, 5}};
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const Shape& s : shapes) {
      if (dt != DType::F32 && s.size() > 2) continue;
      const auto rank = static_cast<std::int64_t>(s.size());
      for (std::int64_t axis = -rank; axis < rank; ++axis)
        for (bool lg : {false, true}) {
          const Host x = rand(dt, s, -6, 6);
          const Tensor y = lab().output(dt, s);
          const Host got = lab().run(ops::softmax(lab().upload(x), y, axis, lg), y);
          expect(std::string(lg ? "log_softmax " : "softmax ") + to_string(dt) + " " + dims(s) + " axis " +
                     std::to_string(axis),
                 got, ref_softmax(x, axis, lg, dt));
        }
    }
}

TEST_P(Ops, SoftmaxOfLargeMagnitudesDoesNotOverflow) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const double big = dt == DType::F16 ? 60000 : 1e30;
    Host x(dt, {5, 6});
    const std::vector<std::vector<double>> rows{
        {1000, 1001, 999.5, 1000.25, 990, 1002},           // exp(1000) overflows: only x - max is safe
        {-10000, -10001, -9999, -10000.5, -10003, -9998},  // and exp(-10000) underflows
        {big, -big, 0, big / 2, -big / 2, 1},
        {80, 0, -80, 88.5, 89, 60},
        {0, 0, 0, 0, 0, 0},
    };
    for (std::size_t r = 0; r < rows.size(); ++r)
      for (std::size_t c = 0; c < 6; ++c) x.v[r * 6 + c] = round_to(dt, rows[r][c]);
    for (bool lg : {false, true}) {
      const Tensor y = lab().output(dt, x.shape);
      const Host got = lab().run(ops::softmax(lab().upload(x), y, -1, lg), y);
      for (double v : got.v) EXPECT_FALSE(std::isnan(v)) << (lg ? "log_softmax " : "softmax ") << to_string(dt);
      expect(std::string(lg ? "log_softmax " : "softmax ") + to_string(dt) + " of large magnitudes", got,
             ref_softmax(x, -1, lg, dt));
    }
  }
}

}  // namespace
}  // namespace tpuhal::ops_test
