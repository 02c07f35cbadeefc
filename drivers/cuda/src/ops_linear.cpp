// Launchers of the linear family (ops.h): matmul, conv2d, conv_transpose2d,
// pool2d and the integer products, each one kernel over its output's
// elements (kernels/linear.h).
#include "ops.h"

#include "../kernels/linear.h"

namespace tpuhal::cuda {

namespace {

using driver::OpKind;

k::Act act_of(const ActivationParams& a) { return {static_cast<std::uint32_t>(a.kind), a.alpha, a.beta}; }

k::lin::ConvGeom geom_of(const driver::ConvAttrs& a) {
  k::lin::ConvGeom g{};
  g.nhwc = a.layout == Layout::NHWC;
  g.groups = a.groups;
  for (int d = 0; d < 2; ++d) {
    g.stride[d] = a.strides[d];
    g.dil[d] = a.dilations[d];
    g.pad[d] = a.pads[d];
  }
  return g;
}

CUresult matmul(const Kernels& kernels, CUstream stream, const driver::OpDesc& op) {
  const auto& at = std::get<driver::MatMulAttrs>(op.attrs);
  k::lin::MatMulParams p{};
  tensors_of(op, {&p.a, &p.b, &p.c, &p.y});
  const std::uint32_t r = p.y.rank;
  // a's view is [..., M, K] ([..., K, M] transposed), b's [..., K, N] ([..., N, K]).
  p.a_row = p.a.strides[at.transpose_a ? r - 1 : r - 2];
  p.a_k = p.a.strides[at.transpose_a ? r - 2 : r - 1];
  p.b_k = p.b.strides[at.transpose_b ? r - 1 : r - 2];
  p.b_col = p.b.strides[at.transpose_b ? r - 2 : r - 1];
  p.k = p.a.shape[at.transpose_a ? r - 2 : r - 1];
  p.alpha = at.alpha;
  p.beta = at.beta;
  p.act = act_of(at.activation);
  p.plain = at.alpha == 1.0f && !p.c.addr && at.activation.kind == Activation::None;
  p.n = k::numel(p.y);
  return kernels.launch(stream, "linear_matmul", p);
}

// matmul_integer: A, B, AZp, BZp, Y; qlinear_matmul: A, AScale, AZp, B,
// BScale, BZp, YScale, YZp, Y.
CUresult int_matmul(const Kernels& kernels, CUstream stream, const driver::OpDesc& op) {
  k::lin::IntMatMulParams p{};
  if (op.kind == OpKind::MatMulInteger)
    tensors_of(op, {&p.a, &p.b, &p.az, &p.bz, &p.y});
  else
    tensors_of(op, {&p.a, &p.as, &p.az, &p.b, &p.bs, &p.bz, &p.ys, &p.yz, &p.y});
  p.k = p.a.shape[p.a.rank - 1];
  p.n = k::numel(p.y);
  return kernels.launch(stream, "linear_int_matmul", p);
}

CUresult conv(const Kernels& kernels, CUstream stream, const driver::OpDesc& op) {
  const auto& at = std::get<driver::ConvAttrs>(op.attrs);
  if (op.kind == OpKind::ConvTranspose2d) {
    k::lin::ConvTransposeParams p{};
    tensors_of(op, {&p.x, &p.w, &p.bias, &p.y});
    p.g = geom_of(at);
    p.act = act_of(at.activation);
    p.n = k::numel(p.y);
    return kernels.launch(stream, "linear_conv_transpose", p);
  }
  k::lin::ConvParams p{};
  tensors_of(op, {&p.x, &p.w, &p.bias, &p.y});
  p.g = geom_of(at);
  p.act = act_of(at.activation);
  p.accumulate = at.accumulate ? 1u : 0u;
  p.n = k::numel(p.y);
  return kernels.launch(stream, "linear_conv", p);
}

// conv_integer: X, W, XZp, WZp, Y; qlinear_conv: X, XScale, XZp, W,
// WScale, WZp, YScale, YZp, Bias, Y.
CUresult int_conv(const Kernels& kernels, CUstream stream, const driver::OpDesc& op) {
  k::lin::IntConvParams p{};
  if (op.kind == OpKind::ConvInteger)
    tensors_of(op, {&p.x, &p.w, &p.xz, &p.wz, &p.y});
  else
    tensors_of(op, {&p.x, &p.xs, &p.xz, &p.w, &p.ws, &p.wz, &p.ys, &p.yz, &p.bias, &p.y});
  p.g = geom_of(std::get<driver::ConvAttrs>(op.attrs));
  p.n = k::numel(p.y);
  return kernels.launch(stream, "linear_int_conv", p);
}

CUresult pool(const Kernels& kernels, CUstream stream, const driver::OpDesc& op) {
  const auto& at = std::get<driver::PoolAttrs>(op.attrs);
  k::lin::PoolParams p{};
  p.x = tensor_of(op.tensors[0]);
  p.y = tensor_of(op.tensors[1]);
  p.nhwc = at.layout == Layout::NHWC;
  p.max = at.max;
  p.include_pad = at.count_include_pad;
  for (int d = 0; d < 2; ++d) {
    p.kernel[d] = at.kernel[d];
    p.stride[d] = at.strides[d];
    p.dil[d] = at.dilations[d];
  }
  for (int d = 0; d < 4; ++d) p.pad[d] = at.pads[d];
  p.n = k::numel(p.y);
  return kernels.launch(stream, "linear_pool", p);
}

}  // namespace

// Every dtype the HAL accepts for these kinds runs: the kernels load and
// store each through kernel.h's converters.
std::string refuse_linear(const driver::OpDesc& op) {
  switch (op.kind) {
    case OpKind::MatMul:
    case OpKind::Conv2d:
    case OpKind::ConvTranspose2d:
    case OpKind::Pool2d:
    case OpKind::MatMulInteger:
    case OpKind::ConvInteger:
    case OpKind::QLinearMatMul:
    case OpKind::QLinearConv: return {};
    default: return op.name + " (not a kind of the linear family)";
  }
}

CUresult run_linear(const Kernels& kernels, CUstream stream, const driver::OpDesc& op, const k::Fault&) {
  switch (op.kind) {
    case OpKind::MatMul: return matmul(kernels, stream, op);
    case OpKind::Conv2d:
    case OpKind::ConvTranspose2d: return conv(kernels, stream, op);
    case OpKind::Pool2d: return pool(kernels, stream, op);
    case OpKind::MatMulInteger:
    case OpKind::QLinearMatMul: return int_matmul(kernels, stream, op);
    case OpKind::ConvInteger:
    case OpKind::QLinearConv: return int_conv(kernels, stream, op);
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
}

}  // namespace tpuhal::cuda
