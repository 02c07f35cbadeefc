// The shape rule of a convolution or pooling window, shared by the board's
// decoder, the HAL's host checks and the compiler. Header only, no
// dependencies: layers that may not link the firmware interface include it
// (tests/layering_test.py names them).
#pragma once

#include <cstdint>

namespace tpuhal::fw {

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

}  // namespace tpuhal::fw
