// The video engine (interface 1.2): decoder channels of the board's codec
// unit, driven through video queues.
//
// A channel is opened by kVideoOpen on a video queue with three pieces of
// memory the driver provides:
//   - a channel page in DMA-mapped host memory (VideoChannelHeader, then
//     slot_count slot words, then record_count FrameRecords);
//   - a frame pool in device DRAM: slot_count slots of slot_bytes each;
//   - packets: kVideoDecode names a packet in host or device memory, which
//     the board copies before the command retires (the driver may reuse the
//     packet's memory once the command's fence is reached).
// Decoding is asynchronous: the codec unit's decode threads take packets in
// order, write each frame into a free slot of the pool, then append a
// FrameRecord to the channel page and raise the interrupt vector of the
// queue that opened the channel. Frames come out in display order.
//
// Slot ownership is a word per slot in the channel page: the board sets it to
// kSlotHeld when it publishes a frame there; the driver stores kSlotFree
// (release ordering) when the frame is released, then writes the channel's
// number to reg::kVideoDoorbell so that a channel waiting for a slot resumes.
// The board never writes a slot whose word is kSlotHeld. The driver
// initialises the page before kVideoOpen (consumed = 0, every slot word free
// except those of frames it still holds from before a reset); the board
// zeroes the counters it writes.
//
// Records are a ring of record_count entries: the board writes record n at
// records[n % record_count] and then `published` = n + 1 (release); the
// driver reads records below `published` and advances `consumed`. The board
// never overwrites a record at or above `consumed`.
//
// Errors in the stream (corrupt or truncated data, a frame larger than the
// slots) are records of kind kRecordError naming the packet; the channel
// keeps decoding what follows. Errors in a command's arguments fail the
// command and halt the queue, like every other opcode.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tpuhal::fw {

enum class VideoCodec : std::uint8_t { kH264 = 1, kH265 = 2, kJpeg = 3 };
enum class PixelLayout : std::uint8_t {
  kNv12 = 1,  // Y plane, then interleaved U/V at half resolution
  kI420 = 2,  // Y, U, V planes; chroma at half resolution (rounded up)
};
const char* to_string(VideoCodec codec) noexcept;
const char* to_string(PixelLayout layout) noexcept;

// Board limits of interface 1.2.
inline constexpr std::uint32_t kMaxVideoChannels = 4096;
inline constexpr std::uint32_t kMaxVideoSlots = 64;
inline constexpr std::uint32_t kMaxVideoRecords = 256;
inline constexpr std::uint64_t kMaxVideoPacketBytes = 64ull << 20;
inline constexpr std::uint32_t kMaxVideoDimension = 8192;
// Packets a channel holds that its decoder has not taken yet: a
// kVideoDecode past it fails with kOutOfMemory (kMemoryVideoPackets). The
// driver keeps below it by waiting for packets_done. Packets also count
// against the codec unit's working memory (kMemoryVideoUnit), with the
// decoders' frames.
inline constexpr std::uint32_t kMaxVideoPendingPackets = 64;

// Plane pitches and offsets inside a slot are multiples of this.
inline constexpr std::uint32_t kVideoPlaneAlign = 64;

// kVideoOpen arguments.
//   args[0] channel (< reg::kDecodeChannels)
//   args[1] codec | layout << 8 | max_width << 16 (16 bits) | max_height << 32 (16 bits)
//   args[2] channel page address (host memory, 4 KiB aligned)
//   args[3] frame pool address (device DRAM, 4 KiB aligned)
//   args[4] slot bytes (>= frame_bytes(max_width, max_height, layout))
//   args[5] slot_count | record_count << 32
// kVideoDecode arguments.
//   args[0] channel
//   args[1] packet address (host or DRAM; 0 with size 0 for an end-of-stream marker)
//   args[2] packet bytes
//   args[3] pts (passed through to the frame)
//   args[4] packet index (the driver's count; named in error records)
//   args[5] flags: kVideoPacketEos (flush: every frame still inside comes out,
//           then a kRecordEos record)
// kVideoClose arguments.
//   args[0] channel: drops the decoder, its queued packets and frames not yet
//           published; the board no longer touches the page or the pool once
//           the command retires.
inline constexpr std::uint64_t kVideoPacketEos = 1u << 0;

inline constexpr std::uint32_t kSlotFree = 0;
inline constexpr std::uint32_t kSlotHeld = 1;

// FrameRecord::detail of a kUnsupportedStream error.
inline constexpr std::uint32_t kVideoDetailPixelFormat = 1;  // not 8-bit 4:2:0
inline constexpr std::uint32_t kVideoDetailTooLarge = 2;     // larger than the channel's slots

enum class RecordKind : std::uint32_t {
  kFrame = 1,
  kError = 2,  // status/detail say what; packet names it
  kEos = 3,    // every frame before the end-of-stream marker has been published
};

struct FrameRecord {
  std::uint32_t kind;           // RecordKind
  std::uint32_t slot;           // kFrame: pool slot holding the frame
  std::uint64_t packet;         // packet index this record came from (kError/kEos: the packet)
  std::int64_t pts;             // kFrame: the pts of the packet the frame came from
  std::uint32_t width, height;  // in the layout the channel was opened with
  std::uint32_t pitch[3];       // bytes per row of Y, then U/V (NV12: one chroma plane)
  std::uint32_t offset[3];      // plane offsets inside the slot
  std::uint32_t status;         // kError: CmdStatus; kFrame: see frame_done_ns
  std::uint32_t detail;         // kError: kCorruptStream: the decoder's own code;
                                // kUnsupportedStream: kVideoDetail*
};
static_assert(sizeof(FrameRecord) == 64);

// Interface 1.21: a kFrame record carries, in the words its kind leaves
// unused, the board time (ns since reset) at which the codec unit finished
// the frame: status | detail << 32. On a modelled clock that is the model's
// time for the frame on the video unit (docs/timing.md). 0 from a board of
// 1.20.
constexpr std::uint64_t frame_done_ns(const FrameRecord& r) noexcept {
  return r.status | std::uint64_t{r.detail} << 32;
}
constexpr void set_frame_done_ns(FrameRecord& r, std::uint64_t ns) noexcept {
  r.status = static_cast<std::uint32_t>(ns);
  r.detail = static_cast<std::uint32_t>(ns >> 32);
}

struct VideoChannelHeader {
  std::uint64_t published;     // board: records written (release)
  std::uint64_t consumed;      // driver: records read
  std::uint64_t packets_done;  // board: packets fully decoded (frames may be waiting for slots)
  std::uint64_t frames;        // board: frames published since open
  std::uint32_t waiting;       // board: 1 while output waits for a free slot or record
  std::uint32_t reserved0;
  std::uint64_t reserved[3];
};
static_assert(sizeof(VideoChannelHeader) == 64);

// Byte size of a channel page and where its parts are.
constexpr std::uint64_t video_slots_offset() { return sizeof(VideoChannelHeader); }
constexpr std::uint64_t video_records_offset(std::uint32_t slot_count) {
  return (sizeof(VideoChannelHeader) + 4ull * slot_count + 63) / 64 * 64;
}
constexpr std::uint64_t video_page_bytes(std::uint32_t slot_count, std::uint32_t record_count) {
  return (video_records_offset(slot_count) + sizeof(FrameRecord) * record_count + 4095) / 4096 * 4096;
}

// The plane layout of a width x height frame in `layout` inside a slot.
struct PlaneLayout {
  std::uint32_t planes;
  std::uint32_t pitch[3];
  std::uint32_t rows[3];
  std::uint32_t row_bytes[3];  // bytes of each row that hold pixels
  std::uint64_t offset[3];
  std::uint64_t bytes;  // the slot bytes the frame needs
};
constexpr PlaneLayout plane_layout(std::uint32_t width, std::uint32_t height, PixelLayout layout) {
  auto align = [](std::uint64_t v) { return (v + kVideoPlaneAlign - 1) / kVideoPlaneAlign * kVideoPlaneAlign; };
  const std::uint32_t cw = (width + 1) / 2, ch = (height + 1) / 2;
  PlaneLayout p{};
  p.pitch[0] = static_cast<std::uint32_t>(align(width));
  p.rows[0] = height;
  p.row_bytes[0] = width;
  p.offset[0] = 0;
  std::uint64_t at = align(std::uint64_t{p.pitch[0]} * height);
  if (layout == PixelLayout::kNv12) {
    p.planes = 2;
    p.pitch[1] = static_cast<std::uint32_t>(align(2ull * cw));
    p.rows[1] = ch;
    p.row_bytes[1] = 2 * cw;
    p.offset[1] = at;
    at += align(std::uint64_t{p.pitch[1]} * ch);
  } else {
    p.planes = 3;
    for (int i = 1; i < 3; ++i) {
      p.pitch[i] = static_cast<std::uint32_t>(align(cw));
      p.rows[i] = ch;
      p.row_bytes[i] = cw;
      p.offset[i] = at;
      at += align(std::uint64_t{p.pitch[i]} * ch);
    }
  }
  p.bytes = at;
  return p;
}

}  // namespace tpuhal::fw
