// The board's reduced float types, binary16 (f16) and bfloat16 (bf16), and
// how a float32 becomes one: round to nearest even, overflow to infinity, a
// NaN stays a quiet NaN of its sign. The tensor engine converts by these
// rules, and the host (the compiler's fp16 and bf16 weights) by the same
// ones. Header only, no dependencies: layers that may not link the firmware
// interface include it (tests/layering_test.py names them).
#pragma once

#include <bit>
#include <cstdint>

namespace tpuhal::fw {

inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000) << 16;
  std::uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  std::uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while (!(man & 0x400));
      bits = sign | static_cast<std::uint32_t>(127 - 15 - e) << 23 | (man & 0x3FF) << 13;
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000 | man << 13;  // inf / nan
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  return std::bit_cast<float>(bits);
}

inline std::uint16_t f32_to_f16(float f) {
  const auto x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000);
  const std::uint32_t abs = x & 0x7FFFFFFF;
  if (abs > 0x7F800000) return sign | 0x7E00;   // nan
  if (abs >= 0x477FF000) return sign | 0x7C00;  // rounds to inf
  if (abs < 0x33000001) return sign;            // rounds to zero
  const std::uint32_t exp = abs >> 23;
  if (exp < 113) {  // subnormal half
    const std::uint32_t man = (abs & 0x7FFFFF) | 0x800000;
    const std::uint32_t shift = 126 - exp;  // 14..24
    std::uint32_t h = man >> shift;
    const std::uint32_t rem = man & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = ((exp - 112) << 10) | ((abs >> 13) & 0x3FF);
  const std::uint32_t rem = abs & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // may carry into the exponent: correct
  return static_cast<std::uint16_t>(sign | h);
}

inline float bf16_to_f32(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

inline std::uint16_t f32_to_bf16(float f) {
  const auto x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<std::uint16_t>((x >> 16) | 0x40);  // quiet nan
  return static_cast<std::uint16_t>((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

}  // namespace tpuhal::fw
