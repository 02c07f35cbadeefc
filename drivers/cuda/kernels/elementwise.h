// Elementwise kernels (kernel.h): one output element per item, except
// cumsum (one line along its axis per item). The arithmetic is the
// simulator's (simulator/src/tensor/elementwise.cpp), step for step, so
// that integers, casts, cumsum and every float map but those of the C
// library give its bits on the GPU too. The C library's maps (exp, log,
// erf, tanh, the trigonometric and hyperbolic functions) are the host's
// libm in the stand-in driver, as in the simulator, and CUDA's f32
// functions on a GPU: within CUDA's documented bounds (1 to 4 ulp), not
// the host's bits.
#pragma once

#include <math.h>

#include "activation.h"
#include "kernel.h"

namespace tpuhal::cuda::k {

// The maps, as the launcher translates driver::ElementwiseOp into them
// (ops_elementwise.cpp), grouped by the kernel that runs them.
enum MapOp : std::uint32_t {
  // Binary arithmetic: ew_float and ew_int.
  kMapAdd,
  kMapSub,
  kMapMul,
  kMapDiv,
  kMapMax,
  kMapMin,
  kMapMod,
  kMapFmod,
  // Unary: abs and neg also in ew_int; the rest floats only.
  kMapAbs,
  kMapNeg,
  kMapActivation,
  kMapExp,
  kMapLog,
  kMapSqrt,
  kMapErf,
  kMapCeil,
  kMapFloor,
  kMapRound,
  kMapSin,
  kMapCos,
  kMapTan,
  kMapAsin,
  kMapAcos,
  kMapAtan,
  kMapSinh,
  kMapCosh,
  kMapAsinh,
  kMapAcosh,
  kMapAtanh,
  // Into u8 1 or 0: ew_compare.
  kMapEqual,
  kMapLess,
  kMapLessOrEqual,
  kMapGreater,
  kMapGreaterOrEqual,
  kMapAnd,
  kMapOr,
  kMapXor,
  kMapNot,
};

TK_FN bool map_is_binary(std::uint32_t op) { return op <= kMapFmod || (op >= kMapEqual && op != kMapNot); }

namespace ew {

TK_FN float float_binary(std::uint32_t op, float a, float b) {
  switch (op) {
    case kMapAdd: return a + b;
    case kMapSub: return a - b;
    case kMapMul: return a * b;
    case kMapDiv: return a / b;
    case kMapMax: return a != a || b != b ? quiet_nan() : max_of(a, b);
    case kMapMin: return a != a || b != b ? quiet_nan() : min_of(a, b);
    case kMapFmod: return ::fmodf(a, b);  // exact
    case kMapMod: {
      // numpy.mod: fmod moved to the divisor's sign; a zero takes b's sign.
      const float r = ::fmodf(a, b);
      return r == 0 ? ::copysignf(0.0f, b) : (r < 0) != (b < 0) ? r + b : r;
    }
    default: return a;
  }
}

// The trigonometric and hyperbolic maps (the C library's: see above).
TK_FN float float_circular(std::uint32_t op, float x) {
  switch (op) {
    case kMapSin: return ::sinf(x);
    case kMapCos: return ::cosf(x);
    case kMapTan: return ::tanf(x);
    case kMapAsin: return ::asinf(x);
    case kMapAcos: return ::acosf(x);
    case kMapAtan: return ::atanf(x);
    case kMapSinh: return ::sinhf(x);
    case kMapCosh: return ::coshf(x);
    case kMapAsinh: return ::asinhf(x);
    case kMapAcosh: return ::acoshf(x);
    default: return ::atanhf(x);
  }
}

TK_FN float float_unary(std::uint32_t op, std::uint32_t act, float alpha, float beta, float x) {
  switch (op) {
    case kMapActivation: return activate(Act{act, alpha, beta}, x);
    case kMapAbs: return ::fabsf(x);
    case kMapNeg: return -x;
    case kMapExp: return ::expf(x);
    case kMapLog: return ::logf(x);
    case kMapSqrt: return ::sqrtf(x);
    case kMapErf: return ::erff(x);
    case kMapCeil: return ::ceilf(x);
    case kMapFloor: return ::floorf(x);
    case kMapRound: return ::nearbyintf(x);  // the default mode: ties to even
    default: return float_circular(op, x);
  }
}

// Integers in int64, as the simulator computes them, then wrapped to the
// output's width by the store: MIN / -1 and MIN % -1 cannot trap.
TK_FN std::int64_t int_binary(std::uint32_t op, std::int64_t a, std::int64_t b) {
  switch (op) {
    case kMapAdd: return a + b;
    case kMapSub: return a - b;
    case kMapMul: return a * b;
    case kMapDiv: return b == 0 ? 0 : a / b;   // toward zero; x / 0 = 0
    case kMapFmod: return b == 0 ? 0 : a % b;  // the dividend's sign; x fmod 0 = 0
    case kMapMod: {                            // the divisor's sign; x mod 0 = 0
      if (b == 0) return 0;
      const std::int64_t r = a % b;
      return r != 0 && (r < 0) != (b < 0) ? r + b : r;
    }
    case kMapMax: return a < b ? b : a;
    case kMapMin: return b < a ? b : a;
    default: return a;
  }
}

TK_FN void store_wrapped(const Tensor& t, std::int64_t off, std::int64_t v) {
  store_i(t, off, static_cast<std::int32_t>(static_cast<std::uint32_t>(static_cast<std::uint64_t>(v))));
}

TK_FN std::int32_t int_min(std::uint32_t dtype) { return dtype == kI8 ? -128 : dtype == kU8 ? 0 : -2147483647 - 1; }
TK_FN std::int32_t int_max(std::uint32_t dtype) { return dtype == kI8 ? 127 : dtype == kU8 ? 255 : 2147483647; }

// Float to integer: toward zero, saturating; NaN gives 0. The limits are
// exact in f32 (-2^31 included), and a value below max + 1 truncates
// into range.
TK_FN std::int32_t truncate_saturate(float v, std::uint32_t dtype) {
  const std::int32_t lo = int_min(dtype), hi = int_max(dtype);
  if (v != v) return 0;
  if (v <= static_cast<float>(lo)) return lo;
  if (v >= static_cast<float>(hi) + 1.0f) return hi;  // 128, 256 and 2^31: exact
  return static_cast<std::int32_t>(v);
}

// Floats compare as f32 (NaN false), integers as integers.
template <class T>
TK_FN bool compares(std::uint32_t op, T u, T v) {
  switch (op) {
    case kMapEqual: return u == v;
    case kMapLess: return u < v;
    case kMapLessOrEqual: return u <= v;
    case kMapGreater: return u > v;
    default: return u >= v;
  }
}

}  // namespace ew

// where(cond, a, b, y): Y = Cond ? A : B. Cond is u8, A, B and Y one dtype;
// the inputs are already broadcast to Y's shape by their strides. Bytes
// are copied, so every dtype is exact.
struct WhereParams {
  std::uint64_t n;
  Tensor cond, a, b, y;
};
TK_FN void where_body(const WhereParams& p, std::uint64_t i) {
  const bool c = *at<const std::uint8_t>(p.cond, offset_of(p.cond, i)) != 0;
  const Tensor& src = c ? p.a : p.b;
  const std::uint32_t size = size_of(p.y.dtype);
  const auto* from = reinterpret_cast<const unsigned char*>(src.addr) + offset_of(src, i) * size;
  auto* to = reinterpret_cast<unsigned char*>(p.y.addr) + offset_of(p.y, i) * size;
  for (std::uint32_t b = 0; b < size; ++b) to[b] = from[b];
}

// Y = A (broadcast or strided: a copy, a transpose), converted to Y's
// dtype.
struct ConvertParams {
  std::uint64_t n;
  Tensor a, y;
};

// One dtype: the element's bytes, so that NaN payloads survive as the
// simulator's memcpy keeps them.
TK_FN void ew_copy_body(const ConvertParams& p, std::uint64_t i) {
  const std::int64_t from = offset_of(p.a, i), to = offset_of(p.y, i);
  switch (size_of(p.y.dtype)) {
    case 1: *at<std::uint8_t>(p.y, to) = *at<const std::uint8_t>(p.a, from); break;
    case 2: *at<std::uint16_t>(p.y, to) = *at<const std::uint16_t>(p.a, from); break;
    default: *at<std::uint32_t>(p.y, to) = *at<const std::uint32_t>(p.a, from); break;
  }
}

// A cast (docs/ops.md, Numerics): to a float type, rounded to nearest even
// (an integer through f32 first); float to integer toward zero,
// saturating, NaN 0; integer to integer saturating.
TK_FN void ew_cast_body(const ConvertParams& p, std::uint64_t i) {
  const std::int64_t from = offset_of(p.a, i), to = offset_of(p.y, i);
  if (is_float(p.y.dtype)) {
    store_f(p.y, to, load_f(p.a, from));
  } else if (is_float(p.a.dtype)) {
    store_i(p.y, to, ew::truncate_saturate(load_f(p.a, from), p.y.dtype));
  } else {
    const std::int32_t v = load_i(p.a, from), lo = ew::int_min(p.y.dtype), hi = ew::int_max(p.y.dtype);
    store_i(p.y, to, v < lo ? lo : v > hi ? hi : v);
  }
}

// Y = op(A) or op(A, B); A and B already broadcast to Y's shape (B absent
// for a unary map). alpha and beta are the activation's.
struct MapParams {
  std::uint64_t n;
  Tensor a, b, y;
  std::uint32_t op;   // MapOp
  std::uint32_t act;  // ActKind, for kMapActivation
  float alpha, beta;
};

// A float map: A, B and Y one float dtype, computed in f32 and rounded
// once when stored.
TK_FN void ew_float_body(const MapParams& p, std::uint64_t i) {
  const float a = load_f(p.a, offset_of(p.a, i));
  const float r = map_is_binary(p.op) ? ew::float_binary(p.op, a, load_f(p.b, offset_of(p.b, i)))
                                      : ew::float_unary(p.op, p.act, p.alpha, p.beta, a);
  store_f(p.y, offset_of(p.y, i), r);
}

// An integer map (binary arithmetic, abs, neg): A, B and Y one integer
// dtype, wrapping to its width.
TK_FN void ew_int_body(const MapParams& p, std::uint64_t i) {
  const std::int64_t a = load_i(p.a, offset_of(p.a, i));
  std::int64_t r = 0;
  if (map_is_binary(p.op))
    r = ew::int_binary(p.op, a, load_i(p.b, offset_of(p.b, i)));
  else
    r = p.op == kMapNeg ? -a : a < 0 ? -a : a;
  ew::store_wrapped(p.y, offset_of(p.y, i), r);
}

// Comparisons (A and B one dtype; floats as f32, where NaN compares
// false) and logic on u8 (nonzero is true), into u8 1 or 0.
TK_FN void ew_compare_body(const MapParams& p, std::uint64_t i) {
  const std::int64_t oa = offset_of(p.a, i);
  const std::int64_t ob = p.op == kMapNot ? 0 : offset_of(p.b, i);
  bool r = false;
  if (p.op >= kMapAnd) {
    const bool u = *at<const std::uint8_t>(p.a, oa) != 0;
    const bool v = p.op != kMapNot && *at<const std::uint8_t>(p.b, ob) != 0;
    r = p.op == kMapAnd ? u && v : p.op == kMapOr ? u || v : p.op == kMapXor ? u != v : !u;
  } else if (is_float(p.a.dtype)) {
    r = ew::compares(p.op, load_f(p.a, oa), load_f(p.b, ob));
  } else {
    r = ew::compares(p.op, load_i(p.a, oa), load_i(p.b, ob));
  }
  *at<std::uint8_t>(p.y, offset_of(p.y, i)) = r ? 1 : 0;
}

// cumsum(x, y): one item per line along the axis. x and y come with the
// axis's dimension set to 1 (so that offset_of finds each line's first
// element), its length and strides apart. Each line is summed in index
// order (from the end with reverse) by its own item: floats in f32, each
// sum rounded to Y's dtype; i32 wraps.
struct CumSumParams {
  std::uint64_t n;  // lines
  Tensor x, y;
  std::uint64_t len;
  std::int64_t x_step, y_step;
  std::uint32_t exclusive, reverse;
};
TK_FN void cumsum_body(const CumSumParams& p, std::uint64_t line) {
  const std::int64_t x0 = offset_of(p.x, line), y0 = offset_of(p.y, line);
  const bool integer = !is_float(p.x.dtype);
  float fsum = 0;
  std::uint32_t isum = 0;
  for (std::uint64_t k = 0; k < p.len; ++k) {
    const auto j = static_cast<std::int64_t>(p.reverse ? p.len - 1 - k : k);
    const std::int64_t from = x0 + j * p.x_step, to = y0 + j * p.y_step;
    if (integer) {
      const auto v = static_cast<std::uint32_t>(load_i(p.x, from));
      if (!p.exclusive) isum += v;
      store_i(p.y, to, static_cast<std::int32_t>(isum));
      if (p.exclusive) isum += v;
    } else {
      const float v = load_f(p.x, from);
      if (!p.exclusive) fsum += v;
      store_f(p.y, to, fsum);
      if (p.exclusive) fsum += v;
    }
  }
}

}  // namespace tpuhal::cuda::k
