// Shape computations that exist only to make constants, evaluated at compile
// time (every input must be a constant): ConstantOfShape, Range, ScatterND
// (the attention masks Swin Transformer builds from shapes).
#include <algorithm>
#include <cmath>

#include "onnx/importer.hpp"

namespace tpuhal::rt::detail {
namespace {

struct ConstantOfShapeAttrs {
  const onnx::TensorProto* value = nullptr;  // into the node, while it is folded; null: 0.0
  static ConstantOfShapeAttrs read(const Attrs& a) {
    const auto* v = a.find("value");
    return {v ? &v->t() : nullptr};
  }
};

Value fold_constant_of_shape(Importer& im, Node& n) {
  const Value& shape = im.in(n, 0);
  if (!is_integer(shape)) im.fail_node(n, "its shape is not integers");
  for (auto d : shape.ints)
    if (d < 0 || d > (std::int64_t{1} << 31)) im.fail_node(n, "dimension " + std::to_string(d));
  Value fill = make_constant({}, {0.0}, false);
  if (const auto* v = n.attr<ConstantOfShapeAttrs>().value) fill = im.tensor_value(*v, "node '" + n.name + "' value");
  if (fill.elements() != 1) im.fail_node(n, "its value is not one element");
  im.check_folded(n, shape.ints);
  return make_constant(shape.ints, std::vector<double>(elements_of(shape.ints), values_of(fill)[0]), is_integer(fill));
}

Value fold_range(Importer& im, Node& n) {
  const auto start = values_of(im.in(n, 0)), limit = values_of(im.in(n, 1)), delta = values_of(im.in(n, 2));
  if (start.size() != 1 || limit.size() != 1 || delta.size() != 1) im.fail_node(n, "its inputs are not scalars");
  if (delta[0] == 0) im.fail_node(n, "a delta of 0");
  const double count = std::max(std::ceil((limit[0] - start[0]) / delta[0]), 0.0);
  if (!(count * 4 <= static_cast<double>(im.constant_limit)))
    im.check_folded(n, {count < 0x1p62 ? static_cast<std::int64_t>(count) : std::int64_t{1} << 62});
  std::vector<double> r(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = start[0] + static_cast<double>(i) * delta[0];
  return make_constant({static_cast<std::int64_t>(r.size())}, r,
                       is_integer(im.in(n, 0)) && is_integer(im.in(n, 1)) && is_integer(im.in(n, 2)));
}

struct ScatterNdAttrs {
  std::string reduction = "none";
  static ScatterNdAttrs read(const Attrs& a) { return {a.s("reduction", "none")}; }
};

Value fold_scatter_nd(Importer& im, Node& n) {
  const Value &data = im.in(n, 0), &idx = im.in(n, 1), &upd = im.in(n, 2);
  if (!is_integer(idx) || idx.shape.empty()) im.fail_node(n, "its indices are not an integer tensor");
  const std::string& reduction = n.attr<ScatterNdAttrs>().reduction;
  if (reduction != "none") im.unsupported(n, "reduction '" + reduction + "'");
  const auto k = static_cast<std::size_t>(idx.shape.back());
  if (k == 0 || k > data.shape.size()) im.fail_node(n, "index tuples of " + std::to_string(k));
  std::uint64_t slab = 1;
  for (std::size_t d = k; d < data.shape.size(); ++d) slab *= static_cast<std::uint64_t>(data.shape[d]);
  const std::uint64_t tuples = idx.elements() / k;
  if (upd.elements() != tuples * slab) im.fail_node(n, "updates of " + std::to_string(upd.elements()) + " elements");
  auto r = values_of(data);
  const auto uv = values_of(upd);
  const auto st = row_major_strides(data.shape);
  for (std::uint64_t t = 0; t < tuples; ++t) {
    std::int64_t at = 0;
    for (std::size_t d = 0; d < k; ++d) {
      std::int64_t i = idx.ints[t * k + d];
      const auto dim = data.shape[d];
      if (i < -dim || i >= dim)
        im.fail_node(n, "index " + std::to_string(i) + " for a dimension of " + std::to_string(dim));
      at += (i < 0 ? i + dim : i) * st[d];
    }
    std::copy_n(uv.begin() + static_cast<std::ptrdiff_t>(t * slab), slab, r.begin() + static_cast<std::ptrdiff_t>(at));
  }
  return make_constant(data.shape, r, is_integer(data) && is_integer(upd));
}

}  // namespace

std::span<const OpHandler> generate_handlers() {
  static const OpHandler h[] = {
      {.ops = {"ConstantOfShape"},
       .read = read_attrs<ConstantOfShapeAttrs>,
       .fold = fold_constant_of_shape,
       .folds = Fold::ConstantsOnly},
      {.ops = {"Range"}, .fold = fold_range, .folds = Fold::ConstantsOnly},
      {.ops = {"ScatterND"}, .read = read_attrs<ScatterNdAttrs>, .fold = fold_scatter_nd, .folds = Fold::ConstantsOnly},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
