// BatchNormalization: folded into the Conv before it, or a depthwise 1x1
// Conv (passes.hpp); on a value of another rank a per-channel mul and add.
// LayerNormalization (opset 17) and InstanceNormalization: the ops PyTorch
// writes for LayerNorm at opset 13.
#include <cmath>

#include "onnx/attrs.hpp"
#include "onnx/importer.hpp"
#include "onnx/lowerer.hpp"

namespace tpuhal::rt::detail {
namespace {

Value infer_batch_norm(Importer& im, Node& n) {
  Value out;
  out.shape = im.in(n, 0).shape;
  for (std::size_t i = 1; i < 5; ++i) im.constant(n, i, "scale, bias, mean and variance");
  if (out.shape.size() < 2) im.fail_node(n, "input of rank " + std::to_string(out.shape.size()));
  return out;
}

// Not after a Conv: y = x * s + (beta - mean * s), per channel.
void lower_batch_norm(Lowerer& l, const Node& n) {
  const DType t = l.float_type();
  const auto& shape = l.shape_of(n.output);
  const auto c = static_cast<std::size_t>(shape[1]);
  const auto& gamma = *l.g.value(n.inputs[1]).data;
  const auto& beta = *l.g.value(n.inputs[2]).data;
  const auto& mean = *l.g.value(n.inputs[3]).data;
  const auto& var = *l.g.value(n.inputs[4]).data;
  if (gamma.size() != c || beta.size() != c || mean.size() != c || var.size() != c)
    throw Error(Status::InvalidArgument,
                "node '" + n.name + "' (BatchNormalization): parameters are not one per channel");
  const float eps = n.attr<BatchNormAttrs>().epsilon;
  std::vector<float> s(c), b(c);
  for (std::size_t i = 0; i < c; ++i) {
    s[i] = static_cast<float>(gamma[i] / std::sqrt(static_cast<double>(var[i]) + eps));
    b[i] = beta[i] - mean[i] * s[i];
  }
  std::vector<std::int64_t> pshape(shape.size() - 1, 1);
  pshape[0] = static_cast<std::int64_t>(c);
  const auto x = l.get(n.inputs[0], t);
  const auto tmp = l.dg().add_arena("", t, shape);
  l.op("mul", n.name, {{"a", x}, {"b", l.add_weight(s, t, pshape)}, {"y", tmp}});
  l.op("add", n.name, {{"a", tmp}, {"b", l.add_weight(b, t, pshape)}, {"y", l.produce(n.output, t, shape)}});
}

struct NormAttrs {
  std::int64_t axis = -1;  // LayerNormalization
  float epsilon = 1e-5f;
  static NormAttrs read(const Attrs& a) { return {a.i("axis", -1), a.f("epsilon", 1e-5f)}; }
};

// Scale or bias (input `i`): over the normalised dims (LayerNormalization),
// or one per channel, shaped [C, 1, ...] to broadcast (InstanceNormalization).
std::string norm_param(Importer& im, const Node& n, std::size_t i, const char* what, bool layer) {
  const Value& x = im.in(n, 0);
  const Value& v = im.constant(n, i, what);
  if (layer) {
    im.broadcast(n, x.shape, v.shape);
    return n.inputs[i];
  }
  if (v.elements() != static_cast<std::uint64_t>(x.shape[1]))
    im.fail_node(n, std::string("its ") + what + " has " + std::to_string(v.elements()) + " values for " +
                        std::to_string(x.shape[1]) + " channels");
  std::vector<std::int64_t> shape(x.shape.size() - 1, 1);
  shape[0] = x.shape[1];
  return im.add_constant(n.name + "/" + what, shape, values_of(v), false);
}

// A ReduceMean of `from` over `axes` into `to`: the axes an attribute, or
// from opset 18 an input.
void reduce_mean(Importer& im, const Node& n, const std::vector<double>& axes, const std::string& suffix,
                 const std::string& from, const std::string& to) {
  onnx::NodeProto p;
  Node r = im.derived(n, suffix, "ReduceMean", {from}, to, p);
  if (im.g.opset >= 18) {
    std::vector<double> ax = axes;
    r.inputs.push_back(im.add_constant(n.name + "/axes", {static_cast<std::int64_t>(ax.size())}, ax, true));
  } else {
    auto* at = p.add_attribute();
    at->set_name("axes");
    at->set_type(onnx::AttributeProto::INTS);
    for (double d : axes) at->add_ints(static_cast<std::int64_t>(d));
  }
  im.emit(std::move(r), p);
}

// The mean and the variance over the normalised axes (ReduceMean), then
// (x - mean) / sqrt(var + eps) * scale + bias.
void expand_normalization(Importer& im, Node& n, const onnx::NodeProto&) {
  const auto& a = n.attr<NormAttrs>();
  const Value& x = im.in(n, 0);
  const auto rank = static_cast<std::int64_t>(x.shape.size());
  const bool layer = n.op == "LayerNormalization";
  std::int64_t first = 2;
  if (layer) {
    first = im.axis_of(n, a.axis, rank);
  } else if (rank < 3) {
    im.fail_node(n, "input of rank " + std::to_string(rank));
  }
  std::vector<double> axes;
  for (std::int64_t d = first; d < rank; ++d) axes.push_back(static_cast<double>(d));
  const std::string scale = norm_param(im, n, 1, "scale", layer);
  const std::string bias = im.has(n, 2) ? norm_param(im, n, 2, "bias", layer) : std::string();
  const std::string p = n.name + "/";
  reduce_mean(im, n, axes, "mean", n.inputs[0], p + "mean");
  im.emit_derived(n, "centre", "Sub", {n.inputs[0], p + "mean"}, p + "centred");
  im.emit_derived(n, "square", "Mul", {p + "centred", p + "centred"}, p + "squares");
  reduce_mean(im, n, axes, "variance", p + "squares", p + "variance");
  const std::string e = im.add_constant(p + "epsilon", {}, {static_cast<double>(a.epsilon)}, false);
  im.emit_derived(n, "add_epsilon", "Add", {p + "variance", e}, p + "variance+eps");
  im.emit_derived(n, "deviation", "Sqrt", {p + "variance+eps"}, p + "deviation");
  im.emit_derived(n, "normalise", "Div", {p + "centred", p + "deviation"}, p + "normalised");
  im.emit_derived(n, "scale", "Mul", {p + "normalised", scale}, bias.empty() ? n.output : p + "scaled");
  if (!bias.empty()) im.emit_derived(n, "bias", "Add", {p + "scaled", bias}, n.output);
  im.g.notes.push_back(n.op + " '" + n.name + "' runs as ReduceMean, Sub, Mul, Sqrt, Div, Mul" +
                       (bias.empty() ? "" : ", Add"));
}

}  // namespace

std::span<const OpHandler> normalization_handlers() {
  static const OpHandler h[] = {
      {.ops = {"BatchNormalization"},
       .read = read_attrs<BatchNormAttrs>,
       .infer = infer_batch_norm,
       .lower = lower_batch_norm},
      {.ops = {"LayerNormalization", "InstanceNormalization"},
       .read = read_attrs<NormAttrs>,
       .expand = expand_normalization},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
