// Every elementwise map that has a builder of its own (the op schema's
// ElementwiseOp builders, generated into tests/ops/op_maps.inc), one test
// each, named after the builder: the builder makes an elementwise op of its
// map, refuses an operand outside its family's dtypes naming the op and the
// operand, and the board computes what reference() below says. A map added
// to the schema without its reference here does not build (-Wswitch); the
// family files (ops_elementwise_test.cpp, ...) test the maps' numerics in
// depth: every dtype, broadcasting, strided views, special values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "impl.hpp"  // hal/src: OpAccess
#include "ops_reference.hpp"
#include "tpuhal/driver/op_desc.hpp"
#include "tpuhal/tpuhal.hpp"

#pragma GCC diagnostic error "-Wswitch"

namespace tpuhal {
namespace {

using driver::ElementwiseOp;

enum class Family { Arith, Float, Comparison, Logic };

struct MapCase {
  const char* name;
  ElementwiseOp op;
  int arity;
  Family family;
  Op (*build)(const Tensor& a, const Tensor* b, const Tensor& y);
};

void PrintTo(const MapCase& m, std::ostream* os) { *os << m.name; }

template <int Arity, class F>
Op call(F f, const Tensor& a, const Tensor* b, const Tensor& y) {
  if constexpr (Arity == 2)
    return f(a, *b, y);
  else
    return f(a, y);
}

#define TPUHAL_TEST_MAP(builder, Name, arity, Fam)           \
  MapCase{#builder, ElementwiseOp::Name, arity, Family::Fam, \
          [](const Tensor& a, const Tensor* b, const Tensor& y) { return call<arity>(&ops::builder, a, b, y); }},
const MapCase kMaps[] = {
#include "op_maps.inc"
};
#undef TPUHAL_TEST_MAP

// What the map gives for one element (the inputs are exact in every dtype
// the test uses); nullopt for the maps without a builder of their own.
std::optional<double> reference(ElementwiseOp op, double a, double b) {
  switch (op) {
    case ElementwiseOp::Identity:
    case ElementwiseOp::Activation: return std::nullopt;
    case ElementwiseOp::Add: return a + b;
    case ElementwiseOp::Sub: return a - b;
    case ElementwiseOp::Mul: return a * b;
    case ElementwiseOp::Div: return std::trunc(a / b);  // integers: toward zero
    case ElementwiseOp::Max: return std::max(a, b);
    case ElementwiseOp::Min: return std::min(a, b);
    case ElementwiseOp::Abs: return std::abs(a);
    case ElementwiseOp::Neg: return -a;
    case ElementwiseOp::Exp: return std::exp(a);
    case ElementwiseOp::Log: return std::log(a);
    case ElementwiseOp::Sqrt: return std::sqrt(a);
    case ElementwiseOp::Erf: return std::erf(a);
    case ElementwiseOp::Equal: return a == b;
    case ElementwiseOp::Less: return a < b;
    case ElementwiseOp::LessOrEqual: return a <= b;
    case ElementwiseOp::Greater: return a > b;
    case ElementwiseOp::GreaterOrEqual: return a >= b;
    case ElementwiseOp::And: return a != 0 && b != 0;
    case ElementwiseOp::Or: return a != 0 || b != 0;
    case ElementwiseOp::Xor: return (a != 0) != (b != 0);
    case ElementwiseOp::Not: return a == 0;
    case ElementwiseOp::Ceil: return std::ceil(a);
    case ElementwiseOp::Floor: return std::floor(a);
    case ElementwiseOp::Round: return std::nearbyint(a);  // halves to even
    case ElementwiseOp::Fmod: return std::fmod(a, b);     // the dividend's sign
    case ElementwiseOp::Sin: return std::sin(a);
    case ElementwiseOp::Cos: return std::cos(a);
    case ElementwiseOp::Tan: return std::tan(a);
    case ElementwiseOp::Asin: return std::asin(a);
    case ElementwiseOp::Acos: return std::acos(a);
    case ElementwiseOp::Atan: return std::atan(a);
    case ElementwiseOp::Sinh: return std::sinh(a);
    case ElementwiseOp::Cosh: return std::cosh(a);
    case ElementwiseOp::Asinh: return std::asinh(a);
    case ElementwiseOp::Acosh: return std::acosh(a);
    case ElementwiseOp::Atanh: return std::atanh(a);
    case ElementwiseOp::Mod: {  // the divisor's sign
      const double r = std::fmod(a, b);
      return r != 0 && (r < 0) != (b < 0) ? r + b : r;
    }
  }
  return std::nullopt;
}

class OpMaps : public ::testing::TestWithParam<MapCase> {
 protected:
  ops_test::Lab lab_{open("sim:tiny")};

  // values as a 1-D tensor of dtype t on the device.
  Tensor upload(DType t, const std::vector<double>& values) {
    ops_test::Host h(t, {static_cast<std::int64_t>(values.size())});
    h.v = values;
    return lab_.upload(h);
  }
};

// The dtypes a map of each family takes (inputs, output), and one it
// refuses, with the operand that names it.
struct FamilyDtypes {
  DType in, out;
  DType refused;
  const char* refused_operand;  // "x"/"a" (the first input) or "y"
};
FamilyDtypes dtypes_of(Family f) {
  switch (f) {
    case Family::Arith: return {DType::I32, DType::I32, DType::F32, "y"};
    case Family::Float: return {DType::F32, DType::F32, DType::I32, "x"};
    case Family::Comparison: return {DType::I32, DType::U8, DType::I32, "y"};
    case Family::Logic: return {DType::U8, DType::U8, DType::I32, "x"};
  }
  return {};
}

TEST_P(OpMaps, BuildsItsMapRefusesOtherDtypesAndComputesOnTheBoard) {
  const MapCase& m = GetParam();
  const FamilyDtypes d = dtypes_of(m.family);
  // Inputs exact in each dtype; b has no zero (integer division).
  std::vector<double> a, b;
  if (m.family == Family::Logic) {
    a = {0, 1, 2, 0, 255, 1};
    b = {0, 0, 1, 1, 3, 0};
  } else if (m.family == Family::Float) {
    a = {-2.5, -1, 0.5, 1.5, 2.5, 4};
    b = a;
  } else {
    a = {-7, -1, 0, 2, 5, 9};
    b = {2, -1, 3, 2, 5, -4};
  }
  Tensor ta = upload(d.in, a), tb = upload(d.in, b);
  Tensor y = upload(d.out, std::vector<double>(a.size(), 0));
  const Op op = m.build(ta, m.arity == 2 ? &tb : nullptr, y);

  // An elementwise op of this map, B absent for a unary one.
  const auto& desc = OpAccess::desc(op);
  ASSERT_TRUE(desc);
  EXPECT_EQ(desc->kind, driver::OpKind::Elementwise);
  const auto* attrs = std::get_if<driver::ElementwiseAttrs>(&desc->attrs);
  ASSERT_NE(attrs, nullptr);
  EXPECT_EQ(attrs->op, m.op);
  EXPECT_EQ(desc->tensors[1].present(), m.arity == 2);

  // The family's dtype rule, refused by the builder with its name. An
  // input-side rule gets every operand in the refused dtype, so that only
  // that rule can refuse it (not the one that y matches x).
  {
    const bool on_y = std::string(d.refused_operand) == "y";
    Tensor bad = upload(d.refused, std::vector<double>(a.size(), 1));
    const Error e = test::error_of([&] {
      if (on_y)
        m.build(ta, m.arity == 2 ? &tb : nullptr, bad);
      else
        m.build(bad, m.arity == 2 ? &bad : nullptr, bad);
    });
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    const std::string what = e.what();
    EXPECT_NE(what.find(m.name), std::string::npos) << what;
    const std::string operand = on_y ? "y" : (m.arity == 2 ? "a" : "x");
    // The family's list of dtypes, or (arith, which takes any) y's match.
    const std::string rule = m.family == Family::Arith ? " but " : "; supported: ";
    EXPECT_NE(what.find(operand + " is " + to_string(d.refused) + rule), std::string::npos) << what;
  }

  // Computed on the board as the reference says.
  const std::vector<double> got = lab_.run(op, y).v;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::optional<double> want = reference(m.op, a[i], b[i]);
    ASSERT_TRUE(want.has_value()) << m.name << " has no reference";
    const double w = d.out == DType::F32 ? static_cast<double>(static_cast<float>(*want)) : *want;
    if (std::isnan(w))
      EXPECT_TRUE(std::isnan(got[i])) << m.name << "(" << a[i] << ", " << b[i] << ")";
    else if (std::isinf(w))
      EXPECT_EQ(got[i], w) << m.name << "(" << a[i] << ", " << b[i] << ")";
    else
      EXPECT_NEAR(got[i], w, std::abs(w) * 1e-6) << m.name << "(" << a[i] << ", " << b[i] << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Schema, OpMaps, ::testing::ValuesIn(kMaps),
                         [](const ::testing::TestParamInfo<MapCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace tpuhal
