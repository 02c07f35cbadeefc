// The tensor engine's innermost loops (simd.h) for the architecture's
// baseline: SSE2 on x86-64; elsewhere the one portable build, the level
// `generic` (on arm64 the baseline includes Advanced SIMD, which the
// compiler uses, so `neon` runs these too). The code is written once, in
// simd_kernels.inc. Also the scalar exp_f32 and erf_f32.
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cstring>

#include "simd.h"

namespace tpuhal::sim::tensor {
namespace simd_baseline {
namespace {

#include "simd_kernels.inc"

}  // namespace

#if defined(__x86_64__)
extern const simd::Kernels kKernels = make_kernels(Isa::kSse2);
#else
extern const simd::Kernels kKernels = make_kernels(Isa::kGeneric);
#endif

}  // namespace simd_baseline

float simd::exp_f32(float x) { return simd_baseline::exp_core(x); }
float simd::erf_f32(float x) { return simd_baseline::erf_core(x); }

}  // namespace tpuhal::sim::tensor
