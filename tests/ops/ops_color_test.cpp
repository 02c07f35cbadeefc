// nv12_to_rgb and i420_to_rgb: BT.601 limited range.
#include "ops_reference.hpp"

namespace tpuhal::ops_test {
namespace {

TEST_P(Ops, Nv12AndI420ToRgbBt601LimitedRange) {
  for (ColorFormat fmt : {ColorFormat::NV12, ColorFormat::I420})
    for (DType yt : {DType::F32, DType::U8, DType::F16, DType::BF16})
      for (bool normalise : {false, true}) {
        const std::int64_t h = 2 * rng_.integer(1, 6), w = 2 * rng_.integer(1, 8);
        const Host luma = rand_int(rng_, DType::U8, {h, w});
        const Host u = rand_int(rng_, DType::U8, {h / 2, w / 2}), v = rand_int(rng_, DType::U8, {h / 2, w / 2});
        ColorConvertOptions o;
        if (normalise) {
          o.mean = {123.675f, 116.28f, 103.53f};
          o.scale = {1 / 58.395f, 1 / 57.12f, 1 / 57.375f};
          if (yt == DType::U8) o.scale = {0.5f, 0.25f, 2.0f};
        }
        const Tensor y = lab().output(yt, {3, h, w});
        Host got;
        if (fmt == ColorFormat::NV12) {
          Host uv(DType::U8, {h / 2, w / 2, 2});
          for (std::size_t i = 0; i < u.size(); ++i) {
            uv.v[2 * i] = u.v[i];
            uv.v[2 * i + 1] = v.v[i];
          }
          got = lab().run(ops::nv12_to_rgb(lab().upload(luma), lab().upload(uv), y, o), y);
        } else {
          got = lab().run(ops::i420_to_rgb(lab().upload(luma), lab().upload(u), lab().upload(v), y, o), y);
        }
        Ref want;
        want.v.resize(got.size());
        want.tol.resize(got.size());
        for (std::int64_t r = 0; r < h; ++r)
          for (std::int64_t c = 0; c < w; ++c) {
            const double Y = luma.v[static_cast<std::size_t>(r * w + c)];
            const double U = u.v[static_cast<std::size_t>((r / 2) * (w / 2) + c / 2)] - 128;
            const double V = v.v[static_cast<std::size_t>((r / 2) * (w / 2) + c / 2)] - 128;
            const double yy = 1.164 * (Y - 16);
            const double rgb[3] = {yy + 1.596 * V, yy - 0.813 * V - 0.391 * U, yy + 2.018 * U};
            for (std::int64_t k = 0; k < 3; ++k) {
              const double val = std::clamp(rgb[k], 0.0, 255.0);
              const double mean = o.mean[static_cast<std::size_t>(k)], sc = o.scale[static_cast<std::size_t>(k)];
              const double out = (val - mean) * sc;
              // f32 evaluation of terms up to ~600: a few roundings of
              // 2^-24 * 1024 each, and the coefficients as f32 (<= 6e-8
              // relative): 2e-4 in all; then one subtraction and one product.
              const double tol = (2e-4 + 2 * kU * (val + std::fabs(mean))) * std::fabs(sc) + 2 * kU * std::fabs(out);
              const auto at = static_cast<std::size_t>((k * h + r) * w + c);
              want.v[at] = out;
              want.tol[at] = tol + (is_float(yt) && yt != DType::F32 ? ulp(yt, out) : 0.0);
            }
          }
        const std::string what = std::string(fmt == ColorFormat::NV12 ? "nv12_to_rgb " : "i420_to_rgb ") +
                                 to_string(yt) + " " + std::to_string(h) + "x" + std::to_string(w) +
                                 (normalise ? " normalised" : "");
        if (is_float(yt))
          expect(what, got, want);
        else
          expect_rounded(what, got, want);
      }
}

// Planes read through strides (a transposed luma, NV12's chroma stored as
// two planes or column-major, I420's U transposed) and y written
// column-major give the bits the dense planes give.
TEST_P(Ops, ColourConversionReadsStridedPlanesAndWritesAStridedY) {
  const std::int64_t h = 6, w = 10, ch = h / 2, cw = w / 2;
  const Host luma = rand_int(rng_, DType::U8, {h, w});
  const Host u = rand_int(rng_, DType::U8, {ch, cw}), v = rand_int(rng_, DType::U8, {ch, cw});
  Host uv(DType::U8, {ch, cw, 2});
  for (std::size_t i = 0; i < u.size(); ++i) {
    uv.v[2 * i] = u.v[i];
    uv.v[2 * i + 1] = v.v[i];
  }
  ColorConvertOptions o;
  o.mean = {123.675f, 116.28f, 103.53f};
  o.scale = {1 / 58.395f, 1 / 57.12f, 1 / 57.375f};
  const Tensor luma_t = lab().upload_view(luma, {1, h + 1}, 3);
  for (DType yt : {DType::F32, DType::F16, DType::U8}) {
    if (yt == DType::U8) o.scale = {0.5f, 0.25f, 2.0f};
    const Tensor dense = lab().output(yt, {3, h, w});
    Buffer yb = dev().allocate(static_cast<std::uint64_t>(3 * h * w) * size_of(yt));
    const Tensor y(yb, yt, {3, h, w}, {h * w, 1, h}, 0);
    const Host want =
        lab().run(ops::i420_to_rgb(lab().upload(luma), lab().upload(u), lab().upload(v), dense, o), dense);
    const auto same = [&](const std::string& what, const Op& op) {
      expect_exact(what + " " + to_string(yt), lab().run(op, y), want.v);
    };
    same("i420, u transposed", ops::i420_to_rgb(luma_t, lab().upload_view(u, {1, ch + 2}, 1), lab().upload(v), y, o));
    same("nv12 dense", ops::nv12_to_rgb(lab().upload(luma), lab().upload(uv), y, o));
    same("nv12 as two planes", ops::nv12_to_rgb(luma_t, lab().upload_view(uv, {cw, 1, ch * cw}, 0), y, o));
    same("nv12 column-major", ops::nv12_to_rgb(luma_t, lab().upload_view(uv, {1, ch, ch * cw}, 2), y, o));
  }
}

}  // namespace
}  // namespace tpuhal::ops_test
