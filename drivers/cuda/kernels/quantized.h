// The quantized family's kernels (kernel.h): quantize, dequantize, the
// qlinear ops that dequantize, compute in f32 and quantize again, and the
// other dense kinds routed here (softmax, resize, colour conversion).
//
// The integer results are the simulated board's bits (docs/ops.md): every
// step is the one f32 operation the simulator performs, in its order
// (simulator/src/tensor/elementwise.cpp, spatial.cpp, simd_kernels.inc),
// and rounding to an integer is rintf in the default mode, to nearest
// with ties to even, as the simulator's nearbyint is.
#pragma once

#include <math.h>

#include "kernel.h"

namespace tpuhal::cuda::k {

namespace quant {

// The attribute enumerations' values (tpuhal/op_enums.inc; the launcher
// checks they agree).
enum : std::uint32_t { kResizeNearest = 0, kResizeLinear = 1 };
enum : std::uint32_t {
  kHalfPixel = 0,
  kAsymmetric = 1,
  kAlignCorners = 2,
  kPytorchHalfPixel = 3,
  kTfHalfPixelForNn = 4
};
enum : std::uint32_t { kRoundPreferFloor = 0, kRoundPreferCeil = 1, kNearestFloor = 2, kNearestCeil = 3 };

TK_FN std::int32_t int_min(std::uint32_t dtype) { return dtype == kI8 ? -128 : dtype == kU8 ? 0 : -2147483647 - 1; }
TK_FN std::int32_t int_max(std::uint32_t dtype) { return dtype == kI8 ? 127 : dtype == kU8 ? 255 : 2147483647; }

// A quantized level: clamp(round_half_even(v) + zero, lo, hi), NaN as 0
// before the zero point. Clamping v to [lo - zero, hi - zero] first gives
// the same level (rounding is monotonic and keeps integers) and keeps the
// conversion to an integer in range; zero is within a byte type's range.
TK_FN std::int32_t level(float v, std::int32_t zero, std::int32_t lo, std::int32_t hi) {
  const float below = static_cast<float>(lo - zero), above = static_cast<float>(hi - zero);
  v = v != v ? 0.0f : v;
  v = v < below ? below : v;
  v = v > above ? above : v;
  return static_cast<std::int32_t>(::rintf(v)) + zero;
}

// Round half to even, then saturate to [lo, hi]; NaN gives 0 (the
// simulator's round_saturate).
TK_FN std::int32_t round_saturate(float v, std::int32_t lo, std::int32_t hi) {
  if (v != v) return 0;
  const float r = ::rintf(v);
  if (r <= static_cast<float>(lo)) return lo;
  if (r >= static_cast<float>(hi)) return hi;
  return static_cast<std::int32_t>(r);
}

// Stores an f32 as t's dtype: floats round to nearest even, integers take
// the nearest even integer and saturate (the simulator's store_float).
TK_FN void store_rounded(const Tensor& t, std::int64_t off, float v) {
  if (is_float(t.dtype))
    store_f(t, off, v);
  else
    store_i(t, off, round_saturate(v, int_min(t.dtype), int_max(t.dtype)));
}

// One value of a scalar operand (every stride 0): element 0.
TK_FN float scalar_f(const Tensor& t) { return *at<const float>(t, 0); }
TK_FN std::int32_t scalar_i(const Tensor& t) { return load_i(t, 0); }

// A byte minus its zero point, times its scale, in f32: dequantize's step.
TK_FN float dequantized(const Tensor& t, std::int64_t off, std::int32_t zero, float scale) {
  return static_cast<float>(load_i(t, off) - zero) * scale;
}

}  // namespace quant

// ---- quantize, dequantize --------------------------------------------------------
//
// X, Scale, ZeroPoint (addr 0 when absent), Y: the scale and zero point
// arrive broadcast to X's shape (per axis or one value), and X and Y share
// a shape, so one linear index addresses all four.

struct QuantizeParams {
  std::uint64_t n;
  Tensor x, scale, zero, y;
};

// y = clamp(round_half_even(x / scale) + zero, lo, hi), in f32.
TK_FN void quantize_body(const QuantizeParams& p, std::uint64_t i) {
  const float x = load_f(p.x, offset_of(p.x, i));
  const float s = *at<const float>(p.scale, offset_of(p.scale, i));
  const std::int32_t z = p.zero.addr ? load_i(p.zero, offset_of(p.zero, i)) : 0;
  store_i(p.y, offset_of(p.y, i), quant::level(x / s, z, quant::int_min(p.y.dtype), quant::int_max(p.y.dtype)));
}

// y = (x - zero) * scale in f32, the difference formed exactly (an i32
// minus an i32 may need 33 bits) and rounded to f32 once.
TK_FN void dequantize_body(const QuantizeParams& p, std::uint64_t i) {
  const std::int64_t z = p.zero.addr ? load_i(p.zero, offset_of(p.zero, i)) : 0;
  const std::int64_t d = static_cast<std::int64_t>(load_i(p.x, offset_of(p.x, i))) - z;
  const float s = *at<const float>(p.scale, offset_of(p.scale, i));
  store_f(p.y, offset_of(p.y, i), static_cast<float>(d) * s);
}

// ---- qlinear_add, qlinear_mul --------------------------------------------------------
//
// A, AScale, AZeroPoint, B, BScale, BZeroPoint, YScale, YZeroPoint, Y: A
// and B broadcast to Y's shape, the scales and zero points one value each.

struct QLinearBinaryParams {
  std::uint64_t n;
  Tensor a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero, y;
  std::uint32_t mul;  // 0: add, 1: multiply
  std::uint32_t reserved;
};

// Dequantize both, add or multiply in f32, quantize: each one f32 operation.
TK_FN void qlinear_binary_body(const QLinearBinaryParams& p, std::uint64_t i) {
  const float fa = quant::dequantized(p.a, offset_of(p.a, i), quant::scalar_i(p.a_zero), quant::scalar_f(p.a_scale));
  const float fb = quant::dequantized(p.b, offset_of(p.b, i), quant::scalar_i(p.b_zero), quant::scalar_f(p.b_scale));
  const float r = p.mul ? fa * fb : fa + fb;
  const std::int32_t q = quant::level(r / quant::scalar_f(p.y_scale), quant::scalar_i(p.y_zero),
                                      quant::int_min(p.y.dtype), quant::int_max(p.y.dtype));
  store_i(p.y, offset_of(p.y, i), q);
}

// ---- qlinear_global_avg_pool ----------------------------------------------------------
//
// X [N, H, W, C], XScale, XZeroPoint, YScale, YZeroPoint, Y [N, 1, 1, C]:
// one item per (n, c), its taps summed in (h, w) order, each dequantized
// and added in f32, the sum divided by H * W, then quantized.

struct QLinearGapParams {
  std::uint64_t n;  // N * C
  Tensor x, x_scale, x_zero, y_scale, y_zero, y;
};

TK_FN void qlinear_gap_body(const QLinearGapParams& p, std::uint64_t i) {
  const std::uint64_t c = p.x.shape[3], ni = i / c, ci = i % c;
  const std::uint64_t h = p.x.shape[1], w = p.x.shape[2], taps = h * w;
  float mean = 0.0f;
  if (taps != 0) {  // an image of no pixels: its scale and zero point are not read
    const float xs = quant::scalar_f(p.x_scale);
    const std::int32_t xz = quant::scalar_i(p.x_zero);
    const std::int64_t base =
        static_cast<std::int64_t>(ni) * p.x.strides[0] + static_cast<std::int64_t>(ci) * p.x.strides[3];
    float acc = 0.0f;
    for (std::uint64_t r = 0; r < h; ++r)
      for (std::uint64_t col = 0; col < w; ++col)
        acc += quant::dequantized(
            p.x, base + static_cast<std::int64_t>(r) * p.x.strides[1] + static_cast<std::int64_t>(col) * p.x.strides[2],
            xz, xs);
    mean = acc / static_cast<float>(taps);
  }
  const std::int32_t q = quant::level(mean / quant::scalar_f(p.y_scale), quant::scalar_i(p.y_zero),
                                      quant::int_min(p.y.dtype), quant::int_max(p.y.dtype));
  const std::int64_t out =
      static_cast<std::int64_t>(ni) * p.y.strides[0] + static_cast<std::int64_t>(ci) * p.y.strides[3];
  store_i(p.y, out, q);
}

// ---- softmax -----------------------------------------------------------------------
//
// One item per line along the axis. x and y carry the shape with the axis
// collapsed to 1 (offset_of gives a line's first element); the line's
// elements are x_step and y_step apart. As the simulator computes it: the
// maximum (a NaN never replaces it), the sum of expf(x - max) in index
// order, then each output from expf again (or the log of the sum).

struct SoftmaxParams {
  std::uint64_t n;  // lines
  Tensor x, y;
  std::uint64_t len;
  std::int64_t x_step, y_step;
  std::uint32_t log;
  std::uint32_t reserved;
};

TK_FN void softmax_body(const SoftmaxParams& p, std::uint64_t i) {
  const std::int64_t xb = offset_of(p.x, i), yb = offset_of(p.y, i);
  float mx = bits_float(0xff800000u);  // -inf
  for (std::uint64_t j = 0; j < p.len; ++j) {
    const float v = load_f(p.x, xb + static_cast<std::int64_t>(j) * p.x_step);
    mx = mx < v ? v : mx;
  }
  float sum = 0.0f;
  for (std::uint64_t j = 0; j < p.len; ++j)
    sum += ::expf(load_f(p.x, xb + static_cast<std::int64_t>(j) * p.x_step) - mx);
  const float log_sum = ::logf(sum);
  for (std::uint64_t j = 0; j < p.len; ++j) {
    const float t = load_f(p.x, xb + static_cast<std::int64_t>(j) * p.x_step) - mx;
    store_f(p.y, yb + static_cast<std::int64_t>(j) * p.y_step, p.log ? t - log_sum : ::expf(t) / sum);
  }
}

// ---- resize ------------------------------------------------------------------------
//
// One item per output element, over H and W of a 4-D image (NCHW or NHWC);
// each item maps its row and column to the input as the simulator's table
// of taps does (the same f32 operations), so nearest copies the element's
// bytes and bilinear interpolates in f32 and stores as store_float does.

struct ResizeParams {
  std::uint64_t n;
  Tensor x, y;
  std::uint32_t mode, coordinate, nearest, nhwc;
  float scale[2];  // rows, columns
};

namespace quant {

// Where output coordinate o reads (ONNX Resize): the resized length is
// in_len * scale, unrounded.
TK_FN float source_coordinate(std::uint32_t mode, float o, float scale, std::uint64_t in_len) {
  const float resized = static_cast<float>(in_len) * scale;
  switch (mode) {
    case kHalfPixel: return (o + 0.5f) / scale - 0.5f;
    case kAsymmetric: return o / scale;
    case kAlignCorners: return resized == 1.0f ? 0.0f : o * static_cast<float>(in_len - 1) / (resized - 1.0f);
    case kPytorchHalfPixel: return resized > 1.0f ? (o + 0.5f) / scale - 0.5f : 0.0f;
    case kTfHalfPixelForNn: return (o + 0.5f) / scale;
    default: return o / scale;
  }
}

// An integral float as an index, saturated far outside any axis (and NaN
// as 0), so that the conversion is defined for every coordinate.
TK_FN std::int64_t index_of(float f) {
  constexpr float kFar = 1099511627776.0f;  // 2^40, beyond every length
  f = f != f ? 0.0f : f;
  f = f < -kFar ? -kFar : f;
  f = f > kFar ? kFar : f;
  return static_cast<std::int64_t>(f);
}

TK_FN std::int64_t nearest_index(std::uint32_t mode, float x) {
  const float fl = ::floorf(x);
  switch (mode) {
    case kRoundPreferFloor: return index_of(x == fl + 0.5f ? fl : ::roundf(x));
    case kRoundPreferCeil: return index_of(x == fl + 0.5f ? ::ceilf(x) : ::roundf(x));
    case kNearestCeil: return index_of(::ceilf(x));
    default: return index_of(fl);
  }
}

TK_FN std::uint64_t clamp_index(std::int64_t i, std::uint64_t len) {
  const std::int64_t last = static_cast<std::int64_t>(len) - 1;
  return static_cast<std::uint64_t>(i < 0 ? 0 : i > last ? last : i);
}

// One output row's or column's taps: the two neighbours (edges replicated)
// and the weight of the second; nearest: one index, twice.
struct Tap {
  std::uint64_t i0, i1;
  float w;
};

TK_FN Tap tap_of(const ResizeParams& p, std::uint64_t o, float scale, std::uint64_t in_len) {
  const float src = source_coordinate(p.coordinate, static_cast<float>(o), scale, in_len);
  if (p.mode != kResizeLinear) {
    const std::uint64_t i = clamp_index(nearest_index(p.nearest, src), in_len);
    return {i, i, 0.0f};
  }
  const float f = ::floorf(src);
  const std::int64_t fi = index_of(f);
  return {clamp_index(fi, in_len), clamp_index(fi + 1, in_len), src - f};
}

// Element offset of (n, c, h, w) in a 4-D image of either layout.
TK_FN std::int64_t at4(const Tensor& t, bool nhwc, std::uint64_t n, std::uint64_t c, std::uint64_t h, std::uint64_t w) {
  const std::uint64_t idx[4] = {n, nhwc ? h : c, nhwc ? w : h, nhwc ? c : w};
  return offset_at(t, idx);
}

}  // namespace quant

TK_FN void resize_body(const ResizeParams& p, std::uint64_t i) {
  const bool nhwc = p.nhwc != 0;
  std::uint64_t idx[4], lin = i;
  for (std::uint32_t d = 4; d-- > 0;) {
    idx[d] = lin % p.y.shape[d];
    lin /= p.y.shape[d];
  }
  const std::uint64_t n = idx[0], c = nhwc ? idx[3] : idx[1], r = nhwc ? idx[1] : idx[2], col = nhwc ? idx[2] : idx[3];
  const std::uint64_t ih = p.x.shape[nhwc ? 1 : 2], iw = p.x.shape[nhwc ? 2 : 3];
  const quant::Tap ty = quant::tap_of(p, r, p.scale[0], ih), tx = quant::tap_of(p, col, p.scale[1], iw);
  const std::int64_t out = offset_at(p.y, idx);
  if (p.mode != quant::kResizeLinear) {
    const std::uint32_t size = size_of(p.y.dtype);
    const auto* from =
        reinterpret_cast<const unsigned char*>(p.x.addr) + quant::at4(p.x, nhwc, n, c, ty.i0, tx.i0) * size;
    auto* to = reinterpret_cast<unsigned char*>(p.y.addr) + out * size;
    for (std::uint32_t b = 0; b < size; ++b) to[b] = from[b];
    return;
  }
  auto px = [&](std::uint64_t yy, std::uint64_t xx) { return load_f(p.x, quant::at4(p.x, nhwc, n, c, yy, xx)); };
  const float top = px(ty.i0, tx.i0) * (1 - tx.w) + px(ty.i0, tx.i1) * tx.w;
  const float bottom = px(ty.i1, tx.i0) * (1 - tx.w) + px(ty.i1, tx.i1) * tx.w;
  quant::store_rounded(p.y, out, top * (1 - ty.w) + bottom * ty.w);
}

// ---- colour conversion --------------------------------------------------------------
//
// Luma [H, W], chroma (NV12: [H/2, W/2, 2], U then V; I420: U and V, each
// [H/2, W/2]), Y [3, H, W]. One item per pixel, writing its three channels.
// BT.601 limited range in f32, each operation as the simulator orders it,
// clamped to [0, 255], then (value - mean) * scale, stored as store_float
// stores (u8: nearest even, saturated).

struct ColorParams {
  std::uint64_t n;  // H * W
  Tensor luma, c1, c2, y;
  std::uint32_t nv12;
  std::uint32_t reserved;
  float mean[3], scale[3];
};

TK_FN void color_body(const ColorParams& p, std::uint64_t i) {
  const std::uint64_t w = p.luma.shape[1], r = i / w, col = i % w;
  const auto byte = [](const Tensor& t, std::int64_t off) {
    return static_cast<float>(*at<const std::uint8_t>(t, off));
  };
  const std::int64_t rr = static_cast<std::int64_t>(r), cc = static_cast<std::int64_t>(col);
  const float Y = byte(p.luma, rr * p.luma.strides[0] + cc * p.luma.strides[1]);
  const std::int64_t chroma = rr / 2 * p.c1.strides[0] + cc / 2 * p.c1.strides[1];
  const float U = byte(p.c1, chroma);
  const float V =
      p.nv12 ? byte(p.c1, chroma + p.c1.strides[2]) : byte(p.c2, rr / 2 * p.c2.strides[0] + cc / 2 * p.c2.strides[1]);
  const float yy = 1.164f * (Y - 16.0f), u = U - 128.0f, vv = V - 128.0f;
  const float rgb[3] = {yy + 1.596f * vv, yy - 0.813f * vv - 0.391f * u, yy + 2.018f * u};
  for (std::uint32_t k = 0; k < 3; ++k) {
    const float clamped = rgb[k] < 0.0f ? 0.0f : 255.0f < rgb[k] ? 255.0f : rgb[k];
    const std::int64_t out = static_cast<std::int64_t>(k) * p.y.strides[0] + rr * p.y.strides[1] + cc * p.y.strides[2];
    quant::store_rounded(p.y, out, (clamped - p.mean[k]) * p.scale[k]);
  }
}

}  // namespace tpuhal::cuda::k
