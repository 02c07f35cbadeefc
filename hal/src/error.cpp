#include "tpuhal/error.hpp"

#include "tpuhal/types.hpp"

namespace tpuhal {

const char* to_string(Status status) noexcept {
  switch (status) {
#define TPUHAL_STATUS(name, c_name, value, text, python_also, doc) \
  case Status::name:                                               \
    return text;
#include "tpuhal/status.inc"
#undef TPUHAL_STATUS
  }
  return "unknown status";
}

Error::Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}

const char* to_string(Memory memory) noexcept {
  switch (memory) {
    case Memory::Device: return "device";
    case Memory::DeviceHostVisible: return "device-host-visible";
    case Memory::HostPinned: return "host-pinned";
  }
  return "unknown";
}

const char* to_string(Engine engine) noexcept {
  switch (engine) {
    case Engine::Compute: return "compute";
    case Engine::Copy: return "copy";
    case Engine::Video: return "video";
  }
  return "unknown";
}

const char* to_string(FrameType type) noexcept {
  switch (type) {
    case FrameType::Intra: return "I";
    case FrameType::Predicted: return "P";
    case FrameType::Bidirectional: return "B";
  }
  return "unknown";
}

const char* to_string(ModelledTime::Bound bound) noexcept {
  switch (bound) {
    case ModelledTime::Bound::Compute: return "compute";
    case ModelledTime::Bound::Memory: return "memory";
    case ModelledTime::Bound::Overhead: return "overhead";
  }
  return "unknown";
}

const char* to_string(Codec codec) noexcept {
  switch (codec) {
    case Codec::H264: return "h264";
    case Codec::H265: return "h265";
    case Codec::Jpeg: return "jpeg";
  }
  return "unknown";
}

const char* to_string(PixelFormat format) noexcept {
  switch (format) {
    case PixelFormat::NV12: return "nv12";
    case PixelFormat::I420: return "i420";
  }
  return "unknown";
}

const char* to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::I8: return "i8";
    case DType::U8: return "u8";
    case DType::I32: return "i32";
  }
  return "unknown";
}

const char* to_string(WaitPolicy::Mode mode) noexcept {
  switch (mode) {
    case WaitPolicy::Mode::Hybrid: return "hybrid";
    case WaitPolicy::Mode::Spin: return "spin";
    case WaitPolicy::Mode::Block: return "block";
  }
  return "unknown";
}

}  // namespace tpuhal
