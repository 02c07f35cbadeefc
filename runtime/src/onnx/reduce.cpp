// ReduceMean, ReduceSum, ReduceMax, ReduceMin, ReduceL1, ReduceL2,
// ReduceSumSquare, ReduceLogSum, ReduceLogSumExp, ReduceProd over any axes,
// keepdims or not: a pool over the innermost dimension of x viewed as
// [1, 1, outer, inner] (ReduceProd: a tree of products over halves of it),
// the reduced axes moved last first where they are not already. CumSum along a constant axis: the board's cumsum. On
// constants each folds.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "onnx/importer.hpp"
#include "onnx/lowerer.hpp"

namespace tpuhal::rt::detail {
namespace {

struct ReduceAttrs {
  std::vector<std::int64_t> axes;  // the attribute (before the opset that made it an input)
  bool keepdims = true;
  bool noop_with_empty_axes = false;
  std::vector<std::size_t> reduced;  // the axes reduced, ascending (its shape rule resolves them)
  static ReduceAttrs read(const Attrs& a) {
    return {a.ints("axes"), a.i("keepdims", 1) != 0, a.i("noop_with_empty_axes", 0) != 0, {}};
  }
};

Value infer_reduce(Importer& im, Node& n) {
  auto& a = n.attr<ReduceAttrs>();
  const auto& x = im.in(n, 0).shape;
  const auto rank = static_cast<std::int64_t>(x.size());
  // Axes: an attribute, or (ReduceSum from opset 13, the others from 18) an input.
  const bool axes_input = n.op == "ReduceSum" ? im.g.opset >= 13 : im.g.opset >= 18;
  std::vector<std::int64_t> axes =
      axes_input ? (im.has(n, 1) ? im.int_list(n, 1, "axes", a.axes) : std::vector<std::int64_t>{}) : a.axes;
  if (axes.empty() && a.noop_with_empty_axes) im.unsupported(n, "noop_with_empty_axes");
  if (axes.empty())
    for (std::int64_t d = 0; d < rank; ++d) axes.push_back(d);
  std::vector<bool> reduced(x.size());
  for (auto ax : axes) {
    const auto d = static_cast<std::size_t>(im.axis_of(n, ax, rank));
    if (reduced[d]) im.fail_node(n, "axis " + std::to_string(ax) + " is repeated");
    reduced[d] = true;
  }
  Value out;
  for (std::size_t d = 0; d < x.size(); ++d)
    if (reduced[d]) a.reduced.push_back(d);
  for (std::size_t d = 0; d < x.size(); ++d)
    if (!reduced[d])
      out.shape.push_back(x[d]);
    else if (a.keepdims)
      out.shape.push_back(1);
  return out;
}

// Folded: each output the reduction of the elements that map to it, in
// double; NaN propagates through max and min. Of integers (shape
// arithmetic), an integer, as ONNX keeps the type: a mean or L2 norm
// truncated toward zero.
Value fold_reduce(Importer& im, Node& n) {
  const Value out = infer_reduce(im, n);
  im.check_folded(n, out.shape);
  const Value& x = im.in(n, 0);
  const auto vals = values_of(x);
  if (vals.empty() && elements_of(out.shape) != 0) im.fail_node(n, "reduces an empty axis");
  std::vector<std::int64_t> kept = x.shape;  // the output with keepdims
  for (auto d : n.attr<ReduceAttrs>().reduced) kept[d] = 1;
  const auto xst = row_major_strides(x.shape), kst = row_major_strides(kept);
  const std::string& op = n.op;
  const double init = op == "ReduceProd"  ? 1.0
                      : op == "ReduceMax" ? -std::numeric_limits<double>::infinity()
                      : op == "ReduceMin" ? std::numeric_limits<double>::infinity()
                                          : 0.0;
  std::vector<double> r(elements_of(kept), init);
  for (std::uint64_t i = 0; i < vals.size(); ++i) {
    std::uint64_t o = 0;
    for (std::size_t d = 0; d < kept.size(); ++d)
      if (kept[d] != 1) o += i / xst[d] % x.shape[d] * kst[d];
    const double v = vals[i];
    double& acc = r[o];
    acc = std::isnan(acc) || std::isnan(v) ? (op == "ReduceMax" || op == "ReduceMin" ? std::nan("") : acc + v)
          : op == "ReduceProd"             ? acc * v
          : op == "ReduceMax"              ? std::max(acc, v)
          : op == "ReduceMin"              ? std::min(acc, v)
          : op == "ReduceL2" || op == "ReduceSumSquare" ? acc + v * v
          : op == "ReduceL1"                            ? acc + std::fabs(v)
          : op == "ReduceLogSumExp"                     ? acc + std::exp(v)
                                                        : acc + v;
  }
  const double count = r.empty() ? 1.0 : static_cast<double>(vals.size() / r.size());
  const bool integer = is_integer(x);
  for (auto& v : r) {
    v = op == "ReduceMean"                                ? v / count
        : op == "ReduceL2"                                ? std::sqrt(v)
        : op == "ReduceLogSum" || op == "ReduceLogSumExp" ? std::log(v)
                                                          : v;
    if (integer) {
      if (!(std::fabs(v) < 0x1p63)) im.fail_node(n, "its integer result is outside int64");
      v = std::trunc(v);
    }
  }
  return make_constant(out.shape, r, integer);
}

// y [outer] = the product of each row of x [outer, inner] (views of them),
// as a tree: each round multiplies the first half of the row by the second,
// carrying an odd last column, until one column is left in y.
void lower_product(Lowerer& l, const Node& n, DType t, std::int64_t x, std::int64_t y, std::int64_t outer,
                   std::int64_t inner) {
  std::int64_t cur = x, width = inner;
  auto part = [&](std::int64_t of, std::int64_t cols, std::int64_t row, std::int64_t col0) {
    return l.dg().add_subview(of, {outer, cols}, {row, 1}, static_cast<std::uint64_t>(col0) * size_of(t));
  };
  while (width > 1) {
    const std::int64_t half = width / 2, next_width = half + width % 2;
    const std::int64_t next = next_width == 1 ? y : l.dg().add_arena("", t, {outer, next_width});
    l.op("mul", n.name,
         {{"a", part(cur, half, width, 0)},
          {"b", part(cur, half, width, half)},
          {"y", part(next, half, next_width, 0)}});
    if (width % 2) l.op("cast", n.name, {{"x", part(cur, 1, width, 2 * half)}, {"y", part(next, 1, next_width, half)}});
    cur = next;
    width = next_width;
  }
}

// Each element alone (nothing to reduce): what the reduction makes of one.
void lower_unreduced(Lowerer& l, const Node& n, std::int64_t x, std::int64_t y) {
  const std::string& op = n.op;
  if (op == "ReduceSumSquare")
    l.op("mul", n.name, {{"a", x}, {"b", x}, {"y", y}});
  else
    l.op(op == "ReduceL2" || op == "ReduceL1" ? "abs"
         : op == "ReduceLogSum"               ? "log"
                                              : "cast",
         n.name, {{"x", x}, {"y", y}});
}

// The sums: sum(f(x)) as mean(f(x)) * n, f the identity, |x|, x * x, or
// exp(x - max) with the row's max taken first; then sqrt (L2), log
// (LogSum), or log plus the max (LogSumExp: no exp overflows).
void lower_sum(Lowerer& l, const Node& n, DType t, std::int64_t x, std::int64_t y, std::int64_t outer,
               std::int64_t inner, const std::function<void(bool, std::int64_t, std::int64_t)>& pool) {
  const std::string& op = n.op;
  const std::vector<std::int64_t> flat{outer, inner}, flat_out{outer}, column{outer, 1};
  std::int64_t src = l.dg().add_view(x, flat), top = -1;
  if (op == "ReduceL2" || op == "ReduceSumSquare") {
    src = l.dg().add_arena("", t, flat);
    l.op("mul", n.name, {{"a", l.dg().add_view(x, flat)}, {"b", l.dg().add_view(x, flat)}, {"y", src}});
  } else if (op == "ReduceL1") {
    src = l.dg().add_arena("", t, flat);
    l.op("abs", n.name, {{"x", l.dg().add_view(x, flat)}, {"y", src}});
  } else if (op == "ReduceLogSumExp") {
    top = l.dg().add_arena("", t, flat_out);
    pool(true, x, top);
    const auto shifted = l.dg().add_arena("", t, flat);
    l.op("sub", n.name, {{"a", l.dg().add_view(x, flat)}, {"b", l.dg().add_view(top, column)}, {"y", shifted}});
    src = l.dg().add_arena("", t, flat);
    l.op("exp", n.name, {{"x", shifted}, {"y", src}});
  }
  const auto m = l.dg().add_arena("", t, flat_out);
  pool(false, src, m);
  const auto count = l.add_weight({static_cast<float>(inner)}, t, {});
  const auto out = l.dg().add_view(y, flat_out);
  if (op == "ReduceSum" || op == "ReduceL1" || op == "ReduceSumSquare") {
    l.op("mul", n.name, {{"a", m}, {"b", count}, {"y", out}});
    return;
  }
  const auto sum = l.dg().add_arena("", t, flat_out);
  l.op("mul", n.name, {{"a", m}, {"b", count}, {"y", sum}});
  if (op == "ReduceL2") {
    l.op("sqrt", n.name, {{"x", sum}, {"y", out}});
  } else if (op == "ReduceLogSum") {
    l.op("log", n.name, {{"x", sum}, {"y", out}});
  } else {  // ReduceLogSumExp
    const auto log_sum = l.dg().add_arena("", t, flat_out);
    l.op("log", n.name, {{"x", sum}, {"y", log_sum}});
    l.op("add", n.name, {{"a", log_sum}, {"b", top}, {"y", out}});
  }
}

// A pool's attributes for a window of kh x kw taps, each output's own
// (stride 1, no padding), in `layout`.
nlohmann::json window_pool(std::uint32_t kh, std::uint32_t kw, const char* layout) {
  return {{"kernel", {kh, kw}}, {"strides", {1, 1}},          {"dilations", {1, 1}}, {"pads", {0, 0, 0, 0}},
          {"ceil_mode", false}, {"count_include_pad", false}, {"layout", layout}};
}

// A mean or max over H and W of a 4-D activation held NHWC (ShuffleNet's
// x.mean([2, 3])) as a global pool of the NHWC tensor: the bits of the
// pool over rows lower_reduce would run on its NCHW transpose (each output
// meets its taps in (row, column) order, a mean divided once), without the
// transpose; in int8, a mean of bytes quantized to its range is
// qlinear_global_avg_pool (qavgpool), as a GlobalAveragePool's is. False
// (nothing emitted) where it does not apply.
bool spatial_pool(Lowerer& l, const Node& n, const std::vector<bool>& reduced) {
  const auto& xs = l.shape_of(n.inputs[0]);
  if ((n.op != "ReduceMean" && n.op != "ReduceMax") || xs.size() != 4 || reduced[0] || reduced[1] || !reduced[2] ||
      !reduced[3] || xs[2] * xs[3] <= 1 || xs[0] * xs[1] == 0 ||
      !(l.held_float_nhwc(n.inputs[0]) || (l.int8() && l.held_nhwc(n.inputs[0]))))
    return false;
  if (n.op == "ReduceMean" && l.qavgpool(n)) return true;  // int8: on the bytes
  const auto y = l.produce(n.output, l.float_type(), l.shape_of(n.output));
  const auto window = [&](std::size_t d) { return static_cast<std::uint32_t>(xs[d]); };
  l.op(n.op == "ReduceMax" ? "max_pool2d" : "avg_pool2d", n.name,
       {{"x", l.get_nhwc_float(n.inputs[0])}, {"y", l.dg().add_view(y, {xs[0], 1, 1, xs[1]})}},
       window_pool(window(2), window(3), "nhwc"));
  return true;
}

// Mean and max directly, min as -max(-x), the sums by lower_sum, product
// as a tree of products.
void lower_reduce(Lowerer& l, const Node& n) {
  const DType t = l.float_type();
  const std::string& op_type = n.op;
  const auto& xs = l.shape_of(n.inputs[0]);
  const auto& shape = l.shape_of(n.output);
  std::vector<bool> reduced(xs.size());
  for (auto d : n.attr<ReduceAttrs>().reduced) reduced[d] = true;
  std::vector<std::size_t> perm;
  std::int64_t outer = 1, inner = 1;
  for (std::size_t d = 0; d < xs.size(); ++d)
    if (!reduced[d]) perm.push_back(d), outer *= xs[d];
  for (std::size_t d = 0; d < xs.size(); ++d)
    if (reduced[d]) perm.push_back(d), inner *= xs[d];
  if (spatial_pool(l, n, reduced)) return;
  std::int64_t x = l.get(n.inputs[0], t);
  const auto y = l.produce(n.output, t, shape);
  if (inner == 1 || outer == 0) {  // nothing to reduce (or nothing to reduce into): each element alone
    lower_unreduced(l, n, l.dg().add_view(x, shape), y);
    return;
  }
  // Only dimensions larger than 1 decide whether the order changes.
  std::vector<std::size_t> big;
  for (auto d : perm)
    if (xs[d] != 1) big.push_back(d);
  if (!std::is_sorted(big.begin(), big.end())) {
    std::vector<std::int64_t> ps;
    for (auto d : perm) ps.push_back(xs[d]);
    const auto tx = l.dg().add_arena("", t, ps);
    l.op("transpose", n.name, {{"x", x}, {"y", tx}}, {{"perm", perm}});
    x = tx;
  }
  const std::vector<std::int64_t> as_pool{1, 1, outer, inner}, pooled{1, 1, outer, 1};
  auto pool = [&](bool max, std::int64_t from, std::int64_t to) {
    l.op(max ? "max_pool2d" : "avg_pool2d", n.name,
         {{"x", l.dg().add_view(from, as_pool)}, {"y", l.dg().add_view(to, pooled)}},
         window_pool(1, static_cast<std::uint32_t>(inner), "nchw"));
  };
  const std::vector<std::int64_t> flat{outer, inner}, flat_out{outer};
  if (op_type == "ReduceMean" || op_type == "ReduceMax") {
    pool(op_type == "ReduceMax", x, y);
  } else if (op_type == "ReduceProd") {
    lower_product(l, n, t, l.dg().add_view(x, flat), l.dg().add_view(y, {outer, 1}), outer, inner);
  } else if (op_type == "ReduceMin") {
    const auto nx = l.dg().add_arena("", t, flat), m = l.dg().add_arena("", t, flat_out);
    l.op("neg", n.name, {{"x", l.dg().add_view(x, flat)}, {"y", nx}});
    pool(true, nx, m);
    l.op("neg", n.name, {{"x", m}, {"y", l.dg().add_view(y, flat_out)}});
  } else {
    lower_sum(l, n, t, x, y, outer, inner, pool);
  }
}

struct CumSumAttrs {
  bool exclusive = false, reverse = false;
  std::size_t axis = 0;  // from the constant axis input, resolved by its shape rule
  static CumSumAttrs read(const Attrs& a) { return {a.i("exclusive", 0) != 0, a.i("reverse", 0) != 0, 0}; }
};

// x's shape; the axis (input 1) one constant integer of x's rank.
Value infer_cumsum(Importer& im, Node& n) {
  auto& a = n.attr<CumSumAttrs>();
  const auto& x = im.in(n, 0).shape;
  const auto rank = static_cast<std::int64_t>(x.size());
  if (rank == 0) im.fail_node(n, "a scalar input");
  const Value& axis = im.constant(n, 1, "axis");
  if (axis.ints.size() != 1) im.fail_node(n, "its axis is not one integer");
  a.axis = static_cast<std::size_t>(im.axis_of(n, axis.ints[0], rank));
  n.inputs.resize(1);  // the axis is read
  Value out;
  out.shape = x;
  return out;
}

// Folded in double (integers stay integers, as ONNX keeps the type).
Value fold_cumsum(Importer& im, Node& n) {
  const Value out = infer_cumsum(im, n);
  im.check_folded(n, out.shape);
  const auto& a = n.attr<CumSumAttrs>();
  const Value& x = im.in(n, 0);
  const auto vals = values_of(x);
  const std::int64_t len = x.shape[a.axis];
  std::int64_t inner = 1;
  for (std::size_t d = a.axis + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
  const std::int64_t outer = len * inner != 0 ? static_cast<std::int64_t>(vals.size()) / (len * inner) : 0;
  std::vector<double> r(vals.size());
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t k = 0; k < inner; ++k) {
      double sum = 0;
      for (std::int64_t s = 0; s < len; ++s) {
        const auto at = static_cast<std::size_t>((o * len + (a.reverse ? len - 1 - s : s)) * inner + k);
        if (!a.exclusive) sum += vals[at];
        r[at] = sum;
        if (a.exclusive) sum += vals[at];
      }
    }
  return make_constant(out.shape, r, is_integer(x));
}

// In the model's float type, or in i32 where the model holds the input as
// integers (positions counted from an attention mask): exact at any length.
void lower_cumsum(Lowerer& l, const Node& n) {
  const auto& a = n.attr<CumSumAttrs>();
  const DType t = l.held_type(n.inputs[0]);
  l.op("cumsum", n.name, {{"x", l.get(n.inputs[0], t)}, {"y", l.produce(n.output, t, l.shape_of(n.output))}},
       {{"axis", a.axis}, {"exclusive", a.exclusive}, {"reverse", a.reverse}});
}

}  // namespace

std::span<const OpHandler> reduce_handlers() {
  static const OpHandler h[] = {
      {.ops = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2", "ReduceSumSquare",
               "ReduceLogSum", "ReduceLogSumExp", "ReduceProd"},
       .read = read_attrs<ReduceAttrs>,
       .infer = infer_reduce,
       .fold = fold_reduce,
       .folds = Fold::IfConstant,
       .lower = lower_reduce},
      {.ops = {"CumSum"},
       .opsets = {.first = 11, .refusal = "CumSum before opset 11"},
       .read = read_attrs<CumSumAttrs>,
       .infer = infer_cumsum,
       .fold = fold_cumsum,
       .folds = Fold::IfConstant,
       .lower = lower_cumsum,
       .writes_fresh = true},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
