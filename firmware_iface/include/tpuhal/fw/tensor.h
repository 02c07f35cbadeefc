// Tensor operations (interface 1.1): the parameter block of kTensorOp.
//
// A tensor op's parameters do not fit a descriptor. They form a parameter
// block: an OpHeader, then the op's tensors (TensorRef, fixed roles per op
// kind, listed in op_kinds.inc), then the op's attributes. The block
// travels either inline in the ring, in the slots right after the kTensorOp
// descriptor (args: 0, block bytes), or in device memory (args: address,
// block bytes) — which is how a recorded program carries it.
//
// Broadcasting is expressed with strides: an input whose dimension is
// broadcast has stride 0 there, so every elementwise-style op sees inputs
// already in the output's shape. Outputs never have stride 0 and never
// overlap inputs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tpuhal::fw {

enum class DType : std::uint32_t {
  kNone = 0,  // an absent optional tensor
  kF32 = 1,
  kF16 = 2,
  kBF16 = 3,
  kI8 = 4,
  kU8 = 5,
  kI32 = 6,
};
inline constexpr std::uint32_t kMaxDType = 6;
constexpr std::uint32_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kF16:
    case DType::kBF16: return 2;
    case DType::kI8:
    case DType::kU8: return 1;
    case DType::kNone: break;
  }
  return 0;
}
const char* to_string(DType t) noexcept;

inline constexpr std::uint32_t kMaxRank = 6;
inline constexpr std::uint64_t kMaxDim = 1ull << 32;  // every dimension is below this

// One tensor: the element at index (0, ..., 0) is at `address`; element
// (i0, ..., ik) at address + sum(i_j * strides[j]) * dtype_size.
struct TensorRef {
  std::uint64_t address;
  std::uint32_t dtype;              // DType
  std::uint32_t rank;               // 0..kMaxRank; a scalar has rank 0
  std::uint64_t shape[kMaxRank];    // entries past `rank` must be zero
  std::uint64_t strides[kMaxRank];  // in elements; entries past `rank` zero
  std::uint64_t reserved[2];        // zero
};
static_assert(sizeof(TensorRef) == 128);

// The op kinds and their wire codes: one line each in op_kinds.inc, which
// also gives each kind's tensors (fixed roles, output last, see the table
// there and docs/ops.md) and its attribute struct (kOpKinds, at the end).
enum class OpKind : std::uint32_t {
  kInvalid = 0,
#define TPUHAL_FW_OP(Name, code, name, tensors, optional, written, Attrs, minor) k##Name = code,
#include "tpuhal/fw/op_kinds.inc"
#undef TPUHAL_FW_OP
};
inline constexpr std::uint32_t kMaxOpKind = 0
#define TPUHAL_FW_OP(Name, code, name, tensors, optional, written, Attrs, minor) +1
#include "tpuhal/fw/op_kinds.inc"
#undef TPUHAL_FW_OP
    ;
const char* to_string(OpKind k) noexcept;

// Tensors per op kind, in order; optional ones may be DType::kNone.
inline constexpr std::uint32_t kMaxOpTensors = 10;
std::uint32_t op_tensor_count(OpKind k) noexcept;

inline constexpr std::uint32_t kOpMagic = 0x3150'4F54;  // "TOP1"
struct OpHeader {
  std::uint32_t magic;        // kOpMagic
  std::uint32_t kind;         // OpKind
  std::uint32_t num_tensors;  // op_tensor_count(kind)
  std::uint32_t attr_bytes;   // sizeof the kind's attribute struct
  std::uint32_t flags;        // OpFlag bits (since 1.18; zero before)
  std::uint32_t reserved0;    // zero
  std::uint64_t reserved1;    // zero
};
static_assert(sizeof(OpHeader) == 32);

// OpHeader::flags. They say how the program places the op, never what it
// computes: a board may ignore them, and only the timing model reads them.
//   kOpGlobal  the op runs on its own, DDR to DDR, outside any group of ops
//              whose activations stay in local memory: how a board's
//              compiler runs what it cannot tile, such as a model's permute
//              (TPU-MLIR runs Permute on the BM1684X only as a global op).
//              Every tensor streams from device memory, and a permuted read
//              moves one element per DRAM burst (timing.h).
inline constexpr std::uint32_t kOpGlobal = 1u << 0;
inline constexpr std::uint32_t kOpFlagsKnown = kOpGlobal;

// The enumerations the attribute structs below carry as uint32 words
// (Activation, Layout, PoolKind, ElementwiseOp, ResizeMode, CoordinateMode,
// NearestMode, ColorFormat), kMax<Enum> for each, and ElementwiseOp's
// is_binary, is_comparison and is_logical: generated from schema/ops.py.
#include "tpuhal/fw/op_enums.inc"

// Quantize / Dequantize: the axis Scale and ZeroPoint vary along is implied
// by their strides; nothing else is needed.
struct QuantAttrs {
  std::uint32_t reserved[4];
};
static_assert(sizeof(QuantAttrs) == 16);

// The other attribute structs (ElementwiseAttrs, MatMulAttrs, ConvAttrs,
// PoolAttrs, ResizeAttrs, ColorConvertAttrs, SoftmaxAttrs, TopKAttrs, ...),
// from the op schema (ATTR_STRUCTS in schema/ops.py).
#include "tpuhal/fw/op_attrs.inc"

inline constexpr std::uint32_t kMaxParamBytes = 4096;

// What the interface fixes for each op kind, indexed by its code (entry 0
// is kInvalid): op_kinds.inc, expanded.
struct OpKindInfo {
  OpKind kind;
  const char* name;
  std::uint32_t tensors;     // TensorRefs after the header, output last
  std::uint32_t optional;    // bit i: tensor i may be absent
  std::uint32_t written;     // bit i: the op writes tensor i (the last, and any other output)
  std::uint32_t attr_bytes;  // sizeof the kind's attribute struct
  std::uint16_t minor;       // the interface minor the kind came in
};
inline constexpr OpKindInfo kOpKinds[kMaxOpKind + 1] = {
    {OpKind::kInvalid, "invalid", 0, 0, 0, 0, 0},
#define TPUHAL_FW_OP(Name, code, name, tensors, optional, written, Attrs, minor) \
  {OpKind::k##Name, name, tensors, optional, written, sizeof(Attrs), minor},
#include "tpuhal/fw/op_kinds.inc"
#undef TPUHAL_FW_OP
};
// The lines are in code order, one apart, and no kind has more tensors
// than a block can carry, an optional last output, or a written tensor it
// does not have.
static_assert(
    [] {
      for (std::uint32_t i = 0; i <= kMaxOpKind; ++i) {
        const OpKindInfo& k = kOpKinds[i];
        if (static_cast<std::uint32_t>(k.kind) != i || k.tensors > kMaxOpTensors) return false;
        if (i != 0 && (k.tensors == 0 || (k.optional >> (k.tensors - 1)) != 0)) return false;
        if (i != 0 && ((k.written >> (k.tensors - 1)) != 1)) return false;
      }
      return true;
    }(),
    "op_kinds.inc: codes must run 1, 2, 3, ... and each kind have 1 to kMaxOpTensors tensors, the last not optional "
    "and written");

// kOpKinds[k], or kOpKinds[0] (kInvalid) for a code no kind has.
constexpr const OpKindInfo& op_kind_info(OpKind k) noexcept {
  const auto i = static_cast<std::uint32_t>(k);
  return kOpKinds[i <= kMaxOpKind ? i : 0];
}

}  // namespace tpuhal::fw
