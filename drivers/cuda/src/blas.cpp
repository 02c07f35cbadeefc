// cuBLAS for the float matrix products (blas.h).
#include "blas.h"

#include <cublas_api.h>
#include <dlfcn.h>

#include <cstdlib>
#include <string_view>

namespace tpuhal::cuda {

struct BlasLibrary {
  void* dl = nullptr;
  std::string path;
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasGetVersion_v2) version = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  // The overload taking a cublasComputeType_t (the header also has an
  // inline one taking a cudaDataType).
  cublasStatus_t (*gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*,
                         cudaDataType, int, long long, const void*, cudaDataType, int, long long, const void*, void*,
                         cudaDataType, int, long long, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
};

namespace {

// Opens the library once per process; null with `why` where none loads.
const BlasLibrary* open_library(std::string* why) {
  static std::string failure;
  static const BlasLibrary* lib = []() -> const BlasLibrary* {
    const char* env = std::getenv("TPUHAL_CUBLAS_LIBRARY");
    const std::string_view names[] = {env ? env : "", "libcublas.so.13", "libcublas.so.12"};
    auto* l = new BlasLibrary;
    for (std::string_view n : names) {
      if (n.empty()) continue;
      l->dl = dlopen(std::string(n).c_str(), RTLD_NOW | RTLD_LOCAL);
      if (l->dl) {
        l->path = std::string(n);
        break;
      }
      failure += (failure.empty() ? "" : "; ") + std::string(dlerror());
    }
    if (!l->dl) return nullptr;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(l->dl, name));
      if (!fn) failure += (failure.empty() ? "" : "; ") + l->path + " lacks " + name;
      return fn != nullptr;
    };
    bool all = true;  // every lookup runs, so the message names each missing one
    all = sym(l->create, "cublasCreate_v2") && all;
    all = sym(l->destroy, "cublasDestroy_v2") && all;
    all = sym(l->version, "cublasGetVersion_v2") && all;
    all = sym(l->set_stream, "cublasSetStream_v2") && all;
    all = sym(l->set_workspace, "cublasSetWorkspace_v2") && all;
    all = sym(l->set_math_mode, "cublasSetMathMode") && all;
    all = sym(l->gemm, "cublasGemmStridedBatchedEx") && all;
    all = sym(l->status_name, "cublasGetStatusName") && all;
    return all ? l : nullptr;  // a library missing entry points stays open, unused
  }();
  if (!lib) *why = "no cuBLAS: " + failure;
  return lib;
}

cudaDataType blas_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::I8: return CUDA_R_8I;
    case DType::I32: return CUDA_R_32I;
    default: return CUDA_R_8U;
  }
}

// One matrix of a product as cuBLAS takes it (column-major): the
// transpose of a row-major view L (rows x cols, element strides
// `row` and `col`), which is either stored as it is (OP_N, ld = row
// stride, when cols are contiguous) or as its own transpose (OP_T).
struct Operand {
  cublasOperation_t op = CUBLAS_OP_N;
  std::int64_t ld = 0;
  bool ok = false;
};
Operand operand(std::uint64_t rows, std::uint64_t cols, std::int64_t row, std::int64_t col) {
  // A dimension of one element has no stride that matters.
  if (cols == 1) col = 1;
  if (rows == 1) row = static_cast<std::int64_t>(std::max<std::uint64_t>(cols, 1));
  Operand o;
  if (col == 1 && row >= static_cast<std::int64_t>(cols)) {
    o = {CUBLAS_OP_N, row, true};
  } else if (row == 1 && col >= static_cast<std::int64_t>(rows)) {
    o = {CUBLAS_OP_T, col, true};
  }
  if (o.ld <= 0 || o.ld > INT32_MAX) o.ok = false;
  return o;
}

// The batch dimensions of `t` (all but its last two), collapsed into one
// count and one stride, or false where they do not collapse.
bool batch_of(std::uint32_t rank, const std::uint64_t* shape, const std::int64_t* strides, std::uint64_t* count,
              std::int64_t* stride) {
  std::uint64_t n = 1;
  std::int64_t s = 0;
  bool set = false;
  for (std::uint32_t d = rank - 2; d-- > 0;) {
    if (shape[d] == 1) continue;
    const std::int64_t st = strides[d];
    if (!set) {
      s = st;
      set = true;
    } else if (st != s * static_cast<std::int64_t>(n)) {
      return false;
    }
    n *= shape[d];
  }
  *count = n;
  *stride = s;
  return true;
}

}  // namespace

std::unique_ptr<Blas> Blas::load(std::string* why) {
  const char* env = std::getenv("TPUHAL_CUDA_BLAS");
  if (env && std::string_view(env) == "0") {
    *why = "TPUHAL_CUDA_BLAS=0";
    return nullptr;
  }
  const BlasLibrary* lib = open_library(why);
  if (!lib) return nullptr;
  cublasHandle_t h = nullptr;
  if (cublasStatus_t s = lib->create(&h); s != CUBLAS_STATUS_SUCCESS) {
    *why = "cublasCreate: " + std::string(lib->status_name(s));
    return nullptr;
  }
  // No workspace: cuBLAS then allocates nothing while a program is being
  // captured, and queues running at once share nothing through it.
  lib->set_workspace(h, nullptr, 0);
  // f32 products in f32, never TF32 (docs/ops.md's bounds are f32's);
  // f16 and bf16 on the tensor cores, accumulating in f32.
  lib->set_math_mode(h, CUBLAS_DEFAULT_MATH);
  auto b = std::unique_ptr<Blas>(new Blas);
  b->lib_ = lib;
  b->handle_ = h;
  int v = 0;
  lib->version(h, &v);
  b->what_ = "cuBLAS " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
             std::to_string(v % 100) + " (" + lib->path + ")";
  return b;
}

Blas::~Blas() {
  if (handle_) lib_->destroy(static_cast<cublasHandle_t>(handle_));
}

bool Blas::gemm(CUstream stream, const driver::OpDesc& op, const k::Tensor& y, CUresult* r, std::string* why) const {
  const auto& at = op.tensors[0];
  const auto& bt = op.tensors[1];
  // matmul, or matmul_integer of i8 by i8 without zero points: int32 sums,
  // exact (and wrapping) on the tensor cores as in the shim's kernels.
  const bool integer = op.kind == driver::OpKind::MatMulInteger;
  driver::MatMulAttrs attrs;
  if (integer) {
    if (at.dtype != DType::I8 || op.tensors[2].present() || op.tensors[3].present()) return false;
  } else {
    attrs = std::get<driver::MatMulAttrs>(op.attrs);
  }
  if (at.dtype != bt.dtype || at.rank < 2 || bt.rank < 2 || y.rank < 2) return false;
  const std::uint32_t ra = at.rank, rb = bt.rank, ry = y.rank;
  const std::uint64_t m = y.shape[ry - 2], n = y.shape[ry - 1];
  const std::uint64_t k = attrs.transpose_a ? at.shape[ra - 2] : at.shape[ra - 1];
  if (m == 0 || n == 0 || k == 0 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) return false;
  // op(a) is m x k, op(b) k x n: their strides after the transposes.
  auto sa_r = static_cast<std::int64_t>(at.strides[ra - 2]), sa_c = static_cast<std::int64_t>(at.strides[ra - 1]);
  auto sb_r = static_cast<std::int64_t>(bt.strides[rb - 2]), sb_c = static_cast<std::int64_t>(bt.strides[rb - 1]);
  if (attrs.transpose_a) std::swap(sa_r, sa_c);
  if (attrs.transpose_b) std::swap(sb_r, sb_c);
  // Y^T = op(b)^T op(a)^T, all column-major.
  const Operand ob = operand(k, n, sb_r, sb_c), oa = operand(m, k, sa_r, sa_c);
  const Operand oy = operand(m, n, y.strides[ry - 2], y.strides[ry - 1]);
  if (!ob.ok || !oa.ok || !oy.ok || oy.op != CUBLAS_OP_N) return false;
  std::uint64_t na = 1, nb = 1, ny = 1;
  std::int64_t sa = 0, sb = 0, sy = 0;
  if (!batch_of(at.rank, at.shape.data(), reinterpret_cast<const std::int64_t*>(at.strides.data()), &na, &sa) ||
      !batch_of(bt.rank, bt.shape.data(), reinterpret_cast<const std::int64_t*>(bt.strides.data()), &nb, &sb) ||
      !batch_of(y.rank, y.shape, y.strides, &ny, &sy))
    return false;
  // Each operand's batch is y's, or broadcast (stride 0).
  if ((na != ny && na != 1) || (nb != ny && nb != 1) || ny > INT32_MAX) return false;
  if (na == 1) sa = 0;
  if (nb == 1) sb = 0;
  const float alpha = attrs.alpha, beta = 0;
  const std::int32_t ialpha = 1, ibeta = 0;
  auto ptr = [](const driver::TensorArg& t) { return reinterpret_cast<void*>(t.buffer->device_address() + t.offset); };
  std::lock_guard lock(mu_);
  auto h = static_cast<cublasHandle_t>(handle_);
  lib_->set_stream(h, reinterpret_cast<cudaStream_t>(stream));
  const cublasStatus_t s = lib_->gemm(
      h, ob.op, oa.op, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
      integer ? static_cast<const void*>(&ialpha) : &alpha, ptr(bt), blas_type(bt.dtype), static_cast<int>(ob.ld), sb,
      ptr(at), blas_type(at.dtype), static_cast<int>(oa.ld), sa, integer ? static_cast<const void*>(&ibeta) : &beta,
      reinterpret_cast<void*>(y.addr), blas_type(static_cast<DType>(y.dtype)), static_cast<int>(oy.ld), sy,
      static_cast<int>(ny), integer ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  // Shapes, layouts or types this cuBLAS has no kernel for are refused
  // before anything is queued: the shim's kernels take them instead.
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) return false;
  *r = s == CUBLAS_STATUS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
  if (s != CUBLAS_STATUS_SUCCESS) *why = std::string("cublasGemmStridedBatchedEx: ") + lib_->status_name(s);
  return true;
}

}  // namespace tpuhal::cuda
