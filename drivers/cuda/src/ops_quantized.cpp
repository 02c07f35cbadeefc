// Launchers of the quantized family (ops.h): quantize, dequantize,
// qlinear_add, qlinear_mul, qlinear_global_avg_pool, softmax, resize and
// colour conversion. Each kind is one kernel launch; every dtype the HAL
// accepts for them runs.
#include "ops.h"

#include "../kernels/quantized.h"

namespace tpuhal::cuda {
namespace {

using driver::OpDesc;
using driver::OpKind;

static_assert(k::quant::kResizeNearest == static_cast<std::uint32_t>(ResizeMode::Nearest) &&
              k::quant::kResizeLinear == static_cast<std::uint32_t>(ResizeMode::Linear));
static_assert(k::quant::kHalfPixel == static_cast<std::uint32_t>(CoordinateMode::HalfPixel) &&
              k::quant::kAsymmetric == static_cast<std::uint32_t>(CoordinateMode::Asymmetric) &&
              k::quant::kAlignCorners == static_cast<std::uint32_t>(CoordinateMode::AlignCorners) &&
              k::quant::kPytorchHalfPixel == static_cast<std::uint32_t>(CoordinateMode::PytorchHalfPixel) &&
              k::quant::kTfHalfPixelForNn == static_cast<std::uint32_t>(CoordinateMode::TfHalfPixelForNn));
static_assert(k::quant::kRoundPreferFloor == static_cast<std::uint32_t>(NearestMode::RoundPreferFloor) &&
              k::quant::kRoundPreferCeil == static_cast<std::uint32_t>(NearestMode::RoundPreferCeil) &&
              k::quant::kNearestFloor == static_cast<std::uint32_t>(NearestMode::Floor) &&
              k::quant::kNearestCeil == static_cast<std::uint32_t>(NearestMode::Ceil));

// quantize and dequantize: X, Scale, ZeroPoint (opt), Y.
CUresult run_quantize(const Kernels& kernels, CUstream stream, const OpDesc& op) {
  k::QuantizeParams p{};
  tensors_of(op, {&p.x, &p.scale, &p.zero, &p.y});
  p.n = k::numel(p.y);
  return kernels.launch(stream, op.kind == OpKind::Quantize ? "quantize" : "dequantize", p);
}

// qlinear_add and qlinear_mul: A, AScale, AZeroPoint, B, BScale,
// BZeroPoint, YScale, YZeroPoint, Y.
CUresult run_qlinear_binary(const Kernels& kernels, CUstream stream, const OpDesc& op) {
  k::QLinearBinaryParams p{};
  tensors_of(op, {&p.a, &p.a_scale, &p.a_zero, &p.b, &p.b_scale, &p.b_zero, &p.y_scale, &p.y_zero, &p.y});
  p.mul = op.kind == OpKind::QLinearMul ? 1 : 0;
  p.n = k::numel(p.y);
  return kernels.launch(stream, "qlinear_binary", p);
}

// X [N, H, W, C], XScale, XZeroPoint, YScale, YZeroPoint, Y [N, 1, 1, C].
CUresult run_qlinear_gap(const Kernels& kernels, CUstream stream, const OpDesc& op) {
  k::QLinearGapParams p{};
  tensors_of(op, {&p.x, &p.x_scale, &p.x_zero, &p.y_scale, &p.y_zero, &p.y});
  p.n = p.x.shape[0] * p.x.shape[3];
  return kernels.launch(stream, "qlinear_global_avg_pool", p);
}

// X, Y: one item per line along the axis (none where the axis is empty).
CUresult run_softmax(const Kernels& kernels, CUstream stream, const OpDesc& op) {
  const auto& a = std::get<driver::SoftmaxAttrs>(op.attrs);
  k::SoftmaxParams p{};
  p.x = tensor_of(op.tensors[0]);
  p.y = tensor_of(op.tensors[1]);
  p.len = p.x.shape[a.axis];
  p.x_step = p.x.strides[a.axis];
  p.y_step = p.y.strides[a.axis];
  p.x.shape[a.axis] = 1;
  p.y.shape[a.axis] = 1;
  p.log = a.log ? 1 : 0;
  p.n = p.len == 0 ? 0 : k::numel(p.y);
  return kernels.launch(stream, "softmax", p);
}

CUresult run_resize(const Kernels& kernels, CUstream stream, const OpDesc& op) {
  const auto& a = std::get<driver::ResizeAttrs>(op.attrs);
  k::ResizeParams p{};
  p.x = tensor_of(op.tensors[0]);
  p.y = tensor_of(op.tensors[1]);
  p.mode = static_cast<std::uint32_t>(a.mode);
  p.coordinate = static_cast<std::uint32_t>(a.coordinate);
  p.nearest = static_cast<std::uint32_t>(a.nearest);
  p.nhwc = a.layout == Layout::NHWC ? 1 : 0;
  p.scale[0] = a.scales[0];
  p.scale[1] = a.scales[1];
  p.n = k::numel(p.y);
  return kernels.launch(stream, "resize", p);
}

// Luma, ChromaU (NV12: both chroma planes), ChromaV (I420 only), Y.
CUresult run_color(const Kernels& kernels, CUstream stream, const OpDesc& op) {
  const auto& a = std::get<driver::ColorConvertAttrs>(op.attrs);
  k::ColorParams p{};
  tensors_of(op, {&p.luma, &p.c1, &p.c2, &p.y});
  p.nv12 = a.format == ColorFormat::NV12 ? 1 : 0;
  for (std::size_t c = 0; c < 3; ++c) {
    p.mean[c] = a.mean[c];
    p.scale[c] = a.scale[c];
  }
  p.n = p.luma.shape[0] * p.luma.shape[1];
  return kernels.launch(stream, "color_convert", p);
}

}  // namespace

std::string refuse_quantized(const OpDesc& op) {
  switch (op.kind) {
    case OpKind::Quantize:
    case OpKind::Dequantize:
    case OpKind::QLinearAdd:
    case OpKind::QLinearMul:
    case OpKind::QLinearGlobalAvgPool:
    case OpKind::Softmax:
    case OpKind::Resize:
    case OpKind::ColorConvert: return {};
    default: return op.name + " (not a kind of the quantized family)";
  }
}

CUresult run_quantized(const Kernels& kernels, CUstream stream, const OpDesc& op, const k::Fault&) {
  switch (op.kind) {
    case OpKind::Quantize:
    case OpKind::Dequantize: return run_quantize(kernels, stream, op);
    case OpKind::QLinearAdd:
    case OpKind::QLinearMul: return run_qlinear_binary(kernels, stream, op);
    case OpKind::QLinearGlobalAvgPool: return run_qlinear_gap(kernels, stream, op);
    case OpKind::Softmax: return run_softmax(kernels, stream, op);
    case OpKind::Resize: return run_resize(kernels, stream, op);
    case OpKind::ColorConvert: return run_color(kernels, stream, op);
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
}

}  // namespace tpuhal::cuda
