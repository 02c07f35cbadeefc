// quantize and dequantize: rounding, saturation, per-tensor and per-axis.
#include "ops_reference.hpp"

namespace tpuhal::ops_test {
namespace {

TEST_P(Ops, QuantizeRoundsHalfToEvenAndSaturates) {
  const Shape shape{3, 4, 5};
  for (DType xt : {DType::F32, DType::F16, DType::BF16, DType::I32})
    for (DType yt : {DType::U8, DType::I8})
      for (int variant = 0; variant < 5; ++variant) {
        // 0: scalar scale, no zero point; 1: scalar scale and zero point;
        // 2: per axis 1; 3: per axis 0 (given as -3); 4: per axis 2, no zero point.
        const std::int64_t axis = variant == 3 ? -3 : variant == 4 ? 2 : 1;
        const std::size_t ax = static_cast<std::size_t>(axis < 0 ? axis + 3 : axis);
        const bool per_axis = variant >= 2;
        const std::int64_t count = per_axis ? shape[ax] : 1;
        Host scale(DType::F32, per_axis ? Shape{count} : (variant == 0 ? Shape{} : Shape{1}));
        for (auto& s : scale.v)  // powers of two make exact ties possible
          s = rng_.coin() ? std::ldexp(1.0, static_cast<int>(rng_.integer(-3, 1))) : f32(rng_.uniform(0.01, 2));
        std::optional<Host> zp;
        if (variant != 0 && variant != 4) {
          zp = rand_int(rng_, yt, per_axis ? Shape{count} : Shape{});
          for (auto& z : zp->v) z = std::clamp(z, yt == DType::U8 ? 60.0 : -60.0, yt == DType::U8 ? 200.0 : 60.0);
        }
        Host x(xt, shape);
        for_each_index(shape, [&](const Shape& idx, std::int64_t lin) {
          const double s = scale.v[per_axis ? static_cast<std::size_t>(idx[ax]) : 0];
          double v = 0;
          switch (rng_.integer(0, 4)) {
            case 0:  // a tie: (k + 0.5) * s, exact where s is a power of two
              v = (static_cast<double>(rng_.integer(xt == DType::BF16 ? -60 : -150, xt == DType::BF16 ? 60 : 150)) +
                   0.5) *
                  s;
              if (xt == DType::I32) v = 2 * static_cast<double>(rng_.integer(-150, 150)) + 1;  // odd / 2 with s = 2
              break;
            case 1: v = rng_.uniform(-300, 300) * s; break;
            case 2: v = (rng_.coin() ? 1 : -1) * (xt == DType::F16 ? 60000.0 : 1e6); break;  // saturates
            case 3:
              v = is_float(xt) ? (rng_.coin() ? kInf : -kInf) : (rng_.coin() ? 2147483647.0 : -2147483648.0);
              break;
            default: v = rng_.uniform(-3, 3); break;
          }
          x.v[static_cast<std::size_t>(lin)] = is_float(xt) ? round_to(xt, v) : std::round(v);
        });
        std::vector<double> want;
        for_each_index(shape, [&](const Shape& idx, std::int64_t lin) {
          const std::size_t p = per_axis ? static_cast<std::size_t>(idx[ax]) : 0;
          want.push_back(quantize_ref(x.v[static_cast<std::size_t>(lin)], xt, scale.v[p],
                                      zp ? static_cast<std::int64_t>(zp->v[p]) : 0, yt));
        });
        const Tensor y = lab().output(yt, shape);
        std::optional<Tensor> tz;
        if (zp) tz = lab().upload(*zp);
        const Host got = lab().run(ops::quantize(lab().upload(x), lab().upload(scale), tz, y, axis), y);
        expect_exact(
            "quantize " + std::string(to_string(xt)) + " -> " + to_string(yt) + " variant " + std::to_string(variant),
            got, want);
      }
}

TEST_P(Ops, DequantizePerTensorAndPerAxis) {
  const Shape shape{4, 3, 5};
  for (DType xt : {DType::U8, DType::I8, DType::I32})
    for (DType yt : {DType::F32, DType::F16, DType::BF16})
      for (int variant = 0; variant < 4; ++variant) {
        const std::int64_t axis = variant == 3 ? -1 : variant == 2 ? 0 : 1;
        const std::size_t ax = static_cast<std::size_t>(axis < 0 ? axis + 3 : axis);
        const bool per_axis = variant >= 2;
        const std::int64_t count = per_axis ? shape[ax] : 1;
        Host scale = rand(DType::F32, per_axis ? Shape{count} : Shape{}, 1e-3, 2);
        std::optional<Host> zp;
        if (variant != 0)
          zp = xt == DType::I32 ? rand_host(rng_, xt, per_axis ? Shape{count} : Shape{1}, -1e6, 1e6)
                                : rand_int(rng_, xt, per_axis ? Shape{count} : Shape{1});
        const Host x = xt == DType::I32 ? with_specials(rng_, rand_host(rng_, xt, shape, -1e8, 1e8), xt)
                                        : rand_int(rng_, xt, shape);
        std::vector<double> want;
        for_each_index(shape, [&](const Shape& idx, std::int64_t lin) {
          const std::size_t p = per_axis ? static_cast<std::size_t>(idx[ax]) : 0;
          const double d = x.v[static_cast<std::size_t>(lin)] - (zp ? zp->v[p] : 0.0);  // exact: |d| < 2^53
          want.push_back(round_to(yt, f32(f32(d) * scale.v[p])));                       // (x - zp) * scale in f32
        });
        const Tensor y = lab().output(yt, shape);
        std::optional<Tensor> tz;
        if (zp) tz = lab().upload(*zp);
        const Host got = lab().run(ops::dequantize(lab().upload(x), lab().upload(scale), tz, y, axis), y);
        expect_exact(
            "dequantize " + std::string(to_string(xt)) + " -> " + to_string(yt) + " variant " + std::to_string(variant),
            got, want);
      }
}

// qlinear_add: the bits of dequantize, an f32 add and quantize in a row,
// for every signedness of a, b and y; dense operands (the vector kernel,
// lengths with tails), b broadcast and a strided (one element at a time).
TEST_P(Ops, QLinearAddIsDequantizeAddQuantizeInF32) {
  for (DType at : {DType::U8, DType::I8})
    for (DType bt : {DType::U8, DType::I8})
      for (DType yt : {DType::U8, DType::I8})
        for (int variant = 0; variant < 3; ++variant) {
          const Shape ys{rng_.integer(1, 4), rng_.integer(1, 70)};
          const Shape bs = variant == 1 ? Shape{1, ys[1]} : ys;
          const Host a = rand_int(rng_, at, ys), b = rand_int(rng_, bt, bs);
          // Powers of two make exact ties; then any scales.
          auto scale = [&] {
            return rng_.coin() ? std::ldexp(1.0, static_cast<int>(rng_.integer(-6, 1))) : f32(rng_.uniform(0.002, 0.3));
          };
          Host sa(DType::F32, {}), sb(DType::F32, {}), sy(DType::F32, {});
          sa.v = {scale()};
          sb.v = {scale()};
          sy.v = {scale()};
          const Host za = rand_int(rng_, at, {}), zb = rand_int(rng_, bt, {}), zy = rand_int(rng_, yt, {});
          std::vector<double> want;
          for_each_index(ys, [&](const Shape& idx, std::int64_t lin) {
            const double av = a.v[static_cast<std::size_t>(lin)];
            const double bv = b.v[static_cast<std::size_t>(variant == 1 ? idx[1] : lin)];
            const double fa = f32((av - za.v[0]) * sa.v[0]), fb = f32((bv - zb.v[0]) * sb.v[0]);
            want.push_back(quantize_ref(f32(fa + fb), DType::F32, sy.v[0], static_cast<std::int64_t>(zy.v[0]), yt));
          });
          const Tensor ta = variant == 2 ? lab().upload_view(a, {1, ys[0]}, 3) : lab().upload(a);
          const Tensor y = lab().output(yt, ys);
          const Host got =
              lab().run(ops::qlinear_add(ta, lab().upload(sa), lab().upload(za), lab().upload(b), lab().upload(sb),
                                         lab().upload(zb), lab().upload(sy), lab().upload(zy), y),
                        y);
          expect_exact("qlinear_add " + std::string(to_string(at)) + " + " + to_string(bt) + " -> " + to_string(yt) +
                           " " + dims(ys) + " variant " + std::to_string(variant),
                       got, want);
        }
}

// qlinear_mul: dequantize both, multiply and quantize, each step one f32
// operation, as QLinearAdd above.
TEST_P(Ops, QLinearMulIsDequantizeMulQuantizeInF32) {
  for (DType at : {DType::U8, DType::I8})
    for (DType yt : {DType::U8, DType::I8})
      for (int variant = 0; variant < 2; ++variant) {
        const DType bt = variant ? at : DType::U8;
        const Shape ys{rng_.integer(1, 4), rng_.integer(1, 70)};
        const Shape bs = variant == 1 ? Shape{1, ys[1]} : ys;
        const Host a = rand_int(rng_, at, ys), b = rand_int(rng_, bt, bs);
        auto scale = [&] {
          return rng_.coin() ? std::ldexp(1.0, static_cast<int>(rng_.integer(-6, 1))) : f32(rng_.uniform(0.002, 0.3));
        };
        Host sa(DType::F32, {}), sb(DType::F32, {}), sy(DType::F32, {});
        sa.v = {scale()};
        sb.v = {scale()};
        sy.v = {scale()};
        const Host za = rand_int(rng_, at, {}), zb = rand_int(rng_, bt, {}), zy = rand_int(rng_, yt, {});
        std::vector<double> want;
        for_each_index(ys, [&](const Shape& idx, std::int64_t lin) {
          const double av = a.v[static_cast<std::size_t>(lin)];
          const double bv = b.v[static_cast<std::size_t>(variant == 1 ? idx[1] : lin)];
          const double fa = f32((av - za.v[0]) * sa.v[0]), fb = f32((bv - zb.v[0]) * sb.v[0]);
          want.push_back(quantize_ref(f32(fa * fb), DType::F32, sy.v[0], static_cast<std::int64_t>(zy.v[0]), yt));
        });
        const Tensor y = lab().output(yt, ys);
        const Host got =
            lab().run(ops::qlinear_mul(lab().upload(a), lab().upload(sa), lab().upload(za), lab().upload(b),
                                       lab().upload(sb), lab().upload(zb), lab().upload(sy), lab().upload(zy), y),
                      y);
        expect_exact("qlinear_mul " + std::string(to_string(at)) + " * " + to_string(bt) + " -> " + to_string(yt) +
                         " " + dims(ys) + " variant " + std::to_string(variant),
                     got, want);
      }
}

// qlinear_mul as a squeeze-and-excitation block's gate: x [n, h, w, c]
// times a gate [n, 1, 1, c], each image by its own gate's row. The images
// hold many times the kernel's stage of floats (its gate row repeated), so
// that a thread reuses the stage across an image's groups of rows and
// fills it again at the next image.
TEST_P(Ops, QLinearMulGatesEachImageByItsOwnRow) {
  const std::int64_t n = 3, h = rng_.integer(30, 45), w = rng_.integer(30, 45), c = rng_.integer(3, 40);
  const Shape xs{n, h, w, c}, gs{n, 1, 1, c};
  const Host x = rand_int(rng_, DType::U8, xs), g = rand_int(rng_, DType::U8, gs);
  Host sx(DType::F32, {}), sg(DType::F32, {}), sy(DType::F32, {});
  sx.v = {f32(rng_.uniform(0.002, 0.3))};
  sg.v = {f32(rng_.uniform(0.002, 0.01))};
  sy.v = {f32(rng_.uniform(0.002, 0.3))};
  const Host zx = rand_int(rng_, DType::U8, {}), zg = rand_int(rng_, DType::U8, {}), zy = rand_int(rng_, DType::U8, {});
  std::vector<double> want;
  for_each_index(xs, [&](const Shape& idx, std::int64_t lin) {
    const double xv = x.v[static_cast<std::size_t>(lin)];
    const double gv = g.v[static_cast<std::size_t>(idx[0] * c + idx[3])];
    const double fx = f32((xv - zx.v[0]) * sx.v[0]), fg = f32((gv - zg.v[0]) * sg.v[0]);
    want.push_back(quantize_ref(f32(fx * fg), DType::F32, sy.v[0], static_cast<std::int64_t>(zy.v[0]), DType::U8));
  });
  const Tensor y = lab().output(DType::U8, xs);
  const Host got =
      lab().run(ops::qlinear_mul(lab().upload(x), lab().upload(sx), lab().upload(zx), lab().upload(g), lab().upload(sg),
                                 lab().upload(zg), lab().upload(sy), lab().upload(zy), y),
                y);
  expect_exact("qlinear_mul gate " + dims(xs), got, want);
}

// qlinear_global_avg_pool (NHWC): the mean over h and w of the dequantized
// x, summed in f32 in (h, w) order and divided by H * W, then quantized.
TEST_P(Ops, QLinearGlobalAvgPoolSumsInRowOrderThenQuantizes) {
  for (DType xt : {DType::U8, DType::I8})
    for (DType yt : {DType::U8, DType::I8}) {
      const std::int64_t n = rng_.integer(1, 2), h = rng_.integer(1, 9), w = rng_.integer(1, 9),
                         c = rng_.integer(1, 40);
      const Host x = rand_int(rng_, xt, {n, h, w, c});
      Host sx(DType::F32, {}), sy(DType::F32, {});
      sx.v = {f32(rng_.uniform(0.002, 0.3))};
      sy.v = {rng_.coin() ? sx.v[0] : f32(rng_.uniform(0.002, 0.3))};
      const Host zx = rand_int(rng_, xt, {}), zy = rand_int(rng_, yt, {});
      std::vector<double> want;
      for (std::int64_t in = 0; in < n; ++in)
        for (std::int64_t ic = 0; ic < c; ++ic) {
          double sum = 0;
          for (std::int64_t ih = 0; ih < h; ++ih)
            for (std::int64_t iw = 0; iw < w; ++iw) {
              const double v = x.v[static_cast<std::size_t>(((in * h + ih) * w + iw) * c + ic)];
              sum = f32(sum + f32((v - zx.v[0]) * sx.v[0]));
            }
          const double mean = f32(sum / static_cast<double>(h * w));
          want.push_back(quantize_ref(mean, DType::F32, sy.v[0], static_cast<std::int64_t>(zy.v[0]), yt));
        }
      const Tensor y = lab().output(yt, {n, 1, 1, c});
      const Host got = lab().run(ops::qlinear_global_avg_pool(lab().upload(x), lab().upload(sx), lab().upload(zx),
                                                              lab().upload(sy), lab().upload(zy), y),
                                 y);
      expect_exact(
          "qlinear_global_avg_pool " + std::string(to_string(xt)) + " -> " + to_string(yt) + " " + dims(x.shape), got,
          want);
    }
}

}  // namespace
}  // namespace tpuhal::ops_test
