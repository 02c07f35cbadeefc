// What the op tests (ops_*_test.cpp, one file per op family) share: the
// float64 / int64 reference written here, following docs/ops.md exactly,
// random data (the seed is printed with every failure; set
// TPUHAL_TEST_SEED to replay one), a device to run ops on, the comparisons
// and the fixtures.
//
// Tolerances (u = 2^-24, the unit roundoff of f32):
// - f32 sums of K products (matmul, convolution, pooling): the classic
//   worst-case bound |computed - exact| <= (K + 2) u sum|a_i b_i|, whatever
//   the order or blocking the engine sums in (oneDNN blocks and uses FMA;
//   the bound holds for any order). It is relative to sum|a_i b_i|, not to
//   the result, so cancellation cannot make it fail spuriously, and any
//   wrong index or operand produces errors of the order of the terms, far
//   above it.
// - f16 / bf16 outputs: the f32 bound above plus one ULP of the output type
//   at the result (round to nearest of a value already within the f32 bound
//   lands at most one ULP away).
// - Elementwise f32 arithmetic (+ - * / sqrt), casts, transposes, max
//   pooling, quantize, dequantize, every integer op and requantisation are
//   exact: an IEEE f32 operation equals the double result rounded once to
//   f32 (double has more than 2 * 24 + 2 bits), so the reference computes in
//   double and rounds where the documented semantics round.
// - exp, log, erf, tanh and friends come from the C library: two f32 ULPs
//   for exp, log and erf, 16 ULPs (relative) for the fused activations.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../hal/device_param.hpp"
#include "tpuhal/fw/command.h"
#include "tpuhal/fw/tensor.h"
#include "tpuhal/sim/board.h"
#include "tpuhal/tpu/device.h"
#include "tpuhal/tpu/sim_provider.h"
#include "tpuhal/tpuhal.hpp"
#include "support/error_of.hpp"

namespace tpuhal::ops_test {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using Shape = std::vector<std::int64_t>;
using ops::ColorConvertOptions;
using ops::Conv2dOptions;
using ops::MatMulOptions;
using ops::Pool2dOptions;
using ops::ResizeOptions;

constexpr double kU = 0x1p-24;  // unit roundoff of f32
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- Element types -----------------------------------------------------------------

inline bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

inline std::int64_t lo_of(DType t) {
  switch (t) {
    case DType::I8: return -128;
    case DType::U8: return 0;
    case DType::I32: return std::numeric_limits<std::int32_t>::min();
    default: return 0;
  }
}
inline std::int64_t hi_of(DType t) {
  switch (t) {
    case DType::I8: return 127;
    case DType::U8: return 255;
    case DType::I32: return std::numeric_limits<std::int32_t>::max();
    default: return 0;
  }
}

struct Format {
  int digits;  // significand bits, the implicit one included
  int emin;    // exponent of the smallest normal number
  double max;  // largest finite value
};
inline Format format_of(DType t) {
  switch (t) {
    case DType::F16: return {11, -14, 65504.0};
    case DType::BF16: return {8, -126, 0x1.fep127};
    default: return {24, -126, static_cast<double>(std::numeric_limits<float>::max())};
  }
}

// `v` rounded to the float type `t`, to nearest with ties to even, overflow
// to infinity (IEEE 754), subnormals included.
inline double round_to(DType t, double v) {
  if (t == DType::F32) return static_cast<double>(static_cast<float>(v));
  if (std::isnan(v) || std::isinf(v) || v == 0) return v;
  const Format f = format_of(t);
  const int q = std::max(std::ilogb(v), f.emin) - (f.digits - 1);  // exponent of one ULP
  const double r = std::ldexp(std::nearbyint(std::ldexp(v, -q)), q);
  return std::fabs(r) > f.max ? std::copysign(kInf, v) : r;
}
inline double f32(double v) { return round_to(DType::F32, v); }

// One ULP of the float type `t` at magnitude |v|.
inline double ulp(DType t, double v) {
  const Format f = format_of(t);
  const int e = (v == 0 || !std::isfinite(v)) ? f.emin : std::max(std::ilogb(v), f.emin);
  return std::ldexp(1.0, e - (f.digits - 1));
}

inline std::int64_t saturate(DType t, double v) {
  return static_cast<std::int64_t>(std::clamp(v, static_cast<double>(lo_of(t)), static_cast<double>(hi_of(t))));
}
// Two's complement wrap into `t` (integer elementwise ops and accumulators wrap).
inline std::int64_t wrap(DType t, std::int64_t v) {
  const auto u = static_cast<std::uint64_t>(v);
  switch (t) {
    case DType::I8: return static_cast<std::int8_t>(static_cast<std::uint8_t>(u));
    case DType::U8: return static_cast<std::uint8_t>(u);
    default: return static_cast<std::int32_t>(static_cast<std::uint32_t>(u));
  }
}
inline std::int64_t wrap32(std::int64_t v) { return wrap(DType::I32, v); }

inline std::uint16_t f16_bits(double v) {
  v = round_to(DType::F16, v);
  if (std::isnan(v)) return 0x7E00;
  const std::uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(v);
  if (std::isinf(a)) return static_cast<std::uint16_t>(sign | 0x7C00);
  if (a < 0x1p-14) return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(a * 0x1p24));
  const int e = std::ilogb(a);
  const auto man = static_cast<std::uint32_t>((std::ldexp(a, -e) - 1.0) * 1024.0);
  return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(e + 15) << 10 | man);
}
inline double f16_value(std::uint16_t h) {
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  const int exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0) return sign * std::ldexp(man, -24);
  if (exp == 31) return man ? kNaN : sign * kInf;
  return sign * std::ldexp(1024 + man, exp - 25);
}
inline std::uint16_t bf16_bits(double v) {
  if (std::isnan(v)) return 0x7FC0;
  const float f = static_cast<float>(round_to(DType::BF16, v));  // exact
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<std::uint16_t>(u >> 16);
}
inline double bf16_value(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline void store(DType t, double v, std::byte* p) {
  switch (t) {
    case DType::F32: {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      return;
    }
    case DType::F16: {
      const std::uint16_t h = f16_bits(v);
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::BF16: {
      const std::uint16_t h = bf16_bits(v);
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::I8: *p = static_cast<std::byte>(static_cast<std::uint8_t>(static_cast<std::int64_t>(v))); return;
    case DType::U8: *p = static_cast<std::byte>(static_cast<std::uint8_t>(static_cast<std::int64_t>(v))); return;
    case DType::I32: {
      const auto i = static_cast<std::int32_t>(static_cast<std::uint32_t>(static_cast<std::int64_t>(v)));
      std::memcpy(p, &i, 4);
      return;
    }
  }
}
inline double load(DType t, const std::byte* p) {
  switch (t) {
    case DType::F32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::F16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return f16_value(h);
    }
    case DType::BF16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_value(h);
    }
    case DType::I8: return static_cast<std::int8_t>(*p);
    case DType::U8: return static_cast<std::uint8_t>(*p);
    case DType::I32: {
      std::int32_t i;
      std::memcpy(&i, p, 4);
      return i;
    }
  }
  return 0;
}

// ---- Host tensors ------------------------------------------------------------------

inline std::int64_t numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}
inline Shape row_major(const Shape& s) {
  Shape st(s.size());
  std::int64_t step = 1;
  for (std::size_t i = s.size(); i-- > 0;) {
    st[i] = step;
    step *= std::max<std::int64_t>(s[i], 1);
  }
  return st;
}
inline std::string dims(const Shape& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}
// Calls fn(index, linear) for every index of `shape`, row-major.
template <class F>
void for_each_index(const Shape& shape, F&& fn) {
  const std::int64_t n = numel(shape);
  Shape idx(shape.size(), 0);
  for (std::int64_t lin = 0; lin < n; ++lin) {
    fn(static_cast<const Shape&>(idx), lin);
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}
inline Shape unravel(const Shape& shape, std::int64_t lin) {
  Shape idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] ? lin % shape[d] : 0;
    lin = shape[d] ? lin / shape[d] : 0;
  }
  return idx;
}

// Values of a tensor in row-major order, as the dtype holds them.
struct Host {
  DType dtype = DType::F32;
  Shape shape;
  std::vector<double> v;
  Host() = default;
  Host(DType t, Shape s) : dtype(t), shape(std::move(s)), v(static_cast<std::size_t>(numel(shape)), 0.0) {}
  std::size_t size() const { return v.size(); }
  double at(const Shape& idx) const {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) off = off * shape[d] + idx[d];
    return v[static_cast<std::size_t>(off)];
  }
};

// h with dimensions reordered: result dim i is h's dim perm[i].
inline Host permuted(const Host& h, const std::vector<std::size_t>& perm) {
  Shape s(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) s[i] = h.shape[perm[i]];
  Host out(h.dtype, s);
  Shape src(perm.size());
  for_each_index(s, [&](const Shape& idx, std::int64_t lin) {
    for (std::size_t i = 0; i < perm.size(); ++i) src[perm[i]] = idx[i];
    out.v[static_cast<std::size_t>(lin)] = h.at(src);
  });
  return out;
}

class Rng {
 public:
  void seed(std::uint64_t s) { g_.seed(s); }
  // The top 53 bits of one draw, as std::generate_canonical takes them from
  // a 64-bit engine, without the long double logarithms libstdc++ computes
  // on every call (a tenth of the op suite's time; on arm64 they are
  // software quad floats).
  double uniform(double lo, double hi) { return lo + (hi - lo) * (static_cast<double>(g_() >> 11) * 0x1.0p-53); }
  std::int64_t integer(std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(g_);
  }
  bool coin(double p = 0.5) { return uniform(0, 1) < p; }
  template <class T>
  T pick(const std::vector<T>& v) {
    return v[static_cast<std::size_t>(integer(0, static_cast<std::int64_t>(v.size()) - 1))];
  }
  std::mt19937_64& engine() { return g_; }

 private:
  std::mt19937_64 g_{1};
};

// Random values the dtype holds exactly: floats uniform in [lo, hi] rounded
// to the type, integers uniform over [lo, hi] clipped to the type's range.
inline Host rand_host(Rng& r, DType t, Shape s, double lo, double hi) {
  Host h(t, std::move(s));
  for (auto& x : h.v)
    x = is_float(t) ? round_to(t, r.uniform(lo, hi))
                    : static_cast<double>(r.integer(std::max<std::int64_t>(static_cast<std::int64_t>(lo), lo_of(t)),
                                                    std::min<std::int64_t>(static_cast<std::int64_t>(hi), hi_of(t))));
  return h;
}
// Integers over the type's whole range.
inline Host rand_int(Rng& r, DType t, Shape s) {
  return rand_host(r, t, std::move(s), static_cast<double>(lo_of(t)), static_cast<double>(hi_of(t)));
}

inline std::uint64_t test_seed() {
  if (const char* s = std::getenv("TPUHAL_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  std::random_device rd;
  return (std::uint64_t{rd()} << 32) ^ rd();
}

using test::error_of;

// The message of the tpuhal::Error `f` throws.
template <class F>
std::string message_of(F&& f) {
  return error_of(std::forward<F>(f)).what();
}

// A builder's refusals: each call throws InvalidArgument whose message is
// exactly its text.
using Refusals = std::vector<std::pair<std::function<void()>, std::string>>;
inline void expect_refusals(const Refusals& cases) {
  for (const auto& [f, says] : cases) {
    const Error e = error_of(f);
    EXPECT_EQ(e.status(), Status::InvalidArgument) << says;
    EXPECT_STREQ(e.what(), says.c_str());
  }
}

// ---- A device to run ops on ----------------------------------------------------------

struct Lab {
  Device dev;
  Queue q;

  explicit Lab(Device d) : dev(std::move(d)) {
    WaitPolicy p = dev.wait_policy();
    p.timeout = 20s;  // every wait here ends
    dev.set_wait_policy(p);
    q = dev.queue(Engine::Compute);
  }

  static std::uint64_t bytes_for(DType t, const Shape& s) {
    return std::max<std::uint64_t>(static_cast<std::uint64_t>(numel(s)) * size_of(t), 64);
  }

  // `h` in a fresh buffer of `mem`, contiguous at offset 0.
  Tensor upload(const Host& h, Memory mem = Memory::Device) {
    const std::uint64_t bytes = bytes_for(h.dtype, h.shape);
    Buffer buf = dev.allocate(bytes, mem);
    Buffer staging = mem == Memory::Device ? dev.allocate(bytes, Memory::HostPinned) : buf;
    auto m = staging.map();
    std::memset(m.data(), 0, m.size());
    for (std::size_t i = 0; i < h.size(); ++i) store(h.dtype, h.v[i], m.data() + i * size_of(h.dtype));
    if (mem == Memory::Device) q.copy(staging, buf).submit().wait();
    return Tensor(buf, h.dtype, h.shape);
  }

  // `h` as a view with `strides` (elements) starting at element `offset` of
  // a fresh device buffer whose other bytes are all 0x7F (3.4e38 in f32, a
  // NaN in f16 and bf16): an element read from the wrong place shows.
  Tensor upload_view(const Host& h, const Shape& strides, std::int64_t offset) {
    const std::uint32_t es = size_of(h.dtype);
    std::int64_t last = offset;
    for (std::size_t d = 0; d < h.shape.size(); ++d) last += (h.shape[d] - 1) * strides[d];
    const std::uint64_t bytes = std::max<std::uint64_t>(static_cast<std::uint64_t>(last + 1) * es, 64);
    Buffer buf = dev.allocate(bytes);
    Buffer staging = dev.allocate(bytes, Memory::HostPinned);
    auto m = staging.map();
    std::memset(m.data(), 0x7F, m.size());
    for_each_index(h.shape, [&](const Shape& idx, std::int64_t lin) {
      std::int64_t off = offset;
      for (std::size_t d = 0; d < idx.size(); ++d) off += idx[d] * strides[d];
      store(h.dtype, h.v[static_cast<std::size_t>(lin)], m.data() + static_cast<std::size_t>(off) * es);
    });
    q.copy(staging, buf).submit().wait();
    return Tensor(buf, h.dtype, h.shape, strides, static_cast<std::uint64_t>(offset) * es);
  }

  // An output tensor whose buffer holds 0xA5 bytes: elements an op fails
  // to write show up.
  Tensor output(DType t, const Shape& s, Memory mem = Memory::Device) {
    Buffer buf = dev.allocate(bytes_for(t, s), mem);
    q.fill(buf, 0, buf.size(), 0xA5).submit().wait();
    return Tensor(buf, t, s);
  }

  std::vector<std::byte> bytes(const Buffer& b) {
    Buffer staging = dev.allocate(b.size(), Memory::HostPinned);
    q.copy(b, staging).submit().wait();
    auto m = staging.map();
    return {m.begin(), m.end()};
  }

  // t's elements in row-major order, through its strides and offset.
  Host download(const Tensor& t) {
    const auto raw = bytes(t.buffer());
    Host h(t.dtype(), t.shape());
    const std::uint32_t es = size_of(t.dtype());
    for_each_index(t.shape(), [&](const Shape& idx, std::int64_t lin) {
      std::uint64_t off = t.offset();
      for (std::size_t d = 0; d < idx.size(); ++d) off += static_cast<std::uint64_t>(idx[d] * t.strides()[d]) * es;
      h.v[static_cast<std::size_t>(lin)] = load(t.dtype(), raw.data() + off);
    });
    return h;
  }

  void run(const Op& op) { q.run(op).submit().wait(); }
  Host run(const Op& op, const Tensor& y) {
    run(op);
    return download(y);
  }

  // Weights rewritten in place between runs: by the board (a copy, an op:
  // its DRAM write log sees them) or by the host where it can map them
  // (host-visible device memory, pinned host memory), which the board
  // cannot see.
  enum class Rewrite { kCopy, kOp, kHostVisible, kHostPinned };
  static constexpr std::array<Rewrite, 4> kRewrites{Rewrite::kCopy, Rewrite::kOp, Rewrite::kHostVisible,
                                                    Rewrite::kHostPinned};
  // Where weights rewritten `how` live; nullopt where this board has no such memory.
  std::optional<Memory> rewrite_memory(Rewrite how) const {
    if (how == Rewrite::kHostVisible)
      return dev.properties().caps.host_visible_device_memory ? std::optional(Memory::DeviceHostVisible) : std::nullopt;
    return how == Rewrite::kHostPinned ? Memory::HostPinned : Memory::Device;
  }
  static const char* rewritten_by(Rewrite how) {
    return how == Rewrite::kCopy          ? "a copy"
           : how == Rewrite::kOp          ? "an op"
           : how == Rewrite::kHostVisible ? "the host, in host-visible device memory"
                                          : "the host, in pinned host memory";
  }
  // w's elements (dense from its buffer's start) become `now`'s, `how`.
  void rewrite(Rewrite how, const Tensor& w, const Host& now) {
    if (how == Rewrite::kHostVisible || how == Rewrite::kHostPinned) {
      auto m = w.buffer().map();
      for (std::size_t i = 0; i < now.size(); ++i) store(now.dtype, now.v[i], m.data() + i * size_of(now.dtype));
    } else if (how == Rewrite::kCopy) {
      q.copy(upload(now).buffer(), 0, w.buffer(), 0, bytes_for(now.dtype, now.shape)).submit().wait();
    } else {
      const Tensor fresh = upload(now);
      run(ops::max(fresh, fresh, w));
    }
  }
};

// ---- Comparing -------------------------------------------------------------------------

// Mismatches of one comparison, reported as one failure with the first few.
class Report {
 public:
  Report(std::string what, const Shape& shape) : what_(std::move(what)), shape_(shape) { os_ << std::setprecision(17); }
  void bad(std::int64_t lin, double got, const std::string& want) {
    if (count_++ < 6) os_ << "\n  at " << dims(unravel(shape_, lin)) << ": got " << got << ", want " << want;
  }
  void finish(std::uint64_t seed, std::size_t total) {
    if (count_)
      ADD_FAILURE() << what_ << ": " << count_ << " of " << total << " elements differ (seed " << seed
                    << "; rerun with TPUHAL_TEST_SEED=" << seed << ")" << os_.str();
  }

 private:
  std::string what_;
  Shape shape_;
  std::ostringstream os_;
  std::size_t count_ = 0;
};

inline bool matches(double got, double want, double tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isnan(got)) return false;
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::fabs(got - want) <= tol;
}

inline std::string num(double v) {
  std::ostringstream os;
  os << std::setprecision(17) << v;
  return os.str();
}

// Reference values with a tolerance each.
struct Ref {
  std::vector<double> v, tol;
  void push(double value, double t) {
    v.push_back(value);
    tol.push_back(t);
  }
};

// ---- Activations -------------------------------------------------------------------------

inline double act_ref(const ActivationParams& a, double x) {
  const double al = a.alpha, be = a.beta;
  switch (a.kind) {
    case Activation::None: return x;
    case Activation::Relu: return x > 0 ? x : 0.0;
    case Activation::Clip: return std::min(std::max(x, al), be);
    case Activation::Sigmoid: return 1.0 / (1.0 + std::exp(-x));
    case Activation::Silu: return x / (1.0 + std::exp(-x));
    case Activation::LeakyRelu: return x < 0 ? al * x : x;
    case Activation::Tanh: return std::tanh(x);
    case Activation::HardSigmoid: return std::min(std::max(al * x + be, 0.0), 1.0);
    case Activation::HardSwish: return x * std::min(std::max(al * x + be, 0.0), 1.0);
  }
  return x;
}
// A bound on |act'|: how far an input error moves the output.
inline double act_lipschitz(const ActivationParams& a) {
  switch (a.kind) {
    case Activation::Sigmoid: return 0.25;
    case Activation::Silu: return 1.1;
    case Activation::LeakyRelu: return std::max(1.0, std::fabs(static_cast<double>(a.alpha)));
    case Activation::HardSigmoid: return std::fabs(static_cast<double>(a.alpha));
    // hs(x) + alpha x on the ramp, where |alpha x + beta| <= 1.
    case Activation::HardSwish: return 2.0 + std::fabs(static_cast<double>(a.beta));
    default: return 1.0;
  }
}
// Error of evaluating the activation in f32 at x (result y): exact for
// relu and clip, one rounding for leaky relu and hard sigmoid's affine
// part, the C library's exp / tanh (16 ULPs, generous) for the rest.
inline double act_eval_err(const ActivationParams& a, double x, double y) {
  switch (a.kind) {
    case Activation::None:
    case Activation::Relu:
    case Activation::Clip: return 0;
    case Activation::LeakyRelu: return kU * std::fabs(y);
    case Activation::HardSigmoid: return 4 * kU * (std::fabs(a.alpha * x) + std::fabs(static_cast<double>(a.beta)));
    case Activation::HardSwish:  // the hard sigmoid's error times |x|, and the product's rounding
      return 4 * kU * (std::fabs(a.alpha * x) + std::fabs(static_cast<double>(a.beta))) * std::fabs(x) +
             kU * std::fabs(y);
    default: return 16 * kU * std::fabs(y) + 1e-30;
  }
}
inline std::string act_name(const ActivationParams& a) {
  static const char* const names[] = {"none",       "relu", "clip",         "sigmoid",   "silu",
                                      "leaky_relu", "tanh", "hard_sigmoid", "hard_swish"};
  return std::string(names[static_cast<int>(a.kind)]) + "(" + num(a.alpha) + ", " + num(a.beta) + ")";
}
inline std::vector<ActivationParams> all_activations(Rng& r) {
  const auto lo = static_cast<float>(r.uniform(-2, -0.1)), hi = static_cast<float>(r.uniform(0.2, 3));
  return {
      ActivationParams{},
      ActivationParams::relu(),
      ActivationParams::clip(lo, hi),
      ActivationParams::sigmoid(),
      ActivationParams::silu(),
      ActivationParams::leaky_relu(static_cast<float>(r.uniform(0.01, 0.5))),
      ActivationParams::tanh(),
      ActivationParams::hard_sigmoid(static_cast<float>(r.uniform(0.1, 0.4)), static_cast<float>(r.uniform(0.3, 0.7))),
      ActivationParams::hard_swish(static_cast<float>(r.uniform(0.1, 0.4)), static_cast<float>(r.uniform(0.3, 0.7)))};
}

// ---- Matrix products ------------------------------------------------------------------------

// NumPy broadcast of two shapes (valid ones).
inline Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const std::size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (std::size_t i = 0; i < r; ++i) {
    const std::int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const std::int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    out[i] = da == 1 ? db : da;
  }
  return out;
}
// Element of h broadcast (NumPy, right-aligned) to the index `idx` of a larger shape.
inline double bcast_at(const Host& h, const Shape& idx) {
  const std::size_t skip = idx.size() - h.shape.size();
  std::int64_t off = 0;
  for (std::size_t d = 0; d < h.shape.size(); ++d) off = off * h.shape[d] + (h.shape[d] == 1 ? 0 : idx[skip + d]);
  return h.v[static_cast<std::size_t>(off)];
}
// Element (row, col) of the matrix of h at y's batch index `bidx`.
inline double mat_at(const Host& h, const Shape& bidx, std::int64_t row, std::int64_t col) {
  const std::size_t r = h.shape.size(), hb = r - 2, skip = bidx.size() - hb;
  std::int64_t off = 0;
  for (std::size_t d = 0; d < hb; ++d) off = off * h.shape[d] + (h.shape[d] == 1 ? 0 : bidx[skip + d]);
  off = (off * h.shape[r - 2] + row) * h.shape[r - 1] + col;
  return h.v[static_cast<std::size_t>(off)];
}

struct MatMulSpec {
  bool ta = false, tb = false;
  float alpha = 1, beta = 1;
  std::optional<Host> c;
  ActivationParams act;
  DType y = DType::F32;
};

inline Ref ref_matmul(const Host& a, const Host& b, const MatMulSpec& s, Shape& yshape) {
  const Shape& as = a.shape;
  const Shape& bs = b.shape;
  const std::int64_t m = s.ta ? as.back() : as[as.size() - 2], k = s.ta ? as[as.size() - 2] : as.back();
  const std::int64_t n = s.tb ? bs[bs.size() - 2] : bs.back();
  yshape = broadcast_shapes(Shape(as.begin(), as.end() - 2), Shape(bs.begin(), bs.end() - 2));
  yshape.push_back(m);
  yshape.push_back(n);
  Ref r;
  const double alpha = s.alpha, beta = s.beta;
  for_each_index(yshape, [&](const Shape& idx, std::int64_t) {
    const Shape bidx(idx.begin(), idx.end() - 2);
    const std::int64_t i = idx[idx.size() - 2], j = idx.back();
    double acc = 0, mag = 0;
    for (std::int64_t kk = 0; kk < k; ++kk) {
      const double av = s.ta ? mat_at(a, bidx, kk, i) : mat_at(a, bidx, i, kk);
      const double bv = s.tb ? mat_at(b, bidx, j, kk) : mat_at(b, bidx, kk, j);
      acc += av * bv;
      mag += std::fabs(av * bv);
    }
    const double cv = s.c ? bcast_at(*s.c, idx) : 0.0;
    const double pre = alpha * acc + (s.c ? beta * cv : 0.0);
    // f32 sum of K products, then alpha * acc + beta * c (three roundings).
    const double err = std::fabs(alpha) * mag * kU * static_cast<double>(k + 2) +
                       4 * kU * (std::fabs(alpha * acc) + std::fabs(beta * cv)) + 1e-30;
    const double out = act_ref(s.act, pre);
    r.push(out, act_lipschitz(s.act) * err + act_eval_err(s.act, pre, out) + (s.y != DType::F32 ? ulp(s.y, out) : 0.0));
  });
  return r;
}

// ---- Convolutions and windows ------------------------------------------------------------

inline std::int64_t window_out(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t dil, std::int64_t p0,
                               std::int64_t p1, bool ceil_mode) {
  const std::int64_t padded = in + p0 + p1, window = dil * (k - 1) + 1;
  if (k < 1 || padded < window) return 0;
  std::int64_t out = (padded - window) / stride + 1;
  if (ceil_mode && (padded - window) % stride) {
    ++out;
    if ((out - 1) * stride >= in + p0) --out;  // a last window starting in the end padding is dropped
  }
  return out;
}

inline Shape img_shape(Layout l, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
  return l == Layout::NCHW ? Shape{n, c, h, w} : Shape{n, h, w, c};
}
struct Img {
  std::int64_t n, c, h, w;
};
inline Img img_dims(const Host& x, Layout l) {
  const Shape& s = x.shape;
  return l == Layout::NCHW ? Img{s[0], s[1], s[2], s[3]} : Img{s[0], s[3], s[1], s[2]};
}
inline std::int64_t img_index(const Shape& s, Layout l, std::int64_t n, std::int64_t c, std::int64_t h,
                              std::int64_t w) {
  return l == Layout::NCHW ? ((n * s[1] + c) * s[2] + h) * s[3] + w : ((n * s[1] + h) * s[2] + w) * s[3] + c;
}
inline double img_at(const Host& x, Layout l, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
  return x.v[static_cast<std::size_t>(img_index(x.shape, l, n, c, h, w))];
}

struct ConvGeom {
  Layout layout = Layout::NCHW;
  std::array<std::uint32_t, 2> strides{1, 1}, dilations{1, 1};
  std::array<std::uint32_t, 4> pads{0, 0, 0, 0};
  std::uint32_t groups = 1;
  Conv2dOptions options() const {
    Conv2dOptions o;
    o.layout = layout;
    o.strides = strides;
    o.dilations = dilations;
    o.pads = pads;
    o.groups = groups;
    return o;
  }
  std::string text() const {
    std::ostringstream os;
    os << (layout == Layout::NCHW ? "NCHW" : "NHWC") << " strides " << strides[0] << "," << strides[1] << " dilations "
       << dilations[0] << "," << dilations[1] << " pads " << pads[0] << "," << pads[1] << "," << pads[2] << ","
       << pads[3] << " groups " << groups;
    return os.str();
  }
};

// y's shape, or empty if the kernel does not fit.
inline Shape conv_out_shape(const Host& x, const Shape& ws, const ConvGeom& g) {
  const Img d = img_dims(x, g.layout);
  const std::int64_t oh = window_out(d.h, ws[2], g.strides[0], g.dilations[0], g.pads[0], g.pads[2], false);
  const std::int64_t ow = window_out(d.w, ws[3], g.strides[1], g.dilations[1], g.pads[1], g.pads[3], false);
  if (oh <= 0 || ow <= 0) return {};
  return img_shape(g.layout, d.n, ws[0], oh, ow);
}

// Calls fn(x value, w value) for the taps of output (n, o, r, col) that fall
// inside the input (padding contributes nothing).
template <class F>
void conv_taps(const Host& x, const Host& w, const ConvGeom& g, std::int64_t n, std::int64_t o, std::int64_t r,
               std::int64_t col, F&& fn) {
  const Img d = img_dims(x, g.layout);
  const std::int64_t cg = w.shape[1], kh = w.shape[2], kw = w.shape[3];
  const std::int64_t og = w.shape[0] / g.groups, grp = o / og;
  for (std::int64_t ci = 0; ci < cg; ++ci)
    for (std::int64_t a = 0; a < kh; ++a) {
      const std::int64_t ih = r * g.strides[0] + a * g.dilations[0] - g.pads[0];
      if (ih < 0 || ih >= d.h) continue;
      for (std::int64_t bb = 0; bb < kw; ++bb) {
        const std::int64_t iw = col * g.strides[1] + bb * g.dilations[1] - g.pads[1];
        if (iw < 0 || iw >= d.w) continue;
        fn(img_at(x, g.layout, n, grp * cg + ci, ih, iw),
           w.v[static_cast<std::size_t>(((o * cg + ci) * kh + a) * kw + bb)]);
      }
    }
}

// Visits y's elements as (n, o, r, col, linear index in y's layout).
template <class F>
void for_each_output(const Shape& ys, Layout l, F&& fn) {
  for_each_index(ys, [&](const Shape& idx, std::int64_t lin) {
    if (l == Layout::NCHW)
      fn(idx[0], idx[1], idx[2], idx[3], lin);
    else
      fn(idx[0], idx[3], idx[1], idx[2], lin);
  });
}

// `prior`: what y held, added before the activation (Conv2dOptions::accumulate).
inline Ref ref_conv(const Host& x, const Host& w, const std::optional<Host>& bias, const ConvGeom& g,
                    const ActivationParams& act, DType ydt, const Shape& ys, const Host* prior = nullptr) {
  Ref r;
  const std::int64_t taps = w.shape[1] * w.shape[2] * w.shape[3] + (prior ? 1 : 0);
  for_each_output(
      ys, g.layout, [&](std::int64_t n, std::int64_t o, std::int64_t row, std::int64_t col, std::int64_t lin) {
        double acc = (bias ? bias->v[static_cast<std::size_t>(o)] : 0.0) +
                     (prior ? prior->v[static_cast<std::size_t>(lin)] : 0.0);
        double mag = std::fabs(bias ? bias->v[static_cast<std::size_t>(o)] : 0.0) +
                     std::fabs(prior ? prior->v[static_cast<std::size_t>(lin)] : 0.0);
        conv_taps(x, w, g, n, o, row, col, [&](double xv, double wv) {
          acc += xv * wv;
          mag += std::fabs(xv * wv);
        });
        const double err = mag * kU * static_cast<double>(taps + 3) + 1e-30;
        const double out = act_ref(act, acc);
        r.push(out, act_lipschitz(act) * err + act_eval_err(act, acc, out) + (ydt != DType::F32 ? ulp(ydt, out) : 0.0));
      });
  return r;
}

// int32 accumulators of conv(x - xz, w - wz[o]) (wrapping), in y's layout.
inline std::vector<std::int64_t> ref_conv_int(const Host& x, const Host& w, const ConvGeom& g, std::int64_t xz,
                                              const std::vector<std::int64_t>& wz, const Shape& ys) {
  std::vector<std::int64_t> acc(static_cast<std::size_t>(numel(ys)));
  for_each_output(ys, g.layout,
                  [&](std::int64_t n, std::int64_t o, std::int64_t row, std::int64_t col, std::int64_t lin) {
                    std::int64_t s = 0;
                    const std::int64_t z = wz.empty() ? 0 : wz[wz.size() == 1 ? 0 : static_cast<std::size_t>(o)];
                    conv_taps(x, w, g, n, o, row, col, [&](double xv, double wv) {
                      s += (static_cast<std::int64_t>(xv) - xz) * (static_cast<std::int64_t>(wv) - z);
                    });
                    acc[static_cast<std::size_t>(lin)] = wrap32(s);
                  });
  return acc;
}

// Requantisation (docs/ops.md): m = (sa * sb) / sy in f32, float(acc) * m
// rounded to f32 once, rounded half to even, plus the zero point, saturated.
inline double requantize(std::int64_t acc32, double sa, double sb, double sy, std::int64_t zy, DType y) {
  const double m = f32(f32(sa * sb) / sy);
  const double v = f32(f32(static_cast<double>(acc32)) * m);
  return static_cast<double>(saturate(y, std::nearbyint(v) + static_cast<double>(zy)));
}

// A random convolution geometry whose kernel fits; returns y's shape.
struct ConvCase {
  ConvGeom g;
  Shape xs, ws;
};
inline ConvCase random_conv(Rng& r, std::int64_t max_hw = 9) {
  for (;;) {
    ConvCase c;
    c.g.layout = r.coin() ? Layout::NCHW : Layout::NHWC;
    const int kind = static_cast<int>(r.integer(0, 3));  // plain, grouped, depthwise, plain
    std::int64_t groups = 1, cg = r.integer(1, 4), og = r.integer(1, 4);
    if (kind == 1) {
      groups = r.integer(2, 3);
      cg = r.integer(1, 3);
      og = r.integer(1, 2);
    } else if (kind == 2) {
      groups = r.integer(2, 5);
      cg = 1;
      og = r.integer(1, 2);
    }
    c.g.groups = static_cast<std::uint32_t>(groups);
    const std::int64_t kh = r.integer(1, 4), kw = r.integer(1, 4);
    c.g.strides = {static_cast<std::uint32_t>(r.integer(1, 3)), static_cast<std::uint32_t>(r.integer(1, 3))};
    c.g.dilations = {static_cast<std::uint32_t>(r.integer(1, 2)), static_cast<std::uint32_t>(r.integer(1, 2))};
    for (auto& p : c.g.pads) p = static_cast<std::uint32_t>(r.integer(0, 3));
    const std::int64_t n = r.integer(1, 2), h = r.integer(1, max_hw), w = r.integer(1, max_hw);
    c.xs = img_shape(c.g.layout, n, groups * cg, h, w);
    c.ws = {groups * og, cg, kh, kw};
    if (window_out(h, kh, c.g.strides[0], c.g.dilations[0], c.g.pads[0], c.g.pads[2], false) > 0 &&
        window_out(w, kw, c.g.strides[1], c.g.dilations[1], c.g.pads[1], c.g.pads[3], false) > 0)
      return c;
  }
}

// ---- The parameterised suite -------------------------------------------------------------

class Ops : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    Device dev = open(GetParam());
    if (!dev.properties().caps.tensor) GTEST_SKIP() << GetParam() << " has no tensor engine";
    lab_ = std::make_unique<Lab>(dev);
    seed_ = test_seed();
    rng_.seed(seed_);
  }

  Lab& lab() { return *lab_; }
  Device& dev() { return lab_->dev; }

  void expect(const std::string& what, const Host& got, const Ref& want) {
    ASSERT_EQ(got.size(), want.v.size()) << what;
    Report rep(GetParam() + ": " + what, got.shape);
    for (std::size_t i = 0; i < got.size(); ++i)
      if (!matches(got.v[i], want.v[i], want.tol[i]))
        rep.bad(static_cast<std::int64_t>(i), got.v[i], num(want.v[i]) + " (tolerance " + num(want.tol[i]) + ")");
    rep.finish(seed_, got.size());
  }
  void expect_exact(const std::string& what, const Host& got, const std::vector<double>& want) {
    Ref r;
    r.v = want;
    r.tol.assign(want.size(), 0.0);
    expect(what, got, r);
  }
  // conv_integer of x (zero point xz, a scalar) and i8 w, exact; then
  // qlinear_conv of the same, its sums scaled by 0.5 * 0.25 / y_scale (powers
  // of two: exact ties) into x's dtype with no zero point, exact too.
  void expect_conv_integer_and_requantised(const std::string& what, const Host& x, const Host& w, const Host& xz,
                                           const ConvGeom& g, double y_scale) {
    const Shape ys = conv_out_shape(x, w.shape, g);
    const auto acc = ref_conv_int(x, w, g, static_cast<std::int64_t>(xz.v.at(0)), {}, ys);
    const Tensor y = lab().output(DType::I32, ys);
    expect_exact(
        "conv_integer " + what,
        lab().run(ops::conv_integer(lab().upload(x), lab().upload(w), y, lab().upload(xz), std::nullopt, g.options()),
                  y),
        std::vector<double>(acc.begin(), acc.end()));
    Host xs(DType::F32, {}), ws(DType::F32, {}), ysc(DType::F32, {}), yz(x.dtype, {});
    xs.v = {0.5};
    ws.v = {0.25};
    ysc.v = {y_scale};
    std::vector<double> want(acc.size());
    for (std::size_t i = 0; i < acc.size(); ++i) want[i] = requantize(acc[i], 0.5, 0.25, y_scale, 0, x.dtype);
    const Tensor yq = lab().output(x.dtype, ys);
    expect_exact("qlinear_conv " + what,
                 lab().run(ops::qlinear_conv(lab().upload(x), lab().upload(xs), lab().upload(xz), lab().upload(w),
                                             lab().upload(ws), lab().upload(Host(DType::I8, {})), lab().upload(ysc),
                                             lab().upload(yz), yq, g.options()),
                           yq),
                 want);
  }
  // An integer output of a float computation: any value between the
  // rounding of want - tol and of want + tol (saturated) is right.
  void expect_rounded(const std::string& what, const Host& got, const Ref& want) {
    ASSERT_EQ(got.size(), want.v.size()) << what;
    Report rep(GetParam() + ": " + what, got.shape);
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double lo = static_cast<double>(saturate(got.dtype, std::nearbyint(want.v[i] - want.tol[i])));
      const double hi = static_cast<double>(saturate(got.dtype, std::nearbyint(want.v[i] + want.tol[i])));
      if (!(got.v[i] >= lo && got.v[i] <= hi))
        rep.bad(static_cast<std::int64_t>(i), got.v[i], "[" + num(lo) + ", " + num(hi) + "] from " + num(want.v[i]));
    }
    rep.finish(seed_, got.size());
  }

  Host rand(DType t, Shape s, double lo = -1, double hi = 1) { return rand_host(rng_, t, std::move(s), lo, hi); }

  // Runs matmul on `a` and `b` (uploaded unless given as tensors) and
  // checks it against the reference.
  void check_matmul(const std::string& what, const Host& a, const Host& b, const MatMulSpec& s,
                    std::optional<Tensor> ta = {}, std::optional<Tensor> tb = {}, std::optional<Tensor> ty = {}) {
    Shape ys;
    const Ref want = ref_matmul(a, b, s, ys);
    if (std::getenv("OPS_DEBUG"))
      fprintf(stderr, "DEBUG matmul %s a %s b %s c %d y %s\n", to_string(a.dtype), dims(a.shape).c_str(),
              dims(b.shape).c_str(), s.c ? 1 : 0, to_string(s.y));
    MatMulOptions o;
    o.transpose_a = s.ta;
    o.transpose_b = s.tb;
    o.alpha = s.alpha;
    o.beta = s.beta;
    o.activation = s.act;
    if (s.c) o.c = lab().upload(*s.c);
    const Tensor y = ty ? *ty : lab().output(s.y, ys);
    const Host got = lab().run(ops::matmul(ta ? *ta : lab().upload(a), tb ? *tb : lab().upload(b), y, o), y);
    expect("matmul " + std::string(to_string(a.dtype)) + " a " + dims(a.shape) + (s.ta ? "^T" : "") + " b " +
               dims(b.shape) + (s.tb ? "^T" : "") + " -> " + to_string(s.y) + " y " + dims(ys) + " alpha " +
               num(s.alpha) + " beta " + num(s.beta) + (s.c ? " c " + dims(s.c->shape) : "") + " " + act_name(s.act) +
               " (" + what + ")",
           got, want);
  }

  std::unique_ptr<Lab> lab_;
  Rng rng_;
  std::uint64_t seed_ = 0;
};

// ---- pooling ----------------------------------------------------------------------------------

inline Ref ref_pool(const Host& x, const Pool2dOptions& o, bool max, const Shape& ys) {
  const Img d = img_dims(x, o.layout);
  Ref r;
  for_each_output(ys, o.layout, [&](std::int64_t n, std::int64_t c, std::int64_t row, std::int64_t col, std::int64_t) {
    const std::int64_t h0 = row * o.strides[0] - o.pads[0], w0 = col * o.strides[1] - o.pads[1];
    double best = -kInf, sum = 0, mag = 0;
    std::int64_t valid = 0, in_padded = 0;
    for (std::int64_t a = 0; a < o.kernel[0]; ++a) {
      const std::int64_t ih = h0 + a * o.dilations[0];
      for (std::int64_t bb = 0; bb < o.kernel[1]; ++bb) {
        const std::int64_t iw = w0 + bb * o.dilations[1];
        // The window clipped to the padded input (taps past the end padding,
        // which ceil_mode windows can have, are not part of it).
        if (ih < d.h + o.pads[2] && iw < d.w + o.pads[3]) ++in_padded;
        if (ih < 0 || ih >= d.h || iw < 0 || iw >= d.w) continue;
        const double v = img_at(x, o.layout, n, c, ih, iw);
        best = std::max(best, v);
        sum += v;
        mag += std::fabs(v);
        ++valid;
      }
    }
    if (max) {
      r.push(best, 0.0);
      return;
    }
    const auto divisor = static_cast<double>(o.count_include_pad ? in_padded : valid);
    const double out = sum / divisor;
    r.push(out, kU * static_cast<double>(valid + 2) * mag / divisor + 2 * kU * std::fabs(out) +
                    (x.dtype != DType::F32 ? ulp(x.dtype, out) : 0.0));
  });
  return r;
}

// Whether every one of `out` windows along an axis has a tap inside the input.
inline bool windows_touch_input(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t dil, std::int64_t p0,
                                std::int64_t out) {
  for (std::int64_t o = 0; o < out; ++o) {
    bool any = false;
    for (std::int64_t a = 0; a < k; ++a) {
      const std::int64_t i = o * stride - p0 + a * dil;
      any = any || (i >= 0 && i < in);
    }
    if (!any) return false;
  }
  return true;
}

struct PoolCase {
  Pool2dOptions o;
  Shape xs, ys;
};
inline PoolCase random_pool(Rng& r, bool dilate) {
  for (;;) {
    PoolCase c;
    c.o.layout = r.coin() ? Layout::NCHW : Layout::NHWC;
    for (int k = 0; k < 2; ++k) {
      c.o.kernel[k] = static_cast<std::uint32_t>(r.integer(1, 3));
      c.o.strides[k] = static_cast<std::uint32_t>(r.integer(1, 3));
      c.o.dilations[k] = dilate ? static_cast<std::uint32_t>(r.integer(1, 2)) : 1;
      const std::int64_t window = std::int64_t{c.o.dilations[k]} * (c.o.kernel[k] - 1) + 1;
      c.o.pads[k] = static_cast<std::uint32_t>(r.integer(0, window - 1));
      c.o.pads[k + 2] = static_cast<std::uint32_t>(r.integer(0, window - 1));
    }
    c.o.ceil_mode = r.coin();
    c.o.count_include_pad = r.coin();
    const std::int64_t n = r.integer(1, 2), ch = r.integer(1, 3), h = r.integer(1, 9), w = r.integer(1, 9);
    const std::int64_t oh =
        window_out(h, c.o.kernel[0], c.o.strides[0], c.o.dilations[0], c.o.pads[0], c.o.pads[2], c.o.ceil_mode);
    const std::int64_t ow =
        window_out(w, c.o.kernel[1], c.o.strides[1], c.o.dilations[1], c.o.pads[1], c.o.pads[3], c.o.ceil_mode);
    if (oh <= 0 || ow <= 0) continue;
    // Windows whose dilated taps all miss the input have nothing to pool
    // (PoolRefusesWindowsMadeOnlyOfPadding); keep them out of here.
    if (!windows_touch_input(h, c.o.kernel[0], c.o.strides[0], c.o.dilations[0], c.o.pads[0], oh) ||
        !windows_touch_input(w, c.o.kernel[1], c.o.strides[1], c.o.dilations[1], c.o.pads[1], ow))
      continue;
    c.xs = img_shape(c.o.layout, n, ch, h, w);
    c.ys = img_shape(c.o.layout, n, ch, oh, ow);
    return c;
  }
}
inline std::string pool_text(const Pool2dOptions& o) {
  std::ostringstream os;
  os << (o.layout == Layout::NCHW ? "NCHW" : "NHWC") << " kernel " << o.kernel[0] << "x" << o.kernel[1] << " strides "
     << o.strides[0] << "," << o.strides[1] << " dilations " << o.dilations[0] << "," << o.dilations[1] << " pads "
     << o.pads[0] << "," << o.pads[1] << "," << o.pads[2] << "," << o.pads[3] << (o.ceil_mode ? " ceil_mode" : "")
     << (o.count_include_pad ? " count_include_pad" : "");
  return os.str();
}

// ---- elementwise --------------------------------------------------------------------------------

enum class Bin { Add, Sub, Mul, Div, Max, Min, Mod, Fmod };
inline const char* bin_name(Bin b) {
  static const char* const names[] = {"add", "sub", "mul", "div", "max", "min", "mod", "fmod"};
  return names[static_cast<int>(b)];
}
inline Op bin_op(Bin op, const Tensor& a, const Tensor& b, const Tensor& y) {
  switch (op) {
    case Bin::Add: return ops::add(a, b, y);
    case Bin::Sub: return ops::sub(a, b, y);
    case Bin::Mul: return ops::mul(a, b, y);
    case Bin::Div: return ops::div(a, b, y);
    case Bin::Max: return ops::max(a, b, y);
    case Bin::Min: return ops::min(a, b, y);
    case Bin::Mod: return ops::mod(a, b, y);
    case Bin::Fmod: return ops::fmod(a, b, y);
  }
  return {};
}
// f32 arithmetic (the double result rounded once to f32 is the IEEE f32
// result), then rounded to the output type.
inline double float_bin(Bin op, double a, double b, DType t) {
  double r = 0;
  switch (op) {
    case Bin::Add: r = a + b; break;
    case Bin::Sub: r = a - b; break;
    case Bin::Mul: r = a * b; break;
    case Bin::Div: r = a / b; break;
    case Bin::Max: r = std::isnan(a) || std::isnan(b) ? kNaN : std::max(a, b); break;
    case Bin::Min: r = std::isnan(a) || std::isnan(b) ? kNaN : std::min(a, b); break;
    case Bin::Fmod: r = std::fmod(a, b); break;  // exact
    case Bin::Mod:                               // numpy.mod: the divisor's sign, a zero too
      r = std::fmod(a, b);
      r = r == 0 ? std::copysign(0.0, b) : (r < 0) != (b < 0) ? r + b : r;
      break;
  }
  return round_to(t, f32(r));
}
inline double int_bin(Bin op, std::int64_t a, std::int64_t b, DType t) {
  std::int64_t r = 0;
  switch (op) {
    case Bin::Add: r = a + b; break;
    case Bin::Sub: r = a - b; break;
    case Bin::Mul: r = a * b; break;
    case Bin::Div: r = b == 0 ? 0 : a / b; break;  // toward zero; x / 0 = 0
    case Bin::Max: r = std::max(a, b); break;
    case Bin::Min: r = std::min(a, b); break;
    case Bin::Fmod: r = b == 0 ? 0 : a % b; break;  // the dividend's sign; x fmod 0 = 0
    case Bin::Mod:                                  // the divisor's sign; x mod 0 = 0
      r = b == 0 ? 0 : a % b;
      if (r != 0 && (r < 0) != (b < 0)) r += b;
      break;
  }
  return static_cast<double>(wrap(t, r));
}

inline const std::vector<std::array<Shape, 3>> kBroadcasts{
    {Shape{2, 3, 4}, Shape{2, 3, 4}, Shape{2, 3, 4}},
    {Shape{2, 3, 4}, Shape{3, 1}, Shape{2, 3, 4}},
    {Shape{1, 4}, Shape{3, 1}, Shape{3, 4}},
    {Shape{}, Shape{5}, Shape{5}},
    {Shape{2, 1, 3, 1}, Shape{4, 1, 2}, Shape{2, 4, 3, 2}},
    {Shape{37}, Shape{1}, Shape{37}},
    // One operand the same row every time, the other dense: per-channel
    // scales over pixels (staged side by side, more rows than one stage
    // holds), either side.
    {Shape{600, 7}, Shape{7}, Shape{600, 7}},
    {Shape{1, 1, 33}, Shape{4, 3, 33}, Shape{4, 3, 33}},
    // The same over a batch, each image its own row (a squeeze-and-excitation
    // gate at batch 3), and more rows per image than one stage holds.
    {Shape{3, 5, 4, 7}, Shape{3, 1, 1, 7}, Shape{3, 5, 4, 7}},
    {Shape{2, 1, 9}, Shape{2, 700, 9}, Shape{2, 700, 9}},
};

// Special values planted among random ones.
inline std::vector<double> specials(DType t) {
  switch (t) {
    case DType::I8: return {-128, -1, 0, 1, 127};
    case DType::U8: return {0, 1, 127, 128, 255};
    case DType::I32: return {-2147483648.0, -1, 0, 1, 2147483647.0, 65536, -65536};
    case DType::F16: return {0, -0.0, 65504, -65504, kInf, -kInf, kNaN, 0x1p-24, 1000};
    default: return {0, -0.0, 3e38, -3e38, kInf, -kInf, kNaN, 1e-40, 0x1p-126};
  }
}
inline Host with_specials(Rng& r, Host h, DType t) {
  const auto sp = specials(t);
  for (auto& v : h.v)
    if (r.coin(0.25)) v = is_float(t) ? round_to(t, r.pick(sp)) : r.pick(sp);
  return h;
}

// The values a cast is most likely to get wrong, for each source type.
inline std::vector<double> cast_specials(DType t) {
  switch (t) {
    case DType::F32:
      return {0,
              -0.0,
              0.5,
              -0.5,
              0.99999994,
              -0.99999994,
              1.5,
              -1.5,
              2.5,
              127,
              127.99999,
              128,
              -128,
              -128.99998,
              -129,
              255,
              255.99998,
              256,
              -1,
              65504,
              65519.996,
              65520,
              1 + 0x1p-11,
              1 + 3 * 0x1p-11,
              1 + 0x1p-8,
              1 + 3 * 0x1p-8,
              0x1p-24,
              0x1p-25,
              3 * 0x1p-26,
              2147483520.0,
              2147483648.0,
              -2147483648.0,
              -2147483904.0,
              3.4e38,
              1e-40,
              kInf,
              -kInf,
              kNaN};
    case DType::F16:
      return {0,    -0.0, 0.5,     -0.5, 1.5,   -1.5,   2.5,     127,  127.9375, 128,   -128, -128.875,
              -129, 255,  255.875, 256,  65504, -65504, 0x1p-24, 1e-4, kInf,     -kInf, kNaN};
    case DType::BF16:
      return {0,   0.5,          -0.5,          1.5,          127,     127.5, 128,   -128, -129,  255,
              256, 2147483648.0, -2147483648.0, 4294967296.0, 3.38e38, 65536, 65280, kInf, -kInf, kNaN};
    case DType::I8: return {-128, -127, -1, 0, 1, 126, 127};
    case DType::U8: return {0, 1, 127, 128, 254, 255};
    case DType::I32:
      return {-2147483648.0, -2147483647.0, -129,         -128,         -1,       0,     1,     127,
              128,           255,           256,          65504,        65519,    65520, 65536, 16777217,
              16777219,      16842753,      2147483647.0, 2147483583.0, -16777217};
  }
  return {};
}

// docs/ops.md: to a float type, round to nearest even (integers are
// converted to f32 first: f16 and bf16 values are computed in f32, which
// matters for i32 -> bf16 only); float to integer rounds toward zero and
// saturates, NaN gives 0; integer to integer saturates.
inline double cast_ref(double v, DType src, DType dst) {
  if (is_float(dst)) return std::isnan(v) ? kNaN : round_to(dst, is_float(src) ? v : f32(v));
  if (std::isnan(v)) return 0;
  return static_cast<double>(saturate(dst, std::trunc(v)));
}

// ---- softmax --------------------------------------------------------------------------------------

inline Ref ref_softmax(const Host& x, std::int64_t axis, bool log_softmax, DType dt) {
  const std::size_t ax = static_cast<std::size_t>(axis < 0 ? axis + static_cast<std::int64_t>(x.shape.size()) : axis);
  const std::int64_t len = x.shape[ax];
  Ref r;
  r.v.resize(x.size());
  r.tol.resize(x.size());
  Shape outer = x.shape;
  outer[ax] = 1;
  const Shape st = row_major(x.shape);
  for_each_index(outer, [&](const Shape& idx, std::int64_t) {
    std::int64_t base = 0;
    for (std::size_t d = 0; d < idx.size(); ++d) base += idx[d] * st[d];
    double mx = -kInf, sum = 0;
    for (std::int64_t i = 0; i < len; ++i) mx = std::max(mx, x.v[static_cast<std::size_t>(base + i * st[ax])]);
    for (std::int64_t i = 0; i < len; ++i) sum += std::exp(x.v[static_cast<std::size_t>(base + i * st[ax])] - mx);
    const double ls = std::log(sum), n = static_cast<double>(len);
    for (std::int64_t i = 0; i < len; ++i) {
      const auto at = static_cast<std::size_t>(base + i * st[ax]);
      const double t = x.v[at] - mx;
      // f32: x - max rounds by u|t| (exp turns that into a relative u|t|),
      // expf adds an ULP, the sum's relative error is at most ~3 len u, the
      // division or the subtraction of log(sum) one more rounding.
      const double out = log_softmax ? t - ls : std::exp(t) / sum;
      const double tol = log_softmax ? 2 * kU * (std::fabs(t) + std::fabs(ls) + 3 * n + std::fabs(out) + 2)
                                     : 2 * kU * std::fabs(out) * (3 * n + std::fabs(t) + 4) + 1e-30;
      // Stored in f16 / bf16, values beyond the type's range are infinite.
      r.v[at] = std::fabs(out) >= format_of(dt).max + ulp(dt, format_of(dt).max) / 2 ? std::copysign(kInf, out) : out;
      r.tol[at] = tol + (dt != DType::F32 ? ulp(dt, out) : 0.0);
    }
  });
  return r;
}

// ---- quantize / dequantize ----------------------------------------------------------------------------

inline double quantize_ref(double x, DType xt, double s, std::int64_t z, DType yt) {
  const double xv = xt == DType::I32 ? f32(x) : x;
  const double q = f32(xv / s);  // in f32
  return static_cast<double>(saturate(yt, std::nearbyint(q) + static_cast<double>(z)));
}

// ---- integer matrix products ------------------------------------------------------------------------

// acc[.., i, j] = sum_k (a - az[i]) (b - bz[j]), wrapped to int32; az, bz
// empty (none), one value or one per row / column.
inline std::vector<std::int64_t> ref_matmul_int(const Host& a, const Host& b, const std::vector<double>& az,
                                                const std::vector<double>& bz, Shape& yshape) {
  const std::int64_t k = a.shape.back();
  yshape = broadcast_shapes(Shape(a.shape.begin(), a.shape.end() - 2), Shape(b.shape.begin(), b.shape.end() - 2));
  yshape.push_back(a.shape[a.shape.size() - 2]);
  yshape.push_back(b.shape.back());
  std::vector<std::int64_t> out;
  for_each_index(yshape, [&](const Shape& idx, std::int64_t) {
    const Shape bidx(idx.begin(), idx.end() - 2);
    const std::int64_t i = idx[idx.size() - 2], j = idx.back();
    const auto za = static_cast<std::int64_t>(az.empty() ? 0 : az[az.size() == 1 ? 0 : static_cast<std::size_t>(i)]);
    const auto zb = static_cast<std::int64_t>(bz.empty() ? 0 : bz[bz.size() == 1 ? 0 : static_cast<std::size_t>(j)]);
    std::int64_t acc = 0;
    for (std::int64_t kk = 0; kk < k; ++kk)
      acc += (static_cast<std::int64_t>(mat_at(a, bidx, i, kk)) - za) *
             (static_cast<std::int64_t>(mat_at(b, bidx, kk, j)) - zb);
    out.push_back(wrap32(acc));
  });
  return out;
}

inline std::vector<double> as_doubles(const std::vector<std::int64_t>& v) { return {v.begin(), v.end()}; }

// ---- resize -----------------------------------------------------------------------------------------------

// ONNX Resize's coordinate transformation; the resized length is in * scale, unrounded.
inline double source_coordinate(CoordinateMode m, double o, double scale, std::int64_t in) {
  const double resized = static_cast<double>(in) * scale;
  switch (m) {
    case CoordinateMode::HalfPixel: return (o + 0.5) / scale - 0.5;
    case CoordinateMode::Asymmetric: return o / scale;
    case CoordinateMode::AlignCorners: return resized == 1 ? 0.0 : o * static_cast<double>(in - 1) / (resized - 1);
    case CoordinateMode::PytorchHalfPixel: return resized > 1 ? (o + 0.5) / scale - 0.5 : 0.0;
    case CoordinateMode::TfHalfPixelForNn: return (o + 0.5) / scale;
  }
  return 0;
}
inline std::int64_t nearest_index(NearestMode m, double x) {
  const double fl = std::floor(x);
  switch (m) {
    case NearestMode::RoundPreferFloor: return static_cast<std::int64_t>(x - fl == 0.5 ? fl : std::round(x));
    case NearestMode::RoundPreferCeil: return static_cast<std::int64_t>(x - fl == 0.5 ? std::ceil(x) : std::round(x));
    case NearestMode::Floor: return static_cast<std::int64_t>(fl);
    case NearestMode::Ceil: return static_cast<std::int64_t>(std::ceil(x));
  }
  return 0;
}
inline std::int64_t clamp_index(std::int64_t i, std::int64_t len) { return std::clamp<std::int64_t>(i, 0, len - 1); }
// The source indices nearest mode may pick for coordinate x. The engine
// computes x in f32 (a few ULPs off); where x lies within 1e-5 of a decision
// boundary the neighbour is accepted too, unless `strict` (the test chose
// scales that make f32 exact).
inline std::vector<std::int64_t> nearest_candidates(NearestMode m, double x, std::int64_t len, bool strict) {
  std::vector<std::int64_t> out{clamp_index(nearest_index(m, x), len)};
  if (!strict) {
    const double eps = 1e-5 * (1 + std::fabs(x));
    out.push_back(clamp_index(nearest_index(m, x - eps), len));
    out.push_back(clamp_index(nearest_index(m, x + eps), len));
  }
  return out;
}
inline const char* coord_name(CoordinateMode m) {
  static const char* const names[] = {"half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                                      "tf_half_pixel_for_nn"};
  return names[static_cast<int>(m)];
}
inline const char* nearest_name(NearestMode m) {
  static const char* const names[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
  return names[static_cast<int>(m)];
}

class ResizeCheck {
 public:
  ResizeCheck(Lab& lab, std::uint64_t seed) : lab_(lab), seed_(seed) {}
  // Resizes x to y's H x W with `o` and checks every output element.
  void run(const std::string& what, const Host& x, std::int64_t oh, std::int64_t ow, const ResizeOptions& o,
           bool strict) {
    const Img d = img_dims(x, o.layout);
    const Shape ys = img_shape(o.layout, d.n, d.c, oh, ow);
    const Tensor y = lab_.output(x.dtype, ys);
    const Host got = lab_.run(ops::resize(lab_.upload(x), y, o), y);
    const std::array<double, 2> sc =
        o.scales ? std::array<double, 2>{(*o.scales)[0], (*o.scales)[1]}
                 : std::array<double, 2>{f32(static_cast<double>(static_cast<float>(oh) / static_cast<float>(d.h))),
                                         f32(static_cast<double>(static_cast<float>(ow) / static_cast<float>(d.w)))};
    Report rep(what + " " +
                   (o.mode == ResizeMode::Nearest ? "nearest " + std::string(nearest_name(o.nearest)) : "linear") +
                   " " + coord_name(o.coordinate) + " " + to_string(x.dtype) + " " + dims(x.shape) + " -> " + dims(ys) +
                   (o.layout == Layout::NHWC ? " NHWC" : ""),
               ys);
    for_each_output(
        ys, o.layout, [&](std::int64_t n, std::int64_t c, std::int64_t r, std::int64_t col, std::int64_t lin) {
          const double sy = source_coordinate(o.coordinate, static_cast<double>(r), sc[0], d.h);
          const double sx = source_coordinate(o.coordinate, static_cast<double>(col), sc[1], d.w);
          const double g = got.v[static_cast<std::size_t>(lin)];
          if (o.mode == ResizeMode::Nearest) {
            std::string options;
            for (auto rr : nearest_candidates(o.nearest, sy, d.h, strict))
              for (auto cc : nearest_candidates(o.nearest, sx, d.w, strict)) {
                const double v = img_at(x, o.layout, n, c, rr, cc);
                if (v == g) return;
                options += " x[" + std::to_string(rr) + "," + std::to_string(cc) + "]=" + num(v);
              }
            rep.bad(lin, g, "one of" + options + " (coordinates " + num(sy) + ", " + num(sx) + ")");
            return;
          }
          // Bilinear, the two nearest rows and columns, edges replicated.
          const double fy = std::floor(sy), fx = std::floor(sx), wy = sy - fy, wx = sx - fx;
          const auto y0 = clamp_index(static_cast<std::int64_t>(fy), d.h),
                     y1 = clamp_index(static_cast<std::int64_t>(fy) + 1, d.h);
          const auto x0 = clamp_index(static_cast<std::int64_t>(fx), d.w),
                     x1 = clamp_index(static_cast<std::int64_t>(fx) + 1, d.w);
          auto px = [&](std::int64_t yy, std::int64_t xx) { return img_at(x, o.layout, n, c, yy, xx); };
          const double want =
              (px(y0, x0) * (1 - wx) + px(y0, x1) * wx) * (1 - wy) + (px(y1, x0) * (1 - wx) + px(y1, x1) * wx) * wy;
          const double maxabs =
              std::max({std::fabs(px(y0, x0)), std::fabs(px(y0, x1)), std::fabs(px(y1, x0)), std::fabs(px(y1, x1))});
          // The f32 coordinates are off by a few ULPs of |s| + 1, which moves the
          // weights by as much; the interpolation itself rounds ~8 times.
          const double tol = maxabs * kU * (16 * (std::fabs(sy) + std::fabs(sx) + 2) + 16);
          if (is_float(x.dtype)) {
            const double t = tol + (x.dtype != DType::F32 ? ulp(x.dtype, want) : 0.0);
            if (!matches(g, want, t)) rep.bad(lin, g, num(want) + " (tolerance " + num(t) + ")");
          } else {
            const double lo = static_cast<double>(saturate(x.dtype, std::nearbyint(want - tol)));
            const double hi = static_cast<double>(saturate(x.dtype, std::nearbyint(want + tol)));
            if (g < lo || g > hi) rep.bad(lin, g, "[" + num(lo) + ", " + num(hi) + "] from " + num(want));
          }
        });
    rep.finish(seed_, got.size());
  }

 private:
  Lab& lab_;
  std::uint64_t seed_;
};

inline const std::vector<CoordinateMode> kCoordinateModes{
    CoordinateMode::HalfPixel, CoordinateMode::Asymmetric, CoordinateMode::AlignCorners,
    CoordinateMode::PytorchHalfPixel, CoordinateMode::TfHalfPixelForNn};
inline const std::vector<NearestMode> kNearestModes{NearestMode::RoundPreferFloor, NearestMode::RoundPreferCeil,
                                                    NearestMode::Floor, NearestMode::Ceil};

// ---- the host's operand checks -------------------------------------------------------------------------------

inline std::string device_name(const ::testing::TestParamInfo<std::string>& p) { return testing::param_name(p.param); }

// ---- determinism across engine thread counts ----------------------------------------------------------------

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A temporary folder, removed with everything in it.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// A fresh board of the bm1684x profile, opened from a temp copy (so that it
// is new in this process) with the environment variable `var` set to
// `value` while it is made and starts its engine (both read it then).
inline std::unique_ptr<Lab> fresh_lab(const TempDir& dir, const char* var, const std::string& value) {
  const std::string json = read_text(std::filesystem::path(TPUHAL_OPS_PROFILE_DIR) / "bm1684x.json");
  EXPECT_FALSE(json.empty());
  const auto path = dir.path / (std::string(var) + "-" + value + ".json");
  std::ofstream(path) << json;
  const char* saved = std::getenv(var);
  const std::string saved_value = saved ? saved : "";
  ::setenv(var, value.c_str(), 1);
  auto lab = std::make_unique<Lab>(open("sim:" + path.string()));
  const Tensor y = lab->output(DType::F32, {4});
  lab->run(ops::relu(lab->upload(Host(DType::F32, {4})), y));  // starts the engine
  if (saved)
    ::setenv(var, saved_value.c_str(), 1);
  else
    ::unsetenv(var);
  return lab;
}

// ---- the board's own checks of parameter blocks ----------------------------------------------------------------
//
// tpu::submit_raw cannot carry an inline parameter block: it treats every
// slot as a descriptor, so publish() (drivers/tpu/src/queue.cpp) writes each
// 64-byte chunk's bytes 4..15 (sequence, fence_value) and sets the fence and
// interrupt flags in the last one, overwriting the block's magic-adjacent
// fields. These tests therefore put the block in memory and pass its address
// (kTensorOp args: address, bytes), as a recorded program does.

struct BoardRig {
  std::shared_ptr<sim::Board> board = std::make_shared<sim::Board>(sim::load_profile("tiny"));
  std::shared_ptr<driver::DeviceBackend> dev =
      tpu::open_device(tpu::make_sim_transport(board), "ops-board:tiny", "tpu-sim");
};

inline driver::Timeline settle(driver::QueueBackend& q, std::uint64_t value) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  for (;;) {
    auto t = q.timeline();
    if (t.completed >= value || t.failed || std::chrono::steady_clock::now() > deadline) return t;
    q.block(value, 100ms);
  }
}

inline fw::CommandDescriptor descriptor(fw::Opcode op, std::uint64_t a0 = 0, std::uint64_t a1 = 0,
                                        std::uint64_t a2 = 0) {
  fw::CommandDescriptor d{};
  d.opcode = static_cast<std::uint16_t>(op);
  d.args[0] = a0;
  d.args[1] = a1;
  d.args[2] = a2;
  return d;
}

inline fw::TensorRef tensor_ref(std::uint64_t address, fw::DType dt, std::vector<std::uint64_t> shape) {
  fw::TensorRef t{};
  t.address = address;
  t.dtype = static_cast<std::uint32_t>(dt);
  t.rank = static_cast<std::uint32_t>(shape.size());
  std::uint64_t step = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    t.shape[d] = shape[d];
    t.strides[d] = step;
    step *= shape[d];
  }
  return t;
}

struct AddBlock {
  fw::OpHeader h;
  fw::TensorRef t[3];  // A, B, Y
  fw::ElementwiseAttrs at;
};
static_assert(sizeof(AddBlock) == 32 + 3 * 128 + 16);
struct ConvBlock {
  fw::OpHeader h;
  fw::TensorRef t[4];  // X, W, Bias, Y
  fw::ConvAttrs at;
};
static_assert(sizeof(ConvBlock) == 32 + 4 * 128 + 64);

class OpsBoard : public ::testing::Test {
 protected:
  void SetUp() override {
    mem_ = rig_.dev->allocate(64 * 1024, Memory::DeviceHostVisible, {});
    block_ = rig_.dev->allocate(4096, Memory::HostPinned, {});
    base_ = mem_->device_address();
    auto m = mem_->map();
    std::memset(m.data(), 0, m.size());
    for (int i = 0; i < 16; ++i) {
      const float a = static_cast<float>(i), b = 0.5f * static_cast<float>(i);
      std::memcpy(m.data() + kA + 4 * i, &a, 4);
      std::memcpy(m.data() + kB + 4 * i, &b, 4);
    }
    std::memset(m.data() + kY, 0xA5, 64);
    std::memset(m.data() + kMarkSrc1, 0x11, 64);
    std::memset(m.data() + kMarkSrc2, 0x22, 64);
  }

  AddBlock add_block() const {
    AddBlock b{};
    b.h.magic = fw::kOpMagic;
    b.h.kind = static_cast<std::uint32_t>(fw::OpKind::kElementwise);
    b.h.num_tensors = 3;
    b.h.attr_bytes = sizeof(fw::ElementwiseAttrs);
    b.t[0] = tensor_ref(base_ + kA, fw::DType::kF32, {16});
    b.t[1] = tensor_ref(base_ + kB, fw::DType::kF32, {16});
    b.t[2] = tensor_ref(base_ + kY, fw::DType::kF32, {16});
    b.at.op = static_cast<std::uint32_t>(fw::ElementwiseOp::kAdd);
    return b;
  }

  // Submits [copy marker 1, tensor op with `block`, copy marker 2] on a
  // fresh compute queue and waits (bounded) for it to finish or fail.
  template <class Block>
  driver::Timeline submit(const Block& blk, std::shared_ptr<driver::QueueBackend>& q) {
    std::memcpy(block_->map().data(), &blk, sizeof blk);
    q = rig_.dev->create_queue(Engine::Compute, {});
    const std::array<fw::CommandDescriptor, 3> ds{
        descriptor(fw::Opcode::kCopy, base_ + kMarkSrc1, base_ + kMarkDst1, 64),
        descriptor(fw::Opcode::kTensorOp, block_->device_address(), sizeof blk),
        descriptor(fw::Opcode::kCopy, base_ + kMarkSrc2, base_ + kMarkDst2, 64)};
    const std::uint64_t v = tpu::submit_raw(*q, ds);
    return settle(*q, v);
  }

  // The op was refused: DeviceFault naming `says`, the command before it
  // ran, the output and the command after it untouched.
  template <class Block>
  void expect_refused(const Block& blk, const std::vector<std::string>& says, std::uint64_t y_offset = kY) {
    SCOPED_TRACE(says.back());
    std::shared_ptr<driver::QueueBackend> q;
    const driver::Timeline t = submit(blk, q);
    ASSERT_TRUE(t.failed) << says[0] << ": the board ran the block";
    const Error e = q->failure();
    EXPECT_EQ(e.status(), Status::DeviceFault) << e.what();
    EXPECT_THAT(e.what(), HasSubstr("failed at command 2 of 3"));
    for (const auto& s : says) EXPECT_THAT(e.what(), HasSubstr(s));
    auto m = mem_->map();
    for (int i = 0; i < 64; ++i) {
      ASSERT_EQ(static_cast<int>(m[kMarkDst1 + i]), 0x11) << "the command before the op did not run";
      ASSERT_EQ(static_cast<int>(m[kMarkDst2 + i]), 0) << "the command after the failed op ran";
      if (y_offset != kNoCheck) {
        ASSERT_EQ(static_cast<int>(m[y_offset + i]), 0xA5) << "the refused op wrote its output";
      }
    }
    std::memset(m.data() + kMarkDst1, 0, 64);
  }

  // A valid add on `q` completes with a + b.
  void expect_add_runs(driver::QueueBackend& q) {
    const AddBlock blk = add_block();
    std::memcpy(block_->map().data() + 2048, &blk, sizeof blk);
    const std::array<fw::CommandDescriptor, 1> ds{
        descriptor(fw::Opcode::kTensorOp, block_->device_address() + 2048, sizeof(AddBlock))};
    const driver::Timeline t = settle(q, tpu::submit_raw(q, ds));
    ASSERT_FALSE(t.failed) << q.failure().what();
    auto m = mem_->map();
    for (int i = 0; i < 16; ++i) {
      float y;
      std::memcpy(&y, m.data() + kY + 4 * i, 4);
      EXPECT_EQ(y, 1.5f * static_cast<float>(i)) << "element " << i;
    }
    std::memset(m.data() + kY, 0xA5, 64);
  }

  static constexpr std::uint64_t kA = 0, kB = 256, kY = 512, kMarkSrc1 = 1024, kMarkSrc2 = 1088, kMarkDst1 = 2048,
                                 kMarkDst2 = 2112, kNoCheck = ~0ull;
  BoardRig rig_;
  std::shared_ptr<driver::BufferBackend> mem_, block_;
  std::uint64_t base_ = 0;
};

}  // namespace tpuhal::ops_test
