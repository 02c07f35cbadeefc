// Lowering's entry point (the lowerer itself: onnx/lowerer.hpp) and the
// conversions and quantisation parameters it shares with the compiler.
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "ir.hpp"
#include "onnx/lowerer.hpp"

namespace tpuhal::rt::detail {

std::uint16_t to_f16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000;
  const std::uint32_t exp = (x >> 23) & 0xff;
  std::uint32_t man = x & 0x7fffff;
  if (exp == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00 | (man ? 0x200 : 0));
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7c00);
  if (e <= 0) {
    if (e < -10) return static_cast<std::uint16_t>(sign);
    man |= 0x800000;
    const int shift = 14 - e;
    std::uint32_t h = man >> shift;
    const std::uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = (static_cast<std::uint32_t>(e) << 10) | (man >> 13);
  const std::uint32_t rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // may carry into the exponent: correct
  return static_cast<std::uint16_t>(sign | h);
}

float from_f16(std::uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -24);
  if (e == 31) return m ? NAN : sign * INFINITY;
  return sign * std::ldexp(static_cast<float>(m + 1024), e - 25);
}

std::uint16_t to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if (std::isnan(f)) return static_cast<std::uint16_t>((x >> 16) | 0x40);
  const std::uint32_t r = x + 0x7fff + ((x >> 16) & 1);
  return static_cast<std::uint16_t>(r >> 16);
}

float from_bf16(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

QParams qparams(const Range& r) {
  const float lo = std::min(r.lo, 0.0f), hi = std::max(r.hi, 0.0f);
  QParams q;
  q.scale = (hi - lo) / 255.0f;
  // Any normal scale works, however small the range (outputs of networks
  // with untrained weights can lie within 1e-14 of zero); a range of zero
  // has none.
  if (!(q.scale >= std::numeric_limits<float>::min()) || !std::isfinite(q.scale)) q.scale = 1.0f / 255.0f;
  q.zero_point = static_cast<std::int32_t>(std::clamp(std::nearbyint(-lo / q.scale), 0.0f, 255.0f));
  return q;
}

bool fp16_holds(const Node& n, const std::map<std::string, Range>& ranges) {
  for (const std::string* v : {&n.inputs.at(0), &n.output}) {
    const auto it = ranges.find(*v);
    if (it == ranges.end()) continue;
    const float m = std::max(std::fabs(it->second.lo), std::fabs(it->second.hi));
    if (m != 0 && (m < 0x1p-6f || m > 0x1p14f)) return false;
  }
  return true;
}

Lowered lower(const Graph& g, Precision precision, const std::map<std::string, Range>* ranges,
              const std::set<std::string>& keep_fp16) {
  Lowerer l{g, precision, ranges, keep_fp16};
  if (precision == Precision::Int8 && g.qdq) l.fixed_q = qdq_params(g);
  l.run();
  return std::move(l.out);
}

}  // namespace tpuhal::rt::detail
