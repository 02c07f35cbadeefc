// Text helpers shared by firmware_iface's describe, image and USB code.
// firmware_iface depends on nothing, so it keeps this private copy of the
// hex() every other layer takes from tpuhal/base/hex.h.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace tpuhal::fw::detail {

// "0x1f": `v` in lowercase hexadecimal ("0" for zero: the board's messages
// have always said so, and tests and users match them).
inline std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%#llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace tpuhal::fw::detail
