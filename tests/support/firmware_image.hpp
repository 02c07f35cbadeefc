// A well-formed firmware image for a board, for the tests of uploads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tpuhal/fw/image.h"
#include "tpuhal/fw/version.h"

namespace tpuhal::test {

// One code section of `code_bytes`, for interface versions 1.0 up to the
// driver's own.
inline std::vector<std::byte> firmware_image(std::uint32_t board_id, std::size_t code_bytes) {
  fw::ImageSpec spec;
  spec.board_id = board_id;
  spec.firmware_version = 0x010203;
  spec.iface_min = {1, 0};
  spec.iface_max = fw::kInterfaceVersion;
  spec.sections.push_back({fw::SectionKind::kCode, 0x1000, std::vector<std::byte>(code_bytes, std::byte{0x5A})});
  return fw::build_image(spec);
}

}  // namespace tpuhal::test
