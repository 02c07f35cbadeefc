// The window attributes of Conv, ConvTranspose and the pools, checked
// before they become the engine's unsigned options, and a window's output
// extent.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "onnx/importer.hpp"

namespace tpuhal::rt::detail {

// One entry per spatial dimension (pads two), kernel_shape, strides,
// dilations and group from 1 to 2^31 - 1, pads and output_padding from 0 to
// fw::kMaxWindowValue, 65536 (the most the ops take), auto_pad one of
// ONNX's four.
void check_window(const Importer& im, const Node& n, const onnx_attrs::WindowAttrs& a, std::size_t spatial);
// A window's output extents (out[2] on: L, or H and W), each at least 1.
void check_window_fits(const Importer& im, const Node& n, const std::vector<std::int64_t>& x,
                       const std::vector<std::int64_t>& out, const std::string& window);
// A 3-D window's attributes over x [N, C, D, H, W] for the kernel
// `kernel` (kd, kh, kw): strides and dilations (1 where absent) and pads
// (front, top, left, back, bottom, right) from `pads` or `auto_pad`.
struct Window3d {
  std::array<std::uint32_t, 3> strides{1, 1, 1}, dilations{1, 1, 1};
  std::array<std::uint32_t, 6> pads{};
};
Window3d window_3d(const onnx_attrs::WindowAttrs& a, const std::vector<std::int64_t>& x,
                   const std::array<std::int64_t, 3>& kernel);
// The output extent of a window of `k` taps (dilation `d`, stride `s`) over
// `in` padded by `pb` and `pe`.
std::int64_t pool_out(std::int64_t in, std::uint32_t k, std::uint32_t s, std::uint32_t d, std::uint32_t pb,
                      std::uint32_t pe, bool ceil);

}  // namespace tpuhal::rt::detail
