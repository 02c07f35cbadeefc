// Pad: constant (the output filled with the value, the input copied into
// its interior), reflect and edge (one padded axis at a time, as numpy.pad
// pads); zero pads are a view.
#include <algorithm>

#include "onnx/importer.hpp"
#include "onnx/lowerer.hpp"

namespace tpuhal::rt::detail {
namespace {

struct PadAttrs {
  std::vector<std::int64_t> pads_attribute;  // before opset 11 (an input since)
  std::string mode = "constant";
  float value_attribute = 0;  // before opset 11
  // Resolved by its shape rule: every dimension's begin pads, then its end pads, and the value.
  std::vector<std::int64_t> pads;
  double value = 0;
  static PadAttrs read(const Attrs& a) { return {a.ints("pads"), a.s("mode", "constant"), a.f("value", 0.0f), {}, 0}; }
};

Value infer_pad(Importer& im, Node& n) {
  auto& a = n.attr<PadAttrs>();
  const int opset = im.g.opset;
  const auto& x = im.in(n, 0).shape;
  const auto rank = static_cast<std::int64_t>(x.size());
  const auto pads = opset >= 11 ? im.int_list(n, 1, "pads", a.pads_attribute) : a.pads_attribute;
  if (opset >= 18 && im.has(n, 3)) im.unsupported(n, "the axes input");
  if (static_cast<std::int64_t>(pads.size()) != 2 * rank)
    im.fail_node(n, std::to_string(pads.size()) + " pads for rank " + std::to_string(rank));
  const std::string& mode = a.mode;
  if (mode != "constant" && mode != "reflect" && mode != "edge") im.unsupported(n, "mode '" + mode + "'");
  double value = a.value_attribute;
  if (opset >= 11 && im.has(n, 2)) {
    const Value& c = im.constant(n, 2, "constant_value");
    if (c.elements() != 1) im.fail_node(n, "constant_value is not a scalar");
    value = values_of(c)[0];
  }
  a.value = value;
  a.pads = pads;
  Value out;
  for (std::int64_t d = 0; d < rank; ++d) {
    const auto lo = pads[static_cast<std::size_t>(d)], hi = pads[static_cast<std::size_t>(d + rank)];
    if (lo < 0 || hi < 0) im.unsupported(n, "negative pads (cropping)");
    const auto dim = x[static_cast<std::size_t>(d)];
    if (mode == "reflect" && (lo >= dim || hi >= dim))
      im.fail_node(n, "reflect pads " + std::to_string(lo) + ", " + std::to_string(hi) + " on a dimension of " +
                          std::to_string(dim));
    if (mode == "edge" && dim == 0 && lo + hi > 0) im.fail_node(n, "edge pads on an empty dimension");
    out.shape.push_back(dim + lo + hi);
  }
  return out;
}

// reflect and edge: one padded axis at a time, each stage copied from the
// one before (the input, then a scratch tensor): the input's part, then
// each padded position (a slab one position thick) from the position it
// mirrors or repeats. Later axes pad the earlier ones' pads too, so
// corners come out as numpy.pad makes them.
void lower_mirrored(Lowerer& l, const Node& n, DType t, std::int64_t x, std::int64_t y) {
  const auto& pads = n.attr<PadAttrs>().pads;
  const auto& xs = l.shape_of(n.inputs[0]);
  const auto rank = xs.size();
  auto before = [&](std::size_t d) { return pads[d]; };
  auto after = [&](std::size_t d) { return pads[d + rank]; };
  std::size_t last = 0;
  for (std::size_t d = 0; d < rank; ++d)
    if (before(d) || after(d)) last = d;
  std::int64_t cur = x;
  std::vector<std::int64_t> cur_shape = xs;
  const bool reflect = n.attr<PadAttrs>().mode == "reflect";
  for (std::size_t d = 0; d < rank; ++d) {
    if (!before(d) && !after(d)) continue;
    std::vector<std::int64_t> next_shape = cur_shape;
    next_shape[d] += before(d) + after(d);
    const auto next = d == last ? y : l.dg().add_arena("", t, next_shape);
    const auto cst = row_major_strides(cur_shape), nst = row_major_strides(next_shape);
    const std::int64_t len = cur_shape[d];
    auto at = [&](std::int64_t tensor, const std::vector<std::int64_t>& st, std::int64_t pos, std::int64_t thick) {
      std::vector<std::int64_t> part = cur_shape;
      part[d] = thick;
      return l.dg().add_subview(tensor, part, st, static_cast<std::uint64_t>(pos * st[d]) * size_of(t));
    };
    l.op("cast", n.name, {{"x", cur}, {"y", at(next, nst, before(d), len)}});
    for (std::int64_t j = 0; j < before(d); ++j)  // mirrors input position before - j, or repeats 0
      l.op("cast", n.name, {{"x", at(cur, cst, reflect ? before(d) - j : 0, 1)}, {"y", at(next, nst, j, 1)}});
    for (std::int64_t j = 0; j < after(d); ++j)  // mirrors input position len - 2 - j, or repeats len - 1
      l.op("cast", n.name,
           {{"x", at(cur, cst, reflect ? len - 2 - j : len - 1, 1)}, {"y", at(next, nst, before(d) + len + j, 1)}});
    cur = next;
    cur_shape = next_shape;
  }
}

// Constant padding: y filled with the value, x copied into its interior.
void lower_pad(Lowerer& l, const Node& n) {
  const DType t = l.float_type();
  const auto& a = n.attr<PadAttrs>();
  const auto& xs = l.shape_of(n.inputs[0]);
  const auto& shape = l.shape_of(n.output);
  if (std::all_of(a.pads.begin(), a.pads.end(), [](std::int64_t p) { return p == 0; })) {
    if (!l.reps.count(n.inputs[0])) l.get(n.inputs[0], t);
    l.alias(n.output, n.inputs[0], shape);
    return;
  }
  const auto x = l.get(n.inputs[0], t);
  const auto y = l.produce(n.output, t, shape);
  if (a.mode != "constant") {
    lower_mirrored(l, n, t, x, y);
    return;
  }
  l.op("cast", n.name, {{"x", l.add_weight({static_cast<float>(a.value)}, t, {})}, {"y", y}});
  const auto st = row_major_strides(shape);
  std::uint64_t first = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) first += static_cast<std::uint64_t>(a.pads[d] * st[d]);
  l.op("cast", n.name, {{"x", x}, {"y", l.dg().add_subview(y, xs, st, first * size_of(t))}});
}

}  // namespace

std::span<const OpHandler> pad_handlers() {
  static const OpHandler h[] = {
      {.ops = {"Pad"}, .read = read_attrs<PadAttrs>, .infer = infer_pad, .lower = lower_pad},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
