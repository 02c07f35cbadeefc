// The typed attributes of the ops that the passes (passes.hpp) rewrite or
// read besides their own handler; every other op's struct stays in its
// family's file.
#pragma once

#include <cstdint>
#include <optional>

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

}  // namespace tpuhal::rt::detail
