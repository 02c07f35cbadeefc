// A stand-in for libcublas.so, so that the CUDA shim's use of cuBLAS (the
// operands' layouts, transposes, leading dimensions, batch strides and the
// epilogue after it) is tested on machines without a GPU. It exports the
// entry points the shim and the benchmarks' raw baseline resolve and runs
// each product on the host, in the stand-in driver's stream order
// (tpuhal_fake_cuda_launch_host, found in the library TPUHAL_CUDA_LIBRARY
// names): column-major C = alpha * op(A) op(B) (+ beta * C), summed in f32
// (int32, wrapping, for int8), as cuBLAS defines it.
#include <cublas_api.h>
#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "host_kernels.h"
#include "kernel.h"

namespace {

using tpuhal::cuda::k::HostKernel;

struct Handle {
  CUstream stream = nullptr;
};

struct Gemm {
  std::uint64_t n;  // the host-kernel convention: items (one: the whole product)
  cublasOperation_t ta, tb;
  int m, nn, k, batch;
  float alpha, beta;
  std::int32_t ialpha, ibeta;
  std::uint64_t a, b, c;
  cudaDataType at, bt, ct;
  long long lda, ldb, ldc, sa, sb, sc;
};

float load(cudaDataType t, std::uint64_t base, long long i) {
  switch (t) {
    case CUDA_R_32F: return reinterpret_cast<const float*>(base)[i];
    case CUDA_R_16F: return tpuhal::cuda::k::f16_to_float(reinterpret_cast<const std::uint16_t*>(base)[i]);
    case CUDA_R_16BF: return tpuhal::cuda::k::bf16_to_float(reinterpret_cast<const std::uint16_t*>(base)[i]);
    case CUDA_R_8I: return reinterpret_cast<const std::int8_t*>(base)[i];
    default: return static_cast<float>(reinterpret_cast<const std::int32_t*>(base)[i]);
  }
}

void store(cudaDataType t, std::uint64_t base, long long i, float v) {
  switch (t) {
    case CUDA_R_32F: reinterpret_cast<float*>(base)[i] = v; break;
    case CUDA_R_16F: reinterpret_cast<std::uint16_t*>(base)[i] = tpuhal::cuda::k::float_to_f16(v); break;
    default: reinterpret_cast<std::uint16_t*>(base)[i] = tpuhal::cuda::k::float_to_bf16(v); break;
  }
}

std::atomic<unsigned long long> gemms{0};  // products run (tpuhal_fake_cublas_gemms)

void run_gemm(const void* raw) {
  gemms.fetch_add(1);
  Gemm g;
  std::memcpy(&g, raw, sizeof g);
  const bool integer = g.at == CUDA_R_8I;
  for (int b = 0; b < g.batch; ++b)
    for (int j = 0; j < g.nn; ++j)
      for (int i = 0; i < g.m; ++i) {
        float facc = 0;
        std::uint32_t iacc = 0;
        for (int l = 0; l < g.k; ++l) {
          const long long ai = b * g.sa + (g.ta == CUBLAS_OP_N ? i + l * g.lda : l + i * g.lda);
          const long long bi = b * g.sb + (g.tb == CUBLAS_OP_N ? l + j * g.ldb : j + l * g.ldb);
          const float x = load(g.at, g.a, ai), y = load(g.bt, g.b, bi);
          if (integer)
            iacc += static_cast<std::uint32_t>(static_cast<std::int32_t>(x) * static_cast<std::int32_t>(y));
          else
            facc = x * y + facc;
        }
        const long long ci = b * g.sc + i + j * g.ldc;
        if (integer) {
          auto* c = reinterpret_cast<std::int32_t*>(g.c);
          c[ci] = static_cast<std::int32_t>(iacc * static_cast<std::uint32_t>(g.ialpha) +
                                            (g.ibeta ? static_cast<std::uint32_t>(g.ibeta * c[ci]) : 0u));
        } else {
          store(g.ct, g.c, ci, g.alpha * facc + (g.beta != 0 ? g.beta * load(g.ct, g.c, ci) : 0.0f));
        }
      }
}

const HostKernel kGemm{"fake cublas gemm", sizeof(Gemm), run_gemm};

using Launch = CUresult (*)(CUstream, const HostKernel*, const void*);
Launch launcher() {
  static Launch l = [] {
    const char* lib = std::getenv("TPUHAL_CUDA_LIBRARY");
    void* dl = lib ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : nullptr;
    return dl ? reinterpret_cast<Launch>(dlsym(dl, "tpuhal_fake_cuda_launch_host")) : nullptr;
  }();
  return l;
}

bool float_type(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

cublasStatus_t queue(cublasHandle_t h, Gemm g, const void* alpha, const void* beta, cublasComputeType_t compute) {
  if (!h || !launcher()) return CUBLAS_STATUS_NOT_INITIALIZED;
  const bool integer = compute == CUBLAS_COMPUTE_32I;
  if (integer ? (g.at != CUDA_R_8I || g.bt != CUDA_R_8I || g.ct != CUDA_R_32I)
              : (!float_type(g.at) || g.at != g.bt || !float_type(g.ct) || compute != CUBLAS_COMPUTE_32F))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const int a_rows = g.ta == CUBLAS_OP_N ? g.m : g.k, b_rows = g.tb == CUBLAS_OP_N ? g.k : g.nn;
  if (g.m < 0 || g.nn < 0 || g.k < 0 || g.batch < 0 || g.lda < std::max(1, a_rows) || g.ldb < std::max(1, b_rows) ||
      g.ldc < std::max(1, g.m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (integer) {
    std::memcpy(&g.ialpha, alpha, 4);
    std::memcpy(&g.ibeta, beta, 4);
  } else {
    std::memcpy(&g.alpha, alpha, 4);
    std::memcpy(&g.beta, beta, 4);
  }
  g.n = 1;
  const auto* handle = reinterpret_cast<const Handle*>(h);
  return launcher()(handle->stream, &kGemm, &g) == CUDA_SUCCESS ? CUBLAS_STATUS_SUCCESS
                                                                : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // namespace

extern "C" {

// For the tests: how many products the stand-in has run.
__attribute__((visibility("default"))) unsigned long long tpuhal_fake_cublas_gemms() { return gemms.load(); }

__attribute__((visibility("default"))) cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  if (!launcher()) return CUBLAS_STATUS_NOT_INITIALIZED;
  *h = reinterpret_cast<cublasHandle_t>(new Handle);
  return CUBLAS_STATUS_SUCCESS;
}
__attribute__((visibility("default"))) cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  delete reinterpret_cast<Handle*>(h);
  return CUBLAS_STATUS_SUCCESS;
}
__attribute__((visibility("default"))) cublasStatus_t cublasGetVersion_v2(cublasHandle_t, int* v) {
  *v = 990000;  // "99.0.0": no real cuBLAS
  return CUBLAS_STATUS_SUCCESS;
}
__attribute__((visibility("default"))) cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  reinterpret_cast<Handle*>(h)->stream = reinterpret_cast<CUstream>(s);
  return CUBLAS_STATUS_SUCCESS;
}
__attribute__((visibility("default"))) cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t, void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
__attribute__((visibility("default"))) cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) {
  return CUBLAS_STATUS_SUCCESS;
}
__attribute__((visibility("default"))) const char* cublasGetStatusName(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_(stand-in error)";
}
__attribute__((visibility("default"))) cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* alpha, const void* a,
    cudaDataType at, int lda, long long sa, const void* b, cudaDataType bt, int ldb, long long sb, const void* beta,
    void* c, cudaDataType ct, int ldc, long long sc, int batch, cublasComputeType_t compute, cublasGemmAlgo_t) {
  Gemm g{};
  g.ta = ta;
  g.tb = tb;
  g.m = m;
  g.nn = n;
  g.k = k;
  g.batch = batch;
  g.a = reinterpret_cast<std::uint64_t>(a);
  g.b = reinterpret_cast<std::uint64_t>(b);
  g.c = reinterpret_cast<std::uint64_t>(c);
  g.at = at;
  g.bt = bt;
  g.ct = ct;
  g.lda = lda;
  g.ldb = ldb;
  g.ldc = ldc;
  g.sa = sa;
  g.sb = sb;
  g.sc = sc;
  return queue(h, g, alpha, beta, compute);
}
__attribute__((visibility("default"))) cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta,
                                                                   cublasOperation_t tb, int m, int n, int k,
                                                                   const void* alpha, const void* a, cudaDataType at,
                                                                   int lda, const void* b, cudaDataType bt, int ldb,
                                                                   const void* beta, void* c, cudaDataType ct, int ldc,
                                                                   cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, a, at, lda, 0, b, bt, ldb, 0, beta, c, ct, ldc, 0, 1,
                                    compute, algo);
}

}  // extern "C"
