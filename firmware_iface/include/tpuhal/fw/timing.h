// The board's timing model: what each command costs in board nanoseconds,
// computed from its descriptor alone (docs/timing.md).
//
// A board profile carries the parameters (TimingModel); the simulator keeps
// its clock with them, and the host's tools plan with the same functions.
// Everything is integer arithmetic on the descriptor's own numbers, so the
// same command costs the same nanoseconds on every host, instruction-set
// level, thread count and architecture.
//
// A tensor op is a roofline between the engine and device memory:
//   - the multiply-accumulate array: `lanes` lanes side by side, each
//     summing `channel_tile` input channels per step. A convolution puts its
//     output channels on the lanes and its input channels (per group) on the
//     tiles, so a layer with 3 input channels, or a depthwise one, fills a
//     few tiles of each lane; its padded work (lane_macs) is what the array
//     spends cycles on;
//   - the vector unit: element-wise work, pooling windows, softmax,
//     conversions, at `vector_lane_elems` elements per lane per cycle, times
//     the cycles each element needs (an exponential costs more than an add);
//   - device memory: every tensor read and written once, at `dram_mbps`.
// An op the program runs on its own (kOpGlobal, tensor.h) streams every
// tensor from device memory, and reads or writes a tensor whose innermost
// dimension is not contiguous (a permute's gathered side) one element per
// DRAM burst of kDramBurstBytes.
// The op costs the larger of compute and memory, plus a fixed cost per op
// and per command. Copies and fills cost their bytes at the bandwidth of
// the memory at their ends; a decoded frame its pixels at the video unit's
// rate for its codec, I frames more than P and B frames.
#pragma once

#include <cstdint>

#include "tpuhal/fw/command.h"
#include "tpuhal/fw/decode.h"
#include "tpuhal/fw/result.h"
#include "tpuhal/fw/tensor.h"
#include "tpuhal/fw/telemetry.h"
#include "tpuhal/fw/video.h"

namespace tpuhal::fw {

// The tensor engine's modes, by the dtype an op computes in: int8 (I8,
// U8), 16-bit float (F16, BF16), 32-bit (F32, I32).
enum class MacPrecision : std::uint32_t { kInt8 = 0, kF16 = 1, kF32 = 2 };
inline constexpr std::uint32_t kMacPrecisions = 3;
const char* to_string(MacPrecision p) noexcept;
MacPrecision mac_precision(DType t) noexcept;

// Which way a copy from `src` to `dst` goes (host addresses: the host window).
constexpr DmaDirection dma_direction(std::uint64_t src, std::uint64_t dst) noexcept {
  const bool from_host = is_host_address(src), to_host = is_host_address(dst);
  if (from_host) return to_host ? DmaDirection::kHostToHost : DmaDirection::kHostToDevice;
  return to_host ? DmaDirection::kDeviceToHost : DmaDirection::kDeviceToDevice;
}

// Device memory's burst: what one element read or written out of order
// costs (LPDDR4: a 16-bit channel, burst length 16).
inline constexpr std::uint64_t kDramBurstBytes = 32;

// Frame kinds a decoder's cost depends on.
enum class FrameType : std::uint32_t { kIntra = 0, kPredicted = 1, kBidirectional = 2 };

struct TimingModel {
  // The tensor engine.
  std::uint32_t clock_mhz = 0;
  std::uint32_t lanes = 0;                              // output channels computed side by side
  std::uint32_t lane_memory_kib = 0;                    // local memory per lane (tiles; informative)
  std::uint32_t l2_kib = 0;                             // shared on-chip memory (informative)
  std::uint32_t macs_per_lane_cycle[kMacPrecisions]{};  // multiply-adds one lane does per cycle
  std::uint32_t channel_tile[kMacPrecisions]{};         // input channels a lane sums per step
  std::uint32_t mac_efficiency_pct[kMacPrecisions]{};   // share of the array's peak a full layer sustains
  std::uint32_t vector_lane_elems[kMacPrecisions]{};    // vector unit: elements per lane per cycle
  std::uint32_t command_ns = 0;                         // every command: fetch, decode, retire
  std::uint32_t op_ns = 0;                              // every tensor op: setup, tiling, pipeline fill
  // Memory and DMA, in MB/s (10^6 bytes).
  std::uint64_t dram_mbps = 0;  // device memory, what tensor ops and fills read and write
  std::uint64_t host_mbps = 0;  // a copy with either end in host memory (the bus)
  std::uint64_t d2d_mbps = 0;   // a copy within device memory
  // The video unit: pixels per second of P frames, by VideoCodec - 1
  // (H.264, H.265, JPEG); I and B frames cost these percentages of a P
  // frame's time. JPEG frames are all I frames at the JPEG rate.
  std::uint64_t decode_pixels_per_s[3]{};
  std::uint32_t intra_pct = 0;
  std::uint32_t bidir_pct = 0;

  // The array's peak in multiply-adds per second, at a precision.
  std::uint64_t peak_macs_per_s(MacPrecision p) const noexcept;
};
// What MboxCmd::kTimingModel writes: this struct, byte for byte.
static_assert(sizeof(TimingModel) == 128);

// What a model must have to cost every command: each field positive and
// each percentage at most 100 (intra_pct and bidir_pct: 100 to 1000).
// Returns the first field that is not so ("channel_tile.int8") and why in
// `why`, or nullptr.
const char* check_timing(const TimingModel& m, const char** why) noexcept;

// A tensor op's work, from its parameter block alone.
struct OpWork {
  MacPrecision precision = MacPrecision::kF32;
  std::uint64_t macs = 0;           // multiply-adds the op asks for
  std::uint64_t lane_macs = 0;      // the same padded to the lanes and channel tiles they occupy
  std::uint64_t vector_cycles = 0;  // vector-unit element-cycles (elements times cycles per element)
  std::uint64_t bytes = 0;          // tensor bytes read and written, each tensor once
};
OpWork op_work(const TimingModel& m, const OpBlock& op) noexcept;

// What bounds a command's time.
enum class Bound : std::uint32_t { kCompute = 0, kMemory = 1, kOverhead = 2 };
const char* to_string(Bound b) noexcept;

struct CommandTime {
  std::uint64_t ns = 0;  // the whole command: max(compute, memory) + overhead
  std::uint64_t compute_ns = 0;
  std::uint64_t memory_ns = 0;
  std::uint64_t overhead_ns = 0;
  Bound bound = Bound::kOverhead;
};

// A tensor op's time. kBadArgument naming the op's kind (value) if the
// model has no rate for what it needs (a checked model always has).
Result<CommandTime> op_time(const TimingModel& m, const OpBlock& op) noexcept;
Result<CommandTime> op_time(const TimingModel& m, const OpWork& work, OpKind kind) noexcept;
// A copy of `bytes` in a DmaDirection; a fill of `bytes` of device memory.
CommandTime copy_time(const TimingModel& m, std::uint64_t bytes, DmaDirection direction) noexcept;
CommandTime fill_time(const TimingModel& m, std::uint64_t bytes) noexcept;
// Any other command (a fence, a wait, a timestamp, a video command's own
// work): the fixed cost.
CommandTime command_time(const TimingModel& m) noexcept;
// The video unit's time for one decoded frame of width x height.
std::uint64_t decode_ns(const TimingModel& m, VideoCodec codec, FrameType type, std::uint32_t width,
                        std::uint32_t height) noexcept;

}  // namespace tpuhal::fw
