// Resize's coordinate and nearest-rounding modes by name: ONNX's attribute
// values, which the model format uses too (docs/model-format.md).
#pragma once

#include <map>
#include <string>

#include "tpuhal/ops.hpp"

namespace tpuhal::rt::detail {

inline const std::map<std::string, CoordinateMode>& coordinate_modes() {
  static const std::map<std::string, CoordinateMode> m = {{"half_pixel", CoordinateMode::HalfPixel},
                                                          {"asymmetric", CoordinateMode::Asymmetric},
                                                          {"align_corners", CoordinateMode::AlignCorners},
                                                          {"pytorch_half_pixel", CoordinateMode::PytorchHalfPixel},
                                                          {"tf_half_pixel_for_nn", CoordinateMode::TfHalfPixelForNn}};
  return m;
}

inline const std::map<std::string, NearestMode>& nearest_modes() {
  static const std::map<std::string, NearestMode> m = {{"round_prefer_floor", NearestMode::RoundPreferFloor},
                                                       {"round_prefer_ceil", NearestMode::RoundPreferCeil},
                                                       {"floor", NearestMode::Floor},
                                                       {"ceil", NearestMode::Ceil}};
  return m;
}

// The name of a mode of one of the tables above.
template <typename Mode>
std::string mode_name(const std::map<std::string, Mode>& table, Mode mode) {
  for (const auto& [name, m] : table)
    if (m == mode) return name;
  return {};
}

}  // namespace tpuhal::rt::detail
