// Shape computations that exist only to make constants, evaluated at compile
// time (every input must be a constant): ConstantOfShape, Range (the
// attention masks Swin Transformer builds from shapes, with ScatterND,
// gather.cpp).
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

}  // namespace

std::span<const OpHandler> generate_handlers() {
  static const OpHandler h[] = {
      {.ops = {"ConstantOfShape"},
       .read = read_attrs<ConstantOfShapeAttrs>,
       .fold = fold_constant_of_shape,
       .folds = Fold::ConstantsOnly},
      {.ops = {"Range"}, .fold = fold_range, .folds = Fold::ConstantsOnly},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
