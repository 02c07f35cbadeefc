// The tensor engine's innermost loops (simd.h) for AVX-512 (F, BW, DQ, VL): the code is
// written once, in simd_kernels.inc.
#include <immintrin.h>

#include <cstring>

#include "simd.h"

namespace tpuhal::sim::tensor::simd_avx512 {
namespace {

#include "simd_kernels.inc"

}  // namespace

extern const simd::Kernels kKernels = make_kernels(Isa::kAvx512);

}  // namespace tpuhal::sim::tensor::simd_avx512
