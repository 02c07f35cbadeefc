// The tensor engine's GEMM kernels for SSE4.1 (its widening loads, pmovsxbw and pmovzxbw, in the packing)
// (fgemm.h, igemm.h): the code is written once, in fgemm_kernels.inc and
// igemm_kernels.inc, over the vector types of gemm_sse.inc.
#include <smmintrin.h>

#include <cstring>

#include "gemm_kernels.h"

namespace tpuhal::sim::tensor::gemm_sse41 {
namespace {

#include "gemm_sse.inc"
#include "fgemm_kernels.inc"
#include "igemm_kernels.inc"

}  // namespace

extern const gemm::Kernels kKernels = {make_float_kernels(Isa::kSse41), make_int_kernels(Isa::kSse41)};

}  // namespace tpuhal::sim::tensor::gemm_sse41
