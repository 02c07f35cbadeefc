#include "raw_cuda.h"

#if TPUHAL_BENCH_CUDA

#include <cublas_api.h>
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

namespace {

// cuBLAS as an application opens it: its own dlopen, none of the shim's code.
struct RawBlas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  cublasStatus_t (*gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*,
                         cudaDataType, int, const void*, cudaDataType, int, const void*, void*, cudaDataType, int,
                         cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
};

const RawBlas* raw_blas(std::string* why) {
  static const RawBlas* blas = []() -> const RawBlas* {
    void* dl = dlopen("libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!dl) dl = dlopen("libcublas.so.12", RTLD_NOW | RTLD_LOCAL);
    if (!dl) return nullptr;
    auto* b = new RawBlas;
    b->create = reinterpret_cast<decltype(b->create)>(dlsym(dl, "cublasCreate_v2"));
    b->destroy = reinterpret_cast<decltype(b->destroy)>(dlsym(dl, "cublasDestroy_v2"));
    b->set_stream = reinterpret_cast<decltype(b->set_stream)>(dlsym(dl, "cublasSetStream_v2"));
    b->status_name = reinterpret_cast<decltype(b->status_name)>(dlsym(dl, "cublasGetStatusName"));
    b->gemm = reinterpret_cast<decltype(b->gemm)>(dlsym(dl, "cublasGemmEx"));
    return b->create && b->destroy && b->set_stream && b->status_name && b->gemm ? b : nullptr;
  }();
  if (!blas) *why = "no usable libcublas.so.13 or .12";
  return blas;
}

cudaDataType raw_type(const std::string& t) {
  return t == "f16"    ? CUDA_R_16F
         : t == "bf16" ? CUDA_R_16BF
         : t == "i8"   ? CUDA_R_8I
         : t == "i32"  ? CUDA_R_32I
                       : CUDA_R_32F;
}

}  // namespace

double RawCuda::gemm_seconds(const std::string& in, const std::string& out, std::int64_t n, const void* a,
                             const void* b, int rounds, int reps, std::string* why) {
  const RawBlas* blas = raw_blas(why);
  if (!blas) return 0;
  const Entries& cu = s_->cu;
  State::Current current(*s_);
  const std::uint64_t in_size = in == "f32" ? 4 : in == "i8" ? 1 : 2, out_size = out == "f16" || out == "bf16" ? 2 : 4;
  const std::uint64_t elems = static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(n);
  CUdeviceptr da = 0, db = 0, dy = 0;
  cublasHandle_t h = nullptr;
  double result = 0;
  auto fail = [&](std::string text) { *why = std::move(text); };
  if (cu.cuMemAlloc(&da, elems * in_size) != CUDA_SUCCESS || cu.cuMemAlloc(&db, elems * in_size) != CUDA_SUCCESS ||
      cu.cuMemAlloc(&dy, elems * out_size) != CUDA_SUCCESS) {
    fail("cuMemAlloc failed");
  } else if (cublasStatus_t st = blas->create(&h); st != CUBLAS_STATUS_SUCCESS) {
    fail(std::string("cublasCreate: ") + blas->status_name(st));
  } else {
    cu.cuMemcpyAsync(da, reinterpret_cast<CUdeviceptr>(a), elems * in_size, s_->stream);
    cu.cuMemcpyAsync(db, reinterpret_cast<CUdeviceptr>(b), elems * in_size, s_->stream);
    blas->set_stream(h, reinterpret_cast<cudaStream_t>(s_->stream));
    const bool integer = in == "i8";
    const float fa = 1, fb = 0;
    const std::int32_t ia = 1, ib = 0;
    const void* alpha = integer ? static_cast<const void*>(&ia) : &fa;
    const void* beta = integer ? static_cast<const void*>(&ib) : &fb;
    const auto ni = static_cast<int>(n);
    auto run = [&] {
      return blas->gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, alpha, reinterpret_cast<const void*>(db), raw_type(in),
                        ni, reinterpret_cast<const void*>(da), raw_type(in), ni, beta, reinterpret_cast<void*>(dy),
                        raw_type(out), ni, integer ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    if (cublasStatus_t ran = run(); ran != CUBLAS_STATUS_SUCCESS) {
      fail(std::string("cublasGemmEx: ") + blas->status_name(ran));
    } else {
      cu.cuStreamSynchronize(s_->stream);
      std::vector<double> t;
      for (int r = 0; r < rounds; ++r) {
        const auto t0 = base::monotonic_ns();
        for (int i = 0; i < reps; ++i) run();
        cu.cuStreamSynchronize(s_->stream);
        t.push_back(static_cast<double>(base::monotonic_ns() - t0) * 1e-9 / reps);
      }
      std::sort(t.begin(), t.end());
      result = t[t.size() / 2];
    }
  }
  if (h) blas->destroy(h);
  for (CUdeviceptr p : {da, db, dy})
    if (p) cu.cuMemFree(p);
  return result;
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
double RawCuda::gemm_seconds(const std::string&, const std::string&, std::int64_t, const void*, const void*, int, int,
                             std::string* why) {
  *why = "this build has no CUDA support";
  return 0;
}

}  // namespace tpuhal::bench

#endif
