// max_pool2d and avg_pool2d: every dtype, the divisor, windows of padding.
#include "ops_reference.hpp"

namespace tpuhal::ops_test {
namespace {

TEST_P(Ops, MaxPoolIsExactForEveryDtype) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8})
    for (int i = 0; i < 6; ++i) {
      const PoolCase c = random_pool(rng_, true);
      const Host x = is_float(dt) ? rand(dt, c.xs, -100, 100) : rand_int(rng_, dt, c.xs);
      const Tensor y = lab().output(dt, c.ys);
      const Host got = lab().run(ops::max_pool2d(lab().upload(x), y, c.o), y);
      expect_exact("max_pool2d " + std::string(to_string(dt)) + " x " + dims(c.xs) + " " + pool_text(c.o), got,
                   ref_pool(x, c.o, true, c.ys).v);
    }
}

// NHWC byte pooling steps over all the channels of a pixel at once (int8
// models' max pools): channel counts past a vector's width, padding on
// both sides, windows that overlap.
TEST_P(Ops, MaxPoolOfBytesNhwcIsExactAcrossManyChannels) {
  for (DType dt : {DType::U8, DType::I8})
    for (const std::int64_t ch : {std::int64_t{67}, std::int64_t{256}}) {
      PoolCase c;
      c.o.layout = Layout::NHWC;
      c.o.kernel = {3, 3};
      c.o.strides = {2, 2};
      c.o.pads = {1, 1, 1, 1};
      c.xs = {2, 9, 8, ch};
      c.ys = {2, window_out(9, 3, 2, 1, 1, 1, false), window_out(8, 3, 2, 1, 1, 1, false), ch};
      const Host x = rand_int(rng_, dt, c.xs);
      const Tensor y = lab().output(dt, c.ys);
      const Host got = lab().run(ops::max_pool2d(lab().upload(x), y, c.o), y);
      expect_exact("max_pool2d " + std::string(to_string(dt)) + " x " + dims(c.xs) + " " + pool_text(c.o), got,
                   ref_pool(x, c.o, true, c.ys).v);
    }
}

TEST_P(Ops, AvgPoolDividesAsDocumented) {
  std::vector<PoolCase> cases;
  // ceil_mode windows that run past the end padding, with and without
  // count_include_pad. Kernel 3, stride 2: H = 6 with pads 1 gives 4 rows,
  // the last window [5, 8) of which only row 5 is input and row 6 padding;
  // W = 6 without pads gives 3 columns, the last window [4, 7) clipped to
  // [4, 6).
  for (bool include : {false, true})
    for (const auto& pads : {std::array<std::uint32_t, 4>{1, 0, 1, 0}, std::array<std::uint32_t, 4>{0, 1, 1, 0}}) {
      PoolCase c;
      c.o.kernel = {3, 3};
      c.o.strides = {2, 2};
      c.o.pads = pads;
      c.o.ceil_mode = true;
      c.o.count_include_pad = include;
      c.xs = {1, 2, 6, 6};
      c.ys = {1, 2, window_out(6, 3, 2, 1, pads[0], pads[2], true), window_out(6, 3, 2, 1, pads[1], pads[3], true)};
      cases.push_back(c);
    }
  for (int i = 0; i < 10; ++i) cases.push_back(random_pool(rng_, i % 3 == 0));
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const PoolCase& c : cases) {
      const Host x = rand(dt, c.xs, -4, 4);
      const Tensor y = lab().output(dt, c.ys);
      const Host got = lab().run(ops::avg_pool2d(lab().upload(x), y, c.o), y);
      expect("avg_pool2d " + std::string(to_string(dt)) + " x " + dims(c.xs) + " " + pool_text(c.o), got,
             ref_pool(x, c.o, false, c.ys));
    }
}

TEST_P(Ops, PoolRefusesWindowsMadeOnlyOfPadding) {
  // Kernel 1x2 with dilation 2 and one column of padding each side over a
  // 1-column input: the window is 3 wide, so pads of 1 pass the "pads
  // smaller than the window" rule, but its two taps (columns -1 and 1) both
  // miss the input. There is nothing to take the max or mean of; like a
  // window made only of padding (which the pads rule exists to exclude),
  // the op must be refused rather than produce a value from no input.
  Pool2dOptions o;
  o.kernel = {1, 2};
  o.dilations = {1, 2};
  o.pads = {0, 1, 0, 1};
  for (DType dt : {DType::U8, DType::I8, DType::F32}) {
    Host xh(dt, {1, 1, 1, 1});
    xh.v = {42};
    const Tensor x = lab().upload(xh), y = lab().output(dt, {1, 1, 1, 1});
    for (bool max : {true, false}) {
      if (!max && !is_float(dt)) continue;
      std::optional<Op> op;
      try {
        op = max ? ops::max_pool2d(x, y, o) : ops::avg_pool2d(x, y, o);
      } catch (const Error& e) {
        EXPECT_EQ(e.status(), Status::InvalidArgument) << e.what();
        continue;
      }
      lab().run(*op);
      ADD_FAILURE() << (max ? "max_pool2d " : "avg_pool2d ") << to_string(dt)
                    << ": a window with no input element was accepted and gave " << lab().download(y).v[0]
                    << " (the only input element is 42)";
    }
  }
}

}  // namespace
}  // namespace tpuhal::ops_test
