// Folding elementwise ops of two constants (arithmetic, comparisons,
// logic): the operands broadcast, the result's size checked against the
// constant limit, then each element.
#pragma once

#include "onnx/importer.hpp"

namespace tpuhal::rt::detail {

struct BinaryFold {
  const Value& x;
  const Value& y;
  std::vector<std::int64_t> shape;  // broadcast
  bool integer = false;             // both operands integers
};

// The output of an elementwise op of two inputs: their broadcast shape.
inline Value infer_binary(Importer& im, Node& n) {
  Value out;
  out.shape = im.broadcast(n, im.in(n, 0).shape, im.in(n, 1).shape);
  return out;
}

inline BinaryFold binary_operands(Importer& im, Node& n) {
  const Value& x = im.in(n, 0);
  const Value& y = im.in(n, 1);
  BinaryFold b{x, y, im.broadcast(n, x.shape, y.shape)};
  im.check_folded(n, b.shape);
  b.integer = is_integer(x) && is_integer(y);
  return b;
}

// `f(p, q)` of each pair of broadcast elements; integers if both operands
// are, or if the result is `boolean` (1 or 0).
template <typename F>
Value fold_each(const BinaryFold& b, bool boolean, F f) {
  const auto xv = values_of(b.x), yv = values_of(b.y);
  std::vector<double> r(elements_of(b.shape));
  for (std::uint64_t i = 0; i < r.size(); ++i)
    r[i] = f(xv[broadcast_index(b.shape, b.x.shape, i)], yv[broadcast_index(b.shape, b.y.shape, i)]);
  return make_constant(b.shape, r, b.integer || boolean);
}

}  // namespace tpuhal::rt::detail
