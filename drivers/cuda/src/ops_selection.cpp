// Launchers of the selection family (ops.h): top_k (argmax, argmin),
// gather, scatter_elements and nms, in every dtype the HAL takes.
#include "ops.h"

#include "../kernels/selection.h"

namespace tpuhal::cuda {
namespace {

CUresult run_top_k(const Kernels& kernels, CUstream stream, const driver::OpDesc& op) {
  const auto& at = std::get<driver::TopKAttrs>(op.attrs);
  k::TopKParams p{};
  tensors_of(op, {&p.x, &p.values, &p.indices});
  p.axis = at.axis;
  p.largest = at.largest ? 1 : 0;
  p.last_index = at.last_index ? 1 : 0;
  p.n = k::sel::lanes(p.indices, p.axis);
  return kernels.launch(stream, "top_k", p);
}

// Raises the fault for an index of op.tensors[1] outside an axis of `dim`.
CUresult check_indices(const Kernels& kernels, CUstream stream, const driver::OpDesc& op, std::uint64_t dim,
                       const k::Fault& fault) {
  k::SelectionIndexCheckParams p{};
  p.indices = tensor_of(op.tensors[1]);
  p.n = k::numel(p.indices);
  p.dim = static_cast<std::int64_t>(dim);
  p.tensor = 1;
  p.fault = fault;
  return kernels.launch(stream, "selection_index_check", p);
}

CUresult run_gather(const Kernels& kernels, CUstream stream, const driver::OpDesc& op, const k::Fault& fault) {
  k::GatherParams p{};
  tensors_of(op, {&p.x, &p.indices, &p.y});
  p.axis = std::get<driver::GatherAttrs>(op.attrs).axis;
  p.n = k::numel(p.y);
  p.fault = fault;
  if (CUresult r = check_indices(kernels, stream, op, p.x.shape[p.axis], fault); r != CUDA_SUCCESS) return r;
  return kernels.launch(stream, "gather", p);
}

// Every index checked, then Y = X, then the updates: a bad index leaves Y
// as it was.
CUresult run_scatter(const Kernels& kernels, CUstream stream, const driver::OpDesc& op, const k::Fault& fault) {
  const auto& at = std::get<driver::ScatterElementsAttrs>(op.attrs);
  k::SelectionCopyParams copy{};
  copy.x = tensor_of(op.tensors[0]);
  copy.y = tensor_of(op.tensors[3]);
  copy.n = k::numel(copy.y);
  copy.fault = fault;
  k::ScatterParams p{};
  p.indices = tensor_of(op.tensors[1]);
  p.updates = tensor_of(op.tensors[2]);
  p.y = copy.y;
  p.axis = at.axis;
  p.reduction = static_cast<std::uint32_t>(at.reduction);
  p.n = k::sel::lanes(p.indices, p.axis);
  p.fault = fault;
  if (CUresult r = check_indices(kernels, stream, op, p.y.shape[p.axis], fault); r != CUDA_SUCCESS) return r;
  if (CUresult r = kernels.launch(stream, "selection_copy", copy); r != CUDA_SUCCESS) return r;
  return kernels.launch(stream, "scatter_elements", p);
}

CUresult run_nms(const Kernels& kernels, CUstream stream, const driver::OpDesc& op) {
  const auto& at = std::get<driver::NmsAttrs>(op.attrs);
  k::NmsParams p{};
  tensors_of(op, {&p.boxes, &p.scores, &p.y});
  p.iou_threshold = at.iou_threshold;
  p.score_threshold = at.score_threshold;
  p.center = at.center ? 1 : 0;
  p.class_agnostic = at.class_agnostic ? 1 : 0;
  p.n = p.y.shape[1] == 0 ? 0 : p.y.shape[0];
  return kernels.launch(stream, "nms", p);
}

}  // namespace

static_assert(static_cast<std::uint32_t>(ScatterReduction::None) == k::sel::kScatterNone &&
              static_cast<std::uint32_t>(ScatterReduction::Add) == k::sel::kScatterAdd &&
              static_cast<std::uint32_t>(ScatterReduction::Mul) == k::sel::kScatterMul &&
              static_cast<std::uint32_t>(ScatterReduction::Max) == k::sel::kScatterMax &&
              static_cast<std::uint32_t>(ScatterReduction::Min) == k::sel::kScatterMin);

std::string refuse_selection(const driver::OpDesc& op) {
  using K = driver::OpKind;
  if (op.kind == K::TopK || op.kind == K::Gather || op.kind == K::ScatterElements || op.kind == K::Nms) return {};
  if (op.kind == K::RoiAlign) return op.name + " (no GPU kernel yet: it runs on sim:N)";
  return op.name + " (not a selection op)";
}

CUresult run_selection(const Kernels& kernels, CUstream stream, const driver::OpDesc& op, const k::Fault& fault) {
  switch (op.kind) {
    case driver::OpKind::TopK: return run_top_k(kernels, stream, op);
    case driver::OpKind::Gather: return run_gather(kernels, stream, op, fault);
    case driver::OpKind::ScatterElements: return run_scatter(kernels, stream, op, fault);
    case driver::OpKind::Nms: return run_nms(kernels, stream, op);
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
}

}  // namespace tpuhal::cuda
