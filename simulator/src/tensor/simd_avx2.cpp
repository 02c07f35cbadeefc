// The tensor engine's innermost loops (simd.h) for AVX2 (built with FMA and
// F16C as the level has them; products and sums stay separate): the code
// is written once, in simd_kernels.inc.
#include <immintrin.h>

#include <cstring>

#include "simd.h"

namespace tpuhal::sim::tensor::simd_avx2 {
namespace {

// dot_rows_i8 with vpmaddwd: 16 products at a time, summed in pairs into
// 32-bit lanes (a pair is at most 2 * 32768 * 128, inside int32), faster
// than the loop in simd_kernels.inc, which widens each product to 32 bits.
// Integer sums: the same result as that loop.
void dot_rows_madd(std::int32_t* out, const std::int16_t* x, const std::int8_t* w, std::size_t stride, std::size_t n,
                   std::size_t rows) {
  for (std::size_t r = 0; r < rows; ++r) {
    const std::int8_t* wr = w + r * stride;
    __m256i s = _mm256_setzero_si256();
    std::size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + i)));
      s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), wv));
    }
    const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    const __m128i q = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    auto t = static_cast<std::uint32_t>(_mm_cvtsi128_si32(_mm_add_epi32(q, _mm_shuffle_epi32(q, 0xB1))));
    for (; i < n; ++i) t += static_cast<std::uint32_t>(static_cast<std::int32_t>(x[i]) * wr[i]);
    out[r] = static_cast<std::int32_t>(t);
  }
}
#define TPUHAL_SIMD_DOT_ROWS_I8 dot_rows_madd
#define TPUHAL_SIMD_EXP_CHAINS 2

#include "simd_kernels.inc"

}  // namespace

extern const simd::Kernels kKernels = make_kernels(Isa::kAvx2);

}  // namespace tpuhal::sim::tensor::simd_avx2
