// The firmware interface version this tree speaks, as the tools and the
// board's messages print it ("1.8"). Tests compare against it, not against a
// literal, so that raising the minor (a line of the op schema's MINORS, from
// which fw/version.inc is generated) breaks no test that is not about
// versions.
#pragma once

#include <string>

#include "tpuhal/fw/version.h"

namespace tpuhal::test {

inline std::string interface_version_text() {
  return std::to_string(fw::kInterfaceVersion.major) + "." + std::to_string(fw::kInterfaceVersion.minor);
}

}  // namespace tpuhal::test
