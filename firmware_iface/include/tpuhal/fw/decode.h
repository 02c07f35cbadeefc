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
#include "tpuhal/fw/tensor.h"
#include "tpuhal/fw/video.h"
#include "tpuhal/fw/window.h"  // window_output, first_empty_window, kMaxWindowValue

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
struct TensorOpArgs {
  std::uint64_t address;  // 0: the block is inline, in the following slots
  std::uint64_t bytes;
};
struct CallArgs {
  std::uint64_t address;
  std::uint64_t slots;
};
struct VideoOpenArgs {
  std::uint32_t channel;
  VideoCodec codec;
  PixelLayout layout;
  std::uint32_t max_width, max_height;
  std::uint64_t page;  // channel page (host memory)
  std::uint64_t pool;  // frame pool (DRAM)
  std::uint64_t slot_bytes;
  std::uint32_t slot_count, record_count;
};
struct VideoDecodeArgs {
  std::uint32_t channel;
  std::uint64_t packet, bytes;
  std::int64_t pts;
  std::uint64_t index;
  bool eos;
};
struct VideoCloseArgs {
  std::uint32_t channel;
};
struct WaitTimeArgs {
  std::uint64_t ns;  // board time
};

// Alternative i holds the arguments of opcode i + 1.
using CommandArgs = std::variant<NopArgs, CopyArgs, CopySgArgs, FillArgs, WaitValueArgs, WriteValueArgs, TimestampArgs,
                                 TensorOpArgs, CallArgs, VideoOpenArgs, VideoDecodeArgs, VideoCloseArgs, WaitTimeArgs>;

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

// Ring slots a decoded command occupies: 1, plus its inline parameter block.
std::uint64_t command_slots(const Command& c) noexcept;

// Validates one scatter-gather segment.
Result<DmaSegment> decode_segment(const DmaSegment& s);

// Whether `op` may run on a queue of `engine` (tensor ops: compute only;
// video ops: video only).
bool engine_accepts(EngineType engine, Opcode op) noexcept;

// A failure as the board reported it in a FenceRecord.
struct Failure {
  CmdStatus status = CmdStatus::kOk;
  std::uint16_t opcode = 0;  // raw: a bad opcode is itself the failure
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

// The driver's view of a FrameRecord the board wrote into a channel opened
// with `open`: the kind is known; a frame's slot is in the pool, its size
// within the channel's maximum, and its planes exactly where plane_layout()
// puts them; an error's status is a stream error. Problem::field is the
// record's byte offset of the bad field.
Result<FrameRecord> decode_frame_record(const FrameRecord& record, const VideoOpenArgs& open);

// One line a person can act on, e.g.
//   "copy: src address 0x1000000000 is not mapped for DMA (read)".
std::string describe(CmdStatus status, std::uint16_t opcode, std::uint16_t field, std::uint64_t value,
                     std::uint64_t detail);
inline std::string describe(const Problem& p, std::uint16_t opcode) {
  return describe(p.status, opcode, p.field, p.value, p.detail);
}
inline std::string describe(const Failure& f) { return describe(f.status, f.opcode, f.field, f.value, f.detail); }

// Name of argument `index` of `op` ("src", "size", ...), or "arg<index>".
std::string arg_name(std::uint16_t opcode, std::uint16_t index);

// ---- Tensor ops ---------------------------------------------------------------

// OpAttrs: every kind's attribute struct, from the op schema.
#include "tpuhal/fw/op_attrs_variant.inc"

// A validated parameter block: dtypes, ranks, shapes and strides agree with
// the op's rules (docs/ops.md), extents do not overflow, outputs do not
// overlap themselves or any input. Whether the addresses are backed by
// memory is the executor's question.
struct OpBlock {
  OpKind kind = OpKind::kInvalid;
  std::uint32_t num_tensors = 0;
  TensorRef tensors[kMaxOpTensors] = {};
  std::uint64_t extent[kMaxOpTensors] = {};  // bytes each tensor spans from its address
  OpAttrs attrs;
  std::uint32_t flags = 0;  // OpHeader::flags (kOpGlobal)
};
Result<OpBlock> decode_op(std::span<const std::byte> block);

// The tensors `op` reads: each but its kind's outputs (OpKindInfo::written),
// and its output too where it accumulates into it (a kConv2d with
// ConvAttrs::accumulate). A bit per tensor, as OpKindInfo::written.
inline std::uint32_t read_mask(const OpBlock& op) noexcept {
  const std::uint32_t all = (1u << op.num_tensors) - 1, written = op_kind_info(op.kind).written;
  const auto* conv = std::get_if<ConvAttrs>(&op.attrs);
  const bool accumulates = op.kind == OpKind::kConv2d && conv && conv->accumulate;
  return (all & ~written) | (accumulates ? written : 0u);
}

// Bytes from a tensor's address to the end of its last element (0 if empty);
// UINT64_MAX if that overflows.
std::uint64_t tensor_extent(const TensorRef& t) noexcept;
std::uint64_t tensor_elements(const TensorRef& t) noexcept;

// Problem::field for a tensor op problem: which tensor and which aspect of
// it, or which attribute word.
enum class TensorAspect : std::uint16_t {
  kDType = 0,
  kRank = 1,
  kShape = 2 /* + dim, 0..5 */,
  kStride = 8 /* + dim */,
  kAddress = 14,
  kOverlap = 15,
};
inline constexpr std::uint16_t kFieldTensorBase = 0x200;
inline constexpr std::uint16_t kFieldAttrBase = 0x300;
constexpr std::uint16_t tensor_field(std::uint32_t tensor, TensorAspect aspect, std::uint32_t dim = 0) {
  return static_cast<std::uint16_t>(kFieldTensorBase + tensor * 16 + static_cast<std::uint16_t>(aspect) + dim);
}
constexpr std::uint16_t attr_field(std::size_t byte_offset) {
  return static_cast<std::uint16_t>(kFieldAttrBase + byte_offset / 4);
}
// A value in a tensor's data that the op refuses when it runs (1.11: an
// index of gather outside its axis; Problem::value the index as int64,
// Problem::detail the axis's length).
inline constexpr std::uint16_t kFieldTensorDataBase = 0x700;  // past the attribute words (0x300 + 1024)
constexpr std::uint16_t tensor_data_field(std::uint32_t tensor) {
  return static_cast<std::uint16_t>(kFieldTensorDataBase + tensor);
}
// A row of a tensor's data that the op refuses when it runs (1.22: a region
// of roi_align's Rois): Problem::value the row; Problem::detail the bound
// on the work one row may ask for (samples) that the row asks more than, or
// 0 where the row holds a value that is not finite.
inline constexpr std::uint16_t kFieldTensorRowBase = 0x710;  // past the tensor data fields
constexpr std::uint16_t tensor_row_field(std::uint32_t tensor) {
  return static_cast<std::uint16_t>(kFieldTensorRowBase + tensor);
}
inline constexpr std::uint16_t kFieldOpKind = 0x107;
inline constexpr std::uint16_t kFieldOpHeader = 0x108;

// DMA access kinds carried in Problem::detail for kDmaFault.
inline constexpr std::uint64_t kAccessRead = 1;
inline constexpr std::uint64_t kAccessWrite = 2;
inline constexpr std::uint64_t kAccessBusError = 3;  // kDmaFault: the transfer failed on the bus

}  // namespace tpuhal::fw
