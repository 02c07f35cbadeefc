#include "simd.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

namespace tpuhal::sim::tensor::simd {

// ThreadSanitizer instruments the resolvers that target_clones generates,
// and the dynamic loader runs them before the sanitizer's runtime is up (a
// crash at start-up), so a TSan build keeps the baseline versions.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define TPUHAL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TPUHAL_CLONES
#endif

namespace {

// exp_f32's arithmetic, inlined into each clone so that it vectorises there;
// the same operations in the same order at every level (the file is built
// without contraction into FMA).
inline float exp_core(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // 9 bits: n * kLn2Hi is exact for |n| < 2^15
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding and removing it rounds to an integer
  float c = x != x ? 0.0f : x;           // NaN comes back at the end
  c = c < -104.0f ? -104.0f : c;         // below: 0 after rounding
  c = c > 89.0f ? 89.0f : c;             // above: inf
  const float nf = (c * kLog2e + kMagic) - kMagic;
  const float r = (c - nf * kLn2Hi) - nf * kLn2Lo;  // |r| <= about ln 2 / 2
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = (p * (r * r) + r) + 1.0f;
  // 2^n as two normal factors (n in [-150, 128]): the first product is
  // exact, the second rounds once, into the subnormals or to inf.
  const auto n = static_cast<std::int32_t>(nf);
  const std::int32_t h = n >> 1;
  const float e = (y * std::bit_cast<float>((h + 127) << 23)) * std::bit_cast<float>((n - h + 127) << 23);
  return x != x ? std::numeric_limits<float>::quiet_NaN() : e;
}

}  // namespace

float exp_f32(float x) { return exp_core(x); }

TPUHAL_CLONES
void sigmoid_f32(float* __restrict p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) p[i] = 1.0f / (1.0f + exp_core(-p[i]));
}

TPUHAL_CLONES
void silu_f32(float* __restrict p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) p[i] = p[i] / (1.0f + exp_core(-p[i]));
}

TPUHAL_CLONES
void relu_f32(float* __restrict p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) p[i] = p[i] > 0 ? p[i] : 0.0f;
}

TPUHAL_CLONES
void clip_f32(float* __restrict p, std::size_t n, float lo, float hi) {
  for (std::size_t i = 0; i < n; ++i) p[i] = std::min(std::max(p[i], lo), hi);
}

TPUHAL_CLONES
void leaky_relu_f32(float* __restrict p, std::size_t n, float alpha) {
  for (std::size_t i = 0; i < n; ++i) p[i] = p[i] < 0 ? alpha * p[i] : p[i];
}

TPUHAL_CLONES
void hard_sigmoid_f32(float* __restrict p, std::size_t n, float alpha, float beta) {
  for (std::size_t i = 0; i < n; ++i) p[i] = std::min(std::max(alpha * p[i] + beta, 0.0f), 1.0f);
}

TPUHAL_CLONES
void hard_swish_f32(float* __restrict p, std::size_t n, float alpha, float beta) {
  for (std::size_t i = 0; i < n; ++i) p[i] = p[i] * std::min(std::max(alpha * p[i] + beta, 0.0f), 1.0f);
}

TPUHAL_CLONES
void add_i32(std::int32_t* __restrict out, const std::int32_t* __restrict add, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = static_cast<std::int32_t>(static_cast<std::uint32_t>(out[i]) + static_cast<std::uint32_t>(add[i]));
}

TPUHAL_CLONES
void add_abs_i8(std::uint32_t* __restrict sums, const std::int8_t* __restrict row, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) sums[i] += static_cast<std::uint32_t>(row[i] < 0 ? -row[i] : row[i]);
}

TPUHAL_CLONES
std::uint64_t sum_abs_i8(const std::int8_t* __restrict v, std::size_t n) {
  // In blocks that cannot overflow a 32-bit lane (128 * 2^16 < 2^32).
  std::uint64_t total = 0;
  for (std::size_t at = 0; at < n; at += 65536) {
    std::uint32_t s = 0;
    const std::size_t end = n - at < 65536 ? n : at + 65536;
    for (std::size_t i = at; i < end; ++i) s += static_cast<std::uint32_t>(v[i] < 0 ? -v[i] : v[i]);
    total += s;
  }
  return total;
}

TPUHAL_CLONES
void max_strided_f32(float* __restrict out, const float* __restrict in, std::size_t n, std::size_t stride) {
  if (stride == 1) {  // the common shapes get loops the vectoriser sees whole
    for (std::size_t i = 0; i < n; ++i) out[i] = in[i] > out[i] || in[i] != in[i] ? in[i] : out[i];
  } else if (stride == 2) {
    for (std::size_t i = 0; i < n; ++i) out[i] = in[2 * i] > out[i] || in[2 * i] != in[2 * i] ? in[2 * i] : out[i];
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      const float v = in[i * stride];
      out[i] = v > out[i] || v != v ? v : out[i];
    }
  }
}

TPUHAL_CLONES
void add_strided_f32(float* __restrict out, const float* __restrict in, std::size_t n, std::size_t stride) {
  if (stride == 1) {
    for (std::size_t i = 0; i < n; ++i) out[i] += in[i];
  } else if (stride == 2) {
    for (std::size_t i = 0; i < n; ++i) out[i] += in[2 * i];
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] += in[i * stride];
  }
}

TPUHAL_CLONES
void madd_strided_f32(float* __restrict out, const float* __restrict in, std::size_t n, std::size_t stride, float w) {
  if (stride == 1) {
    for (std::size_t i = 0; i < n; ++i) out[i] += w * in[i];
  } else if (stride == 2) {
    for (std::size_t i = 0; i < n; ++i) out[i] += w * in[2 * i];
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] += w * in[i * stride];
  }
}

TPUHAL_CLONES
void requantize_u8(const std::int32_t* __restrict acc, const float* __restrict mul, std::uint8_t* __restrict out,
                   std::size_t n, std::int32_t zero, std::int32_t lo, std::int32_t hi) {
  // Adding and removing 1.5 * 2^23 rounds half to even in the default
  // rounding mode (the build keeps floating point strict: no contraction).
  constexpr float kMagic = 12582912.0f, kLimit = 4194304.0f;
  for (std::size_t i = 0; i < n; ++i) {
    float v = static_cast<float>(acc[i]) * mul[i];
    v = v < -kLimit ? -kLimit : v;
    v = v > kLimit ? kLimit : v;
    const float r = (v + kMagic) - kMagic;
    std::int32_t q = static_cast<std::int32_t>(r) + zero;
    q = q < lo ? lo : q;
    q = q > hi ? hi : q;
    out[i] = static_cast<std::uint8_t>(q);
  }
}

// f16 -> f32 without branches (so that it vectorises): move the exponent
// and mantissa into place and rebias; a subnormal half comes out right by
// one float subtraction (exact), infinities and NaNs by moving their
// exponent to the top. The same bits as numerics.h's half_to_float.
TPUHAL_CLONES
void widen_f16(const std::uint16_t* __restrict in, float* __restrict out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t h = in[i];
    std::uint32_t o = (h & 0x7FFFu) << 13;              // exponent and mantissa
    const std::uint32_t exp = o & 0x0F800000u;          // the exponent alone
    o += (127u - 15u) << 23;                            // rebias
    o += exp == 0x0F800000u ? (128u - 16u) << 23 : 0u;  // inf, nan: to the top exponent
    float f;
    if (exp == 0) {  // zero or subnormal: renormalise through the float unit
      o += 1u << 23;
      std::memcpy(&f, &o, 4);
      f -= 6.103515625e-05f;  // 2^-14
    } else {
      std::memcpy(&f, &o, 4);
    }
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits |= (h & 0x8000u) << 16;
    std::memcpy(&out[i], &bits, 4);
  }
}

TPUHAL_CLONES
void widen_bf16(const std::uint16_t* __restrict in, float* __restrict out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t bits = static_cast<std::uint32_t>(in[i]) << 16;
    std::memcpy(&out[i], &bits, 4);
  }
}

// f32 -> f16 without branches: normal results round half to even by an
// integer add on the bits; subnormal ones by a float add of 0.5, whose
// rounding is the one wanted; then overflow to infinity and NaN. The same
// bits as numerics.h's float_to_half.
TPUHAL_CLONES
void narrow_f16(const float* __restrict in, std::uint16_t* __restrict out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t x;
    std::memcpy(&x, &in[i], 4);
    const std::uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7FFFFFFFu;
    const std::uint32_t normal = (a - (112u << 23) + 0xFFFu + ((a >> 13) & 1u)) >> 13;
    float fa;
    std::memcpy(&fa, &a, 4);
    fa += 0.5f;  // to a multiple of 2^-24, nearest even
    std::uint32_t sub;
    std::memcpy(&sub, &fa, 4);
    sub -= 0x3F000000u;                                // the bits of 0.5
    std::uint32_t r = a < 0x38800000u ? sub : normal;  // below 2^-14: subnormal
    r = a >= 0x477FF000u ? 0x7C00u : r;                // rounds past 65504: infinity
    r = a > 0x7F800000u ? 0x7E00u : r;                 // NaN
    out[i] = static_cast<std::uint16_t>(sign | r);
  }
}

TPUHAL_CLONES
void narrow_bf16(const float* __restrict in, std::uint16_t* __restrict out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t x;
    std::memcpy(&x, &in[i], 4);
    const std::uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
    const std::uint32_t nan = (x >> 16) | 0x40u;
    out[i] = static_cast<std::uint16_t>((x & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
  }
}

}  // namespace tpuhal::sim::tensor::simd
