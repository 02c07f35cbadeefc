#include "op_cost.hpp"

#include <algorithm>
#include <cstddef>

namespace tpuhal::detail {
namespace {

double elements(const driver::TensorArg& t) {
  double n = 1;
  for (std::uint32_t i = 0; i < t.rank; ++i) n *= static_cast<double>(t.shape[i]);
  return n;
}
double outputs(const driver::OpDesc& op) { return elements(op.tensors.back()); }

// The cost classes of schema/ops.py; the generated kind_flops() below picks
// one per kind and names its operands by index.

// 2 * outputs * A's inner dimension (the one the product sums over).
double matmul_flops(const driver::OpDesc& op, std::size_t a_index) {
  const driver::TensorArg& a = op.tensors[a_index];
  const auto* attrs = std::get_if<driver::MatMulAttrs>(&op.attrs);
  const bool transposed = attrs && attrs->transpose_a;
  const double inner = a.rank >= 2 ? static_cast<double>(a.shape[a.rank - (transposed ? 2 : 1)]) : 1.0;
  return 2.0 * outputs(op) * inner;
}
// W's taps per output: Cin/groups * kh * kw.
double window(const driver::TensorArg& w) {
  return w.rank == 4 ? static_cast<double>(w.shape[1] * w.shape[2] * w.shape[3]) : 0.0;
}
double conv_flops(const driver::OpDesc& op, std::size_t w_index) {
  return 2.0 * outputs(op) * window(op.tensors[w_index]);
}
// A transposed convolution scatters each input element through its window.
double conv_transpose_flops(const driver::OpDesc& op, std::size_t x_index, std::size_t w_index) {
  return 2.0 * elements(op.tensors[x_index]) * window(op.tensors[w_index]);
}
double pool_flops(const driver::OpDesc& op) {
  const auto& a = std::get<driver::PoolAttrs>(op.attrs);
  return outputs(op) * a.kernel[0] * a.kernel[1];
}
double per_output_flops(const driver::OpDesc& op) { return outputs(op); }
// One per element of the tensor the kind scans (nms: its scores), or of the
// output where that has more.
double scan_flops(const driver::OpDesc& op, std::size_t t_index) {
  return std::max(elements(op.tensors[t_index]), outputs(op));
}

#include "op_cost.inc"

}  // namespace

OpCost op_cost(const driver::OpDesc& op) {
  OpCost c;
  if (op.tensors.empty()) return c;
  c.flops = kind_flops(op);
  c.peak = kind_peak(op.kind);
  c.precision = op.tensors.front().dtype;
  for (const auto& t : op.tensors)
    if (t.present()) c.bytes += elements(t) * size_of(t.dtype);
  // A convolution accumulating into y reads it too.
  const auto* conv = std::get_if<driver::ConvAttrs>(&op.attrs);
  if (conv && conv->accumulate) c.bytes += elements(op.tensors.back()) * size_of(op.tensors.back().dtype);
  return c;
}

}  // namespace tpuhal::detail
