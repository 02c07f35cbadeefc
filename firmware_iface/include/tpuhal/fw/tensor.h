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
#define TPUHAL_FW_OP(Name, code, name, tensors, optional, Attrs) k##Name = code,
#include "tpuhal/fw/op_kinds.inc"
#undef TPUHAL_FW_OP
};
inline constexpr std::uint32_t kMaxOpKind = 0
#define TPUHAL_FW_OP(Name, code, name, tensors, optional, Attrs) +1
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
  std::uint64_t reserved[2];  // zero
};
static_assert(sizeof(OpHeader) == 32);

// Activation fused after matmul and convolution (and the unary maps).
enum class Activation : std::uint32_t {
  kNone = 0,
  kRelu = 1,
  kClip = 2,  // clamp to [alpha, beta]; relu6 is clip(0, 6)
  kSigmoid = 3,
  kSilu = 4,       // x * sigmoid(x)
  kLeakyRelu = 5,  // x < 0 ? alpha * x : x
  kTanh = 6,
  kHardSigmoid = 7,  // clamp(alpha * x + beta, 0, 1)
  kHardSwish = 8,    // x * clamp(alpha * x + beta, 0, 1) (interface 1.4)
};
inline constexpr std::uint32_t kMaxActivation = 8;

struct MatMulAttrs {
  std::uint32_t trans_a, trans_b;  // 0 or 1: use the last two dims transposed
  float alpha, beta;               // beta scales C; C absent: beta ignored
  std::uint32_t activation;        // Activation
  float act_alpha, act_beta;
  std::uint32_t reserved;
};
static_assert(sizeof(MatMulAttrs) == 32);

enum class Layout : std::uint32_t { kNCHW = 0, kNHWC = 1 };

// Convolution geometry: pads are top, left, bottom, right. A transposed
// convolution (kConvTranspose2d) takes W as [Cin, Cout/groups, kh, kw] and
// pads crop its output.
struct ConvAttrs {
  std::uint32_t layout;  // Layout of X and Y; W is always [Cout, Cin/groups, kh, kw]
  std::uint32_t groups;
  std::uint32_t stride[2];
  std::uint32_t dilation[2];
  std::uint32_t pad[4];
  std::uint32_t activation;  // Activation (float conv only)
  float act_alpha, act_beta;
  std::uint32_t reserved[3];
};
static_assert(sizeof(ConvAttrs) == 64);

enum class PoolKind : std::uint32_t { kMax = 0, kAverage = 1 };
struct PoolAttrs {
  std::uint32_t kind;    // PoolKind
  std::uint32_t layout;  // Layout
  std::uint32_t kernel[2];
  std::uint32_t stride[2];
  std::uint32_t dilation[2];
  std::uint32_t pad[4];
  std::uint32_t ceil_mode;          // output size rounds up
  std::uint32_t count_include_pad;  // average: divide by the full window
  std::uint32_t reserved[2];
};
static_assert(sizeof(PoolAttrs) == 64);

enum class ElementwiseOp : std::uint32_t {
  kIdentity = 0,  // Y = A: copy, cast (A and Y dtypes differ), transpose (A strided)
  kAdd = 1,
  kSub = 2,
  kMul = 3,
  kDiv = 4,
  kMax = 5,
  kMin = 6,
  kActivation = 7,  // Y = activation(A), `activation` below
  kAbs = 8,
  kNeg = 9,
  kExp = 10,
  kLog = 11,
  kSqrt = 12,
  kErf = 13,  // interface 1.3
  // Interface 1.7: comparisons, A and B of one dtype and Y u8 holding 1 or
  // 0 (a NaN compares false: unequal, neither less nor greater), and logic
  // on u8 operands (nonzero is true) into u8 1 or 0.
  kEqual = 14,
  kLess = 15,
  kLessOrEqual = 16,
  kGreater = 17,
  kGreaterOrEqual = 18,
  kAnd = 19,
  kOr = 20,
  kXor = 21,
  kNot = 22,
};
inline constexpr std::uint32_t kMaxElementwiseOp = 22;
constexpr bool is_comparison(ElementwiseOp op) {
  return op >= ElementwiseOp::kEqual && op <= ElementwiseOp::kGreaterOrEqual;
}
constexpr bool is_logical(ElementwiseOp op) { return op >= ElementwiseOp::kAnd && op <= ElementwiseOp::kNot; }
constexpr bool is_binary(ElementwiseOp op) {
  return (op >= ElementwiseOp::kAdd && op <= ElementwiseOp::kMin) ||
         (op >= ElementwiseOp::kEqual && op <= ElementwiseOp::kXor);
}

struct ElementwiseAttrs {
  std::uint32_t op;          // ElementwiseOp
  std::uint32_t activation;  // Activation, for kActivation
  float alpha, beta;         // the activation's parameters
};
static_assert(sizeof(ElementwiseAttrs) == 16);

struct SoftmaxAttrs {
  std::uint32_t axis;  // < rank
  std::uint32_t log;   // 1: log-softmax
  std::uint32_t reserved[2];
};
static_assert(sizeof(SoftmaxAttrs) == 16);

// Quantize / Dequantize: the axis Scale and ZeroPoint vary along is implied
// by their strides; nothing else is needed.
struct QuantAttrs {
  std::uint32_t reserved[4];
};
static_assert(sizeof(QuantAttrs) == 16);

enum class ResizeMode : std::uint32_t { kNearest = 0, kLinear = 1 };
enum class CoordinateMode : std::uint32_t {
  kHalfPixel = 0,
  kAsymmetric = 1,
  kAlignCorners = 2,
  kPytorchHalfPixel = 3,
  kTfHalfPixelForNn = 4,
};
enum class NearestMode : std::uint32_t {
  kRoundPreferFloor = 0,
  kRoundPreferCeil = 1,
  kFloor = 2,
  kCeil = 3,
};
// Resizes the H and W dimensions of a 4-D tensor (N and C are kept).
struct ResizeAttrs {
  std::uint32_t mode;        // ResizeMode
  std::uint32_t coordinate;  // CoordinateMode
  std::uint32_t nearest;     // NearestMode
  std::uint32_t layout;      // Layout
  float scale[2];            // output/input along H and W (> 0)
  std::uint32_t reserved[2];
};
static_assert(sizeof(ResizeAttrs) == 32);

// TopK: Indices (I32) has X's shape but k (1 <= k <= X's length) along
// `axis`; Values, when present, Indices' shape and X's dtype. Order: largest
// first (smallest with largest == 0), NaN before every number either way,
// ties by index, lower first (higher first with last_index == 1).
struct TopKAttrs {
  std::uint32_t axis;        // < rank
  std::uint32_t largest;     // 0 or 1
  std::uint32_t last_index;  // 0 or 1
  std::uint32_t reserved;
};
static_assert(sizeof(TopKAttrs) == 16);

enum class ColorFormat : std::uint32_t { kNV12 = 0, kI420 = 1 };
// YUV (BT.601, limited range) -> RGB in [0, 255], then per channel
// (value - mean) * scale. Luma is [H, W]; NV12 chroma is [H/2, W/2, 2];
// I420 chroma U and V are [H/2, W/2] each; Y is [3, H, W] (planar RGB).
struct ColorConvertAttrs {
  std::uint32_t format;  // ColorFormat
  std::uint32_t reserved0;
  float mean[3];
  float scale[3];
  std::uint32_t reserved[6];
};
static_assert(sizeof(ColorConvertAttrs) == 56);

inline constexpr std::uint32_t kMaxParamBytes = 4096;

// What the interface fixes for each op kind, indexed by its code (entry 0
// is kInvalid): op_kinds.inc, expanded.
struct OpKindInfo {
  OpKind kind;
  const char* name;
  std::uint32_t tensors;     // TensorRefs after the header, output last
  std::uint32_t optional;    // bit i: tensor i may be absent
  std::uint32_t attr_bytes;  // sizeof the kind's attribute struct
};
inline constexpr OpKindInfo kOpKinds[kMaxOpKind + 1] = {
    {OpKind::kInvalid, "invalid", 0, 0, 0},
#define TPUHAL_FW_OP(Name, code, name, tensors, optional, Attrs) \
  {OpKind::k##Name, name, tensors, optional, sizeof(Attrs)},
#include "tpuhal/fw/op_kinds.inc"
#undef TPUHAL_FW_OP
};
// The lines are in code order, one apart, and no kind has more tensors
// than a block can carry or an optional output.
static_assert(
    [] {
      for (std::uint32_t i = 0; i <= kMaxOpKind; ++i) {
        const OpKindInfo& k = kOpKinds[i];
        if (static_cast<std::uint32_t>(k.kind) != i || k.tensors > kMaxOpTensors) return false;
        if (i != 0 && (k.tensors == 0 || (k.optional >> (k.tensors - 1)) != 0)) return false;
      }
      return true;
    }(),
    "op_kinds.inc: codes must run 1, 2, 3, ... and each kind have 1 to kMaxOpTensors tensors, the last not optional");

// kOpKinds[k], or kOpKinds[0] (kInvalid) for a code no kind has.
constexpr const OpKindInfo& op_kind_info(OpKind k) noexcept {
  const auto i = static_cast<std::uint32_t>(k);
  return kOpKinds[i <= kMaxOpKind ? i : 0];
}

}  // namespace tpuhal::fw
