// The driver-side description of a tensor op: what the HAL hands a backend
// after checking every operand (hal/src/ops.cpp).
//
// Conventions every backend can rely on:
// - Tensors come in a fixed order per kind (op_kinds.inc gives each kind's
//   roles); absent optional ones have buffer == nullptr.
// - Broadcasting is already expressed with strides: an input broadcast
//   along a dimension has stride 0 there, and inputs of elementwise-style
//   ops (and the scales and zero points of quantized ops) have exactly the
//   shape of the tensor they apply to.
// - The output (always the last tensor) has no zero strides and overlaps no
//   input.
// - The attributes are the alternative op_kinds.inc names for the kind.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "tpuhal/ops.hpp"
#include "tpuhal/types.hpp"

namespace tpuhal::driver {

class BufferBackend;

struct TensorArg {
  BufferBackend* buffer = nullptr;  // nullptr: an absent optional tensor
  std::uint64_t offset = 0;         // bytes into the buffer
  DType dtype = DType::F32;
  std::uint32_t rank = 0;
  std::array<std::uint64_t, kMaxRank> shape{};
  std::array<std::uint64_t, kMaxRank> strides{};  // elements
  bool present() const noexcept { return buffer != nullptr; }
};

enum class OpKind : std::uint8_t {
#define TPUHAL_OP_KIND(Name, name, tensors, written, Attrs, minor) Name,
#include "tpuhal/driver/op_kinds.inc"
#undef TPUHAL_OP_KIND
};

// ElementwiseOp and its names, and introduced_in(): the interface minor each
// value of an attribute enumeration came in. Generated from schema/ops.py.
#include "tpuhal/driver/op_enums.inc"

struct NoAttrs {};
// The other attribute structs (ElementwiseAttrs, MatMulAttrs, ConvAttrs,
// PoolAttrs, ResizeAttrs, ColorConvertAttrs, SoftmaxAttrs, ...) and
// OpAttrs, from the op schema (ATTR_STRUCTS in schema/ops.py).
#include "tpuhal/driver/op_attrs.inc"

struct OpDesc {
  OpKind kind = OpKind::MatMul;
  std::string name;  // for messages: "matmul", "qlinear_conv", ...
  std::vector<TensorArg> tensors;
  OpAttrs attrs;
  bool global = false;  // Op::set_global: run on its own, DDR to DDR (a placement; the result is the same)
};

// What each kind is (op_kinds.inc), indexed by the kind.
struct OpKindInfo {
  OpKind kind;
  const char* name;
  std::uint32_t tensors;    // OpDesc::tensors, output last
  std::uint32_t written;    // bit i: the op writes tensor i (the last, and any other output)
  std::size_t attrs_index;  // the alternative of OpAttrs it carries
  std::uint16_t minor;      // the board interface minor it needs at least
};
namespace op_kind_detail {
template <class T, std::size_t I = 0>
constexpr std::size_t attrs_index() {
  static_assert(I < std::variant_size_v<OpAttrs>, "op_kinds.inc names an attribute struct OpAttrs lacks");
  if constexpr (std::is_same_v<std::variant_alternative_t<I, OpAttrs>, T>)
    return I;
  else
    return attrs_index<T, I + 1>();
}
}  // namespace op_kind_detail
inline constexpr OpKindInfo kOpKinds[] = {
#define TPUHAL_OP_KIND(Name, name, tensors, written, Attrs, minor) \
  {OpKind::Name, name, tensors, written, op_kind_detail::attrs_index<Attrs>(), minor},
#include "tpuhal/driver/op_kinds.inc"
#undef TPUHAL_OP_KIND
};
inline constexpr std::size_t kOpKindCount = std::size(kOpKinds);
static_assert([] {
  for (std::size_t i = 0; i < kOpKindCount; ++i)
    if (static_cast<std::size_t>(kOpKinds[i].kind) != i || kOpKinds[i].tensors == 0) return false;
  return true;
}());

constexpr const OpKindInfo& op_kind_info(OpKind k) noexcept { return kOpKinds[static_cast<std::size_t>(k)]; }
// "matmul", "conv2d", ... (the kind; OpDesc::name is the op the user built).
constexpr const char* to_string(OpKind k) noexcept { return op_kind_info(k).name; }
constexpr std::uint32_t op_tensor_count(OpKind k) noexcept { return op_kind_info(k).tensors; }

}  // namespace tpuhal::driver
