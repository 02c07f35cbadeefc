// Element types and the exact rules the tensor engine converts and rounds
// by (docs/ops.md). Internal to the simulator.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "tpuhal/fw/half.h"
#include "tpuhal/fw/tensor.h"

namespace tpuhal::sim::tensor {

// Round half to even, then saturate to [lo, hi]; NaN gives 0.
inline std::int32_t round_saturate(float v, std::int32_t lo, std::int32_t hi) {
  if (std::isnan(v)) return 0;
  const float r = std::nearbyint(v);  // the default mode: to nearest, ties to even
  if (r <= static_cast<float>(lo)) return lo;
  if (r >= static_cast<float>(hi)) return hi;
  return static_cast<std::int32_t>(r);
}

// Float to integer cast: toward zero, saturating; NaN gives 0.
inline std::int64_t truncate_saturate(double v, std::int64_t lo, std::int64_t hi) {
  if (std::isnan(v)) return 0;
  if (v <= static_cast<double>(lo)) return lo;
  if (v >= static_cast<double>(hi)) return hi;
  return static_cast<std::int64_t>(v);
}

inline std::int32_t int_min(fw::DType t) {
  return t == fw::DType::kI8 ? -128 : t == fw::DType::kU8 ? 0 : std::numeric_limits<std::int32_t>::min();
}
inline std::int32_t int_max(fw::DType t) {
  return t == fw::DType::kI8 ? 127 : t == fw::DType::kU8 ? 255 : std::numeric_limits<std::int32_t>::max();
}
inline bool is_float(fw::DType t) { return t == fw::DType::kF32 || t == fw::DType::kF16 || t == fw::DType::kBF16; }

inline float load_float(const std::byte* p, fw::DType t) {
  switch (t) {
    case fw::DType::kF32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case fw::DType::kF16: {
      std::uint16_t v;
      std::memcpy(&v, p, 2);
      return fw::f16_to_f32(v);
    }
    case fw::DType::kBF16: {
      std::uint16_t v;
      std::memcpy(&v, p, 2);
      return fw::bf16_to_f32(v);
    }
    case fw::DType::kI8: return static_cast<float>(static_cast<std::int8_t>(*p));
    case fw::DType::kU8: return static_cast<float>(static_cast<std::uint8_t>(*p));
    case fw::DType::kI32: {
      std::int32_t v;
      std::memcpy(&v, p, 4);
      return static_cast<float>(v);
    }
    case fw::DType::kNone: break;
  }
  return 0;
}

inline std::int64_t load_int(const std::byte* p, fw::DType t) {
  switch (t) {
    case fw::DType::kI8: return static_cast<std::int8_t>(*p);
    case fw::DType::kU8: return static_cast<std::uint8_t>(*p);
    case fw::DType::kI32: {
      std::int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    default: return static_cast<std::int64_t>(load_float(p, t));
  }
}

// Stores a float as `t`: floats round to nearest even; integers take the
// nearest even integer and saturate (used by requantising ops).
inline void store_float(std::byte* p, fw::DType t, float v) {
  switch (t) {
    case fw::DType::kF32: std::memcpy(p, &v, 4); return;
    case fw::DType::kF16: {
      const std::uint16_t h = fw::f32_to_f16(v);
      std::memcpy(p, &h, 2);
      return;
    }
    case fw::DType::kBF16: {
      const std::uint16_t h = fw::f32_to_bf16(v);
      std::memcpy(p, &h, 2);
      return;
    }
    case fw::DType::kI8: *p = static_cast<std::byte>(static_cast<std::int8_t>(round_saturate(v, -128, 127))); return;
    case fw::DType::kU8: *p = static_cast<std::byte>(static_cast<std::uint8_t>(round_saturate(v, 0, 255))); return;
    case fw::DType::kI32: {
      const std::int32_t i = round_saturate(v, int_min(t), int_max(t));
      std::memcpy(p, &i, 4);
      return;
    }
    case fw::DType::kNone: return;
  }
}

// Stores an integer as `t`, wrapping (two's complement) like C++ unsigned
// arithmetic: the integer elementwise ops wrap.
inline void store_int_wrap(std::byte* p, fw::DType t, std::int64_t v) {
  switch (t) {
    case fw::DType::kI8:
    case fw::DType::kU8: *p = static_cast<std::byte>(static_cast<std::uint8_t>(v)); return;
    case fw::DType::kI32: {
      const auto u = static_cast<std::uint32_t>(static_cast<std::uint64_t>(v));
      std::memcpy(p, &u, 4);
      return;
    }
    default: store_float(p, t, static_cast<float>(v)); return;
  }
}

}  // namespace tpuhal::sim::tensor
