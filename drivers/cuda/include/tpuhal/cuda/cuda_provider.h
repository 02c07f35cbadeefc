// The CUDA shim: the driver interface on NVIDIA GPUs through the CUDA
// driver API (cuda:N). libcuda.so.1 is loaded at run time; without it the
// provider lists no devices and says why. docs/cuda.md describes the mapping.
#pragma once

#include <memory>

#include "tpuhal/driver/driver.hpp"

namespace tpuhal::cuda {

std::shared_ptr<driver::Provider> make_cuda_provider();

}  // namespace tpuhal::cuda
