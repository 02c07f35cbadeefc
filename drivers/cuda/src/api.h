// The CUDA driver API as the shim reaches it: libcuda.so.1 opened at run
// time, every entry point resolved once through cuGetProcAddress at one
// pinned version, so a machine without the driver still runs everything else
// and a newer driver cannot change a signature under us. Internal to
// drivers/cuda.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>

#include "tpuhal/error.hpp"

namespace tpuhal::cuda {

// The driver API version the entry points are resolved at (CUDA 12.0): the
// oldest driver the shim runs on.
inline constexpr int kPinnedVersion = 12000;

struct Api {
#define TPUHAL_CUDA_ENTRY(name, type) type name = nullptr;
#include "entry_points.inc"
#undef TPUHAL_CUDA_ENTRY
  int driver_version = 0;  // cuDriverGetVersion: 12080 for 12.8
  std::string library;     // the path it was opened from
};

// The loaded driver, initialised (cuInit) and with at least one device, or
// null with `why` saying what is missing ("libcuda.so.1 not found: ...",
// "CUDA driver 11.4 is older than 12.0", "no CUDA device"). Loads once per
// process; TPUHAL_CUDA_LIBRARY names another library to load instead.
const Api* load(std::string* why);

// A CUDA version number as people write it: 12080 -> "12.8".
std::string version_text(int v);

// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
std::string describe(const Api& api, CUresult r);

// The tpuhal status a CUDA error maps to.
Status status_of(CUresult r) noexcept;

// Throws Error(status_of(r), "<what>: <describe(r)>") unless r is success.
void check(const Api& api, CUresult r, const std::string& what);

// Makes a context current on this thread for a scope and restores the one
// before: the caller's own CUDA code keeps whatever it had set.
class ScopedContext {
 public:
  ScopedContext(const Api& api, CUcontext ctx);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  const Api& api_;
};

}  // namespace tpuhal::cuda
