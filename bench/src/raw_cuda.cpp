#include "raw_cuda.h"

#if TPUHAL_BENCH_CUDA

#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <vector>

#include "tpuhal/base/wait.h"

namespace tpuhal::bench {
namespace {

// An empty kernel in PTX, so the baseline needs no compiled binary: the
// driver compiles it for whatever GPU it finds.
constexpr char kEmptyKernel[] =
    ".version 7.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    ".visible .entry tpuhal_empty()\n"
    "{\n"
    "\tret;\n"
    "}\n";

struct Entries {
#define TPUHAL_CUDA_ENTRY(name, type) type name = nullptr;
#include "raw_cuda_entries.inc"
#undef TPUHAL_CUDA_ENTRY
};

}  // namespace

struct RawCuda::State {
  Entries cu;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  CUmodule module = nullptr;
  CUfunction empty = nullptr;
  CUdeviceptr device_buffer = 0;
  void* host_buffer = nullptr;

  // The context is current only inside the baseline's calls, as the shim
  // does, so neither disturbs the other.
  struct Current {
    const Entries& cu;
    explicit Current(const State& s) : cu(s.cu) { cu.cuCtxPushCurrent(s.ctx); }
    ~Current() {
      CUcontext c = nullptr;
      cu.cuCtxPopCurrent(&c);
    }
  };
};

namespace {

std::string error_name(const Entries& cu, CUresult r) {
  const char* name = nullptr;
  if (cu.cuGetErrorName) cu.cuGetErrorName(r, &name);
  return name ? name : "CUDA error " + std::to_string(static_cast<int>(r));
}

}  // namespace

std::unique_ptr<RawCuda> RawCuda::open(const std::string& uri, std::uint64_t max_bytes, std::string* why) {
  auto say = [&](std::string text) {
    if (why) *why = std::move(text);
    return nullptr;
  };
  if (uri.rfind("cuda:", 0) != 0) return say(uri + " is not a CUDA device");
  int ordinal = -1;
  const char* digits = uri.c_str() + 5;
  if (std::from_chars(digits, uri.c_str() + uri.size(), ordinal).ec != std::errc() || ordinal < 0)
    return say("CUDA URIs are cuda:N");
  const char* env = std::getenv("TPUHAL_CUDA_LIBRARY");
  const std::string library = env && *env ? env : "libcuda.so.1";
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);  // never closed, as in the shim
  if (!lib) return say(library + " could not be loaded");
  auto get_proc = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(lib, "cuGetProcAddress_v2"));
  if (!get_proc) return say(library + " has no cuGetProcAddress_v2");
  auto s = std::make_unique<State>();
  std::string missing;
#define TPUHAL_CUDA_ENTRY(name, type)                                                            \
  {                                                                                              \
    void* fn = nullptr;                                                                          \
    if (get_proc(#name, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, nullptr) == CUDA_SUCCESS && fn) \
      s->cu.name = reinterpret_cast<type>(fn);                                                   \
    else                                                                                         \
      missing += " " #name;                                                                      \
  }
#include "raw_cuda_entries.inc"
#undef TPUHAL_CUDA_ENTRY
  if (!missing.empty()) return say(library + " lacks" + missing);
  const Entries& cu = s->cu;
  auto failed = [&](const char* what, CUresult r) { return say(std::string(what) + ": " + error_name(cu, r)); };
  if (CUresult r = cu.cuInit(0); r != CUDA_SUCCESS) return failed("cuInit", r);
  if (CUresult r = cu.cuDeviceGet(&s->dev, ordinal); r != CUDA_SUCCESS) return failed("cuDeviceGet", r);
  if (CUresult r = cu.cuDevicePrimaryCtxRetain(&s->ctx, s->dev); r != CUDA_SUCCESS)
    return failed("cuDevicePrimaryCtxRetain", r);
  // From here the destructor gives back whatever was made.
  std::unique_ptr<RawCuda> raw(new RawCuda(std::move(s)));
  State& st = *raw->s_;
  State::Current current(st);
  if (CUresult r = cu.cuStreamCreate(&st.stream, CU_STREAM_NON_BLOCKING); r != CUDA_SUCCESS)
    return failed("cuStreamCreate", r);
  if (CUresult r = cu.cuMemAlloc(&st.device_buffer, max_bytes); r != CUDA_SUCCESS) return failed("cuMemAlloc", r);
  if (CUresult r = cu.cuMemHostAlloc(&st.host_buffer, max_bytes, 0); r != CUDA_SUCCESS)
    return failed("cuMemHostAlloc", r);
  if (CUresult r = cu.cuModuleLoadData(&st.module, kEmptyKernel); r != CUDA_SUCCESS)
    return failed("cuModuleLoadData", r);
  if (CUresult r = cu.cuModuleGetFunction(&st.empty, st.module, "tpuhal_empty"); r != CUDA_SUCCESS)
    return failed("cuModuleGetFunction", r);
  // First touch of every page on both sides, as the shim's run gets.
  cu.cuMemcpyAsync(st.device_buffer, reinterpret_cast<CUdeviceptr>(st.host_buffer), max_bytes, st.stream);
  cu.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(st.host_buffer), st.device_buffer, max_bytes, st.stream);
  if (CUresult r = cu.cuStreamSynchronize(st.stream); r != CUDA_SUCCESS) return failed("cuStreamSynchronize", r);
  return raw;
}

RawCuda::RawCuda(std::unique_ptr<State> s) : s_(std::move(s)) {}

RawCuda::~RawCuda() {
  const Entries& cu = s_->cu;
  {
    State::Current current(*s_);
    if (s_->stream) {
      cu.cuStreamSynchronize(s_->stream);
      cu.cuStreamDestroy(s_->stream);
    }
    if (s_->module) cu.cuModuleUnload(s_->module);
    if (s_->device_buffer) cu.cuMemFree(s_->device_buffer);
    if (s_->host_buffer) cu.cuMemFreeHost(s_->host_buffer);
  }
  cu.cuDevicePrimaryCtxRelease(s_->dev);
}

double RawCuda::copy_gbps(bool to_device, std::uint64_t bytes, int reps) {
  const Entries& cu = s_->cu;
  State::Current current(*s_);
  const auto host = reinterpret_cast<CUdeviceptr>(s_->host_buffer);
  const CUdeviceptr src = to_device ? host : s_->device_buffer, dst = to_device ? s_->device_buffer : host;
  const auto t0 = base::monotonic_ns();
  for (int i = 0; i < reps; ++i) cu.cuMemcpyAsync(dst, src, bytes, s_->stream);
  cu.cuStreamSynchronize(s_->stream);
  const double sec = static_cast<double>(base::monotonic_ns() - t0) * 1e-9;
  return static_cast<double>(bytes) * reps / sec / 1e9;
}

double RawCuda::launch_round_trip_us() {
  const Entries& cu = s_->cu;
  State::Current current(*s_);
  const auto t0 = base::monotonic_ns();
  cu.cuLaunchKernel(s_->empty, 1, 1, 1, 1, 1, 1, 0, s_->stream, nullptr, nullptr);
  cu.cuStreamSynchronize(s_->stream);
  return static_cast<double>(base::monotonic_ns() - t0) / 1000.0;
}

double RawCuda::launch_rate_mps(std::uint64_t n) {
  const Entries& cu = s_->cu;
  State::Current current(*s_);
  const auto t0 = base::monotonic_ns();
  for (std::uint64_t i = 0; i < n; ++i) cu.cuLaunchKernel(s_->empty, 1, 1, 1, 1, 1, 1, 0, s_->stream, nullptr, nullptr);
  cu.cuStreamSynchronize(s_->stream);
  const double sec = static_cast<double>(base::monotonic_ns() - t0) * 1e-9;
  return static_cast<double>(n) / sec / 1e6;
}

}  // namespace tpuhal::bench

#else  // built without the CUDA toolkit

namespace tpuhal::bench {

struct RawCuda::State {};

std::unique_ptr<RawCuda> RawCuda::open(const std::string&, std::uint64_t, std::string* why) {
  if (why) *why = "this build has no CUDA support";
  return nullptr;
}
RawCuda::RawCuda(std::unique_ptr<State> s) : s_(std::move(s)) {}
RawCuda::~RawCuda() = default;
double RawCuda::copy_gbps(bool, std::uint64_t, int) { return 0; }
double RawCuda::launch_round_trip_us() { return 0; }
double RawCuda::launch_rate_mps(std::uint64_t) { return 0; }

}  // namespace tpuhal::bench

#endif
