// Validating decoders for everything that crosses the host<->board boundary.
//
// The board decodes descriptors and segments the driver wrote; the driver
// decodes the failure records the board wrote. Both treat the other side as
// untrusted: any byte pattern yields either a fully validated value or a
// Problem naming the field and value at fault. Nothing here reads memory
// beyond the structure it is given.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <variant>

#include "tpuhal/fw/command.h"
#include "tpuhal/fw/regs.h"
#include "tpuhal/fw/result.h"

namespace tpuhal::fw {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the firmware interface is little-endian; a big-endian host needs byte swaps");

struct NopArgs {};
struct CopyArgs {
  std::uint64_t src, dst, size;
};
struct CopySgArgs {
  std::uint64_t list, count, total;
};
struct FillArgs {
  std::uint64_t dst, size;
  std::uint32_t pattern;
  std::uint32_t pattern_bytes;  // 1, 2 or 4
};
struct WaitValueArgs {
  std::uint64_t address, value;
  WaitMode mode;
};
struct WriteValueArgs {
  std::uint64_t address, value;
};
struct TimestampArgs {
  std::uint64_t address;
};

using CommandArgs = std::variant<NopArgs, CopyArgs, CopySgArgs, FillArgs, WaitValueArgs,
                                 WriteValueArgs, TimestampArgs>;

struct Command {
  Opcode opcode = Opcode::kInvalid;
  std::uint16_t flags = 0;
  std::uint32_t sequence = 0;
  std::uint64_t fence_value = 0;
  CommandArgs args;
};

// Validates one descriptor's structure: opcode, flags, reserved arguments,
// ranges and alignment. Whether its addresses are mapped is the executor's
// question (a DMA fault), not the decoder's.
Result<Command> decode_command(const CommandDescriptor& d);
Result<Command> decode_command(std::span<const std::byte> bytes);  // exactly 64 bytes

// Validates one scatter-gather segment.
Result<DmaSegment> decode_segment(const DmaSegment& s);

// Whether `op` may run on a queue of `engine`.
bool engine_accepts(EngineType engine, Opcode op) noexcept;

// A failure as the board reported it in a FenceRecord.
struct Failure {
  CmdStatus status = CmdStatus::kOk;
  std::uint16_t opcode = 0;   // raw: a bad opcode is itself the failure
  std::uint16_t field = Problem::kNoField;
  std::uint32_t sequence = 0;
  std::uint64_t fence = 0;
  std::uint64_t value = 0;
  std::uint64_t detail = 0;
};
// The driver's view of a status page whose timeline has kTimelineFailed set.
// A record with an unknown or zero status is itself reported as a
// kFirmwareFault problem whose value is the raw status.
Result<Failure> decode_failure(const FenceRecord& record);

// One line a person can act on, e.g.
//   "copy: src address 0x1000000000 is not mapped for DMA (read)".
std::string describe(CmdStatus status, std::uint16_t opcode, std::uint16_t field,
                     std::uint64_t value, std::uint64_t detail);
inline std::string describe(const Problem& p, std::uint16_t opcode) {
  return describe(p.status, opcode, p.field, p.value, p.detail);
}
inline std::string describe(const Failure& f) {
  return describe(f.status, f.opcode, f.field, f.value, f.detail);
}

// Name of argument `index` of `op` ("src", "size", ...), or "arg<index>".
std::string arg_name(std::uint16_t opcode, std::uint16_t index);

// DMA access kinds carried in Problem::detail for kDmaFault.
inline constexpr std::uint64_t kAccessRead = 1;
inline constexpr std::uint64_t kAccessWrite = 2;

}  // namespace tpuhal::fw
