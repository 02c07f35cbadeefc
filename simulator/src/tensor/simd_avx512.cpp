// The tensor engine's innermost loops (simd.h) for AVX-512 (F, BW, DQ, VL): the code is
// written once, in simd_kernels.inc.
#include <immintrin.h>

#include <cstring>

#include "simd.h"

namespace tpuhal::sim::tensor::simd_avx512 {
namespace {

// lookup_u8 on a CPU with AVX512_VBMI (Ice Lake, Zen 4 and later): the
// table in four registers, 64 indices at a time, two two-register byte
// permutes (index bits 0-6) and a blend by bit 7. False (nothing done)
// without VBMI: the loop in simd_kernels.inc runs instead.
#define TPUHAL_VBMI __attribute__((target("avx512f,avx512bw,avx512vbmi")))
TPUHAL_VBMI inline __m512i look_up_64(__m512i idx, __m512i t0, __m512i t1, __m512i t2, __m512i t3) {
  const __m512i lo = _mm512_permutex2var_epi8(t0, idx, t1), hi = _mm512_permutex2var_epi8(t2, idx, t3);
  return _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi);
}

TPUHAL_VBMI void lookup_vbmi(const std::uint8_t* table, const std::uint8_t* in, std::uint8_t* out, std::size_t n) {
  const __m512i t0 = _mm512_loadu_si512(table), t1 = _mm512_loadu_si512(table + 64);
  const __m512i t2 = _mm512_loadu_si512(table + 128), t3 = _mm512_loadu_si512(table + 192);
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) _mm512_storeu_si512(out + i, look_up_64(_mm512_loadu_si512(in + i), t0, t1, t2, t3));
  if (i < n) {
    const __mmask64 m = (std::uint64_t{1} << (n - i)) - 1;  // n - i < 64
    _mm512_mask_storeu_epi8(out + i, m, look_up_64(_mm512_maskz_loadu_epi8(m, in + i), t0, t1, t2, t3));
  }
}
#undef TPUHAL_VBMI

bool lookup_if_vbmi(const std::uint8_t* table, const std::uint8_t* in, std::uint8_t* out, std::size_t n) {
  static const bool vbmi = __builtin_cpu_supports("avx512vbmi");
  if (!vbmi) return false;
  lookup_vbmi(table, in, out, n);
  return true;
}
#define TPUHAL_SIMD_LOOKUP_VBMI lookup_if_vbmi

// dot_rows_i8 with vpmaddwd: 32 products at a time, summed in pairs into
// 32-bit lanes (a pair is at most 2 * 32768 * 128, inside int32), twice the
// rate of the loop in simd_kernels.inc, which widens each product to 32 bits.
// Integer sums: the same result as that loop.
void dot_rows_madd(std::int32_t* out, const std::int16_t* x, const std::int8_t* w, std::size_t stride, std::size_t n,
                   std::size_t rows) {
  for (std::size_t r = 0; r < rows; ++r) {
    const std::int8_t* wr = w + r * stride;
    __m512i s = _mm512_setzero_si512();
    std::size_t i = 0;
    for (; i + 32 <= n; i += 32) {
      const __m512i wv = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr + i)));
      s = _mm512_add_epi32(s, _mm512_madd_epi16(_mm512_loadu_si512(x + i), wv));
    }
    // Lanes added as the vector adds do, wrapping (GCC's _mm512_reduce_add_epi32
    // adds in signed int, which may not overflow).
    const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
    const __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    const __m128i d = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0x4E));
    auto t = static_cast<std::uint32_t>(_mm_cvtsi128_si32(_mm_add_epi32(d, _mm_shuffle_epi32(d, 0xB1))));
    for (; i < n; ++i) t += static_cast<std::uint32_t>(static_cast<std::int32_t>(x[i]) * wr[i]);
    out[r] = static_cast<std::int32_t>(t);
  }
}
#define TPUHAL_SIMD_DOT_ROWS_I8 dot_rows_madd

#include "simd_kernels.inc"

}  // namespace

extern const simd::Kernels kKernels = make_kernels(Isa::kAvx512);

}  // namespace tpuhal::sim::tensor::simd_avx512
