// The tensor engine's innermost loops (simd.h) for AVX2 (built with FMA and
// F16C as the level has them; products and sums stay separate): the code
// is written once, in simd_kernels.inc.
#include <immintrin.h>

#include <cstring>

#include "simd.h"

namespace tpuhal::sim::tensor::simd_avx2 {
namespace {

#include "simd_kernels.inc"

}  // namespace

extern const simd::Kernels kKernels = make_kernels(Isa::kAvx2);

}  // namespace tpuhal::sim::tensor::simd_avx2
