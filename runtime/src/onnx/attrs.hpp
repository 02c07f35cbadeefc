// The typed attributes of the ops that the passes (passes.hpp) rewrite or
// read besides their own handler; every other op's struct stays in its
// family's file.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "onnx/handler.hpp"

namespace tpuhal::rt::detail {

// Conv and ConvTranspose (and BatchNormalization rewritten as a Conv).
using ConvAttrs = onnx_attrs::WindowAttrs;

struct BatchNormAttrs {
  float epsilon = 1e-5f;
  static BatchNormAttrs read(const Attrs& a) { return {a.f("epsilon", 1e-5f)}; }
};

struct ConcatAttrs {
  std::optional<std::int64_t> axis;  // as given
  std::int64_t resolved = 0;         // made non-negative by its shape rule
  static ConcatAttrs read(const Attrs& a) { return {a.opt_i("axis"), 0}; }
};

// Slice (and Split, made Slices); a channel shuffle's lowering reads the
// Slices after it (shape.cpp).
struct SliceAttrs {
  std::vector<std::int64_t> starts, ends;  // the attributes (the inputs from opset 10)
  // Resolved by its shape rule: the start and step per dimension.
  std::vector<std::int64_t> lo, step;
  static SliceAttrs read(const Attrs& a) { return {a.ints("starts"), a.ints("ends"), {}, {}}; }
};

}  // namespace tpuhal::rt::detail
