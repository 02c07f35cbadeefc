// The tensor engine's GEMM kernels for SSE2, x86-64's baseline
// (fgemm.h, igemm.h): the code is written once, in fgemm_kernels.inc and
// igemm_kernels.inc, over the vector types of gemm_sse.inc.
#include <emmintrin.h>

#include <cstring>

#include "gemm_kernels.h"

namespace tpuhal::sim::tensor::gemm_sse2 {
namespace {

#include "gemm_sse.inc"
#include "fgemm_kernels.inc"
#include "igemm_kernels.inc"

}  // namespace

extern const gemm::Kernels kKernels = {make_float_kernels(Isa::kSse2), make_int_kernels(Isa::kSse2)};

}  // namespace tpuhal::sim::tensor::gemm_sse2
