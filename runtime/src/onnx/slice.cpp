// Slice (positive steps on device data, any step on constants): a cast
// from a strided view. Split (sizes given or equal parts): a Slice per
// output.
#include <algorithm>

#include "onnx/attrs.hpp"
#include "onnx/importer.hpp"
#include "onnx/lowerer.hpp"

namespace tpuhal::rt::detail {
namespace {

// Slice's start and step per dimension and its output shape.
struct SliceParams {
  std::vector<std::int64_t> lo, step, shape;
};

SliceParams slice_of(Importer& im, const Node& n) {
  const auto& a = n.attr<SliceAttrs>();
  const auto& x = im.in(n, 0).shape;
  const auto rank = static_cast<std::int64_t>(x.size());
  auto starts = im.int_list(n, 1, "starts", a.starts), ends = im.int_list(n, 2, "ends", a.ends);
  std::vector<std::int64_t> axes = im.has(n, 3) ? im.int_list(n, 3, "axes", {}) : std::vector<std::int64_t>{};
  std::vector<std::int64_t> steps = im.has(n, 4) ? im.int_list(n, 4, "steps", {}) : std::vector<std::int64_t>{};
  if (axes.empty())
    for (std::size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<std::int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    im.fail_node(n, "starts, ends, axes and steps differ in length");
  SliceParams p{std::vector<std::int64_t>(x.size(), 0), std::vector<std::int64_t>(x.size(), 1), x};
  for (std::size_t i = 0; i < starts.size(); ++i) {
    const auto ax = static_cast<std::size_t>(im.axis_of(n, axes[i], rank));
    const auto dim = x[ax];
    if (steps[i] == 0) im.fail_node(n, "a step of 0");
    if (steps[i] < 0 && !im.in(n, 0).data)
      im.unsupported(n, "step " + std::to_string(steps[i]) +
                            " on data computed on the device; the compiler slices it with positive steps");
    auto clampi = [&](std::int64_t v, std::int64_t lo, std::int64_t hi) {
      return std::clamp(v < 0 ? v + dim : v, lo, hi);
    };
    p.step[ax] = steps[i];
    if (steps[i] > 0) {
      const auto b = clampi(starts[i], 0, dim), e = clampi(ends[i], 0, dim);
      p.lo[ax] = b;
      p.shape[ax] = e > b ? (e - b + steps[i] - 1) / steps[i] : 0;
    } else if (dim > 0) {  // backwards: from start down to end (exclusive), clamped as ONNX does
      const auto b = clampi(starts[i], 0, dim - 1), e = clampi(ends[i], -1, dim - 1);
      p.lo[ax] = b;
      p.shape[ax] = b > e ? (b - e - steps[i] - 1) / -steps[i] : 0;
    } else {
      p.shape[ax] = 0;
    }
  }
  return p;
}

// A constant sliced.
Value sliced(const Value& x, const SliceParams& sl) {
  const auto vals = values_of(x);
  Value out;
  out.shape = sl.shape;
  const auto in_st = row_major_strides(x.shape), out_st = row_major_strides(sl.shape);
  std::vector<double> r(out.elements());
  for (std::uint64_t i = 0; i < r.size(); ++i) {
    std::int64_t at = 0;
    for (std::size_t d = 0; d < sl.shape.size(); ++d) {
      const std::int64_t coord = static_cast<std::int64_t>(i) / out_st[d] % sl.shape[d];
      at += (sl.lo[d] + coord * sl.step[d]) * in_st[d];
    }
    r[i] = vals[static_cast<std::size_t>(at)];
  }
  return make_constant(sl.shape, r, is_integer(x));
}

Value fold_slice(Importer& im, Node& n) {
  const Value& x = im.in(n, 0);
  return sliced(x, slice_of(im, n));
}

Value infer_slice(Importer& im, Node& n) {
  const auto r = slice_of(im, n);
  auto& a = n.attr<SliceAttrs>();
  a.lo = r.lo;
  a.step = r.step;
  Value out;
  out.shape = r.shape;
  return out;
}

void lower_slice(Lowerer& l, const Node& n) {
  const auto& a = n.attr<SliceAttrs>();
  if (l.qslice(n, a.lo, a.step)) return;
  const DType t = l.float_type();
  const auto x = l.get(n.inputs[0], t);
  const auto& xs = l.shape_of(n.inputs[0]);
  const auto st = row_major_strides(xs);
  std::vector<std::int64_t> strides(xs.size());
  std::uint64_t first = 0;
  for (std::size_t d = 0; d < xs.size(); ++d) {
    first += static_cast<std::uint64_t>(a.lo[d]) * static_cast<std::uint64_t>(st[d]);
    strides[d] = st[d] * a.step[d];
  }
  const auto& shape = l.shape_of(n.output);
  const auto view = l.dg().add_subview(x, shape, strides, first * size_of(t));
  l.op("cast", n.name, {{"x", view}, {"y", l.produce(n.output, t, shape)}});
}

struct SplitAttrs {
  std::int64_t axis = 0;
  std::vector<std::int64_t> split;  // the attribute (an input from opset 13)
  std::optional<std::int64_t> num_outputs;
  static SplitAttrs read(const Attrs& a) { return {a.i("axis", 0), a.ints("split"), a.opt_i("num_outputs")}; }
};

// The size of each of Split's `parts` along an axis of `dim`.
std::vector<std::int64_t> split_sizes(Importer& im, const Node& n, std::int64_t dim, std::int64_t parts) {
  const auto& a = n.attr<SplitAttrs>();
  std::vector<std::int64_t> sizes =
      im.g.opset >= 13 ? (im.has(n, 1) ? im.int_list(n, 1, "split", a.split) : std::vector<std::int64_t>{}) : a.split;
  if (sizes.empty()) {
    // Equal parts (opset 18: num_outputs of them, the last smaller).
    const std::int64_t count = a.num_outputs.value_or(parts);
    if (count != parts) im.fail_node(n, std::to_string(parts) + " outputs for num_outputs " + std::to_string(count));
    const std::int64_t each = (dim + count - 1) / std::max<std::int64_t>(count, 1);
    if (!a.num_outputs && dim % count != 0)
      im.fail_node(n, "a dimension of " + std::to_string(dim) + " does not split into " + std::to_string(count) +
                          " equal parts");
    for (std::int64_t k = 0, left = dim; k < count; ++k, left -= each) sizes.push_back(std::min(each, left));
  }
  if (static_cast<std::int64_t>(sizes.size()) != parts)
    im.fail_node(n, std::to_string(sizes.size()) + " sizes for " + std::to_string(parts) + " outputs");
  std::int64_t at = 0;
  for (auto sz : sizes) {
    if (sz < 0) im.fail_node(n, "a part of size " + std::to_string(sz));
    at += sz;
  }
  if (at != dim) im.fail_node(n, "parts of " + std::to_string(at) + " for a dimension of " + std::to_string(dim));
  return sizes;
}

// A Slice per used output (a constant sliced at once).
void expand_split(Importer& im, Node& n, const onnx::NodeProto& p) {
  const Value& x = im.in(n, 0);
  const auto rank = static_cast<std::int64_t>(x.shape.size());
  const auto axis = static_cast<std::size_t>(im.axis_of(n, n.attr<SplitAttrs>().axis, rank));
  const auto sizes = split_sizes(im, n, x.shape[axis], static_cast<std::int64_t>(p.output_size()));
  std::int64_t at = 0;
  for (int k = 0; k < p.output_size(); ++k) {
    SliceParams sl{std::vector<std::int64_t>(x.shape.size(), 0), std::vector<std::int64_t>(x.shape.size(), 1), x.shape};
    sl.lo[axis] = at;
    sl.shape[axis] = sizes[static_cast<std::size_t>(k)];
    at += sizes[static_cast<std::size_t>(k)];
    const std::string& out = p.output(k);
    if (out.empty()) continue;
    if (im.g.values.count(out)) im.fail_node(n, "output '" + out + "' is defined twice");
    if (x.data) {
      im.g.values[out] = sliced(x, sl);
      im.g.notes.push_back("folded Split '" + n.name + "' of a constant");
      continue;
    }
    onnx::NodeProto proto;
    Node s = im.derived(n, std::to_string(k), "Slice", {n.inputs[0]}, out, proto);
    s.attrs = SliceAttrs{{}, {}, sl.lo, sl.step};
    im.g.values[out].shape = sl.shape;
    im.g.nodes.push_back(std::move(s));
  }
}

}  // namespace

std::span<const OpHandler> slice_handlers() {
  static const OpHandler h[] = {
      {.ops = {"Slice"},
       .opsets = {.first = 10, .refusal = "opset {opset} (attribute form)"},
       .read = read_attrs<SliceAttrs>,
       .infer = infer_slice,
       .fold = fold_slice,
       .folds = Fold::IfConstant,
       .lower = lower_slice},
      {.ops = {"Split"}, .read = read_attrs<SplitAttrs>, .expand = expand_split, .outputs = 0},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
