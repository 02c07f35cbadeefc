// Comparisons (Equal, Less, LessOrEqual, Greater, GreaterOrEqual) into u8
// booleans (1 or 0); logic (And, Or, Xor, Not) of booleans the device
// computed or constants; Where, its condition such a boolean. Each folded
// on constants (the masks models build from shapes).
#include <map>

#include "onnx/fold.hpp"
#include "onnx/lowerer.hpp"

namespace tpuhal::rt::detail {
namespace {

Value fold_compare_or_logic(Importer& im, Node& n) {
  const std::string& op = n.op;
  return fold_each(binary_operands(im, n), true, [&](double p, double q) -> double {
    return op == "Equal"            ? p == q
           : op == "Less"           ? p < q
           : op == "LessOrEqual"    ? p <= q
           : op == "Greater"        ? p > q
           : op == "GreaterOrEqual" ? p >= q
           : op == "And"            ? (p != 0 && q != 0)
           : op == "Or"             ? (p != 0 || q != 0)
                                    : ((p != 0) != (q != 0));  // Xor
  });
}

// The tpuhal op of a comparison or logic op.
const std::string& kind_of(const std::string& op) {
  static const std::map<std::string, std::string> kinds = {{"Equal", "equal"},
                                                           {"Less", "less"},
                                                           {"LessOrEqual", "less_equal"},
                                                           {"Greater", "greater"},
                                                           {"GreaterOrEqual", "greater_equal"},
                                                           {"And", "logical_and"},
                                                           {"Or", "logical_or"},
                                                           {"Xor", "logical_xor"},
                                                           {"Not", "logical_not"}};
  return kinds.at(op);
}

// Numbers in, u8 1 or 0 out.
void lower_compare(Lowerer& l, const Node& n) {
  const DType t = l.float_type();
  l.op(kind_of(n.op), n.name,
       {{"a", l.get(n.inputs[0], t)},
        {"b", l.get(n.inputs[1], t)},
        {"y", l.produce_bool(n.output, l.shape_of(n.output))}});
}

void lower_logic(Lowerer& l, const Node& n) {
  l.op(kind_of(n.op), n.name,
       {{"a", l.get_bool(n, n.inputs[0])},
        {"b", l.get_bool(n, n.inputs[1])},
        {"y", l.produce_bool(n.output, l.shape_of(n.output))}});
}

Value infer_not(Importer& im, Node& n) {
  Value out;
  out.shape = im.in(n, 0).shape;
  return out;
}

Value fold_not(Importer& im, Node& n) {
  const Value& x = im.in(n, 0);
  std::vector<double> r = values_of(x);
  for (auto& v : r) v = v == 0 ? 1 : 0;
  return make_constant(x.shape, r, true);
}

void lower_not(Lowerer& l, const Node& n) {
  l.op("logical_not", n.name,
       {{"x", l.get_bool(n, n.inputs[0])}, {"y", l.produce_bool(n.output, l.shape_of(n.output))}});
}

// Device data: a condition, constant or computed, selecting between values.
Value infer_where(Importer& im, Node& n) {
  const Value& c = im.in(n, 0);
  Value out;
  out.shape = im.broadcast(n, im.broadcast(n, c.shape, im.in(n, 1).shape), im.in(n, 2).shape);
  return out;
}

Value fold_where(Importer& im, Node& n) {
  const Value &c = im.in(n, 0), &p = im.in(n, 1), &q = im.in(n, 2);
  const auto shape = im.broadcast(n, im.broadcast(n, c.shape, p.shape), q.shape);
  im.check_folded(n, shape);
  const auto cv = values_of(c), pv = values_of(p), qv = values_of(q);
  std::vector<double> r(elements_of(shape));
  for (std::uint64_t i = 0; i < r.size(); ++i)
    r[i] = cv[broadcast_index(shape, c.shape, i)] != 0 ? pv[broadcast_index(shape, p.shape, i)]
                                                       : qv[broadcast_index(shape, q.shape, i)];
  return make_constant(shape, r, is_integer(p) && is_integer(q));
}

// The condition as u8 1 or 0, constant or computed.
void lower_where(Lowerer& l, const Node& n) {
  const DType t = l.float_type();
  l.op("where", n.name,
       {{"cond", l.get_bool(n, n.inputs[0])},
        {"a", l.get(n.inputs[1], t)},
        {"b", l.get(n.inputs[2], t)},
        {"y", l.produce(n.output, t, l.shape_of(n.output))}});
}

}  // namespace

std::span<const OpHandler> logic_handlers() {
  static const OpHandler h[] = {
      {.ops = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"},
       .infer = infer_binary,
       .fold = fold_compare_or_logic,
       .folds = Fold::IfConstant,
       .lower = lower_compare},
      {.ops = {"And", "Or", "Xor"},
       .infer = infer_binary,
       .fold = fold_compare_or_logic,
       .folds = Fold::IfConstant,
       .lower = lower_logic},
      {.ops = {"Not"}, .infer = infer_not, .fold = fold_not, .folds = Fold::IfConstant, .lower = lower_not},
      {.ops = {"Where"}, .infer = infer_where, .fold = fold_where, .folds = Fold::IfConstant, .lower = lower_where},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
