// Byte counts for people: "12 GiB", "4.0 KiB", and parsing "256MiB".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tpuhal::base {

// 1536 -> "1.5 KiB"; exact multiples print without decimals ("12 GiB").
std::string format_bytes(std::uint64_t bytes);

// "4096", "4KiB", "4 KiB", "4k", "256MiB", "12GiB", "1.5GiB" -> bytes.
// Binary units only (k/K/KiB = 1024). nullopt on anything else or overflow.
std::optional<std::uint64_t> parse_bytes(std::string_view text);

}  // namespace tpuhal::base
