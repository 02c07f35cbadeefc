// Comparisons (Equal, Less, LessOrEqual, Greater, GreaterOrEqual) into u8
// booleans (1 or 0); logic (And, Or, Xor, Not) of booleans the device
// computed or constants; Where, its condition such a boolean. Each folded
// on constants (the masks models build from shapes). IsNaN, IsInf and
// Sign by comparisons.
#include <limits>
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

struct IsInfAttrs {
  bool positive = true, negative = true;
  static IsInfAttrs read(const Attrs& a) { return {a.i("detect_positive", 1) != 0, a.i("detect_negative", 1) != 0}; }
};

// IsNaN: not x == x (a NaN equals nothing). IsInf: x == inf, x == -inf, or
// both (neither: x == NaN, false everywhere). Sign: 1 above 0, -1 below, x
// * 0 else (0 for zeros, NaN for NaN). In the model's float type.
void lower_float_test(Lowerer& l, const Node& n) {
  const DType t = l.float_type();
  const auto& shape = l.shape_of(n.output);
  const auto x = l.get(n.inputs[0], t);
  auto scalar = [&](float v) { return l.add_weight({v}, t, {}); };
  auto compare = [&](const char* kind, std::int64_t b, std::int64_t y = -1) {
    if (y < 0) y = l.dg().add_arena("", DType::U8, shape);
    l.op(kind, n.name, {{"a", x}, {"b", b}, {"y", y}});
    return y;
  };
  if (n.op == "IsNaN") {
    l.op("logical_not", n.name, {{"x", compare("equal", x)}, {"y", l.produce_bool(n.output, shape)}});
  } else if (n.op == "IsInf") {
    const auto& a = n.attr<IsInfAttrs>();
    constexpr float inf = std::numeric_limits<float>::infinity();
    if (a.positive && a.negative)
      l.op("logical_or", n.name,
           {{"a", compare("equal", scalar(inf))},
            {"b", compare("equal", scalar(-inf))},
            {"y", l.produce_bool(n.output, shape)}});
    else
      compare("equal",
              scalar(a.positive   ? inf
                     : a.negative ? -inf
                                  : std::numeric_limits<float>::quiet_NaN()),
              l.produce_bool(n.output, shape));
  } else {  // Sign
    const auto zeroed = l.dg().add_arena("", t, shape), below = l.dg().add_arena("", t, shape);
    l.op("mul", n.name, {{"a", x}, {"b", scalar(0)}, {"y", zeroed}});
    l.op("where", n.name, {{"cond", compare("less", scalar(0))}, {"a", scalar(-1)}, {"b", zeroed}, {"y", below}});
    l.op("where", n.name,
         {{"cond", compare("greater", scalar(0))},
          {"a", scalar(1)},
          {"b", below},
          {"y", l.produce(n.output, t, shape)}});
  }
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
      {.ops = {"IsNaN", "Sign"}, .infer = infer_not, .lower = lower_float_test},
      {.ops = {"IsInf"},
       .opsets = {.first = 10, .refusal = "IsInf before opset 10"},
       .read = read_attrs<IsInfAttrs>,
       .infer = infer_not,
       .lower = lower_float_test},
      {.ops = {"Where"}, .infer = infer_where, .fold = fold_where, .folds = Fold::IfConstant, .lower = lower_where},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
