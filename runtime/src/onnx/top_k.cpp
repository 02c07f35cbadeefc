// ArgMax, ArgMin (keepdims or not, select_last_index) and TopK (constant k;
// values and indices): top_k, the indices i32 on the device (consumers and
// outputs see them as floats, exact below 2^24), TopK's values in the
// float type. Hardmax: the one-hot of ArgMax.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "onnx/importer.hpp"
#include "onnx/lowerer.hpp"

namespace tpuhal::rt::detail {
namespace {

struct TopKAttrs {
  std::int64_t axis = 0;  // as given (TopK's default -1, ArgMax's and ArgMin's 0)
  bool largest = true, keepdims = true, sorted = true, last_index = false;
  std::size_t resolved = 0;  // the axis, made non-negative by its shape rule
  static TopKAttrs read(const Attrs& a) {
    const std::string& op = a.node.op_type();
    TopKAttrs t;
    t.axis = a.i("axis", op == "TopK" ? -1 : 0);
    t.largest = op != "ArgMin" && a.i("largest", 1) != 0;
    t.keepdims = a.i("keepdims", 1) != 0;
    t.sorted = a.i("sorted", 1) != 0;
    t.last_index = a.i("select_last_index", 0) != 0;
    return t;
  }
};

// TopK's k: one constant integer from 1 to the axis' length.
std::int64_t k_of(Importer& im, Node& n, std::int64_t length) {
  const Value& kv = im.constant(n, 1, "k");
  if (kv.ints.size() != 1) im.fail_node(n, "k is not one integer");
  const std::int64_t k = kv.ints[0];
  // 0 (an empty result) only where it folds: the device takes 1 to length.
  const std::int64_t least = im.in(n, 0).data ? 0 : 1;
  if (k < least || k > length) im.fail_node(n, "k " + std::to_string(k) + " for a length of " + std::to_string(length));
  if (!n.attr<TopKAttrs>().sorted)
    im.g.notes.push_back("TopK '" + n.name + "' runs sorted (sorted=0 leaves the order open)");
  return k;
}

Value infer_top_k(Importer& im, Node& n) {
  auto& a = n.attr<TopKAttrs>();
  const auto& x = im.in(n, 0).shape;
  const auto rank = static_cast<std::int64_t>(x.size());
  if (rank == 0) im.fail_node(n, "a scalar input");
  const std::int64_t axis = im.axis_of(n, a.axis, rank);
  const bool top_k = n.op == "TopK";
  Value out;
  out.shape = x;
  const std::int64_t k = top_k ? k_of(im, n, x[static_cast<std::size_t>(axis)]) : 1;
  if (top_k || a.keepdims)
    out.shape[static_cast<std::size_t>(axis)] = k;
  else
    out.shape.erase(out.shape.begin() + axis);
  if (x[static_cast<std::size_t>(axis)] > 0x7FFF'FFFF) im.fail_node(n, "an axis too long for i32 indices");
  a.resolved = static_cast<std::size_t>(axis);
  n.inputs.resize(1);
  return out;
}

// TopK, ArgMax and ArgMin of a constant: along the axis, the k largest
// (or smallest) best first, equal values in index order (the last index
// first for an ArgMax with select_last_index); TopK's indices into
// Importer::folded_second.
Value fold_top_k(Importer& im, Node& n) {
  Value shape = infer_top_k(im, n);
  const auto& a = n.attr<TopKAttrs>();
  const auto& xs = im.in(n, 0).shape;
  const Value& x = im.in(n, 0);
  const bool integer = is_integer(x);
  const auto axis = a.resolved;
  std::int64_t outer = 1, inner = 1;
  for (std::size_t d = 0; d < axis; ++d) outer *= xs[d];
  for (std::size_t d = axis + 1; d < xs.size(); ++d) inner *= xs[d];
  const std::int64_t len = xs[axis];
  const std::int64_t k = n.op == "TopK" ? shape.shape[axis] : 1;
  std::vector<double> values(static_cast<std::size_t>(outer * k * inner)), indices(values.size());
  std::vector<std::int64_t> order(static_cast<std::size_t>(len));
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) {
      const auto at = [&](std::int64_t j) { return value_at(x, static_cast<std::size_t>((o * len + j) * inner + i)); };
      std::iota(order.begin(), order.end(), 0);
      // Best first (NaN largest); equal values by index (the last first with select_last_index).
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](std::int64_t p, std::int64_t q) {
        const double vp = at(p), vq = at(q);
        const bool np = std::isnan(vp), nq = std::isnan(vq);  // NaN above every number, as torch.topk takes it
        if (np != nq) return a.largest ? np : nq;
        if (!np && vp != vq) return a.largest ? vp > vq : vp < vq;
        return a.last_index ? p > q : p < q;
      });
      for (std::int64_t j = 0; j < k; ++j) {
        const auto out = static_cast<std::size_t>((o * k + j) * inner + i);
        values[out] = at(order[static_cast<std::size_t>(j)]);
        indices[out] = static_cast<double>(order[static_cast<std::size_t>(j)]);
      }
    }
  if (n.op != "TopK") return make_constant(shape.shape, indices, true);
  im.folded_second = make_constant(shape.shape, indices, true);
  return make_constant(shape.shape, values, integer);
}

void lower_top_k(Lowerer& l, const Node& n) {
  const auto& a = n.attr<TopKAttrs>();
  const DType t = l.float_type();
  const auto& shape = l.shape_of(n.output);
  const std::size_t axis = a.resolved;
  const bool top_k = n.op == "TopK";
  auto kept = l.shape_of(n.inputs[0]);
  kept[axis] = top_k ? shape[axis] : 1;
  std::map<std::string, std::int64_t> operands{{"x", l.get(n.inputs[0], t)}};
  if (top_k) {
    operands["values"] = l.produce(n.output, t, shape);
    operands["indices"] = l.produce(n.output2.empty() ? n.name + "/indices" : n.output2, DType::I32, shape);
  } else {
    operands["indices"] = l.dg().add_view(l.produce(n.output, DType::I32, shape), kept);
  }
  l.op("top_k", n.name, operands, {{"axis", axis}, {"largest", a.largest}, {"last_index", a.last_index}});
}

// Hardmax (opset 13: along one axis) as ArgMax (keepdims, the first of
// equal maxima, as ONNX's Hardmax takes) compared with the axis' indices
// 0..n-1, shaped to broadcast along it, and cast to float: 1 at the first
// maximum, 0 elsewhere.
struct HardmaxAttrs {
  std::int64_t axis = -1;
  static HardmaxAttrs read(const Attrs& a) { return {a.i("axis", -1)}; }
};

void set_int(onnx::NodeProto& p, const char* name, std::int64_t v) {
  auto* a = p.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

void expand_hardmax(Importer& im, Node& n, const onnx::NodeProto&) {
  const auto x = im.in(n, 0).shape;
  const auto rank = static_cast<std::int64_t>(x.size());
  if (rank == 0) im.fail_node(n, "a scalar input");
  const std::int64_t axis = im.axis_of(n, n.attr<HardmaxAttrs>().axis, rank);
  const std::int64_t length = x[static_cast<std::size_t>(axis)];
  onnx::NodeProto p;
  Node arg = im.derived(n, "argmax", "ArgMax", {n.inputs[0]}, n.name + "/argmax", p);
  set_int(p, "axis", axis);
  set_int(p, "keepdims", 1);
  im.emit(std::move(arg), p);
  std::vector<std::int64_t> shape(x.size(), 1);
  shape[static_cast<std::size_t>(axis)] = length;
  std::vector<double> indices(static_cast<std::size_t>(length));
  for (std::size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<double>(i);
  const std::string iota = im.add_constant(n.name + "/indices", shape, indices, true);
  im.emit_derived(n, "equal", "Equal", {n.name + "/argmax", iota}, n.name + "/one_hot");
  onnx::NodeProto c;
  Node cast = im.derived(n, "cast", "Cast", {n.name + "/one_hot"}, n.output, c);
  set_int(c, "to", onnx::TensorProto::FLOAT);
  im.emit(std::move(cast), c);
}

}  // namespace

std::span<const OpHandler> top_k_handlers() {
  static const OpHandler h[] = {
      {.ops = {"ArgMax", "ArgMin"},
       .read = read_attrs<TopKAttrs>,
       .infer = infer_top_k,
       .fold = fold_top_k,
       .folds = Fold::IfConstant,
       .lower = lower_top_k},
      {.ops = {"TopK"},
       .opsets = {.first = 10, .refusal = "opset below 10 (k as an attribute)"},
       .read = read_attrs<TopKAttrs>,
       .infer = infer_top_k,
       .fold = fold_top_k,
       .folds = Fold::IfConstant,
       .lower = lower_top_k,
       .outputs = 2},
      {.ops = {"Hardmax"},
       .opsets = {.first = 13, .refusal = "opset below 13 (Hardmax over the dimensions flattened from its axis)"},
       .read = read_attrs<HardmaxAttrs>,
       .expand = expand_hardmax},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
