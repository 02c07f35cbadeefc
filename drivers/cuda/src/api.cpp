#include "api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

namespace tpuhal::cuda {
namespace {

struct Loaded {
  Api api;
  const Api* ok = nullptr;
  std::string why;
};

void load_into(Loaded& l) {
  const char* env = std::getenv("TPUHAL_CUDA_LIBRARY");
  l.api.library = env && *env ? env : "libcuda.so.1";
  // Never closed: the driver's own threads and our streams outlive any
  // moment we could prove safe to unload it.
  void* lib = dlopen(l.api.library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    l.why = "no CUDA driver: " + l.api.library + " could not be loaded (" + (err ? err : "unknown error") + ")";
    return;
  }
  auto version = reinterpret_cast<PFN_cuDriverGetVersion_v2020>(dlsym(lib, "cuDriverGetVersion"));
  if (!version || version(&l.api.driver_version) != CUDA_SUCCESS) {
    l.why = l.api.library + " is not a CUDA driver (no working cuDriverGetVersion)";
    return;
  }
  if (l.api.driver_version < kPinnedVersion) {
    l.why = "CUDA driver " + version_text(l.api.driver_version) + " (" + l.api.library + ") is older than " +
            version_text(kPinnedVersion) + ", the oldest the shim runs on; update the NVIDIA driver";
    return;
  }
  auto get_proc = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(lib, "cuGetProcAddress_v2"));
  if (!get_proc) {
    l.why = l.api.library + " reports CUDA " + version_text(l.api.driver_version) + " but has no cuGetProcAddress_v2";
    return;
  }
  // Each entry point at the pinned version: the ABI this code was written
  // against, whatever newer variants the driver also offers.
  std::string missing;
#define TPUHAL_CUDA_ENTRY(name, type)                                                                    \
  {                                                                                                      \
    void* fn = nullptr;                                                                                  \
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;                         \
    if (get_proc(#name, &fn, kPinnedVersion, CU_GET_PROC_ADDRESS_DEFAULT, &found) == CUDA_SUCCESS && fn) \
      l.api.name = reinterpret_cast<type>(fn);                                                           \
    else                                                                                                 \
      missing += (missing.empty() ? "" : ", ") + std::string(#name);                                     \
  }
#include "entry_points.inc"
#undef TPUHAL_CUDA_ENTRY
  if (!missing.empty()) {
    l.why = "CUDA driver " + version_text(l.api.driver_version) + " (" + l.api.library + ") lacks " + missing +
            " at version " + version_text(kPinnedVersion);
    return;
  }
  // CUDA runs streams over CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8
  // by default), fewer than a device's 10 tpuhal queues: a stream memory
  // wait at the head of one then holds the queues queued behind it on the
  // same connection (docs/cuda.md). Unless the application chose a number,
  // ask for 32 before the driver starts; it reads the variable at cuInit.
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  const CUresult r = l.api.cuInit(0);
  if (r == CUDA_ERROR_NO_DEVICE) {
    l.why = "no CUDA device (the CUDA " + version_text(l.api.driver_version) + " driver found none)";
    return;
  }
  if (r != CUDA_SUCCESS) {
    l.why = "the CUDA driver failed to initialise: cuInit: " + describe(l.api, r);
    return;
  }
  l.ok = &l.api;
}

}  // namespace

std::string version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

const Api* load(std::string* why) {
  static Loaded loaded;
  static std::once_flag once;
  std::call_once(once, [] { load_into(loaded); });
  if (!loaded.ok && why) *why = loaded.why;
  return loaded.ok;
}

std::string describe(const Api& api, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.cuGetErrorName) api.cuGetErrorName(r, &name);
  if (api.cuGetErrorString) api.cuGetErrorString(r, &text);
  std::string s = name ? name : "CUDA error " + std::to_string(static_cast<int>(r));
  if (text) s += std::string(" (") + text + ")";
  return s;
}

Status status_of(CUresult r) noexcept {
  switch (r) {
    case CUDA_SUCCESS: return Status::Ok;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE: return Status::InvalidArgument;
    case CUDA_ERROR_OUT_OF_MEMORY: return Status::OutOfMemory;
    case CUDA_ERROR_NOT_SUPPORTED: return Status::Unsupported;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_NOT_FOUND: return Status::NotFound;
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE: return Status::Unavailable;
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_SYSTEM_NOT_READY:
    case CUDA_ERROR_UNKNOWN: return Status::DeviceLost;
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_LAUNCH_TIMEOUT: return Status::DeviceFault;
    default: return Status::Internal;
  }
}

void check(const Api& api, CUresult r, const std::string& what) {
  if (r != CUDA_SUCCESS) throw Error(status_of(r), what + ": " + describe(api, r));
}

ScopedContext::ScopedContext(const Api& api, CUcontext ctx) : api_(api) {
  check(api, api.cuCtxPushCurrent(ctx), "cuCtxPushCurrent");
}

ScopedContext::~ScopedContext() {
  CUcontext popped = nullptr;
  api_.cuCtxPopCurrent(&popped);
}

}  // namespace tpuhal::cuda
