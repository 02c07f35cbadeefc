// The shape rule of a convolution or pooling window, shared by the board's
// decoder, the HAL's host checks and the compiler. Header only, no
// dependencies: layers that may not link the firmware interface include it
// (tests/layering_test.py names them).
#pragma once

#include <cstdint>

namespace tpuhal::fw {

// The largest stride, dilation, pooling kernel and pad a window takes, on
// the board and on the host.
inline constexpr std::uint32_t kMaxWindowValue = 65536;

// Output size of a convolution or pooling window along one axis:
// floor or ceil((in + pads - dilation * (kernel - 1) - 1) / stride) + 1, or 0
// if the window never fits. With ceil, a last window that would start in
// the end padding is dropped (as ONNX and PyTorch do).
constexpr std::uint64_t window_output(std::uint64_t in, std::uint64_t kernel, std::uint64_t stride,
                                      std::uint64_t dilation, std::uint64_t pad_begin, std::uint64_t pad_end,
                                      bool ceil_mode) noexcept {
  if (kernel == 0 || stride == 0 || dilation == 0) return 0;
  const std::uint64_t padded = in + pad_begin + pad_end;
  const std::uint64_t window = dilation * (kernel - 1) + 1;
  if (padded < window) return 0;
  std::uint64_t out = (padded - window) / stride + 1;
  if (ceil_mode && (padded - window) % stride != 0) {
    ++out;
    // The last window must start inside the input or the begin padding.
    if ((out - 1) * stride >= in + pad_begin) --out;
  }
  return out;
}

// The first of `out` windows along one axis none of whose taps lands in
// the input (all in the padding, or straddling a narrow input between
// dilated taps), or UINT64_MAX if none. Pooling refuses such a window:
// it has nothing to pool.
constexpr std::uint64_t first_empty_window(std::uint64_t in, std::uint64_t out, std::uint64_t kernel,
                                           std::uint64_t stride, std::uint64_t dilation,
                                           std::uint64_t pad_begin) noexcept {
  for (std::uint64_t o = 0; o < out; ++o) {
    // Taps k with 0 <= o * stride + k * dilation - pad_begin < in.
    const std::int64_t start = static_cast<std::int64_t>(o * stride) - static_cast<std::int64_t>(pad_begin);
    if (stride != 0 && start >= 0 && start < static_cast<std::int64_t>(in)) {
      // Its first tap is in the input, as is that of every window up to the
      // first one starting past the input: go on from there (an input 2^32
      // long must not cost 2^32 steps).
      o = (in + pad_begin + stride - 1) / stride - 1;
      continue;
    }
    const std::int64_t d = static_cast<std::int64_t>(dilation);
    const std::int64_t kmin = start < 0 ? (-start + d - 1) / d : 0;
    const std::int64_t last = static_cast<std::int64_t>(in) - 1 - start;
    if (last < 0 || kmin > last / d || kmin >= static_cast<std::int64_t>(kernel)) return o;
  }
  return UINT64_MAX;
}

// ---- The shape rule of the five window kinds, once for both layers ----
//
// conv2d, conv_integer and qlinear_conv: X [N, C, H, W], W [Cout, C/groups,
// kh, kw], Y [N, Cout, OH, OW]. conv_transpose2d: W [C, Cout/groups, kh,
// kw], Y [N, Cout, OH, OW] with OH = (H - 1) * stride + (kh - 1) *
// dilation + 1 - pads, plus an output padding below max(stride,
// dilation). pool2d: Y [N, C, OH, OW] of X, the kernel an attribute.
// Shapes here are in NCHW order whatever the layout; ranks are checked
// before (each layer reports them its own way). The board's decoder and
// the HAL's builders both read these functions and report what they find
// in their own terms: an attribute word or a tensor dimension on the
// board, a sentence on the host.

// A window op's geometry.
struct Window {
  std::uint32_t kernel[2] = {1, 1};  // pooling's; a convolution's is W's
  std::uint32_t stride[2] = {1, 1};
  std::uint32_t dilation[2] = {1, 1};
  std::uint32_t pad[4] = {0, 0, 0, 0};  // top, left, bottom, right
  std::uint32_t groups = 1;             // convolutions
  bool ceil_mode = false;               // pooling
};

// The first part of a window op a rule finds wrong.
enum class WindowFault : std::uint8_t {
  kNone,
  kKernel,         // kernel[at] (pooling) is not 1 to kMaxWindowValue
  kStride,         // stride[at] is not 1 to kMaxWindowValue
  kDilation,       // dilation[at] likewise
  kPad,            // pad[at] is above kMaxWindowValue
  kPadPastWindow,  // pooling: pad[at] or pad[at + 2] is not below the window, `want` wide
  kGroups,         // groups is 0 or does not divide the channels
  kWeight,         // W's dimension `at` is `got`; it must be `want`
  kEmptyWindow,    // pooling: window `got` along axis `at` (0: H, 1: W) has no tap in X
  kEmptyInput,     // transposed: X's extent (at 0) or W's kernel (at 1) along axis `axis` is 0
  kOutput,         // Y's dimension `at` (NCHW) is `got`; it must be `want` (transposed: from
                   // `want`, at least 1, to slack more)
};

struct WindowVerdict {
  WindowFault fault = WindowFault::kNone;
  std::uint32_t at = 0;
  std::uint32_t axis = 0;
  std::uint64_t got = 0;
  std::uint64_t want = 0;
  // Y's shape, NCHW: out[2] and out[3] are 0 where the window never fits
  // (the host refuses that; the board runs an empty output). A transposed
  // convolution's are the least OH and OW, and may be negative; Y may
  // exceed them by up to `slack` (its output padding).
  std::int64_t out[4] = {0, 0, 0, 0};
  std::int64_t slack[2] = {0, 0};
  bool transposed = false;
  std::uint8_t empty[2] = {0, 0};  // transposed, per axis: 1 where X's extent is 0, 2 where W's kernel is
  constexpr bool ok() const noexcept { return fault == WindowFault::kNone; }
};

// The attribute words alone: per axis the kernel (pooling), stride and
// dilation, then the four pads, then (pooling) pads below the window.
constexpr WindowVerdict window_values(const Window& w, bool pooling) noexcept {
  const auto in_range = [](std::uint32_t v) { return v >= 1 && v <= kMaxWindowValue; };
  for (std::uint32_t k = 0; k < 2; ++k) {
    if (pooling && !in_range(w.kernel[k])) return {WindowFault::kKernel, k, 0, w.kernel[k], kMaxWindowValue};
    if (!in_range(w.stride[k])) return {WindowFault::kStride, k, 0, w.stride[k], kMaxWindowValue};
    if (!in_range(w.dilation[k])) return {WindowFault::kDilation, k, 0, w.dilation[k], kMaxWindowValue};
  }
  for (std::uint32_t k = 0; k < 4; ++k)
    if (w.pad[k] > kMaxWindowValue) return {WindowFault::kPad, k, 0, w.pad[k], kMaxWindowValue};
  // A pooling window made only of padding has nothing to pool.
  for (std::uint32_t k = 0; pooling && k < 2; ++k) {
    const std::uint64_t window = std::uint64_t{w.dilation[k]} * (w.kernel[k] - 1) + 1;
    if (w.pad[k] >= window || w.pad[k + 2] >= window) return {WindowFault::kPadPastWindow, k, 0, w.pad[k], window};
  }
  return {};
}

// A convolution's shapes, x and wt in NCHW order ([Cout, C/groups, kh, kw]).
constexpr WindowVerdict conv_shape(const Window& w, const std::uint64_t (&x)[4],
                                   const std::uint64_t (&wt)[4]) noexcept {
  const std::uint64_t c = x[1], cout = wt[0];
  if (w.groups == 0 || c % w.groups != 0 || cout % w.groups != 0) return {WindowFault::kGroups, 0, 0, w.groups, 0};
  if (wt[1] != c / w.groups) return {WindowFault::kWeight, 1, 0, wt[1], c / w.groups};
  WindowVerdict v;
  v.out[0] = static_cast<std::int64_t>(x[0]);
  v.out[1] = static_cast<std::int64_t>(cout);
  for (std::uint32_t k = 0; k < 2; ++k)
    v.out[2 + k] = static_cast<std::int64_t>(
        window_output(x[2 + k], wt[2 + k], w.stride[k], w.dilation[k], w.pad[k], w.pad[k + 2], false));
  return v;
}

// A transposed convolution's, wt [C, Cout/groups, kh, kw].
constexpr WindowVerdict conv_transpose_shape(const Window& w, const std::uint64_t (&x)[4],
                                             const std::uint64_t (&wt)[4]) noexcept {
  const std::uint64_t c = x[1];
  if (w.groups == 0 || c % w.groups != 0) return {WindowFault::kGroups, 0, 0, w.groups, 0};
  if (wt[0] != c) return {WindowFault::kWeight, 0, 0, wt[0], c};
  WindowVerdict v;
  v.transposed = true;
  v.out[0] = static_cast<std::int64_t>(x[0]);
  v.out[1] = static_cast<std::int64_t>(wt[1] * w.groups);
  for (std::uint32_t k = 0; k < 2; ++k) {
    // In unsigned words, which wrap where values the rule refuses would
    // overflow; the same as signed arithmetic wherever that does not.
    v.out[2 + k] = static_cast<std::int64_t>((x[2 + k] - 1) * w.stride[k] + (wt[2 + k] - 1) * w.dilation[k] + 1 -
                                             w.pad[k] - w.pad[k + 2]);
    v.slack[k] = std::int64_t{w.stride[k] > w.dilation[k] ? w.stride[k] : w.dilation[k]} - 1;
    v.empty[k] = x[2 + k] == 0 ? 1 : wt[2 + k] == 0 ? 2 : 0;
  }
  return v;
}

// Y against a verdict without a fault: its batch and channels, then per
// axis its extent (a transposed convolution's X and W not empty along it
// first).
constexpr WindowVerdict check_window_output(const WindowVerdict& v, const std::uint64_t (&y)[4]) noexcept {
  for (std::uint32_t d = 0; d < 2; ++d)
    if (y[d] != static_cast<std::uint64_t>(v.out[d]))
      return {WindowFault::kOutput, d, 0, y[d], static_cast<std::uint64_t>(v.out[d])};
  for (std::uint32_t k = 0; k < 2; ++k) {
    if (v.empty[k]) return {WindowFault::kEmptyInput, v.empty[k] - 1u, k, 0, 1};
    const std::int64_t least = v.out[2 + k];
    const auto got = static_cast<std::int64_t>(y[2 + k]);
    // got - least in unsigned words: no overflow, whatever the shapes.
    const bool ok = v.transposed ? got >= 1 && got >= least &&
                                       static_cast<std::uint64_t>(got) - static_cast<std::uint64_t>(least) <=
                                           static_cast<std::uint64_t>(v.slack[k])
                                 : got == least;
    if (!ok) return {WindowFault::kOutput, 2 + k, 0, y[2 + k], static_cast<std::uint64_t>(least > 0 ? least : 0)};
  }
  return {};
}

// A pooling's: Y keeps X's batch and channels; every window needs a tap in
// X (dilated taps can straddle a narrow input).
constexpr WindowVerdict pool_shape(const Window& w, const std::uint64_t (&x)[4]) noexcept {
  WindowVerdict v;
  v.out[0] = static_cast<std::int64_t>(x[0]);
  v.out[1] = static_cast<std::int64_t>(x[1]);
  for (std::uint32_t k = 0; k < 2; ++k) {
    const std::uint64_t out =
        window_output(x[2 + k], w.kernel[k], w.stride[k], w.dilation[k], w.pad[k], w.pad[k + 2], w.ceil_mode);
    const std::uint64_t empty = first_empty_window(x[2 + k], out, w.kernel[k], w.stride[k], w.dilation[k], w.pad[k]);
    if (empty != UINT64_MAX) return {WindowFault::kEmptyWindow, k, k, empty, 0};
    v.out[2 + k] = static_cast<std::int64_t>(out);
  }
  return v;
}

}  // namespace tpuhal::fw
