// The tensor engine's innermost loops (simd.h) for SSE4.1: the code is
// written once, in simd_kernels.inc.
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cstring>

#include "simd.h"

namespace tpuhal::sim::tensor::simd_sse41 {
namespace {

#include "simd_kernels.inc"

}  // namespace

extern const simd::Kernels kKernels = make_kernels(Isa::kSse41);

}  // namespace tpuhal::sim::tensor::simd_sse41
