// The board's telemetry block (interface 1.6, regs.h kCapTelemetry).
//
// The driver asks for it through the mailbox: MboxCmd::kTelemetry with
// arg0 = the host address of a buffer mapped for the board (8-byte
// aligned) and arg1 = its size in bytes. The board writes the block there
// by DMA before it completes the command, and answers res0 = the bytes
// written, res1 = telemetry_bytes() of the whole block. A buffer too small
// for the header fails (MboxStatus::kError) with res0 = kBadArgument and
// res1 as above, nothing written; an unaligned one with kBadAlignment; one
// the board cannot reach with kDmaFault. A buffer too small for every
// queue and channel gets as many entries as fit, queues first (num_queues
// and num_channels say how many).
//
// Asking never takes a queue, never waits for queued work, and resets
// nothing: every counter counts from the board's power-on (a board reset
// does not clear them; `resets` counts those). Utilisation is a counter's
// difference over an interval, as DCGM computes it.
//
// Layout: TelemetryHeader, then num_queues TelemetryQueue entries of
// queue_bytes each, then num_channels TelemetryChannel entries of
// channel_bytes each. Readers step by the sizes the block gives: a later
// version may append fields to any of the three.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tpuhal::fw {

inline constexpr std::uint32_t kTelemetryMagic = 0x4D4C4554;  // "TELM" little-endian
inline constexpr std::uint16_t kTelemetryVersion = 1;
// faults[] is indexed by CmdStatus; statuses past the end are not counted.
inline constexpr std::uint32_t kTelemetryFaultKinds = 32;

// DMA directions of dma_bytes[].
enum class DmaDirection : std::uint32_t {
  kHostToDevice = 0,
  kDeviceToHost = 1,
  kDeviceToDevice = 2,
  kHostToHost = 3,
};

struct TelemetryHeader {
  std::uint32_t magic;         // kTelemetryMagic
  std::uint16_t version;       // kTelemetryVersion
  std::uint16_t header_bytes;  // sizeof(TelemetryHeader) of this version
  std::uint32_t total_bytes;   // the whole block as written
  std::uint32_t num_queues;    // TelemetryQueue entries that follow
  std::uint32_t num_channels;  // TelemetryChannel entries after them
  std::uint32_t queue_bytes;   // each entry's size
  std::uint32_t channel_bytes;
  std::uint32_t reserved0;
  std::uint64_t board_time_ns;  // when the block was written (reg::kTimeLo's clock)
  std::uint64_t uptime_ns;      // since power-on
  std::uint64_t resets;         // board resets since power-on
  // By EngineType: time during which at least one queue of that engine was
  // running a batch of commands ([0] is unused).
  std::uint64_t engine_busy_ns[4];
  std::uint64_t dma_bytes[4];                  // by DmaDirection: bytes copied or filled
  std::uint64_t faults[kTelemetryFaultKinds];  // by CmdStatus: commands that failed so
  std::uint64_t firmware_crashes;              // the firmware stopped (kStatusFatal)
  std::int32_t temperature_mc;                 // die temperature, milli-degrees Celsius
  std::uint32_t power_mw;                      // board power over the last interval
  std::uint64_t energy_uj;                     // since power-on
  std::uint32_t clock_mhz;                     // the compute clock
  std::uint32_t power_limit_mw;                // the board's power limit (its profile's peak)
};

struct TelemetryQueue {
  std::uint32_t engine;    // EngineType
  std::uint32_t index;     // hardware queue number
  std::uint64_t commands;  // commands retired
  std::uint64_t busy_ns;   // time running a batch (waits on fences included)
  std::uint64_t failures;  // commands that failed
};

struct TelemetryChannel {
  std::uint64_t packets;  // compressed packets taken
  std::uint64_t frames;   // frames decoded
  std::uint64_t errors;   // packets that did not decode
  std::uint64_t busy_ns;  // time the decoder spent on the channel
};

static_assert(sizeof(TelemetryHeader) == 408);
static_assert(offsetof(TelemetryHeader, board_time_ns) == 32);
static_assert(offsetof(TelemetryHeader, faults) == 120);
static_assert(offsetof(TelemetryHeader, temperature_mc) == 384);
static_assert(sizeof(TelemetryQueue) == 32);
static_assert(sizeof(TelemetryChannel) == 32);

constexpr std::uint64_t telemetry_bytes(std::uint32_t queues, std::uint32_t channels) noexcept {
  return sizeof(TelemetryHeader) + std::uint64_t{queues} * sizeof(TelemetryQueue) +
         std::uint64_t{channels} * sizeof(TelemetryChannel);
}

}  // namespace tpuhal::fw
