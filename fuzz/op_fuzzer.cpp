// fw::decode_op: a tensor op's parameter block (fw/tensor.h), as the board
// reads it, inline after a kTensorOp descriptor or from memory, before its
// tensor engine touches any tensor.
//
// Input: the block's bytes (OpHeader, TensorRefs, attributes). Properties,
// checked here independently of tensor.cpp, from the rules in fw/tensor.h and fw/op_attrs.inc,
// docs/firmware-interface.md and docs/ops.md:
//   - a block outside [32, 4096] bytes, with a bad magic, kind, tensor count,
//     attribute size or a non-zero reserved header word is refused;
//   - a decoded block carries the kind, tensors and attributes of the input
//     unchanged, in the kind's attribute struct;
//   - every tensor of a decoded block is well formed (dtype, rank, dimensions
//     below 2^32, zero tails and reserved words; absent only where the role
//     is optional, and then all zero), and its extent is the byte span of its
//     elements (computed here in 128-bit arithmetic) and does not wrap;
//   - the output is present, never writes an element twice (brute force for
//     up to 4096 elements) and does not overlap any input's bytes;
//   - shapes obey the op's rules (matmul, convolution and pooling output
//     sizes, elementwise, softmax, quantisation, resize, colour conversion);
//     no pooling window (of the first 4096 along each axis) lies wholly in
//     the padding;
//   - a refusal is a known status naming the header, the op kind, one of the
//     op's tensors or one of its attribute words, and reads as a sentence.
// TPUHAL_FUZZ_VERBOSE=1 prints how each input was judged.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>
#include <type_traits>
#include <variant>
#include <vector>

#include "fuzz_util.h"
#include "tpuhal/fw/command.h"
#include "tpuhal/fw/decode.h"
#include "tpuhal/fw/tensor.h"

// Every op kind has its case in check_rules.
#pragma GCC diagnostic error "-Wswitch"

namespace fw = tpuhal::fw;
__extension__ typedef unsigned __int128 u128;  // extents and addresses without overflow

namespace {

struct KindRule {
  std::uint32_t tensors;
  std::uint32_t optional;  // bit i: tensor i may be absent
  std::uint32_t attr_bytes;
  std::size_t attr_index;  // alternative of fw::OpAttrs
};

// Which alternative of fw::OpAttrs holds T.
template <class T, std::size_t I = 0>
constexpr std::size_t attr_index() {
  if constexpr (std::is_same_v<std::variant_alternative_t<I, fw::OpAttrs>, T>)
    return I;
  else
    return attr_index<T, I + 1>();
}

// The interface's table of tensors per kind and each kind's attribute
// struct (fw/op_kinds.inc); entry 0 is kInvalid.
constexpr KindRule kRules[fw::kMaxOpKind + 1] = {
    {0, 0, 0, 0},
#define TPUHAL_FW_OP(Name, code, name, tensors, optional, written, Attrs, minor) \
  {tensors, optional, sizeof(fw::Attrs), attr_index<fw::Attrs>()},
#include "tpuhal/fw/op_kinds.inc"
#undef TPUHAL_FW_OP
};

constexpr std::size_t kHeader = sizeof(fw::OpHeader);
constexpr std::size_t kRef = sizeof(fw::TensorRef);
constexpr auto kTensorOp = static_cast<std::uint16_t>(fw::Opcode::kTensorOp);

bool is_float(std::uint32_t t) { return t >= 1 && t <= 3; }
bool is_int8(std::uint32_t t) { return t == 4 || t == 5; }
std::uint32_t esize(std::uint32_t t) { return t == 0 ? 0 : t <= 1 || t == 6 ? 4 : t <= 3 ? 2 : 1; }

// Bytes from the address to the end of the last element; 0 when empty.
u128 extent_of(const fw::TensorRef& t) {
  u128 last = 0;
  for (std::uint32_t d = 0; d < t.rank; ++d) {
    if (t.shape[d] == 0) return 0;
    last += u128{t.shape[d] - 1} * t.strides[d];
  }
  return (last + 1) * esize(t.dtype);
}

u128 elements_of(const fw::TensorRef& t) {
  u128 n = 1;
  for (std::uint32_t d = 0; d < t.rank; ++d) n *= t.shape[d];
  return n;
}

bool same_shape(const fw::TensorRef& a, const fw::TensorRef& b) {
  if (a.rank != b.rank) return false;
  for (std::uint32_t d = 0; d < a.rank; ++d)
    if (a.shape[d] != b.shape[d]) return false;
  return true;
}

// Output length of a window along one axis (docs/ops.md): floor or ceil of
// (in + pads - dilation * (k - 1) - 1) / stride, plus one; with ceil a last
// window that would start in the end padding is dropped; 0 if none fits.
// A kernel of size 0 has no taps: no window (the op is then empty).
u128 window_out(u128 in, u128 k, u128 stride, u128 dilation, u128 pad_begin, u128 pad_end, bool ceil) {
  if (k == 0) return 0;
  const u128 padded = in + pad_begin + pad_end, window = dilation * (k - 1) + 1;
  if (padded < window) return 0;
  u128 out = (padded - window) / stride + 1;
  if (ceil && (padded - window) % stride && out * stride < in + pad_begin) ++out;
  return out;
}

// Whether pooling window o along an axis has a tap inside the input.
bool window_has_tap(std::int64_t in, std::int64_t kernel, std::int64_t stride, std::int64_t dilation,
                    std::int64_t pad_begin, std::int64_t o) {
  const std::int64_t start = o * stride - pad_begin;
  const std::int64_t first = start >= 0 ? 0 : (-start + dilation - 1) / dilation;  // first tap >= 0
  return first < kernel && start + first * dilation < in;
}

#define RULE(cond) FUZZ_CHECK(cond, "%s accepted", fw::to_string(kind))

void check_output_distinct(const fw::TensorRef& y);

void check_matmul_shapes(fw::OpKind kind, const fw::TensorRef& a, const fw::TensorRef& b, const fw::TensorRef& y,
                         bool trans_a, bool trans_b) {
  const std::uint32_t r = y.rank;
  RULE(r >= 2 && a.rank == r && b.rank == r);
  for (std::uint32_t d = 0; d + 2 < r; ++d) RULE(a.shape[d] == y.shape[d] && b.shape[d] == y.shape[d]);
  const std::uint64_t m = trans_a ? a.shape[r - 1] : a.shape[r - 2];
  const std::uint64_t k = trans_a ? a.shape[r - 2] : a.shape[r - 1];
  const std::uint64_t kb = trans_b ? b.shape[r - 1] : b.shape[r - 2];
  const std::uint64_t n = trans_b ? b.shape[r - 2] : b.shape[r - 1];
  RULE(m == y.shape[r - 2] && n == y.shape[r - 1] && k == kb);
}

void check_conv_shapes(fw::OpKind kind, const fw::ConvAttrs& at, const fw::TensorRef& x, const fw::TensorRef& w,
                       const fw::TensorRef& y) {
  // Only a float convolution accumulates into y (0 or 1); the integer ones not.
  RULE(kind == fw::OpKind::kConv2d ? at.accumulate <= 1 : at.accumulate == 0);
  RULE(x.rank == 4 && w.rank == 4 && y.rank == 4 && at.layout <= 1);
  const bool nhwc = at.layout == 1;
  const std::uint64_t n = x.shape[0], c = x.shape[nhwc ? 3 : 1];
  const std::uint64_t h = x.shape[nhwc ? 1 : 2], wd = x.shape[nhwc ? 2 : 3];
  RULE(at.groups >= 1 && c % at.groups == 0 && w.shape[0] % at.groups == 0 && w.shape[1] == c / at.groups);
  for (int k = 0; k < 2; ++k) RULE(at.stride[k] >= 1 && at.dilation[k] >= 1);
  RULE(y.shape[0] == n && y.shape[nhwc ? 3 : 1] == w.shape[0]);
  RULE(y.shape[nhwc ? 1 : 2] == window_out(h, w.shape[2], at.stride[0], at.dilation[0], at.pad[0], at.pad[2], false));
  RULE(y.shape[nhwc ? 2 : 3] == window_out(wd, w.shape[3], at.stride[1], at.dilation[1], at.pad[1], at.pad[3], false));
}

void check_rules(const fw::OpBlock& b) {
  const fw::OpKind kind = b.kind;
  const auto& t = b.tensors;
  const fw::TensorRef& y = t[b.num_tensors - 1];
  // Every attribute struct's reserved words are zero.
  std::visit(
      [&](const auto& at) {
        if constexpr (requires { at.reserved; }) {
          std::uint32_t words[sizeof at.reserved / 4];
          std::memcpy(words, &at.reserved, sizeof words);
          for (const std::uint32_t w : words) RULE(w == 0);
        }
      },
      b.attrs);
  switch (kind) {
    case fw::OpKind::kMatMul: {
      const auto& at = std::get<fw::MatMulAttrs>(b.attrs);
      RULE(at.trans_a <= 1 && at.trans_b <= 1 && at.activation <= fw::kMaxActivation);
      RULE(is_float(t[0].dtype) && t[1].dtype == t[0].dtype && (y.dtype == t[0].dtype || y.dtype == 1));
      if (t[2].dtype) RULE(is_float(t[2].dtype) && same_shape(t[2], y));
      check_matmul_shapes(kind, t[0], t[1], y, at.trans_a, at.trans_b);
      break;
    }
    case fw::OpKind::kMatMulInteger:
      RULE(is_int8(t[0].dtype) && is_int8(t[1].dtype) && y.dtype == 6);
      check_matmul_shapes(kind, t[0], t[1], y, false, false);
      break;
    case fw::OpKind::kQLinearMatMul:
      RULE(is_int8(t[0].dtype) && is_int8(t[3].dtype) && is_int8(y.dtype));
      RULE(t[1].dtype == 1 && t[4].dtype == 1 && t[6].dtype == 1 && t[7].dtype == y.dtype);
      check_matmul_shapes(kind, t[0], t[3], y, false, false);
      break;
    case fw::OpKind::kConv2d: {
      const auto& at = std::get<fw::ConvAttrs>(b.attrs);
      RULE(is_float(t[0].dtype) && t[1].dtype == t[0].dtype && y.dtype == t[0].dtype);
      check_conv_shapes(kind, at, t[0], t[1], y);
      if (t[2].dtype) RULE(t[2].rank == 1 && t[2].shape[0] == t[1].shape[0]);
      break;
    }
    case fw::OpKind::kConvInteger:
      RULE(is_int8(t[0].dtype) && is_int8(t[1].dtype) && y.dtype == 6);
      check_conv_shapes(kind, std::get<fw::ConvAttrs>(b.attrs), t[0], t[1], y);
      break;
    case fw::OpKind::kQLinearConv:
      RULE(is_int8(t[0].dtype) && is_int8(t[3].dtype) && is_int8(y.dtype));
      RULE(t[1].dtype == 1 && t[4].dtype == 1 && t[6].dtype == 1 && t[7].dtype == y.dtype);
      check_conv_shapes(kind, std::get<fw::ConvAttrs>(b.attrs), t[0], t[3], y);
      if (t[8].dtype) RULE(t[8].dtype == 6 && t[8].rank == 1 && t[8].shape[0] == t[3].shape[0]);
      break;
    case fw::OpKind::kPool2d: {
      const auto& at = std::get<fw::PoolAttrs>(b.attrs);
      const fw::TensorRef& x = t[0];
      RULE(x.rank == 4 && y.rank == 4 && at.layout <= 1 && at.kind <= 1 && y.dtype == x.dtype);
      RULE(at.kind == 1 ? is_float(x.dtype) : x.dtype != 6);
      const bool nhwc = at.layout == 1;
      const std::uint32_t dc = nhwc ? 3 : 1, dh = nhwc ? 1 : 2;
      RULE(y.shape[0] == x.shape[0] && y.shape[dc] == x.shape[dc]);
      for (std::uint32_t k = 0; k < 2; ++k) {
        RULE(at.kernel[k] >= 1 && at.stride[k] >= 1 && at.dilation[k] >= 1);
        RULE(y.shape[dh + k] == window_out(x.shape[dh + k], at.kernel[k], at.stride[k], at.dilation[k], at.pad[k],
                                           at.pad[k + 2], at.ceil_mode));
        // No window made only of padding (or of taps that straddle the input).
        for (std::uint64_t o = 0; o < y.shape[dh + k] && o < 4096; ++o)
          RULE(window_has_tap(static_cast<std::int64_t>(x.shape[dh + k]), at.kernel[k], at.stride[k], at.dilation[k],
                              at.pad[k], static_cast<std::int64_t>(o)));
      }
      break;
    }
    case fw::OpKind::kElementwise: {
      const auto& at = std::get<fw::ElementwiseAttrs>(b.attrs);
      const auto op = static_cast<fw::ElementwiseOp>(at.op);
      RULE(at.op <= fw::kMaxElementwiseOp && same_shape(t[0], y));
      if (fw::is_binary(op))
        RULE(t[1].dtype == t[0].dtype && same_shape(t[1], y));
      else
        RULE(t[1].dtype == 0);
      // Comparisons give u8; logic takes and gives u8; the rest keep the dtype.
      if (fw::is_comparison(op) || fw::is_logical(op)) RULE(y.dtype == static_cast<std::uint32_t>(fw::DType::kU8));
      if (fw::is_logical(op)) RULE(t[0].dtype == static_cast<std::uint32_t>(fw::DType::kU8));
      if (op != fw::ElementwiseOp::kIdentity && !fw::is_comparison(op) && !fw::is_logical(op))
        RULE(y.dtype == t[0].dtype);
      // Activations, exp, log, sqrt, erf, ceil, floor, round and the
      // trigonometric and hyperbolic functions (sin to atanh) take floats
      // only: written out here, not read from
      // fw::is_float_only, so that the fuzzer checks the decoder against a
      // rule of its own.
      if (op == fw::ElementwiseOp::kActivation || op == fw::ElementwiseOp::kExp || op == fw::ElementwiseOp::kLog ||
          op == fw::ElementwiseOp::kSqrt || op == fw::ElementwiseOp::kErf || op == fw::ElementwiseOp::kCeil ||
          op == fw::ElementwiseOp::kFloor || op == fw::ElementwiseOp::kRound ||
          (op >= fw::ElementwiseOp::kSin && op <= fw::ElementwiseOp::kAtanh))
        RULE(is_float(t[0].dtype));
      break;
    }
    case fw::OpKind::kSoftmax: {
      const auto& at = std::get<fw::SoftmaxAttrs>(b.attrs);
      RULE(is_float(t[0].dtype) && y.dtype == t[0].dtype && same_shape(t[0], y));
      RULE(at.axis < t[0].rank && at.log <= 1);
      break;
    }
    case fw::OpKind::kQuantize:
    case fw::OpKind::kDequantize: {
      const bool q = kind == fw::OpKind::kQuantize;
      RULE(same_shape(t[0], y) && same_shape(t[1], t[0]) && t[1].dtype == 1);
      if (t[2].dtype) RULE(same_shape(t[2], t[0]) && t[2].dtype == (q ? y.dtype : t[0].dtype));
      RULE(q ? (is_float(t[0].dtype) || t[0].dtype == 6) && is_int8(y.dtype)
             : (is_int8(t[0].dtype) || t[0].dtype == 6) && is_float(y.dtype));
      break;
    }
    case fw::OpKind::kResize: {
      const auto& at = std::get<fw::ResizeAttrs>(b.attrs);
      const std::uint32_t dc = at.layout == 1 ? 3 : 1;
      RULE(t[0].rank == 4 && y.rank == 4 && y.dtype == t[0].dtype && t[0].dtype != 6);
      RULE(y.shape[0] == t[0].shape[0] && y.shape[dc] == t[0].shape[dc]);
      RULE(at.scale[0] > 0 && at.scale[1] > 0);
      break;
    }
    case fw::OpKind::kColorConvert: {
      const auto& at = std::get<fw::ColorConvertAttrs>(b.attrs);
      const fw::TensorRef& luma = t[0];
      RULE(luma.dtype == 5 && luma.rank == 2 && luma.shape[0] % 2 == 0 && luma.shape[1] % 2 == 0);
      const std::uint64_t h = luma.shape[0], w = luma.shape[1];
      RULE(t[1].dtype == 5 && t[1].shape[0] == h / 2 && t[1].shape[1] == w / 2);
      if (at.format == 0)
        RULE(t[1].rank == 3 && t[1].shape[2] == 2 && t[2].dtype == 0);
      else
        RULE(at.format == 1 && t[1].rank == 2 && t[2].dtype == 5 && same_shape(t[2], t[1]));
      RULE((is_float(y.dtype) || y.dtype == 5) && y.rank == 3 && y.shape[0] == 3 && y.shape[1] == h && y.shape[2] == w);
      break;
    }
    case fw::OpKind::kTopK: {
      // X, Values (opt), Indices: Indices i32 of X's shape but 1..len along
      // the axis; Values likewise in X's dtype, written once, apart from X
      // and Indices.
      const auto& at = std::get<fw::TopKAttrs>(b.attrs);
      const fw::TensorRef& x = t[0];
      RULE(y.dtype == 6 && x.dtype != 0 && y.rank == x.rank && at.axis < x.rank);
      RULE(at.largest <= 1 && at.last_index <= 1 && at.reserved == 0 && x.shape[at.axis] < (1ull << 31));
      for (std::uint32_t d = 0; d < x.rank; ++d)
        RULE(d == at.axis ? y.shape[d] >= 1 && y.shape[d] <= x.shape[d] : y.shape[d] == x.shape[d]);
      if (t[1].dtype) {
        RULE(t[1].dtype == x.dtype && same_shape(t[1], y));
        check_output_distinct(t[1]);
        for (std::uint32_t i : {0u, 2u})
          if (b.extent[1] && b.extent[i])
            RULE(u128{t[1].address} + b.extent[1] <= t[i].address || u128{t[i].address} + b.extent[i] <= t[1].address);
      }
      break;
    }
    case fw::OpKind::kConvTranspose2d: {
      // W [Cin, Cout/groups, kh, kw]; each output length is the transposed
      // window's, (in-1)*stride + (k-1)*dilation + 1 - pads, plus less than
      // max(stride, dilation).
      const auto& at = std::get<fw::ConvAttrs>(b.attrs);
      const fw::TensorRef &x = t[0], &w = t[1];
      RULE(at.accumulate == 0);
      RULE(is_float(x.dtype) && w.dtype == x.dtype && y.dtype == x.dtype);
      RULE(x.rank == 4 && w.rank == 4 && y.rank == 4 && at.layout <= 1);
      const bool nhwc = at.layout == 1;
      const std::uint32_t dc = nhwc ? 3 : 1, dh = nhwc ? 1 : 2;
      RULE(at.groups >= 1 && x.shape[dc] % at.groups == 0 && w.shape[0] == x.shape[dc]);
      RULE(y.shape[0] == x.shape[0] && y.shape[dc] == w.shape[1] * at.groups);
      for (std::uint32_t k = 0; k < 2; ++k) {
        RULE(at.stride[k] >= 1 && at.dilation[k] >= 1 && x.shape[dh + k] >= 1 && w.shape[2 + k] >= 1);
        const u128 full = u128{x.shape[dh + k] - 1} * at.stride[k] + u128{w.shape[2 + k] - 1} * at.dilation[k] + 1;
        const u128 out = u128{y.shape[dh + k]} + at.pad[k] + at.pad[k + 2];
        RULE(out >= full && out < full + std::max(at.stride[k], at.dilation[k]) && y.shape[dh + k] >= 1);
      }
      if (t[2].dtype) RULE(is_float(t[2].dtype) && t[2].rank == 1 && t[2].shape[0] == y.shape[dc]);
      break;
    }
    case fw::OpKind::kWhere:
      RULE(t[0].dtype == 5 && t[1].dtype == y.dtype && t[2].dtype == y.dtype);
      RULE(same_shape(t[0], y) && same_shape(t[1], y) && same_shape(t[2], y));
      break;
    case fw::OpKind::kQLinearAdd:
    case fw::OpKind::kQLinearMul: {
      // A, AScale, AZp, B, BScale, BZp, YScale, YZp, Y: bytes in and out,
      // everything in Y's shape, each scale (f32) and zero point (its
      // tensor's dtype) one value: stride 0 wherever its extent is not 1.
      const auto& at = std::get<fw::QuantAttrs>(b.attrs);
      RULE(at.reserved[0] == 0 && at.reserved[1] == 0 && at.reserved[2] == 0 && at.reserved[3] == 0);
      RULE(is_int8(t[0].dtype) && is_int8(t[3].dtype) && is_int8(y.dtype));
      RULE(t[1].dtype == 1 && t[4].dtype == 1 && t[6].dtype == 1);
      RULE(t[2].dtype == t[0].dtype && t[5].dtype == t[3].dtype && t[7].dtype == y.dtype);
      for (std::uint32_t i = 0; i < 8; ++i) RULE(same_shape(t[i], y));
      for (const std::uint32_t i : {1u, 2u, 4u, 5u, 6u, 7u})
        for (std::uint32_t d = 0; d < y.rank; ++d) RULE(t[i].shape[d] <= 1 || t[i].strides[d] == 0);
      break;
    }
    case fw::OpKind::kQLinearGlobalAvgPool: {
      // X [N, H, W, C] bytes, XScale (f32), XZp (X's dtype), YScale (f32),
      // YZp (Y's dtype), Y [N, 1, 1, C] bytes; each scale and zero point one
      // value: stride 0 wherever its extent (its tensor's shape) is not 1.
      const auto& at = std::get<fw::QuantAttrs>(b.attrs);
      RULE(at.reserved[0] == 0 && at.reserved[1] == 0 && at.reserved[2] == 0 && at.reserved[3] == 0);
      RULE(is_int8(t[0].dtype) && is_int8(y.dtype) && t[1].dtype == 1 && t[3].dtype == 1);
      RULE(t[2].dtype == t[0].dtype && t[4].dtype == y.dtype);
      RULE(t[0].rank == 4 && y.rank == 4 && y.shape[0] == t[0].shape[0] && y.shape[1] == 1 && y.shape[2] == 1 &&
           y.shape[3] == t[0].shape[3]);
      for (const std::uint32_t i : {1u, 2u}) RULE(same_shape(t[i], t[0]));
      for (const std::uint32_t i : {3u, 4u}) RULE(same_shape(t[i], y));
      for (const std::uint32_t i : {1u, 2u, 3u, 4u})
        for (std::uint32_t d = 0; d < t[i].rank; ++d) RULE(t[i].shape[d] <= 1 || t[i].strides[d] == 0);
      break;
    }
    case fw::OpKind::kCumSum: {
      // X, Y: Y of X's dtype (a float or i32) and shape; the axis one of X's.
      const auto& at = std::get<fw::CumSumAttrs>(b.attrs);
      RULE(at.reserved == 0 && at.exclusive <= 1 && at.reverse <= 1);
      RULE((is_float(t[0].dtype) || t[0].dtype == 6) && y.dtype == t[0].dtype && same_shape(t[0], y));
      RULE(at.axis < t[0].rank);
      break;
    }
    case fw::OpKind::kNms: {
      // Boxes [B, N, 4], Scores [B, N, C], Y [B, M, 6], one float dtype; the
      // IoU threshold a finite number from 0 to 1, the score threshold finite.
      const auto& at = std::get<fw::NmsAttrs>(b.attrs);
      RULE(at.center <= 1 && at.class_agnostic <= 1);
      RULE(is_float(t[0].dtype) && t[1].dtype == t[0].dtype && y.dtype == t[0].dtype);
      RULE(t[0].rank == 3 && t[1].rank == 3 && y.rank == 3 && t[0].shape[2] == 4 && y.shape[2] == 6);
      RULE(t[1].shape[0] == t[0].shape[0] && y.shape[0] == t[0].shape[0] && t[1].shape[1] == t[0].shape[1]);
      RULE(at.iou_threshold >= 0 && at.iou_threshold <= 1 && std::isfinite(at.score_threshold));
      break;
    }
    case fw::OpKind::kRoiAlign: {
      // X [N, C, H, W] and Rois [R, 4] of any float dtype, Y [R, C, OH, OW]
      // of X's, BatchIndices [R] i32; mode avg or max, sampling_ratio at most
      // 65536, spatial_scale finite and not negative, half_pixel 0 or 1.
      const auto& at = std::get<fw::RoiAlignAttrs>(b.attrs);
      RULE(at.mode <= 1 && at.sampling_ratio <= 65536 && at.half_pixel <= 1);
      RULE(std::isfinite(at.spatial_scale) && at.spatial_scale >= 0);
      RULE(is_float(t[0].dtype) && is_float(t[1].dtype) && t[2].dtype == 6 && y.dtype == t[0].dtype);
      RULE(t[0].rank == 4 && t[1].rank == 2 && t[2].rank == 1 && y.rank == 4 && t[1].shape[1] == 4);
      RULE(t[2].shape[0] == t[1].shape[0] && y.shape[0] == t[1].shape[0] && y.shape[1] == t[0].shape[1]);
      break;
    }
    case fw::OpKind::kGather: {
      // X, Indices (i32, u8 or i8), Y in X's dtype: X's dimensions before the axis,
      // then Indices' dimensions, then X's after it.
      const auto& at = std::get<fw::GatherAttrs>(b.attrs);
      const fw::TensorRef &x = t[0], &idx = t[1];
      RULE(at.reserved[0] == 0 && at.reserved[1] == 0 && at.reserved[2] == 0);
      RULE((idx.dtype == 6 || is_int8(idx.dtype)) && y.dtype == x.dtype && at.axis < x.rank &&
           y.rank + 1 == x.rank + idx.rank);
      std::uint64_t want[2 * fw::kMaxRank] = {};
      std::uint32_t n = 0;
      for (std::uint32_t d = 0; d < x.rank; ++d) {
        if (d != at.axis) {
          want[n++] = x.shape[d];
          continue;
        }
        for (std::uint32_t i = 0; i < idx.rank; ++i) want[n++] = idx.shape[i];
      }
      for (std::uint32_t d = 0; d < y.rank; ++d) RULE(y.shape[d] == want[d]);
      break;
    }
    case fw::OpKind::kScatterElements: {
      // X, Indices (i32), Updates, Y: Updates and Y of X's dtype, Y of X's
      // shape and Updates of Indices'; Indices of X's rank and at most its
      // length in every dimension but the axis; one of five reductions.
      const auto& at = std::get<fw::ScatterElementsAttrs>(b.attrs);
      const fw::TensorRef &x = t[0], &idx = t[1];
      RULE(at.reserved[0] == 0 && at.reserved[1] == 0 && at.reduction <= 4);
      RULE(x.dtype != 0 && idx.dtype == 6 && t[2].dtype == x.dtype && y.dtype == x.dtype);
      RULE(same_shape(y, x) && same_shape(t[2], idx) && at.axis < x.rank && idx.rank == x.rank);
      for (std::uint32_t d = 0; d < x.rank; ++d) RULE(d == at.axis || idx.shape[d] <= x.shape[d]);
      break;
    }
    case fw::OpKind::kInvalid: RULE(false);
  }
}

#undef RULE

// The output writes each of its elements once: with up to 4096 elements,
// every element's offset is computed and compared.
void check_output_distinct(const fw::TensorRef& y) {
  if (elements_of(y) == 0 || elements_of(y) > 4096) return;
  std::vector<u128> offsets;
  std::uint64_t idx[fw::kMaxRank] = {};
  for (;;) {
    u128 off = 0;
    for (std::uint32_t d = 0; d < y.rank; ++d) off += u128{idx[d]} * y.strides[d];
    offsets.push_back(off);
    std::uint32_t d = y.rank;
    while (d > 0 && ++idx[d - 1] == y.shape[d - 1]) idx[--d] = 0;
    if (d == 0) break;
  }
  std::sort(offsets.begin(), offsets.end());
  FUZZ_CHECK(std::adjacent_find(offsets.begin(), offsets.end()) == offsets.end(),
             "the output (rank %u) writes an element twice", y.rank);
}

void check_decoded(const fw::OpBlock& b, const std::uint8_t* data, std::size_t size) {
  FUZZ_CHECK(size >= kHeader && size <= fw::kMaxParamBytes, "a %zu-byte block accepted", size);
  const auto h = tpuhal::fuzz::load<fw::OpHeader>(data);
  FUZZ_CHECK(h.magic == fw::kOpMagic && h.kind >= 1 && h.kind <= fw::kMaxOpKind && h.reserved0 == 0 && h.reserved1 == 0,
             "header magic %#x kind %u accepted", h.magic, h.kind);
  // One flag bit is defined (kOpGlobal, bit 0); the others are reserved.
  FUZZ_CHECK((h.flags & ~1u) == 0 && b.flags == h.flags, "header flags %#x accepted as %#x", h.flags, b.flags);
  const KindRule& rule = kRules[h.kind];
  FUZZ_CHECK(static_cast<std::uint32_t>(b.kind) == h.kind && b.num_tensors == rule.tensors &&
                 h.num_tensors == rule.tensors && h.attr_bytes == rule.attr_bytes &&
                 size == kHeader + rule.tensors * kRef + rule.attr_bytes,
             "kind %u: %u tensors, %u attribute bytes, %zu bytes accepted", h.kind, h.num_tensors, h.attr_bytes, size);
  FUZZ_CHECK(fw::op_tensor_count(b.kind) == rule.tensors, "op_tensor_count(%u)", h.kind);
  FUZZ_CHECK(std::memcmp(b.tensors, data + kHeader, rule.tensors * kRef) == 0, "decoded tensors differ from the block");
  FUZZ_CHECK(b.attrs.index() == rule.attr_index, "kind %u decoded with attributes %zu", h.kind, b.attrs.index());
  const std::uint8_t* attr_bytes = data + kHeader + rule.tensors * kRef;
  std::visit(
      [&](const auto& a) {
        FUZZ_CHECK(sizeof a == rule.attr_bytes && std::memcmp(&a, attr_bytes, sizeof a) == 0,
                   "decoded attributes differ from the block");
      },
      b.attrs);

  const std::uint32_t out = rule.tensors - 1;
  for (std::uint32_t i = 0; i < rule.tensors; ++i) {
    const fw::TensorRef& t = b.tensors[i];
    if (t.dtype == 0) {
      static const fw::TensorRef kZero{};
      FUZZ_CHECK((rule.optional >> i & 1) && std::memcmp(&t, &kZero, sizeof t) == 0,
                 "tensor %u absent (role optional: %u)", i, rule.optional >> i & 1);
      FUZZ_CHECK(b.extent[i] == 0, "absent tensor %u spans %" PRIu64 " bytes", i, b.extent[i]);
      continue;
    }
    FUZZ_CHECK(t.dtype <= fw::kMaxDType && t.rank <= fw::kMaxRank && t.reserved[0] == 0 && t.reserved[1] == 0,
               "tensor %u dtype %u rank %u accepted", i, t.dtype, t.rank);
    for (std::uint32_t d = 0; d < fw::kMaxRank; ++d) {
      if (d < t.rank)
        FUZZ_CHECK(t.shape[d] < fw::kMaxDim, "tensor %u shape[%u] = %" PRIu64, i, d, t.shape[d]);
      else
        FUZZ_CHECK(t.shape[d] == 0 && t.strides[d] == 0, "tensor %u: dimension %u past rank %u", i, d, t.rank);
    }
    const u128 extent = extent_of(t);
    FUZZ_CHECK(extent == b.extent[i] && b.extent[i] == fw::tensor_extent(t),
               "tensor %u extent %" PRIu64 " (tensor_extent %" PRIu64 ")", i, b.extent[i], fw::tensor_extent(t));
    FUZZ_CHECK(u128{t.address} + extent <= (u128{1} << 64), "tensor %u wraps the address space", i);
  }

  const fw::TensorRef& y = b.tensors[out];
  FUZZ_CHECK(y.dtype != 0, "absent output");
  for (std::uint32_t d = 0; d < y.rank; ++d)
    FUZZ_CHECK(y.shape[d] <= 1 || y.strides[d] != 0, "output broadcast along dimension %u", d);
  check_output_distinct(y);
  if (b.extent[out]) {
    for (std::uint32_t i = 0; i < out; ++i) {
      if (!b.extent[i]) continue;
      const u128 xa = b.tensors[i].address, ya = y.address;
      FUZZ_CHECK(xa + b.extent[i] <= ya || ya + b.extent[out] <= xa,
                 "output [%#" PRIx64 ", +%" PRIu64 ") overlaps tensor %u [%#" PRIx64 ", +%" PRIu64 ")", y.address,
                 b.extent[out], i, b.tensors[i].address, b.extent[i]);
    }
  }
  check_rules(b);
}

void check_refused(const fw::Problem& p, const std::uint8_t* data, std::size_t size) {
  FUZZ_CHECK(p.status == fw::CmdStatus::kBadArgument || p.status == fw::CmdStatus::kReservedNotZero ||
                 p.status == fw::CmdStatus::kBadAlignment,
             "refused with status %u", static_cast<unsigned>(p.status));
  if (size < kHeader || size > fw::kMaxParamBytes) {
    FUZZ_CHECK(p.field == fw::kFieldOpHeader, "a %zu-byte block refused for field %#x", size, p.field);
  } else {
    const auto h = tpuhal::fuzz::load<fw::OpHeader>(data);
    const bool kind_ok = h.magic == fw::kOpMagic && h.kind >= 1 && h.kind <= fw::kMaxOpKind;
    const KindRule& rule = kRules[kind_ok ? h.kind : 0];
    const bool tensor_field = p.field >= fw::kFieldTensorBase && p.field < fw::kFieldTensorBase + 16 * rule.tensors;
    const bool attr_field = p.field >= fw::kFieldAttrBase && p.field < fw::kFieldAttrBase + (rule.attr_bytes + 3) / 4;
    FUZZ_CHECK(
        p.field == fw::kFieldOpHeader || p.field == fw::kFieldOpKind || (kind_ok && (tensor_field || attr_field)),
        "kind %u refused for field %#x", h.kind, p.field);
  }
  // As the driver reads it back from the status page.
  fw::FenceRecord rec{};
  rec.value = fw::kTimelineFailed;
  rec.error_status = static_cast<std::uint32_t>(p.status);
  rec.error_opcode = kTensorOp;
  rec.error_field = p.field;
  rec.error_value = p.value;
  rec.error_detail = p.detail;
  auto failure = fw::decode_failure(rec);
  FUZZ_CHECK(failure.ok(), "status %u not decodable by the driver", rec.error_status);
  const std::string msg = fw::describe(*failure);
  FUZZ_CHECK(tpuhal::fuzz::printable(msg), "message \"%s\"", msg.c_str());
}

const bool kVerbose = std::getenv("TPUHAL_FUZZ_VERBOSE") != nullptr;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto decoded = fw::decode_op(std::as_bytes(std::span(data, size)));
  if (kVerbose)
    std::fprintf(stderr, "%s\n",
                 decoded ? (std::string("decoded: ") + fw::to_string(decoded->kind)).c_str()
                         : ("refused: " + fw::describe(decoded.problem(), kTensorOp)).c_str());
  if (decoded)
    check_decoded(*decoded, data, size);
  else
    check_refused(decoded.problem(), data, size);
  return 0;
}
