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

}  // namespace tpuhal::fw
