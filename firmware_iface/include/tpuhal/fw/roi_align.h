// RoiAlign's sampling along one axis of X, shared by the board's roi_align
// (the simulator's kernel) and the compiler's fold of RoiAlign (a model's
// host stage), so that both give the same bits: each step one f32
// operation, in ONNX Runtime's order. Pure; header only.
#pragma once

#include <cstdint>

namespace tpuhal::fw {

// Where one sample falls: its two pixels and their weights, or outside
// (more than a pixel beyond X, where it pools nothing).
struct RoiTap {
  std::uint64_t low = 0, high = 0;
  float l = 0, h = 0;
  bool inside = false;
};

// Sample `i` of the `grid` in bin `p` of a region that starts at `start`
// with bins `bin` pixels wide, along an axis of `size` pixels (at least 1).
inline RoiTap roi_tap(float start, float bin, std::uint64_t p, std::uint64_t i, std::uint64_t grid,
                      std::uint64_t size) {
  RoiTap t;
  float at = start + static_cast<float>(p) * bin + (static_cast<float>(i) + 0.5f) * bin / static_cast<float>(grid);
  if (at < -1.0f || at > static_cast<float>(size)) return t;
  if (at <= 0) at = 0.0f;
  t.low = static_cast<std::uint64_t>(at);
  if (t.low >= size - 1) {
    t.low = t.high = size - 1;
    at = static_cast<float>(t.low);
  } else {
    t.high = t.low + 1;
  }
  t.l = at - static_cast<float>(t.low);
  t.h = 1.0f - t.l;
  t.inside = true;
  return t;
}

}  // namespace tpuhal::fw
