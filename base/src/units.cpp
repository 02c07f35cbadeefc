#include "tpuhal/base/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>

namespace tpuhal::base {

std::string format_bytes(std::uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  std::uint64_t whole = bytes;
  bool exact = true;
  double value = static_cast<double>(bytes);
  while (value >= 1024.0 && unit < 6) {
    exact = exact && (whole % 1024 == 0);
    whole /= 1024;
    value /= 1024.0;
    ++unit;
  }
  if (!exact && value >= 1023.95 && unit < 6) {  // would print as "1024.0"
    value /= 1024.0;
    ++unit;
  }
  char buf[48];
  if (exact)
    std::snprintf(buf, sizeof buf, "%llu %s", static_cast<unsigned long long>(whole), kUnits[unit]);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", value, kUnits[unit]);
  return buf;
}

std::optional<std::uint64_t> parse_bytes(std::string_view text) {
  std::size_t i = 0;
  auto skip_space = [&] {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  };
  skip_space();
  std::uint64_t integer = 0;
  std::size_t digits = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    const std::uint64_t d = static_cast<std::uint64_t>(text[i] - '0');
    if (integer > (UINT64_MAX - d) / 10) return std::nullopt;
    integer = integer * 10 + d;
    ++i;
    ++digits;
  }
  double fraction = 0.0;
  if (i < text.size() && text[i] == '.') {
    ++i;
    double scale = 0.1;
    std::size_t frac_digits = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      fraction += scale * (text[i] - '0');
      scale /= 10;
      ++i;
      ++frac_digits;
    }
    if (frac_digits == 0) return std::nullopt;
  }
  if (digits == 0) return std::nullopt;
  skip_space();
  std::string unit;
  while (i < text.size() && std::isalpha(static_cast<unsigned char>(text[i])))
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i++])));
  skip_space();
  if (i != text.size()) return std::nullopt;
  int shift = 0;
  if (unit.empty() || unit == "b")
    shift = 0;
  else if (unit == "k" || unit == "kib")
    shift = 10;
  else if (unit == "m" || unit == "mib")
    shift = 20;
  else if (unit == "g" || unit == "gib")
    shift = 30;
  else if (unit == "t" || unit == "tib")
    shift = 40;
  else
    return std::nullopt;
  if (shift == 0 && fraction != 0.0) return std::nullopt;
  if (shift > 0 && integer > (UINT64_MAX >> shift)) return std::nullopt;
  const std::uint64_t whole = integer << shift;
  const auto frac = static_cast<std::uint64_t>(std::llround(fraction * std::ldexp(1.0, shift)));
  if (whole > UINT64_MAX - frac) return std::nullopt;
  return whole + frac;
}

}  // namespace tpuhal::base
