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

// The interface this header set describes. 1.1 added tensor ops and calls
// (kTensorOp, kCall, kCapTensor); 1.2 the video engine (video.h: kVideoOpen,
// kVideoDecode, kVideoClose, reg::kVideoDoorbell, kCapVideoDecode); 1.3 the
// elementwise mode ElementwiseOp::kErf (tensor.h); 1.4 the activation
// Activation::kHardSwish (tensor.h); 1.5 the op kinds kTopK,
// kConvTranspose2d and kWhere (op_kinds.inc); 1.6 the telemetry block
// (telemetry.h: MboxCmd::kTelemetry, kCapTelemetry); 1.7 the elementwise
// comparisons and logic, ElementwiseOp::kEqual to kNot (tensor.h); 1.8 the
// status kOutOfMemory (status.h), with the codec unit's bounds
// (video.h: kMaxVideoPendingPackets). A board speaking to an older driver
// reports what 1.8 calls kOutOfMemory as kBadArgument (a command) or
// kCorruptStream (a frame record). 1.9 the modelled board clock
// (kCapModelledTime: timestamps and the TIME registers keep the board's
// timing model's time, timing.h). 1.10 the elementwise modes
// ElementwiseOp::kCeil, kFloor and kRound (tensor.h). 1.11 the op kind
// kGather (op_kinds.inc, GatherAttrs in op_attrs.inc). 1.12 the op kind
// kQLinearAdd (op_kinds.inc), and u8 and i8 indices for kGather (a table
// lookup: each byte picks one of 256 entries).
inline constexpr Version kInterfaceVersion{1, 12};
inline constexpr std::uint16_t kMinorOutOfMemory = 8;
inline constexpr std::uint16_t kMinorGatherByteIndices = 12;

// The version a driver supporting [driver_min, driver_max] (same major) and a
// board advertising `board` agree on, or kBadArgument with field
// Problem::kFieldVersion, value = board's packed version, detail = driver_max
// packed.
Result<Version> negotiate(Version board, Version driver_min, Version driver_max);

// The board side: accept a driver's chosen version, or say why not.
Result<Version> accept_driver_version(Version board, std::uint32_t requested_packed);

}  // namespace tpuhal::fw
