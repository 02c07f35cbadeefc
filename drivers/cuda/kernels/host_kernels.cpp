#include "host_kernels.h"

#include <cstring>
#include <type_traits>

#include "kernel.h"
#include "families.h"

namespace tpuhal::cuda::k {
namespace {

#define TPUHAL_KERNEL(name, Params, body)                   \
  {"tpuhal_k_" #name, sizeof(Params), [](const void* raw) { \
     static_assert(std::is_trivially_copyable_v<Params>);   \
     Params p;                                              \
     std::memcpy(static_cast<void*>(&p), raw, sizeof p);    \
     for (std::uint64_t i = 0; i < p.n; ++i) body(p, i);    \
   }},
const HostKernel kKernels[] = {
#include "kernels.inc"
};
#undef TPUHAL_KERNEL

}  // namespace

std::span<const HostKernel> host_kernels() { return kKernels; }

}  // namespace tpuhal::cuda::k
