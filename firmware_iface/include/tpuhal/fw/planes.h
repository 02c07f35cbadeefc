// The shape rules of resize and color_convert, shared by the board's
// decoder and the HAL's host checks. Header only, no dependencies: layers
// that may not link the firmware interface include it
// (tests/layering_test.py names them).
#pragma once

#include <cstdint>

namespace tpuhal::fw {

// ---- resize: Y keeps X's batch and channels; H and W are Y's own ----

// The largest scale (output over input) along H or W.
inline constexpr float kMaxResizeScale = 65536.0f;

// A scale the board takes: finite, above 0, at most kMaxResizeScale (NaN
// fails every comparison).
constexpr bool resize_scale_ok(float scale) noexcept { return scale > 0 && scale <= kMaxResizeScale; }

// ---- color_convert: 4:2:0 planes to planar RGB ----
//
// Luma [H, W] with H and W even; NV12's chroma [H/2, W/2, 2] (U and V
// interleaved), I420's U and V [H/2, W/2] each; Y [3, H, W].

// Whether a luma plane of h x w has the even sizes 4:2:0 chroma needs.
constexpr bool luma_even(std::uint64_t h, std::uint64_t w) noexcept { return h % 2 == 0 && w % 2 == 0; }

struct ColorPlanes {
  std::uint32_t chroma_rank;  // 3 for NV12, 2 for I420 (each of U and V)
  std::uint64_t chroma[3];    // the chroma plane's shape
  std::uint64_t y[3];         // Y's: 3, H, W
};

constexpr ColorPlanes color_planes(bool nv12, std::uint64_t h, std::uint64_t w) noexcept {
  return nv12 ? ColorPlanes{3, {h / 2, w / 2, 2}, {3, h, w}} : ColorPlanes{2, {h / 2, w / 2, 0}, {3, h, w}};
}

}  // namespace tpuhal::fw
