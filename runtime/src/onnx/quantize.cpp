// QuantizeLinear and DequantizeLinear: explicit (Q/DQ) quantization, as
// quantization-aware training exports it. A DequantizeLinear of a constant
// folds to float weights that remember their integers and scales
// (QuantizedConstant); a QuantizeLinear followed by a DequantizeLinear
// becomes one node, the pair, that runs as the device's quantize and
// dequantize in a float model. In int8 the pair gives the value it
// quantizes its u8 parameters (qdq_params), so that the layers around it
// run in int8 with the model's own scales, and it then costs nothing where
// its input is already held in them (docs/runtime.md, "Q/DQ models").
#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include "onnx/importer.hpp"
#include "onnx/lowerer.hpp"
#include "onnx/passes.hpp"

namespace tpuhal::rt::detail {
namespace {

// A quantization's parameters, read from a node's constant inputs: one
// scale and zero point (per tensor) or one per slice along `axis`.
struct QuantParams {
  std::vector<float> scales;
  std::vector<std::int32_t> zeros;
  bool is_signed = false;  // int8; uint8 otherwise
  std::int64_t axis = -1;  // -1: per tensor
  std::int32_t lo() const { return is_signed ? -128 : 0; }
  std::int32_t hi() const { return is_signed ? 127 : 255; }
  bool operator==(const QuantParams&) const = default;
};

struct QuantAttrs {
  std::int64_t axis = 1;
  std::vector<std::string> present;
  QuantParams params;  // resolved by the shape rule
  static QuantAttrs read(const Attrs& a) { return {a.i("axis", 1), a.names(), {}}; }
};

// A Q/DQ pair: the QuantizeLinear's parameters and the DequantizeLinear's.
struct PairAttrs {
  QuantParams q, dq;
  std::string quantize;  // the QuantizeLinear's name
};

// Input 1 (scale) and 2 (zero point) of a QuantizeLinear or
// DequantizeLinear whose input 0 has `shape`.
QuantParams read_params(Importer& im, Node& n, const std::vector<std::int64_t>& shape, bool dequantize) {
  const auto& a = n.attr<QuantAttrs>();
  const auto unknown = Attrs::first_unknown(a.present, {"axis"});
  if (!unknown.empty()) im.unsupported(n, "attribute " + unknown + " (block or float8 quantization)");
  const Value& scale = im.constant(n, 1, "scale");
  QuantParams p;
  const std::uint64_t count = scale.elements();
  if (scale.shape.size() > 1 || count == 0)
    im.fail_node(n, "its scale has shape " + dims_text(scale.shape) + "; it must be a scalar or 1-D");
  if (count > 1 || scale.shape.size() == 1) {
    const auto axis = im.axis_of(n, a.axis, static_cast<std::int64_t>(shape.size()));
    if (count > 1 || shape.empty() || shape[static_cast<std::size_t>(axis)] == 1) p.axis = axis;
    if (count > 1 && static_cast<std::int64_t>(count) != shape[static_cast<std::size_t>(axis)])
      im.fail_node(n, "its " + std::to_string(count) + " scales are not one per slice of axis " + std::to_string(axis) +
                          " of " + dims_text(shape));
  }
  if (count == 1 && p.axis >= 0 && shape[static_cast<std::size_t>(p.axis)] == 1) p.axis = -1;
  p.scales = *scale.data;
  for (float s : p.scales)
    if (!(s > 0) || !std::isfinite(s)) im.fail_node(n, "its scale " + std::to_string(s) + " is not positive");
  int type = onnx::TensorProto::UINT8;
  if (im.has(n, 2)) {
    const Value& zero = im.constant(n, 2, "zero point");
    if (zero.elements() != count)
      im.fail_node(n, "its zero point has " + std::to_string(zero.elements()) + " values for " + std::to_string(count) +
                          " scales");
    type = zero.int8_type;
    for (auto z : zero.ints) p.zeros.push_back(static_cast<std::int32_t>(z));
  } else {
    p.zeros.assign(count, 0);
    if (dequantize) type = im.in(n, 0).int8_type;
  }
  if (type != onnx::TensorProto::INT8 && type != onnx::TensorProto::UINT8)
    im.unsupported(n, "quantization to ONNX element type " + std::to_string(type) +
                          "; the compiler takes int8 and uint8 (as QuantizeLinear's zero point gives it)");
  p.is_signed = type == onnx::TensorProto::INT8;
  return p;
}

// Which scale and zero point element `i` of a tensor of `shape` uses.
std::size_t param_index(const QuantParams& p, const std::vector<std::int64_t>& shape, std::uint64_t i) {
  if (p.axis < 0) return 0;
  std::uint64_t inner = 1;
  for (std::size_t d = static_cast<std::size_t>(p.axis) + 1; d < shape.size(); ++d)
    inner *= static_cast<std::uint64_t>(shape[d]);
  return static_cast<std::size_t>(i / inner % static_cast<std::uint64_t>(shape[static_cast<std::size_t>(p.axis)]));
}

// saturate(round_half_even(x / scale) + zero point) of constant x, as the
// device's quantize computes it.
Value fold_quantize(const Value& x, const QuantParams& p) {
  Value out;
  out.shape = x.shape;
  out.int8_type = p.is_signed ? onnx::TensorProto::INT8 : onnx::TensorProto::UINT8;
  out.data = std::vector<float>(x.elements());
  out.ints.resize(x.elements());
  for (std::uint64_t i = 0; i < x.elements(); ++i) {
    const std::size_t k = param_index(p, x.shape, i);
    const float r = std::nearbyint((*x.data)[i] / p.scales[k]) + static_cast<float>(p.zeros[k]);
    const auto q = static_cast<std::int32_t>(std::clamp(r, static_cast<float>(p.lo()), static_cast<float>(p.hi())));
    out.ints[i] = q;
    (*out.data)[i] = static_cast<float>(q);
  }
  return out;
}

// A QuantizeLinear of computed data, until a DequantizeLinear pairs with
// it: only its shape (finish_qdq removes it).
Value infer_quantized(Importer& im, Node& n) {
  Value v;
  v.shape = im.in(n, 0).shape;
  v.int8_type = n.attr<QuantAttrs>().params.is_signed ? onnx::TensorProto::INT8 : onnx::TensorProto::UINT8;
  return v;
}

const OpHandler& quantize_node_handler() {
  static const OpHandler h{.infer = infer_quantized};
  return h;
}

void expand_quantize(Importer& im, Node& n, const onnx::NodeProto&) {
  const Value& x = im.in(n, 0);
  n.attr<QuantAttrs>().params = read_params(im, n, x.shape, false);
  im.g.qdq = true;
  if (x.data) {
    im.check_folded(n, x.shape);
    im.g.values[n.output] = fold_quantize(x, n.attr<QuantAttrs>().params);
    im.g.notes.push_back("folded QuantizeLinear '" + n.name + "' of a constant");
    return;
  }
  n.handler = &quantize_node_handler();
  onnx::NodeProto none;
  im.emit(std::move(n), none);
}

// (x - zero point) * scale of constant 8-bit x: float weights that keep
// their integers (QuantizedConstant).
void fold_dequantize(Importer& im, Node& n, const Value& x) {
  const auto& p = n.attr<QuantAttrs>().params;
  if (x.int8_type == 0)
    im.unsupported(n, "its input '" + n.inputs[0] +
                          "' is a constant that is neither int8 nor uint8; the compiler dequantizes int8 and uint8");
  Value out;
  out.shape = x.shape;
  out.data = std::vector<float>(x.elements());
  auto qc = std::make_shared<QuantizedConstant>();
  qc->q.resize(x.elements());
  qc->scales = p.scales;
  qc->axis = p.axis < 0 ? 0 : p.axis;
  for (std::uint64_t i = 0; i < x.elements(); ++i) {
    const std::size_t k = param_index(p, x.shape, i);
    qc->q[i] = static_cast<std::int32_t>(x.ints[i]) - p.zeros[k];
    (*out.data)[i] = static_cast<float>(qc->q[i]) * p.scales[k];
  }
  out.quantized = std::move(qc);
  im.g.values[n.output] = std::move(out);
  im.g.notes.push_back("folded DequantizeLinear '" + n.name + "' of a constant (its integers kept for int8)");
}

Value infer_pair(Importer& im, Node& n) {
  Value v;
  v.shape = im.in(n, 0).shape;
  return v;
}
void lower_pair(Lowerer& l, const Node& n);

const OpHandler& pair_handler() {
  static const OpHandler h{.infer = infer_pair, .lower = lower_pair, .writes_fresh = true};
  return h;
}

// A constant input: the dequantized weights. A QuantizeLinear's output:
// the pair, one node reading what the QuantizeLinear quantizes.
void expand_dequantize(Importer& im, Node& n, const onnx::NodeProto&) {
  const Value& x = im.in(n, 0);
  n.attr<QuantAttrs>().params = read_params(im, n, x.shape, true);
  im.g.qdq = true;
  if (x.data) {
    fold_dequantize(im, n, x);
    return;
  }
  const Node* q = nullptr;
  for (const auto& m : im.g.nodes)
    if (m.output == n.inputs[0] && m.op == "QuantizeLinear") q = &m;
  if (!q)
    im.unsupported(n, "its input '" + n.inputs[0] +
                          "' is neither a constant nor a QuantizeLinear's output; the compiler takes "
                          "DequantizeLinear of weights and of a QuantizeLinear (a Q/DQ pair)");
  PairAttrs a{q->attr<QuantAttrs>().params, n.attr<QuantAttrs>().params, q->name};
  if (a.q.is_signed != a.dq.is_signed)
    im.fail_node(n, "it dequantizes " + std::string(a.dq.is_signed ? "int8" : "uint8") + " and QuantizeLinear '" +
                        q->name + "' makes " + (a.q.is_signed ? "int8" : "uint8"));
  Node pair = n;
  pair.handler = &pair_handler();
  pair.inputs = {q->inputs[0]};
  pair.fused = "QuantizeLinear '" + q->name + "'";
  pair.attrs = std::move(a);
  onnx::NodeProto none;
  im.emit(std::move(pair), none);
}

// The device's quantize and dequantize, per tensor or along the axis.
std::int64_t param_tensors(Lowerer& l, const QuantParams& p, std::int64_t& zero) {
  const auto k = static_cast<std::int64_t>(p.scales.size());
  const std::vector<std::int64_t> shape = p.axis < 0 ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{k};
  std::vector<std::int8_t> z(p.zeros.begin(), p.zeros.end());
  zero = l.add_raw(p.is_signed ? DType::I8 : DType::U8, shape, z.data(), z.size());
  return l.add_raw(DType::F32, shape, p.scales.data(), p.scales.size() * 4);
}

nlohmann::json axis_attr(const QuantParams& p) { return {{"axis", p.axis < 0 ? 0 : p.axis}}; }

void lower_pair(Lowerer& l, const Node& n) {
  const auto& a = n.attr<PairAttrs>();
  const auto& shape = l.shape_of(n.output);
  const std::string& x = n.inputs[0];
  if (l.int8() && l.fixed_q.count(n.output)) {
    const QParams q = l.fixed_q.at(n.output);
    auto it = l.reps.find(x);
    if (it != l.reps.end() && it->second.primary == DType::U8 && !it->second.boolean && it->second.q.scale == q.scale &&
        it->second.q.zero_point == q.zero_point) {
      l.reps[n.output] = it->second;  // already held in the pair's integers: the same tensors
      return;
    }
    // Quantized once, into the u8 form the int8 layers after it read.
    const bool nhwc = shape.size() == 4 && it != l.reps.end() && it->second.primary_nhwc;
    const auto xf = nhwc ? l.get_nhwc_float(x) : l.get(x, DType::F32);
    const auto y = nhwc ? l.produce_nhwc(n.output, shape, q) : l.produce(n.output, DType::U8, shape);
    Rep& r = l.reps.at(n.output);
    l.ensure_q_tensors(r);
    l.op("quantize", n.name, {{"x", xf}, {"scale", r.q_scale}, {"zero_point", r.q_zero}, {"y", y}}, {{"axis", 0}});
    return;
  }
  std::int64_t qz = -1, dz = -1;
  const auto qs = param_tensors(l, a.q, qz), ds = param_tensors(l, a.dq, dz);
  const auto q = l.dg().add_arena("", a.q.is_signed ? DType::I8 : DType::U8, shape);
  l.op("quantize", n.name, {{"x", l.get(x, DType::F32)}, {"scale", qs}, {"zero_point", qz}, {"y", q}}, axis_attr(a.q));
  l.op("dequantize", n.name,
       {{"x", q}, {"scale", ds}, {"zero_point", dz}, {"y", l.produce(n.output, DType::F32, shape)}}, axis_attr(a.dq));
}

}  // namespace

bool is_qdq_pair(const Node& n) { return n.handler == &pair_handler(); }

// The u8 parameters each value has from the Q/DQ pairs (int8): a pair's
// output, and what it quantizes where every use of that goes through pairs
// of the same parameters. int8 x with zero point z is u8 with z + 128: the
// same 256 values.
std::map<std::string, QParams> qdq_params(const Graph& g) {
  std::map<std::string, QParams> fixed;
  std::map<std::string, std::vector<const Node*>> uses;
  for (const auto& n : g.nodes)
    for (const auto& x : n.inputs) uses[x].push_back(&n);
  std::set<std::string> outputs;
  for (const auto& o : g.outputs) outputs.insert(o.second);
  auto params = [](const Node& n) -> std::optional<QParams> {
    const auto& a = n.attr<PairAttrs>();
    if (!(a.q == a.dq) || a.q.axis >= 0) return std::nullopt;
    return QParams{a.q.scales[0], a.q.zeros[0] + (a.q.is_signed ? 128 : 0)};
  };
  for (const auto& n : g.nodes) {
    if (!is_qdq_pair(n)) continue;
    const auto p = params(n);
    if (!p) continue;
    fixed[n.output] = *p;
    const std::string& x = n.inputs[0];
    if (outputs.count(x) || g.value(x).data) continue;
    bool all = true;
    for (const Node* u : uses[x]) {
      const auto up = is_qdq_pair(*u) ? params(*u) : std::nullopt;
      all = all && up && up->scale == p->scale && up->zero_point == p->zero_point;
    }
    if (all) fixed[x] = *p;
  }
  return fixed;
}

void finish_qdq(Importer& im) {
  for (const auto& n : im.g.nodes) {
    for (const auto& x : n.inputs) {
      if (x.empty() || n.op == "QuantizeLinear") continue;
      const Value& v = im.g.value(x);
      if (v.int8_type && !v.data)
        im.unsupported(n, "it reads '" + x +
                              "', a QuantizeLinear's integers; the compiler takes QuantizeLinear only before "
                              "DequantizeLinear (Q/DQ pairs)");
    }
  }
  for (const auto& o : im.g.outputs)
    if (im.g.value(o.second).int8_type && !im.g.value(o.second).data)
      im.fail(Status::Unsupported, "output '" + o.first +
                                       "' is a QuantizeLinear's integers; model outputs must be float (end the model "
                                       "with a DequantizeLinear)");
  std::erase_if(im.g.nodes, [](const Node& n) { return n.op == "QuantizeLinear"; });
}

std::span<const OpHandler> quantize_handlers() {
  static const OpHandler h[] = {
      {.ops = {"QuantizeLinear"},
       .opsets = {10, INT_MAX, nullptr},
       .read = read_attrs<QuantAttrs>,
       .expand = expand_quantize},
      {.ops = {"DequantizeLinear"},
       .opsets = {10, INT_MAX, nullptr},
       .read = read_attrs<QuantAttrs>,
       .expand = expand_dequantize},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
