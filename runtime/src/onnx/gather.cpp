// Gather. With constant indices: on device data a cast per run of
// consecutive indices, from a view of the input into a view of the output;
// on constants folded. With indices computed on the device (an ArgMax's,
// a Cast's of token ids): the board's gather, which checks each index
// when it runs. GatherND: each index tuple made one index into the data
// viewed with its indexed dimensions flattened, then the board's gather.
// GatherElements: each index made one into the data flattened, then the
// board's gather. ScatterElements: the board's scatter_elements; on
// constants folded.
// ScatterND: the data viewed as rows, GatherND's rows of the index tuples,
// and one scatter_elements of rows.
#include <cmath>

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

// ---- GatherND: Y[b.., m..] = X[b.., I[b.., m.., 0], .., I[b.., m.., k-1], rest..]

struct GatherNdAttrs {
  std::int64_t batch_dims = 0;
  std::int64_t k = 0;              // the tuples' length: indices' last dimension
  std::vector<std::int32_t> rows;  // constant indices: each tuple's row (flat_rows)
  static GatherNdAttrs read(const Attrs& a) { return {a.i("batch_dims", 0), 0, {}}; }
};

// Checks the operands; returns Y's shape: indices' shape without its last
// dimension, then X's dimensions after the b + k indexed ones.
std::vector<std::int64_t> gather_nd_shape(Importer& im, Node& n) {
  auto& a = n.attr<GatherNdAttrs>();
  const auto& x = im.in(n, 0).shape;
  const auto& idx = im.in(n, 1).shape;
  const auto r = static_cast<std::int64_t>(x.size()), q = static_cast<std::int64_t>(idx.size()), b = a.batch_dims;
  if (r < 1 || q < 1) im.fail_node(n, "its data and indices must have rank 1 or more");
  if (b < 0 || b >= std::min(r, q))
    im.fail_node(n, "batch_dims " + std::to_string(b) + " is outside [0, " + std::to_string(std::min(r, q)) + ")");
  for (std::int64_t d = 0; d < b; ++d)
    if (x[static_cast<std::size_t>(d)] != idx[static_cast<std::size_t>(d)])
      im.fail_node(n, "batch dimension " + std::to_string(d) + " is " + std::to_string(x[static_cast<std::size_t>(d)]) +
                          " in the data and " + std::to_string(idx[static_cast<std::size_t>(d)]) + " in the indices");
  a.k = idx.back();
  if (a.k < 1 || a.k > r - b)
    im.fail_node(n, "index tuples of length " + std::to_string(a.k) + " into " + std::to_string(r - b) +
                        " dimensions after the batch ones");
  std::vector<std::int64_t> y(idx.begin(), idx.end() - 1);
  y.insert(y.end(), x.begin() + b + a.k, x.end());
  if (y.size() > kMaxRank) im.unsupported(n, "rank above 6");
  return y;
}

// The flat row of X viewed as [prod(X[:b + k]), X[b + k:]..] that each
// tuple of constant indices names; an index outside its dimension fails.
std::vector<std::int64_t> flat_rows(Importer& im, const Node& n, const std::vector<std::int64_t>& x, const Value& idx,
                                    std::size_t b, std::size_t k) {
  std::int64_t per_batch = 1;
  for (std::size_t d = b; d < b + k; ++d) per_batch *= x[d];
  std::int64_t tuples_per_batch = 1;
  for (std::size_t d = b; d + 1 < idx.shape.size(); ++d) tuples_per_batch *= idx.shape[d];
  std::vector<std::int64_t> rows(idx.ints.size() / k);
  for (std::size_t t = 0; t < rows.size(); ++t) {
    std::int64_t within = 0;  // the tuple's row in its batch: row-major over the k dimensions
    for (std::size_t j = 0; j < k; ++j) {
      const std::int64_t dim = x[b + j];
      std::int64_t i = idx.ints[t * k + j];
      if (i < -dim || i >= dim) index_outside(im, n, i, dim);
      within = within * dim + (i < 0 ? i + dim : i);
    }
    rows[t] = static_cast<std::int64_t>(t) / tuples_per_batch * per_batch + within;
  }
  return rows;
}

Value fold_gather_nd(Importer& im, Node& n) {
  const auto shape = gather_nd_shape(im, n);
  const Value& x = im.in(n, 0);
  const Value& idx = im.in(n, 1);
  if (!is_integer(idx)) im.fail_node(n, "its indices are not integers");
  im.check_folded(n, shape);
  const auto& a = n.attr<GatherNdAttrs>();
  std::int64_t inner = 1;
  for (std::size_t d = static_cast<std::size_t>(a.batch_dims + a.k); d < x.shape.size(); ++d) inner *= x.shape[d];
  std::vector<double> r;
  for (auto row : flat_rows(im, n, x.shape, idx, static_cast<std::size_t>(a.batch_dims), static_cast<std::size_t>(a.k)))
    for (std::int64_t i = 0; i < inner; ++i) r.push_back(value_at(x, static_cast<std::size_t>(row * inner + i)));
  return make_constant(shape, r, is_integer(x));
}

Value infer_gather_nd(Importer& im, Node& n) {
  Value out;
  out.shape = gather_nd_shape(im, n);
  const auto& a = n.attr<GatherNdAttrs>();
  const auto& x = im.in(n, 0).shape;
  std::int64_t rows = 1;
  for (std::size_t d = 0; d < static_cast<std::size_t>(a.batch_dims + a.k); ++d) rows *= x[d];
  if (rows > 0x7FFF'FFFF) im.unsupported(n, "more than 2^31 - 1 index tuples' worth of data rows");
  const Value& idx = im.in(n, 1);
  if (!idx.data) return out;
  if (!is_integer(idx)) im.fail_node(n, "its indices are not integers");
  auto& a_rows = n.attr<GatherNdAttrs>().rows;
  a_rows.clear();
  for (auto row : flat_rows(im, n, x, idx, static_cast<std::size_t>(a.batch_dims), static_cast<std::size_t>(a.k)))
    a_rows.push_back(static_cast<std::int32_t>(row));
  return out;
}

// The rows of X viewed as [rows, X[b + k:]..] that index tuples on the
// device (input `indices`, [tuples.., k]) name, as an i32 tensor of the
// tuples' shape: each index through a gather from [0, dim) (which checks
// it and counts a negative one from the end), times its stride, summed,
// plus each batch's first row.
std::int64_t device_rows(Lowerer& l, const Node& n, const std::string& indices, const std::vector<std::int64_t>& xs,
                         std::size_t b, std::size_t k) {
  const Value& idx = l.g.value(indices);
  const std::vector<std::int64_t> tuples(idx.shape.begin(), idx.shape.end() - 1);
  const auto all = l.dense(l.get(indices, DType::I32), DType::I32, idx.shape);
  const auto tst = row_major_strides(idx.shape);
  std::vector<std::int64_t> view_strides(tst.begin(), tst.end() - 1);
  std::int64_t acc = -1, stride = 1;
  for (std::size_t j = k; j-- > 0;) {
    const std::int64_t dim = xs[b + j];
    std::vector<std::int32_t> range(static_cast<std::size_t>(dim));
    for (std::size_t i = 0; i < range.size(); ++i) range[i] = static_cast<std::int32_t>(i);
    const auto part = l.dg().add_subview(all, tuples, view_strides, j * 4);
    const auto checked = l.dg().add_arena("", DType::I32, tuples);
    l.op("gather", n.name,
         {{"x", l.add_raw(DType::I32, {dim}, range.data(), range.size() * 4)}, {"indices", part}, {"y", checked}},
         {{"axis", 0}});
    auto term = checked;
    if (stride != 1) {
      const std::int32_t s32 = static_cast<std::int32_t>(stride);
      term = l.dg().add_arena("", DType::I32, tuples);
      l.op("mul", n.name, {{"a", checked}, {"b", l.add_raw(DType::I32, {}, &s32, 4)}, {"y", term}});
    }
    if (acc >= 0) {
      const auto sum = l.dg().add_arena("", DType::I32, tuples);
      l.op("add", n.name, {{"a", acc}, {"b", term}, {"y", sum}});
      acc = sum;
    } else {
      acc = term;
    }
    stride *= dim;
  }
  if (b > 0) {  // each batch's first row, along the tuples' batch dimensions
    std::int64_t per = 1;
    for (std::size_t d = b; d < tuples.size(); ++d) per *= tuples[d];
    std::vector<std::int32_t> first(static_cast<std::size_t>(elements_of(tuples)));
    for (std::size_t i = 0; i < first.size(); ++i)
      first[i] = static_cast<std::int32_t>(static_cast<std::int64_t>(i) / per * stride);
    const auto sum = l.dg().add_arena("", DType::I32, tuples);
    l.op("add", n.name, {{"a", acc}, {"b", l.add_raw(DType::I32, tuples, first.data(), first.size() * 4)}, {"y", sum}});
    acc = sum;
  }
  return acc;
}

// X viewed as [rows, X[b + k:]..] and one gather of rows. Constant tuples
// give the rows as a weight; tuples on the device are made rows there
// (device_rows).
void lower_gather_nd(Lowerer& l, const Node& n) {
  const DType t = l.float_type();
  const auto& a = n.attr<GatherNdAttrs>();
  const auto& xs = l.shape_of(n.inputs[0]);
  const Value& idx = l.g.value(n.inputs[1]);
  const auto b = static_cast<std::size_t>(a.batch_dims), k = static_cast<std::size_t>(a.k);
  std::vector<std::int64_t> xv{1};
  for (std::size_t d = 0; d < b + k; ++d) xv[0] *= xs[d];
  xv.insert(xv.end(), xs.begin() + static_cast<std::ptrdiff_t>(b + k), xs.end());
  const std::vector<std::int64_t> tuples(idx.shape.begin(), idx.shape.end() - 1);
  const std::int64_t rows = idx.data ? l.add_raw(DType::I32, tuples, a.rows.data(), a.rows.size() * 4)
                                     : device_rows(l, n, n.inputs[1], xs, b, k);
  const auto x = l.dg().add_view(l.dense(l.get(n.inputs[0], t), t, xs), xv);
  l.op("gather", n.name, {{"x", x}, {"indices", rows}, {"y", l.produce(n.output, t, l.shape_of(n.output))}},
       {{"axis", 0}});
}

// ---- GatherElements: Y[i..] = X[i.. with the axis's coordinate replaced
// by I[i..]]; Y has I's shape (of X's rank, at most X's length but along
// the axis).

struct GatherElementsAttrs {
  std::int64_t axis = 0;
  std::size_t resolved = 0;        // by its shape rule
  std::vector<std::int32_t> flat;  // constant indices: the elements of X flattened they name
  static GatherElementsAttrs read(const Attrs& a) { return {a.i("axis", 0), 0, {}}; }
};

// Of each position of I (shape `is`), the flat offset in X (shape `xs`) of
// its coordinates but along the axis.
std::vector<std::int64_t> element_bases(const std::vector<std::int64_t>& xs, const std::vector<std::int64_t>& is,
                                        std::size_t axis) {
  const auto xst = row_major_strides(xs), ist = row_major_strides(is);
  std::vector<std::int64_t> base(elements_of(is));
  for (std::size_t i = 0; i < base.size(); ++i)
    for (std::size_t d = 0; d < is.size(); ++d)
      if (d != axis) base[i] += static_cast<std::int64_t>(i / ist[d] % static_cast<std::uint64_t>(is[d]) * xst[d]);
  return base;
}

Value infer_gather_elements(Importer& im, Node& n) {
  auto& a = n.attr<GatherElementsAttrs>();
  const auto& x = im.in(n, 0).shape;
  const Value& idx = im.in(n, 1);
  const auto rank = static_cast<std::int64_t>(x.size());
  if (rank == 0) im.fail_node(n, "gathers from a scalar");
  a.resolved = static_cast<std::size_t>(im.axis_of(n, a.axis, rank));
  if (idx.shape.size() != x.size())
    im.fail_node(n, "its indices " + dims_text(idx.shape) + " are not of the data's rank " + std::to_string(rank));
  for (std::size_t d = 0; d < x.size(); ++d)
    if (d != a.resolved && idx.shape[d] > x[d])
      im.fail_node(n, "its indices " + dims_text(idx.shape) + " are longer than the data " + dims_text(x) +
                          " in dimension " + std::to_string(d));
  if (elements_of(x) > 0x7FFF'FFFF) im.unsupported(n, "data of more than 2^31 - 1 elements");
  a.flat.clear();
  if (idx.data) {
    if (!is_integer(idx)) im.fail_node(n, "its indices are not integers");
    const auto dim = x[a.resolved];
    const auto stride = row_major_strides(x)[a.resolved];
    const auto base = element_bases(x, idx.shape, a.resolved);
    for (std::size_t i = 0; i < idx.ints.size(); ++i) {
      const auto v = idx.ints[i];
      if (v < -dim || v >= dim) index_outside(im, n, v, dim);
      a.flat.push_back(static_cast<std::int32_t>(base[i] + (v < 0 ? v + dim : v) * static_cast<std::int64_t>(stride)));
    }
  }
  Value out;
  out.shape = idx.shape;
  return out;
}

Value fold_gather_elements(Importer& im, Node& n) {
  const Value out = infer_gather_elements(im, n);
  im.check_folded(n, out.shape);
  const Value& x = im.in(n, 0);
  const auto vals = values_of(x);
  std::vector<double> r;
  for (auto f : n.attr<GatherElementsAttrs>().flat) r.push_back(vals[static_cast<std::size_t>(f)]);
  return make_constant(out.shape, r, is_integer(x));
}

// X flattened and one gather. Constant indices are flat at compile time;
// indices on the device are made flat there: each through a gather from
// [0, dim) (which checks it and counts a negative one from the end), times
// the axis's stride, plus its position's offset.
void lower_gather_elements(Lowerer& l, const Node& n) {
  const auto& a = n.attr<GatherElementsAttrs>();
  const DType t = l.held_type(n.inputs[0]);
  const auto& xs = l.shape_of(n.inputs[0]);
  const Value& idx = l.g.value(n.inputs[1]);
  std::int64_t flat = -1;
  if (idx.data) {
    flat = l.add_raw(DType::I32, idx.shape, a.flat.data(), a.flat.size() * 4);
  } else {
    const std::int64_t dim = xs[a.resolved];
    std::vector<std::int32_t> range(static_cast<std::size_t>(dim));
    for (std::size_t i = 0; i < range.size(); ++i) range[i] = static_cast<std::int32_t>(i);
    const auto checked = l.dg().add_arena("", DType::I32, idx.shape);
    l.op("gather", n.name,
         {{"x", l.add_raw(DType::I32, {dim}, range.data(), range.size() * 4)},
          {"indices", l.get(n.inputs[1], DType::I32)},
          {"y", checked}},
         {{"axis", 0}});
    const auto s32 = static_cast<std::int32_t>(row_major_strides(xs)[a.resolved]);
    const auto scaled = l.dg().add_arena("", DType::I32, idx.shape);
    l.op("mul", n.name, {{"a", checked}, {"b", l.add_raw(DType::I32, {}, &s32, 4)}, {"y", scaled}});
    std::vector<std::int32_t> base;
    for (auto b : element_bases(xs, idx.shape, a.resolved)) base.push_back(static_cast<std::int32_t>(b));
    flat = l.dg().add_arena("", DType::I32, idx.shape);
    l.op("add", n.name,
         {{"a", scaled}, {"b", l.add_raw(DType::I32, idx.shape, base.data(), base.size() * 4)}, {"y", flat}});
  }
  const auto x = l.dg().add_view(l.dense(l.get(n.inputs[0], t), t, xs), {static_cast<std::int64_t>(elements_of(xs))});
  l.op("gather", n.name, {{"x", x}, {"indices", flat}, {"y", l.produce(n.output, t, l.shape_of(n.output))}},
       {{"axis", 0}});
}

// ---- ScatterElements: Y = data, then each update written (or combined) at
// its index along the axis, in the indices' row-major order.

struct ScatterAttrs {
  std::int64_t axis = 0;                           // as given
  std::string reduction = "none";                  // none, add, mul, max or min (the board's ScatterReduction)
  std::size_t resolved = 0;                        // the axis, resolved by its shape rule
  ScatterReduction mode = ScatterReduction::None;  // the reduction, resolved likewise
  static ScatterAttrs read(const Attrs& a) { return {a.i("axis", 0), a.s("reduction", "none"), 0}; }
};

// A Scatter node's reduction by its name; an unknown one fails the node.
ScatterReduction reduction_of(const Importer& im, const Node& n, const std::string& name) {
  const auto r = parse_enum<ScatterReduction>(name);
  if (!r) im.fail_node(n, "unknown reduction '" + name + "'");
  return *r;
}

// Checks the operands (indices of the data's rank, at most its length but
// along the axis; updates of the indices' shape; constant indices within
// the axis) and resolves the axis; the output has the data's shape.
Value infer_scatter_elements(Importer& im, Node& n) {
  auto& a = n.attr<ScatterAttrs>();
  a.mode = reduction_of(im, n, a.reduction);
  const auto& x = im.in(n, 0).shape;
  const Value& idx = im.in(n, 1);
  const auto& upd = im.in(n, 2).shape;
  const auto rank = static_cast<std::int64_t>(x.size());
  if (rank == 0) im.fail_node(n, "scatters into a scalar");
  const auto axis = im.axis_of(n, a.axis, rank);
  a.resolved = static_cast<std::size_t>(axis);
  if (idx.shape.size() != x.size() || upd != idx.shape)
    im.fail_node(n, "its indices " + dims_text(idx.shape) + " and updates " + dims_text(upd) +
                        " must have one shape, of the data's rank " + std::to_string(rank));
  for (std::size_t d = 0; d < x.size(); ++d)
    if (d != a.resolved && idx.shape[d] > x[d])
      im.fail_node(n, "its indices " + dims_text(idx.shape) + " are longer than the data " + dims_text(x) +
                          " in dimension " + std::to_string(d));
  const auto dim = x[a.resolved];
  if (dim > 0x7FFF'FFFF) im.unsupported(n, "an axis of more than 2^31 - 1 elements");
  if (idx.data) {
    if (!is_integer(idx)) im.fail_node(n, "its indices are not integers");
    for (auto i : idx.ints)
      if (i < -dim || i >= dim) index_outside(im, n, i, dim);
  }
  Value out;
  out.shape = x;
  return out;
}

// An update u combined with what is there, v, in double.
double combined(double v, double u, ScatterReduction r) {
  switch (r) {
    case ScatterReduction::None: return u;
    case ScatterReduction::Add: return v + u;
    case ScatterReduction::Mul: return v * u;
    case ScatterReduction::Max: return std::isnan(v) || std::isnan(u) ? NAN : std::max(v, u);
    case ScatterReduction::Min: return std::isnan(v) || std::isnan(u) ? NAN : std::min(v, u);
  }
  return u;
}

// In double, updates applied in order (integers stay integers).
Value fold_scatter_elements(Importer& im, Node& n) {
  const Value out = infer_scatter_elements(im, n);
  im.check_folded(n, out.shape);
  const auto& a = n.attr<ScatterAttrs>();
  const Value& x = im.in(n, 0);
  const Value& idx = im.in(n, 1);
  if (!idx.data) im.fail_node(n, "its indices are not constants");
  auto r = values_of(x);
  const auto upd = values_of(im.in(n, 2));
  const auto xst = row_major_strides(x.shape), ist = row_major_strides(idx.shape);
  const auto dim = x.shape[a.resolved];
  for (std::size_t j = 0; j < idx.ints.size(); ++j) {
    std::int64_t at = 0;
    for (std::size_t d = 0; d < x.shape.size(); ++d) {
      const std::int64_t pos = static_cast<std::int64_t>(j) / ist[d] % idx.shape[d];
      const std::int64_t i = idx.ints[j];
      at += (d == a.resolved ? (i < 0 ? i + dim : i) : pos) * xst[d];
    }
    double& v = r[static_cast<std::size_t>(at)];
    v = combined(v, upd[j], a.mode);
  }
  return make_constant(out.shape, r, is_integer(x));
}

// The board's scatter_elements, in the model's float type, or in i32 where
// the model holds the data as integers.
void lower_scatter_elements(Lowerer& l, const Node& n) {
  const auto& a = n.attr<ScatterAttrs>();
  const DType t = l.held_type(n.inputs[0]);
  l.op("scatter_elements", n.name,
       {{"x", l.get(n.inputs[0], t)},
        {"indices", l.get(n.inputs[1], DType::I32)},
        {"updates", l.get(n.inputs[2], t)},
        {"y", l.produce(n.output, t, l.shape_of(n.output))}},
       {{"axis", a.resolved}, {"reduction", to_string(a.mode)}});
}

// ---- ScatterND: Y = data, then each update (a slice of the data's
// dimensions after the k indexed) written, or combined, at the position its
// index tuple names, in the tuples' row-major order. On the board: the
// data viewed as [rows, data[k:]..] and one scatter_elements along the
// rows, each tuple's row (GatherND's) repeated along the slice.

struct ScatterNdAttrs {
  std::string reduction = "none";
  ScatterReduction mode = ScatterReduction::None;  // the reduction, resolved by the shape rule
  std::size_t k = 0;                               // the tuples' length: indices' last dimension
  std::vector<std::int32_t> rows;                  // constant indices: each tuple's row (flat_rows)
  static ScatterNdAttrs read(const Attrs& a) { return {a.s("reduction", "none"), ScatterReduction::None, 0, {}}; }
};

// Checks the operands: indices [tuples.., k] with 1 <= k <= the data's
// rank, updates [tuples.., data[k:]..], constant tuples within the data.
Value infer_scatter_nd(Importer& im, Node& n) {
  auto& a = n.attr<ScatterNdAttrs>();
  a.mode = reduction_of(im, n, a.reduction);
  const auto& x = im.in(n, 0).shape;
  const Value& idx = im.in(n, 1);
  const auto& upd = im.in(n, 2).shape;
  if (x.empty() || idx.shape.empty()) im.fail_node(n, "its data and indices must have rank 1 or more");
  const std::int64_t k = idx.shape.back();
  if (k < 1 || k > static_cast<std::int64_t>(x.size()))
    im.fail_node(n,
                 "index tuples of length " + std::to_string(k) + " into " + std::to_string(x.size()) + " dimensions");
  a.k = static_cast<std::size_t>(k);
  std::vector<std::int64_t> want(idx.shape.begin(), idx.shape.end() - 1);
  want.insert(want.end(), x.begin() + k, x.end());
  if (upd != want)
    im.fail_node(n, "its updates " + dims_text(upd) + " are not " + dims_text(want) +
                        " (the indices' tuples, then the data's dimensions after the indexed ones)");
  std::int64_t rows = 1;
  for (std::size_t d = 0; d < a.k; ++d) rows *= x[d];
  if (rows > 0x7FFF'FFFF) im.unsupported(n, "more than 2^31 - 1 index tuples' worth of data rows");
  if (idx.data) {
    if (!is_integer(idx)) im.fail_node(n, "its indices are not integers");
    a.rows.clear();
    for (auto row : flat_rows(im, n, x, idx, 0, a.k)) a.rows.push_back(static_cast<std::int32_t>(row));
  }
  Value out;
  out.shape = x;
  return out;
}

Value fold_scatter_nd(Importer& im, Node& n) {
  const Value out = infer_scatter_nd(im, n);
  im.check_folded(n, out.shape);
  const auto& a = n.attr<ScatterNdAttrs>();
  auto r = values_of(im.in(n, 0));
  const auto upd = values_of(im.in(n, 2));
  std::size_t inner = 1;
  for (std::size_t d = a.k; d < out.shape.size(); ++d) inner *= static_cast<std::size_t>(out.shape[d]);
  for (std::size_t t = 0; t < a.rows.size(); ++t)
    for (std::size_t i = 0; i < inner; ++i) {
      double& v = r[static_cast<std::size_t>(a.rows[t]) * inner + i];
      v = combined(v, upd[t * inner + i], a.mode);
    }
  return make_constant(out.shape, r, is_integer(im.in(n, 0)));
}

void lower_scatter_nd(Lowerer& l, const Node& n) {
  const auto& a = n.attr<ScatterNdAttrs>();
  const DType t = l.held_type(n.inputs[0]);
  const auto& xs = l.shape_of(n.inputs[0]);
  const Value& idx = l.g.value(n.inputs[1]);
  const std::vector<std::int64_t> tuples(idx.shape.begin(), idx.shape.end() - 1);
  std::vector<std::int64_t> view{1}, updates{static_cast<std::int64_t>(elements_of(tuples))}, along{1};
  for (std::size_t d = 0; d < a.k; ++d) view[0] *= xs[d];
  view.insert(view.end(), xs.begin() + static_cast<std::ptrdiff_t>(a.k), xs.end());
  updates.insert(updates.end(), view.begin() + 1, view.end());
  along.resize(view.size(), 0);  // each tuple's row repeated along its slice
  std::int64_t rows;
  if (idx.data) {  // the rows, each repeated along its slice
    const auto slice = static_cast<std::size_t>(elements_of(updates)) / std::max<std::size_t>(a.rows.size(), 1);
    std::vector<std::int32_t> each(a.rows.size() * slice);
    for (std::size_t i = 0; i < each.size(); ++i) each[i] = a.rows[i / slice];
    rows = l.add_raw(DType::I32, updates, each.data(), each.size() * 4);
  } else {
    rows = l.dg().add_subview(device_rows(l, n, n.inputs[1], xs, 0, a.k), updates, along, 0);
  }
  const auto y = l.produce(n.output, t, xs);
  l.op("scatter_elements", n.name,
       {{"x", l.dg().add_view(l.dense(l.get(n.inputs[0], t), t, xs), view)},
        {"indices", rows},
        {"updates", l.dg().add_view(l.dense(l.get(n.inputs[2], t), t, l.shape_of(n.inputs[2])), updates)},
        {"y", l.dg().add_view(y, view)}},
       {{"axis", 0}, {"reduction", to_string(a.mode)}});
}

OpHandler scatter_handler(std::string_view op, OpsetRange opsets) {
  return {.ops = {op},
          .opsets = opsets,
          .read = read_attrs<ScatterAttrs>,
          .infer = infer_scatter_elements,
          .fold = fold_scatter_elements,
          .folds = Fold::IfConstant,
          .lower = lower_scatter_elements,
          .writes_fresh = true};
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
      {.ops = {"GatherND"},
       .opsets = {.first = 11, .refusal = "GatherND before opset 11"},
       .read = read_attrs<GatherNdAttrs>,
       .infer = infer_gather_nd,
       .fold = fold_gather_nd,
       .folds = Fold::IfConstant,
       .lower = lower_gather_nd},
      {.ops = {"GatherElements"},
       .opsets = {.first = 11, .refusal = "GatherElements before opset 11"},
       .read = read_attrs<GatherElementsAttrs>,
       .infer = infer_gather_elements,
       .fold = fold_gather_elements,
       .folds = Fold::IfConstant,
       .lower = lower_gather_elements},
      scatter_handler("ScatterElements", {.first = 11, .refusal = "ScatterElements before opset 11"}),
      // Its name before opset 11, without reductions.
      scatter_handler(
          "Scatter",
          {.first = 9, .last = 10, .refusal = "Scatter at opset {opset}; from opset 11 it is ScatterElements"}),
      {.ops = {"ScatterND"},
       .opsets = {.first = 11, .refusal = "ScatterND before opset 11"},
       .read = read_attrs<ScatterNdAttrs>,
       .infer = infer_scatter_nd,
       .fold = fold_scatter_nd,
       .folds = Fold::IfConstant,
       .lower = lower_scatter_nd,
       .writes_fresh = true},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
