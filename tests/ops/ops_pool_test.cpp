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

// NHWC byte pooling (int8 models' max pools) reduces a window's input rows
// to one, over whole rows of pixels, then steps each tap over all the
// channels of a pixel at once: channel counts below and past a vector's
// width, padding on either side, windows that overlap, strides and
// dilations that make a tap skip the first or last rows and columns,
// ceil_mode's extra window, windows of one row.
TEST_P(Ops, MaxPoolOfBytesNhwcIsExactAcrossManyChannels) {
  struct Geometry {
    std::array<std::uint32_t, 2> kernel, strides, dilations;
    std::array<std::uint32_t, 4> pads;
    bool ceil = false;
  };
  const Geometry geometries[] = {
      {{3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}},  // ResNet's and ShuffleNet's stem pool
      {{3, 2}, {2, 1}, {1, 1}, {1, 0, 1, 1}},
      {{3, 3}, {1, 3}, {2, 2}, {2, 2, 0, 1}},        // dilated: taps skip rows and columns at both ends
      {{2, 3}, {3, 2}, {1, 1}, {0, 1, 1, 2}, true},  // ceil_mode
      {{1, 3}, {1, 1}, {1, 1}, {0, 1, 0, 1}},        // one row a window
      {{5, 5}, {1, 1}, {1, 1}, {2, 2, 2, 2}},
  };
  for (DType dt : {DType::U8, DType::I8})
    for (const Geometry& gm : geometries)
      for (const std::int64_t ch : {std::int64_t{24}, std::int64_t{67}, std::int64_t{256}}) {
        PoolCase c;
        c.o.layout = Layout::NHWC;
        c.o.kernel = gm.kernel;
        c.o.strides = gm.strides;
        c.o.dilations = gm.dilations;
        c.o.pads = gm.pads;
        c.o.ceil_mode = gm.ceil;
        const std::int64_t h = 9, w = 8;
        c.xs = {2, h, w, ch};
        c.ys = {2, window_out(h, gm.kernel[0], gm.strides[0], gm.dilations[0], gm.pads[0], gm.pads[2], gm.ceil),
                window_out(w, gm.kernel[1], gm.strides[1], gm.dilations[1], gm.pads[1], gm.pads[3], gm.ceil), ch};
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

// Float pooling NHWC (fp32 models' pools) steps a row of outputs at a time,
// each tap over every column it falls inside (all the channels of each;
// f16 and bf16 widened an input row at a time, each output row rounded
// once); each output still meets its taps in (row, column) order, so the
// bits are those of the same pool in NCHW (where f16 and bf16 widen the
// whole input first). Windows that reach into the padding on either side,
// strides and dilations that make a tap skip the first or last columns,
// ceil_mode's extra window, NaNs and infinities.
TEST_P(Ops, FloatPoolNhwcGivesTheBitsOfNchw) {
  struct Geometry {
    std::array<std::uint32_t, 2> kernel, strides, dilations;
    std::array<std::uint32_t, 4> pads;
    bool ceil = false;
  };
  const Geometry geometries[] = {
      {{3, 2}, {2, 1}, {1, 1}, {1, 0, 1, 1}},
      {{3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}},        // ResNet's and ShuffleNet's stem pool
      {{3, 3}, {1, 3}, {2, 2}, {2, 2, 0, 1}},        // dilated: taps skip columns at both ends
      {{2, 3}, {3, 2}, {1, 1}, {0, 1, 1, 2}, true},  // ceil_mode
      {{1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}},        // every input once, one run per row
  };
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  for (const DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const Geometry& gm : geometries)
      for (bool max : {true, false})
        for (bool include : {false, true}) {
          Pool2dOptions o;
          o.kernel = gm.kernel;
          o.strides = gm.strides;
          o.dilations = gm.dilations;
          o.pads = gm.pads;
          o.ceil_mode = gm.ceil;
          o.count_include_pad = include;
          const std::int64_t n = 2, ch = 67, h = 9, w = 8;
          const std::int64_t oh =
              window_out(h, o.kernel[0], o.strides[0], o.dilations[0], o.pads[0], o.pads[2], gm.ceil);
          const std::int64_t ow =
              window_out(w, o.kernel[1], o.strides[1], o.dilations[1], o.pads[1], o.pads[3], gm.ceil);
          Host x = rand(dt, {n, ch, h, w}, -4, 4);
          for (std::size_t i = 0; i < x.v.size(); i += 97) x.v[i] = specials[i / 97 % 3];
          const Host xt = permuted(x, {0, 2, 3, 1});
          const Tensor y = lab().output(dt, {n, ch, oh, ow});
          const Host want =
              lab().run(max ? ops::max_pool2d(lab().upload(x), y, o) : ops::avg_pool2d(lab().upload(x), y, o), y);
          o.layout = Layout::NHWC;
          const Tensor yt = lab().output(dt, {n, oh, ow, ch});
          const Host got =
              lab().run(max ? ops::max_pool2d(lab().upload(xt), yt, o) : ops::avg_pool2d(lab().upload(xt), yt, o), yt);
          expect_exact(std::string(max ? "max_pool2d" : "avg_pool2d") + " " + std::string(to_string(dt)) +
                           " NHWC against NCHW " + pool_text(o),
                       permuted(got, {0, 3, 1, 2}), want.v);
        }
}

// f16 and bf16 global pooling NHWC (fp16 models' squeeze-and-excitation
// pools) widens a row's taps as it goes, in one call where one block takes
// every channel and a tap at a time where not; NCHW widens the whole input
// first: the same bits either way. Channel counts of one block and of
// several (the last one short), and a batch.
TEST_P(Ops, HalfGlobalPoolNhwcGivesTheBitsOfNchw) {
  for (DType dt : {DType::F16, DType::BF16})
    for (const std::array<std::int64_t, 2> nc : {std::array<std::int64_t, 2>{1, 300}, {4, 40}, {1, 40}})
      for (bool max : {true, false}) {
        Pool2dOptions o;
        o.kernel = {6, 6};
        const std::int64_t n = nc[0], ch = nc[1], h = 6, w = 6;
        const Host x = rand(dt, {n, ch, h, w}, -4, 4);
        const Host xt = permuted(x, {0, 2, 3, 1});
        const Tensor y = lab().output(dt, {n, ch, 1, 1});
        const Host want =
            lab().run(max ? ops::max_pool2d(lab().upload(x), y, o) : ops::avg_pool2d(lab().upload(x), y, o), y);
        const Ref ref = ref_pool(x, o, max, {n, ch, 1, 1});
        if (max)
          expect_exact("max_pool2d against the reference " + dims(x.shape), want, ref.v);
        else
          expect("avg_pool2d against the reference " + dims(x.shape), want, ref);
        o.layout = Layout::NHWC;
        const Tensor yt = lab().output(dt, {n, 1, 1, ch});
        const Host got =
            lab().run(max ? ops::max_pool2d(lab().upload(xt), yt, o) : ops::avg_pool2d(lab().upload(xt), yt, o), yt);
        Host as_nchw(dt, {n, ch, 1, 1});
        as_nchw.v = got.v;  // [n, 1, 1, ch] and [n, ch, 1, 1] order their values alike
        expect_exact(std::string(max ? "max_pool2d " : "avg_pool2d ") + std::string(to_string(dt)) + " NHWC " +
                         dims(xt.shape) + " against NCHW " + pool_text(o),
                     as_nchw, want.v);
      }
}

// f32 global pooling NHWC (fp32 models' squeeze-and-excitation pools) sums
// a block of channels over a row's taps, or every row's, in one step: the
// bits of NCHW's tap by tap. Channel counts split into blocks of 16, 32 and
// 64 (more blocks where fewer would leave a thread idle), a batch, and an
// input whose rows are not evenly apart (a slice of a wider image).
TEST_P(Ops, FloatGlobalPoolNhwcGivesTheBitsOfNchw) {
  for (const std::array<std::int64_t, 3> ncx :
       {std::array<std::int64_t, 3>{1, 32, 0}, {1, 40, 0}, {2, 300, 0}, {1, 1, 0}, {1, 48, 3}})
    for (bool max : {false, true}) {
      const std::int64_t n = ncx[0], ch = ncx[1], extra = ncx[2], h = 7, w = 9;
      Pool2dOptions o;
      o.kernel = {h, w};
      const Host wide = rand(DType::F32, {n, h, w + extra, ch}, -4, 4);
      Host x(DType::F32, {n, ch, h, w});
      for (std::int64_t a = 0; a < n; ++a)
        for (std::int64_t c = 0; c < ch; ++c)
          for (std::int64_t r = 0; r < h; ++r)
            for (std::int64_t q = 0; q < w; ++q)
              x.v[static_cast<std::size_t>(((a * ch + c) * h + r) * w + q)] = wide.at({a, r, q, c});
      const Tensor y = lab().output(DType::F32, {n, ch, 1, 1});
      const Host want =
          lab().run(max ? ops::max_pool2d(lab().upload(x), y, o) : ops::avg_pool2d(lab().upload(x), y, o), y);
      o.layout = Layout::NHWC;
      const Tensor all = lab().upload(wide);
      const Tensor xt(all.buffer(), DType::F32, {n, h, w, ch}, {h * (w + extra) * ch, (w + extra) * ch, ch, 1}, 0);
      const Tensor yt = lab().output(DType::F32, {n, 1, 1, ch});
      const Host got = lab().run(max ? ops::max_pool2d(xt, yt, o) : ops::avg_pool2d(xt, yt, o), yt);
      Host as_nchw(DType::F32, {n, ch, 1, 1});
      as_nchw.v = got.v;  // [n, 1, 1, ch] and [n, ch, 1, 1] order their values alike
      expect_exact(std::string(max ? "max_pool2d" : "avg_pool2d") + " NHWC " + dims({n, h, w, ch}) + " (rows " +
                       std::to_string((w + extra) * ch) + " apart) against NCHW",
                   as_nchw, want.v);
    }
}

// A window of one row across the width (ReduceMean over the last axis, as
// LayerNorm exports it; with one row, a 1-D network's global pool) sums
// each row in column order from 0, in f32, then divides: rows of several
// lengths, with padding at both ends counted or not.
TEST_P(Ops, AvgPoolOverWholeRowsSumsEachRowInOrder) {
  for (const std::int64_t w : {std::int64_t{5}, std::int64_t{96}, std::int64_t{1000}})
    for (const std::int64_t pad : {std::int64_t{0}, std::int64_t{1}})
      for (bool include : {false, true})
        for (const std::int64_t rows : {std::int64_t{37}, std::int64_t{1}}) {
          Pool2dOptions o;
          o.kernel = {1, static_cast<std::uint32_t>(w + 2 * pad)};
          o.pads = {0, static_cast<std::uint32_t>(pad), 0, static_cast<std::uint32_t>(pad)};
          o.count_include_pad = include;
          const Host x = rand(DType::F32, {2, 3, rows, w}, -4, 4);
          const Tensor y = lab().output(DType::F32, {2, 3, rows, 1});
          const Host got = lab().run(ops::avg_pool2d(lab().upload(x), y, o), y);
          std::vector<double> want(got.size());
          for (std::int64_t i = 0; i < 2 * 3 * rows; ++i) {
            float sum = 0.0f;
            for (std::int64_t b = 0; b < w; ++b) sum += static_cast<float>(x.v[static_cast<std::size_t>(i * w + b)]);
            want[static_cast<std::size_t>(i)] = sum / static_cast<float>(include ? w + 2 * pad : w);
          }
          expect_exact("avg_pool2d x [2, 3, " + std::to_string(rows) + ", " + std::to_string(w) + "] " + pool_text(o),
                       got, want);
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
