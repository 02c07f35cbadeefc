#include "tpuhal/fw/usb.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>

#include "tpuhal/fw/image.h"
#include "text.h"

namespace tpuhal::fw {
namespace {

using detail::hex;

// What each type may carry.
enum class Data : std::uint8_t { kNone, kSome, kAny };
struct Rule {
  UsbType type;
  UsbDirection direction;
  Data data;
  const char* name;
};
constexpr Rule kRules[] = {
    {UsbType::kRegWrite, UsbDirection::kToBoard, Data::kNone, "reg-write"},
    {UsbType::kRegRead, UsbDirection::kToBoard, Data::kNone, "reg-read"},
    {UsbType::kMemWrite, UsbDirection::kToBoard, Data::kSome, "mem-write"},
    {UsbType::kMemRead, UsbDirection::kToBoard, Data::kNone, "mem-read"},
    {UsbType::kHostData, UsbDirection::kToBoard, Data::kAny, "host-data"},
    {UsbType::kMapDma, UsbDirection::kToBoard, Data::kNone, "map-dma"},
    {UsbType::kUnmapDma, UsbDirection::kToBoard, Data::kNone, "unmap-dma"},
    {UsbType::kFwBegin, UsbDirection::kToBoard, Data::kNone, "fw-begin"},
    {UsbType::kFwData, UsbDirection::kToBoard, Data::kSome, "fw-data"},
    {UsbType::kFwCommit, UsbDirection::kToBoard, Data::kNone, "fw-commit"},
    {UsbType::kRegValue, UsbDirection::kToHost, Data::kNone, "reg-value"},
    {UsbType::kMemData, UsbDirection::kToHost, Data::kSome, "mem-data"},
    {UsbType::kHostRead, UsbDirection::kToHost, Data::kNone, "host-read"},
    {UsbType::kHostWrite, UsbDirection::kToHost, Data::kSome, "host-write"},
    {UsbType::kError, UsbDirection::kToHost, Data::kNone, "error"},
    {UsbType::kFwStatus, UsbDirection::kToHost, Data::kNone, "fw-status"},
};

const Rule* rule_of(std::uint16_t type) {
  for (const Rule& r : kRules)
    if (static_cast<std::uint16_t>(r.type) == type) return &r;
  return nullptr;
}

Problem arg_problem(CmdStatus status, std::uint64_t value, UsbType type, unsigned index) {
  return {status, kFieldUsbArg, value, static_cast<std::uint64_t>(index) << 32 | static_cast<std::uint16_t>(type)};
}

}  // namespace

const char* to_string(UsbType type) noexcept {
  const Rule* r = rule_of(static_cast<std::uint16_t>(type));
  return r ? r->name : "unknown";
}

Result<std::uint64_t> usb_message_bytes(std::span<const std::byte> bytes, UsbDirection direction,
                                        std::uint32_t max_data) {
  if (bytes.size() < sizeof(UsbHeader))
    return Problem{CmdStatus::kBadArgument, kFieldUsbLength, bytes.size(), sizeof(UsbHeader)};
  UsbHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.magic != kUsbMagic) return Problem{CmdStatus::kBadArgument, kFieldUsbMagic, h.magic, kUsbMagic};
  const Rule* r = rule_of(h.type);
  if (!r) return Problem{CmdStatus::kInvalidOpcode, kFieldUsbType, h.type, 0};
  if (r->direction != direction)
    return Problem{CmdStatus::kBadArgument, kFieldUsbDirection, h.type, static_cast<std::uint64_t>(direction)};
  const std::uint16_t allowed = r->type == UsbType::kHostData ? kUsbFlagFault
                                : r->type == UsbType::kMapDma ? kUsbFlagDeviceWrites
                                                              : 0;
  if (h.flags & ~allowed) return Problem{CmdStatus::kInvalidFlags, kFieldUsbFlags, h.flags, h.type};
  if (h.data_bytes > max_data) return Problem{CmdStatus::kBadArgument, kFieldUsbLength, h.data_bytes, max_data};
  return sizeof(UsbHeader) + std::uint64_t{h.data_bytes};
}

Result<UsbMessage> decode_usb_message(std::span<const std::byte> bytes, UsbDirection direction, std::uint32_t bar0_size,
                                      std::uint32_t max_data) {
  auto total = usb_message_bytes(bytes, direction, max_data);
  if (!total) return total.problem();
  if (*total != bytes.size()) return Problem{CmdStatus::kBadArgument, kFieldUsbLength, bytes.size(), *total};
  UsbHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  const Rule& r = *rule_of(h.type);
  const UsbType type = r.type;
  const bool from_board = direction == UsbDirection::kToHost;
  if (from_board ? h.sequence == 0 : h.sequence != 0)
    return Problem{CmdStatus::kBadSequence, kFieldUsbSequence, h.sequence, h.type};
  const bool fault = type == UsbType::kHostData && (h.flags & kUsbFlagFault);
  const Data data = fault ? Data::kNone : r.data;
  if (data == Data::kNone && h.data_bytes != 0)
    return Problem{CmdStatus::kBadArgument, kFieldUsbLength, h.data_bytes, 0};
  if (data == Data::kSome && h.data_bytes == 0) return Problem{CmdStatus::kBadArgument, kFieldUsbLength, 0, 1};

  const std::uint64_t a0 = h.arg[0], a1 = h.arg[1];
  auto reg_offset = [&]() -> std::optional<Problem> {
    if (a0 % 4 != 0) return arg_problem(CmdStatus::kBadAlignment, a0, type, 0);
    if (a0 >= bar0_size) return arg_problem(CmdStatus::kBadArgument, a0, type, 0);
    return std::nullopt;
  };
  auto zero = [&](unsigned i) -> std::optional<Problem> {
    const std::uint64_t v = i == 0 ? a0 : a1;
    if (v != 0) return arg_problem(CmdStatus::kReservedNotZero, v, type, i);
    return std::nullopt;
  };
  auto fits32 = [&](unsigned i) -> std::optional<Problem> {
    const std::uint64_t v = i == 0 ? a0 : a1;
    if (v > 0xFFFFFFFFull) return arg_problem(CmdStatus::kBadArgument, v, type, i);
    return std::nullopt;
  };
  auto range = [&](std::uint64_t address, std::uint64_t n) -> std::optional<Problem> {
    if (address + n < address) return arg_problem(CmdStatus::kBadArgument, address, type, 0);
    return std::nullopt;
  };
  std::optional<Problem> p;
  switch (type) {
    case UsbType::kRegWrite:
    case UsbType::kRegValue:
      if (!(p = reg_offset())) p = fits32(1);
      break;
    case UsbType::kRegRead:
      if (!(p = reg_offset())) p = zero(1);
      break;
    case UsbType::kMemWrite:
    case UsbType::kMemData:
    case UsbType::kHostWrite:
    case UsbType::kHostData:
      if (!(p = zero(1))) p = range(a0, h.data_bytes);
      break;
    case UsbType::kMemRead:
    case UsbType::kHostRead:
      if (a1 == 0 || a1 > max_data)
        p = arg_problem(CmdStatus::kBadArgument, a1, type, 1);
      else
        p = range(a0, a1);
      break;
    case UsbType::kMapDma:
    case UsbType::kUnmapDma:
      if (a0 % kUsbPage != 0)
        p = arg_problem(CmdStatus::kBadAlignment, a0, type, 0);
      else if (a1 == 0 || a1 % kUsbPage != 0)
        p = arg_problem(CmdStatus::kBadAlignment, a1, type, 1);
      else
        p = range(a0, a1);
      break;
    case UsbType::kFwBegin:
      if (a0 == 0 || a0 > kMaxImageBytes)
        p = arg_problem(CmdStatus::kBadArgument, a0, type, 0);
      else
        p = zero(1);
      break;
    case UsbType::kFwData:
      if (a0 >= kMaxImageBytes || h.data_bytes > kMaxImageBytes - a0)
        p = arg_problem(CmdStatus::kBadArgument, a0, type, 0);
      else
        p = zero(1);
      break;
    case UsbType::kFwCommit:
      if (!(p = fits32(0))) p = zero(1);
      break;
    case UsbType::kError:
      if (!(p = fits32(0)) && a1 > 0xFFFF) p = arg_problem(CmdStatus::kBadArgument, a1, type, 1);
      break;
    case UsbType::kFwStatus:  // status | field << 32
      if (a0 >> 48) p = arg_problem(CmdStatus::kBadArgument, a0, type, 0);
      break;
  }
  if (p) return *p;
  UsbMessage m;
  m.type = type;
  m.flags = h.flags;
  m.sequence = h.sequence;
  m.tag = h.tag;
  m.arg[0] = a0;
  m.arg[1] = a1;
  m.data = bytes.subspan(sizeof(UsbHeader));
  return m;
}

Result<UsbIdentity> decode_usb_identity(std::span<const std::byte> bytes) {
  if (bytes.size() != sizeof(UsbIdentity))
    return Problem{CmdStatus::kBadArgument, kFieldUsbLength, bytes.size(), sizeof(UsbIdentity)};
  UsbIdentity id;
  std::memcpy(&id, bytes.data(), sizeof id);
  if (id.magic != kUsbMagic) return Problem{CmdStatus::kBadArgument, kFieldUsbMagic, id.magic, kUsbMagic};
  if (id.mode != static_cast<std::uint32_t>(UsbMode::kLoader) &&
      id.mode != static_cast<std::uint32_t>(UsbMode::kApplication))
    return Problem{CmdStatus::kBadArgument, kFieldUsbArg, id.mode, 0};
  if (id.max_data == 0 || id.max_data > kUsbMaxData)
    return Problem{CmdStatus::kBadArgument, kFieldUsbLength, id.max_data, kUsbMaxData};
  for (std::uint32_t r : id.reserved)
    if (r != 0) return Problem{CmdStatus::kReservedNotZero, kFieldUsbArg, r, 0};
  return id;
}

Result<UsbInterrupt> decode_usb_interrupt(std::span<const std::byte> bytes) {
  if (bytes.size() != sizeof(UsbInterrupt))
    return Problem{CmdStatus::kBadArgument, kFieldUsbLength, bytes.size(), sizeof(UsbInterrupt)};
  UsbInterrupt irq;
  std::memcpy(&irq, bytes.data(), sizeof irq);
  if (irq.magic != kUsbMagic) return Problem{CmdStatus::kBadArgument, kFieldUsbMagic, irq.magic, kUsbMagic};
  if (irq.vectors == 0) return Problem{CmdStatus::kBadArgument, kFieldUsbArg, 0, 0};
  return irq;
}

void append_usb_message(std::vector<std::byte>& out, UsbType type, std::uint64_t tag, std::uint64_t arg0,
                        std::uint64_t arg1, std::span<const std::byte> data, std::uint32_t sequence,
                        std::uint16_t flags) {
  const UsbHeader h = usb_header(type, tag, arg0, arg1, static_cast<std::uint32_t>(data.size()), sequence, flags);
  // Appended, not resized then copied: a resize would zero the payload's
  // bytes first, a second pass over up to a megabyte per message.
  out.reserve(out.size() + sizeof h + data.size());
  const auto* head = reinterpret_cast<const std::byte*>(&h);
  out.insert(out.end(), head, head + sizeof h);
  out.insert(out.end(), data.begin(), data.end());
}

std::vector<std::vector<std::byte>> usb_upload_transfers(std::span<const std::byte> image, std::uint32_t max_data,
                                                         std::uint32_t crc32c, std::uint64_t tag) {
  std::vector<std::vector<std::byte>> out(1);
  auto add = [&](UsbType type, std::uint64_t arg0, std::span<const std::byte> data) {
    if (out.back().size() + sizeof(UsbHeader) + data.size() > kUsbTransferBytes) out.emplace_back();
    append_usb_message(out.back(), type, tag, arg0, 0, data);
  };
  add(UsbType::kFwBegin, image.size(), {});
  const std::uint64_t chunk = std::clamp<std::uint32_t>(max_data, 1, kUsbMaxData);
  for (std::uint64_t off = 0; off < image.size(); off += chunk)
    add(UsbType::kFwData, off, image.subspan(off, std::min<std::uint64_t>(chunk, image.size() - off)));
  add(UsbType::kFwCommit, crc32c, {});
  return out;
}

Result<UsbSplitter::Fed> UsbSplitter::feed(std::span<const std::byte> bytes,
                                           const std::function<bool(std::span<const std::byte>)>& on_message) {
  // First the message cut at the end of the last buffer: its header, then
  // as much more as its length says.
  while (!partial_.empty()) {
    std::size_t want = sizeof(UsbHeader);
    if (partial_.size() >= want) {
      auto len = usb_message_bytes(partial_, direction_, max_data_);
      if (!len) {
        partial_.clear();
        return len.problem();
      }
      want = static_cast<std::size_t>(*len);
      if (partial_.size() == want) {
        const bool go_on = on_message(partial_);
        partial_.clear();
        if (!go_on) return Fed::kStopped;
        break;
      }
    }
    if (bytes.empty()) return Fed::kAll;
    const std::size_t n = std::min(want - partial_.size(), bytes.size());
    partial_.insert(partial_.end(), bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    bytes = bytes.subspan(n);
  }
  // Then the messages that lie whole in `bytes`.
  while (bytes.size() >= sizeof(UsbHeader)) {
    auto len = usb_message_bytes(bytes, direction_, max_data_);
    if (!len) return len.problem();
    if (bytes.size() < *len) break;
    if (!on_message(bytes.first(static_cast<std::size_t>(*len)))) return Fed::kStopped;
    bytes = bytes.subspan(static_cast<std::size_t>(*len));
  }
  partial_.assign(bytes.begin(), bytes.end());
  return Fed::kAll;
}

std::string describe_usb_problem(const Problem& p) {
  const std::string at = "usb: ";
  switch (p.field) {
    case kFieldUsbMagic:
      return at + "magic " + hex(p.value) + " is not " + hex(kUsbMagic) + " (\"TUSB\"): the stream is out of step";
    case kFieldUsbType: return at + "message type " + hex(p.value) + " is unknown";
    case kFieldUsbDirection:
      return at + std::string(to_string(static_cast<UsbType>(p.value))) + " messages travel " +
             (p.detail == static_cast<std::uint64_t>(UsbDirection::kToBoard) ? "from the board to the host"
                                                                             : "from the host to the board") +
             ", not this way";
    case kFieldUsbFlags:
      return at + "flags " + hex(p.value) + " are not defined for " + to_string(static_cast<UsbType>(p.detail));
    case kFieldUsbLength:
      if (p.detail == sizeof(UsbHeader) && p.value < sizeof(UsbHeader))
        return at + std::to_string(p.value) + " bytes, fewer than a " + std::to_string(sizeof(UsbHeader)) +
               "-byte header";
      if (p.detail == 0) return at + std::to_string(p.value) + " bytes of data on a message that carries none";
      if (p.detail == 1 && p.value == 0) return at + "a message that carries data has none";
      return at + "length " + std::to_string(p.value) + " where " + std::to_string(p.detail) +
             (p.value > p.detail ? " is the most" : " was expected");
    case kFieldUsbSequence:
      return at + std::string(to_string(static_cast<UsbType>(p.detail))) + " with sequence " + std::to_string(p.value) +
             (p.value == 0 ? ": board messages are numbered from 1" : ": host messages carry sequence 0");
    case kFieldUsbArg: {
      const auto type = static_cast<UsbType>(p.detail & 0xFFFF);
      const unsigned index = static_cast<unsigned>(p.detail >> 32);
      std::string s = at + to_string(type) + " argument " + std::to_string(index) + " = " + hex(p.value);
      if (p.status == CmdStatus::kBadAlignment)
        return s + (type == UsbType::kMapDma || type == UsbType::kUnmapDma ? " is not a non-zero multiple of 4096"
                                                                           : " is not 4-byte aligned");
      if (p.status == CmdStatus::kReservedNotZero) return s + ": reserved, must be 0";
      return s + " is out of range";
    }
  }
  return at + "invalid message (field " + std::to_string(p.field) + ", value " + hex(p.value) + ")";
}

}  // namespace tpuhal::fw
