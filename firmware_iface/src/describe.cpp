#include <cinttypes>
#include <cstdio>
#include <string>

#include "tpuhal/fw/decode.h"
#include "tpuhal/fw/version.h"
#include "tpuhal/fw/video.h"
#include "text.h"

namespace tpuhal::fw {

const char* to_string(CmdStatus status) noexcept {
  switch (status) {
    case CmdStatus::kOk: return "ok";
    case CmdStatus::kInvalidOpcode: return "invalid opcode";
    case CmdStatus::kInvalidFlags: return "invalid flags";
    case CmdStatus::kReservedNotZero: return "reserved field not zero";
    case CmdStatus::kBadSequence: return "bad sequence";
    case CmdStatus::kBadArgument: return "bad argument";
    case CmdStatus::kBadAlignment: return "bad alignment";
    case CmdStatus::kDmaFault: return "DMA fault";
    case CmdStatus::kFenceNotMonotonic: return "fence not monotonic";
    case CmdStatus::kDependencyFailed: return "dependency failed";
    case CmdStatus::kUnsupportedOnEngine: return "unsupported on engine";
    case CmdStatus::kRingConfig: return "ring configuration";
    case CmdStatus::kFirmwareFault: return "firmware fault";
    case CmdStatus::kEccError: return "ECC error";
    case CmdStatus::kHang: return "hang";
    case CmdStatus::kQueueReset: return "queue reset";
    case CmdStatus::kCorruptStream: return "corrupt stream";
    case CmdStatus::kUnsupportedStream: return "unsupported stream";
    case CmdStatus::kOutOfMemory: return "out of memory";
  }
  return "unknown status";
}

bool is_known(std::uint32_t status) noexcept { return status <= static_cast<std::uint32_t>(CmdStatus::kOutOfMemory); }

const char* to_string(Opcode op) noexcept {
  switch (op) {
    case Opcode::kInvalid: return "invalid";
    case Opcode::kNop: return "nop";
    case Opcode::kCopy: return "copy";
    case Opcode::kCopySg: return "copy_sg";
    case Opcode::kFill: return "fill";
    case Opcode::kWaitValue: return "wait_value";
    case Opcode::kWriteValue: return "write_value";
    case Opcode::kTimestamp: return "timestamp";
    case Opcode::kTensorOp: return "tensor_op";
    case Opcode::kCall: return "call";
    case Opcode::kVideoOpen: return "video_open";
    case Opcode::kVideoDecode: return "video_decode";
    case Opcode::kVideoClose: return "video_close";
    case Opcode::kWaitTime: return "wait_time";
  }
  return "unknown";
}

const char* to_string(VideoCodec codec) noexcept {
  switch (codec) {
    case VideoCodec::kH264: return "h264";
    case VideoCodec::kH265: return "h265";
    case VideoCodec::kJpeg: return "jpeg";
  }
  return "unknown";
}

const char* to_string(PixelLayout layout) noexcept {
  switch (layout) {
    case PixelLayout::kNv12: return "nv12";
    case PixelLayout::kI420: return "i420";
  }
  return "unknown";
}

const char* to_string(EngineType engine) noexcept {
  switch (engine) {
    case EngineType::kNone: return "none";
    case EngineType::kCompute: return "compute";
    case EngineType::kCopy: return "copy";
    case EngineType::kVideo: return "video";
  }
  return "unknown";
}

namespace {

using detail::hex;

std::string opcode_name(std::uint16_t opcode) {
  if (opcode >= 1 && opcode <= kMaxOpcode) return to_string(static_cast<Opcode>(opcode));
  char buf[32];
  std::snprintf(buf, sizeof buf, "opcode 0x%x", opcode);
  return buf;
}

std::string dec(std::uint64_t v) { return std::to_string(v); }

std::string field_name(std::uint16_t opcode, std::uint16_t field) {
  switch (field) {
    case Problem::kNoField: return "descriptor";
    case Problem::kFieldOpcode: return "opcode";
    case Problem::kFieldFlags: return "flags";
    case Problem::kFieldSequence: return "sequence";
    case Problem::kFieldFence: return "fence value";
    case Problem::kFieldVersion: return "interface version";
    case Problem::kFieldLength: return "length";
    case Problem::kFieldStatusPage: return "status page";
    case kFieldOpKind: return "op kind";
    case kFieldOpHeader: return "op header";
    default: break;
  }
  if (field >= kFieldTensorBase && field < kFieldAttrBase) {
    const unsigned tensor = (field - kFieldTensorBase) / 16, aspect = (field - kFieldTensorBase) % 16;
    std::string t = "tensor " + std::to_string(tensor) + " ";
    if (aspect == 0) return t + "dtype";
    if (aspect == 1) return t + "rank";
    if (aspect < 8) return t + "shape[" + std::to_string(aspect - 2) + "]";
    if (aspect < 14) return t + "strides[" + std::to_string(aspect - 8) + "]";
    if (aspect == 14) return t + "address";
    return t + "placement";
  }
  if (field >= kFieldAttrBase && field < kFieldAttrBase + kMaxParamBytes / 4)
    return "attribute word " + std::to_string(field - kFieldAttrBase);
  if (field >= kFieldTensorDataBase && field < kFieldTensorDataBase + kMaxOpTensors)
    return "tensor " + std::to_string(field - kFieldTensorDataBase) + " data";
  if (field >= kFieldTensorRowBase && field < kFieldTensorRowBase + kMaxOpTensors)
    return "tensor " + std::to_string(field - kFieldTensorRowBase) + " row";
  switch (field) {
    default: return arg_name(opcode, field);
  }
}

}  // namespace

std::string arg_name(std::uint16_t opcode, std::uint16_t index) {
  static const char* const kNames[][3] = {
      /* invalid */ {nullptr, nullptr, nullptr},
      /* nop */ {nullptr, nullptr, nullptr},
      /* copy */ {"src", "dst", "size"},
      /* copy_sg */ {"segment list", "segment count", "total size"},
      /* fill */ {"dst", "size", "pattern"},
      /* wait_value */ {"address", "value", "mode"},
      /* write_value */ {"address", "value", nullptr},
      /* timestamp */ {"address", nullptr, nullptr},
      /* tensor_op */ {"parameter block", "parameter bytes", nullptr},
      /* call */ {"command list", "slots", nullptr},
  };
  static const char* const kVideo[][6] = {
      /* video_open */ {"channel", "codec/layout/max size", "channel page", "frame pool", "slot bytes",
                        "slot/record counts"},
      /* video_decode */ {"channel", "packet", "packet bytes", "pts", "packet index", "packet flags"},
      /* video_close */ {"channel", nullptr, nullptr, nullptr, nullptr, nullptr},
  };
  if (opcode == static_cast<std::uint16_t>(Opcode::kWaitTime) && index == 0) return "board time";
  if (opcode >= static_cast<std::uint16_t>(Opcode::kVideoOpen) &&
      opcode <= static_cast<std::uint16_t>(Opcode::kVideoClose) && index < 6 &&
      kVideo[opcode - static_cast<std::uint16_t>(Opcode::kVideoOpen)][index])
    return kVideo[opcode - static_cast<std::uint16_t>(Opcode::kVideoOpen)][index];
  if (opcode <= static_cast<std::uint16_t>(Opcode::kCall) && index < 3 && kNames[opcode][index])
    return kNames[opcode][index];
  return "arg" + std::to_string(index);
}

std::string describe(CmdStatus status, std::uint16_t opcode, std::uint16_t field, std::uint64_t value,
                     std::uint64_t detail) {
  const std::string op = opcode_name(opcode);
  const std::string what = field_name(opcode, field);
  switch (status) {
    case CmdStatus::kOk: return op + ": ok";
    case CmdStatus::kInvalidOpcode:
      return "unknown opcode " + hex(value) + " (interface " + dec(kInterfaceVersion.major) + "." +
             dec(kInterfaceVersion.minor) + " defines 1.." + dec(kMaxOpcode) + ")";
    case CmdStatus::kInvalidFlags:
      return op + ": undefined flag bits " + hex(value & ~detail) + " in flags " + hex(value);
    case CmdStatus::kReservedNotZero: return op + ": unused " + what + " is " + hex(value) + ", must be zero";
    case CmdStatus::kBadSequence:
      return op + ": descriptor sequence " + dec(value) + " where the ring position is " + dec(detail) +
             " (stale or corrupt ring slot)";
    case CmdStatus::kBadArgument:
      if (field == Problem::kFieldVersion)
        return "interface version " + dec(value >> 16) + "." + dec(value & 0xFFFF) + " is not compatible with " +
               dec(detail >> 16) + "." + dec(detail & 0xFFFF);
      if (field == Problem::kFieldLength) return "descriptor of " + dec(value) + " bytes, expected " + dec(detail);
      if (field >= kFieldTensorBase && field < kFieldAttrBase && (field - kFieldTensorBase) % 16 == 15)
        return op + ": output " + what.substr(0, what.find(' ', 7)) + " overlaps input tensor " + dec(value);
      if (field >= kFieldTensorDataBase && field < kFieldTensorDataBase + kMaxOpTensors)
        return op + ": tensor " + dec(field - kFieldTensorDataBase) + " holds the index " +
               std::to_string(static_cast<std::int64_t>(value)) + ", outside [-" + dec(detail) + ", " + dec(detail) +
               ") (the length of the indexed axis)";
      if (field >= kFieldTensorRowBase && field < kFieldTensorRowBase + kMaxOpTensors)
        return op + ": row " + dec(value) + " of tensor " + dec(field - kFieldTensorRowBase) +
               (detail ? " asks for more than " + dec(detail) + " samples (the most one row may take)"
                       : " holds a value that is not finite once scaled");
      if (field >= kFieldTensorBase && field < kFieldAttrBase)
        return op + ": " + what + " = " + dec(value) + " is not valid" +
               (detail ? " (expected " + dec(detail) + ")" : std::string{});
      return op + ": " + what + " = " + dec(value) + " is out of range" +
             (detail ? " (limit " + dec(detail) + ")" : std::string{});
    case CmdStatus::kBadAlignment:
      if (value == 0) return op + ": " + what + " is 0, which is never valid";  // a call to address 0, say
      return op + ": " + what + " = " + hex(value) + " is not a multiple of " + dec(detail);
    case CmdStatus::kDmaFault:
      if (detail == kAccessBusError)
        return op + ": the transfer at " + what + " address " + hex(value) + " failed on the bus (DMA error)";
      return op + ": " + what + " address " + hex(value) + " is not mapped for DMA (" +
             (detail == kAccessWrite ? "write" : "read") + ")";
    case CmdStatus::kFenceNotMonotonic:
      return op + ": fence value " + dec(value) + " is not greater than the last one written, " + dec(detail);
    case CmdStatus::kDependencyFailed:
      return op + ": the timeline at " + hex(value) + " that this queue waits on has failed";
    case CmdStatus::kUnsupportedOnEngine:
      return op + " is not supported on a " + to_string(static_cast<EngineType>(detail)) + " queue";
    case CmdStatus::kRingConfig: return "ring configuration rejected: " + what + " = " + hex(value);
    case CmdStatus::kFirmwareFault: return "firmware fault (code " + hex(value) + ")";
    case CmdStatus::kEccError: return op + ": uncorrectable ECC error at device address " + hex(value);
    case CmdStatus::kHang: return op + ": stopped by the board's watchdog after " + dec(value / 1'000'000) + " ms";
    case CmdStatus::kQueueReset: return op + ": discarded by a queue reset";
    case CmdStatus::kCorruptStream: {
      // The simulator's decoder reports FFmpeg's four-letter error tags.
      std::string code = dec(detail);
      if (detail == 0x41444E49)
        code = "invalid data";
      else if (detail > 0xFFFFFF && detail <= 0xFFFFFFFF) {
        std::string tag;
        for (int i = 0; i < 4; ++i) {
          const char ch = static_cast<char>(detail >> (8 * i) & 0xFF);
          tag += (ch >= 0x20 && ch < 0x7F) ? ch : '?';
        }
        code = "'" + tag + "'";
      }
      return "packet " + dec(value) + " does not decode: corrupt or truncated data (decoder: " + code + ")";
    }
    case CmdStatus::kUnsupportedStream:
      if (detail == kVideoDetailPixelFormat)
        return "packet " + dec(value) + " decodes to a picture that is not 8-bit 4:2:0, which the unit does not output";
      if (detail == kVideoDetailTooLarge)
        return "packet " + dec(value) +
               " decodes to a picture larger than the channel's frame buffers (max_width x max_height)";
      return "packet " + dec(value) + ": stream not supported (" + dec(detail) + ")";
    case CmdStatus::kOutOfMemory:
      // In a frame record, value is the packet.
      if (opcode == 0 && detail == kMemoryVideoUnit)
        return "packet " + dec(value) +
               ": its frame does not fit in the codec unit's working memory, which the channels open have used up "
               "(close channels, or open them with a smaller max_width x max_height)";
      if (detail == kMemoryVideoPackets)
        return op + ": the channel already holds " + dec(value) +
               " packets its decoder has not taken (wait for packets_done before sending more)";
      if (detail == kMemoryVideoUnit)
        return op + ": the codec unit's working memory (" + dec(value >> 20) +
               " MiB: packets queued and the decoders' frames) is used up";
      return op + ": the board ran out of memory serving it" + (value ? " (" + dec(value) + " bytes)" : std::string());
  }
  return "unknown status " + dec(static_cast<std::uint32_t>(status)) + " for " + op;
}

}  // namespace tpuhal::fw
