// cumsum (docs/ops.md, kinds with rules): running sums along every axis,
// exclusive and reversed, in every dtype it takes, from strided views; and
// the builder's refusals.
#include "ops_reference.hpp"

namespace tpuhal::ops_test {
namespace {

// The documented arithmetic: along each line of `axis`, in index order
// (from the end with reverse), floats summed in f32 and each sum rounded to
// the dtype, i32 wrapping.
std::vector<double> ref_cumsum(const Host& x, std::int64_t axis, bool exclusive, bool reverse) {
  const auto rank = static_cast<std::int64_t>(x.shape.size());
  const auto ax = static_cast<std::size_t>(axis < 0 ? axis + rank : axis);
  std::vector<double> y(x.size());
  const std::int64_t len = x.shape[ax];
  std::int64_t inner = 1;
  for (std::size_t d = ax + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
  const std::int64_t outer = len * inner != 0 ? numel(x.shape) / (len * inner) : 0;
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t in = 0; in < inner; ++in) {
      float fsum = 0;
      std::uint32_t isum = 0;
      for (std::int64_t n = 0; n < len; ++n) {
        const std::int64_t i = reverse ? len - 1 - n : n;
        const auto at = static_cast<std::size_t>((o * len + i) * inner + in);
        if (x.dtype == DType::I32) {
          const auto v = static_cast<std::uint32_t>(static_cast<std::int64_t>(x.v[at]));
          if (!exclusive) isum += v;
          y[at] = static_cast<double>(static_cast<std::int32_t>(isum));
          if (exclusive) isum += v;
        } else {
          const auto v = static_cast<float>(x.v[at]);
          if (!exclusive) fsum += v;
          y[at] = round_to(x.dtype, static_cast<double>(fsum));
          if (exclusive) fsum += v;
        }
      }
    }
  return y;
}

TEST_P(Ops, CumsumAlongEveryAxisExclusiveAndReversedInEveryDtype) {
  const std::vector<Shape> shapes{{7}, {3, 5}, {2, 3, 4}, {2, 1, 3, 5}, {4, 0}};
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::I32})
    for (const Shape& s : shapes) {
      const auto rank = static_cast<std::int64_t>(s.size());
      for (std::int64_t axis = -rank; axis < rank; ++axis)
        for (int mode = 0; mode < 4; ++mode) {
          const bool exclusive = mode & 1, reverse = mode & 2;
          // i32 over its whole range, so that sums wrap.
          const Host x = dt == DType::I32 ? rand_int(rng_, dt, s) : rand(dt, s, -8, 8);
          const Tensor y = lab().output(dt, s);
          const Host got = lab().run(ops::cumsum(lab().upload(x), y, axis, exclusive, reverse), y);
          expect_exact(std::string("cumsum ") + to_string(dt) + " " + dims(s) + " axis " + std::to_string(axis) +
                           (exclusive ? " exclusive" : "") + (reverse ? " reverse" : ""),
                       got, ref_cumsum(x, axis, exclusive, reverse));
        }
    }
}

TEST_P(Ops, CumsumReadsAStridedViewAndWritesOneIntoAnother) {
  // x is a [4, 6] view with a padded row stride, read transposed; y a
  // column-major view: strides on both sides of the axis.
  const Host x = rand(DType::F32, {6, 4}, -3, 3);
  const Tensor xv = lab().upload_view(x, {1, 9}, 5);  // element [i, j] at 5 + i + 9 j
  Buffer yb = dev().allocate(24 * 4);
  lab().q.fill(yb, 0, yb.size(), 0xA5).submit().wait();
  const Tensor y(yb, DType::F32, {6, 4}, {1, 6}, 0);
  for (std::int64_t axis : {0, 1}) {
    lab().run(ops::cumsum(xv, y, axis, false, true));
    expect_exact("cumsum of a strided view, axis " + std::to_string(axis), lab().download(y),
                 ref_cumsum(x, axis, false, true));
  }
}

TEST_P(Ops, CumsumRefusesWhatItsRuleDoesNotTake) {
  auto t = [&](DType dt, Shape s) { return lab().output(dt, std::move(s)); };
  const Refusals cases{
      {[&] { ops::cumsum(t(DType::U8, {4}), t(DType::U8, {4})); }, "cumsum: x is u8; supported: f32, f16, bf16, i32"},
      {[&] { ops::cumsum(t(DType::F32, {4}), t(DType::F16, {4})); }, "cumsum: y is f16 but x is f32"},
      {[&] {
         ops::cumsum(t(DType::F32, {2, 3}), t(DType::F32, {3, 2}));
       },
       "cumsum: y has shape [3, 2]; expected [2, 3] (the shape of x)"},
      {[&] {
         ops::cumsum(t(DType::F32, {2, 3}), t(DType::F32, {2, 3}), 2);
       },
       "cumsum: axis 2 is out of range for rank 2"},
      {[&] {
         ops::cumsum(t(DType::F32, {2, 3}), t(DType::F32, {2, 3}), -3);
       },
       "cumsum: axis -3 is out of range for rank 2"},
      {[&] { ops::cumsum(t(DType::F32, {}), t(DType::F32, {})); }, "cumsum: axis 0 is out of range for rank 0"},
  };
  expect_refusals(cases);
}

}  // namespace
}  // namespace tpuhal::ops_test
