// The shim's tensor-op kernels compiled for the host (kernel.h), by name:
// the stand-in driver (tests/cuda/fake_driver.cpp) runs them when a test
// launches "tpuhal_k_<name>" from the shim's fatbin.
#pragma once

#include <cstddef>
#include <span>

namespace tpuhal::cuda::k {

struct HostKernel {
  const char* name;                 // "tpuhal_k_<name>", the GPU entry point's
  std::size_t params;               // sizeof its Params
  void (*run)(const void* params);  // every item, in order
};

std::span<const HostKernel> host_kernels();

}  // namespace tpuhal::cuda::k
