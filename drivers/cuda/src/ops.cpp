// Tensor ops on the GPU: loading the kernels, launching them, and which
// family of launchers takes each kind of op (ops.h).
#include "ops.h"

#include <algorithm>

#include "blas.h"
#include "tpuhal/error.hpp"
#include "../kernels/activation.h"

// The fatbin nvcc built from drivers/cuda/kernels (empty where the library
// was built without nvcc): a file CMake writes.
extern "C" const unsigned char tpuhal_cuda_kernels_fatbin[];
extern "C" const unsigned long long tpuhal_cuda_kernels_fatbin_size;

namespace tpuhal::cuda {

static_assert(k::kF32 == static_cast<std::uint32_t>(DType::F32) && k::kF16 == static_cast<std::uint32_t>(DType::F16) &&
              k::kBF16 == static_cast<std::uint32_t>(DType::BF16) && k::kI8 == static_cast<std::uint32_t>(DType::I8) &&
              k::kU8 == static_cast<std::uint32_t>(DType::U8) && k::kI32 == static_cast<std::uint32_t>(DType::I32));
static_assert(k::kRank == kMaxRank);

std::unique_ptr<Kernels> Kernels::load(const Api& api, std::string* why) {
  if (tpuhal_cuda_kernels_fatbin_size == 0) {
    *why = "this build of tpuhal has no GPU kernels (the CUDA toolkit's nvcc was not found when it was built)";
    return nullptr;
  }
  auto k = std::unique_ptr<Kernels>(new Kernels(api));
  if (CUresult r = api.cuModuleLoadData(&k->module_, tpuhal_cuda_kernels_fatbin); r != CUDA_SUCCESS) {
    k->module_ = nullptr;
    *why = "cuModuleLoadData (the tensor-op kernels, built for sm_80 and sm_90 with PTX): " + describe(api, r);
    return nullptr;
  }
  return k;
}

Kernels::~Kernels() {
  if (module_) api_.cuModuleUnload(module_);
}

CUresult Kernels::function(const char* name, CUfunction* out) const {
  std::lock_guard lock(mu_);
  if (auto it = functions_.find(std::string_view(name)); it != functions_.end()) {
    *out = it->second;
    return CUDA_SUCCESS;
  }
  const std::string entry = std::string("tpuhal_k_") + name;
  if (CUresult r = api_.cuModuleGetFunction(out, module_, entry.c_str()); r != CUDA_SUCCESS) return r;
  functions_.emplace(name, *out);
  return CUDA_SUCCESS;
}

CUresult Kernels::launch_raw(CUstream stream, const char* name, void* params, std::uint64_t n) const {
  if (n == 0) return CUDA_SUCCESS;
  CUfunction f = nullptr;
  if (CUresult r = function(name, &f); r != CUDA_SUCCESS) return r;
  // A grid-stride loop: enough blocks to fill any current GPU several
  // times over, no more.
  constexpr std::uint64_t kBlock = 256, kMaxBlocks = 16384;
  const auto blocks = static_cast<unsigned>(std::min((n + kBlock - 1) / kBlock, kMaxBlocks));
  void* args[] = {params};
  return api_.cuLaunchKernel(f, blocks, 1, 1, kBlock, 1, 1, 0, stream, args, nullptr);
}

k::Tensor tensor_of(const driver::TensorArg& t) {
  k::Tensor out;
  if (!t.present()) return out;
  out.addr = t.buffer->device_address() + t.offset;
  out.dtype = static_cast<std::uint32_t>(t.dtype);
  out.rank = t.rank;
  for (std::uint32_t d = 0; d < t.rank; ++d) {
    out.shape[d] = t.shape[d];
    out.strides[d] = static_cast<std::int64_t>(t.strides[d]);
  }
  return out;
}

void tensors_of(const driver::OpDesc& op, std::initializer_list<k::Tensor*> fields) {
  std::size_t i = 0;
  for (k::Tensor* f : fields) *f = tensor_of(op.tensors.at(i++));
}

std::string op_in(const driver::OpDesc& op, DType dtype) { return op.name + " in " + to_string(dtype); }

namespace {

enum class Family { Elementwise, Linear, Quantized, Selection };

Family family_of(driver::OpKind kind) {
  using K = driver::OpKind;
  switch (kind) {
    case K::Elementwise:
    case K::Where:
    case K::CumSum: return Family::Elementwise;
    case K::MatMul:
    case K::Conv2d:
    case K::ConvTranspose2d:
    case K::Pool2d:
    case K::MatMulInteger:
    case K::ConvInteger:
    case K::QLinearMatMul:
    case K::QLinearConv: return Family::Linear;
    case K::Quantize:
    case K::Dequantize:
    case K::QLinearAdd:
    case K::QLinearMul:
    case K::QLinearGlobalAvgPool:
    case K::Softmax:
    case K::Resize:
    case K::ColorConvert: return Family::Quantized;
    case K::TopK:
    case K::Gather:
    case K::ScatterElements:
    case K::Nms:
    case K::RoiAlign: return Family::Selection;
  }
  return Family::Selection;
}

}  // namespace

bool run_matmul_on_blas(const Blas& blas, const Kernels& kernels, CUstream stream, const driver::OpDesc& op,
                        const std::function<std::uint64_t(std::uint64_t)>& scratch, CUresult* r, std::string* why) {
  if (op.kind == driver::OpKind::MatMulInteger) return blas.gemm(stream, op, tensor_of(op.tensors[4]), r, why);
  const auto& attrs = std::get<driver::MatMulAttrs>(op.attrs);
  const k::Tensor y = tensor_of(op.tensors[3]);
  const k::Tensor c = tensor_of(op.tensors[2]);
  const bool plain = !c.addr && attrs.activation.kind == Activation::None;
  if (plain || y.dtype == k::kF32) {
    if (!blas.gemm(stream, op, y, r, why)) return false;
  } else {
    // An f32 sum, rounded once into y's dtype by the epilogue.
    k::Tensor t = y;
    t.dtype = k::kF32;
    std::int64_t stride = 1;
    for (std::uint32_t d = t.rank; d-- > 0;) {
      t.strides[d] = stride;
      stride *= static_cast<std::int64_t>(t.shape[d]);
    }
    t.addr = scratch(static_cast<std::uint64_t>(stride) * 4);
    if (!t.addr || !blas.gemm(stream, op, t, r, why)) return false;
    if (*r != CUDA_SUCCESS) return true;
    return (*r = kernels.launch(stream, "epilogue",
                                k::EpilogueParams{k::numel(y),
                                                  t,
                                                  c,
                                                  y,
                                                  attrs.beta,
                                                  {static_cast<std::uint32_t>(attrs.activation.kind),
                                                   attrs.activation.alpha, attrs.activation.beta}}),
            true);
  }
  if (*r != CUDA_SUCCESS || plain) return true;
  *r = kernels.launch(stream, "epilogue",
                      k::EpilogueParams{k::numel(y),
                                        y,
                                        c,
                                        y,
                                        attrs.beta,
                                        {static_cast<std::uint32_t>(attrs.activation.kind), attrs.activation.alpha,
                                         attrs.activation.beta}});
  return true;
}

std::string refuse_op(const driver::OpDesc& op) {
  switch (family_of(op.kind)) {
    case Family::Elementwise: return refuse_elementwise(op);
    case Family::Linear: return refuse_linear(op);
    case Family::Quantized: return refuse_quantized(op);
    case Family::Selection: return refuse_selection(op);
  }
  return op.name + " (unknown kind)";
}

CUresult run_op(const Kernels& kernels, CUstream stream, const driver::OpDesc& op, const k::Fault& fault) {
  switch (family_of(op.kind)) {
    case Family::Elementwise: return run_elementwise(kernels, stream, op, fault);
    case Family::Linear: return run_linear(kernels, stream, op, fault);
    case Family::Quantized: return run_quantized(kernels, stream, op, fault);
    case Family::Selection: return run_selection(kernels, stream, op, fault);
  }
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // namespace tpuhal::cuda
