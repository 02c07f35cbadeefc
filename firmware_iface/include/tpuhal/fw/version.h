// Interface versions and their negotiation.
//
// The board advertises the interface version it implements in
// Reg::kIfaceVersion (major << 16 | minor). The driver picks the version both
// speak with negotiate(), writes it to Reg::kDriverVersion, and the board
// answers in Reg::kStatus with kStatusVersionOk or kStatusVersionRejected.
// Rule: majors must be equal; the agreed minor is the smaller of the two
// (every minor only adds opcodes, registers and capability bits that the
// other side can ignore).
#pragma once

#include <cstdint>

#include "tpuhal/fw/result.h"

namespace tpuhal::fw {

struct Version {
  std::uint16_t major = 0;
  std::uint16_t minor = 0;

  constexpr std::uint32_t packed() const noexcept { return static_cast<std::uint32_t>(major) << 16 | minor; }
  static constexpr Version unpack(std::uint32_t v) noexcept {
    return {static_cast<std::uint16_t>(v >> 16), static_cast<std::uint16_t>(v & 0xFFFF)};
  }
  friend constexpr bool operator==(Version, Version) = default;
};

// The interface this header set describes, and what each minor added:
// generated from the op schema (schema/ops.py: MINORS).
#include "tpuhal/fw/version.inc"
inline constexpr std::uint16_t kMinorOutOfMemory = 8;
inline constexpr std::uint16_t kMinorGatherByteIndices = 12;
inline constexpr std::uint16_t kMinorOpFlags = 18;
inline constexpr std::uint16_t kMinorWaitTime = 21;  // kWaitTime, frame_done_ns

// The version a driver supporting [driver_min, driver_max] (same major) and a
// board advertising `board` agree on, or kBadArgument with field
// Problem::kFieldVersion, value = board's packed version, detail = driver_max
// packed.
Result<Version> negotiate(Version board, Version driver_min, Version driver_max);

// The board side: accept a driver's chosen version, or say why not.
Result<Version> accept_driver_version(Version board, std::uint32_t requested_packed);

}  // namespace tpuhal::fw
