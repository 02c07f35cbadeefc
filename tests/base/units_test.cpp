// parse_bytes / format_bytes: the byte-count helpers used by profiles and the CLI.
#include "tpuhal/base/units.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>

namespace tpuhal::base {
namespace {

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = kKiB * 1024;
constexpr std::uint64_t kGiB = kMiB * 1024;
constexpr std::uint64_t kTiB = kGiB * 1024;

TEST(BaseUnits, ParsesPlainNumbersAndBinaryUnits) {
  struct Case {
    const char* text;
    std::uint64_t bytes;
  };
  const Case cases[] = {
      {"0", 0},
      {"4096", 4096},
      {"4KiB", 4 * kKiB},
      {"4 KiB", 4 * kKiB},
      {"4k", 4 * kKiB},
      {"4K", 4 * kKiB},
      {"4kib", 4 * kKiB},
      {"256MiB", 256 * kMiB},
      {"256m", 256 * kMiB},
      {"12GiB", 12 * kGiB},
      {"2TiB", 2 * kTiB},
      {"1.5GiB", kGiB + kGiB / 2},
      {"0.5k", 512},
      {"7b", 7},
      {"7 B", 7},
      {"  64 MiB  ", 64 * kMiB},
      {"1.0", 1},  // a zero fraction is not a fraction of a byte
      {"18446744073709551615", UINT64_MAX},
      {"16777215TiB", 16777215ull * kTiB},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    const auto parsed = parse_bytes(c.text);
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, c.bytes);
  }
}

TEST(BaseUnits, RejectsMalformedText) {
  const char* const cases[] = {
      "",      "   ", "KiB",    "-1",  "1.",   ".5k",  "1.5",    "1.5B", "4KB", "4 kb",
      "4 PiB", "4x",  "4 K iB", "1e3", "0x10", "1,5k", "4KiB x", "4 4",  "abc", "4.5.6k",
  };
  for (const char* text : cases) {
    SCOPED_TRACE(text);
    EXPECT_EQ(parse_bytes(text), std::nullopt);
  }
}

TEST(BaseUnits, RejectsValuesThatOverflow64Bits) {
  const char* const cases[] = {
      "18446744073709551616",       // 2^64
      "99999999999999999999",       // far past 2^64 in the digit loop
      "16777216TiB",                // 2^24 TiB = 2^64
      "17179869184GiB",             // 2^34 GiB = 2^64
      "18014398509481984k",         // 2^54 KiB = 2^64
      "16777215.9999999999999TiB",  // the fraction rounds the total up to 2^64
  };
  for (const char* text : cases) {
    SCOPED_TRACE(text);
    EXPECT_EQ(parse_bytes(text), std::nullopt);
  }
}

TEST(BaseUnits, FormatsExactMultiplesWithoutDecimals) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1), "1 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1048575), "1.0 MiB");  // not "1024.0 KiB"
  EXPECT_EQ(format_bytes((1ull << 30) - 1), "1.0 GiB");
  EXPECT_EQ(format_bytes(1024), "1 KiB");
  EXPECT_EQ(format_bytes(4 * kKiB), "4 KiB");
  EXPECT_EQ(format_bytes(256 * kMiB), "256 MiB");
  EXPECT_EQ(format_bytes(12 * kGiB), "12 GiB");
  EXPECT_EQ(format_bytes(3 * kTiB), "3 TiB");
  EXPECT_EQ(format_bytes(1ull << 63), "8 EiB");
}

TEST(BaseUnits, FormatsInexactValuesWithOneDecimal) {
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(1025), "1.0 KiB");
  EXPECT_EQ(format_bytes(kMiB + kMiB / 2), "1.5 MiB");
  // Exact in the lower unit but not in the upper one.
  EXPECT_EQ(format_bytes(1536 * kKiB), "1.5 MiB");
  EXPECT_EQ(format_bytes(kGiB + 1), "1.0 GiB");
  EXPECT_EQ(format_bytes(UINT64_MAX), "16.0 EiB");
}

TEST(BaseUnits, FormatThenParseRoundTripsExactMultiples) {
  for (std::uint64_t v : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{4096}, 3 * kMiB, 12 * kGiB, 5 * kTiB}) {
    SCOPED_TRACE(v);
    const auto parsed = parse_bytes(format_bytes(v));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, v);
  }
}

}  // namespace
}  // namespace tpuhal::base
