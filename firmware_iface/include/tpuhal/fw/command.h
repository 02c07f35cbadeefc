// Command descriptors, DMA scatter-gather segments, and the queue status page.
//
// Ring protocol (one ring per hardware queue, in device DRAM):
//   driver: write descriptor(s) at ring[tail % size], each with sequence = its
//           ring position (mod 2^32); then store TAIL with release ordering
//           (on PCIe: a posted MMIO write after the descriptor writes).
//   board:  load TAIL with acquire ordering, read and validate each descriptor
//           from HEAD to TAIL, execute it, then advance HEAD. A descriptor with
//           kFlagFence writes its fence_value into the queue's status page when
//           it and everything before it on the ring are complete.
// A descriptor that fails validation or execution halts the queue: the board
// records the failure in the status page, sets kTimelineFailed in its value
// and raises the queue's interrupt. The queue runs again only after a
// queue reset (reg::queue::kControl, kQueueControlReset).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tpuhal::fw {

// ---- Device address space ------------------------------------------------
// [0, DRAM size)                          device DRAM
// [kHostWindowBase, kHostWindowEnd)       host memory, reached over the bus
//                                         through the board's IOMMU; the
//                                         address is the IOVA the host mapped
// anything else                           not decoded: a DMA fault
inline constexpr std::uint64_t kHostWindowBase = 1ull << 48;
inline constexpr std::uint64_t kHostWindowEnd = 1ull << 52;
constexpr bool is_host_address(std::uint64_t a) { return a >= kHostWindowBase && a < kHostWindowEnd; }

// ---- Descriptors -----------------------------------------------------------
enum class Opcode : std::uint16_t {
  kInvalid = 0,     // zeroed memory is never a valid command
  kNop = 1,         // no arguments
  kCopy = 2,        // args: src, dst, size (bytes, > 0); memmove semantics in DRAM
  kCopySg = 3,      // args: segment list address, segment count, total bytes
  kFill = 4,        // args: dst, size, pattern | pattern_bytes << 32 (1, 2 or 4)
  kWaitValue = 5,   // args: address (8-aligned), value, WaitMode
  kWriteValue = 6,  // args: address (8-aligned), value
  kTimestamp = 7,   // args: address (8-aligned): writes board time in ns
  // Interface 1.1:
  kTensorOp = 8,  // args: parameter block address (0: inline), block bytes
                  // (tensor.h); inline, the block fills the next
                  // ceil(bytes / 64) ring slots. Compute queues only.
  kCall = 9,      // args: command list address (64-aligned), slots: runs a
                  // recorded list of descriptors (a program) in place
  // Interface 1.2 (video.h; video queues only):
  kVideoOpen = 10,    // opens a decoder channel
  kVideoDecode = 11,  // hands the channel one packet (or its end of stream)
  kVideoClose = 12,   // closes a channel
  // Interface 1.21:
  kWaitTime = 13,  // args: board time (ns since reset): the queue's next
                   // command starts no earlier (a packet's arrival, a frame
                   // the codec unit finishes then). Every engine; costs
                   // nothing. A board on the host's clock waits for it; a
                   // modelled clock moves up to it (docs/timing.md).
};
inline constexpr std::uint16_t kMaxOpcodeV1_0 = 7;
inline constexpr std::uint16_t kMaxOpcodeV1_1 = 9;
inline constexpr std::uint16_t kMaxOpcode = 13;
// The latest board time a kWaitTime names (146 years after reset), so that
// a modelled clock moved up to it cannot overflow.
inline constexpr std::uint64_t kMaxWaitTimeNs = 1ull << 62;
const char* to_string(Opcode op) noexcept;

// Descriptor flags.
inline constexpr std::uint16_t kFlagFence = 1u << 0;      // write fence_value on completion
inline constexpr std::uint16_t kFlagInterrupt = 1u << 1;  // raise the queue's vector if unmasked
inline constexpr std::uint16_t kKnownFlags = kFlagFence | kFlagInterrupt;

// kWaitValue comparison.
enum class WaitMode : std::uint64_t {
  kGreaterEqual = 0,  // *address >= value (unsigned 64-bit)
  kTimeline = 1,      // *address is another queue's timeline word: wait until
                      // its low 63 bits >= value; if kTimelineFailed is set
                      // first, fail with kDependencyFailed
};

struct CommandDescriptor {
  std::uint16_t opcode;       // Opcode
  std::uint16_t flags;        // kFlag*
  std::uint32_t sequence;     // ring position (mod 2^32) of this descriptor
  std::uint64_t fence_value;  // the submission's timeline value; written if kFlagFence
  std::uint64_t args[6];      // opcode-specific; unused args must be zero
};
static_assert(sizeof(CommandDescriptor) == 64);
static_assert(offsetof(CommandDescriptor, fence_value) == 8);
static_assert(offsetof(CommandDescriptor, args) == 16);

// One scatter-gather element of a kCopySg list (the list lives in DRAM or
// host memory at a 32-byte aligned address).
struct DmaSegment {
  std::uint64_t src;
  std::uint64_t dst;
  std::uint64_t size;      // bytes, > 0
  std::uint64_t reserved;  // must be zero
};
static_assert(sizeof(DmaSegment) == 32);
inline constexpr std::uint64_t kMaxSgSegments = 1u << 16;

// Slots an inline parameter block of `bytes` occupies after its descriptor.
constexpr std::uint64_t inline_slots(std::uint64_t bytes) { return (bytes + 63) / 64; }

// A command list run by kCall holds descriptors like a ring, with sequence =
// slot index within the list. It may not nest kCall, and its descriptors
// carry no kFlagFence or kFlagInterrupt: the kCall's own flags complete it.
inline constexpr std::uint64_t kMaxCallSlots = 1u << 24;

// Limits every board of interface 1.x honours.
inline constexpr std::uint64_t kMaxTransferBytes = 1ull << 40;
inline constexpr std::uint32_t kMinRingEntries = 16;

// ---- Queue status page (host memory, written by the board) ---------------
// The driver gives each queue a 4 KiB page in DMA-mapped host memory and
// programs its address into reg::queue::kFence*. The board writes:
//   fence.value: the timeline, i.e. the fence_value of the last fenced
//                descriptor completed, with kTimelineFailed set once the queue
//                halts on an error. Written last, with release ordering.
//   stamps[v % kTimestampSlots]: {v, board time} for each fence value v.
inline constexpr std::uint64_t kTimelineFailed = 1ull << 63;
inline constexpr std::uint64_t kTimelineValueMask = kTimelineFailed - 1;

struct FenceRecord {
  std::uint64_t value;           // timeline (see above)
  std::uint64_t timestamp_ns;    // board time when `value` was written
  std::uint64_t error_fence;     // fence_value field of the failed descriptor
  std::uint32_t error_status;    // CmdStatus
  std::uint16_t error_opcode;    // opcode field of the failed descriptor
  std::uint16_t error_field;     // Problem::field
  std::uint32_t error_sequence;  // sequence (ring position) of the failed descriptor
  std::uint32_t reserved0;
  std::uint64_t error_value;   // Problem::value
  std::uint64_t error_detail;  // Problem::detail
  std::uint64_t reserved1;
};
static_assert(sizeof(FenceRecord) == 64);

struct TimestampSlot {
  std::uint64_t value;  // fence value this slot describes (0: never written)
  std::uint64_t ns;     // board time it completed
};
static_assert(sizeof(TimestampSlot) == 16);

inline constexpr std::uint32_t kTimestampSlots = 128;
inline constexpr std::uint32_t kQueueStatusPageSize = 4096;
struct QueueStatusPage {
  FenceRecord fence;
  std::uint8_t reserved[64 * 15];
  TimestampSlot stamps[kTimestampSlots];
  std::uint8_t tail_reserved[kQueueStatusPageSize - 64 * 16 - 16 * kTimestampSlots];
};
static_assert(sizeof(QueueStatusPage) == kQueueStatusPageSize);
static_assert(offsetof(QueueStatusPage, stamps) == 1024);

}  // namespace tpuhal::fw
