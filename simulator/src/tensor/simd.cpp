#include "simd.h"

#include <algorithm>
#include <cstring>

namespace tpuhal::sim::tensor::simd {

// ThreadSanitizer instruments the resolvers that target_clones generates,
// and the dynamic loader runs them before the sanitizer's runtime is up (a
// crash at start-up), so a TSan build keeps the baseline versions.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define TPUHAL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TPUHAL_CLONES
#endif

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
