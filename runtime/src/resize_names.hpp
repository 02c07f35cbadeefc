// Resize's coordinate and nearest-rounding modes by name: ONNX's attribute
// values, which the model format uses too (docs/model-format.md). The names
// are the op schema's (schema/ops.py, tpuhal/op_enums.inc).
#pragma once

#include <map>
#include <string>

#include "tpuhal/ops.hpp"

namespace tpuhal::rt::detail {

// Every value of an attribute enumeration by its name.
template <typename Mode>
const std::map<std::string, Mode>& modes_by_name() {
  static const std::map<std::string, Mode> m = [] {
    std::map<std::string, Mode> out;
    for (const auto& [name, mode] : EnumNames<Mode>::table) out.emplace(name, mode);
    return out;
  }();
  return m;
}

inline const std::map<std::string, CoordinateMode>& coordinate_modes() { return modes_by_name<CoordinateMode>(); }
inline const std::map<std::string, NearestMode>& nearest_modes() { return modes_by_name<NearestMode>(); }

// The name of a mode of one of the tables above.
template <typename Mode>
std::string mode_name(const std::map<std::string, Mode>&, Mode mode) {
  return enum_name(mode);
}

}  // namespace tpuhal::rt::detail
