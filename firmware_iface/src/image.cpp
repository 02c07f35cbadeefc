#include "tpuhal/fw/image.h"
#include "text.h"

#include <array>
#include <cstddef>
#include <cstdio>
#include <cstring>

namespace tpuhal::fw {
namespace {

using detail::hex;

constexpr std::array<std::uint32_t, 256> make_crc_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr auto kCrcTable = make_crc_table();

constexpr std::size_t kCrcOffset = offsetof(ImageHeader, crc32c);
static_assert(kCrcOffset == 40);

// A section entry's fields, in Problem::detail's upper half.
enum SectionField : std::uint64_t { kKind = 0, kFlags = 1, kOffset = 2, kBytes = 3, kLoad = 4 };

Problem section_problem(CmdStatus status, std::uint64_t value, std::uint32_t index, SectionField field) {
  return {status, kFieldImageSection, value, static_cast<std::uint64_t>(field) << 32 | index};
}

bool known_kind(std::uint32_t k) { return k >= 1 && k <= 3; }

std::string version_text(std::uint32_t packed) {
  const Version v = Version::unpack(packed);
  return std::to_string(v.major) + "." + std::to_string(v.minor);
}

}  // namespace

const char* to_string(SectionKind kind) noexcept {
  switch (kind) {
    case SectionKind::kCode: return "code";
    case SectionKind::kData: return "data";
    case SectionKind::kConfig: return "config";
  }
  return "unknown";
}

std::uint32_t crc32c(std::span<const std::byte> bytes, std::uint32_t crc) noexcept {
  crc = ~crc;
  for (std::byte b : bytes) crc = kCrcTable[(crc ^ static_cast<std::uint8_t>(b)) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

Result<Image> decode_image(std::span<const std::byte> bytes) {
  const std::uint64_t size = bytes.size();
  if (size < sizeof(ImageHeader)) return Problem{CmdStatus::kBadArgument, kFieldImageSize, size, sizeof(ImageHeader)};
  ImageHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.magic != kImageMagic) return Problem{CmdStatus::kBadArgument, kFieldImageMagic, h.magic, kImageMagic};
  if (h.format != kImageFormat) return Problem{CmdStatus::kBadArgument, kFieldImageFormat, h.format, kImageFormat};
  if (h.header_bytes != sizeof(ImageHeader))
    return Problem{CmdStatus::kBadArgument, kFieldImageHeader, h.header_bytes, sizeof(ImageHeader)};
  if (h.flags != 0) return Problem{CmdStatus::kReservedNotZero, kFieldImageHeader, h.flags, 0};
  for (std::uint32_t r : h.reserved)
    if (r != 0) return Problem{CmdStatus::kReservedNotZero, kFieldImageHeader, r, 1};
  if (h.image_bytes > kMaxImageBytes)
    return Problem{CmdStatus::kBadArgument, kFieldImageSize, h.image_bytes, kMaxImageBytes};
  if (h.image_bytes != size) return Problem{CmdStatus::kBadArgument, kFieldImageSize, h.image_bytes, size};
  if (h.section_count == 0 || h.section_count > kMaxImageSections)
    return Problem{CmdStatus::kBadArgument, kFieldImageSections, h.section_count, kMaxImageSections};
  const std::uint64_t table_end = sizeof(ImageHeader) + std::uint64_t{h.section_count} * sizeof(SectionEntry);
  if (table_end > size) return Problem{CmdStatus::kBadArgument, kFieldImageTable, table_end, size};

  std::vector<SectionEntry> entries(h.section_count);
  std::memcpy(entries.data(), bytes.data() + sizeof(ImageHeader), entries.size() * sizeof(SectionEntry));
  for (std::uint32_t i = 0; i < h.section_count; ++i) {
    const SectionEntry& e = entries[i];
    if (!known_kind(e.kind)) return section_problem(CmdStatus::kBadArgument, e.kind, i, kKind);
    if (e.flags != 0) return section_problem(CmdStatus::kReservedNotZero, e.flags, i, kFlags);
    if (e.bytes == 0) return section_problem(CmdStatus::kBadArgument, 0, i, kBytes);
    if (e.offset % kImageAlignment != 0) return section_problem(CmdStatus::kBadAlignment, e.offset, i, kOffset);
    if (e.offset < table_end || e.offset > size) return section_problem(CmdStatus::kBadArgument, e.offset, i, kOffset);
    if (e.bytes > size - e.offset) return section_problem(CmdStatus::kBadArgument, e.bytes, i, kBytes);
    if (e.load_address + e.bytes < e.load_address)
      return section_problem(CmdStatus::kBadArgument, e.load_address, i, kLoad);
  }
  for (std::uint32_t i = 0; i < h.section_count; ++i) {
    for (std::uint32_t j = i + 1; j < h.section_count; ++j) {
      const SectionEntry &a = entries[i], &b = entries[j];
      if (a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes)
        return Problem{CmdStatus::kBadArgument, kFieldImageOverlap, i, j};
      if (a.load_address < b.load_address + b.bytes && b.load_address < a.load_address + a.bytes)
        return Problem{CmdStatus::kBadArgument, kFieldImageOverlap, i, j | 1ull << 32};
    }
  }
  static constexpr std::byte kZero[4]{};
  std::uint32_t crc = crc32c(bytes.first(kCrcOffset));
  crc = crc32c(kZero, crc);
  crc = crc32c(bytes.subspan(kCrcOffset + 4), crc);
  if (crc != h.crc32c) return Problem{CmdStatus::kBadArgument, kFieldImageChecksum, crc, h.crc32c};

  Image image{h.board_id, h.firmware_version, Version::unpack(h.iface_min), Version::unpack(h.iface_max), h.crc32c, {}};
  for (const SectionEntry& e : entries)
    image.sections.push_back({static_cast<SectionKind>(e.kind), e.load_address, bytes.subspan(e.offset, e.bytes)});
  return image;
}

Result<Image> check_image_for(Result<Image> image, std::uint32_t board_id, Version iface) {
  if (!image) return image;
  const Image& im = *image;
  if (im.board_id != board_id) return Problem{CmdStatus::kBadArgument, kFieldImageBoard, im.board_id, board_id};
  const bool same_major = iface.major == im.iface_min.major && iface.major == im.iface_max.major;
  if (!same_major || iface.minor < im.iface_min.minor || iface.minor > im.iface_max.minor)
    return Problem{CmdStatus::kBadArgument, kFieldImageIface, iface.packed(),
                   std::uint64_t{im.iface_min.packed()} << 32 | im.iface_max.packed()};
  return image;
}

std::string describe_image_problem(const Problem& p) {
  const std::string at = "firmware image: ";
  switch (p.field) {
    case kFieldImageSize:
      if (p.detail == sizeof(ImageHeader) && p.value < sizeof(ImageHeader))
        return at + std::to_string(p.value) + " bytes, fewer than its " + std::to_string(sizeof(ImageHeader)) +
               "-byte header";
      if (p.detail == kMaxImageBytes)
        return at + "says it is " + std::to_string(p.value) + " bytes, more than the limit of " +
               std::to_string(kMaxImageBytes);
      return at + "says it is " + std::to_string(p.value) + " bytes but " + std::to_string(p.detail) + " were given";
    case kFieldImageTable:
      return at + "its section table ends at byte " + std::to_string(p.value) + ", past the image's " +
             std::to_string(p.detail) + " bytes";
    case kFieldImageMagic:
      return at + "magic " + hex(p.value) + " is not " + hex(kImageMagic) + " (\"TPFW\"): not a firmware image";
    case kFieldImageFormat:
      return at + "format " + std::to_string(p.value) + " is not the format " + std::to_string(p.detail) +
             " this side reads";
    case kFieldImageHeader:
      if (p.status == CmdStatus::kReservedNotZero)
        return at + (p.detail == 0 ? "flags " : "a reserved header word is ") + hex(p.value) + "; must be 0";
      return at + "header size " + std::to_string(p.value) + " is not " + std::to_string(p.detail);
    case kFieldImageSections:
      return at + std::to_string(p.value) + " sections; 1 to " + std::to_string(p.detail) + " allowed";
    case kFieldImageSection: {
      const auto index = static_cast<std::uint32_t>(p.detail);
      const auto field = static_cast<SectionField>(p.detail >> 32);
      const std::string s = at + "section " + std::to_string(index) + ": ";
      switch (field) {
        case kKind: return s + "kind " + std::to_string(p.value) + " is not code (1), data (2) or config (3)";
        case kFlags: return s + "flags " + hex(p.value) + "; must be 0";
        case kOffset:
          if (p.status == CmdStatus::kBadAlignment)
            return s + "offset " + hex(p.value) + " is not " + std::to_string(kImageAlignment) + "-byte aligned";
          return s + "offset " + hex(p.value) +
                 " is outside the payload area (after the section table, "
                 "inside the image)";
        case kBytes:
          return p.value == 0 ? s + "it is empty" : s + std::to_string(p.value) + " bytes run past the image's end";
        case kLoad: return s + "load address " + hex(p.value) + " plus its size wraps around";
      }
      return s + "bad entry";
    }
    case kFieldImageOverlap:
      return at + "sections " + std::to_string(p.value) + " and " + std::to_string(p.detail & 0xFFFFFFFF) +
             ((p.detail >> 32) ? " load at overlapping addresses" : " overlap in the image");
    case kFieldImageChecksum:
      return at + "checksum " + hex(p.detail) + " does not match its contents (" + hex(p.value) +
             "): damaged in transit or on disk";
    case kFieldImageBoard:
      return at + "built for board " + std::to_string(p.value) + ", this board is " + std::to_string(p.detail);
    case kFieldImageIface:
      return at + "implements interface " + version_text(static_cast<std::uint32_t>(p.detail >> 32)) + " to " +
             version_text(static_cast<std::uint32_t>(p.detail)) + ", the driver speaks " +
             version_text(static_cast<std::uint32_t>(p.value));
  }
  return at + "invalid (field " + std::to_string(p.field) + ", value " + hex(p.value) + ")";
}

std::vector<std::byte> build_image(const ImageSpec& spec) {
  const std::uint64_t table_end = sizeof(ImageHeader) + spec.sections.size() * sizeof(SectionEntry);
  std::uint64_t at = (table_end + kImageAlignment - 1) / kImageAlignment * kImageAlignment;
  std::vector<SectionEntry> entries;
  for (const auto& s : spec.sections) {
    entries.push_back({static_cast<std::uint32_t>(s.kind), 0, s.load_address, at, s.payload.size()});
    at = (at + s.payload.size() + kImageAlignment - 1) / kImageAlignment * kImageAlignment;
  }
  std::vector<std::byte> out(at);
  ImageHeader h{};
  h.magic = kImageMagic;
  h.format = kImageFormat;
  h.header_bytes = sizeof(ImageHeader);
  h.board_id = spec.board_id;
  h.firmware_version = spec.firmware_version;
  h.iface_min = spec.iface_min.packed();
  h.iface_max = spec.iface_max.packed();
  h.section_count = static_cast<std::uint32_t>(spec.sections.size());
  h.image_bytes = out.size();
  std::memcpy(out.data(), &h, sizeof h);
  if (!entries.empty()) std::memcpy(out.data() + sizeof h, entries.data(), entries.size() * sizeof(SectionEntry));
  for (std::size_t i = 0; i < spec.sections.size(); ++i)
    if (!spec.sections[i].payload.empty())
      std::memcpy(out.data() + entries[i].offset, spec.sections[i].payload.data(), spec.sections[i].payload.size());
  const std::uint32_t crc = crc32c(out);  // the crc field is still zero
  std::memcpy(out.data() + kCrcOffset, &crc, sizeof crc);
  return out;
}

}  // namespace tpuhal::fw
