// The GPU side of the shim's tensor-op kernels (kernel.h): every family's
// list expanded into a grid-stride entry point "tpuhal_k_<name>". Built by
// nvcc into a fatbin (drivers/CMakeLists.txt) that the shim embeds and loads
// with cuModuleLoadData when a device opens.
#include "kernel.h"
#include "families.h"

using namespace tpuhal::cuda::k;  // NOLINT: the lists name the families' types unqualified

#define TPUHAL_KERNEL(name, Params, body)                                                                         \
  extern "C" __global__ void tpuhal_k_##name(const Params p) {                                                    \
    const std::uint64_t step = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;                                \
    for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += step) \
      body(p, i);                                                                                                 \
  }
#include "kernels.inc"
#undef TPUHAL_KERNEL
