// The composition root of the library: the providers built into libtpuhal.
// A new built-in driver adds one line here.
#include "tpuhal/pcie/pcie_provider.h"
#include "tpuhal/tpu/sim_provider.h"
#include "tpuhal/tpu/simd_provider.h"
#include "tpuhal/tpu/usb_provider.h"
#include "tpuhal/tpu/usb_sim_provider.h"
#if TPUHAL_HAVE_CUDA
#include "tpuhal/cuda/cuda_provider.h"
#endif

namespace tpuhal::detail {

std::vector<std::shared_ptr<driver::Provider>> builtin_providers() {
  std::vector<std::shared_ptr<driver::Provider>> all{tpu::make_sim_provider(), pcie::make_pcie_provider(),
                                                      tpu::make_simd_provider(), tpu::make_usb_provider(),
                                                      tpu::make_usb_sim_provider()};
#if TPUHAL_HAVE_CUDA
  all.push_back(cuda::make_cuda_provider());
#endif
  return all;
}

}  // namespace tpuhal::detail
