// The integer products: matmul_integer, conv_integer, qlinear_matmul and
// qlinear_conv; zero points, int32 wrapping, requantisation.
#include "ops_reference.hpp"

namespace tpuhal::ops_test {
namespace {

TEST_P(Ops, MatMulIntegerAppliesScalarRowAndColumnZeroPoints) {
  for (DType at : {DType::U8, DType::I8})
    for (DType bt : {DType::U8, DType::I8})
      for (int variant = 0; variant < 7; ++variant) {
        // 0 none; 1 a scalar; 2 b scalar; 3 a per row; 4 b per column;
        // 5 both per row / column, batched; 6 both scalar, batched b.
        const std::int64_t m = rng_.integer(1, 17), n = rng_.integer(1, 17), k = rng_.integer(1, 40);
        const Shape as = variant == 5 ? Shape{2, m, k} : Shape{m, k};
        const Shape bs = variant == 6 ? Shape{3, k, n} : Shape{k, n};
        const Host a = rand_int(rng_, at, as), b = rand_int(rng_, bt, bs);
        std::optional<Host> az, bz;
        if (variant == 1 || variant == 6) az = rand_int(rng_, at, variant == 1 ? Shape{} : Shape{1});
        if (variant == 2 || variant == 6) bz = rand_int(rng_, bt, Shape{});
        if (variant == 3 || variant == 5) az = rand_int(rng_, at, {m});
        if (variant == 4 || variant == 5) bz = rand_int(rng_, bt, {n});
        Shape ys;
        const auto want =
            ref_matmul_int(a, b, az ? az->v : std::vector<double>{}, bz ? bz->v : std::vector<double>{}, ys);
        const Tensor y = lab().output(DType::I32, ys);
        std::optional<Tensor> taz, tbz;
        if (az) taz = lab().upload(*az);
        if (bz) tbz = lab().upload(*bz);
        const Host got = lab().run(ops::matmul_integer(lab().upload(a), lab().upload(b), y, taz, tbz), y);
        expect_exact("matmul_integer " + std::string(to_string(at)) + " x " + to_string(bt) + " a " + dims(as) + " b " +
                         dims(bs) + " variant " + std::to_string(variant),
                     got, as_doubles(want));
      }
}

TEST_P(Ops, MatMulIntegerAccumulatesInInt32WrappingAround) {
  // K large enough that the sums leave int32: they wrap modulo 2^32.
  struct Case {
    DType at, bt;
    double a, b;  // every element (or, when NaN, random extremes)
    std::int64_t k;
    bool zero_points;
  };
  const std::vector<Case> cases{
      {DType::U8, DType::U8, 255, 255, 70000, false},  // 4.55e9
      {DType::I8, DType::I8, -128, -128, 140000, false},
      {DType::U8, DType::I8, 255, -128, 70000, false},  // -2.28e9
      {DType::I8, DType::U8, 127, 255, 70000, false},
      // Past 2^24 but inside int32, odd: exact in int32, not in f32.
      {DType::I8, DType::I8, 127, 127, 1041, false},  // 16790289
      {DType::U8, DType::I8, 255, 127, 521, false},   // 16872585
      {DType::U8, DType::U8, 255, 255, 259, false},   // 16841475
      {DType::I8, DType::U8, -127, 255, 519, false},  // -16808715
      {DType::U8, DType::I8, kNaN, kNaN, 50000, true},
      {DType::U8, DType::U8, kNaN, kNaN, 50000, true},
  };
  for (const Case& c : cases) {
    const std::int64_t m = 3, n = 2;
    Host a(c.at, {m, c.k}), b(c.bt, {c.k, n});
    for (auto& v : a.v)
      v = std::isnan(c.a) ? (rng_.coin(0.9) ? static_cast<double>(hi_of(c.at)) : static_cast<double>(lo_of(c.at)))
                          : c.a;
    for (auto& v : b.v)
      v = std::isnan(c.b) ? (rng_.coin(0.9) ? static_cast<double>(hi_of(c.bt)) : static_cast<double>(lo_of(c.bt)))
                          : c.b;
    std::optional<Host> az, bz;
    if (c.zero_points) {
      az = Host(c.at, {m});
      az->v = {0, static_cast<double>(lo_of(c.at)), 1};
      bz = Host(c.bt, {});
      bz->v = {static_cast<double>(c.bt == DType::U8 ? 0 : 127)};
    }
    Shape ys;
    const auto want = ref_matmul_int(a, b, az ? az->v : std::vector<double>{}, bz ? bz->v : std::vector<double>{}, ys);
    const Tensor y = lab().output(DType::I32, ys);
    std::optional<Tensor> taz, tbz;
    if (az) taz = lab().upload(*az);
    if (bz) tbz = lab().upload(*bz);
    const Host got = lab().run(ops::matmul_integer(lab().upload(a), lab().upload(b), y, taz, tbz), y);
    expect_exact(
        "matmul_integer " + std::string(to_string(c.at)) + " x " + to_string(c.bt) + " K " + std::to_string(c.k), got,
        as_doubles(want));
  }
}

TEST_P(Ops, MatMulIntegerIsExactWhereSomeSumsPass2To24OrPartialSumsCancel) {
  // A few large sums among small ones (odd, so f32 cannot hold them), and
  // partial sums far past 2^24 that cancel to small totals (oneDNN alone
  // gets these wrong: the engine must slice K by the data).
  const std::int64_t m = 33, n = 40, k = 2049;
  for (int variant = 0; variant < 3; ++variant) {
    // Variant 2 is variant 0 batched, b broadcast over a's two batches.
    Host a(DType::U8, variant == 2 ? Shape{2, m, k} : Shape{m, k}),
        b(DType::I8, variant == 2 ? Shape{1, k, n} : Shape{k, n});
    for (auto& v : a.v) v = static_cast<double>(rng_.integer(0, 3));
    for (auto& v : b.v) v = static_cast<double>(rng_.integer(-3, 3));
    if (variant != 1) {
      // Row 5 and 17 all 255, column 7 all 127 (k odd: 255 * 127 * 2049 is
      // odd); in the second batch only row 17.
      for (std::int64_t kk = 0; kk < k; ++kk) {
        a.v[static_cast<std::size_t>(5 * k + kk)] = 255;
        a.v[static_cast<std::size_t>(17 * k + kk)] = 255;
        if (variant == 2) a.v[static_cast<std::size_t>((m + 17) * k + kk)] = 255;
        b.v[static_cast<std::size_t>(kk * n + 7)] = 127;
      }
    } else {
      // Every column climbs to 255 * 126 * 1024 (3.3e7) and comes back down.
      for (auto& v : a.v) v = 255;
      for (std::int64_t kk = 0; kk < k; ++kk)
        for (std::int64_t j = 0; j < n; ++j)
          b.v[static_cast<std::size_t>(kk * n + j)] = (kk < k / 2 ? 126 : -126) + (kk % 7 == 0 ? (j % 3) - 1 : 0);
    }
    Shape ys;
    const auto want = ref_matmul_int(a, b, {}, {}, ys);
    const Tensor y = lab().output(DType::I32, ys);
    const Host got = lab().run(ops::matmul_integer(lab().upload(a), lab().upload(b), y), y);
    expect_exact(variant == 1 ? "matmul_integer, partial sums past 2^24 that cancel"
                              : "matmul_integer, rows and a column past 2^24 " + dims(a.shape) + " x " + dims(b.shape),
                 got, as_doubles(want));
  }
}

TEST_P(Ops, ConvIntegerWithInputAndPerChannelWeightZeroPoints) {
  for (DType xt : {DType::U8, DType::I8})
    for (DType wt : {DType::U8, DType::I8})
      for (int variant = 0; variant < 5; ++variant) {
        // 0 none; 1 x only; 2 x and scalar w; 3 x and per channel w; 4 per channel w only.
        const ConvCase c = random_conv(rng_, 8);
        const Host x = rand_int(rng_, xt, c.xs), w = rand_int(rng_, wt, c.ws);
        std::optional<Host> xz, wz;
        if (variant >= 1 && variant <= 3) xz = rand_int(rng_, xt, rng_.coin() ? Shape{} : Shape{1});
        if (variant == 2) wz = rand_int(rng_, wt, {});
        if (variant >= 3) wz = rand_int(rng_, wt, {c.ws[0]});
        const Shape ys = conv_out_shape(x, c.ws, c.g);
        std::vector<std::int64_t> wzv;
        if (wz)
          for (double v : wz->v) wzv.push_back(static_cast<std::int64_t>(v));
        const auto want = ref_conv_int(x, w, c.g, xz ? static_cast<std::int64_t>(xz->v[0]) : 0, wzv, ys);
        std::optional<Tensor> txz, twz;
        if (xz) txz = lab().upload(*xz);
        if (wz) twz = lab().upload(*wz);
        const Tensor y = lab().output(DType::I32, ys);
        const Host got = lab().run(ops::conv_integer(lab().upload(x), lab().upload(w), y, txz, twz, c.g.options()), y);
        expect_exact("conv_integer " + std::string(to_string(xt)) + " x " + dims(c.xs) + " " + to_string(wt) + " w " +
                         dims(c.ws) + " " + c.g.text() + " variant " + std::to_string(variant),
                     got, as_doubles(want));
      }
}

// As Conv2dTakesWeightsRewrittenInPlace (ops_conv_test.cpp), for the
// integer convolution's kept weights (reordered for oneDNN, or packed for
// the engine's own kernels): rewritten through the board, or by the host in
// pinned memory, each run takes the weights as they are. The first weights
// keep every sum within 2^24 and the second, near 127 over bytes near 255,
// pass it, so the runs switch between the engine's paths (the kept channel
// sums that choose them have a unit test of their own, tensor_isa_test.cpp).
TEST_P(Ops, ConvIntegerTakesWeightsRewrittenInPlace) {
  // A 3x3 layer, and a widening 1x1 (without VNNI, oneDNN's f32
  // convolution of the integers, its weights widened and kept).
  struct Shape3 {
    std::int64_t c, o, k;
  };
  for (const Shape3 k : {Shape3{64, 24, 3}, Shape3{24, 144, 1}})
    for (const bool by_host : {false, true}) {
      ConvGeom g;
      g.layout = Layout::NHWC;
      const auto pad = static_cast<std::uint32_t>(k.k / 2);
      g.pads = {pad, pad, pad, pad};
      const Host x = rand_host(rng_, DType::U8, img_shape(g.layout, 1, k.c, 7, 9), 250, 255);
      const Host w1 = rand_host(rng_, DType::I8, {k.o, k.c, k.k, k.k}, -3, 3);
      const Host w2 = rand_host(rng_, DType::I8, {k.o, k.c, k.k, k.k}, 120, 127);
      const Tensor xt = lab().upload(x), w = lab().upload(w1, by_host ? Memory::HostPinned : Memory::Device);
      const Shape ys = conv_out_shape(x, w1.shape, g);
      int run = 0;
      for (const Host* now : {&w1, &w1, &w2, &w2, &w1}) {
        if (by_host) {
          auto m = w.buffer().map();
          for (std::size_t i = 0; i < now->size(); ++i) store(DType::I8, now->v[i], m.data() + i);
        } else {
          lab().q.copy(lab().upload(*now).buffer(), w.buffer()).submit().wait();
        }
        const Tensor y = lab().output(DType::I32, ys);
        expect_exact(std::string("conv_integer ") + dims(w1.shape) + ", weights rewritten by " +
                         (by_host ? "the host" : "a copy") + ", run " + std::to_string(++run) +
                         (now == &w1 ? " with the first weights" : " with the second weights"),
                     lab().run(ops::conv_integer(xt, w, y, std::nullopt, std::nullopt, g.options()), y),
                     as_doubles(ref_conv_int(x, *now, g, 0, {}, ys)));
      }
    }
}

TEST_P(Ops, ConvIntegerAccumulatesExactlyInInt32) {
  // Sums past 2^24 (exact in int32, not in f32) and past 2^31 (wrapping).
  struct Case {
    DType xt, wt;
    double x, w;
    std::int64_t c;
    bool x_zero_point;
  };
  const std::vector<Case> cases{
      {DType::I8, DType::I8, 127, 127, 1041, false},   // 16790289
      {DType::U8, DType::I8, 255, 127, 521, false},    // 16872585
      {DType::I8, DType::I8, 127, 127, 1041, true},    // with a zero point of 0 given
      {DType::U8, DType::U8, 255, 255, 35000, false},  // 2.28e9: wraps
      {DType::I8, DType::I8, -128, -128, 140000, false},
      // Within 2^24, but each pair of products passes 2^15: what
      // vpmaddubsw (oneDNN without VNNI) saturates.
      {DType::U8, DType::I8, 255, 127, 64, false},  // 2072640
      {DType::U8, DType::I8, 255, -128, 64, false},
  };
  for (const Case& c : cases)
    for (Layout layout : {Layout::NCHW, Layout::NHWC}) {
      Host x(c.xt, img_shape(layout, 1, c.c, 1, 2)), w(c.wt, {2, c.c, 1, 1});
      std::fill(x.v.begin(), x.v.end(), c.x);
      std::fill(w.v.begin(), w.v.end(), c.w);
      ConvGeom g;
      g.layout = layout;
      std::optional<Host> xz;
      if (c.x_zero_point) xz = Host(c.xt, {});
      const Shape ys = conv_out_shape(x, w.shape, g);
      const auto want = ref_conv_int(x, w, g, 0, {}, ys);
      std::optional<Tensor> txz;
      if (xz) txz = lab().upload(*xz);
      const Tensor y = lab().output(DType::I32, ys);
      const Host got =
          lab().run(ops::conv_integer(lab().upload(x), lab().upload(w), y, txz, std::nullopt, g.options()), y);
      expect_exact("conv_integer " + std::string(to_string(c.xt)) + " " + num(c.x) + " x " + to_string(c.wt) + " " +
                       num(c.w) + " over " + std::to_string(c.c) + " channels " + g.text(),
                   got, as_doubles(want));
    }
}

TEST_P(Ops, DepthwiseIntegerConvolutionsAreExactAtTheExtremes) {
  // Depthwise 3x3 windows of the extreme values, where each pair of
  // products passes 2^15 (what vpmaddubsw, oneDNN's int8 multiply without
  // VNNI, saturates), with zero points of both ends, in both layouts and
  // strides, summed and requantised.
  struct Case {
    DType xt;
    double x, w, zero;  // the input's zero point: padding is worth it
  };
  const Case cases[] = {{DType::U8, 255, 127, 0},    {DType::U8, 255, -128, 0},  {DType::I8, -128, -128, 0},
                        {DType::I8, 127, -128, 0},   {DType::U8, 0, 127, 255},   {DType::U8, 255, -128, 3},
                        {DType::I8, -128, 127, 127}, {DType::I8, 127, 127, -128}};
  for (const Case& c : cases)
    for (Layout layout : {Layout::NCHW, Layout::NHWC})
      for (std::uint32_t stride : {1u, 2u}) {
        ConvGeom g;
        g.layout = layout;
        g.groups = 24;
        g.strides = {stride, stride};
        g.pads = {1, 1, 1, 1};
        Host x(c.xt, img_shape(layout, 1, 24, 9, 10)), w(DType::I8, {24, 1, 3, 3});
        std::fill(x.v.begin(), x.v.end(), c.x);
        std::fill(w.v.begin(), w.v.end(), c.w);
        w.v[4] = c.w > 0 ? -128 : 127;  // a centre of the other sign: the border windows differ from the inner ones
        Host xz(c.xt, {});
        xz.v = {c.zero};
        expect_conv_integer_and_requantised(std::string(to_string(c.xt)) + " " + num(c.x) + " (zero point " +
                                                num(c.zero) + ") x i8 " + num(c.w) + " " + g.text(),
                                            x, w, xz, g, 512.0);
      }
}

TEST_P(Ops, GroupedIntegerConvolutionsOneDnnsGemmPathCompensatesWrongly) {
  // Grouped geometries where oneDNN 2.6's GEMM convolution, given an s8
  // input or an input zero point, offset every sum of a channel by a
  // constant. The engine must not hand them to it that way: plain sums,
  // with an input zero point, and requantised (the fused path).
  struct Case {
    std::int64_t groups, og, cg, kh, kw;
  };
  const Case cases[] = {{2, 4, 1, 2, 4}, {2, 4, 1, 4, 2}, {2, 4, 1, 8, 1}, {4, 2, 1, 4, 2},
                        {4, 2, 1, 2, 4}, {4, 2, 1, 8, 1}, {3, 7, 2, 8, 4}, {5, 5, 2, 8, 4}};
  for (const Case& k : cases)
    for (DType xt : {DType::I8, DType::U8})
      for (bool zero_point : {false, true}) {
        ConvGeom g;
        g.layout = Layout::NHWC;
        g.groups = static_cast<std::uint32_t>(k.groups);
        g.pads = {1, 1, 1, 1};
        const Host x = rand_int(rng_, xt, img_shape(g.layout, 1, k.groups * k.cg, 12, 9));
        const Host w = rand_int(rng_, DType::I8, {k.groups * k.og, k.cg, k.kh, k.kw});
        const std::int64_t zero = zero_point ? (xt == DType::I8 ? 3 : 131) : 0;
        Host xz(xt, {});
        xz.v = {static_cast<double>(zero)};
        // Requantised too, by powers of two: the fused path's candidate.
        expect_conv_integer_and_requantised(std::string(to_string(xt)) + " x " + dims(x.shape) + " i8 w " +
                                                dims(w.shape) + " " + g.text() +
                                                (zero_point ? " x zero point " + std::to_string(zero) : ""),
                                            x, w, xz, g, 4.0);
      }
}

TEST_P(Ops, QLinearMatMulRequantisesWithTiesToEvenAndSaturation) {
  for (DType at : {DType::U8, DType::I8})
    for (DType bt : {DType::U8, DType::I8})
      for (DType yt : {DType::U8, DType::I8})
        for (int variant = 0; variant < 5; ++variant) {
          // 0 scalars; 1 a per row; 2 b per column; 3 both (every element its
          // own multiplier); 4 power-of-two multipliers (exact ties) and saturation.
          const std::int64_t m = rng_.integer(1, 12), n = rng_.integer(1, 12), k = rng_.integer(1, 24);
          const Host a = rand_int(rng_, at, {m, k}), b = rand_int(rng_, bt, {k, n});
          const bool row = variant == 1 || variant == 3, col = variant == 2 || variant == 3;
          Host as = rand(DType::F32, row ? Shape{m} : Shape{}, 1e-3, 0.05);
          Host bs = rand(DType::F32, col ? Shape{n} : Shape{1}, 1e-3, 0.05);
          Host ysc = rand(DType::F32, {}, 0.02, 0.5);
          if (variant == 4) {
            as.v = {std::ldexp(1.0, static_cast<int>(rng_.integer(-4, 0)))};
            bs.v = {std::ldexp(1.0, static_cast<int>(rng_.integer(-3, 3)))};
            ysc.v = {std::ldexp(1.0, static_cast<int>(rng_.integer(-2, 2)))};
          }
          Host az = rand_int(rng_, at, row ? Shape{m} : Shape{}), bz = rand_int(rng_, bt, col ? Shape{n} : Shape{});
          Host yz = rand_int(rng_, yt, {});
          Shape ys;
          const auto acc = ref_matmul_int(a, b, az.v, bz.v, ys);
          std::vector<double> want;
          for (std::size_t i = 0; i < acc.size(); ++i) {
            const std::size_t r = static_cast<std::size_t>(static_cast<std::int64_t>(i) / n),
                              cc = i % static_cast<std::size_t>(n);
            want.push_back(requantize(acc[i], as.v[row ? r : 0], bs.v[col ? cc : 0], ysc.v[0],
                                      static_cast<std::int64_t>(yz.v[0]), yt));
          }
          const Tensor y = lab().output(yt, ys);
          const Host got =
              lab().run(ops::qlinear_matmul(lab().upload(a), lab().upload(as), lab().upload(az), lab().upload(b),
                                            lab().upload(bs), lab().upload(bz), lab().upload(ysc), lab().upload(yz), y),
                        y);
          expect_exact("qlinear_matmul " + std::string(to_string(at)) + " x " + to_string(bt) + " -> " + to_string(yt) +
                           " " + dims(ys) + " variant " + std::to_string(variant),
                       got, want);
        }
}

TEST_P(Ops, QLinearConvRequantisesWithBiasTiesAndSaturation) {
  for (DType xt : {DType::U8, DType::I8})
    for (DType wt : {DType::U8, DType::I8})
      for (DType yt : {DType::U8, DType::I8})
        for (int variant = 0; variant < 4; ++variant) {
          // 0 scalar scales; 1 per channel w scale and zero point, bias;
          // 2 power-of-two multipliers (ties), bias; 3 large multipliers (saturation).
          const ConvCase c = random_conv(rng_, 8);
          const Host x = rand_int(rng_, xt, c.xs), w = rand_int(rng_, wt, c.ws);
          const std::int64_t o = c.ws[0];
          const bool per_channel = variant == 1;
          Host xs = rand(DType::F32, {}, 1e-3, 0.05),
               ws = rand(DType::F32, per_channel ? Shape{o} : Shape{}, 1e-3, 0.05);
          Host ysc = rand(DType::F32, {1}, 0.05, 1);
          if (variant == 2) {
            xs.v = {0.5};
            ws.v = {std::ldexp(1.0, static_cast<int>(rng_.integer(-3, 0)))};
            ysc.v = {std::ldexp(1.0, static_cast<int>(rng_.integer(0, 3)))};
          } else if (variant == 3) {
            xs.v = {2};
            ws.v = {3};
            ysc.v = {0.5};
          }
          const Host xz = rand_int(rng_, xt, {}), wz = rand_int(rng_, wt, per_channel ? Shape{o} : Shape{});
          const Host yz = rand_int(rng_, yt, {});
          std::optional<Host> bias;
          if (variant == 1 || variant == 2) bias = rand_host(rng_, DType::I32, {o}, -5000, 5000);
          const Shape ys = conv_out_shape(x, c.ws, c.g);
          std::vector<std::int64_t> wzv;
          for (double v : wz.v) wzv.push_back(static_cast<std::int64_t>(v));
          const auto acc = ref_conv_int(x, w, c.g, static_cast<std::int64_t>(xz.v[0]), wzv, ys);
          std::vector<double> want(acc.size());
          for_each_output(
              ys, c.g.layout, [&](std::int64_t, std::int64_t oc, std::int64_t, std::int64_t, std::int64_t lin) {
                const auto ol = static_cast<std::size_t>(oc);
                const std::int64_t sum =
                    wrap32(acc[static_cast<std::size_t>(lin)] + (bias ? static_cast<std::int64_t>(bias->v[ol]) : 0));
                want[static_cast<std::size_t>(lin)] = requantize(sum, xs.v[0], ws.v[per_channel ? ol : 0], ysc.v[0],
                                                                 static_cast<std::int64_t>(yz.v[0]), yt);
              });
          Conv2dOptions opt = c.g.options();
          if (bias) opt.bias = lab().upload(*bias);
          const Tensor y = lab().output(yt, ys);
          const Host got = lab().run(
              ops::qlinear_conv(lab().upload(x), lab().upload(xs), lab().upload(xz), lab().upload(w), lab().upload(ws),
                                lab().upload(wz), lab().upload(ysc), lab().upload(yz), y, opt),
              y);
          expect_exact("qlinear_conv " + std::string(to_string(xt)) + " x " + dims(c.xs) + " " + to_string(wt) + " w " +
                           dims(c.ws) + " -> " + to_string(yt) + " " + c.g.text() + " variant " +
                           std::to_string(variant),
                       got, want);
        }
}

TEST_P(Ops, QLinearConvWithS8WeightsNoWeightZeroPointAndNoBiasRoundsTheSame) {
  // The case the engine hands to oneDNN with the requantisation fused:
  // it must give the same bytes as everywhere else, ties and saturation
  // included (including 64 input channels of 3x3 taps, where the sums can
  // pass 2^24 only by the worst case).
  for (DType xt : {DType::U8, DType::I8})
    for (DType yt : {DType::U8, DType::I8})
      for (int variant = 0; variant < 4; ++variant) {
        // 0 per channel scales; 1 power-of-two multipliers (exact ties);
        // 2 large multipliers (saturation); 3 a wide layer, per channel.
        ConvCase c = random_conv(rng_, 8);
        if (variant == 3) {
          c.g = ConvGeom{};
          c.g.layout = rng_.coin() ? Layout::NHWC : Layout::NCHW;
          c.g.pads = {1, 1, 1, 1};
          c.xs = img_shape(c.g.layout, 1, 64, 9, 7);
          c.ws = {16, 64, 3, 3};
        }
        const Host x = rand_int(rng_, xt, c.xs), w = rand_int(rng_, DType::I8, c.ws);
        const std::int64_t o = c.ws[0];
        const bool per_channel = variant == 0 || variant == 3;
        Host xs = rand(DType::F32, {}, 1e-3, 0.05), ws = rand(DType::F32, per_channel ? Shape{o} : Shape{}, 1e-3, 0.05);
        Host ysc = rand(DType::F32, {1}, 0.05, 1);
        if (variant == 1) {
          xs.v = {0.5};
          ws.v = {std::ldexp(1.0, static_cast<int>(rng_.integer(-3, 0)))};
          ysc.v = {std::ldexp(1.0, static_cast<int>(rng_.integer(0, 3)))};
        } else if (variant == 2) {
          xs.v = {2};
          ws.v = {3};
          ysc.v = {0.5};
        }
        const Host xz = rand_int(rng_, xt, {});
        Host wz(DType::I8, per_channel ? Shape{o} : Shape{});  // zeros
        const Host yz = rand_int(rng_, yt, {});
        const Shape ys = conv_out_shape(x, c.ws, c.g);
        const auto acc = ref_conv_int(x, w, c.g, static_cast<std::int64_t>(xz.v[0]), {}, ys);
        std::vector<double> want(acc.size());
        for_each_output(
            ys, c.g.layout, [&](std::int64_t, std::int64_t oc, std::int64_t, std::int64_t, std::int64_t lin) {
              want[static_cast<std::size_t>(lin)] = requantize(wrap32(acc[static_cast<std::size_t>(lin)]), xs.v[0],
                                                               ws.v[per_channel ? static_cast<std::size_t>(oc) : 0],
                                                               ysc.v[0], static_cast<std::int64_t>(yz.v[0]), yt);
            });
        const Tensor y = lab().output(yt, ys);
        const Host got = lab().run(
            ops::qlinear_conv(lab().upload(x), lab().upload(xs), lab().upload(xz), lab().upload(w), lab().upload(ws),
                              lab().upload(wz), lab().upload(ysc), lab().upload(yz), y, c.g.options()),
            y);
        expect_exact("qlinear_conv " + std::string(to_string(xt)) + " x " + dims(c.xs) + " s8 w " + dims(c.ws) +
                         " -> " + to_string(yt) + " " + c.g.text() + " variant " + std::to_string(variant),
                     got, want);
      }
}

TEST_P(Ops, IntegerConvolutionsOfAFewPositionsAreExact) {
  // 1x1 convolutions over at most 8 positions (a Linear layer, a
  // squeeze-and-excitation block's on a 1x1 image) run as dot products
  // (conv.cpp, few_positions); 9 go the other way. Both integer ops, s8
  // weights at their extremes (sums past 2^24, where oneDNN would take the
  // input's nibbles), zero points at both ends, per-channel weight zero
  // points, both layouts, a strided kernel over a 3x3 image, and a bias
  // that wraps the sum.
  struct Case {
    Layout layout;
    std::int64_t n, c, o, h;
    std::uint32_t stride;
  };
  const Case cases[] = {{Layout::NHWC, 1, 1280, 37, 1, 1}, {Layout::NHWC, 8, 48, 19, 1, 1},
                        {Layout::NHWC, 9, 48, 19, 1, 1},   {Layout::NCHW, 3, 1280, 21, 1, 1},
                        {Layout::NHWC, 2, 64, 18, 3, 2},   {Layout::NCHW, 1, 7, 5, 3, 2}};
  for (const Case& k : cases)
    for (DType xt : {DType::U8, DType::I8})
      for (int variant = 0; variant < 3; ++variant) {
        // 0 extremes, no weight zero points; 1 random, per-channel weight
        // zero points; 2 extremes with the input's zero point at the far end.
        ConvGeom g;
        g.layout = k.layout;
        g.strides = {k.stride, k.stride};
        Host x = variant == 1 ? rand_int(rng_, xt, img_shape(g.layout, k.n, k.c, k.h, k.h))
                              : rand_host(rng_, xt, img_shape(g.layout, k.n, k.c, k.h, k.h),
                                          static_cast<double>(hi_of(xt) - 2), static_cast<double>(hi_of(xt)));
        const Host w = variant == 1 ? rand_int(rng_, DType::I8, {k.o, k.c, 1, 1})
                                    : rand_host(rng_, DType::I8, {k.o, k.c, 1, 1}, 120, 127);
        Host xz(xt, {});
        xz.v = {variant == 2 ? static_cast<double>(lo_of(xt))
                             : static_cast<double>(rng_.integer(lo_of(xt), hi_of(xt)))};
        Host wz(DType::I8, {k.o});  // zeros
        if (variant == 1) wz = rand_int(rng_, DType::I8, {k.o});
        std::vector<std::int64_t> wzv;
        for (double v : wz.v) wzv.push_back(static_cast<std::int64_t>(v));
        const Shape ys = conv_out_shape(x, w.shape, g);
        const auto acc = ref_conv_int(x, w, g, static_cast<std::int64_t>(xz.v[0]), wzv, ys);
        const std::string what = std::string(to_string(xt)) + " x " + dims(x.shape) + " s8 w " + dims(w.shape) + " " +
                                 g.text() + " variant " + std::to_string(variant);
        const Tensor yi = lab().output(DType::I32, ys);
        expect_exact("conv_integer " + what,
                     lab().run(ops::conv_integer(lab().upload(x), lab().upload(w), yi, lab().upload(xz),
                                                 lab().upload(wz), g.options()),
                               yi),
                     as_doubles(acc));
        Host bias = rand_host(rng_, DType::I32, {k.o}, -5000, 5000);
        bias.v[0] = 2147483647;  // wraps
        const Host xs = rand(DType::F32, {}, 1e-3, 0.05), ws = rand(DType::F32, {k.o}, 1e-4, 1e-3);
        const Host ysc = rand(DType::F32, {}, 0.05, 1), yz = rand_int(rng_, DType::U8, {});
        std::vector<double> want(acc.size());
        for_each_output(ys, g.layout, [&](std::int64_t, std::int64_t oc, std::int64_t, std::int64_t, std::int64_t lin) {
          const auto ol = static_cast<std::size_t>(oc);
          want[static_cast<std::size_t>(lin)] =
              requantize(wrap32(acc[static_cast<std::size_t>(lin)] + static_cast<std::int64_t>(bias.v[ol])), xs.v[0],
                         ws.v[ol], ysc.v[0], static_cast<std::int64_t>(yz.v[0]), DType::U8);
        });
        Conv2dOptions opt = g.options();
        opt.bias = lab().upload(bias);
        const Tensor y = lab().output(DType::U8, ys);
        expect_exact("qlinear_conv " + what,
                     lab().run(ops::qlinear_conv(lab().upload(x), lab().upload(xs), lab().upload(xz), lab().upload(w),
                                                 lab().upload(ws), lab().upload(wz), lab().upload(ysc),
                                                 lab().upload(yz), y, opt),
                               y),
                     want);
      }
}

TEST_P(Ops, IntegerConvolutionsOfAFewTapsAreExactAtTheirLargestSums) {
  // Without VNNI, an integer convolution of at most 256 taps an output with
  // as many output channels as input channels or more (a network's first
  // layer, an expanding 1x1) runs as oneDNN's f32 convolution of the same
  // integers (conv.cpp, integer_sums_as_f32), exact while each sum stays
  // below 2^24: here 256 taps of 255 * 255 in every output come within
  // 131,000 of it, and 257 take the other route. Both integer ops; u8 and i8
  // inputs and weights with per-channel weight zero points; both layouts;
  // a first layer of 3 channels; a grouped expansion; a depthwise layer of
  // an i8 input; an input read as a slice of a wider tensor; a bias that
  // wraps. (This CPU's own level takes its route; CI runs these at every
  // level below it.)
  struct Case {
    Layout layout;
    std::int64_t n, c, o, h, k;
    std::uint32_t stride, groups;
  };
  const Case cases[] = {{Layout::NHWC, 1, 256, 260, 3, 1, 1, 1}, {Layout::NHWC, 2, 257, 258, 2, 1, 1, 1},
                        {Layout::NHWC, 1, 3, 32, 9, 3, 2, 1},    {Layout::NCHW, 2, 16, 96, 5, 1, 1, 1},
                        {Layout::NCHW, 1, 8, 16, 6, 3, 1, 2},    {Layout::NHWC, 1, 24, 24, 7, 3, 1, 24}};
  for (const Case& k : cases)
    for (DType xt : {DType::U8, DType::I8})
      for (int variant = 0; variant < 2; ++variant) {
        // 0 the largest sums: x at one end of its range, its zero point at
        // the other, w less its zero point -255 or 255 (the signs mixed by
        // channel); 1 random values with per-channel weight zero points.
        const DType wt = xt == DType::U8 ? DType::I8 : DType::U8;
        ConvGeom g;
        g.layout = k.layout;
        g.strides = {k.stride, k.stride};
        g.groups = k.groups;
        g.pads = {k.k / 2 > 0 ? 1u : 0u, k.k / 2 > 0 ? 1u : 0u, 0, 0};
        const Shape xs_shape = img_shape(g.layout, k.n, k.c, k.h, k.h), ws_shape{k.o, k.c / k.groups, k.k, k.k};
        Host x = variant == 0
                     ? rand_host(rng_, xt, xs_shape, static_cast<double>(hi_of(xt)), static_cast<double>(hi_of(xt)))
                     : rand_int(rng_, xt, xs_shape);
        Host w = rand_int(rng_, wt, ws_shape);
        Host wz(wt, {k.o});
        if (variant == 0) {
          const std::int64_t per_o = static_cast<std::int64_t>(w.size()) / k.o;
          for (std::int64_t oi = 0; oi < k.o; ++oi) {
            const bool up = oi % 2 == 0;  // w - wz = 255 or -255
            wz.v[static_cast<std::size_t>(oi)] = static_cast<double>(up ? lo_of(wt) : hi_of(wt));
            for (std::int64_t i = 0; i < per_o; ++i)
              w.v[static_cast<std::size_t>(oi * per_o + i)] = static_cast<double>(up ? hi_of(wt) : lo_of(wt));
          }
        } else {
          wz = rand_int(rng_, wt, {k.o});
        }
        Host xz(xt, {});
        xz.v = {variant == 0 ? static_cast<double>(lo_of(xt))
                             : static_cast<double>(rng_.integer(lo_of(xt), hi_of(xt)))};
        std::vector<std::int64_t> wzv;
        for (double v : wz.v) wzv.push_back(static_cast<std::int64_t>(v));
        const Shape ys = conv_out_shape(x, w.shape, g);
        ASSERT_FALSE(ys.empty()) << dims(xs_shape) << " " << g.text();
        const auto acc = ref_conv_int(x, w, g, static_cast<std::int64_t>(xz.v[0]), wzv, ys);
        const std::string what = std::string(to_string(xt)) + " x " + dims(x.shape) + " " + to_string(wt) + " w " +
                                 dims(w.shape) + " " + g.text() + " variant " + std::to_string(variant);
        // Variant 1 reads x as a slice: its last dimension 3 elements apart
        // more than its length.
        const auto input = [&] {
          if (variant == 0) return lab().upload(x);
          const Shape& d = x.shape;
          return lab().upload_view(x, {d[1] * d[2] * (d[3] + 3), d[2] * (d[3] + 3), d[3] + 3, 1}, 1);
        };
        const Tensor yi = lab().output(DType::I32, ys);
        expect_exact(
            "conv_integer " + what,
            lab().run(ops::conv_integer(input(), lab().upload(w), yi, lab().upload(xz), lab().upload(wz), g.options()),
                      yi),
            as_doubles(acc));
        Host bias = rand_host(rng_, DType::I32, {k.o}, -50000, 50000);
        bias.v[0] = 2147483647.0;   // wraps with channel 0's largest sums
        bias.v[1] = -2147483648.0;  // and with channel 1's
        const DType yt = variant == 0 ? DType::U8 : DType::I8;
        const Host xs = rand(DType::F32, {}, 1e-3, 0.05), ws = rand(DType::F32, {k.o}, 1e-4, 1e-3);
        const Host ysc = rand(DType::F32, {}, 0.05, 1), yz = rand_int(rng_, yt, {});
        std::vector<double> want(acc.size());
        for_each_output(ys, g.layout, [&](std::int64_t, std::int64_t oc, std::int64_t, std::int64_t, std::int64_t lin) {
          const auto ol = static_cast<std::size_t>(oc);
          want[static_cast<std::size_t>(lin)] =
              requantize(wrap32(acc[static_cast<std::size_t>(lin)] + static_cast<std::int64_t>(bias.v[ol])), xs.v[0],
                         ws.v[ol], ysc.v[0], static_cast<std::int64_t>(yz.v[0]), yt);
        });
        Conv2dOptions opt = g.options();
        opt.bias = lab().upload(bias);
        const Tensor y = lab().output(yt, ys);
        expect_exact(
            "qlinear_conv " + what + " -> " + to_string(yt),
            lab().run(ops::qlinear_conv(input(), lab().upload(xs), lab().upload(xz), lab().upload(w), lab().upload(ws),
                                        lab().upload(wz), lab().upload(ysc), lab().upload(yz), y, opt),
                      y),
            want);
      }
}

TEST_P(Ops, QLinearConvDepthwiseInNhwcIsExactForEveryKernelStrideAndEdge) {
  // Depthwise layers as an int8 MobileNet's or EfficientNet's reach the
  // engine (NHWC, s8 weights without zero points, per-channel scales, a
  // bias), which on AVX-512 VNNI run four taps at a time on the engine's
  // own loop: kernels of 5x5 and wider (3x3 for comparison), strides of 1,
  // 2 and 3 (only the taps' columns laid out where 4 dilations are a
  // multiple of the stride: at 2, and at 3 with dilation 3), dilation 2,
  // uneven padding, channel counts off the vector width, u8 and i8 in
  // and out with zero points at both ends and between, inputs and weights at the
  // extremes in part of the image, a bias that wraps the int32 sum; each
  // byte as requantize() gives it, twice (weights kept from run to run),
  // then with x, w and y as views.
  struct Case {
    std::int64_t c, h, w, kh, kw;
    std::uint32_t sh, sw, dil;
    std::array<std::uint32_t, 4> pads;
  };
  const Case cases[] = {{40, 14, 13, 5, 5, 1, 1, 1, {2, 2, 2, 2}}, {24, 15, 16, 5, 5, 2, 2, 1, {1, 2, 2, 1}},
                        {7, 9, 11, 3, 7, 1, 3, 1, {0, 3, 1, 0}},   {64, 11, 12, 5, 4, 2, 2, 2, {4, 3, 2, 1}},
                        {17, 8, 9, 3, 3, 1, 1, 1, {1, 1, 1, 1}},   {33, 6, 20, 1, 9, 1, 2, 1, {0, 4, 0, 4}},
                        {20, 10, 25, 3, 5, 2, 3, 3, {3, 6, 0, 5}}};
  for (const Case& k : cases)
    for (DType xt : {DType::U8, DType::I8})
      for (DType yt : {DType::U8, DType::I8})
        for (const bool with_bias : {false, true}) {
          ConvGeom g;
          g.layout = Layout::NHWC;
          g.groups = static_cast<std::uint32_t>(k.c);
          g.strides = {k.sh, k.sw};
          g.dilations = {k.dil, k.dil};
          g.pads = k.pads;
          Host x = rand_int(rng_, xt, img_shape(g.layout, 2, k.c, k.h, k.w));
          Host w = rand_host(rng_, DType::I8, {k.c, 1, k.kh, k.kw}, -128, 127);
          const double top = xt == DType::U8 ? 255 : 127;
          for (std::size_t i = 0; i < x.v.size() / 4; ++i) x.v[i] = top;  // the first rows at the extreme
          for (std::int64_t t = 0; t < k.kh * k.kw; ++t) w.v[static_cast<std::size_t>(t)] = -128;  // channel 0's taps
          Host xz(xt, {}), wz(DType::I8, {k.c});  // weight zero points 0
          const double zero_points[] = {xt == DType::U8 ? 0.0 : -128.0, xt == DType::U8 ? 255.0 : 127.0,
                                        xt == DType::U8 ? 131.0 : 3.0};
          xz.v = {zero_points[static_cast<std::size_t>(rng_.integer(0, 2))]};
          const Host xs = rand(DType::F32, {}, 1e-3, 0.05), ws = rand(DType::F32, {k.c}, 1e-4, 0.01);
          const Host ysc = rand(DType::F32, {}, 0.01, 0.5), yz = rand_int(rng_, yt, {});
          Host bias = rand_host(rng_, DType::I32, {k.c}, -100000, 100000);
          bias.v[0] = 2147483000;  // wraps channel 0's sums
          const Shape ys = conv_out_shape(x, w.shape, g);
          ASSERT_FALSE(ys.empty()) << g.text();
          const auto acc = ref_conv_int(x, w, g, static_cast<std::int64_t>(xz.v[0]), {}, ys);
          std::vector<double> want(acc.size());
          for_each_output(ys, g.layout,
                          [&](std::int64_t, std::int64_t oc, std::int64_t, std::int64_t, std::int64_t lin) {
                            const auto ol = static_cast<std::size_t>(oc);
                            const std::int64_t sum = wrap32(acc[static_cast<std::size_t>(lin)] +
                                                            (with_bias ? static_cast<std::int64_t>(bias.v[ol]) : 0));
                            want[static_cast<std::size_t>(lin)] =
                                requantize(sum, xs.v[0], ws.v[ol], ysc.v[0], static_cast<std::int64_t>(yz.v[0]), yt);
                          });
          Conv2dOptions opt = g.options();
          if (with_bias) opt.bias = lab().upload(bias);
          const std::string what = "qlinear_conv " + std::string(to_string(xt)) + " x " + dims(x.shape) + " s8 w " +
                                   dims(w.shape) + " -> " + to_string(yt) + " " + g.text() + " x zero point " +
                                   num(xz.v[0]) + (with_bias ? " with a bias" : "");
          // Dense twice, then views: x's pixels 3 bytes apart more than its
          // channels, w every second byte (not contiguous: not kept), y a
          // channel slice of a wider tensor.
          const std::int64_t xc = k.c + 3, yc = k.c + 2, taps = k.kh * k.kw;
          const Shape x_strides{x.shape[1] * x.shape[2] * xc, x.shape[2] * xc, xc, 1};
          const Shape w_strides{2 * taps, 2 * taps, 2 * k.kw, 2};
          const Tensor wide_y = lab().output(yt, {ys[0], ys[1], ys[2], yc});
          const Tensor y_slice(wide_y.buffer(), yt, ys, {ys[1] * ys[2] * yc, ys[2] * yc, yc, 1}, 1);
          for (int run = 0; run < 3; ++run) {
            const bool views = run == 2;
            const Tensor y = views ? y_slice : lab().output(yt, ys);
            expect_exact(what + (views ? " through views" : " run " + std::to_string(run)),
                         lab().run(ops::qlinear_conv(
                                       views ? lab().upload_view(x, x_strides, 5) : lab().upload(x), lab().upload(xs),
                                       lab().upload(xz), views ? lab().upload_view(w, w_strides, 1) : lab().upload(w),
                                       lab().upload(ws), lab().upload(wz), lab().upload(ysc), lab().upload(yz), y, opt),
                                   y),
                         want);
          }
        }
}

TEST_P(Ops, QLinearConvShapedLikeAnInt8ResNetLayerIsExact) {
  // What the compiler's int8 layers hand the engine (runtime/src/onnx/
  // int8.cpp): u8 NHWC activations, s8 per-channel weights with zero
  // points 0, an i32 bias (some large enough to wrap the int32 sum), at
  // ResNet's shapes (3x3 over 256 channels: K past several exact blocks;
  // 1x1 with stride 2; the 7x7 stem; a Gemm as a 1x1 over 2048), with odd
  // sizes, an input zero point of 0 and not, with and without a bias.
  struct Case {
    std::int64_t c, h, w, o, k, stride, pad;
  };
  const Case cases[] = {{256, 7, 9, 67, 3, 1, 1},
                        {64, 15, 13, 257, 1, 2, 0},
                        {3, 17, 19, 64, 7, 2, 3},
                        {2048, 1, 1, 10, 1, 1, 0},
                        {33, 5, 6, 31, 3, 2, 1}};
  for (const Case& k : cases)
    for (const std::int64_t x_zero : {0, 131})
      for (const bool with_bias : {false, true}) {
        ConvGeom g;
        g.layout = Layout::NHWC;
        g.strides = {static_cast<std::uint32_t>(k.stride), static_cast<std::uint32_t>(k.stride)};
        const auto p = static_cast<std::uint32_t>(k.pad);
        g.pads = {p, p, p, p};
        const Host x = rand_int(rng_, DType::U8, img_shape(g.layout, 1, k.c, k.h, k.w));
        const Host w = rand_host(rng_, DType::I8, {k.o, k.c, k.k, k.k}, -127, 127);
        Host xz(DType::U8, {}), wz(DType::I8, {k.o});  // weight zero points 0
        xz.v = {static_cast<double>(x_zero)};
        const Host xs = rand(DType::F32, {}, 1e-3, 0.05), ws = rand(DType::F32, {k.o}, 1e-4, 0.01);
        const Host ysc = rand(DType::F32, {}, 0.05, 1), yz = rand_int(rng_, DType::U8, {});
        Host bias = rand_host(rng_, DType::I32, {k.o}, -100000, 100000);
        bias.v[0] = 2147483000;  // wraps the sums of channel 0 that pass 647
        const Shape ys = conv_out_shape(x, w.shape, g);
        const auto acc = ref_conv_int(x, w, g, x_zero, {}, ys);
        std::vector<double> want(acc.size());
        for_each_output(ys, g.layout, [&](std::int64_t, std::int64_t oc, std::int64_t, std::int64_t, std::int64_t lin) {
          const auto ol = static_cast<std::size_t>(oc);
          const std::int64_t sum =
              wrap32(acc[static_cast<std::size_t>(lin)] + (with_bias ? static_cast<std::int64_t>(bias.v[ol]) : 0));
          want[static_cast<std::size_t>(lin)] =
              requantize(sum, xs.v[0], ws.v[ol], ysc.v[0], static_cast<std::int64_t>(yz.v[0]), DType::U8);
        });
        Conv2dOptions opt = g.options();
        if (with_bias) opt.bias = lab().upload(bias);
        const Tensor y = lab().output(DType::U8, ys);
        const std::string what = "qlinear_conv u8 x " + dims(x.shape) + " s8 w " + dims(w.shape) + " " + g.text() +
                                 " x zero point " + std::to_string(x_zero) + (with_bias ? " with a bias" : "");
        // Twice: a second run with the same weights must give the same bytes.
        for (int run = 0; run < 2; ++run)
          expect_exact(what + " run " + std::to_string(run),
                       lab().run(ops::qlinear_conv(lab().upload(x), lab().upload(xs), lab().upload(xz), lab().upload(w),
                                                   lab().upload(ws), lab().upload(wz), lab().upload(ysc),
                                                   lab().upload(yz), y, opt),
                                 y),
                       want);
      }
}

}  // namespace
}  // namespace tpuhal::ops_test
