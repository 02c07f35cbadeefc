// The firmware image: what a host uploads to a board that boots from the
// host (a USB stick's loader, a PCIe card's mailbox), and what the board
// checks before it runs a byte of it.
//
//   offset 0     ImageHeader (64 bytes)
//   offset 64    SectionEntry[section_count] (32 bytes each)
//   after        section payloads, each 16-byte aligned, in any order
//
// Little-endian. ImageHeader::crc32c is the CRC-32C (Castagnoli) of the
// whole image with that field read as zero. decode_image() validates every
// field and returns views into the bytes it was given; the uploader runs it
// before sending (a bad image never reaches the board) and the board again
// on receipt.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tpuhal/fw/result.h"
#include "tpuhal/fw/version.h"

namespace tpuhal::fw {

inline constexpr std::uint32_t kImageMagic = 0x57465054;  // "TPFW"
inline constexpr std::uint16_t kImageFormat = 1;
inline constexpr std::uint32_t kMaxImageSections = 16;
inline constexpr std::uint64_t kMaxImageBytes = 64ull << 20;
inline constexpr std::uint64_t kImageAlignment = 16;

enum class SectionKind : std::uint32_t {
  kCode = 1,    // instructions for the board's controller
  kData = 2,    // initialised data
  kConfig = 3,  // board configuration (clock, memory training tables)
};
const char* to_string(SectionKind kind) noexcept;  // "code"; "unknown" off the list

struct ImageHeader {
  std::uint32_t magic;             // kImageMagic
  std::uint16_t format;            // kImageFormat
  std::uint16_t header_bytes;      // sizeof(ImageHeader)
  std::uint32_t board_id;          // the board it runs on (reg::kBoardId)
  std::uint32_t firmware_version;  // major << 24 | minor << 16 | patch
  std::uint32_t iface_min;         // interface versions it implements (Version::packed)
  std::uint32_t iface_max;
  std::uint32_t section_count;  // 1..kMaxImageSections
  std::uint32_t flags;          // none defined: 0
  std::uint64_t image_bytes;    // the whole image
  std::uint32_t crc32c;         // of the image with this field zero
  std::uint32_t reserved[5];    // 0
};
static_assert(sizeof(ImageHeader) == 64);

struct SectionEntry {
  std::uint32_t kind;          // SectionKind
  std::uint32_t flags;         // none defined: 0
  std::uint64_t load_address;  // where the board places it
  std::uint64_t offset;        // of its payload, from the image start; kImageAlignment-aligned
  std::uint64_t bytes;         // > 0
};
static_assert(sizeof(SectionEntry) == 32);

struct ImageSection {
  SectionKind kind;
  std::uint64_t load_address;
  std::span<const std::byte> payload;
};

struct Image {
  std::uint32_t board_id;
  std::uint32_t firmware_version;
  Version iface_min, iface_max;
  std::uint32_t crc32c;
  std::vector<ImageSection> sections;  // in table order
};

// Problem::field values for images (Problem::value: the offending value,
// Problem::detail: the limit or the section index).
inline constexpr std::uint16_t kFieldImageSize = 0x200;  // fewer bytes than the header says
inline constexpr std::uint16_t kFieldImageMagic = 0x201;
inline constexpr std::uint16_t kFieldImageFormat = 0x202;
inline constexpr std::uint16_t kFieldImageHeader = 0x203;    // header_bytes, flags or reserved
inline constexpr std::uint16_t kFieldImageSections = 0x204;  // section_count
inline constexpr std::uint16_t kFieldImageSection = 0x205;   // a section entry; detail = its index
inline constexpr std::uint16_t kFieldImageOverlap = 0x206;   // two sections overlap; value, detail = indices
inline constexpr std::uint16_t kFieldImageChecksum = 0x207;  // value = computed, detail = stored
inline constexpr std::uint16_t kFieldImageBoard = 0x208;     // value = image's board, detail = the board's
inline constexpr std::uint16_t kFieldImageIface = 0x209;     // value = driver's packed, detail = image's range
inline constexpr std::uint16_t kFieldImageTable = 0x20A;     // the section table runs past the image's end

// CRC-32C (Castagnoli, reflected, init and final xor 0xFFFFFFFF) of `bytes`,
// continuing from `crc` (0 to start).
std::uint32_t crc32c(std::span<const std::byte> bytes, std::uint32_t crc = 0) noexcept;

// Validates an image: size, magic, format, header, section table (kinds,
// alignment, bounds, payloads inside the image and clear of the tables and
// of each other, load ranges disjoint) and checksum.
Result<Image> decode_image(std::span<const std::byte> bytes);

// Checks that a decoded image is for board `board_id` and implements
// interface `iface` (the version the driver speaks).
Result<Image> check_image_for(Result<Image> image, std::uint32_t board_id, Version iface);

// A sentence for a Problem from decode_image/check_image_for ("firmware
// image: section 2 (data) at offset 0x41 is not 16-byte aligned").
std::string describe_image_problem(const Problem& p);

// Builds a valid image (tools and tests): sections laid out in order after
// the table, aligned, with the checksum filled in.
struct ImageSpec {
  std::uint32_t board_id = 0;
  std::uint32_t firmware_version = 0;
  Version iface_min{}, iface_max{};
  struct Section {
    SectionKind kind = SectionKind::kCode;
    std::uint64_t load_address = 0;
    std::vector<std::byte> payload;
  };
  std::vector<Section> sections;
};
std::vector<std::byte> build_image(const ImageSpec& spec);

}  // namespace tpuhal::fw
