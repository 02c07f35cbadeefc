// The composition root of the library: the providers built into libtpuhal.
// A new built-in driver adds one line here.
#include "tpuhal/pcie/pcie_provider.h"
#include "tpuhal/tpu/sim_provider.h"
#include "tpuhal/tpu/simd_provider.h"

namespace tpuhal::detail {

std::vector<std::shared_ptr<driver::Provider>> builtin_providers() {
  return {tpu::make_sim_provider(), pcie::make_pcie_provider(), tpu::make_simd_provider()};
}

}  // namespace tpuhal::detail
