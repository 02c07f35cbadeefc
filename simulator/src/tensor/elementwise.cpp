// Elementwise maps (with cast and transpose as strided identity), softmax,
// quantize and dequantize.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "engine.h"
#include "numerics.h"
#include "simd.h"

namespace tpuhal::sim::tensor {
namespace {

std::int64_t int_binary(fw::ElementwiseOp op, std::int64_t a, std::int64_t b) {
  switch (op) {
    case fw::ElementwiseOp::kAdd: return a + b;
    case fw::ElementwiseOp::kSub: return a - b;
    case fw::ElementwiseOp::kMul: return a * b;
    case fw::ElementwiseOp::kDiv: return b == 0 ? 0 : a / b;   // toward zero; x / 0 = 0
    case fw::ElementwiseOp::kFmod: return b == 0 ? 0 : a % b;  // the dividend's sign; x fmod 0 = 0
    case fw::ElementwiseOp::kMod: {                            // the divisor's sign; x mod 0 = 0
      if (b == 0) return 0;
      const std::int64_t r = a % b;
      return r != 0 && (r < 0) != (b < 0) ? r + b : r;
    }
    case fw::ElementwiseOp::kMax: return std::max(a, b);
    case fw::ElementwiseOp::kMin: return std::min(a, b);
    default: return a;
  }
}

float float_binary(fw::ElementwiseOp op, float a, float b) {
  switch (op) {
    case fw::ElementwiseOp::kAdd: return a + b;
    case fw::ElementwiseOp::kSub: return a - b;
    case fw::ElementwiseOp::kMul: return a * b;
    case fw::ElementwiseOp::kDiv: return a / b;
    case fw::ElementwiseOp::kFmod: return std::fmod(a, b);  // exact
    case fw::ElementwiseOp::kMod: {  // as numpy.mod: fmod moved to the divisor's sign; a zero takes b's sign
      const float r = std::fmod(a, b);
      return r == 0 ? std::copysign(0.0f, b) : (r < 0) != (b < 0) ? r + b : r;
    }
    case fw::ElementwiseOp::kMax:
      return std::isnan(a) || std::isnan(b) ? std::numeric_limits<float>::quiet_NaN() : std::max(a, b);
    case fw::ElementwiseOp::kMin:
      return std::isnan(a) || std::isnan(b) ? std::numeric_limits<float>::quiet_NaN() : std::min(a, b);
    default: return a;
  }
}

float float_unary(const fw::ElementwiseAttrs& at, float x) {
  switch (static_cast<fw::ElementwiseOp>(at.op)) {
    case fw::ElementwiseOp::kActivation:
      return activate(static_cast<fw::Activation>(at.activation), at.alpha, at.beta, x);
    case fw::ElementwiseOp::kAbs: return std::fabs(x);
    case fw::ElementwiseOp::kNeg: return -x;
    case fw::ElementwiseOp::kExp: return std::exp(x);
    case fw::ElementwiseOp::kLog: return std::log(x);
    case fw::ElementwiseOp::kSqrt: return std::sqrt(x);
    case fw::ElementwiseOp::kErf: return simd::erf_f32(x);
    case fw::ElementwiseOp::kCeil: return std::ceil(x);
    case fw::ElementwiseOp::kFloor: return std::floor(x);
    case fw::ElementwiseOp::kRound: return std::nearbyint(x);  // the default mode: ties to even
    case fw::ElementwiseOp::kSin: return std::sin(x);
    case fw::ElementwiseOp::kCos: return std::cos(x);
    case fw::ElementwiseOp::kTan: return std::tan(x);
    case fw::ElementwiseOp::kAsin: return std::asin(x);
    case fw::ElementwiseOp::kAcos: return std::acos(x);
    case fw::ElementwiseOp::kAtan: return std::atan(x);
    case fw::ElementwiseOp::kSinh: return std::sinh(x);
    case fw::ElementwiseOp::kCosh: return std::cosh(x);
    case fw::ElementwiseOp::kAsinh: return std::asinh(x);
    case fw::ElementwiseOp::kAcosh: return std::acosh(x);
    case fw::ElementwiseOp::kAtanh: return std::atanh(x);
    default: return x;
  }
}

// Casts one element: to float types round to nearest even; float to integer
// rounds toward zero and saturates (NaN: 0); integer to narrower integer
// saturates.
void cast_one(const std::byte* src, fw::DType st, std::byte* dst, fw::DType to) {
  if (is_float(to)) {
    store_float(dst, to, is_float(st) ? load_float(src, st) : static_cast<float>(load_int(src, st)));
    return;
  }
  const std::int64_t v = is_float(st) ? truncate_saturate(load_float(src, st), int_min(to), int_max(to))
                                      : std::clamp<std::int64_t>(load_int(src, st), int_min(to), int_max(to));
  store_int_wrap(dst, to, v);
}

// Float maps with every view f32 (the common case), a row at a time: the
// dims are merged where every view allows it, then each row of the last
// dim runs as one loop with the op chosen outside it. Each element's
// arithmetic is float_binary's / float_unary's, so results are the
// generic path's.
// Elements below which a map runs on one thread.
constexpr std::uint64_t kGrain = 16384;

struct Rows {
  std::uint32_t rank = 0;
  std::uint64_t shape[fw::kMaxRank] = {};
  std::uint64_t strides[3][fw::kMaxRank] = {};  // y, a, b
};

Rows merged(const View* const* views, std::size_t n) {
  Rows r;
  for (std::uint32_t d = 0; d < views[0]->rank; ++d) {
    const std::uint64_t len = views[0]->shape[d];
    if (len == 1) continue;
    bool merge = r.rank > 0;
    for (std::size_t t = 0; t < n && merge; ++t) merge = r.strides[t][r.rank - 1] == views[t]->strides[d] * len;
    if (merge) {
      r.shape[r.rank - 1] *= len;
      for (std::size_t t = 0; t < n; ++t) r.strides[t][r.rank - 1] = views[t]->strides[d];
      continue;
    }
    r.shape[r.rank] = len;
    for (std::size_t t = 0; t < n; ++t) r.strides[t][r.rank] = views[t]->strides[d];
    ++r.rank;
  }
  if (r.rank == 0) {  // one element
    r.rank = 1;
    r.shape[0] = 1;
  }
  return r;
}

// The element offsets of each view at the start of row `row` (every dim
// but the last, in order).
void row_offsets(const Rows& r, std::uint64_t row, std::uint64_t* off) {
  off[0] = off[1] = off[2] = 0;
  for (std::uint32_t d = r.rank - 1; d-- > 0;) {
    const std::uint64_t i = row % r.shape[d];
    row /= r.shape[d];
    for (int t = 0; t < 3; ++t) off[t] += i * r.strides[t][d];
  }
}

template <class F>
void binary_row(float* y, const float* a, std::uint64_t sa, const float* b, std::uint64_t sb, std::uint64_t n, F f) {
  if (sa == 1 && sb == 1) {
    for (std::uint64_t i = 0; i < n; ++i) y[i] = f(a[i], b[i]);
  } else if (sa == 1 && sb == 0) {
    const float bv = *b;
    for (std::uint64_t i = 0; i < n; ++i) y[i] = f(a[i], bv);
  } else if (sa == 0 && sb == 1) {
    const float av = *a;
    for (std::uint64_t i = 0; i < n; ++i) y[i] = f(av, b[i]);
  } else {
    for (std::uint64_t i = 0; i < n; ++i) y[i] = f(a[i * sa], b[i * sb]);
  }
}

void binary_row(fw::ElementwiseOp op, float* y, const float* a, std::uint64_t sa, const float* b, std::uint64_t sb,
                std::uint64_t n) {
  // The four arithmetic ops on dense or broadcast operands: the vector
  // loops of the engine's level (the same bits).
  if (sa <= 1 && sb <= 1) {
    switch (op) {
      case fw::ElementwiseOp::kAdd: return simd::arith_f32(simd::Arith::kAdd, y, a, sa, b, sb, n);
      case fw::ElementwiseOp::kSub: return simd::arith_f32(simd::Arith::kSub, y, a, sa, b, sb, n);
      case fw::ElementwiseOp::kMul: return simd::arith_f32(simd::Arith::kMul, y, a, sa, b, sb, n);
      case fw::ElementwiseOp::kDiv: return simd::arith_f32(simd::Arith::kDiv, y, a, sa, b, sb, n);
      default: break;
    }
  }
  switch (op) {
    case fw::ElementwiseOp::kAdd: return binary_row(y, a, sa, b, sb, n, [](float u, float v) { return u + v; });
    case fw::ElementwiseOp::kSub: return binary_row(y, a, sa, b, sb, n, [](float u, float v) { return u - v; });
    case fw::ElementwiseOp::kMul: return binary_row(y, a, sa, b, sb, n, [](float u, float v) { return u * v; });
    case fw::ElementwiseOp::kDiv: return binary_row(y, a, sa, b, sb, n, [](float u, float v) { return u / v; });
    default: return binary_row(y, a, sa, b, sb, n, [op](float u, float v) { return float_binary(op, u, v); });
  }
}

// One chunk of a map over f32 rows: y[i] = op(a[i * sa], b[i * sb]).
void map_row(const fw::ElementwiseAttrs& at, float* yr, const float* ar, std::uint64_t sa, const float* br,
             std::uint64_t sb, std::uint64_t n) {
  const auto op = static_cast<fw::ElementwiseOp>(at.op);
  if (fw::is_binary(op)) {
    binary_row(op, yr, ar, sa, br, sb, n);
  } else if (op == fw::ElementwiseOp::kActivation && sa == 1) {
    if (yr != ar) std::memmove(yr, ar, n * sizeof(float));
    activate_span(static_cast<fw::Activation>(at.activation), at.alpha, at.beta, yr, n);
  } else if (op == fw::ElementwiseOp::kErf && sa == 1) {
    if (yr != ar) std::memmove(yr, ar, n * sizeof(float));
    simd::erf_f32s(yr, n);
  } else {
    for (std::uint64_t i = 0; i < n; ++i) yr[i] = float_unary(at, ar[i * sa]);
  }
}

// n elements of an f16 or bf16 row, `stride` apart, as f32 (exact).
void widen_row(fw::DType t, const std::uint16_t* in, std::uint64_t stride, float* out, std::uint64_t n) {
  if (stride == 1) {
    if (t == fw::DType::kF16)
      simd::widen_f16(in, out, n);
    else
      simd::widen_bf16(in, out, n);
    return;
  }
  for (std::uint64_t i = 0; i < n; ++i) out[i] = load_float(reinterpret_cast<const std::byte*>(in + i * stride), t);
}

// A float map of two operands over rows where one operand is the same row
// each time (a per-channel scale over every pixel: a squeeze-and-excitation
// block's Mul) and the other and y are dense across rows: that row staged
// side by side (widened once, for f16 and bf16), so that one call takes
// many rows (a call per row of 32 channels cost EfficientNet-B0's first Mul
// 100 us; in f16, four times its f32 time). Over a batch (an outer
// dimension along which y and the other operand stay dense), each image's
// row is staged in turn: at batch 8 the rows went one call each, and
// MobileNetV3-Small's gates took as long as its expanding convolutions.
// The same op on the same pairs of elements; halves widened exactly and
// each result rounded once, as float_rows does. False where the rows are
// not so.
bool repeated_rows(TensorEngine& e, const fw::ElementwiseAttrs& at, const Rows& r, const View& a, const View& b,
                   const View& y) {
  constexpr std::uint64_t kStage = 4096;  // floats of the repeated row, on the stack
  if (r.rank != 2 && r.rank != 3) return false;
  const std::uint32_t d = r.rank - 2;  // the rows' dimension (1: after the images')
  const std::uint64_t len = r.shape[d + 1], rows = r.shape[d], images = d ? r.shape[0] : 1;
  const auto &ys = r.strides[0], &as = r.strides[1], &bs = r.strides[2];
  const bool dense = ys[d + 1] == 1 && as[d + 1] == 1 && bs[d + 1] == 1 && ys[d] == len;
  const bool a_repeats = dense && as[d] == 0 && bs[d] == len, b_repeats = dense && bs[d] == 0 && as[d] == len;
  if (rows < 2 || len > kStage / 2 || !(a_repeats || b_repeats)) return false;
  const auto &once_s = a_repeats ? as : bs, &other_s = a_repeats ? bs : as;
  if (d && (ys[0] != rows * len || other_s[0] != rows * len)) return false;
  const fw::DType t = y.dtype;
  const bool half = t != fw::DType::kF32;
  const std::uint64_t group = kStage / len, per_image = (rows + group - 1) / group;  // rows per call
  const std::uint64_t once_step = d ? once_s[0] * y.esize : 0;                       // bytes between images' rows
  const std::byte* once = (a_repeats ? a : b).data;
  const std::byte* other = (a_repeats ? b : a).data;
  e.pool().parallel_for(
      images * per_image,
      [&](std::uint64_t begin, std::uint64_t end) {
        float stage[kStage];
        std::uint64_t staged = UINT64_MAX;  // the image whose row `stage` holds
        for (std::uint64_t k = begin; k < end; ++k) {
          const std::uint64_t image = k / per_image, g = k % per_image;
          if (image != staged) {
            const std::byte* row = once + image * once_step;
            if (half)
              widen_row(t, reinterpret_cast<const std::uint16_t*>(row), 1, stage, len);
            else
              std::memcpy(stage, row, len * sizeof(float));
            for (std::uint64_t i = 1; i < group; ++i) std::memcpy(stage + i * len, stage, len * sizeof(float));
            staged = image;
          }
          const std::uint64_t first = (image * rows + g * group) * len, n = std::min(group, rows - g * group) * len;
          if (!half) {
            const auto* o = reinterpret_cast<const float*>(other) + first;
            map_row(at, reinterpret_cast<float*>(y.data) + first, a_repeats ? stage : o, 1, a_repeats ? o : stage, 1,
                    n);
            continue;
          }
          // A block at a time, widened, mapped and rounded while it is in the
          // first-level cache.
          constexpr std::uint64_t kBlock = 1024;
          float wide[kBlock], out[kBlock];
          const auto* xh = reinterpret_cast<const std::uint16_t*>(other) + first;
          auto* yh = reinterpret_cast<std::uint16_t*>(y.data) + first;
          for (std::uint64_t s = 0; s < n; s += kBlock) {
            const std::uint64_t m = std::min(kBlock, n - s);
            widen_row(t, xh + s, 1, wide, m);
            map_row(at, out, a_repeats ? stage + s : wide, 1, a_repeats ? wide : stage + s, 1, m);
            t == fw::DType::kF16 ? simd::narrow_f16(out, yh + s, m) : simd::narrow_bf16(out, yh + s, m);
          }
        }
      },
      std::max<std::uint64_t>(1, kGrain / kStage));
  return true;
}

// A float map whose operands and result are one float dtype, over rows of
// the merged dimensions, the result dense along them. f16 and bf16 go
// through f32 a stretch at a time (widened exactly, computed as in f32,
// rounded once), the same bits as element by element.
bool float_rows(TensorEngine& e, const fw::ElementwiseAttrs& at, const View& a, const View& b, const View& y) {
  const auto op = static_cast<fw::ElementwiseOp>(at.op);
  const bool binary = fw::is_binary(op);
  const fw::DType t = y.dtype;
  if (!is_float(t) || a.dtype != t || (binary && b.dtype != t) || op == fw::ElementwiseOp::kIdentity) return false;
  const View* views[3] = {&y, &a, &b};
  const Rows r = merged(views, binary ? 3 : 2);
  const std::uint64_t len = r.shape[r.rank - 1];
  if (r.strides[0][r.rank - 1] != 1) return false;
  std::uint64_t rows = 1;  // every dim but the last
  for (std::uint32_t d = 0; d + 1 < r.rank; ++d) rows *= r.shape[d];
  const std::uint64_t sa = r.strides[1][r.rank - 1], sb = r.strides[2][r.rank - 1];
  if (binary && repeated_rows(e, at, r, a, b, y)) return true;
  // Split long single rows too, so that both threads work on a dense map.
  const std::uint64_t chunk = rows >= e.threads() ? len : (len + e.threads() - 1) / e.threads();
  const std::uint64_t per_row = (len + chunk - 1) / chunk;
  auto body = [&](std::uint64_t begin, std::uint64_t end) {
    std::uint64_t off[3];
    constexpr std::uint64_t kStage = 512;  // f16 and bf16: floats staged at a time, on the stack
    float ys[kStage], as[kStage], bs[kStage];
    for (std::uint64_t k = begin; k < end; ++k) {
      row_offsets(r, k / per_row, off);
      const std::uint64_t lo = k % per_row * chunk, n = std::min(chunk, len - lo);
      if (t == fw::DType::kF32) {
        map_row(at, reinterpret_cast<float*>(y.data) + off[0] + lo,
                reinterpret_cast<const float*>(a.data) + off[1] + lo * sa, sa,
                binary ? reinterpret_cast<const float*>(b.data) + off[2] + lo * sb : nullptr, sb, n);
        continue;
      }
      auto* yh = reinterpret_cast<std::uint16_t*>(y.data) + off[0] + lo;
      const auto* ah = reinterpret_cast<const std::uint16_t*>(a.data) + off[1] + lo * sa;
      const auto* bh = binary ? reinterpret_cast<const std::uint16_t*>(b.data) + off[2] + lo * sb : nullptr;
      for (std::uint64_t s = 0; s < n; s += kStage) {
        const std::uint64_t m = std::min(kStage, n - s);
        // A broadcast operand (stride 0) is one value: widened once.
        widen_row(t, ah + s * sa, sa, as, sa == 0 ? 1 : m);
        if (binary) widen_row(t, bh + s * sb, sb, bs, sb == 0 ? 1 : m);
        map_row(at, ys, as, sa == 0 ? 0 : 1, bs, sb == 0 ? 0 : 1, m);
        if (t == fw::DType::kF16)
          simd::narrow_f16(ys, yh + s, m);
        else
          simd::narrow_bf16(ys, yh + s, m);
      }
    }
  };
  e.pool().parallel_for(rows * per_row, body, std::max<std::uint64_t>(1, kGrain / chunk));
  return true;
}

// Calls f(T{}) with T the unsigned integer of `es` bytes; false where there
// is none (the caller copies bytes).
template <class F>
bool with_element_type(std::uint64_t es, F&& f) {
  switch (es) {
    case 1: f(std::uint8_t{}); return true;
    case 2: f(std::uint16_t{}); return true;
    case 4: f(std::uint32_t{}); return true;
    case 8: f(std::uint64_t{}); return true;
    default: return false;
  }
}

// Copies n elements of `es` bytes, `sy` and `sa` elements apart.
void strided_copy(std::byte* y, std::uint64_t sy, const std::byte* a, std::uint64_t sa, std::uint64_t n,
                  std::uint64_t es) {
  const bool typed = with_element_type(es, [&](auto t) {
    using T = decltype(t);
    auto* yt = reinterpret_cast<T*>(y);
    const auto* at = reinterpret_cast<const T*>(a);
    for (std::uint64_t i = 0; i < n; ++i) yt[i * sy] = at[i * sa];
  });
  if (!typed)
    for (std::uint64_t i = 0; i < n; ++i) std::memcpy(y + i * sy * es, a + i * sa * es, es);
}

// transpose_tile's lines of J elements (a constant), y dense: the
// compiler interleaves J inputs into whole vectors of y.
template <std::uint64_t J, class T>
void interleave(T* __restrict y, const T* __restrict a, std::uint64_t sa, std::uint64_t ni) {
  for (std::uint64_t i = 0; i < ni; ++i)
    for (std::uint64_t j = 0; j < J; ++j) y[i * J + j] = a[i + j * sa];
}

// Tiles of a transpose, `planes` of them py and pa elements apart (one
// call for a run of small ones: a channel shuffle's pixels): y[i * syr + j]
// = a[i + j * sa] for i < ni and j < nj (each tile fits in L1), without a
// call per line: NCHW to NHWC of an image's three channels is a line of
// three elements per pixel, and a channel shuffle's (ShuffleNet's) a line
// of its two groups.
void transpose_tiles(std::byte* y, std::uint64_t syr, const std::byte* a, std::uint64_t sa, std::uint64_t ni,
                     std::uint64_t nj, std::uint64_t es, std::uint64_t planes = 1, std::uint64_t py = 0,
                     std::uint64_t pa = 0) {
  const bool typed = with_element_type(es, [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, std::uint8_t>) {
      if (syr == nj) {  // bytes: every plane in one call, with the level's shuffles
        simd::interleave_8(reinterpret_cast<std::uint8_t*>(y), reinterpret_cast<const std::uint8_t*>(a), sa, ni, nj,
                           planes, py, pa);
        return;
      }
    }
    if constexpr (std::is_same_v<T, std::uint32_t>) {
      // f32, i32 lines of 3 and 4 (an image's NCHW planes), which this
      // file's loop copied element by element (0.3 of the time at 224x224);
      // two (a channel shuffle's) were 6 % slower that way, and stay.
      if (syr == nj && nj >= 3 && nj <= 4) {
        simd::interleave_32(reinterpret_cast<std::uint32_t*>(y), reinterpret_cast<const std::uint32_t*>(a), sa, ni, nj,
                            planes, py, pa);
        return;
      }
    }
    for (std::uint64_t p = 0; p < planes; ++p) {
      auto* yt = reinterpret_cast<T*>(y) + p * py;
      const auto* at = reinterpret_cast<const T*>(a) + p * pa;
      if (syr == nj && nj >= 2 && nj <= 4) {
        nj == 2   ? interleave<2>(yt, at, sa, ni)
        : nj == 3 ? interleave<3>(yt, at, sa, ni)
                  : interleave<4>(yt, at, sa, ni);
        continue;
      }
      for (std::uint64_t j = 0; j < nj; ++j)
        for (std::uint64_t i = 0; i < ni; ++i) yt[i * syr + j] = at[i + j * sa];
    }
  });
  if (!typed)
    for (std::uint64_t p = 0; p < planes; ++p)
      for (std::uint64_t i = 0; i < ni; ++i)
        strided_copy(y + (p * py + i * syr) * es, 1, a + (p * pa + i) * es, sa, nj, es);
}

// Rows up to this many bytes are copied by copy_short.
constexpr std::uint64_t kShortRow = 256;

// n bytes (at most kShortRow) from s to d, which do not overlap, in
// 16-byte moves, the last one ending at n (it may write again what the
// one before it wrote); under 16 bytes, in 8-, 4- and 1-byte moves alike.
inline void copy_short(std::byte* d, const std::byte* s, std::uint64_t n) {
  if (n >= 16) {
    for (std::uint64_t i = 0; i + 16 < n; i += 16) std::memcpy(d + i, s + i, 16);
    std::memcpy(d + n - 16, s + n - 16, 16);
  } else if (n >= 8) {
    std::memcpy(d, s, 8);
    std::memcpy(d + n - 8, s + n - 8, 8);
  } else if (n >= 4) {
    std::memcpy(d, s, 4);
    std::memcpy(d + n - 4, s + n - 4, 4);
  } else {
    for (std::uint64_t i = 0; i < n; ++i) d[i] = s[i];
  }
}

// A transpose of the last two merged dims of y and a (y dense along the
// last, a along the one before: NCHW <-> NHWC), walked in tiles of 32
// lines of 32 elements (lines of a few elements, longer), so that both
// sides are read and written a cache line at a time. `planes` runs of
// `inner` lines of `len` elements; a line i of y is `syr` apart, an
// element j of a `sa` apart.
struct TransposeTiles {
  static constexpr std::uint64_t kTile = 32;
  std::uint64_t len, inner, syr, sa, tile_i, row_tiles, planes;

  // The tiles of r's transpose; nullopt where r is not one.
  static std::optional<TransposeTiles> of(const Rows& r) {
    const std::uint64_t len = r.shape[r.rank - 1];
    const std::uint64_t sy = r.strides[0][r.rank - 1], sa = r.strides[1][r.rank - 1];
    if (r.rank < 2 || sy != 1 || sa == 1 || r.strides[1][r.rank - 2] != 1) return std::nullopt;
    const std::uint64_t inner = r.shape[r.rank - 2];
    const std::uint64_t tile_i = len >= kTile ? kTile : len <= 4 ? 8192 : std::max(kTile, kTile * kTile / len);
    std::uint64_t rows = 1;
    for (std::uint32_t d = 0; d + 1 < r.rank; ++d) rows *= r.shape[d];
    const std::uint64_t syr = r.strides[0][r.rank - 2], row_tiles = (inner + tile_i - 1) / tile_i;
    return TransposeTiles{len, inner, syr, sa, tile_i, row_tiles, rows / inner};
  }
  // Tiles a thread takes at a time.
  std::uint64_t grain() const {
    return std::max<std::uint64_t>(1, kGrain / (std::min(inner, tile_i) * std::max<std::uint64_t>(1, len)));
  }
  // tile(y0, a0, ni, nj) for every tile, on the engine's threads: the
  // offsets (in elements) of its first element in y and in a, and its
  // ni lines of nj elements.
  template <class Tile>
  void each(TensorEngine& e, const Rows& r, Tile&& tile) const {
    e.pool().parallel_for(
        planes * row_tiles,
        [&](std::uint64_t begin, std::uint64_t end) {
          for (std::uint64_t t = begin; t < end; ++t) {
            std::uint64_t off[3];
            row_offsets(r, t / row_tiles * inner, off);  // the plane's first row
            const std::uint64_t i0 = t % row_tiles * tile_i, ni = std::min(inner, i0 + tile_i) - i0;
            for (std::uint64_t j0 = 0; j0 < len; j0 += kTile)
              tile(off[0] + i0 * syr + j0, off[1] + i0 + j0 * sa, ni, std::min(len, j0 + kTile) - j0);
          }
        },
        grain());
  }
};

// A copy between views of one dtype (a strided copy such as a Concat's
// slice, or a transpose): rows of the merged dims, each a memcpy where both
// are dense along it, else element by element; a transpose in
// TransposeTiles' tiles.
void same_type_copy(TensorEngine& e, const View& a, const View& y) {
  const View* views[2] = {&y, &a};
  const Rows r = merged(views, 2);
  const std::uint64_t len = r.shape[r.rank - 1], es = y.esize;
  const std::uint64_t sy = r.strides[0][r.rank - 1], sa = r.strides[1][r.rank - 1];
  std::uint64_t rows = 1;
  for (std::uint32_t d = 0; d + 1 < r.rank; ++d) rows *= r.shape[d];
  if (const auto g = TransposeTiles::of(r)) {
    if (r.rank == 3 && g->row_tiles == 1 && len < TransposeTiles::kTile) {  // planes of one tile, evenly apart
      const std::uint64_t py = r.strides[0][0], pa = r.strides[1][0];
      e.pool().parallel_for(
          g->planes,
          [&](std::uint64_t begin, std::uint64_t end) {
            transpose_tiles(y.data + begin * py * es, g->syr, a.data + begin * pa * es, sa, g->inner, len, es,
                            end - begin, py, pa);
          },
          g->grain());
      return;
    }
    g->each(e, r, [&](std::uint64_t y0, std::uint64_t a0, std::uint64_t ni, std::uint64_t nj) {
      transpose_tiles(y.data + y0 * es, g->syr, a.data + a0 * es, sa, ni, nj, es);
    });
    return;
  }
  if (r.rank == 2 && sy == 1 && sa == 1 && len * es <= kShortRow && apart(y, a)) {
    // Short rows evenly apart (a Concat's part of a few dozen channels a
    // pixel): each in a few whole-vector moves, not a call, found by a
    // multiplication rather than row_offsets' division (as a case of the
    // loop below, ShuffleNet's int8 copies took 25 % longer).
    const std::uint64_t py = r.strides[0][0] * es, pa = r.strides[1][0] * es, bytes = len * es;
    e.pool().parallel_for(
        rows,
        [&](std::uint64_t begin, std::uint64_t end) {
          for (std::uint64_t k = begin; k < end; ++k) copy_short(y.data + k * py, a.data + k * pa, bytes);
        },
        std::max<std::uint64_t>(1, kGrain / std::max<std::uint64_t>(1, len)));
    return;
  }
  e.pool().parallel_for(
      rows,
      [&](std::uint64_t begin, std::uint64_t end) {
        for (std::uint64_t k = begin; k < end; ++k) {
          std::uint64_t off[3];
          row_offsets(r, k, off);
          std::byte* yr = y.data + off[0] * es;
          const std::byte* ar = a.data + off[1] * es;
          if (sy == 1 && sa == 1) {
            std::memmove(yr, ar, len * es);
          } else {
            strided_copy(yr, sy, ar, sa, len, es);
          }
        }
      },
      std::max<std::uint64_t>(1, kGrain / std::max<std::uint64_t>(1, len)));
}

// An f32 view cast into a dense f16 or bf16 y where that is a transpose of
// the last two merged dimensions (an fp16 model's f32 input, NCHW read in
// NHWC's order): TransposeTiles' tiles, each transposed into the
// thread's own floats and rounded into y while they are in cache. A
// transposed f32 copy of the whole input first, then a pass to round it,
// took MobileNetV3-Small fp16's input at batch 8 about 290 us against
// fp32's transpose alone at 180. The same floats rounded by the same
// conversions: the same bits. False where the views are not so.
bool transposed_narrow(TensorEngine& e, const View& a, const View& y) {
  const View* views[2] = {&y, &a};
  const Rows r = merged(views, 2);
  const auto g = TransposeTiles::of(r);
  if (a.dtype != fw::DType::kF32 || !g) return false;
  const auto narrow = y.dtype == fw::DType::kF16 ? simd::narrow_f16 : simd::narrow_bf16;
  auto* const yh = reinterpret_cast<std::uint16_t*>(y.data);
  const auto* const af = reinterpret_cast<const float*>(a.data);
  g->each(e, r, [&](std::uint64_t y0, std::uint64_t a0, std::uint64_t ni, std::uint64_t nj) {
    thread_local std::vector<float> tile;  // kept from call to call: fresh pages at every call cost faults
    tile.resize(std::max<std::size_t>(tile.size(), g->tile_i * std::min(g->len, TransposeTiles::kTile)));
    transpose_tiles(reinterpret_cast<std::byte*>(tile.data()), nj, reinterpret_cast<const std::byte*>(af + a0), g->sa,
                    ni, nj, sizeof(float));
    if (nj == g->syr) {
      narrow(tile.data(), yh + y0, ni * nj);  // the tile's lines lie together in y
      return;
    }
    for (std::uint64_t i = 0; i < ni; ++i) narrow(tile.data() + i * nj, yh + y0 + i * g->syr, nj);
  });
  return true;
}

// Comparisons (any dtype, floats compared as f32: a NaN is unequal to
// everything and neither less nor greater) and logic on u8 (nonzero is
// true), into u8 1 or 0.
bool compare(fw::ElementwiseOp op, const std::byte* pa, const std::byte* pb, fw::DType t) {
  auto holds = [op](auto u, auto v) {
    switch (op) {
      case fw::ElementwiseOp::kEqual: return u == v;
      case fw::ElementwiseOp::kLess: return u < v;
      case fw::ElementwiseOp::kLessOrEqual: return u <= v;
      case fw::ElementwiseOp::kGreater: return u > v;
      case fw::ElementwiseOp::kGreaterOrEqual: return u >= v;
      default: return false;
    }
  };
  return is_float(t) ? holds(load_float(pa, t), load_float(pb, t)) : holds(load_int(pa, t), load_int(pb, t));
}

void compare_or_logic(TensorEngine& e, fw::ElementwiseOp op, const View& a, const View& b, const View& y) {
  const View* views[3] = {&y, &a, &b};
  e.pool().parallel_for(
      y.elements(),
      [&](std::uint64_t begin, std::uint64_t end) {
        for_each_index(y.shape, y.rank, views, begin, end, [&](const std::uint64_t* off) {
          bool r = false;
          if (fw::is_comparison(op)) {
            r = compare(op, a.at(off[1]), b.at(off[2]), a.dtype);
          } else {
            const bool u = *a.at(off[1]) != std::byte{0};
            const bool v = op != fw::ElementwiseOp::kNot && *b.at(off[2]) != std::byte{0};
            r = op == fw::ElementwiseOp::kAnd   ? u && v
                : op == fw::ElementwiseOp::kOr  ? u || v
                : op == fw::ElementwiseOp::kXor ? u != v
                                                : !u;
          }
          *y.at(off[0]) = std::byte{r ? std::uint8_t{1} : std::uint8_t{0}};
        });
      },
      kGrain);
}

}  // namespace

fw::Problem run_elementwise(TensorEngine& e, const fw::ElementwiseAttrs& at, const View* v) {
  const View &a = v[0], &b = v[1], &y = v[2];
  const auto op = static_cast<fw::ElementwiseOp>(at.op);
  const bool binary = fw::is_binary(op);
  const View* views[3] = {&y, &a, &b};
  const View* unary_views[2] = {&y, &a};
  // Dense same-dtype copies go straight through memcpy.
  if (op == fw::ElementwiseOp::kIdentity && a.dtype == y.dtype && a.contiguous() && y.contiguous()) {
    std::memcpy(y.data, a.data, y.elements() * y.esize);
    return {};
  }
  if (op == fw::ElementwiseOp::kIdentity && a.dtype == y.dtype) {
    same_type_copy(e, a, y);
    return {};
  }
  // Dense casts between f32 and f16 or bf16 (a model's input and output
  // conversions): the vector conversions, the same bits as cast_one. A
  // strided f32 input that is a transpose (an fp16 model's input read in
  // NHWC's order) is rounded tile by tile (transposed_narrow); another
  // strided input (an output read in NCHW's order) is first copied dense
  // as it is, in tiles where that is a transpose.
  const bool half_y = y.dtype == fw::DType::kF16 || y.dtype == fw::DType::kBF16;
  const bool half_a = a.dtype == fw::DType::kF16 || a.dtype == fw::DType::kBF16;
  if (op == fw::ElementwiseOp::kIdentity && y.contiguous() &&
      ((a.dtype == fw::DType::kF32 && half_y) || (half_a && y.dtype == fw::DType::kF32))) {
    if (!a.contiguous() && half_y && transposed_narrow(e, a, y)) return {};
    View from = a;
    if (!a.contiguous()) {
      from = staged_like(e, y, Staged::kW, e.staged(Staged::kW, (y.elements() * a.esize + 3) / 4));
      from.dtype = a.dtype;
      from.esize = a.esize;
      same_type_copy(e, a, from);
    }
    if (half_y)
      narrow_into(e, from, y);
    else
      widened(e, from, Staged::kX, reinterpret_cast<float*>(y.data));
    return {};
  }
  if (fw::is_comparison(op) || fw::is_logical(op)) {
    compare_or_logic(e, op, a, b, y);
    return {};
  }
  if (float_rows(e, at, a, b, y)) return {};
  e.pool().parallel_for(y.elements(), [&](std::uint64_t begin, std::uint64_t end) {
    if (op == fw::ElementwiseOp::kIdentity) {
      for_each_index(y.shape, y.rank, unary_views, begin, end,
                     [&](const std::uint64_t* off) { cast_one(a.at(off[1]), a.dtype, y.at(off[0]), y.dtype); });
    } else if (binary && is_float(y.dtype)) {
      for_each_index(y.shape, y.rank, views, begin, end, [&](const std::uint64_t* off) {
        store_float(y.at(off[0]), y.dtype,
                    float_binary(op, load_float(a.at(off[1]), a.dtype), load_float(b.at(off[2]), b.dtype)));
      });
    } else if (binary) {
      for_each_index(y.shape, y.rank, views, begin, end, [&](const std::uint64_t* off) {
        store_int_wrap(y.at(off[0]), y.dtype,
                       int_binary(op, load_int(a.at(off[1]), a.dtype), load_int(b.at(off[2]), b.dtype)));
      });
    } else if (is_float(y.dtype)) {
      for_each_index(y.shape, y.rank, unary_views, begin, end, [&](const std::uint64_t* off) {
        store_float(y.at(off[0]), y.dtype, float_unary(at, load_float(a.at(off[1]), a.dtype)));
      });
    } else {  // integer abs / neg
      for_each_index(y.shape, y.rank, unary_views, begin, end, [&](const std::uint64_t* off) {
        const std::int64_t x = load_int(a.at(off[1]), a.dtype);
        store_int_wrap(y.at(off[0]), y.dtype, op == fw::ElementwiseOp::kNeg ? -x : (x < 0 ? -x : x));
      });
    }
  });
  return {};
}

fw::Problem run_softmax(TensorEngine& e, const fw::SoftmaxAttrs& at, const View* v) {
  const View &x = v[0], &y = v[1];
  const std::uint32_t axis = at.axis;
  const std::uint64_t len = x.shape[axis];
  // Iterate over every index with the axis dimension collapsed to 1.
  View xs = x, ys = y;
  xs.shape[axis] = 1;
  ys.shape[axis] = 1;
  const View* views[2] = {&xs, &ys};
  const std::uint64_t rows = xs.elements();
  // f32 lines with adjacent elements are read and written where they are.
  const bool x_dense = x.dtype == fw::DType::kF32 && x.strides[axis] == 1;
  const bool y_dense = y.dtype == fw::DType::kF32 && y.strides[axis] == 1;
  const bool into_y = y_dense && !at.log;  // the exponentials, then the results, in y's line
  e.pool().parallel_for(rows, [&](std::uint64_t begin, std::uint64_t end) {
    std::vector<float> buf(x_dense ? 0 : len), ex(into_y ? 0 : len);
    for_each_index(xs.shape, xs.rank, views, begin, end, [&](const std::uint64_t* off) {
      const float* in = x_dense ? reinterpret_cast<const float*>(x.at(off[0])) : buf.data();
      for (std::uint64_t i = 0; !x_dense && i < len; ++i)
        buf[i] = load_float(x.at(off[0] + i * x.strides[axis]), x.dtype);
      float mx = -std::numeric_limits<float>::infinity();
      for (std::uint64_t i = 0; i < len; ++i) mx = std::max(mx, in[i]);
      // The board's exp (simd.h's exp_f32, in vectors), each once; summed in
      // order on this thread. Softmax's go straight into a dense y.
      float* out = into_y ? reinterpret_cast<float*>(y.at(off[1])) : ex.data();
      simd::exp_shifted_f32(in, out, len, mx);
      float sum = 0;
      for (std::uint64_t i = 0; i < len; ++i) sum += out[i];
      if (at.log) {
        const float log_sum = std::log(sum);
        for (std::uint64_t i = 0; i < len; ++i) out[i] = in[i] - mx - log_sum;
      } else {
        for (std::uint64_t i = 0; i < len; ++i) out[i] = out[i] / sum;
      }
      if (!into_y)
        for (std::uint64_t i = 0; i < len; ++i) store_float(y.at(off[1] + i * y.strides[axis]), y.dtype, out[i]);
    });
  });
  return {};
}

// Y[i] along the axis = X[0] + ... + X[i] (to X[i - 1] with exclusive, 0
// first; from the last index down with reverse). Each line along the axis
// is summed in order by one thread, so the result does not depend on the
// thread count: floats in f32, each sum rounded to Y's dtype; i32 wraps.
fw::Problem run_cumsum(TensorEngine& e, const fw::CumSumAttrs& at, const View* v) {
  const View &x = v[0], &y = v[1];
  const std::uint32_t axis = at.axis;
  const std::uint64_t len = x.shape[axis];
  View xs = x, ys = y;  // every line's first element: the axis collapsed to 1
  xs.shape[axis] = 1;
  ys.shape[axis] = 1;
  const View* views[2] = {&xs, &ys};
  const bool integer = x.dtype == fw::DType::kI32;
  const bool exclusive = at.exclusive != 0, reverse = at.reverse != 0;
  e.pool().parallel_for(xs.elements(), [&](std::uint64_t begin, std::uint64_t end) {
    for_each_index(xs.shape, xs.rank, views, begin, end, [&](const std::uint64_t* off) {
      float fsum = 0;
      std::uint32_t isum = 0;  // wraps
      for (std::uint64_t n = 0; n < len; ++n) {
        const std::uint64_t i = reverse ? len - 1 - n : n;
        const std::byte* in = x.at(off[0] + i * x.strides[axis]);
        std::byte* out = y.at(off[1] + i * y.strides[axis]);
        if (integer) {
          const auto value = static_cast<std::uint32_t>(load_int(in, x.dtype));
          if (!exclusive) isum += value;
          store_int_wrap(out, y.dtype, static_cast<std::int32_t>(isum));
          if (exclusive) isum += value;
        } else {
          const float value = load_float(in, x.dtype);
          if (!exclusive) fsum += value;
          store_float(out, y.dtype, fsum);
          if (exclusive) fsum += value;
        }
      }
    });
  });
  return {};
}

namespace {

// Whether a view broadcast over y's shape is one value (every stride 0).
bool one_value(const View& v) {
  for (std::uint32_t d = 0; d < v.rank; ++d)
    if (v.shape[d] > 1 && v.strides[d] != 0) return false;
  return true;
}

}  // namespace

// y = saturate(round_half_even(x / scale) + zero_point), in f32.
fw::Problem run_quantize(TensorEngine& e, const fw::QuantAttrs& /*a*/, const View* v) {
  const View &x = v[0], &scale = v[1], &zp = v[2], &y = v[3];
  const View zero{};
  const View* views[4] = {&y, &x, &scale, zp.present() ? &zp : &zero};
  const std::int32_t lo = int_min(y.dtype), hi = int_max(y.dtype);
  if (x.dtype == fw::DType::kF32 && (y.dtype == fw::DType::kU8 || y.dtype == fw::DType::kI8) && x.contiguous() &&
      y.contiguous() && one_value(scale) && (!zp.present() || one_value(zp))) {
    // One scale and zero point over dense f32 (the compiler's conversions):
    // the same arithmetic as below, without walking indices.
    const auto* in = reinterpret_cast<const float*>(x.data);
    auto* out = reinterpret_cast<std::uint8_t*>(y.data);
    const float s = load_float(scale.data, fw::DType::kF32);
    const std::int32_t z = zp.present() ? static_cast<std::int32_t>(load_int(zp.data, zp.dtype)) : 0;
    e.pool().parallel_for(y.elements(), [&](std::uint64_t begin, std::uint64_t end) {
      simd::quantize_f32(in + begin, out + begin, end - begin, s, z, lo, hi);
    });
    return {};
  }
  e.pool().parallel_for(y.elements(), [&](std::uint64_t begin, std::uint64_t end) {
    for_each_index(y.shape, y.rank, views, begin, end, [&](const std::uint64_t* off) {
      const float xv =
          is_float(x.dtype) ? load_float(x.at(off[1]), x.dtype) : static_cast<float>(load_int(x.at(off[1]), x.dtype));
      const float s = load_float(scale.at(off[2]), fw::DType::kF32);
      const std::int32_t z = zp.present() ? static_cast<std::int32_t>(load_int(zp.at(off[3]), zp.dtype)) : 0;
      const std::int32_t q = round_saturate(xv / s, INT32_MIN / 2, INT32_MAX / 2) + z;
      store_int_wrap(y.at(off[0]), y.dtype, std::min(std::max(q, lo), hi));
    });
  });
  return {};
}

// y = (x - zero_point) * scale, in f32.
fw::Problem run_dequantize(TensorEngine& e, const fw::QuantAttrs& /*a*/, const View* v) {
  const View &x = v[0], &scale = v[1], &zp = v[2], &y = v[3];
  const View zero{};
  const View* views[4] = {&y, &x, &scale, zp.present() ? &zp : &zero};
  if (y.dtype == fw::DType::kF32 && (x.dtype == fw::DType::kU8 || x.dtype == fw::DType::kI8) && x.contiguous() &&
      y.contiguous() && one_value(scale) && (!zp.present() || one_value(zp))) {
    // One scale and zero point over dense bytes: the same arithmetic as
    // below, without walking indices.
    const auto* in = reinterpret_cast<const std::uint8_t*>(x.data);
    auto* out = reinterpret_cast<float*>(y.data);
    const float s = load_float(scale.data, fw::DType::kF32);
    const auto z = zp.present() ? static_cast<std::int32_t>(load_int(zp.data, zp.dtype)) : 0;
    const bool is_signed = x.dtype == fw::DType::kI8;
    e.pool().parallel_for(y.elements(), [&](std::uint64_t begin, std::uint64_t end) {
      simd::dequantize_8(in + begin, out + begin, end - begin, is_signed, s, z);
    });
    return {};
  }
  e.pool().parallel_for(y.elements(), [&](std::uint64_t begin, std::uint64_t end) {
    for_each_index(y.shape, y.rank, views, begin, end, [&](const std::uint64_t* off) {
      const std::int64_t z = zp.present() ? load_int(zp.at(off[3]), zp.dtype) : 0;
      const float r =
          static_cast<float>(load_int(x.at(off[1]), x.dtype) - z) * load_float(scale.at(off[2]), fw::DType::kF32);
      store_float(y.at(off[0]), y.dtype, r);
    });
  });
  return {};
}

namespace {

// The scales and zero points of a qlinear_add or qlinear_mul (A, AScale,
// AZeroPoint, B, BScale, BZeroPoint, YScale, YZeroPoint, Y), each one
// value (the decoder's rule).
simd::QAddParams quantized_binary_params(const View* v) {
  simd::QAddParams p{};
  p.a_signed = v[0].dtype == fw::DType::kI8;
  p.b_signed = v[3].dtype == fw::DType::kI8;
  p.a_scale = load_float(v[1].data, fw::DType::kF32);
  p.b_scale = load_float(v[4].data, fw::DType::kF32);
  p.y_scale = load_float(v[6].data, fw::DType::kF32);
  p.a_zero = static_cast<std::int32_t>(load_int(v[2].data, v[2].dtype));
  p.b_zero = static_cast<std::int32_t>(load_int(v[5].data, v[5].dtype));
  p.y_zero = static_cast<std::int32_t>(load_int(v[7].data, v[7].dtype));
  p.lo = int_min(v[8].dtype);
  p.hi = int_max(v[8].dtype);
  return p;
}

}  // namespace

// A, AScale, AZeroPoint, B, BScale, BZeroPoint, YScale, YZeroPoint, Y: the
// bits of dequantize, an f32 add and quantize in a row, at every level.
fw::Problem run_qlinear_add(TensorEngine& e, const fw::QuantAttrs& /*a*/, const View* v) {
  const View &a = v[0], &b = v[3], &y = v[8];
  const simd::QAddParams p = quantized_binary_params(v);
  const auto* pa = reinterpret_cast<const std::uint8_t*>(a.data);
  const auto* pb = reinterpret_cast<const std::uint8_t*>(b.data);
  auto* py = reinterpret_cast<std::uint8_t*>(y.data);
  if (a.contiguous() && b.contiguous() && y.contiguous()) {
    e.pool().parallel_for(y.elements(), [&](std::uint64_t begin, std::uint64_t end) {
      simd::qadd_8(pa + begin, pb + begin, py + begin, end - begin, p);
    });
    return {};
  }
  // Broadcast or strided operands: one element at a time, the same
  // arithmetic (the kernel's, on one element).
  const View* views[3] = {&y, &a, &b};
  e.pool().parallel_for(
      y.elements(),
      [&](std::uint64_t begin, std::uint64_t end) {
        for_each_index(y.shape, y.rank, views, begin, end, [&](const std::uint64_t* off) {
          simd::qadd_8(reinterpret_cast<const std::uint8_t*>(a.at(off[1])),
                       reinterpret_cast<const std::uint8_t*>(b.at(off[2])),
                       reinterpret_cast<std::uint8_t*>(y.at(off[0])), 1, p);
        });
      },
      16384);
  return {};
}

namespace {

// qlinear_mul's operands as its kernel takes them: x, the dense one (its
// dequantization in p), and f, the other, dequantized into floats first.
struct QMulOperands {
  simd::QMulParams p;
  bool f_signed;
  float f_scale;
  std::int32_t f_zero;
};

constexpr std::uint64_t kQMulStage = 4096;  // floats of f at a time, on the stack

// A thread's floats of f: dequantized, then repeated. A gate's row is the
// same for every row of its image, and a thread's items are mostly one
// image's groups of rows: filled once for them, not per group (for 16
// channels, refilling 16 KB for each 4 KB of x cost more than the
// products).
struct QMulStage {
  float buf[kQMulStage];
  const std::uint8_t* f = nullptr;  // what buf holds: f's first `once` values, repeated up to `filled`
  std::uint64_t once = 0, filled = 0;
};

// g rows of n elements, dense in x (sx 1, or 0: one value) and y; f's row
// has stride sf (0: one value) and is the same for each of the g rows
// (g > 1 only where g * n <= kQMulStage).
void qmul_rows(const QMulOperands& o, QMulStage& st, const std::uint8_t* x, std::uint64_t sx, const std::uint8_t* f,
               std::uint64_t sf, std::uint8_t* y, std::uint64_t n, std::uint64_t g) {
  float* const buf = st.buf;
  const std::uint64_t total = g * n;
  if (sx == 0) {  // both one value along the row: one product
    std::uint8_t out;
    simd::dequantize_8(f, buf, 1, o.f_signed, o.f_scale, o.f_zero);
    st.f = nullptr;
    simd::qmul_8(x, buf, &out, 1, o.p);
    std::memset(y, out, total);
  } else if (sf == 0 || g > 1) {  // f's one value, or its one row repeated g times
    const std::uint64_t m = std::min(total, kQMulStage), once = sf == 0 ? 1 : n;
    if (st.f != f || st.once != once || st.filled < m) {
      simd::dequantize_8(f, buf, once, o.f_signed, o.f_scale, o.f_zero);
      if (once == 1)
        std::fill_n(buf + 1, m - 1, buf[0]);
      else
        for (std::uint64_t i = once; i < m; i += once) std::memcpy(buf + i, buf, once * sizeof(float));
      st.f = f;
      st.once = once;
      st.filled = m;
    }
    for (std::uint64_t s = 0; s < total; s += m) simd::qmul_8(x + s, buf, y + s, std::min(m, total - s), o.p);
  } else {
    for (std::uint64_t s = 0; s < n; s += kQMulStage) {
      const std::uint64_t m = std::min(kQMulStage, n - s);
      simd::dequantize_8(f + s, buf, m, o.f_signed, o.f_scale, o.f_zero);
      simd::qmul_8(x + s, buf, y + s, m, o.p);
    }
    st.f = nullptr;
  }
}

}  // namespace

// The same operands as qlinear_add, multiplied, over rows of the merged
// dimensions where the result is dense along them and each operand is dense
// or one value along them, else one element at a time. Where the operand
// that is not the kernel's x repeats from row to row (an SE block's gate,
// [n, 1, 1, c] against [n, h, w, c]: the same c values for every pixel),
// rows are taken several at a time with its floats repeated, so that the
// kernel sees long dense runs rather than rows of a few channels.
fw::Problem run_qlinear_mul(TensorEngine& e, const fw::QuantAttrs& /*a*/, const View* v) {
  const View &a = v[0], &b = v[3], &y = v[8];
  const simd::QAddParams q = quantized_binary_params(v);
  const View* views[3] = {&y, &a, &b};
  const Rows r = merged(views, 3);
  const std::uint32_t last = r.rank - 1;
  const std::uint64_t len = r.shape[last];
  // x: the operand dense along the rows, where one is; of two, the one
  // that does not repeat from row to row (not a gate).
  const bool a_dense = r.strides[1][last] == 1, b_dense = r.strides[2][last] == 1;
  const bool x_is_a = a_dense ? !(b_dense && last > 0 && r.strides[1][last - 1] == 0) : !b_dense;
  const int xt = x_is_a ? 1 : 2, ft = x_is_a ? 2 : 1;
  const QMulOperands o{{x_is_a ? q.a_signed : q.b_signed, x_is_a ? q.a_scale : q.b_scale, q.y_scale,
                        x_is_a ? q.a_zero : q.b_zero, q.y_zero, q.lo, q.hi},
                       x_is_a ? q.b_signed : q.a_signed,
                       x_is_a ? q.b_scale : q.a_scale,
                       x_is_a ? q.b_zero : q.a_zero};
  const auto* px = reinterpret_cast<const std::uint8_t*>((x_is_a ? a : b).data);
  const auto* pf = reinterpret_cast<const std::uint8_t*>((x_is_a ? b : a).data);
  auto* py = reinterpret_cast<std::uint8_t*>(y.data);
  const std::uint64_t sx = r.strides[xt][last], sf = r.strides[ft][last];
  if (r.strides[0][last] != 1 || sx > 1 || sf > 1) {
    e.pool().parallel_for(
        y.elements(),
        [&](std::uint64_t begin, std::uint64_t end) {
          QMulStage st;
          for_each_index(y.shape, y.rank, views, begin, end, [&](const std::uint64_t* off) {
            qmul_rows(o, st, px + off[xt], 1, pf + off[ft], 1, py + off[0], 1, 1);
          });
        },
        16384);
    return {};
  }
  std::uint64_t rows = 1;
  for (std::uint32_t d = 0; d < last; ++d) rows *= r.shape[d];
  const std::uint64_t inner = last > 0 ? r.shape[last - 1] : 1;
  const bool repeats = last > 0 && sx == 1 && r.strides[ft][last - 1] == 0 && r.strides[0][last - 1] == len &&
                       r.strides[xt][last - 1] == len;
  // Items: g rows at a time where f repeats; else a row, long single rows
  // split so that every thread works.
  const std::uint64_t group = repeats ? std::clamp<std::uint64_t>(kQMulStage / len, 1, inner) : 1;
  const std::uint64_t per_inner = (inner + group - 1) / group;
  const std::uint64_t chunk = repeats || rows >= e.threads() ? len : (len + e.threads() - 1) / e.threads();
  const std::uint64_t per_row = (len + chunk - 1) / chunk;
  auto body = [&](std::uint64_t begin, std::uint64_t end) {
    std::uint64_t off[3];
    QMulStage st;
    for (std::uint64_t k = begin; k < end; ++k) {
      std::uint64_t row = k / per_row, lo = k % per_row * chunk, g = 1;
      if (repeats) {
        const std::uint64_t g0 = k % per_inner * group;
        row = k / per_inner * inner + g0;
        lo = 0;
        g = std::min(group, inner - g0);
      }
      row_offsets(r, row, off);
      qmul_rows(o, st, px + off[xt] + lo * sx, sx, pf + off[ft] + lo * sf, sf, py + off[0] + lo,
                std::min(chunk, len - lo), g);
    }
  };
  const std::uint64_t items = repeats ? rows / inner * per_inner : rows * per_row;
  e.pool().parallel_for(items, body, std::max<std::uint64_t>(1, kGrain / (repeats ? group * len : chunk)));
  return {};
}

}  // namespace tpuhal::sim::tensor
