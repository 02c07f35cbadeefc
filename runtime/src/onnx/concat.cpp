// Concat (any axis): none where it can be, each input that only it uses
// written straight into its part of the output by the op that makes it
// (plan_concats, passes.hpp); the others copied (cast) into strided views of
// the output. Folded on constants.
#include "onnx/attrs.hpp"
#include "onnx/importer.hpp"
#include "onnx/lowerer.hpp"

namespace tpuhal::rt::detail {
namespace {

// The output's shape, its inputs checked; `axis` made non-negative.
std::vector<std::int64_t> concat_shape(Importer& im, const Node& n, std::int64_t& axis) {
  const auto& x = im.in(n, 0).shape;
  const auto rank = static_cast<std::int64_t>(x.size());
  const auto& given = n.attr<ConcatAttrs>().axis;
  if (!given) im.fail_node(n, "no axis");
  axis = im.axis_of(n, *given, rank);
  const auto ax = static_cast<std::size_t>(axis);
  std::vector<std::int64_t> shape = x;
  shape[ax] = 0;
  for (std::size_t i = 0; i < n.inputs.size(); ++i) {
    const auto& v = im.in(n, i).shape;
    if (v.size() != x.size())
      im.fail_node(n, "inputs of ranks " + std::to_string(rank) + " and " + std::to_string(v.size()));
    for (std::size_t d = 0; d < x.size(); ++d)
      if (d != ax && v[d] != x[d])
        im.fail_node(n, "inputs " + dims_text(x) + " and " + dims_text(v) + " differ off the axis");
    shape[ax] += v[ax];
  }
  return shape;
}

Value fold_concat(Importer& im, Node& n) {
  const Value& x = im.in(n, 0);
  std::int64_t axis = 0;
  const auto shape = concat_shape(im, n, axis);
  bool integer = true;
  for (std::size_t i = 0; i < n.inputs.size(); ++i) integer = integer && is_integer(im.in(n, i));
  im.check_folded(n, shape);
  std::int64_t outer = 1;
  for (std::int64_t d = 0; d < axis; ++d) outer *= x.shape[static_cast<std::size_t>(d)];
  std::vector<double> r;
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      const Value& v = im.in(n, i);
      const auto vv = values_of(v);
      const std::uint64_t chunk = outer ? v.elements() / static_cast<std::uint64_t>(outer) : 0;
      r.insert(r.end(), vv.begin() + static_cast<std::ptrdiff_t>(o * chunk),
               vv.begin() + static_cast<std::ptrdiff_t>((o + 1) * chunk));
    }
  return make_constant(shape, r, integer);
}

Value infer_concat(Importer& im, Node& n) {
  Value out;
  out.shape = concat_shape(im, n, n.attr<ConcatAttrs>().resolved);
  return out;
}

// fp32, fp16 and bf16: a 4-D Concat with an input held NHWC is made NHWC, each input
// copied into its part (along the NHWC form of the axis).
bool nhwc_concat(Lowerer& l, const Node& n, std::int64_t axis) {
  const auto& shape = l.shape_of(n.output);
  if (shape.size() != 4 ||
      std::none_of(n.inputs.begin(), n.inputs.end(), [&](const std::string& x) { return l.held_float_nhwc(x); }))
    return false;
  for (const auto& x : n.inputs)
    if (auto it = l.reps.find(x); !l.g.value(x).data && (it == l.reps.end() || it->second.boolean)) return false;
  // The output is made already where an input was made in its part (a
  // channel shuffle's Slice: shape.cpp's made_in_concat); that one is not copied.
  const auto made = l.reps.find(n.output);
  const auto y = made != l.reps.end() && made->second.primary_nhwc ? made->second.nhwc_float
                                                                   : l.produce_nhwc_float(n.output, shape);
  const auto st = row_major_strides(to_nhwc(shape));
  const std::size_t ax = nhwc_dim(static_cast<std::size_t>(axis));
  std::int64_t at = 0;
  for (const auto& x : n.inputs) {
    const auto xs = to_nhwc(l.shape_of(x));
    const auto part = l.dg().add_subview(y, xs, st, static_cast<std::uint64_t>(at * st[ax]) * size_of(l.nhwc_type));
    at += xs[ax];
    if (const auto r = l.reps.find(x); r != l.reps.end() && r->second.primary_nhwc && r->second.nhwc_float >= 0 &&
                                       l.dg().tensors[static_cast<std::size_t>(r->second.nhwc_float)].base == y)
      continue;
    l.op("cast", n.name, {{"x", l.get_nhwc_float(x)}, {"y", part}});
  }
  return true;
}

// Each input not already produced in its part of the output (placements)
// is copied there.
void lower_concat(Lowerer& l, const Node& n) {
  const auto axis = n.attr<ConcatAttrs>().resolved;
  if (l.qconcat(n, axis)) return;
  if (nhwc_concat(l, n, axis)) return;
  const DType t = l.float_type();
  const auto& shape = l.shape_of(n.output);
  // An NHWC output made for an input made in its part (made_in_concat) is
  // that input's storage alone: this output is made anew.
  if (const auto it = l.reps.find(n.output); it != l.reps.end() && it->second.primary_nhwc) l.reps.erase(it);
  std::int64_t y;
  if (auto it = l.reps.find(n.output); it != l.reps.end() && it->second.by_dtype.count(t))
    y = it->second.by_dtype.at(t);
  else
    y = l.produce(n.output, t, shape);
  const auto st = row_major_strides(shape);
  std::int64_t at = 0;
  for (const auto& in : n.inputs) {
    const auto& is = l.shape_of(in);
    const auto part_at = static_cast<std::uint64_t>(at * st[static_cast<std::size_t>(axis)]) * size_of(t);
    at += is[static_cast<std::size_t>(axis)];
    if (l.placed.count(in) && l.reps.at(in).primary == t) continue;
    const auto x = l.get(in, t);
    l.op("cast", n.name, {{"x", x}, {"y", l.dg().add_subview(y, is, st, part_at)}});
  }
}

}  // namespace

std::span<const OpHandler> concat_handlers() {
  static const OpHandler h[] = {
      {.ops = {"Concat"},
       .read = read_attrs<ConcatAttrs>,
       .infer = infer_concat,
       .fold = fold_concat,
       .folds = Fold::IfConstant,
       .lower = lower_concat,
       .writes_fresh = true},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
