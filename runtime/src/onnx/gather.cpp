// Gather. With constant indices: on device data a cast per run of
// consecutive indices, from a view of the input into a view of the output;
// on constants folded. With indices computed on the device (an ArgMax's,
// a Cast's of token ids): the board's gather, which checks each index
// when it runs.
#include "onnx/importer.hpp"
#include "onnx/lowerer.hpp"

namespace tpuhal::rt::detail {
namespace {

struct GatherAttrs {
  std::int64_t axis = 0;  // as given
  // Resolved by its shape rule: the axis, and the indices made non-negative.
  std::size_t resolved = 0;
  std::vector<std::int64_t> indices;
  bool on_device = false;  // the indices are device data: the board's gather
  static GatherAttrs read(const Attrs& a) { return {a.i("axis", 0), 0, {}, false}; }
};

// x's shape with the axis replaced by idx's shape.
std::vector<std::int64_t> gathered(const std::vector<std::int64_t>& x, std::int64_t axis,
                                   const std::vector<std::int64_t>& idx) {
  std::vector<std::int64_t> shape(x.begin(), x.begin() + axis);
  shape.insert(shape.end(), idx.begin(), idx.end());
  shape.insert(shape.end(), x.begin() + axis + 1, x.end());
  return shape;
}

[[noreturn]] void index_outside(Importer& im, const Node& n, std::int64_t i, std::int64_t dim) {
  im.fail_node(n,
               "index " + std::to_string(i) + " outside [" + std::to_string(-dim) + ", " + std::to_string(dim) + ")");
}

Value fold_gather(Importer& im, Node& n) {
  const Value& x = im.in(n, 0);
  const auto vals = values_of(x);
  const auto rank = static_cast<std::int64_t>(x.shape.size());
  const Value& idx = im.in(n, 1);
  if (!is_integer(idx)) im.fail_node(n, "its indices are not integers");
  if (rank == 0) im.fail_node(n, "gathers from a scalar");
  const auto axis = im.axis_of(n, n.attr<GatherAttrs>().axis, rank);
  const auto dim = x.shape[static_cast<std::size_t>(axis)];
  const auto shape = gathered(x.shape, axis, idx.shape);
  im.check_folded(n, shape);
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t d = 0; d < axis; ++d) outer *= x.shape[static_cast<std::size_t>(d)];
  for (std::int64_t d = axis + 1; d < rank; ++d) inner *= x.shape[static_cast<std::size_t>(d)];
  std::vector<double> r;
  for (std::int64_t o = 0; o < outer; ++o)
    for (auto i : idx.ints) {
      if (i < -dim || i >= dim) index_outside(im, n, i, dim);
      if (i < 0) i += dim;
      for (std::int64_t k = 0; k < inner; ++k) r.push_back(vals[static_cast<std::size_t>((o * dim + i) * inner + k)]);
    }
  return make_constant(shape, r, is_integer(x));
}

// Device data or device indices.
Value infer_gather(Importer& im, Node& n) {
  auto& a = n.attr<GatherAttrs>();
  const auto& x = im.in(n, 0).shape;
  const Value& idx = im.in(n, 1);
  const auto rank = static_cast<std::int64_t>(x.size());
  if (rank == 0) im.fail_node(n, "gathers from a scalar");
  const auto axis = im.axis_of(n, a.axis, rank);
  const auto dim = x[static_cast<std::size_t>(axis)];
  Value out;
  out.shape = gathered(x, axis, idx.shape);
  if (out.shape.size() > kMaxRank) im.unsupported(n, "rank above 6");
  a.resolved = static_cast<std::size_t>(axis);
  if (!idx.data) {  // the board checks each index as it runs
    if (dim > 0x7FFF'FFFF) im.unsupported(n, "an axis of more than 2^31 - 1 elements with indices on the device");
    a.on_device = true;
    return out;
  }
  if (!is_integer(idx)) im.fail_node(n, "its indices are not integers");
  for (auto i : idx.ints) {
    if (i < -dim || i >= dim) index_outside(im, n, i, dim);
    a.indices.push_back(i < 0 ? i + dim : i);
  }
  return out;
}

// The board's gather, or a copy per run of consecutive constant indices.
void lower_gather(Lowerer& l, const Node& n) {
  const DType t = l.float_type();
  const auto& a = n.attr<GatherAttrs>();
  if (a.on_device) {
    const auto idx = l.get(n.inputs[1], DType::I32);
    l.op("gather", n.name,
         {{"x", l.get(n.inputs[0], t)}, {"indices", idx}, {"y", l.produce(n.output, t, l.shape_of(n.output))}},
         {{"axis", a.resolved}});
    return;
  }
  const auto& xs = l.shape_of(n.inputs[0]);
  const auto axis = a.resolved;
  const auto& idx = a.indices;
  const auto x = l.get(n.inputs[0], t);
  const auto y = l.produce(n.output, t, l.shape_of(n.output));
  const auto xst = row_major_strides(xs);
  // y viewed as x's shape with the indices flattened onto the axis.
  std::vector<std::int64_t> ys = xs;
  ys[axis] = static_cast<std::int64_t>(idx.size());
  const auto yst = row_major_strides(ys);
  for (std::size_t j = 0; j < idx.size();) {
    std::size_t run = 1;
    while (j + run < idx.size() && idx[j + run] == idx[j] + static_cast<std::int64_t>(run)) ++run;
    std::vector<std::int64_t> part = xs;
    part[axis] = static_cast<std::int64_t>(run);
    const auto from = static_cast<std::uint64_t>(idx[j] * xst[axis]) * size_of(t);
    const auto to = static_cast<std::uint64_t>(static_cast<std::int64_t>(j) * yst[axis]) * size_of(t);
    l.op("cast", n.name, {{"x", l.dg().add_subview(x, part, xst, from)}, {"y", l.dg().add_subview(y, part, yst, to)}});
    j += run;
  }
}

}  // namespace

std::span<const OpHandler> gather_handlers() {
  static const OpHandler h[] = {
      {.ops = {"Gather"},
       .read = read_attrs<GatherAttrs>,
       .infer = infer_gather,
       .fold = fold_gather,
       .folds = Fold::IfConstant,
       .lower = lower_gather},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
