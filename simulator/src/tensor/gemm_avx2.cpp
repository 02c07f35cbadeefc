// The tensor engine's GEMM kernels for AVX2 with FMA and F16C
// (fgemm.h, igemm.h): the code is written once, in fgemm_kernels.inc and
// igemm_kernels.inc, over the vector types defined here.
#include <immintrin.h>

#include <cstring>

#include "gemm_kernels.h"

namespace tpuhal::sim::tensor::gemm_avx2 {
namespace {

struct V {
  using reg = __m256i;
  static reg load(const std::int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static void store(std::int32_t* p, reg r) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), r); }
  static reg add(reg a, reg b) { return _mm256_add_epi32(a, b); }
};

struct F {
  using reg = __m256;
  static constexpr unsigned kLanes = 8;
  static constexpr bool kFma = true;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, reg r) { _mm256_storeu_ps(p, r); }
  static reg bcast(const float* p) { return _mm256_set1_ps(*p); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static __m256i to_int(reg r) { return _mm256_cvtps_epi32(r); }
  // kLanes halves or bf16 words from p, widened (exact).
  static reg load_f16(const std::uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static reg load_bf16(const std::uint16_t* p) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  }
};
constexpr unsigned FMR = 6, FNV = 2;
#define TPUHAL_GEMM_F16C 1

#include "fgemm_kernels.inc"
#include "igemm_kernels.inc"

}  // namespace

extern const gemm::Kernels kKernels = {make_float_kernels(Isa::kAvx2), make_int_kernels(Isa::kAvx2)};

}  // namespace tpuhal::sim::tensor::gemm_avx2
