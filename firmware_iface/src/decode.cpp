#include "tpuhal/fw/decode.h"

#include <cstddef>
#include <cstring>

#include "tpuhal/fw/tensor.h"

namespace tpuhal::fw {
namespace {

Problem problem(CmdStatus status, std::uint16_t field, std::uint64_t value, std::uint64_t detail = 0) {
  return Problem{status, field, value, detail};
}

// Every argument from `first` on must be zero.
bool reserved_args_zero(const CommandDescriptor& d, int first, Problem& out) {
  for (int i = first; i < 6; ++i) {
    if (d.args[i] != 0) {
      out = problem(CmdStatus::kReservedNotZero, static_cast<std::uint16_t>(i), d.args[i]);
      return false;
    }
  }
  return true;
}

bool range_ok(std::uint64_t address, std::uint64_t size) { return address <= UINT64_MAX - size; }

}  // namespace

Result<Command> decode_command(const CommandDescriptor& d) {
  if (d.opcode == 0 || d.opcode > kMaxOpcode)
    return problem(CmdStatus::kInvalidOpcode, Problem::kFieldOpcode, d.opcode);
  if (d.flags & ~kKnownFlags) return problem(CmdStatus::kInvalidFlags, Problem::kFieldFlags, d.flags, kKnownFlags);
  if ((d.flags & kFlagFence) && (d.fence_value == 0 || d.fence_value > kTimelineValueMask))
    return problem(CmdStatus::kBadArgument, Problem::kFieldFence, d.fence_value, kTimelineValueMask);

  Command c;
  c.opcode = static_cast<Opcode>(d.opcode);
  c.flags = d.flags;
  c.sequence = d.sequence;
  c.fence_value = d.fence_value;
  Problem p;

  switch (c.opcode) {
    case Opcode::kNop:
      if (!reserved_args_zero(d, 0, p)) return p;
      c.args = NopArgs{};
      return c;

    case Opcode::kCopy: {
      if (!reserved_args_zero(d, 3, p)) return p;
      const CopyArgs a{d.args[0], d.args[1], d.args[2]};
      if (a.size == 0 || a.size > kMaxTransferBytes)
        return problem(CmdStatus::kBadArgument, 2, a.size, kMaxTransferBytes);
      if (!range_ok(a.src, a.size)) return problem(CmdStatus::kBadArgument, 0, a.src);
      if (!range_ok(a.dst, a.size)) return problem(CmdStatus::kBadArgument, 1, a.dst);
      c.args = a;
      return c;
    }

    case Opcode::kCopySg: {
      if (!reserved_args_zero(d, 3, p)) return p;
      const CopySgArgs a{d.args[0], d.args[1], d.args[2]};
      if (a.list % sizeof(DmaSegment) != 0) return problem(CmdStatus::kBadAlignment, 0, a.list, sizeof(DmaSegment));
      if (a.count == 0 || a.count > kMaxSgSegments) return problem(CmdStatus::kBadArgument, 1, a.count, kMaxSgSegments);
      if (!range_ok(a.list, a.count * sizeof(DmaSegment))) return problem(CmdStatus::kBadArgument, 0, a.list);
      if (a.total == 0 || a.total > kMaxTransferBytes)
        return problem(CmdStatus::kBadArgument, 2, a.total, kMaxTransferBytes);
      c.args = a;
      return c;
    }

    case Opcode::kFill: {
      if (!reserved_args_zero(d, 3, p)) return p;
      const std::uint64_t packed = d.args[2];
      const std::uint64_t width = packed >> 32;
      if (width != 1 && width != 2 && width != 4) return problem(CmdStatus::kBadArgument, 2, packed, 4);
      const auto pattern = static_cast<std::uint32_t>(packed);
      if (width < 4 && (pattern >> (8 * width)) != 0) return problem(CmdStatus::kBadArgument, 2, packed, width);
      FillArgs a{d.args[0], d.args[1], pattern, static_cast<std::uint32_t>(width)};
      if (a.size == 0 || a.size > kMaxTransferBytes)
        return problem(CmdStatus::kBadArgument, 1, a.size, kMaxTransferBytes);
      if (a.size % width != 0) return problem(CmdStatus::kBadAlignment, 1, a.size, width);
      if (a.dst % width != 0) return problem(CmdStatus::kBadAlignment, 0, a.dst, width);
      if (!range_ok(a.dst, a.size)) return problem(CmdStatus::kBadArgument, 0, a.dst);
      c.args = a;
      return c;
    }

    case Opcode::kWaitValue: {
      if (!reserved_args_zero(d, 3, p)) return p;
      if (d.args[0] % 8 != 0) return problem(CmdStatus::kBadAlignment, 0, d.args[0], 8);
      if (d.args[2] > static_cast<std::uint64_t>(WaitMode::kTimeline))
        return problem(CmdStatus::kBadArgument, 2, d.args[2], 1);
      const auto mode = static_cast<WaitMode>(d.args[2]);
      if (mode == WaitMode::kTimeline && d.args[1] > kTimelineValueMask)
        return problem(CmdStatus::kBadArgument, 1, d.args[1], kTimelineValueMask);
      c.args = WaitValueArgs{d.args[0], d.args[1], mode};
      return c;
    }

    case Opcode::kWriteValue:
      if (!reserved_args_zero(d, 2, p)) return p;
      if (d.args[0] % 8 != 0) return problem(CmdStatus::kBadAlignment, 0, d.args[0], 8);
      c.args = WriteValueArgs{d.args[0], d.args[1]};
      return c;

    case Opcode::kTimestamp:
      if (!reserved_args_zero(d, 1, p)) return p;
      if (d.args[0] % 8 != 0) return problem(CmdStatus::kBadAlignment, 0, d.args[0], 8);
      c.args = TimestampArgs{d.args[0]};
      return c;

    case Opcode::kTensorOp: {
      if (!reserved_args_zero(d, 2, p)) return p;
      const TensorOpArgs a{d.args[0], d.args[1]};
      if (a.address % 8 != 0) return problem(CmdStatus::kBadAlignment, 0, a.address, 8);
      if (a.bytes < sizeof(OpHeader) || a.bytes > kMaxParamBytes)
        return problem(CmdStatus::kBadArgument, 1, a.bytes, kMaxParamBytes);
      if (!range_ok(a.address, a.bytes)) return problem(CmdStatus::kBadArgument, 0, a.address);
      c.args = a;
      return c;
    }

    case Opcode::kCall: {
      if (!reserved_args_zero(d, 2, p)) return p;
      const CallArgs a{d.args[0], d.args[1]};
      if (a.address == 0 || a.address % 64 != 0) return problem(CmdStatus::kBadAlignment, 0, a.address, 64);
      if (a.slots == 0 || a.slots > kMaxCallSlots) return problem(CmdStatus::kBadArgument, 1, a.slots, kMaxCallSlots);
      if (!range_ok(a.address, a.slots * sizeof(CommandDescriptor)))
        return problem(CmdStatus::kBadArgument, 0, a.address);
      c.args = a;
      return c;
    }

    case Opcode::kVideoOpen: {
      VideoOpenArgs a{};
      a.channel = static_cast<std::uint32_t>(d.args[0]);
      if (d.args[0] >= kMaxVideoChannels) return problem(CmdStatus::kBadArgument, 0, d.args[0], kMaxVideoChannels);
      const std::uint64_t cfg = d.args[1];
      const auto codec = cfg & 0xFF, layout = cfg >> 8 & 0xFF;
      a.max_width = static_cast<std::uint32_t>(cfg >> 16 & 0xFFFF);
      a.max_height = static_cast<std::uint32_t>(cfg >> 32 & 0xFFFF);
      if (codec < 1 || codec > 3) return problem(CmdStatus::kBadArgument, 1, cfg, 3);
      if (layout < 1 || layout > 2) return problem(CmdStatus::kBadArgument, 1, cfg, 2);
      if (cfg >> 48 != 0) return problem(CmdStatus::kReservedNotZero, 1, cfg);
      if (a.max_width == 0 || a.max_height == 0 || a.max_width > kMaxVideoDimension ||
          a.max_height > kMaxVideoDimension)
        return problem(CmdStatus::kBadArgument, 1, cfg, kMaxVideoDimension);
      a.codec = static_cast<VideoCodec>(codec);
      a.layout = static_cast<PixelLayout>(layout);
      a.page = d.args[2];
      a.pool = d.args[3];
      a.slot_bytes = d.args[4];
      a.slot_count = static_cast<std::uint32_t>(d.args[5]);
      a.record_count = static_cast<std::uint32_t>(d.args[5] >> 32);
      if (a.page == 0 || a.page % 4096 != 0) return problem(CmdStatus::kBadAlignment, 2, a.page, 4096);
      if (a.pool % 4096 != 0) return problem(CmdStatus::kBadAlignment, 3, a.pool, 4096);
      if (a.slot_bytes < plane_layout(a.max_width, a.max_height, a.layout).bytes ||
          a.slot_bytes % kVideoPlaneAlign != 0 || a.slot_bytes > (1ull << 32))
        return problem(CmdStatus::kBadArgument, 4, a.slot_bytes,
                       plane_layout(a.max_width, a.max_height, a.layout).bytes);
      if (a.slot_count == 0 || a.slot_count > kMaxVideoSlots || a.record_count < a.slot_count ||
          a.record_count > kMaxVideoRecords)
        return problem(CmdStatus::kBadArgument, 5, d.args[5], kMaxVideoRecords);
      if (!range_ok(a.pool, a.slot_bytes * a.slot_count)) return problem(CmdStatus::kBadArgument, 3, a.pool);
      if (!range_ok(a.page, video_page_bytes(a.slot_count, a.record_count)))
        return problem(CmdStatus::kBadArgument, 2, a.page);
      c.args = a;
      return c;
    }

    case Opcode::kVideoDecode: {
      VideoDecodeArgs a{};
      if (d.args[0] >= kMaxVideoChannels) return problem(CmdStatus::kBadArgument, 0, d.args[0], kMaxVideoChannels);
      a.channel = static_cast<std::uint32_t>(d.args[0]);
      a.packet = d.args[1];
      a.bytes = d.args[2];
      a.pts = static_cast<std::int64_t>(d.args[3]);
      a.index = d.args[4];
      if (d.args[5] & ~kVideoPacketEos) return problem(CmdStatus::kReservedNotZero, 5, d.args[5]);
      a.eos = (d.args[5] & kVideoPacketEos) != 0;
      if (a.eos ? (a.bytes != 0 || a.packet != 0) : a.bytes == 0)
        return problem(CmdStatus::kBadArgument, 2, a.bytes, kMaxVideoPacketBytes);
      if (a.bytes > kMaxVideoPacketBytes) return problem(CmdStatus::kBadArgument, 2, a.bytes, kMaxVideoPacketBytes);
      if (!range_ok(a.packet, a.bytes)) return problem(CmdStatus::kBadArgument, 1, a.packet);
      c.args = a;
      return c;
    }

    case Opcode::kVideoClose: {
      if (!reserved_args_zero(d, 1, p)) return p;
      if (d.args[0] >= kMaxVideoChannels) return problem(CmdStatus::kBadArgument, 0, d.args[0], kMaxVideoChannels);
      c.args = VideoCloseArgs{static_cast<std::uint32_t>(d.args[0])};
      return c;
    }

    case Opcode::kWaitTime:
      if (!reserved_args_zero(d, 1, p)) return p;
      if (d.args[0] > kMaxWaitTimeNs) return problem(CmdStatus::kBadArgument, 0, d.args[0], kMaxWaitTimeNs);
      c.args = WaitTimeArgs{d.args[0]};
      return c;

    case Opcode::kInvalid: break;
  }
  return problem(CmdStatus::kInvalidOpcode, Problem::kFieldOpcode, d.opcode);
}

std::uint64_t command_slots(const Command& c) noexcept {
  if (const auto* t = std::get_if<TensorOpArgs>(&c.args); t && t->address == 0) return 1 + inline_slots(t->bytes);
  return 1;
}

Result<Command> decode_command(std::span<const std::byte> bytes) {
  if (bytes.size() != sizeof(CommandDescriptor))
    return problem(CmdStatus::kBadArgument, Problem::kFieldLength, bytes.size(), sizeof(CommandDescriptor));
  CommandDescriptor d;
  std::memcpy(&d, bytes.data(), sizeof d);
  return decode_command(d);
}

Result<DmaSegment> decode_segment(const DmaSegment& s) {
  if (s.reserved != 0) return problem(CmdStatus::kReservedNotZero, 3, s.reserved);
  if (s.size == 0 || s.size > kMaxTransferBytes) return problem(CmdStatus::kBadArgument, 2, s.size, kMaxTransferBytes);
  if (!range_ok(s.src, s.size)) return problem(CmdStatus::kBadArgument, 0, s.src);
  if (!range_ok(s.dst, s.size)) return problem(CmdStatus::kBadArgument, 1, s.dst);
  return s;
}

bool engine_accepts(EngineType engine, Opcode op) noexcept {
  if (op == Opcode::kInvalid || static_cast<std::uint16_t>(op) > kMaxOpcode) return false;
  const bool video = op == Opcode::kVideoOpen || op == Opcode::kVideoDecode || op == Opcode::kVideoClose;
  switch (engine) {
    case EngineType::kCompute: return !video;
    case EngineType::kCopy:
      // DMA and synchronisation run everywhere; tensor work and programs
      // (which may hold tensor work) need the tensor engine.
      return op != Opcode::kTensorOp && op != Opcode::kCall && !video;
    case EngineType::kVideo: return op != Opcode::kTensorOp && op != Opcode::kCall;
    case EngineType::kNone: break;
  }
  return false;
}

Result<FrameRecord> decode_frame_record(const FrameRecord& r, const VideoOpenArgs& open) {
  auto bad = [](std::size_t field, std::uint64_t value, std::uint64_t detail = 0) {
    return problem(CmdStatus::kFirmwareFault, static_cast<std::uint16_t>(field), value, detail);
  };
  switch (static_cast<RecordKind>(r.kind)) {
    case RecordKind::kFrame: {
      if (r.slot >= open.slot_count) return bad(offsetof(FrameRecord, slot), r.slot, open.slot_count);
      if (r.width == 0 || r.width > open.max_width) return bad(offsetof(FrameRecord, width), r.width, open.max_width);
      if (r.height == 0 || r.height > open.max_height)
        return bad(offsetof(FrameRecord, height), r.height, open.max_height);
      const PlaneLayout L = plane_layout(r.width, r.height, open.layout);
      if (L.bytes > open.slot_bytes) return bad(offsetof(FrameRecord, width), L.bytes, open.slot_bytes);
      for (std::uint32_t p = 0; p < 3; ++p) {
        const bool used = p < L.planes;
        if (r.pitch[p] != (used ? L.pitch[p] : 0))
          return bad(offsetof(FrameRecord, pitch) + 4 * p, r.pitch[p], L.pitch[p]);
        if (r.offset[p] != (used ? L.offset[p] : 0))
          return bad(offsetof(FrameRecord, offset) + 4 * p, r.offset[p], L.offset[p]);
      }
      return r;
    }
    case RecordKind::kError:
      if (r.status != static_cast<std::uint32_t>(CmdStatus::kCorruptStream) &&
          r.status != static_cast<std::uint32_t>(CmdStatus::kUnsupportedStream) &&
          r.status != static_cast<std::uint32_t>(CmdStatus::kOutOfMemory) &&
          r.status != static_cast<std::uint32_t>(CmdStatus::kDmaFault))
        return bad(offsetof(FrameRecord, status), r.status);
      return r;
    case RecordKind::kEos: return r;
  }
  return bad(offsetof(FrameRecord, kind), r.kind);
}

Result<Failure> decode_failure(const FenceRecord& r) {
  if (r.error_status == 0 || !is_known(r.error_status))
    return problem(CmdStatus::kFirmwareFault, Problem::kNoField, r.error_status);
  Failure f;
  f.status = static_cast<CmdStatus>(r.error_status);
  f.opcode = r.error_opcode;
  f.field = r.error_field;
  f.sequence = r.error_sequence;
  f.fence = r.error_fence;
  f.value = r.error_value;
  f.detail = r.error_detail;
  return f;
}

}  // namespace tpuhal::fw
