// Validation of tensor op parameter blocks (docs/ops.md has the rules).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <iterator>

#include "tpuhal/fw/decode.h"
#include "tpuhal/fw/planes.h"

// Every op kind has its case in the switches over OpKind below.
#pragma GCC diagnostic error "-Wswitch"

namespace tpuhal::fw {

const char* to_string(DType t) noexcept {
  switch (t) {
    case DType::kNone: return "none";
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI8: return "i8";
    case DType::kU8: return "u8";
    case DType::kI32: return "i32";
  }
  return "unknown";
}

const char* to_string(OpKind k) noexcept {
  const auto i = static_cast<std::uint32_t>(k);
  return i <= kMaxOpKind ? kOpKinds[i].name : "unknown";
}

std::uint32_t op_tensor_count(OpKind k) noexcept { return op_kind_info(k).tensors; }

std::uint64_t tensor_elements(const TensorRef& t) noexcept {
  std::uint64_t n = 1;
  for (std::uint32_t i = 0; i < t.rank && i < kMaxRank; ++i) {
    if (t.shape[i] == 0) return 0;
    if (n > (1ull << 48) / t.shape[i]) return UINT64_MAX;
    n *= t.shape[i];
  }
  return n;
}

std::uint64_t tensor_extent(const TensorRef& t) noexcept {
  const std::uint64_t size = dtype_size(static_cast<DType>(t.dtype));
  std::uint64_t last = 0;  // index of the last element, in elements
  for (std::uint32_t i = 0; i < t.rank && i < kMaxRank; ++i) {
    if (t.shape[i] == 0) return 0;
    const std::uint64_t span = t.shape[i] - 1;
    if (span && t.strides[i] > (UINT64_MAX >> 1) / span) return UINT64_MAX;
    const std::uint64_t step = span * t.strides[i];
    if (last > (UINT64_MAX >> 1) - step) return UINT64_MAX;
    last += step;
  }
  if (last + 1 > UINT64_MAX / 8) return UINT64_MAX;
  return (last + 1) * size;
}

namespace {

struct Check {
  Problem problem;
  bool failed = false;

  bool fail(CmdStatus s, std::uint16_t field, std::uint64_t value, std::uint64_t detail = 0) {
    if (!failed) {
      problem = {s, field, value, detail};
      failed = true;
    }
    return false;
  }
};

using A = TensorAspect;

bool is_float(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }
bool is_int8(DType t) { return t == DType::kI8 || t == DType::kU8; }
DType dt(const TensorRef& t) { return static_cast<DType>(t.dtype); }
bool present(const TensorRef& t) { return t.dtype != 0; }

// Structure of one tensor: dtype, rank, zeroed tails, sizes.
bool check_tensor(Check& c, const OpBlock& b, std::uint32_t i, bool optional) {
  const TensorRef& t = b.tensors[i];
  if (t.dtype == 0) {
    if (!optional) return c.fail(CmdStatus::kBadArgument, tensor_field(i, A::kDType), 0);
    const TensorRef zero{};
    if (std::memcmp(&t, &zero, sizeof t) != 0)
      return c.fail(CmdStatus::kReservedNotZero, tensor_field(i, A::kAddress), t.address);
    return true;
  }
  if (t.dtype > kMaxDType) return c.fail(CmdStatus::kBadArgument, tensor_field(i, A::kDType), t.dtype);
  if (t.rank > kMaxRank) return c.fail(CmdStatus::kBadArgument, tensor_field(i, A::kRank), t.rank, kMaxRank);
  for (std::uint32_t d = 0; d < kMaxRank; ++d) {
    if (d >= t.rank && t.shape[d] != 0)
      return c.fail(CmdStatus::kReservedNotZero, tensor_field(i, A::kShape, d), t.shape[d]);
    if (d >= t.rank && t.strides[d] != 0)
      return c.fail(CmdStatus::kReservedNotZero, tensor_field(i, A::kStride, d), t.strides[d]);
    if (d < t.rank && t.shape[d] >= kMaxDim)
      return c.fail(CmdStatus::kBadArgument, tensor_field(i, A::kShape, d), t.shape[d], kMaxDim - 1);
  }
  if (t.reserved[0] || t.reserved[1])
    return c.fail(CmdStatus::kReservedNotZero, tensor_field(i, A::kAddress), t.reserved[0] | t.reserved[1]);
  if (tensor_elements(t) == UINT64_MAX)
    return c.fail(CmdStatus::kBadArgument, tensor_field(i, A::kShape), tensor_elements(t), 1ull << 48);
  const std::uint64_t extent = tensor_extent(t);
  if (extent == UINT64_MAX || t.address > UINT64_MAX - extent)
    return c.fail(CmdStatus::kBadArgument, tensor_field(i, A::kAddress), t.address);
  return true;
}

// An output must not write one element twice: with its dimensions sorted by
// stride, each stride must clear the previous dimension's span.
bool check_no_self_overlap(Check& c, const TensorRef& t, std::uint32_t i) {
  std::uint32_t dims[kMaxRank];
  std::uint32_t n = 0;
  for (std::uint32_t d = 0; d < t.rank; ++d)
    if (t.shape[d] > 1) dims[n++] = d;
  for (std::uint32_t k = 1; k < n; ++k)  // insertion sort by stride: n <= 6
    for (std::uint32_t j = k; j > 0 && t.strides[dims[j]] < t.strides[dims[j - 1]]; --j)
      std::swap(dims[j], dims[j - 1]);
  std::uint64_t span = 1;  // elements covered by the dimensions so far
  for (std::uint32_t k = 0; k < n; ++k) {
    const std::uint32_t d = dims[k];
    if (t.strides[d] < span) return c.fail(CmdStatus::kBadArgument, tensor_field(i, A::kStride, d), t.strides[d], span);
    span = t.strides[d] * t.shape[d];
  }
  return true;
}

bool expect_dtype(Check& c, const OpBlock& b, std::uint32_t i, bool ok) {
  return ok || c.fail(CmdStatus::kBadArgument, tensor_field(i, A::kDType), b.tensors[i].dtype);
}

bool expect_rank(Check& c, const OpBlock& b, std::uint32_t i, std::uint32_t rank) {
  return b.tensors[i].rank == rank ||
         c.fail(CmdStatus::kBadArgument, tensor_field(i, A::kRank), b.tensors[i].rank, rank);
}

bool expect_dim(Check& c, const OpBlock& b, std::uint32_t i, std::uint32_t d, std::uint64_t want) {
  return b.tensors[i].shape[d] == want ||
         c.fail(CmdStatus::kBadArgument, tensor_field(i, A::kShape, d), b.tensors[i].shape[d], want);
}

bool expect_same_shape(Check& c, const OpBlock& b, std::uint32_t i, std::uint32_t like) {
  if (!expect_rank(c, b, i, b.tensors[like].rank)) return false;
  for (std::uint32_t d = 0; d < b.tensors[like].rank; ++d)
    if (!expect_dim(c, b, i, d, b.tensors[like].shape[d])) return false;
  return true;
}

// A parameter broadcast over the shape of tensor `like` (scale, zero point):
// same shape, and stride 0 along every dimension in `constant_dims` (a bit
// mask), over which it must not vary.
bool expect_param(Check& c, const OpBlock& b, std::uint32_t i, std::uint32_t like, std::uint32_t constant_dims) {
  if (!expect_same_shape(c, b, i, like)) return false;
  for (std::uint32_t d = 0; d < b.tensors[i].rank; ++d)
    if ((constant_dims >> d & 1) && b.tensors[i].shape[d] > 1 && b.tensors[i].strides[d] != 0)
      return c.fail(CmdStatus::kBadArgument, tensor_field(i, A::kStride, d), b.tensors[i].strides[d], 0);
  return true;
}

bool expect_attr(Check& c, std::size_t offset, bool ok, std::uint64_t value, std::uint64_t limit = 0) {
  return ok || c.fail(CmdStatus::kBadArgument, attr_field(offset), value, limit);
}

// An f32 attribute word as the problem reports it: its bits.
std::uint32_t float_bits(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

bool check_activation(Check& c, std::size_t offset, std::uint32_t act, float alpha, float beta) {
  if (!expect_attr(c, offset, act <= kMaxActivation, act, kMaxActivation)) return false;
  if (!std::isfinite(alpha) || !std::isfinite(beta)) return c.fail(CmdStatus::kBadArgument, attr_field(offset + 4), 0);
  if (static_cast<Activation>(act) == Activation::kClip && alpha > beta)
    return c.fail(CmdStatus::kBadArgument, attr_field(offset + 4), 0);
  return true;
}

// ---- Per op kind -----------------------------------------------------------------

// A, B, Y: [..., M, K] x [..., K, N] -> [..., M, N], batch dims equal.
bool check_matmul_shapes(Check& c, const OpBlock& b, std::uint32_t ia, std::uint32_t ib, std::uint32_t iy, bool trans_a,
                         bool trans_b) {
  const TensorRef &a = b.tensors[ia], &bb = b.tensors[ib], &y = b.tensors[iy];
  if (y.rank < 2) return c.fail(CmdStatus::kBadArgument, tensor_field(iy, A::kRank), y.rank, 2);
  if (!expect_rank(c, b, ia, y.rank) || !expect_rank(c, b, ib, y.rank)) return false;
  const std::uint32_t r = y.rank;
  for (std::uint32_t d = 0; d + 2 < r; ++d)
    if (!expect_dim(c, b, ia, d, y.shape[d]) || !expect_dim(c, b, ib, d, y.shape[d])) return false;
  const std::uint64_t m = y.shape[r - 2], n = y.shape[r - 1];
  const std::uint64_t k = trans_a ? a.shape[r - 2] : a.shape[r - 1];
  if (!expect_dim(c, b, ia, trans_a ? r - 1 : r - 2, m)) return false;
  if (!expect_dim(c, b, ib, trans_b ? r - 1 : r - 2, k)) return false;
  if (!expect_dim(c, b, ib, trans_b ? r - 2 : r - 1, n)) return false;
  (void)bb;
  return true;
}

bool check_matmul(Check& c, const OpBlock& b, const MatMulAttrs& at) {
  if (!expect_attr(c, offsetof(MatMulAttrs, trans_a), at.trans_a <= 1, at.trans_a, 1) ||
      !expect_attr(c, offsetof(MatMulAttrs, trans_b), at.trans_b <= 1, at.trans_b, 1) ||
      !expect_attr(c, offsetof(MatMulAttrs, alpha), std::isfinite(at.alpha) && std::isfinite(at.beta), 0) ||
      !check_activation(c, offsetof(MatMulAttrs, activation), at.activation, at.act_alpha, at.act_beta))
    return false;
  const DType ta = dt(b.tensors[0]);
  if (!expect_dtype(c, b, 0, is_float(ta)) || !expect_dtype(c, b, 1, dt(b.tensors[1]) == ta) ||
      !expect_dtype(c, b, 3, dt(b.tensors[3]) == ta || dt(b.tensors[3]) == DType::kF32))
    return false;
  if (present(b.tensors[2])) {
    if (!expect_dtype(c, b, 2, is_float(dt(b.tensors[2]))) || !expect_same_shape(c, b, 2, 3)) return false;
  }
  return check_matmul_shapes(c, b, 0, 1, 3, at.trans_a, at.trans_b);
}

// The window kinds' shape rule is fw/window.h's, which the host's builders
// read too; these report what it finds as attribute words and tensor
// dimensions. Shapes go to it in NCHW order.
struct Nchw {
  std::uint64_t s[4];
};
Nchw nchw(const TensorRef& t, bool nhwc) {
  return nhwc ? Nchw{{t.shape[0], t.shape[3], t.shape[1], t.shape[2]}}
              : Nchw{{t.shape[0], t.shape[1], t.shape[2], t.shape[3]}};
}

// The dimension of a layout's tensor that holds NCHW dimension d.
std::uint32_t layout_dim(bool nhwc, std::uint32_t d) {
  constexpr std::uint32_t kNhwc[4] = {0, 3, 1, 2};
  return nhwc ? kNhwc[d] : d;
}

// ConvAttrs or PoolAttrs as the rule takes them.
template <typename Attrs>
Window window_of(const Attrs& at) {
  Window w;
  for (int k = 0; k < 2; ++k) {
    w.stride[k] = at.stride[k];
    w.dilation[k] = at.dilation[k];
  }
  for (int k = 0; k < 4; ++k) w.pad[k] = at.pad[k];
  if constexpr (requires { at.groups; }) w.groups = at.groups;
  if constexpr (requires { at.kernel; }) {
    w.kernel[0] = at.kernel[0];
    w.kernel[1] = at.kernel[1];
    w.ceil_mode = at.ceil_mode != 0;
  }
  return w;
}

// Where the board reports a fault of fw/window.h's rule: the attribute
// word, or a dimension of X (ix), W (iw) or Y (iy).
struct WindowTensors {
  std::uint32_t ix, iw, iy;
  bool nhwc;
};

template <typename Attrs>
bool fail_window(Check& c, const WindowVerdict& v, const Window& w, const WindowTensors& t) {
  using F = WindowFault;
  const auto attr = [&](std::size_t offset, std::uint64_t value) {
    return c.fail(CmdStatus::kBadArgument, attr_field(offset), value, v.want);
  };
  switch (v.fault) {
    case F::kNone: return true;
    case F::kKernel:
      if constexpr (requires(Attrs a) { a.kernel; }) return attr(offsetof(Attrs, kernel) + 4 * v.at, v.got);
      break;
    case F::kStride: return attr(offsetof(Attrs, stride) + 4 * v.at, v.got);
    case F::kDilation: return attr(offsetof(Attrs, dilation) + 4 * v.at, v.got);
    case F::kPad:
    case F::kPadPastWindow: return attr(offsetof(Attrs, pad) + 4 * v.at, v.got);
    case F::kGroups:
      if constexpr (requires(Attrs a) { a.groups; }) return attr(offsetof(Attrs, groups), v.got);
      break;
    case F::kWeight: return c.fail(CmdStatus::kBadArgument, tensor_field(t.iw, A::kShape, v.at), v.got, v.want);
    case F::kEmptyWindow:  // the dilation word, and the window
      return c.fail(CmdStatus::kBadArgument, attr_field(offsetof(Attrs, dilation) + 4 * v.at), w.dilation[v.at], v.got);
    case F::kEmptyInput:
      return v.at == 0
                 ? c.fail(CmdStatus::kBadArgument, tensor_field(t.ix, A::kShape, layout_dim(t.nhwc, 2 + v.axis)), 0, 1)
                 : c.fail(CmdStatus::kBadArgument, tensor_field(t.iw, A::kShape, 2 + v.axis), 0, 1);
    case F::kOutput:
      return c.fail(CmdStatus::kBadArgument, tensor_field(t.iy, A::kShape, layout_dim(t.nhwc, v.at)), v.got, v.want);
  }
  return c.fail(CmdStatus::kBadArgument, 0, 0);  // a fault these attributes cannot have
}

// Y's dimensions as the verdict says, batch and channels first.
template <typename Attrs>
bool expect_window_output(Check& c, const OpBlock& b, const WindowVerdict& v, const Window& w, const WindowTensors& t) {
  return fail_window<Attrs>(c, check_window_output(v, nchw(b.tensors[t.iy], t.nhwc).s), w, t);
}

// X [N,C,H,W] (or NHWC), W [Cout, Cin/groups, kh, kw], Y [N,Cout,OH,OW]
// (transposed: W [Cin, Cout/groups, kh, kw]). Layout and window words in
// range; X, W and Y of rank 4.
bool check_conv_shapes(Check& c, const OpBlock& b, const ConvAttrs& at, std::uint32_t ix, std::uint32_t iw,
                       std::uint32_t iy, bool transposed = false) {
  if (!expect_attr(c, offsetof(ConvAttrs, layout), at.layout <= 1, at.layout, 1)) return false;
  const bool nhwc = at.layout == static_cast<std::uint32_t>(Layout::kNHWC);
  const Window w = window_of(at);
  const WindowTensors t{ix, iw, iy, nhwc};
  if (!fail_window<ConvAttrs>(c, window_values(w, false), w, t)) return false;
  if (!expect_rank(c, b, ix, 4) || !expect_rank(c, b, iw, 4) || !expect_rank(c, b, iy, 4)) return false;
  const Nchw x = nchw(b.tensors[ix], nhwc), wt = nchw(b.tensors[iw], false);
  const WindowVerdict v = transposed ? conv_transpose_shape(w, x.s, wt.s) : conv_shape(w, x.s, wt.s);
  return fail_window<ConvAttrs>(c, v, w, t) && expect_window_output<ConvAttrs>(c, b, v, w, t);
}

bool check_conv(Check& c, const OpBlock& b, const ConvAttrs& at) {
  if (!check_activation(c, offsetof(ConvAttrs, activation), at.activation, at.act_alpha, at.act_beta) ||
      !expect_attr(c, offsetof(ConvAttrs, accumulate), at.accumulate <= 1, at.accumulate, 1))
    return false;
  const DType tx = dt(b.tensors[0]);
  if (!expect_dtype(c, b, 0, is_float(tx)) || !expect_dtype(c, b, 1, dt(b.tensors[1]) == tx) ||
      !expect_dtype(c, b, 3, dt(b.tensors[3]) == tx))
    return false;
  if (!check_conv_shapes(c, b, at, 0, 1, 3)) return false;
  if (present(b.tensors[2])) {
    if (!expect_dtype(c, b, 2, is_float(dt(b.tensors[2]))) || !expect_rank(c, b, 2, 1) ||
        !expect_dim(c, b, 2, 0, b.tensors[1].shape[0]))
      return false;
  }
  return true;
}

// Only a kConv2d accumulates into Y (ConvAttrs::accumulate).
bool check_conv_transpose(Check& c, const OpBlock& b, const ConvAttrs& at) {
  if (!check_activation(c, offsetof(ConvAttrs, activation), at.activation, at.act_alpha, at.act_beta) ||
      !expect_attr(c, offsetof(ConvAttrs, accumulate), at.accumulate == 0, at.accumulate, 0))
    return false;
  const DType tx = dt(b.tensors[0]);
  if (!expect_dtype(c, b, 0, is_float(tx)) || !expect_dtype(c, b, 1, dt(b.tensors[1]) == tx) ||
      !expect_dtype(c, b, 3, dt(b.tensors[3]) == tx) || !check_conv_shapes(c, b, at, 0, 1, 3, true))
    return false;
  if (present(b.tensors[2])) {
    const std::uint64_t cout = b.tensors[1].shape[1] * at.groups;
    if (!expect_dtype(c, b, 2, is_float(dt(b.tensors[2]))) || !expect_rank(c, b, 2, 1) || !expect_dim(c, b, 2, 0, cout))
      return false;
  }
  return true;
}

bool check_pool(Check& c, const OpBlock& b, const PoolAttrs& at) {
  if (!expect_attr(c, offsetof(PoolAttrs, kind), at.kind <= 1, at.kind, 1) ||
      !expect_attr(c, offsetof(PoolAttrs, layout), at.layout <= 1, at.layout, 1) ||
      !expect_attr(c, offsetof(PoolAttrs, ceil_mode), at.ceil_mode <= 1, at.ceil_mode, 1) ||
      !expect_attr(c, offsetof(PoolAttrs, count_include_pad), at.count_include_pad <= 1, at.count_include_pad, 1))
    return false;
  const bool nhwc = at.layout == static_cast<std::uint32_t>(Layout::kNHWC);
  const Window w = window_of(at);
  const WindowTensors t{0, 0, 1, nhwc};
  if (!fail_window<PoolAttrs>(c, window_values(w, true), w, t) || !expect_rank(c, b, 0, 4)) return false;
  const WindowVerdict v = pool_shape(w, nchw(b.tensors[0], nhwc).s);
  if (!fail_window<PoolAttrs>(c, v, w, t)) return false;
  const DType tx = dt(b.tensors[0]);
  const bool avg = at.kind == static_cast<std::uint32_t>(PoolKind::kAverage);
  if (!expect_dtype(c, b, 0, avg ? is_float(tx) : tx != DType::kI32) || !expect_dtype(c, b, 1, dt(b.tensors[1]) == tx))
    return false;
  return expect_rank(c, b, 1, 4) && expect_window_output<PoolAttrs>(c, b, v, w, t);
}

bool check_elementwise(Check& c, const OpBlock& b, const ElementwiseAttrs& at) {
  if (!expect_attr(c, offsetof(ElementwiseAttrs, op), at.op <= kMaxElementwiseOp, at.op, kMaxElementwiseOp))
    return false;
  const auto op = static_cast<ElementwiseOp>(at.op);
  const DType ta = dt(b.tensors[0]), ty = dt(b.tensors[2]);
  if (!expect_same_shape(c, b, 0, 2)) return false;
  if (is_binary(op)) {
    if (!present(b.tensors[1])) return c.fail(CmdStatus::kBadArgument, tensor_field(1, A::kDType), 0);
    if (!expect_same_shape(c, b, 1, 2) || !expect_dtype(c, b, 1, dt(b.tensors[1]) == ta)) return false;
  } else if (present(b.tensors[1])) {
    return c.fail(CmdStatus::kBadArgument, tensor_field(1, A::kDType), b.tensors[1].dtype, 0);
  }
  if (op == ElementwiseOp::kActivation) {
    if (!check_activation(c, offsetof(ElementwiseAttrs, activation), at.activation, at.alpha, at.beta)) return false;
  } else if (!expect_attr(c, offsetof(ElementwiseAttrs, activation), at.activation == 0, at.activation, 0)) {
    return false;
  }
  if (op == ElementwiseOp::kIdentity) return true;  // any dtype to any dtype
  if (is_comparison(op)) return expect_dtype(c, b, 2, ty == DType::kU8);
  if (is_logical(op)) return expect_dtype(c, b, 0, ta == DType::kU8) && expect_dtype(c, b, 2, ty == DType::kU8);
  return expect_dtype(c, b, 0, !is_float_only(op) || is_float(ta)) && expect_dtype(c, b, 2, ty == ta);
}

bool check_integer_conv(Check& c, const OpBlock& b, const ConvAttrs& at, std::uint32_t ix, std::uint32_t iw,
                        std::uint32_t iy, std::uint32_t ixz, std::uint32_t iwz) {
  if (!expect_attr(c, offsetof(ConvAttrs, activation), at.activation == 0, at.activation, 0) ||
      !expect_attr(c, offsetof(ConvAttrs, accumulate), at.accumulate == 0, at.accumulate, 0))
    return false;
  if (!expect_dtype(c, b, ix, is_int8(dt(b.tensors[ix]))) || !expect_dtype(c, b, iw, is_int8(dt(b.tensors[iw]))))
    return false;
  if (!check_conv_shapes(c, b, at, ix, iw, iy)) return false;
  // The input's zero point is one value; the weights' one per output channel.
  if (present(b.tensors[ixz]) &&
      (!expect_dtype(c, b, ixz, dt(b.tensors[ixz]) == dt(b.tensors[ix])) || !expect_param(c, b, ixz, ix, 0xF)))
    return false;
  if (present(b.tensors[iwz]) &&
      (!expect_dtype(c, b, iwz, dt(b.tensors[iwz]) == dt(b.tensors[iw])) || !expect_param(c, b, iwz, iw, 0xE)))
    return false;
  return true;
}

bool check_resize(Check& c, const OpBlock& b, const ResizeAttrs& at) {
  if (!expect_attr(c, offsetof(ResizeAttrs, mode), at.mode <= 1, at.mode, 1) ||
      !expect_attr(c, offsetof(ResizeAttrs, coordinate), at.coordinate <= 4, at.coordinate, 4) ||
      !expect_attr(c, offsetof(ResizeAttrs, nearest), at.nearest <= 3, at.nearest, 3) ||
      !expect_attr(c, offsetof(ResizeAttrs, layout), at.layout <= 1, at.layout, 1))
    return false;
  for (int k = 0; k < 2; ++k)
    if (!expect_attr(c, offsetof(ResizeAttrs, scale) + 4 * k, resize_scale_ok(at.scale[k]), 0)) return false;
  const DType tx = dt(b.tensors[0]);
  if (!expect_dtype(c, b, 0, tx != DType::kI32) || !expect_dtype(c, b, 1, dt(b.tensors[1]) == tx) ||
      !expect_rank(c, b, 0, 4) || !expect_rank(c, b, 1, 4))
    return false;
  const bool nhwc = at.layout == static_cast<std::uint32_t>(Layout::kNHWC);
  const std::uint32_t dc = nhwc ? 3 : 1;
  return expect_dim(c, b, 1, 0, b.tensors[0].shape[0]) && expect_dim(c, b, 1, dc, b.tensors[0].shape[dc]);
}

// Tensor `out` has tensor `into`'s shape with dimension `axis` (checked:
// < into's rank) replaced by tensor `part`'s whole shape (a splice rule,
// schema/ops.py: Gather). A result past kMaxRank is the part's rank's fault.
bool expect_spliced(Check& c, const OpBlock& b, std::uint32_t out, std::uint32_t into, std::uint32_t axis,
                    std::uint32_t part) {
  const TensorRef &x = b.tensors[into], &p = b.tensors[part];
  const std::uint32_t rank = x.rank - 1 + p.rank;
  if (rank > kMaxRank)
    return c.fail(CmdStatus::kBadArgument, tensor_field(part, A::kRank), p.rank, kMaxRank + 1 - x.rank);
  if (!expect_rank(c, b, out, rank)) return false;
  std::uint32_t d = 0;
  for (std::uint32_t i = 0; i < axis; ++i)
    if (!expect_dim(c, b, out, d++, x.shape[i])) return false;
  for (std::uint32_t i = 0; i < p.rank; ++i)
    if (!expect_dim(c, b, out, d++, p.shape[i])) return false;
  for (std::uint32_t i = axis + 1; i < x.rank; ++i)
    if (!expect_dim(c, b, out, d++, x.shape[i])) return false;
  return true;
}

// Tensor i has tensor `like`'s rank and at most its length in every
// dimension but `axis` (checked: < like's rank): a within rule,
// schema/ops.py (ScatterElements' indices).
bool expect_within(Check& c, const OpBlock& b, std::uint32_t i, std::uint32_t like, std::uint32_t axis) {
  const TensorRef &t = b.tensors[i], &l = b.tensors[like];
  if (!expect_rank(c, b, i, l.rank)) return false;
  for (std::uint32_t d = 0; d < l.rank; ++d)
    if (d != axis && t.shape[d] > l.shape[d])
      return c.fail(CmdStatus::kBadArgument, tensor_field(i, A::kShape, d), t.shape[d], l.shape[d]);
  return true;
}

// Tensor i has tensor `of`'s shape but k, 1 to of's length, along `axis`
// (checked: < of's rank): a k_along rule, schema/ops.py (TopK's indices).
// Its indices are i32: of's length there is at most 2^31 - 1.
bool expect_k_along(Check& c, const OpBlock& b, std::uint32_t i, std::uint32_t of, std::uint32_t axis) {
  const TensorRef &t = b.tensors[i], &x = b.tensors[of];
  if (!expect_rank(c, b, i, x.rank)) return false;
  for (std::uint32_t d = 0; d < x.rank; ++d) {
    if (d != axis) {
      if (!expect_dim(c, b, i, d, x.shape[d])) return false;
    } else if (t.shape[d] < 1 || t.shape[d] > x.shape[d]) {
      return c.fail(CmdStatus::kBadArgument, tensor_field(i, A::kShape, d), t.shape[d], x.shape[d]);
    }
  }
  if (x.shape[axis] > 0x7FFF'FFFF)
    return c.fail(CmdStatus::kBadArgument, tensor_field(of, A::kShape, axis), x.shape[axis], 0x7FFF'FFFF);
  return true;
}

// Tensor i is written besides the last (an outputs rule, schema/ops.py:
// TopK's values): as decode_op checks the last, it must not write an element
// twice or overlap any other tensor.
bool expect_output(Check& c, const OpBlock& b, std::uint32_t i) {
  if (!check_no_self_overlap(c, b.tensors[i], i)) return false;
  const TensorRef& v = b.tensors[i];
  for (std::uint32_t j = 0; j < b.num_tensors; ++j) {
    const TensorRef& o = b.tensors[j];
    if (j != i && b.extent[i] && b.extent[j] && v.address < o.address + b.extent[j] &&
        o.address < v.address + b.extent[i])
      return c.fail(CmdStatus::kBadArgument, tensor_field(i, A::kOverlap), j, v.address);
  }
  return true;
}

bool check_color(Check& c, const OpBlock& b, const ColorConvertAttrs& at) {
  if (!expect_attr(c, offsetof(ColorConvertAttrs, format), at.format <= 1, at.format, 1) ||
      !expect_attr(c, offsetof(ColorConvertAttrs, reserved0), at.reserved0 == 0, at.reserved0, 0))
    return false;
  for (int k = 0; k < 3; ++k)
    if (!expect_attr(c, offsetof(ColorConvertAttrs, mean) + 4 * k,
                     std::isfinite(at.mean[k]) && std::isfinite(at.scale[k]), 0))
      return false;
  // The planes' shapes are fw/planes.h's, which the host's checks read too.
  const bool nv12 = at.format == static_cast<std::uint32_t>(ColorFormat::kNV12);
  const TensorRef& luma = b.tensors[0];
  if (!expect_dtype(c, b, 0, dt(luma) == DType::kU8) || !expect_rank(c, b, 0, 2)) return false;
  const std::uint64_t h = luma.shape[0], w = luma.shape[1];
  if (!luma_even(h, w))
    return c.fail(CmdStatus::kBadAlignment, tensor_field(0, A::kShape, h % 2 ? 0 : 1), h % 2 ? h : w, 2);
  const ColorPlanes planes = color_planes(nv12, h, w);
  if (!expect_dtype(c, b, 1, dt(b.tensors[1]) == DType::kU8) || !expect_rank(c, b, 1, planes.chroma_rank)) return false;
  for (std::uint32_t d = 0; d < planes.chroma_rank; ++d)
    if (!expect_dim(c, b, 1, d, planes.chroma[d])) return false;
  if (nv12) {
    if (present(b.tensors[2]))
      return c.fail(CmdStatus::kBadArgument, tensor_field(2, A::kDType), b.tensors[2].dtype, 0);
  } else if (!expect_dtype(c, b, 2, dt(b.tensors[2]) == DType::kU8) || !expect_same_shape(c, b, 2, 1)) {
    return false;
  }
  const TensorRef& y = b.tensors[3];
  if (!expect_dtype(c, b, 3, is_float(dt(y)) || dt(y) == DType::kU8) || !expect_rank(c, b, 3, 3)) return false;
  for (std::uint32_t d = 0; d < 3; ++d)
    if (!expect_dim(c, b, 3, d, planes.y[d])) return false;
  return true;
}

#include "op_rules.inc"  // check_<id> of the kinds with rules (schema/ops.py)

template <class T>
bool read_attrs(Check& c, std::span<const std::byte> bytes, OpAttrs& out) {
  if (bytes.size() != sizeof(T)) return c.fail(CmdStatus::kBadArgument, kFieldOpHeader, bytes.size(), sizeof(T));
  T t;
  std::memcpy(&t, bytes.data(), sizeof t);
  // Every struct's reserved words are zero, whatever the kind: a later
  // minor may give one a meaning, and this board knows none.
  if constexpr (requires { t.reserved; }) {
    std::uint32_t words[sizeof t.reserved / 4];
    std::memcpy(words, &t.reserved, sizeof words);
    for (std::size_t i = 0; i < std::size(words); ++i)
      if (words[i]) return c.fail(CmdStatus::kReservedNotZero, attr_field(offsetof(T, reserved) + 4 * i), words[i]);
  }
  out = t;
  return true;
}

bool read_kind_attrs(Check& c, OpKind kind, std::span<const std::byte> bytes, OpAttrs& out) {
  switch (kind) {
#define TPUHAL_FW_OP(Name, code, name, tensors, optional, written, Attrs, minor) \
  case OpKind::k##Name:                                                          \
    return read_attrs<Attrs>(c, bytes, out);
#include "tpuhal/fw/op_kinds.inc"
#undef TPUHAL_FW_OP
    case OpKind::kInvalid: break;
  }
  return c.fail(CmdStatus::kBadArgument, kFieldOpKind, static_cast<std::uint32_t>(kind), kMaxOpKind);
}

}  // namespace

Result<OpBlock> decode_op(std::span<const std::byte> block) {
  Check c;
  OpBlock b;
  if (block.size() < sizeof(OpHeader) || block.size() > kMaxParamBytes)
    return Problem{CmdStatus::kBadArgument, kFieldOpHeader, block.size(), kMaxParamBytes};
  OpHeader h;
  std::memcpy(&h, block.data(), sizeof h);
  if (h.magic != kOpMagic) return Problem{CmdStatus::kBadArgument, kFieldOpHeader, h.magic, kOpMagic};
  if (h.kind == 0 || h.kind > kMaxOpKind) return Problem{CmdStatus::kBadArgument, kFieldOpKind, h.kind, kMaxOpKind};
  if (h.reserved0 || h.reserved1 || (h.flags & ~kOpFlagsKnown))
    return Problem{CmdStatus::kReservedNotZero, kFieldOpHeader, h.reserved0 | h.reserved1 | (h.flags & ~kOpFlagsKnown)};
  b.kind = static_cast<OpKind>(h.kind);
  b.flags = h.flags;
  const std::uint32_t want = op_tensor_count(b.kind);
  if (h.num_tensors != want) return Problem{CmdStatus::kBadArgument, kFieldOpHeader, h.num_tensors, want};
  b.num_tensors = want;
  const std::uint64_t tensor_bytes = std::uint64_t{want} * sizeof(TensorRef);
  if (h.attr_bytes > kMaxParamBytes || block.size() != sizeof(OpHeader) + tensor_bytes + h.attr_bytes)
    return Problem{CmdStatus::kBadArgument, kFieldOpHeader, block.size(),
                   sizeof(OpHeader) + tensor_bytes + std::min<std::uint64_t>(h.attr_bytes, kMaxParamBytes)};
  std::memcpy(b.tensors, block.data() + sizeof(OpHeader), tensor_bytes);
  const auto attrs = block.subspan(sizeof(OpHeader) + tensor_bytes);

  // Which tensors may be absent.
  const std::uint32_t optional = op_kind_info(b.kind).optional;
  for (std::uint32_t i = 0; i < want; ++i)
    if (!check_tensor(c, b, i, optional >> i & 1)) return c.problem;
  const std::uint32_t out = want - 1;
  if (!check_no_self_overlap(c, b.tensors[out], out)) return c.problem;
  for (std::uint32_t i = 0; i < want; ++i) b.extent[i] = tensor_extent(b.tensors[i]);
  for (std::uint32_t i = 0; i < out; ++i) {
    if (!b.extent[i] || !b.extent[out]) continue;
    const auto& x = b.tensors[i];
    const auto& y = b.tensors[out];
    if (x.address < y.address + b.extent[out] && y.address < x.address + b.extent[i])
      return Problem{CmdStatus::kBadArgument, tensor_field(out, A::kOverlap), i, y.address};
  }

  // The kind's attribute struct (op_kinds.inc), then the kind's own rules:
  // a switch without a default, so that a kind without its case does not
  // build (-Wswitch, an error here).
  if (!read_kind_attrs(c, b.kind, attrs, b.attrs)) return c.problem;
  bool ok = false;
  switch (b.kind) {
    case OpKind::kMatMul: ok = check_matmul(c, b, std::get<MatMulAttrs>(b.attrs)); break;
    case OpKind::kConv2d: ok = check_conv(c, b, std::get<ConvAttrs>(b.attrs)); break;
    case OpKind::kPool2d: ok = check_pool(c, b, std::get<PoolAttrs>(b.attrs)); break;
    case OpKind::kElementwise: ok = check_elementwise(c, b, std::get<ElementwiseAttrs>(b.attrs)); break;
    case OpKind::kConvInteger:
      ok = expect_dtype(c, b, 4, dt(b.tensors[4]) == DType::kI32) &&
           check_integer_conv(c, b, std::get<ConvAttrs>(b.attrs), 0, 1, 4, 2, 3);
      break;
    case OpKind::kQLinearConv: {
      // X, XScale, XZp, W, WScale, WZp, YScale, YZp, Bias (opt), Y
      ok = expect_dtype(c, b, 9, is_int8(dt(b.tensors[9]))) &&
           check_integer_conv(c, b, std::get<ConvAttrs>(b.attrs), 0, 3, 9, 2, 5);
      if (!ok) break;
      ok = expect_dtype(c, b, 1, dt(b.tensors[1]) == DType::kF32) && expect_param(c, b, 1, 0, 0xF) &&
           expect_dtype(c, b, 4, dt(b.tensors[4]) == DType::kF32) && expect_param(c, b, 4, 3, 0xE) &&
           expect_dtype(c, b, 6, dt(b.tensors[6]) == DType::kF32) && expect_param(c, b, 6, 9, 0xF) &&
           expect_dtype(c, b, 7, dt(b.tensors[7]) == dt(b.tensors[9])) && expect_param(c, b, 7, 9, 0xF) &&
           expect_dtype(c, b, 2, present(b.tensors[2])) && expect_dtype(c, b, 5, present(b.tensors[5]));
      if (ok && present(b.tensors[8]))
        ok = expect_dtype(c, b, 8, dt(b.tensors[8]) == DType::kI32) && expect_rank(c, b, 8, 1) &&
             expect_dim(c, b, 8, 0, b.tensors[3].shape[0]);
      break;
    }
    case OpKind::kResize: ok = check_resize(c, b, std::get<ResizeAttrs>(b.attrs)); break;
    case OpKind::kColorConvert: ok = check_color(c, b, std::get<ColorConvertAttrs>(b.attrs)); break;
    case OpKind::kConvTranspose2d: ok = check_conv_transpose(c, b, std::get<ConvAttrs>(b.attrs)); break;
#include "op_rule_cases.inc"  // the kinds with rules (schema/ops.py)
    case OpKind::kInvalid: break;
  }
  if (!ok) return c.failed ? c.problem : Problem{CmdStatus::kBadArgument, kFieldOpKind, h.kind};
  return b;
}

}  // namespace tpuhal::fw
