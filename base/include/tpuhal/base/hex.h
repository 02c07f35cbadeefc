// hex(): how tpuhal writes addresses, registers, IDs and masks in messages.
//   hex(0x1f) == "0x1f", hex(0) == "0x0", hex(0x1f, 4) == "0x001f"
// firmware_iface, which depends on nothing, keeps its own private copy.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace tpuhal {

// `v` in lowercase hexadecimal after "0x", zero-padded to at least `width`
// digits.
inline std::string hex(std::uint64_t v, int width = 0) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%0*llx", width, static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace tpuhal
