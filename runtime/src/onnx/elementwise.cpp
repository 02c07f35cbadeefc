// Arithmetic with broadcasting (Add, Sub, Mul, Div; Min and Max,
// variadic), the unary maps (Sqrt, Exp, Log, Abs, Neg, Erf, Ceil, Floor, Round, Reciprocal, and
// the trigonometric and hyperbolic functions and their inverses, Sin to Atanh) and
// Pow by one constant exponent: the tpuhal op of the same name, folded on
// constants. Mod: mod (fmod 0, the divisor's sign) or fmod (fmod 1, the
// dividend's), folded on constants.
#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>

#include "onnx/fold.hpp"
#include "onnx/lowerer.hpp"

namespace tpuhal::rt::detail {
namespace {

// The tpuhal op of the same name ("Add": "add").
std::string lower_case(const std::string& op) {
  std::string kind = op;
  std::transform(kind.begin(), kind.end(), kind.begin(), [](char c) { return static_cast<char>(std::tolower(c)); });
  return kind;
}

Value fold_arithmetic(Importer& im, Node& n) {
  const BinaryFold b = binary_operands(im, n);
  const std::string& op = n.op;
  return fold_each(b, false, [&](double p, double q) {
    if (op == "Add") return p + q;
    if (op == "Sub") return p - q;
    if (op == "Mul") return p * q;
    if (b.integer) {
      if (q == 0) im.fail_node(n, "integer division by zero");
      return static_cast<double>(static_cast<std::int64_t>(p) / static_cast<std::int64_t>(q));
    }
    return p / q;
  });
}

void lower_binary(Lowerer& l, const Node& n) {
  if (l.qadd(n) || l.qmul(n)) return;
  if (l.nhwc_island(n, {n.inputs[0], n.inputs[1]}, true)) {
    const auto a = l.get_nhwc_float(n.inputs[0]), b = l.get_nhwc_float(n.inputs[1]);
    l.op(lower_case(n.op), n.name, {{"a", a}, {"b", b}, {"y", l.produce_nhwc_float(n.output, l.shape_of(n.output))}});
    return;
  }
  // Integers (integer model inputs, integer constants) stay integers in
  // i32: a division rounds toward zero, as ONNX's of integers does. (A
  // value held as i32 is not enough: a Cast to float of one is a view.)
  auto integral = [&](const std::string& v) {
    const Value& val = l.g.value(v);
    return val.data ? is_integer(val) : l.g.integer_inputs.count(v) > 0;
  };
  const DType t = integral(n.inputs[0]) && integral(n.inputs[1]) ? DType::I32 : l.float_type();
  const auto x = l.get(n.inputs[0], t), y2 = l.get(n.inputs[1], t);
  l.op(lower_case(n.op), n.name, {{"a", x}, {"b", y2}, {"y", l.produce(n.output, t, l.shape_of(n.output))}});
}

struct ModAttrs {
  bool fmod = false;
  static ModAttrs read(const Attrs& a) { return {a.i("fmod", 0) != 0}; }
};

// Mod: the divisor's sign (fmod 0, integers) or the dividend's (fmod 1).
Value fold_mod(Importer& im, Node& n) {
  const BinaryFold b = binary_operands(im, n);
  const bool fmod = n.attr<ModAttrs>().fmod;
  if (!b.integer && !fmod) im.fail_node(n, "fmod 0 on floats");
  return fold_each(b, false, [&](double p, double q) {
    if (b.integer && q == 0) im.fail_node(n, "integer modulo by zero");
    double r = std::fmod(p, q);
    if (!fmod && r != 0 && ((r < 0) != (q < 0))) r += q;  // the divisor's sign
    return r;
  });
}

// On device data in the model's float type, as the other arithmetic:
// integers held as floats are exact below 2^24 (fp32).
void lower_mod(Lowerer& l, const Node& n) {
  const DType t = l.float_type();
  const auto a = l.get(n.inputs[0], t), b = l.get(n.inputs[1], t);
  l.op(n.attr<ModAttrs>().fmod ? "fmod" : "mod", n.name,
       {{"a", a}, {"b", b}, {"y", l.produce(n.output, t, l.shape_of(n.output))}});
}

Value infer_variadic(Importer& im, Node& n) {
  if (n.inputs.empty()) im.fail_node(n, "no inputs");
  Value out;
  out.shape = im.in(n, 0).shape;
  for (std::size_t i = 1; i < n.inputs.size(); ++i) out.shape = im.broadcast(n, out.shape, im.in(n, i).shape);
  return out;
}

// Min, Max, Sum and Mean of constants: the binary op chained in input
// order, each step rounded to f32 unless every input is an integer; Mean
// then divides by n.
Value fold_variadic(Importer& im, Node& n) {
  Value acc = im.in(n, 0);
  bool integer = is_integer(acc);
  for (std::size_t i = 1; i < n.inputs.size(); ++i) {
    const Value& y = im.in(n, i);
    BinaryFold b{acc, y, im.broadcast(n, acc.shape, y.shape)};
    im.check_folded(n, b.shape);
    b.integer = integer = integer && is_integer(y);
    acc = fold_each(b, false, [&](double p, double q) {
      return n.op == "Min" ? std::min(p, q) : n.op == "Max" ? std::max(p, q) : p + q;
    });
  }
  if (n.op != "Mean") return acc;
  auto v = values_of(acc);
  for (auto& e : v)
    e = integer ? std::trunc(e / static_cast<double>(n.inputs.size()))
                : static_cast<float>(e / static_cast<double>(n.inputs.size()));
  return make_constant(acc.shape, v, integer);
}

// Min, Max and Sum of several inputs: a chain of the binary op, in input
// order. Mean: their sum times 1 / n.
void lower_variadic(Lowerer& l, const Node& n) {
  const DType t = l.float_type();
  const auto& shape = l.shape_of(n.output);
  const std::string kind = n.op == "Min" ? "min" : n.op == "Max" ? "max" : "add";
  const bool mean = n.op == "Mean";
  const auto out = [&](bool last) {
    return last && !mean ? l.produce(n.output, t, shape) : l.dg().add_arena("", t, shape);
  };
  std::int64_t acc = l.get(n.inputs[0], t);
  if (n.inputs.size() == 1) {
    l.op("cast", n.name, {{"x", acc}, {"y", l.produce(n.output, t, shape)}});
    return;
  }
  for (std::size_t i = 1; i < n.inputs.size(); ++i) {
    const auto y = out(i + 1 == n.inputs.size());
    l.op(kind, n.name, {{"a", acc}, {"b", l.get(n.inputs[i], t)}, {"y", y}});
    acc = y;
  }
  if (mean)
    l.op("mul", n.name,
         {{"a", acc},
          {"b", l.add_weight({1.0f / static_cast<float>(n.inputs.size())}, t, {})},
          {"y", l.produce(n.output, t, shape)}});
}

Value infer_unary(Importer& im, Node& n) {
  Value out;
  out.shape = im.in(n, 0).shape;
  return out;
}

// Each unary map as the compiler folds it on constants, in double.
double (*unary_map(const std::string& op))(double) {
  static const std::pair<const char*, double (*)(double)> kMaps[] = {
      {"Sqrt", [](double v) { return std::sqrt(v); }},
      {"Exp", [](double v) { return std::exp(v); }},
      {"Log", [](double v) { return std::log(v); }},
      {"Abs", [](double v) { return std::fabs(v); }},
      {"Neg", [](double v) { return -v; }},
      {"Erf", [](double v) { return std::erf(v); }},
      {"Ceil", [](double v) { return std::ceil(v); }},
      {"Floor", [](double v) { return std::floor(v); }},
      {"Round", [](double v) { return std::nearbyint(v); }},  // halves to even in the default rounding mode
      {"Reciprocal", [](double v) { return 1.0 / v; }},
      {"Sin", [](double v) { return std::sin(v); }},
      {"Cos", [](double v) { return std::cos(v); }},
      {"Tan", [](double v) { return std::tan(v); }},
      {"Asin", [](double v) { return std::asin(v); }},
      {"Acos", [](double v) { return std::acos(v); }},
      {"Atan", [](double v) { return std::atan(v); }},
      {"Sinh", [](double v) { return std::sinh(v); }},
      {"Cosh", [](double v) { return std::cosh(v); }},
      {"Asinh", [](double v) { return std::asinh(v); }},
      {"Acosh", [](double v) { return std::acosh(v); }},
      {"Atanh", [](double v) { return std::atanh(v); }},
  };
  for (const auto& [name, f] : kMaps)
    if (op == name) return f;
  return nullptr;
}

Value fold_unary(Importer& im, Node& n) {
  const Value& x = im.in(n, 0);
  std::vector<double> r = values_of(x);
  double (*f)(double) = unary_map(n.op);
  for (auto& v : r) v = f(v);
  return make_constant(x.shape, r, false);
}

void lower_unary(Lowerer& l, const Node& n) {
  const DType t = l.float_type();
  const auto x = l.get(n.inputs[0], t);
  l.op(lower_case(n.op), n.name, {{"x", x}, {"y", l.produce(n.output, t, l.shape_of(n.output))}});
}

// Reciprocal: div of 1 by x.
void lower_reciprocal(Lowerer& l, const Node& n) {
  const DType t = l.float_type();
  const auto x = l.get(n.inputs[0], t);
  l.op("div", n.name,
       {{"a", l.add_weight({1.0f}, t, {})}, {"b", x}, {"y", l.produce(n.output, t, l.shape_of(n.output))}});
}

struct PowAttrs {
  double exponent = 0;  // the constant exponent (its shape rule reads it)
};

std::any read_pow(const Attrs&) { return PowAttrs{}; }

Value infer_pow(Importer& im, Node& n) {
  const Value& y = im.constant(n, 1, "exponent");
  if (y.elements() != 1)
    im.unsupported(n, "an exponent of shape " + dims_text(y.shape) + "; the compiler takes one constant exponent");
  Value out;
  out.shape = im.broadcast(n, im.in(n, 0).shape, y.shape);
  n.attr<PowAttrs>().exponent = values_of(y)[0];
  return out;
}

Value fold_pow(Importer& im, Node& n) {
  const Value& x = im.in(n, 0);
  const auto vals = values_of(x);
  const Value& y = im.in(n, 1);
  if (x.elements() != 1 && y.elements() != 1)
    im.fail_node(n, "a power of two constant tensors is folded only with a scalar");
  const auto yv = values_of(y);
  const auto shape = im.broadcast(n, x.shape, y.shape);
  im.check_folded(n, shape);
  std::vector<double> r(elements_of(shape));
  for (std::size_t i = 0; i < r.size(); ++i)
    r[i] = std::pow(vals[x.elements() == 1 ? 0 : i], yv[y.elements() == 1 ? 0 : i]);
  return make_constant(shape, r, false);
}

// x^e for one constant e: products for small integer powers (and their
// reciprocals), sqrt for 0.5, else exp(e * log(x)) (NaN for x < 0, as
// pow gives for a fractional power).
void lower_pow(Lowerer& l, const Node& n) {
  const DType t = l.float_type();
  const double e = n.attr<PowAttrs>().exponent;
  const auto& shape = l.shape_of(n.output);
  const auto x = l.get(n.inputs[0], t);
  const auto y = l.produce(n.output, t, shape);
  const double whole = std::nearbyint(e);
  if (e == whole && std::fabs(e) <= 16 && e != 0) {
    auto m = static_cast<std::uint32_t>(std::fabs(e));
    // Square-and-multiply, most significant bit first.
    std::int64_t acc = x;
    const int top = 31 - std::countl_zero(m);
    for (int b = top - 1; b >= 0; --b) {
      const auto sq = l.dg().add_arena("", t, shape);
      l.op("mul", n.name, {{"a", acc}, {"b", acc}, {"y", sq}});
      acc = sq;
      if ((m >> b) & 1) {
        const auto mx = l.dg().add_arena("", t, shape);
        l.op("mul", n.name, {{"a", acc}, {"b", x}, {"y", mx}});
        acc = mx;
      }
    }
    if (e < 0)
      l.op("div", n.name, {{"a", l.add_weight({1.0f}, t, {})}, {"b", acc}, {"y", y}});
    else
      l.op("cast", n.name, {{"x", acc}, {"y", y}});
    return;
  }
  if (e == 0) {  // pow(x, 0) is 1 for every x, NaN included
    l.op("cast", n.name, {{"x", l.add_weight({1.0f}, t, {})}, {"y", y}});
    return;
  }
  if (e == 0.5) {
    l.op("sqrt", n.name, {{"x", x}, {"y", y}});
    return;
  }
  const auto lg = l.dg().add_arena("", t, shape), m = l.dg().add_arena("", t, shape);
  l.op("log", n.name, {{"x", x}, {"y", lg}});
  l.op("mul", n.name, {{"a", lg}, {"b", l.add_weight({static_cast<float>(e)}, t, {})}, {"y", m}});
  l.op("exp", n.name, {{"x", m}, {"y", y}});
}

}  // namespace

std::span<const OpHandler> elementwise_handlers() {
  static const OpHandler h[] = {
      {.ops = {"Add", "Sub", "Mul", "Div"},
       .infer = infer_binary,
       .fold = fold_arithmetic,
       .folds = Fold::IfFirstTwoConstant,
       .lower = lower_binary,
       .writes_fresh = true},
      {.ops = {"Mod"},
       .read = read_attrs<ModAttrs>,
       .infer = infer_binary,
       .fold = fold_mod,
       .folds = Fold::IfFirstTwoConstant,
       .lower = lower_mod,
       .writes_fresh = true},
      {.ops = {"Min", "Max", "Sum", "Mean"},
       .infer = infer_variadic,
       .fold = fold_variadic,
       .folds = Fold::IfConstant,
       .lower = lower_variadic,
       .writes_fresh = true},
      {.ops = {"Sqrt", "Exp", "Log",  "Abs",  "Neg",  "Erf",  "Ceil", "Floor", "Round", "Sin",
               "Cos",  "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"},
       .infer = infer_unary,
       .fold = fold_unary,
       .folds = Fold::IfConstant,
       .lower = lower_unary,
       .writes_fresh = true},
      {.ops = {"Reciprocal"},
       .infer = infer_unary,
       .fold = fold_unary,
       .folds = Fold::IfConstant,
       .lower = lower_reciprocal,
       .writes_fresh = true},
      {.ops = {"Pow"},
       .read = read_pow,
       .infer = infer_pow,
       .fold = fold_pow,
       .folds = Fold::IfConstant,
       .lower = lower_pow},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
