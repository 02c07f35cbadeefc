// The tensor engine's GEMM kernels for AVX-512 (F, BW, DQ, VL)
// (fgemm.h, igemm.h): the code is written once, in fgemm_kernels.inc and
// igemm_kernels.inc, over the vector types defined here.
#include <immintrin.h>

#include <cstring>

#include "gemm_kernels.h"

namespace tpuhal::sim::tensor::gemm_avx512 {
namespace {

struct V {
  using reg = __m512i;
  static reg load(const std::int32_t* p) { return _mm512_loadu_si512(p); }
  static void store(std::int32_t* p, reg r) { _mm512_storeu_si512(p, r); }
  static reg add(reg a, reg b) { return _mm512_add_epi32(a, b); }
};

struct F {
  using reg = __m512;
  static constexpr unsigned kLanes = 16;
  static constexpr bool kFma = true;
  static reg zero() { return _mm512_setzero_ps(); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, reg r) { _mm512_storeu_ps(p, r); }
  static reg bcast(const float* p) { return _mm512_set1_ps(*p); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static __m512i to_int(reg r) {
    return _mm512_maskz_cvtps_epi32(0xFFFF, r);
  }  // maskz: no undefined lanes for GCC to warn of
  // kLanes halves or bf16 words from p, widened (exact).
  static reg load_f16(const std::uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static reg load_bf16(const std::uint16_t* p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }
};
constexpr unsigned FMR = 12, FNV = 2;
#define TPUHAL_GEMM_F16C 1

#include "fgemm_kernels.inc"
#include "igemm_kernels.inc"

}  // namespace

extern const gemm::Kernels kKernels = {make_float_kernels(Isa::kAvx512), make_int_kernels(Isa::kAvx512)};

}  // namespace tpuhal::sim::tensor::gemm_avx512
