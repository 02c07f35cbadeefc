#include "simd.h"

#include <algorithm>

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

}  // namespace tpuhal::sim::tensor::simd
