// Command status codes: what the board reports when a descriptor fails, and
// what the decoders report for bytes that do not validate.
#pragma once

#include <cstdint>

namespace tpuhal::fw {

enum class CmdStatus : std::uint32_t {
  kOk = 0,
  kInvalidOpcode = 1,         // opcode unknown to this interface version
  kInvalidFlags = 2,          // a flag bit this version does not define
  kReservedNotZero = 3,       // a reserved field or argument is not zero
  kBadSequence = 4,           // descriptor's sequence is not its ring position
  kBadArgument = 5,           // an argument is out of its valid range
  kBadAlignment = 6,          // an address or size violates its alignment
  kDmaFault = 7,              // an address is not backed by DRAM or a DMA window
  kFenceNotMonotonic = 8,     // fence value not greater than the last one written
  kDependencyFailed = 9,      // a waited-on timeline failed
  kUnsupportedOnEngine = 10,  // opcode valid, but not on this queue's engine
  kRingConfig = 11,           // ring base/size/fence address misconfigured
  kFirmwareFault = 12,        // the board's firmware stopped (needs reset)
  kEccError = 13,             // uncorrectable memory error in device DRAM
  kHang = 14,                 // the board's watchdog stopped a command
  kQueueReset = 15,           // work discarded by a queue or device reset
  kCorruptStream = 16,        // video: the packet's data does not decode
  kUnsupportedStream = 17,    // video: valid, but not something the decoder takes
  // The board's memory for this work is used up: detail says which memory
  // (kMemory* below), value its limit. The board refuses the command (or,
  // in a frame record, the frame) and goes on; nothing else is lost.
  kOutOfMemory = 18,
};

// Problem::detail (and FrameRecord::detail) of a kOutOfMemory.
inline constexpr std::uint32_t kMemoryHost = 1;          // the board's own allocation failed
inline constexpr std::uint32_t kMemoryVideoPackets = 2;  // a channel's packet queue (value: its length)
inline constexpr std::uint32_t kMemoryVideoUnit = 3;     // the codec unit's working memory (value: bytes)

// "dma fault", "invalid opcode", ...; "unknown status" for values off the list.
const char* to_string(CmdStatus status) noexcept;
bool is_known(std::uint32_t status) noexcept;

}  // namespace tpuhal::fw
