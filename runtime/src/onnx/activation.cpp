// Relu, Clip, Sigmoid, Tanh, LeakyRelu, HardSigmoid, HardSwish: the
// activation op (or fused into the Conv, Gemm or MatMul before them,
// passes.hpp). Softmax, LogSoftmax: softmax (its log flag for LogSoftmax).
// PRelu, Elu, Selu, Celu, ThresholdedRelu, Softplus, Softsign, Shrink:
// compositions of the elementwise maps.
#include <cfloat>

#include <algorithm>
#include <cmath>

#include "onnx/importer.hpp"
#include "onnx/lowerer.hpp"

namespace tpuhal::rt::detail {
namespace {

struct ActivationAttrs {
  float alpha = 0, beta = 0;            // LeakyRelu, HardSigmoid
  float min = -FLT_MAX, max = FLT_MAX;  // Clip before opset 11
  static ActivationAttrs read(const Attrs& a) {
    const bool leaky = a.node.op_type() == "LeakyRelu";
    return {a.f("alpha", leaky ? 0.01f : 0.2f), a.f("beta", 0.5f), a.f("min", -FLT_MAX), a.f("max", FLT_MAX)};
  }
};

// Clip's bounds: constant inputs from opset 11, attributes before.
ActivationParams clip(const Graph& g, const Node& n) {
  const auto& a = n.attr<ActivationAttrs>();
  float lo = -FLT_MAX, hi = FLT_MAX;
  if (g.opset >= 11) {
    if (n.inputs.size() > 1 && !n.inputs[1].empty()) lo = (*g.value(n.inputs[1]).data).at(0);
    if (n.inputs.size() > 2 && !n.inputs[2].empty()) hi = (*g.value(n.inputs[2]).data).at(0);
  } else {
    lo = a.min;
    hi = a.max;
  }
  return ActivationParams::clip(lo, hi);
}

ActivationParams relu(const Graph&, const Node&) { return ActivationParams::relu(); }
ActivationParams sigmoid(const Graph&, const Node&) { return ActivationParams::sigmoid(); }
ActivationParams tanh(const Graph&, const Node&) { return ActivationParams::tanh(); }
ActivationParams hard_swish(const Graph&, const Node&) { return ActivationParams::hard_swish(); }
ActivationParams hard_sigmoid(const Graph&, const Node& n) {
  const auto& a = n.attr<ActivationAttrs>();
  return ActivationParams::hard_sigmoid(a.alpha, a.beta);
}
ActivationParams leaky_relu(const Graph&, const Node& n) {
  return ActivationParams::leaky_relu(n.attr<ActivationAttrs>().alpha);
}

Value infer_same_shape(Importer& im, Node& n) {
  Value out;
  out.shape = im.in(n, 0).shape;
  return out;
}

Value infer_clip(Importer& im, Node& n) {
  Value out;
  out.shape = im.in(n, 0).shape;
  if (im.g.opset >= 11) {
    if (im.has(n, 1)) im.constant(n, 1, "bounds");
    if (im.has(n, 2)) im.constant(n, 2, "bounds");
  }
  return out;
}

// Clip of a constant: integers stay integers (bounds rounded toward the
// range), floats clamped as f32.
Value fold_clip(Importer& im, Node& n) {
  const Value& x = im.in(n, 0);
  const ActivationParams p = clip(im.g, n);
  const bool integer = is_integer(x);
  auto v = values_of(x);
  for (auto& e : v)
    e = std::min<double>(std::max<double>(e, integer ? std::ceil(p.alpha) : p.alpha),
                         integer ? std::floor(p.beta) : p.beta);
  return make_constant(x.shape, v, integer);
}

// In the activation type; in an int8 model a table lookup over bytes held
// NHWC (Lowerer::qtable), else f32 (NHWC between NHWC values).
void lower_as(Lowerer& l, const Node& n, const ActivationParams& p) {
  if (l.qtable(n, p)) return;
  if (l.nhwc_island(n, {n.inputs[0]})) {
    const auto x = l.get_nhwc_float(n.inputs[0]);
    l.op("activation", n.name, {{"x", x}, {"y", l.produce_nhwc_float(n.output, l.shape_of(n.output))}},
         {{"activation", act_json(p)}});
    return;
  }
  const DType t = l.float_type();
  const auto x = l.get(n.inputs[0], t);
  l.op("activation", n.name, {{"x", x}, {"y", l.produce(n.output, t, l.shape_of(n.output))}},
       {{"activation", act_json(p)}});
}
void lower_activation(Lowerer& l, const Node& n) { lower_as(l, n, n.handler->activation(l.g, n)); }
void lower_leaky_relu(Lowerer& l, const Node& n) { lower_as(l, n, leaky_relu(l.g, n)); }

struct CompositeAttrs {
  float alpha = 1, gamma = 0, lambd = 0, bias = 0;
  static CompositeAttrs read(const Attrs& a) {
    const std::string& op = a.node.op_type();
    return {a.f("alpha", op == "Selu" ? 1.67326319217681884765625f : 1.0f), a.f("gamma", 1.05070102214813232421875f),
            a.f("lambd", 0.5f), a.f("bias", 0.0f)};
  }
};

// PRelu's slope broadcasts to x (ONNX: one way, x keeps its shape).
Value infer_prelu(Importer& im, Node& n) {
  Value out;
  out.shape = im.in(n, 0).shape;
  if (im.broadcast(n, out.shape, im.in(n, 1).shape) != out.shape)
    im.fail_node(n, "its slope " + dims_text(im.in(n, 1).shape) + " does not broadcast to x " + dims_text(out.shape));
  return out;
}

// Each composition in the model's float type, its intermediates in the
// arena; the last map writes the output.
struct Composer {
  Lowerer& l;
  const Node& n;
  DType t;
  std::vector<std::int64_t> shape;

  std::int64_t fresh(DType d) { return l.dg().add_arena("", d, shape); }
  std::int64_t scalar(float v) { return l.add_weight({v}, t, {}); }
  std::int64_t unary(const char* kind, std::int64_t x, bool last = false) {
    const auto y = last ? output() : fresh(t);
    l.op(kind, n.name, {{"x", x}, {"y", y}});
    return y;
  }
  std::int64_t binary(const char* kind, std::int64_t a, std::int64_t b, bool last = false) {
    const bool compare = std::string_view(kind) == "greater" || std::string_view(kind) == "less";
    const auto y = last ? output() : fresh(compare ? DType::U8 : t);
    l.op(kind, n.name, {{"a", a}, {"b", b}, {"y", y}});
    return y;
  }
  std::int64_t where(std::int64_t cond, std::int64_t a, std::int64_t b, bool last = false) {
    const auto y = last ? output() : fresh(t);
    l.op("where", n.name, {{"cond", cond}, {"a", a}, {"b", b}, {"y", y}});
    return y;
  }
  std::int64_t output() { return l.produce(n.output, t, shape); }
};

// alpha * (exp(x) - 1) where x <= 0, else x (inf - 1 where x is large: not taken).
std::int64_t elu(Composer& c, std::int64_t x, float alpha, bool last) {
  const auto e = c.binary("sub", c.unary("exp", x), c.scalar(1));
  return c.where(c.binary("greater", x, c.scalar(0)), x, c.binary("mul", e, c.scalar(alpha)), last);
}

void lower_composite(Lowerer& l, const Node& n) {
  const auto& a = n.attr<CompositeAttrs>();
  const DType t = l.float_type();
  Composer c{l, n, t, l.shape_of(n.output)};
  const auto x = l.get(n.inputs[0], t);
  const std::string& op = n.op;
  if (op == "PRelu") {
    c.where(c.binary("less", x, c.scalar(0)), c.binary("mul", x, l.get(n.inputs[1], t)), x, true);
  } else if (op == "Elu") {
    elu(c, x, a.alpha, true);
  } else if (op == "Selu") {
    c.binary("mul", elu(c, x, a.alpha, false), c.scalar(a.gamma), true);
  } else if (op == "Celu") {  // max(0, x) + min(0, alpha * (exp(x / alpha) - 1))
    const auto e = c.binary("sub", c.unary("exp", c.binary("div", x, c.scalar(a.alpha))), c.scalar(1));
    const auto neg = c.binary("min", c.binary("mul", e, c.scalar(a.alpha)), c.scalar(0));
    c.binary("add", c.binary("max", x, c.scalar(0)), neg, true);
  } else if (op == "ThresholdedRelu") {
    c.where(c.binary("greater", x, c.scalar(a.alpha)), x, c.scalar(0), true);
  } else if (op == "Softplus") {  // max(x, 0) + log(1 + exp(-|x|)): no exp overflows
    const auto e = c.unary("exp", c.unary("neg", c.unary("abs", x)));
    c.binary("add", c.binary("max", x, c.scalar(0)), c.unary("log", c.binary("add", e, c.scalar(1))), true);
  } else if (op == "Softsign") {
    c.binary("div", x, c.binary("add", c.unary("abs", x), c.scalar(1)), true);
  } else {  // Shrink: x + bias below -lambd, x - bias above lambd, else 0
    const auto above =
        c.where(c.binary("greater", x, c.scalar(a.lambd)), c.binary("sub", x, c.scalar(a.bias)), c.scalar(0));
    c.where(c.binary("less", x, c.scalar(-a.lambd)), c.binary("add", x, c.scalar(a.bias)), above, true);
  }
}

struct SoftmaxAttrs {
  std::optional<std::int64_t> axis;
  static SoftmaxAttrs read(const Attrs& a) { return {a.opt_i("axis")}; }
};

// Softmax and LogSoftmax (the model file's `log_softmax`: the same op with
// its log flag; a reader that predates it refuses the kind rather than
// computing a softmax).
void lower_softmax(Lowerer& l, const Node& n) {
  const char* kind = n.op == "LogSoftmax" ? "log_softmax" : "softmax";
  const DType t = l.float_type();
  const auto& shape = l.shape_of(n.output);
  const auto x = l.get(n.inputs[0], t);
  const auto y = l.produce(n.output, t, shape);
  const auto rank = static_cast<std::int64_t>(shape.size());
  const int opset = l.g.opset;
  std::int64_t axis = n.attr<SoftmaxAttrs>().axis.value_or(opset >= 13 ? -1 : 1);
  if (axis < 0) axis += rank;
  if (opset >= 13 || axis == rank - 1) {
    l.op(kind, n.name, {{"x", x}, {"y", y}}, {{"axis", axis}});
  } else {  // before opset 13: over the flattened dimensions from `axis` on
    std::int64_t outer = 1, inner = 1;
    for (std::int64_t i = 0; i < rank; ++i) (i < axis ? outer : inner) *= shape[static_cast<std::size_t>(i)];
    l.op(kind, n.name, {{"x", l.dg().add_view(x, {outer, inner})}, {"y", l.dg().add_view(y, {outer, inner})}},
         {{"axis", 1}});
  }
}

// Softmax and LogSoftmax of a constant: each row's maximum, exponentials
// and sum in double, each result rounded to f32 once.
Value fold_softmax(Importer& im, Node& n) {
  const Value& x = im.in(n, 0);
  const auto rank = static_cast<std::int64_t>(x.shape.size());
  std::int64_t axis = n.attr<SoftmaxAttrs>().axis.value_or(im.g.opset >= 13 ? -1 : 1);
  axis = im.axis_of(n, axis, rank);
  std::int64_t outer = 1, len = 1, inner = 1;  // before opset 13: the dimensions from axis on, flattened
  for (std::int64_t i = 0; i < rank; ++i) {
    const std::int64_t d = x.shape[static_cast<std::size_t>(i)];
    if (i < axis)
      outer *= d;
    else if (i == axis || im.g.opset < 13)
      len *= d;
    else
      inner *= d;
  }
  std::vector<double> y(x.elements());
  const bool log = n.op == "LogSoftmax";
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) {
      const auto at = [&](std::int64_t j) { return static_cast<std::size_t>((o * len + j) * inner + i); };
      double most = -HUGE_VAL, sum = 0;
      for (std::int64_t j = 0; j < len; ++j) most = std::max(most, value_at(x, at(j)));
      for (std::int64_t j = 0; j < len; ++j) sum += std::exp(value_at(x, at(j)) - most);
      for (std::int64_t j = 0; j < len; ++j)
        y[at(j)] = log ? value_at(x, at(j)) - most - std::log(sum) : std::exp(value_at(x, at(j)) - most) / sum;
    }
  return make_constant(x.shape, y, false);
}

// Relu of a constant.
Value fold_relu(Importer& im, Node& n) {
  const Value& x = im.in(n, 0);
  auto v = values_of(x);
  for (auto& e : v) e = e > 0 ? e : 0.0;
  return make_constant(x.shape, v, is_integer(x));
}

// An activation op's handler: fused as `fuse` says.
OpHandler activation_op(std::string_view op, ActivationParams (*params)(const Graph&, const Node&), Fuse fuse) {
  return {.ops = {op},
          .read = read_attrs<ActivationAttrs>,
          .infer = infer_same_shape,
          .lower = lower_activation,
          .writes_fresh = true,
          .activation = params,
          .fuse = fuse};
}

}  // namespace

std::span<const OpHandler> activation_handlers() {
  static const OpHandler h[] = {
      [] {
        OpHandler r = activation_op("Relu", relu, Fuse::Always);
        r.fold = fold_relu;
        r.folds = Fold::IfConstant;
        return r;
      }(),
      activation_op("Sigmoid", sigmoid, Fuse::FloatOnly),
      activation_op("Tanh", tanh, Fuse::FloatOnly),
      activation_op("HardSigmoid", hard_sigmoid, Fuse::FloatOnly),
      activation_op("HardSwish", hard_swish, Fuse::FloatOnly),
      // LeakyRelu does not fuse.
      {.ops = {"LeakyRelu"},
       .read = read_attrs<ActivationAttrs>,
       .infer = infer_same_shape,
       .lower = lower_leaky_relu,
       .writes_fresh = true},
      {.ops = {"Clip"},
       .read = read_attrs<ActivationAttrs>,
       .infer = infer_clip,
       .fold = fold_clip,
       .folds = Fold::IfConstant,
       .lower = lower_activation,
       .writes_fresh = true,
       .activation = clip,
       .fuse = Fuse::Always},
      {.ops = {"PRelu"},
       .read = read_attrs<CompositeAttrs>,
       .infer = infer_prelu,
       .lower = lower_composite,
       .writes_fresh = true},
      {.ops = {"Elu", "Selu", "Celu", "ThresholdedRelu", "Softplus", "Softsign", "Shrink"},
       .read = read_attrs<CompositeAttrs>,
       .infer = infer_same_shape,
       .lower = lower_composite,
       .writes_fresh = true},
      {.ops = {"Softmax", "LogSoftmax"},
       .read = read_attrs<SoftmaxAttrs>,
       .infer = infer_same_shape,
       .fold = fold_softmax,
       .folds = Fold::IfConstant,
       .lower = lower_softmax,
       .writes_fresh = true},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
