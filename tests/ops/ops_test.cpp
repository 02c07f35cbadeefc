// The tensor ops against a float64 / int64 reference written here, on fresh
// random data every run (the seed is printed with every failure; set
// TPUHAL_TEST_SEED to replay one), following docs/ops.md exactly; recorded
// programs; the host's operand checks; and the board's own checks of
// parameter blocks the HAL would never produce.
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
// - exp, log, tanh and friends come from the C library: two f32 ULPs for
//   exp and log, 16 ULPs (relative) for the fused activations.
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

namespace tpuhal {
namespace {

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

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

std::int64_t lo_of(DType t) {
  switch (t) {
    case DType::I8: return -128;
    case DType::U8: return 0;
    case DType::I32: return std::numeric_limits<std::int32_t>::min();
    default: return 0;
  }
}
std::int64_t hi_of(DType t) {
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
Format format_of(DType t) {
  switch (t) {
    case DType::F16: return {11, -14, 65504.0};
    case DType::BF16: return {8, -126, 0x1.fep127};
    default: return {24, -126, static_cast<double>(std::numeric_limits<float>::max())};
  }
}

// `v` rounded to the float type `t`, to nearest with ties to even, overflow
// to infinity (IEEE 754), subnormals included.
double round_to(DType t, double v) {
  if (t == DType::F32) return static_cast<double>(static_cast<float>(v));
  if (std::isnan(v) || std::isinf(v) || v == 0) return v;
  const Format f = format_of(t);
  const int q = std::max(std::ilogb(v), f.emin) - (f.digits - 1);  // exponent of one ULP
  const double r = std::ldexp(std::nearbyint(std::ldexp(v, -q)), q);
  return std::fabs(r) > f.max ? std::copysign(kInf, v) : r;
}
double f32(double v) { return round_to(DType::F32, v); }

// One ULP of the float type `t` at magnitude |v|.
double ulp(DType t, double v) {
  const Format f = format_of(t);
  const int e = (v == 0 || !std::isfinite(v)) ? f.emin : std::max(std::ilogb(v), f.emin);
  return std::ldexp(1.0, e - (f.digits - 1));
}

std::int64_t saturate(DType t, double v) {
  return static_cast<std::int64_t>(std::clamp(v, static_cast<double>(lo_of(t)), static_cast<double>(hi_of(t))));
}
// Two's complement wrap into `t` (integer elementwise ops and accumulators wrap).
std::int64_t wrap(DType t, std::int64_t v) {
  const auto u = static_cast<std::uint64_t>(v);
  switch (t) {
    case DType::I8: return static_cast<std::int8_t>(static_cast<std::uint8_t>(u));
    case DType::U8: return static_cast<std::uint8_t>(u);
    default: return static_cast<std::int32_t>(static_cast<std::uint32_t>(u));
  }
}
std::int64_t wrap32(std::int64_t v) { return wrap(DType::I32, v); }

std::uint16_t f16_bits(double v) {
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
double f16_value(std::uint16_t h) {
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  const int exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0) return sign * std::ldexp(man, -24);
  if (exp == 31) return man ? kNaN : sign * kInf;
  return sign * std::ldexp(1024 + man, exp - 25);
}
std::uint16_t bf16_bits(double v) {
  if (std::isnan(v)) return 0x7FC0;
  const float f = static_cast<float>(round_to(DType::BF16, v));  // exact
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<std::uint16_t>(u >> 16);
}
double bf16_value(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void store(DType t, double v, std::byte* p) {
  switch (t) {
    case DType::F32: { const float f = static_cast<float>(v); std::memcpy(p, &f, 4); return; }
    case DType::F16: { const std::uint16_t h = f16_bits(v); std::memcpy(p, &h, 2); return; }
    case DType::BF16: { const std::uint16_t h = bf16_bits(v); std::memcpy(p, &h, 2); return; }
    case DType::I8: *p = static_cast<std::byte>(static_cast<std::uint8_t>(static_cast<std::int64_t>(v))); return;
    case DType::U8: *p = static_cast<std::byte>(static_cast<std::uint8_t>(static_cast<std::int64_t>(v))); return;
    case DType::I32: {
      const auto i = static_cast<std::int32_t>(static_cast<std::uint32_t>(static_cast<std::int64_t>(v)));
      std::memcpy(p, &i, 4);
      return;
    }
  }
}
double load(DType t, const std::byte* p) {
  switch (t) {
    case DType::F32: { float f; std::memcpy(&f, p, 4); return f; }
    case DType::F16: { std::uint16_t h; std::memcpy(&h, p, 2); return f16_value(h); }
    case DType::BF16: { std::uint16_t h; std::memcpy(&h, p, 2); return bf16_value(h); }
    case DType::I8: return static_cast<std::int8_t>(*p);
    case DType::U8: return static_cast<std::uint8_t>(*p);
    case DType::I32: { std::int32_t i; std::memcpy(&i, p, 4); return i; }
  }
  return 0;
}

// ---- Host tensors ------------------------------------------------------------------

std::int64_t numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}
Shape row_major(const Shape& s) {
  Shape st(s.size());
  std::int64_t step = 1;
  for (std::size_t i = s.size(); i-- > 0;) {
    st[i] = step;
    step *= std::max<std::int64_t>(s[i], 1);
  }
  return st;
}
std::string dims(const Shape& s) {
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
Shape unravel(const Shape& shape, std::int64_t lin) {
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
Host permuted(const Host& h, const std::vector<std::size_t>& perm) {
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
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(g_); }
  std::int64_t integer(std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(g_); }
  bool coin(double p = 0.5) { return uniform(0, 1) < p; }
  template <class T>
  T pick(const std::vector<T>& v) { return v[static_cast<std::size_t>(integer(0, static_cast<std::int64_t>(v.size()) - 1))]; }
  std::mt19937_64& engine() { return g_; }

 private:
  std::mt19937_64 g_{1};
};

// Random values the dtype holds exactly: floats uniform in [lo, hi] rounded
// to the type, integers uniform over [lo, hi] clipped to the type's range.
Host rand_host(Rng& r, DType t, Shape s, double lo, double hi) {
  Host h(t, std::move(s));
  for (auto& x : h.v)
    x = is_float(t) ? round_to(t, r.uniform(lo, hi))
                    : static_cast<double>(r.integer(std::max<std::int64_t>(static_cast<std::int64_t>(lo), lo_of(t)),
                                                    std::min<std::int64_t>(static_cast<std::int64_t>(hi), hi_of(t))));
  return h;
}
// Integers over the type's whole range.
Host rand_int(Rng& r, DType t, Shape s) {
  return rand_host(r, t, std::move(s), static_cast<double>(lo_of(t)), static_cast<double>(hi_of(t)));
}

std::uint64_t test_seed() {
  if (const char* s = std::getenv("TPUHAL_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  std::random_device rd;
  return (std::uint64_t{rd()} << 32) ^ rd();
}

using test::error_of;

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
};

// ---- Comparing -------------------------------------------------------------------------

// Mismatches of one comparison, reported as one failure with the first few.
class Report {
 public:
  Report(std::string what, const Shape& shape) : what_(std::move(what)), shape_(shape) {
    os_ << std::setprecision(17);
  }
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

bool matches(double got, double want, double tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isnan(got)) return false;
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::fabs(got - want) <= tol;
}

std::string num(double v) {
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

double act_ref(const ActivationParams& a, double x) {
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
  }
  return x;
}
// A bound on |act'|: how far an input error moves the output.
double act_lipschitz(const ActivationParams& a) {
  switch (a.kind) {
    case Activation::Sigmoid: return 0.25;
    case Activation::Silu: return 1.1;
    case Activation::LeakyRelu: return std::max(1.0, std::fabs(static_cast<double>(a.alpha)));
    case Activation::HardSigmoid: return std::fabs(static_cast<double>(a.alpha));
    default: return 1.0;
  }
}
// Error of evaluating the activation in f32 at x (result y): exact for
// relu and clip, one rounding for leaky relu and hard sigmoid's affine
// part, the C library's exp / tanh (16 ULPs, generous) for the rest.
double act_eval_err(const ActivationParams& a, double x, double y) {
  switch (a.kind) {
    case Activation::None: case Activation::Relu: case Activation::Clip: return 0;
    case Activation::LeakyRelu: return kU * std::fabs(y);
    case Activation::HardSigmoid: return 4 * kU * (std::fabs(a.alpha * x) + std::fabs(static_cast<double>(a.beta)));
    default: return 16 * kU * std::fabs(y) + 1e-30;
  }
}
std::string act_name(const ActivationParams& a) {
  static const char* const names[] = {"none", "relu", "clip", "sigmoid", "silu", "leaky_relu", "tanh", "hard_sigmoid"};
  return std::string(names[static_cast<int>(a.kind)]) + "(" + num(a.alpha) + ", " + num(a.beta) + ")";
}
std::vector<ActivationParams> all_activations(Rng& r) {
  const auto lo = static_cast<float>(r.uniform(-2, -0.1)), hi = static_cast<float>(r.uniform(0.2, 3));
  return {ActivationParams{},
          ActivationParams::relu(),
          ActivationParams::clip(lo, hi),
          ActivationParams::sigmoid(),
          ActivationParams::silu(),
          ActivationParams::leaky_relu(static_cast<float>(r.uniform(0.01, 0.5))),
          ActivationParams::tanh(),
          ActivationParams::hard_sigmoid(static_cast<float>(r.uniform(0.1, 0.4)), static_cast<float>(r.uniform(0.3, 0.7)))};
}

// ---- Matrix products ------------------------------------------------------------------------

// NumPy broadcast of two shapes (valid ones).
Shape broadcast_shapes(const Shape& a, const Shape& b) {
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
double bcast_at(const Host& h, const Shape& idx) {
  const std::size_t skip = idx.size() - h.shape.size();
  std::int64_t off = 0;
  for (std::size_t d = 0; d < h.shape.size(); ++d) off = off * h.shape[d] + (h.shape[d] == 1 ? 0 : idx[skip + d]);
  return h.v[static_cast<std::size_t>(off)];
}
// Element (row, col) of the matrix of h at y's batch index `bidx`.
double mat_at(const Host& h, const Shape& bidx, std::int64_t row, std::int64_t col) {
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

Ref ref_matmul(const Host& a, const Host& b, const MatMulSpec& s, Shape& yshape) {
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

std::int64_t window_out(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t dil, std::int64_t p0,
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

Shape img_shape(Layout l, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
  return l == Layout::NCHW ? Shape{n, c, h, w} : Shape{n, h, w, c};
}
struct Img {
  std::int64_t n, c, h, w;
};
Img img_dims(const Host& x, Layout l) {
  const Shape& s = x.shape;
  return l == Layout::NCHW ? Img{s[0], s[1], s[2], s[3]} : Img{s[0], s[3], s[1], s[2]};
}
std::int64_t img_index(const Shape& s, Layout l, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
  return l == Layout::NCHW ? ((n * s[1] + c) * s[2] + h) * s[3] + w : ((n * s[1] + h) * s[2] + w) * s[3] + c;
}
double img_at(const Host& x, Layout l, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
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
Shape conv_out_shape(const Host& x, const Shape& ws, const ConvGeom& g) {
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
        fn(img_at(x, g.layout, n, grp * cg + ci, ih, iw), w.v[static_cast<std::size_t>(((o * cg + ci) * kh + a) * kw + bb)]);
      }
    }
}

// Visits y's elements as (n, o, r, col, linear index in y's layout).
template <class F>
void for_each_output(const Shape& ys, Layout l, F&& fn) {
  for_each_index(ys, [&](const Shape& idx, std::int64_t lin) {
    if (l == Layout::NCHW) fn(idx[0], idx[1], idx[2], idx[3], lin);
    else fn(idx[0], idx[3], idx[1], idx[2], lin);
  });
}

Ref ref_conv(const Host& x, const Host& w, const std::optional<Host>& bias, const ConvGeom& g,
             const ActivationParams& act, DType ydt, const Shape& ys) {
  Ref r;
  const std::int64_t taps = w.shape[1] * w.shape[2] * w.shape[3];
  for_each_output(ys, g.layout, [&](std::int64_t n, std::int64_t o, std::int64_t row, std::int64_t col, std::int64_t) {
    double acc = bias ? bias->v[static_cast<std::size_t>(o)] : 0.0, mag = std::fabs(acc);
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
std::vector<std::int64_t> ref_conv_int(const Host& x, const Host& w, const ConvGeom& g, std::int64_t xz,
                                       const std::vector<std::int64_t>& wz, const Shape& ys) {
  std::vector<std::int64_t> acc(static_cast<std::size_t>(numel(ys)));
  for_each_output(ys, g.layout, [&](std::int64_t n, std::int64_t o, std::int64_t row, std::int64_t col, std::int64_t lin) {
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
double requantize(std::int64_t acc32, double sa, double sb, double sy, std::int64_t zy, DType y) {
  const double m = f32(f32(sa * sb) / sy);
  const double v = f32(f32(static_cast<double>(acc32)) * m);
  return static_cast<double>(saturate(y, std::nearbyint(v) + static_cast<double>(zy)));
}

// A random convolution geometry whose kernel fits; returns y's shape.
struct ConvCase {
  ConvGeom g;
  Shape xs, ws;
};
ConvCase random_conv(Rng& r, std::int64_t max_hw = 9) {
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
    if (std::getenv("OPS_DEBUG")) fprintf(stderr, "DEBUG matmul %s a %s b %s c %d y %s\n", to_string(a.dtype), dims(a.shape).c_str(), dims(b.shape).c_str(), s.c ? 1 : 0, to_string(s.y));
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
               num(s.alpha) + " beta " + num(s.beta) + (s.c ? " c " + dims(s.c->shape) : "") + " " +
               act_name(s.act) + " (" + what + ")",
           got, want);
  }

  std::unique_ptr<Lab> lab_;
  Rng rng_;
  std::uint64_t seed_ = 0;
};

// ---- matmul ----------------------------------------------------------------------------------

TEST_P(Ops, MatMulMatchesTheReferenceForRandomShapes) {
  struct Dims {
    std::int64_t m, n, k;
  };
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const std::vector<DType> outs = dt == DType::F32 ? std::vector<DType>{DType::F32} : std::vector<DType>{dt, DType::F32};
    for (DType yt : outs) {
      std::vector<Dims> cases{{1, 1, 1}, {1, 17, 1}, {7, 1, 40}, {1, 1, 300}};
      for (int i = 0; i < 3; ++i) cases.push_back({rng_.integer(1, 33), rng_.integer(1, 33), rng_.integer(1, 70)});
      for (const Dims& d : cases) {
        MatMulSpec s;
        s.y = yt;
        check_matmul("random", rand(dt, {d.m, d.k}), rand(dt, {d.k, d.n}), s);
      }
    }
  }
}

TEST_P(Ops, MatMulWithEmptyOutputsRunsNothing) {
  // Nothing to compute: the ops complete and the queue stays healthy.
  for (const auto& [as, bs, ys] : std::vector<std::array<Shape, 3>>{{Shape{0, 4}, Shape{4, 5}, Shape{0, 5}},
                                                                     {Shape{3, 4}, Shape{4, 0}, Shape{3, 0}},
                                                                     {Shape{0, 0}, Shape{0, 0}, Shape{0, 0}},
                                                                     {Shape{2, 0, 4}, Shape{2, 4, 5}, Shape{2, 0, 5}}}) {
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
      const Tensor y = lab().output(dt, ys);
      lab().run(ops::matmul(lab().upload(rand(dt, as)), lab().upload(rand(dt, bs)), y));
    }
  }
  MatMulSpec s;
  check_matmul("after empty ops", rand(DType::F32, {2, 3}), rand(DType::F32, {3, 2}), s);
}

TEST_P(Ops, MatMulBatchDimensionsOfZeroBroadcastLikeNumPy) {
  // NumPy: a batch dimension of 1 broadcasts against 0 to 0
  // (np.matmul(np.ones((0, 3, 4)), np.ones((4, 5))).shape == (0, 3, 5)).
  struct Case {
    Shape as, bs, ys, wrong;
  };
  const std::vector<Case> cases{
      {{0, 3, 4}, {4, 5}, {0, 3, 5}, {1, 3, 5}},
      {{2, 1, 3, 4}, {0, 4, 5}, {2, 0, 3, 5}, {2, 1, 3, 5}},
      {{1, 3, 4}, {0, 4, 5}, {0, 3, 5}, {1, 3, 5}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("a " + dims(c.as) + " b " + dims(c.bs));
    const Tensor a = lab().upload(rand(DType::F32, c.as)), b = lab().upload(rand(DType::F32, c.bs));
    const Tensor y = lab().output(DType::F32, c.ys);
    EXPECT_NO_THROW(lab().run(ops::matmul(a, b, y))) << "y " << dims(c.ys) << " is the broadcast shape";
    // The shape with the zero dimension taken as 1 reads elements a or b
    // do not have (past the end of their data) and must be refused.
    const Tensor wrong = lab().output(DType::F32, c.wrong);
    const Error e = error_of([&] { ops::matmul(a, b, wrong); });
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("matmul: y has shape " + dims(c.wrong)));
  }
}

TEST_P(Ops, MatMulWithZeroInnerDimensionGivesZerosOrBetaC) {
  // K = 0: every element of y is written, with 0 (or beta * c). The cases
  // through the engine's general path (c given, or f16) come first.
  for (DType dt : {DType::F16, DType::F32, DType::BF16}) {
    MatMulSpec s;
    s.y = dt;
    s.c = rand(DType::F32, {3, 5});
    s.beta = 2.0f;
    check_matmul("K = 0 with c", rand(dt, {3, 0}), rand(dt, {0, 5}), s);
  }
  for (DType dt : {DType::F16, DType::F32, DType::BF16}) {
    MatMulSpec s;
    s.y = dt;
    check_matmul("batched K = 0", rand(dt, {2, 3, 0}), rand(dt, {0, 4}), s);
    check_matmul("K = 0", rand(dt, {3, 0}), rand(dt, {0, 5}), s);
  }
}

TEST_P(Ops, IntegerProductsWithZeroInnerDimension) {
  // matmul_integer: sums over nothing are 0; qlinear_matmul: y_zero_point.
  const Host a = rand_int(rng_, DType::U8, {3, 0}), b = rand_int(rng_, DType::I8, {0, 4});
  const Host az = rand_int(rng_, DType::U8, {3}), bz = rand_int(rng_, DType::I8, {4});
  const Tensor y = lab().output(DType::I32, {3, 4});
  expect_exact("matmul_integer K = 0",
               lab().run(ops::matmul_integer(lab().upload(a), lab().upload(b), y, lab().upload(az), lab().upload(bz)), y),
               std::vector<double>(12, 0.0));
  Host sc(DType::F32, {});
  sc.v = {0.5};
  Host yz(DType::U8, {});
  yz.v = {77};
  const Tensor q = lab().output(DType::U8, {3, 4});
  expect_exact("qlinear_matmul K = 0",
               lab().run(ops::qlinear_matmul(lab().upload(a), lab().upload(sc), lab().upload(az), lab().upload(b),
                                             lab().upload(sc), lab().upload(bz), lab().upload(sc), lab().upload(yz), q),
                         q),
               std::vector<double>(12, 77.0));
}

TEST_P(Ops, MatMulBroadcastsBatchDimensions) {
  const std::vector<std::array<Shape, 2>> batches{
      {Shape{2, 1}, Shape{3}},    // a [2,1,M,K] x b [3,K,N] -> [2,3,M,N]
      {Shape{}, Shape{4}},        // a [M,K] x b [4,K,N]
      {Shape{3}, Shape{}},        // a [3,M,K] x b [K,N]
      {Shape{1}, Shape{2}},       // a [1,M,K] x b [2,K,N]
      {Shape{2, 3, 1}, Shape{1, 3, 4}},
      {Shape{2, 1, 2, 1}, Shape{3, 1, 2}},
  };
  for (const auto& [ba, bb] : batches) {
    const DType dt = rng_.pick(std::vector<DType>{DType::F32, DType::F16, DType::BF16});
    const std::int64_t m = rng_.integer(1, 9), n = rng_.integer(1, 9), k = rng_.integer(1, 12);
    Shape as = ba, bs = bb;
    as.insert(as.end(), {m, k});
    bs.insert(bs.end(), {k, n});
    MatMulSpec s;
    s.y = rng_.coin() ? dt : DType::F32;
    s.ta = rng_.coin(0.3);
    s.tb = rng_.coin(0.3);
    Host a = rand(dt, as), b = rand(dt, bs);
    if (s.ta) std::swap(a.shape[a.shape.size() - 1], a.shape[a.shape.size() - 2]);  // same values, [.., K, M]
    if (s.tb) std::swap(b.shape[b.shape.size() - 1], b.shape[b.shape.size() - 2]);
    check_matmul("batch broadcast", a, b, s);
  }
}

TEST_P(Ops, MatMulTransposesEitherOperand) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (int t = 0; t < 4; ++t) {
      MatMulSpec s;
      s.ta = t & 1;
      s.tb = t & 2;
      s.y = dt;
      const std::int64_t m = rng_.integer(1, 13), n = rng_.integer(1, 13), k = rng_.integer(1, 20);
      const Shape as = s.ta ? Shape{2, k, m} : Shape{2, m, k};
      const Shape bs = s.tb ? Shape{n, k} : Shape{k, n};
      check_matmul("transposes", rand(dt, as), rand(dt, bs), s);
    }
}

TEST_P(Ops, MatMulScalesAndAddsABroadcastC) {
  const std::int64_t m = 6, n = 7, k = 9;
  const std::vector<Shape> c_shapes{{}, {1}, {n}, {m, 1}, {m, n}, {1, n}, {2, 1, n}, {2, m, n}};
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const Shape& cs : c_shapes) {
      MatMulSpec s;
      s.y = rng_.coin() ? dt : DType::F32;
      s.alpha = static_cast<float>(rng_.uniform(-2, 2));
      s.beta = rng_.coin(0.2) ? 0.0f : static_cast<float>(rng_.uniform(-2, 2));
      s.c = rand(rng_.pick(std::vector<DType>{DType::F32, DType::F16, DType::BF16}), cs, -3, 3);
      check_matmul("c broadcast", rand(dt, {2, m, k}), rand(dt, {k, n}), s);
    }
}

TEST_P(Ops, MatMulFusesEveryActivation) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const ActivationParams& act : all_activations(rng_)) {
      MatMulSpec s;
      s.act = act;
      s.y = dt;
      if (rng_.coin()) {
        s.c = rand(DType::F32, {5});
        s.alpha = 0.75f;
        s.beta = -1.5f;
      }
      check_matmul("activation", rand(dt, {8, 12}, -1.5, 1.5), rand(dt, {12, 5}, -1.5, 1.5), s);
    }
}

TEST_P(Ops, MatMulReadsAndWritesStridedAndPermutedViews) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const std::int64_t m = rng_.integer(2, 9), n = rng_.integer(2, 9), k = rng_.integer(2, 15);
    MatMulSpec s;
    s.y = dt;
    const Host a = rand(dt, {m, k}), b = rand(dt, {k, n});
    // a stored column-major (the transpose of a [K, M] buffer), b with
    // padded rows at an offset, y written through a transposed view.
    const Tensor ta = lab().upload(permuted(a, {1, 0})).permute({1, 0});
    const Tensor tb = lab().upload_view(b, {n + 3, 1}, 5);
    const Tensor ty = lab().output(dt, {n, m}).permute({1, 0});
    check_matmul("column-major a, padded b, transposed y", a, b, s, ta, tb, ty);
    // transpose_a of a transposed view: the stored matrix is a itself.
    MatMulSpec st = s;
    st.ta = true;
    const Host at = permuted(a, {1, 0});  // [K, M], what the op transposes back
    check_matmul("transpose_a of a permuted view", at, b, st, lab().upload(a).permute({1, 0}));
    // Batched a [B, M, K] as a permutation of a stored [M, B, K], and every
    // stride of b doubled.
    const Host ab = rand(dt, {3, m, k});
    const Tensor tab = lab().upload(permuted(ab, {1, 0, 2})).permute({1, 0, 2});
    const Tensor tbs = lab().upload_view(b, {2 * n, 2}, 0);
    check_matmul("batch-permuted a, doubled strides", ab, b, s, tab, tbs);
  }
}

TEST_P(Ops, MatMulReadsAndWritesHostMemory) {
  const Host a = rand(DType::F32, {5, 6}), b = rand(DType::F32, {6, 4});
  MatMulSpec s;
  const Tensor ta = lab().upload(a, Memory::HostPinned);
  // Over a bus without a memory window (USB) host-visible device memory
  // cannot be mapped, so the second operand is plain device memory there.
  const Tensor tb = lab().upload(
      b, dev().properties().caps.host_visible_device_memory ? Memory::DeviceHostVisible : Memory::Device);
  const Tensor ty = lab().output(DType::F32, {5, 4}, Memory::HostPinned);
  check_matmul("operands in host memory", a, b, s, ta, tb, ty);
}

// ---- conv2d ------------------------------------------------------------------------------------

TEST_P(Ops, Conv2dMatchesTheReferenceForRandomGeometries) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const int cases = dt == DType::F32 ? 14 : 7;
    for (int i = 0; i < cases; ++i) {
      const ConvCase c = random_conv(rng_);
      const Host x = rand(dt, c.xs), w = rand(dt, c.ws);
      const Shape ys = conv_out_shape(x, c.ws, c.g);
      std::optional<Host> bias;
      if (rng_.coin()) bias = rand(rng_.coin() ? dt : DType::F32, {c.ws[0]});
      const ActivationParams act = rng_.pick(all_activations(rng_));
      Conv2dOptions o = c.g.options();
      o.activation = act;
      if (bias) o.bias = lab().upload(*bias);
      const Tensor y = lab().output(dt, ys);
      const Host got = lab().run(ops::conv2d(lab().upload(x), lab().upload(w), y, o), y);
      expect("conv2d " + std::string(to_string(dt)) + " x " + dims(c.xs) + " w " + dims(c.ws) + " " + c.g.text() +
                 (bias ? " bias" : "") + " " + act_name(act),
             got, ref_conv(x, w, bias, c.g, act, dt, ys));
    }
  }
}

TEST_P(Ops, Conv2dSpecificGeometries) {
  struct Case {
    const char* name;
    Shape nchw;  // x as N, C, H, W
    Shape ws;
    ConvGeom g;
  };
  auto geom = [](std::array<std::uint32_t, 2> s, std::array<std::uint32_t, 2> d, std::array<std::uint32_t, 4> p,
                 std::uint32_t groups) {
    ConvGeom g;
    g.strides = s;
    g.dilations = d;
    g.pads = p;
    g.groups = groups;
    return g;
  };
  const std::vector<Case> cases{
      {"1x1", {2, 5, 7, 6}, {4, 5, 1, 1}, geom({1, 1}, {1, 1}, {0, 0, 0, 0}, 1)},
      {"1x1 stride 2", {1, 3, 7, 6}, {8, 3, 1, 1}, geom({2, 2}, {1, 1}, {0, 0, 0, 0}, 1)},
      {"1x1 padded past the kernel", {1, 2, 3, 4}, {3, 2, 1, 1}, geom({1, 1}, {1, 1}, {2, 1, 3, 2}, 1)},
      {"2x2 pads 3", {1, 2, 4, 4}, {2, 2, 2, 2}, geom({1, 2}, {1, 1}, {3, 0, 1, 3}, 1)},
      {"depthwise 3x3", {1, 6, 8, 8}, {6, 1, 3, 3}, geom({1, 1}, {1, 1}, {1, 1, 1, 1}, 6)},
      {"depthwise multiplier 2", {2, 4, 7, 5}, {8, 1, 3, 3}, geom({2, 1}, {1, 2}, {1, 2, 0, 1}, 4)},
      {"kernel covers the input", {1, 3, 5, 4}, {2, 3, 5, 4}, geom({1, 1}, {1, 1}, {0, 0, 0, 0}, 1)},
      {"1x1 input, padded", {1, 2, 1, 1}, {3, 2, 3, 3}, geom({1, 1}, {1, 1}, {1, 1, 1, 1}, 1)},
      {"dilated, strided, asymmetric", {1, 4, 11, 9}, {6, 2, 3, 2}, geom({2, 3}, {2, 3}, {0, 3, 2, 1}, 2)},
  };
  for (const Case& c : cases)
    for (Layout layout : {Layout::NCHW, Layout::NHWC})
      for (DType dt : {DType::F32, DType::F16}) {
        ConvGeom g = c.g;
        g.layout = layout;
        const Host x = rand(dt, img_shape(layout, c.nchw[0], c.nchw[1], c.nchw[2], c.nchw[3])), w = rand(dt, c.ws);
        const Host bias = rand(DType::F32, {c.ws[0]});
        const Shape ys = conv_out_shape(x, c.ws, g);
        ASSERT_FALSE(ys.empty()) << c.name;
        Conv2dOptions o = g.options();
        o.bias = lab().upload(bias);
        o.activation = ActivationParams::relu();
        const Tensor y = lab().output(dt, ys);
        const Host got = lab().run(ops::conv2d(lab().upload(x), lab().upload(w), y, o), y);
        expect(std::string("conv2d ") + c.name + " " + to_string(dt) + " " + g.text(), got,
               ref_conv(x, w, bias, g, o.activation, dt, ys));
      }
}

TEST_P(Ops, ConvolutionsWithZeroInputChannels) {
  // Sums over no input channels: conv2d gives bias (then the activation),
  // conv_integer 0.
  for (Layout layout : {Layout::NCHW, Layout::NHWC}) {
    ConvGeom g;
    g.layout = layout;
    g.pads = {1, 1, 1, 1};
    const Host x = rand(DType::F32, img_shape(layout, 1, 0, 4, 4)), w = rand(DType::F32, {3, 0, 3, 3});
    const Host bias = rand(DType::F32, {3}, -2, 2);
    const Shape ys = conv_out_shape(x, w.shape, g);
    Conv2dOptions o = g.options();
    o.bias = lab().upload(bias);
    o.activation = ActivationParams::relu();
    const Tensor y = lab().output(DType::F32, ys);
    expect(std::string("conv2d with no input channels ") + g.text(),
           lab().run(ops::conv2d(lab().upload(x), lab().upload(w), y, o), y),
           ref_conv(x, w, bias, g, o.activation, DType::F32, ys));
    const Host xi = rand_int(rng_, DType::U8, img_shape(layout, 1, 0, 4, 4)), wi = rand_int(rng_, DType::I8, {3, 0, 3, 3});
    const Tensor yi = lab().output(DType::I32, ys);
    expect_exact(std::string("conv_integer with no input channels ") + g.text(),
                 lab().run(ops::conv_integer(lab().upload(xi), lab().upload(wi), yi, std::nullopt, std::nullopt, g.options()), yi),
                 std::vector<double>(static_cast<std::size_t>(numel(ys)), 0.0));
  }
}

// ---- pooling ----------------------------------------------------------------------------------

Ref ref_pool(const Host& x, const Pool2dOptions& o, bool max, const Shape& ys) {
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
bool windows_touch_input(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t dil, std::int64_t p0,
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
PoolCase random_pool(Rng& r, bool dilate) {
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
    const std::int64_t oh = window_out(h, c.o.kernel[0], c.o.strides[0], c.o.dilations[0], c.o.pads[0], c.o.pads[2], c.o.ceil_mode);
    const std::int64_t ow = window_out(w, c.o.kernel[1], c.o.strides[1], c.o.dilations[1], c.o.pads[1], c.o.pads[3], c.o.ceil_mode);
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
std::string pool_text(const Pool2dOptions& o) {
  std::ostringstream os;
  os << (o.layout == Layout::NCHW ? "NCHW" : "NHWC") << " kernel " << o.kernel[0] << "x" << o.kernel[1] << " strides "
     << o.strides[0] << "," << o.strides[1] << " dilations " << o.dilations[0] << "," << o.dilations[1] << " pads "
     << o.pads[0] << "," << o.pads[1] << "," << o.pads[2] << "," << o.pads[3] << (o.ceil_mode ? " ceil_mode" : "")
     << (o.count_include_pad ? " count_include_pad" : "");
  return os.str();
}

TEST_P(Ops, MaxPoolIsExactForEveryDtype) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8})
    for (int i = 0; i < 6; ++i) {
      const PoolCase c = random_pool(rng_, true);
      const Host x = is_float(dt) ? rand(dt, c.xs, -100, 100) : rand_int(rng_, dt, c.xs);
      const Tensor y = lab().output(dt, c.ys);
      const Host got = lab().run(ops::max_pool2d(lab().upload(x), y, c.o), y);
      expect_exact("max_pool2d " + std::string(to_string(dt)) + " x " + dims(c.xs) + " " + pool_text(c.o), got,
                   ref_pool(x, c.o, true, c.ys).v);
    }
}

TEST_P(Ops, AvgPoolDividesAsDocumented) {
  std::vector<PoolCase> cases;
  // ceil_mode windows that run past the end padding, with and without
  // count_include_pad. Kernel 3, stride 2: H = 6 with pads 1 gives 4 rows,
  // the last window [5, 8) of which only row 5 is input and row 6 padding;
  // W = 6 without pads gives 3 columns, the last window [4, 7) clipped to
  // [4, 6).
  for (bool include : {false, true})
    for (const auto& pads : {std::array<std::uint32_t, 4>{1, 0, 1, 0}, std::array<std::uint32_t, 4>{0, 1, 1, 0}}) {
      PoolCase c;
      c.o.kernel = {3, 3};
      c.o.strides = {2, 2};
      c.o.pads = pads;
      c.o.ceil_mode = true;
      c.o.count_include_pad = include;
      c.xs = {1, 2, 6, 6};
      c.ys = {1, 2, window_out(6, 3, 2, 1, pads[0], pads[2], true), window_out(6, 3, 2, 1, pads[1], pads[3], true)};
      cases.push_back(c);
    }
  for (int i = 0; i < 10; ++i) cases.push_back(random_pool(rng_, i % 3 == 0));
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const PoolCase& c : cases) {
      const Host x = rand(dt, c.xs, -4, 4);
      const Tensor y = lab().output(dt, c.ys);
      const Host got = lab().run(ops::avg_pool2d(lab().upload(x), y, c.o), y);
      expect("avg_pool2d " + std::string(to_string(dt)) + " x " + dims(c.xs) + " " + pool_text(c.o), got,
             ref_pool(x, c.o, false, c.ys));
    }
}

TEST_P(Ops, PoolRefusesWindowsMadeOnlyOfPadding) {
  // Kernel 1x2 with dilation 2 and one column of padding each side over a
  // 1-column input: the window is 3 wide, so pads of 1 pass the "pads
  // smaller than the window" rule, but its two taps (columns -1 and 1) both
  // miss the input. There is nothing to take the max or mean of; like a
  // window made only of padding (which the pads rule exists to exclude),
  // the op must be refused rather than produce a value from no input.
  Pool2dOptions o;
  o.kernel = {1, 2};
  o.dilations = {1, 2};
  o.pads = {0, 1, 0, 1};
  for (DType dt : {DType::U8, DType::I8, DType::F32}) {
    Host xh(dt, {1, 1, 1, 1});
    xh.v = {42};
    const Tensor x = lab().upload(xh), y = lab().output(dt, {1, 1, 1, 1});
    for (bool max : {true, false}) {
      if (!max && !is_float(dt)) continue;
      std::optional<Op> op;
      try {
        op = max ? ops::max_pool2d(x, y, o) : ops::avg_pool2d(x, y, o);
      } catch (const Error& e) {
        EXPECT_EQ(e.status(), Status::InvalidArgument) << e.what();
        continue;
      }
      lab().run(*op);
      ADD_FAILURE() << (max ? "max_pool2d " : "avg_pool2d ") << to_string(dt)
                    << ": a window with no input element was accepted and gave " << lab().download(y).v[0]
                    << " (the only input element is 42)";
    }
  }
}

// ---- elementwise --------------------------------------------------------------------------------

enum class Bin { Add, Sub, Mul, Div, Max, Min };
const char* bin_name(Bin b) {
  static const char* const names[] = {"add", "sub", "mul", "div", "max", "min"};
  return names[static_cast<int>(b)];
}
Op bin_op(Bin op, const Tensor& a, const Tensor& b, const Tensor& y) {
  switch (op) {
    case Bin::Add: return ops::add(a, b, y);
    case Bin::Sub: return ops::sub(a, b, y);
    case Bin::Mul: return ops::mul(a, b, y);
    case Bin::Div: return ops::div(a, b, y);
    case Bin::Max: return ops::max(a, b, y);
    case Bin::Min: return ops::min(a, b, y);
  }
  return {};
}
// f32 arithmetic (the double result rounded once to f32 is the IEEE f32
// result), then rounded to the output type.
double float_bin(Bin op, double a, double b, DType t) {
  double r = 0;
  switch (op) {
    case Bin::Add: r = a + b; break;
    case Bin::Sub: r = a - b; break;
    case Bin::Mul: r = a * b; break;
    case Bin::Div: r = a / b; break;
    case Bin::Max: r = std::isnan(a) || std::isnan(b) ? kNaN : std::max(a, b); break;
    case Bin::Min: r = std::isnan(a) || std::isnan(b) ? kNaN : std::min(a, b); break;
  }
  return round_to(t, f32(r));
}
double int_bin(Bin op, std::int64_t a, std::int64_t b, DType t) {
  std::int64_t r = 0;
  switch (op) {
    case Bin::Add: r = a + b; break;
    case Bin::Sub: r = a - b; break;
    case Bin::Mul: r = a * b; break;
    case Bin::Div: r = b == 0 ? 0 : a / b; break;  // toward zero; x / 0 = 0
    case Bin::Max: r = std::max(a, b); break;
    case Bin::Min: r = std::min(a, b); break;
  }
  return static_cast<double>(wrap(t, r));
}

const std::vector<std::array<Shape, 3>> kBroadcasts{
    {Shape{2, 3, 4}, Shape{2, 3, 4}, Shape{2, 3, 4}},
    {Shape{2, 3, 4}, Shape{3, 1}, Shape{2, 3, 4}},
    {Shape{1, 4}, Shape{3, 1}, Shape{3, 4}},
    {Shape{}, Shape{5}, Shape{5}},
    {Shape{2, 1, 3, 1}, Shape{4, 1, 2}, Shape{2, 4, 3, 2}},
    {Shape{37}, Shape{1}, Shape{37}},
};

// Special values planted among random ones.
std::vector<double> specials(DType t) {
  switch (t) {
    case DType::I8: return {-128, -1, 0, 1, 127};
    case DType::U8: return {0, 1, 127, 128, 255};
    case DType::I32: return {-2147483648.0, -1, 0, 1, 2147483647.0, 65536, -65536};
    case DType::F16: return {0, -0.0, 65504, -65504, kInf, -kInf, kNaN, 0x1p-24, 1000};
    default: return {0, -0.0, 3e38, -3e38, kInf, -kInf, kNaN, 1e-40, 0x1p-126};
  }
}
Host with_specials(Rng& r, Host h, DType t) {
  const auto sp = specials(t);
  for (auto& v : h.v)
    if (r.coin(0.25)) v = is_float(t) ? round_to(t, r.pick(sp)) : r.pick(sp);
  return h;
}

TEST_P(Ops, ElementwiseBinaryOpsBroadcastAndRoundAsF32) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (Bin op : {Bin::Add, Bin::Sub, Bin::Mul, Bin::Div, Bin::Max, Bin::Min})
      for (const auto& [as, bs, ys] : kBroadcasts) {
        const Host a = with_specials(rng_, rand(dt, as, -8, 8), dt);
        const Host b = with_specials(rng_, rand(dt, bs, -8, 8), dt);
        const Tensor y = lab().output(dt, ys);
        const Host got = lab().run(bin_op(op, lab().upload(a), lab().upload(b), y), y);
        std::vector<double> want;
        for_each_index(ys, [&](const Shape& idx, std::int64_t) { want.push_back(float_bin(op, bcast_at(a, idx), bcast_at(b, idx), dt)); });
        expect_exact(std::string(bin_name(op)) + " " + to_string(dt) + " " + dims(as) + " and " + dims(bs) + " -> " + dims(ys),
                     got, want);
      }
}

TEST_P(Ops, ElementwiseIntegerOpsWrapAndDivideTowardZero) {
  for (DType dt : {DType::I8, DType::U8, DType::I32})
    for (Bin op : {Bin::Add, Bin::Sub, Bin::Mul, Bin::Div, Bin::Max, Bin::Min})
      for (const auto& [as, bs, ys] : kBroadcasts) {
        Host a = with_specials(rng_, rand_int(rng_, dt, as), dt);
        Host b = with_specials(rng_, rand_int(rng_, dt, bs), dt);
        if (op == Bin::Div)
          for (auto& v : b.v)
            if (rng_.coin(0.2)) v = rng_.coin() ? 0.0 : (dt == DType::U8 ? 1.0 : -1.0);  // x / 0 and MIN / -1
        const Tensor y = lab().output(dt, ys);
        const Host got = lab().run(bin_op(op, lab().upload(a), lab().upload(b), y), y);
        std::vector<double> want;
        for_each_index(ys, [&](const Shape& idx, std::int64_t) {
          want.push_back(int_bin(op, static_cast<std::int64_t>(bcast_at(a, idx)), static_cast<std::int64_t>(bcast_at(b, idx)), dt));
        });
        expect_exact(std::string(bin_name(op)) + " " + to_string(dt) + " " + dims(as) + " and " + dims(bs) + " -> " + dims(ys),
                     got, want);
      }
}

TEST_P(Ops, ElementwiseUnaryOps) {
  // abs and neg, every dtype: exact (integers wrap: abs(-128) is -128 in i8).
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32})
    for (bool neg : {false, true}) {
      const Host x = with_specials(rng_, is_float(dt) ? rand(dt, {4, 9}, -50, 50) : rand_int(rng_, dt, {4, 9}), dt);
      const Tensor y = lab().output(dt, x.shape);
      const Tensor tx = lab().upload(x);
      const Host got = lab().run(neg ? ops::neg(tx, y) : ops::abs(tx, y), y);
      std::vector<double> want;
      for (double v : x.v)
        want.push_back(is_float(dt) ? (neg ? -v : std::fabs(v))
                                    : static_cast<double>(wrap(dt, neg ? -static_cast<std::int64_t>(v)
                                                                       : std::llabs(static_cast<std::int64_t>(v)))));
      expect_exact(std::string(neg ? "neg " : "abs ") + to_string(dt), got, want);
    }
  // exp, log, sqrt on floats, with their special cases.
  enum class U { Exp, Log, Sqrt };
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (U op : {U::Exp, U::Log, U::Sqrt}) {
      Host x = rand(dt, {5, 11}, op == U::Exp ? -10 : 0, 10);
      const std::vector<double> sp = op == U::Exp ? std::vector<double>{0, -0.0, 100, -200, kInf, -kInf, kNaN, 11, 12}
                                                  : std::vector<double>{0, -0.0, -1, kInf, -kInf, kNaN, 1, 1e-6, 4, 1e4};
      for (std::size_t i = 0; i < sp.size(); ++i) x.v[i] = round_to(dt, sp[i]);
      const Tensor tx = lab().upload(x), y = lab().output(dt, x.shape);
      const Host got = lab().run(op == U::Exp ? ops::exp(tx, y) : op == U::Log ? ops::log(tx, y) : ops::sqrt(tx, y), y);
      Ref want;
      for (double v : x.v) {
        if (op == U::Sqrt) {  // correctly rounded in f32, then to the type
          want.push(round_to(dt, f32(std::sqrt(v))), 0.0);
          continue;
        }
        double e = op == U::Exp ? std::exp(v) : std::log(v);
        if (std::isfinite(e) && std::fabs(e) > format_of(DType::F32).max) e = std::copysign(kInf, e);  // f32 overflow
        if (std::isfinite(e) && std::fabs(e) >= format_of(dt).max + ulp(dt, format_of(dt).max) / 2)
          e = std::copysign(kInf, e);  // overflow of the output type
        // expf / logf are within 2 ULPs; the f16 / bf16 store adds one of theirs.
        want.push(e, 2 * ulp(DType::F32, e) + (dt != DType::F32 ? ulp(dt, e) : 0.0));
      }
      expect(std::string(op == U::Exp ? "exp " : op == U::Log ? "log " : "sqrt ") + to_string(dt), got, want);
    }
}

TEST_P(Ops, ElementwiseActivations) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const ActivationParams& act : all_activations(rng_)) {
      const Host x = rand(dt, {3, 40}, -12, 12);
      const Tensor y = lab().output(dt, x.shape);
      const Host got = lab().run(ops::activation(lab().upload(x), y, act), y);
      Ref want;
      for (double v : x.v) {
        const double out = act_ref(act, v);
        want.push(out, act_eval_err(act, v, out) + (dt != DType::F32 ? ulp(dt, out) : 0.0));
      }
      expect("activation " + act_name(act) + " " + to_string(dt), got, want);
    }
  // relu() is activation(relu).
  const Host x = rand(DType::F32, {17}, -3, 3);
  const Tensor y = lab().output(DType::F32, x.shape);
  const Host got = lab().run(ops::relu(lab().upload(x), y), y);
  std::vector<double> want;
  for (double v : x.v) want.push_back(v > 0 ? v : 0.0);
  expect_exact("relu", got, want);
}

// The values a cast is most likely to get wrong, for each source type.
std::vector<double> cast_specials(DType t) {
  switch (t) {
    case DType::F32:
      return {0, -0.0, 0.5, -0.5, 0.99999994, -0.99999994, 1.5, -1.5, 2.5, 127, 127.99999, 128, -128, -128.99998,
              -129, 255, 255.99998, 256, -1, 65504, 65519.996, 65520, 1 + 0x1p-11, 1 + 3 * 0x1p-11, 1 + 0x1p-8,
              1 + 3 * 0x1p-8, 0x1p-24, 0x1p-25, 3 * 0x1p-26, 2147483520.0, 2147483648.0, -2147483648.0,
              -2147483904.0, 3.4e38, 1e-40, kInf, -kInf, kNaN};
    case DType::F16:
      return {0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, 127, 127.9375, 128, -128, -128.875, -129, 255, 255.875, 256,
              65504, -65504, 0x1p-24, 1e-4, kInf, -kInf, kNaN};
    case DType::BF16:
      return {0, 0.5, -0.5, 1.5, 127, 127.5, 128, -128, -129, 255, 256, 2147483648.0, -2147483648.0,
              4294967296.0, 3.38e38, 65536, 65280, kInf, -kInf, kNaN};
    case DType::I8: return {-128, -127, -1, 0, 1, 126, 127};
    case DType::U8: return {0, 1, 127, 128, 254, 255};
    case DType::I32:
      return {-2147483648.0, -2147483647.0, -129, -128, -1, 0, 1, 127, 128, 255, 256, 65504, 65519, 65520, 65536,
              16777217, 16777219, 16842753, 2147483647.0, 2147483583.0, -16777217};
  }
  return {};
}

// docs/ops.md: to a float type, round to nearest even (integers are
// converted to f32 first: f16 and bf16 values are computed in f32, which
// matters for i32 -> bf16 only); float to integer rounds toward zero and
// saturates, NaN gives 0; integer to integer saturates.
double cast_ref(double v, DType src, DType dst) {
  if (is_float(dst)) return std::isnan(v) ? kNaN : round_to(dst, is_float(src) ? v : f32(v));
  if (std::isnan(v)) return 0;
  return static_cast<double>(saturate(dst, std::trunc(v)));
}

TEST_P(Ops, CastBetweenEveryPairOfDtypes) {
  const std::vector<DType> all{DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32};
  for (DType src : all) {
    std::vector<double> vals = cast_specials(src);
    for (int i = 0; i < 40; ++i) {
      if (!is_float(src)) vals.push_back(static_cast<double>(rng_.integer(lo_of(src), hi_of(src))));
      else if (i % 2) vals.push_back(rng_.uniform(-300, 300));
      else vals.push_back(std::ldexp(rng_.uniform(-1, 1), static_cast<int>(rng_.integer(-30, 40))));
    }
    Host x(src, {static_cast<std::int64_t>(vals.size())});
    for (std::size_t i = 0; i < vals.size(); ++i) x.v[i] = is_float(src) ? round_to(src, vals[i]) : vals[i];
    const Tensor tx = lab().upload(x);
    for (DType dst : all) {
      const Tensor y = lab().output(dst, x.shape);
      const Host got = lab().run(ops::cast(tx, y), y);
      std::vector<double> want;
      for (double v : x.v) want.push_back(cast_ref(v, src, dst));
      expect_exact(std::string("cast ") + to_string(src) + " -> " + to_string(dst), got, want);
    }
  }
}

TEST_P(Ops, CastBroadcastsItsInput) {
  const Host x = rand(DType::F32, {3, 1}, -200, 200);
  const Tensor y = lab().output(DType::I8, {2, 3, 4});
  const Host got = lab().run(ops::cast(lab().upload(x), y), y);
  std::vector<double> want;
  for_each_index(y.shape(), [&](const Shape& idx, std::int64_t) { want.push_back(cast_ref(bcast_at(x, idx), DType::F32, DType::I8)); });
  expect_exact("cast f32 [3, 1] -> i8 [2, 3, 4]", got, want);
}

TEST_P(Ops, TransposeAnyPermutationUpToRank6) {
  const std::vector<DType> all{DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32};
  for (int trial = 0; trial < 18; ++trial) {
    const std::size_t rank = static_cast<std::size_t>(trial % 6) + 1;
    Shape s(rank);
    for (auto& d : s) d = rng_.integer(1, rank >= 5 ? 3 : 5);
    std::vector<std::size_t> perm(rank);
    std::iota(perm.begin(), perm.end(), std::size_t{0});
    std::shuffle(perm.begin(), perm.end(), rng_.engine());
    const DType dt = rng_.pick(all);
    const Host x = is_float(dt) ? rand(dt, s, -100, 100) : rand_int(rng_, dt, s);
    const Host want = permuted(x, perm);
    const Tensor y = lab().output(dt, want.shape);
    const Host got = lab().run(ops::transpose(lab().upload(x), y, perm), y);
    std::string p;
    for (auto v : perm) p += std::to_string(v);
    expect_exact("transpose " + std::string(to_string(dt)) + " " + dims(s) + " perm " + p, got, want.v);
  }
}

// ---- softmax --------------------------------------------------------------------------------------

Ref ref_softmax(const Host& x, std::int64_t axis, bool log_softmax, DType dt) {
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

TEST_P(Ops, SoftmaxAndLogSoftmaxAlongEveryAxis) {
  const std::vector<Shape> shapes{{5}, {3, 7}, {2, 3, 4}, {2, 2, 3, 5}};
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const Shape& s : shapes) {
      if (dt != DType::F32 && s.size() > 2) continue;
      const auto rank = static_cast<std::int64_t>(s.size());
      for (std::int64_t axis = -rank; axis < rank; ++axis)
        for (bool lg : {false, true}) {
          const Host x = rand(dt, s, -6, 6);
          const Tensor y = lab().output(dt, s);
          const Host got = lab().run(ops::softmax(lab().upload(x), y, axis, lg), y);
          expect(std::string(lg ? "log_softmax " : "softmax ") + to_string(dt) + " " + dims(s) + " axis " + std::to_string(axis),
                 got, ref_softmax(x, axis, lg, dt));
        }
    }
}

TEST_P(Ops, SoftmaxOfLargeMagnitudesDoesNotOverflow) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const double big = dt == DType::F16 ? 60000 : 1e30;
    Host x(dt, {5, 6});
    const std::vector<std::vector<double>> rows{
        {1000, 1001, 999.5, 1000.25, 990, 1002},           // exp(1000) overflows: only x - max is safe
        {-10000, -10001, -9999, -10000.5, -10003, -9998},  // and exp(-10000) underflows
        {big, -big, 0, big / 2, -big / 2, 1},
        {80, 0, -80, 88.5, 89, 60},
        {0, 0, 0, 0, 0, 0},
    };
    for (std::size_t r = 0; r < rows.size(); ++r)
      for (std::size_t c = 0; c < 6; ++c) x.v[r * 6 + c] = round_to(dt, rows[r][c]);
    for (bool lg : {false, true}) {
      const Tensor y = lab().output(dt, x.shape);
      const Host got = lab().run(ops::softmax(lab().upload(x), y, -1, lg), y);
      for (double v : got.v) EXPECT_FALSE(std::isnan(v)) << (lg ? "log_softmax " : "softmax ") << to_string(dt);
      expect(std::string(lg ? "log_softmax " : "softmax ") + to_string(dt) + " of large magnitudes", got,
             ref_softmax(x, -1, lg, dt));
    }
  }
}

// ---- quantize / dequantize ----------------------------------------------------------------------------

double quantize_ref(double x, DType xt, double s, std::int64_t z, DType yt) {
  const double xv = xt == DType::I32 ? f32(x) : x;
  const double q = f32(xv / s);  // in f32
  return static_cast<double>(saturate(yt, std::nearbyint(q) + static_cast<double>(z)));
}

TEST_P(Ops, QuantizeRoundsHalfToEvenAndSaturates) {
  const Shape shape{3, 4, 5};
  for (DType xt : {DType::F32, DType::F16, DType::BF16, DType::I32})
    for (DType yt : {DType::U8, DType::I8})
      for (int variant = 0; variant < 5; ++variant) {
        // 0: scalar scale, no zero point; 1: scalar scale and zero point;
        // 2: per axis 1; 3: per axis 0 (given as -3); 4: per axis 2, no zero point.
        const std::int64_t axis = variant == 3 ? -3 : variant == 4 ? 2 : 1;
        const std::size_t ax = static_cast<std::size_t>(axis < 0 ? axis + 3 : axis);
        const bool per_axis = variant >= 2;
        const std::int64_t count = per_axis ? shape[ax] : 1;
        Host scale(DType::F32, per_axis ? Shape{count} : (variant == 0 ? Shape{} : Shape{1}));
        for (auto& s : scale.v)  // powers of two make exact ties possible
          s = rng_.coin() ? std::ldexp(1.0, static_cast<int>(rng_.integer(-3, 1))) : f32(rng_.uniform(0.01, 2));
        std::optional<Host> zp;
        if (variant != 0 && variant != 4) {
          zp = rand_int(rng_, yt, per_axis ? Shape{count} : Shape{});
          for (auto& z : zp->v) z = std::clamp(z, yt == DType::U8 ? 60.0 : -60.0, yt == DType::U8 ? 200.0 : 60.0);
        }
        Host x(xt, shape);
        for_each_index(shape, [&](const Shape& idx, std::int64_t lin) {
          const double s = scale.v[per_axis ? static_cast<std::size_t>(idx[ax]) : 0];
          double v = 0;
          switch (rng_.integer(0, 4)) {
            case 0:  // a tie: (k + 0.5) * s, exact where s is a power of two
              v = (static_cast<double>(rng_.integer(xt == DType::BF16 ? -60 : -150, xt == DType::BF16 ? 60 : 150)) + 0.5) * s;
              if (xt == DType::I32) v = 2 * static_cast<double>(rng_.integer(-150, 150)) + 1;  // odd / 2 with s = 2
              break;
            case 1: v = rng_.uniform(-300, 300) * s; break;
            case 2: v = (rng_.coin() ? 1 : -1) * (xt == DType::F16 ? 60000.0 : 1e6); break;  // saturates
            case 3: v = is_float(xt) ? (rng_.coin() ? kInf : -kInf) : (rng_.coin() ? 2147483647.0 : -2147483648.0); break;
            default: v = rng_.uniform(-3, 3); break;
          }
          x.v[static_cast<std::size_t>(lin)] = is_float(xt) ? round_to(xt, v) : std::round(v);
        });
        std::vector<double> want;
        for_each_index(shape, [&](const Shape& idx, std::int64_t lin) {
          const std::size_t p = per_axis ? static_cast<std::size_t>(idx[ax]) : 0;
          want.push_back(quantize_ref(x.v[static_cast<std::size_t>(lin)], xt, scale.v[p],
                                      zp ? static_cast<std::int64_t>(zp->v[p]) : 0, yt));
        });
        const Tensor y = lab().output(yt, shape);
        std::optional<Tensor> tz;
        if (zp) tz = lab().upload(*zp);
        const Host got = lab().run(ops::quantize(lab().upload(x), lab().upload(scale), tz, y, axis), y);
        expect_exact("quantize " + std::string(to_string(xt)) + " -> " + to_string(yt) + " variant " +
                         std::to_string(variant),
                     got, want);
      }
}

TEST_P(Ops, DequantizePerTensorAndPerAxis) {
  const Shape shape{4, 3, 5};
  for (DType xt : {DType::U8, DType::I8, DType::I32})
    for (DType yt : {DType::F32, DType::F16, DType::BF16})
      for (int variant = 0; variant < 4; ++variant) {
        const std::int64_t axis = variant == 3 ? -1 : variant == 2 ? 0 : 1;
        const std::size_t ax = static_cast<std::size_t>(axis < 0 ? axis + 3 : axis);
        const bool per_axis = variant >= 2;
        const std::int64_t count = per_axis ? shape[ax] : 1;
        Host scale = rand(DType::F32, per_axis ? Shape{count} : Shape{}, 1e-3, 2);
        std::optional<Host> zp;
        if (variant != 0)
          zp = xt == DType::I32 ? rand_host(rng_, xt, per_axis ? Shape{count} : Shape{1}, -1e6, 1e6)
                                : rand_int(rng_, xt, per_axis ? Shape{count} : Shape{1});
        const Host x = xt == DType::I32 ? with_specials(rng_, rand_host(rng_, xt, shape, -1e8, 1e8), xt)
                                        : rand_int(rng_, xt, shape);
        std::vector<double> want;
        for_each_index(shape, [&](const Shape& idx, std::int64_t lin) {
          const std::size_t p = per_axis ? static_cast<std::size_t>(idx[ax]) : 0;
          const double d = x.v[static_cast<std::size_t>(lin)] - (zp ? zp->v[p] : 0.0);  // exact: |d| < 2^53
          want.push_back(round_to(yt, f32(f32(d) * scale.v[p])));  // (x - zp) * scale in f32
        });
        const Tensor y = lab().output(yt, shape);
        std::optional<Tensor> tz;
        if (zp) tz = lab().upload(*zp);
        const Host got = lab().run(ops::dequantize(lab().upload(x), lab().upload(scale), tz, y, axis), y);
        expect_exact("dequantize " + std::string(to_string(xt)) + " -> " + to_string(yt) + " variant " +
                         std::to_string(variant),
                     got, want);
      }
}

// ---- integer matrix products ------------------------------------------------------------------------

// acc[.., i, j] = sum_k (a - az[i]) (b - bz[j]), wrapped to int32; az, bz
// empty (none), one value or one per row / column.
std::vector<std::int64_t> ref_matmul_int(const Host& a, const Host& b, const std::vector<double>& az,
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
      acc += (static_cast<std::int64_t>(mat_at(a, bidx, i, kk)) - za) * (static_cast<std::int64_t>(mat_at(b, bidx, kk, j)) - zb);
    out.push_back(wrap32(acc));
  });
  return out;
}

std::vector<double> as_doubles(const std::vector<std::int64_t>& v) { return {v.begin(), v.end()}; }

TEST_P(Ops, MatMulIntegerAppliesScalarRowAndColumnZeroPoints) {
  for (DType at : {DType::U8, DType::I8})
    for (DType bt : {DType::U8, DType::I8})
      for (int variant = 0; variant < 7; ++variant) {
        // 0 none; 1 a scalar; 2 b scalar; 3 a per row; 4 b per column;
        // 5 both per row / column, batched; 6 both scalar, batched b.
        const std::int64_t m = rng_.integer(1, 17), n = rng_.integer(1, 17), k = rng_.integer(1, 40);
        const Shape as = variant == 5 ? Shape{2, m, k} : Shape{m, k};
        const Shape bs = variant == 6 ? Shape{3, k, n} : Shape{k, n};
        const Host a = rand_int(rng_, at, as), b = rand_int(rng_, bt, bs);
        std::optional<Host> az, bz;
        if (variant == 1 || variant == 6) az = rand_int(rng_, at, variant == 1 ? Shape{} : Shape{1});
        if (variant == 2 || variant == 6) bz = rand_int(rng_, bt, Shape{});
        if (variant == 3 || variant == 5) az = rand_int(rng_, at, {m});
        if (variant == 4 || variant == 5) bz = rand_int(rng_, bt, {n});
        Shape ys;
        const auto want = ref_matmul_int(a, b, az ? az->v : std::vector<double>{}, bz ? bz->v : std::vector<double>{}, ys);
        const Tensor y = lab().output(DType::I32, ys);
        std::optional<Tensor> taz, tbz;
        if (az) taz = lab().upload(*az);
        if (bz) tbz = lab().upload(*bz);
        const Host got = lab().run(ops::matmul_integer(lab().upload(a), lab().upload(b), y, taz, tbz), y);
        expect_exact("matmul_integer " + std::string(to_string(at)) + " x " + to_string(bt) + " a " + dims(as) + " b " +
                         dims(bs) + " variant " + std::to_string(variant),
                     got, as_doubles(want));
      }
}

TEST_P(Ops, MatMulIntegerAccumulatesInInt32WrappingAround) {
  // K large enough that the sums leave int32: they wrap modulo 2^32.
  struct Case {
    DType at, bt;
    double a, b;  // every element (or, when NaN, random extremes)
    std::int64_t k;
    bool zero_points;
  };
  const std::vector<Case> cases{
      {DType::U8, DType::U8, 255, 255, 70000, false},   // 4.55e9
      {DType::I8, DType::I8, -128, -128, 140000, false},
      {DType::U8, DType::I8, 255, -128, 70000, false},  // -2.28e9
      {DType::I8, DType::U8, 127, 255, 70000, false},
      // Past 2^24 but inside int32, odd: exact in int32, not in f32.
      {DType::I8, DType::I8, 127, 127, 1041, false},  // 16790289
      {DType::U8, DType::I8, 255, 127, 521, false},   // 16872585
      {DType::U8, DType::U8, 255, 255, 259, false},   // 16841475
      {DType::I8, DType::U8, -127, 255, 519, false},  // -16808715
      {DType::U8, DType::I8, kNaN, kNaN, 50000, true},
      {DType::U8, DType::U8, kNaN, kNaN, 50000, true},
  };
  for (const Case& c : cases) {
    const std::int64_t m = 3, n = 2;
    Host a(c.at, {m, c.k}), b(c.bt, {c.k, n});
    for (auto& v : a.v) v = std::isnan(c.a) ? (rng_.coin(0.9) ? static_cast<double>(hi_of(c.at)) : static_cast<double>(lo_of(c.at))) : c.a;
    for (auto& v : b.v) v = std::isnan(c.b) ? (rng_.coin(0.9) ? static_cast<double>(hi_of(c.bt)) : static_cast<double>(lo_of(c.bt))) : c.b;
    std::optional<Host> az, bz;
    if (c.zero_points) {
      az = Host(c.at, {m});
      az->v = {0, static_cast<double>(lo_of(c.at)), 1};
      bz = Host(c.bt, {});
      bz->v = {static_cast<double>(c.bt == DType::U8 ? 0 : 127)};
    }
    Shape ys;
    const auto want = ref_matmul_int(a, b, az ? az->v : std::vector<double>{}, bz ? bz->v : std::vector<double>{}, ys);
    const Tensor y = lab().output(DType::I32, ys);
    std::optional<Tensor> taz, tbz;
    if (az) taz = lab().upload(*az);
    if (bz) tbz = lab().upload(*bz);
    const Host got = lab().run(ops::matmul_integer(lab().upload(a), lab().upload(b), y, taz, tbz), y);
    expect_exact("matmul_integer " + std::string(to_string(c.at)) + " x " + to_string(c.bt) + " K " + std::to_string(c.k),
                 got, as_doubles(want));
  }
}

TEST_P(Ops, MatMulIntegerIsExactWhereSomeSumsPass2To24OrPartialSumsCancel) {
  // A few large sums among small ones (odd, so f32 cannot hold them), and
  // partial sums far past 2^24 that cancel to small totals (oneDNN alone
  // gets these wrong: the engine must slice K by the data).
  const std::int64_t m = 33, n = 40, k = 2049;
  for (int variant = 0; variant < 3; ++variant) {
    // Variant 2 is variant 0 batched, b broadcast over a's two batches.
    Host a(DType::U8, variant == 2 ? Shape{2, m, k} : Shape{m, k}), b(DType::I8, variant == 2 ? Shape{1, k, n} : Shape{k, n});
    for (auto& v : a.v) v = static_cast<double>(rng_.integer(0, 3));
    for (auto& v : b.v) v = static_cast<double>(rng_.integer(-3, 3));
    if (variant != 1) {
      // Row 5 and 17 all 255, column 7 all 127 (k odd: 255 * 127 * 2049 is
      // odd); in the second batch only row 17.
      for (std::int64_t kk = 0; kk < k; ++kk) {
        a.v[static_cast<std::size_t>(5 * k + kk)] = 255;
        a.v[static_cast<std::size_t>(17 * k + kk)] = 255;
        if (variant == 2) a.v[static_cast<std::size_t>((m + 17) * k + kk)] = 255;
        b.v[static_cast<std::size_t>(kk * n + 7)] = 127;
      }
    } else {
      // Every column climbs to 255 * 126 * 1024 (3.3e7) and comes back down.
      for (auto& v : a.v) v = 255;
      for (std::int64_t kk = 0; kk < k; ++kk)
        for (std::int64_t j = 0; j < n; ++j)
          b.v[static_cast<std::size_t>(kk * n + j)] = (kk < k / 2 ? 126 : -126) + (kk % 7 == 0 ? (j % 3) - 1 : 0);
    }
    Shape ys;
    const auto want = ref_matmul_int(a, b, {}, {}, ys);
    const Tensor y = lab().output(DType::I32, ys);
    const Host got = lab().run(ops::matmul_integer(lab().upload(a), lab().upload(b), y), y);
    expect_exact(variant == 1 ? "matmul_integer, partial sums past 2^24 that cancel"
                              : "matmul_integer, rows and a column past 2^24 " + dims(a.shape) + " x " + dims(b.shape),
                 got, as_doubles(want));
  }
}

TEST_P(Ops, ConvIntegerWithInputAndPerChannelWeightZeroPoints) {
  for (DType xt : {DType::U8, DType::I8})
    for (DType wt : {DType::U8, DType::I8})
      for (int variant = 0; variant < 5; ++variant) {
        // 0 none; 1 x only; 2 x and scalar w; 3 x and per channel w; 4 per channel w only.
        const ConvCase c = random_conv(rng_, 8);
        const Host x = rand_int(rng_, xt, c.xs), w = rand_int(rng_, wt, c.ws);
        std::optional<Host> xz, wz;
        if (variant >= 1 && variant <= 3) xz = rand_int(rng_, xt, rng_.coin() ? Shape{} : Shape{1});
        if (variant == 2) wz = rand_int(rng_, wt, {});
        if (variant >= 3) wz = rand_int(rng_, wt, {c.ws[0]});
        const Shape ys = conv_out_shape(x, c.ws, c.g);
        std::vector<std::int64_t> wzv;
        if (wz)
          for (double v : wz->v) wzv.push_back(static_cast<std::int64_t>(v));
        const auto want = ref_conv_int(x, w, c.g, xz ? static_cast<std::int64_t>(xz->v[0]) : 0, wzv, ys);
        std::optional<Tensor> txz, twz;
        if (xz) txz = lab().upload(*xz);
        if (wz) twz = lab().upload(*wz);
        const Tensor y = lab().output(DType::I32, ys);
        const Host got = lab().run(ops::conv_integer(lab().upload(x), lab().upload(w), y, txz, twz, c.g.options()), y);
        expect_exact("conv_integer " + std::string(to_string(xt)) + " x " + dims(c.xs) + " " + to_string(wt) + " w " +
                         dims(c.ws) + " " + c.g.text() + " variant " + std::to_string(variant),
                     got, as_doubles(want));
      }
}

TEST_P(Ops, ConvIntegerAccumulatesExactlyInInt32) {
  // Sums past 2^24 (exact in int32, not in f32) and past 2^31 (wrapping).
  struct Case {
    DType xt, wt;
    double x, w;
    std::int64_t c;
    bool x_zero_point;
  };
  const std::vector<Case> cases{
      {DType::I8, DType::I8, 127, 127, 1041, false},   // 16790289
      {DType::U8, DType::I8, 255, 127, 521, false},    // 16872585
      {DType::I8, DType::I8, 127, 127, 1041, true},    // with a zero point of 0 given
      {DType::U8, DType::U8, 255, 255, 35000, false},  // 2.28e9: wraps
      {DType::I8, DType::I8, -128, -128, 140000, false},
  };
  for (const Case& c : cases)
    for (Layout layout : {Layout::NCHW, Layout::NHWC}) {
      Host x(c.xt, img_shape(layout, 1, c.c, 1, 2)), w(c.wt, {2, c.c, 1, 1});
      std::fill(x.v.begin(), x.v.end(), c.x);
      std::fill(w.v.begin(), w.v.end(), c.w);
      ConvGeom g;
      g.layout = layout;
      std::optional<Host> xz;
      if (c.x_zero_point) xz = Host(c.xt, {});
      const Shape ys = conv_out_shape(x, w.shape, g);
      const auto want = ref_conv_int(x, w, g, 0, {}, ys);
      std::optional<Tensor> txz;
      if (xz) txz = lab().upload(*xz);
      const Tensor y = lab().output(DType::I32, ys);
      const Host got = lab().run(ops::conv_integer(lab().upload(x), lab().upload(w), y, txz, std::nullopt, g.options()), y);
      expect_exact("conv_integer " + std::string(to_string(c.xt)) + " " + num(c.x) + " x " + to_string(c.wt) + " " +
                       num(c.w) + " over " + std::to_string(c.c) + " channels " + g.text(),
                   got, as_doubles(want));
    }
}

TEST_P(Ops, GroupedIntegerConvolutionsOneDnnsGemmPathCompensatesWrongly) {
  // Grouped geometries where oneDNN 2.6's GEMM convolution, given an s8
  // input or an input zero point, offset every sum of a channel by a
  // constant. The engine must not hand them to it that way: plain sums,
  // with an input zero point, and requantised (the fused path).
  struct Case {
    std::int64_t groups, og, cg, kh, kw;
  };
  const Case cases[] = {{2, 4, 1, 2, 4}, {2, 4, 1, 4, 2}, {2, 4, 1, 8, 1}, {4, 2, 1, 4, 2},
                        {4, 2, 1, 2, 4}, {4, 2, 1, 8, 1}, {3, 7, 2, 8, 4}, {5, 5, 2, 8, 4}};
  for (const Case& k : cases)
    for (DType xt : {DType::I8, DType::U8})
      for (bool zero_point : {false, true}) {
        ConvGeom g;
        g.layout = Layout::NHWC;
        g.groups = static_cast<std::uint32_t>(k.groups);
        g.pads = {1, 1, 1, 1};
        const Host x = rand_int(rng_, xt, img_shape(g.layout, 1, k.groups * k.cg, 12, 9));
        const Host w = rand_int(rng_, DType::I8, {k.groups * k.og, k.cg, k.kh, k.kw});
        const std::int64_t zero = zero_point ? (xt == DType::I8 ? 3 : 131) : 0;
        Host xz(xt, {});
        xz.v = {static_cast<double>(zero)};
        const Shape ys = conv_out_shape(x, w.shape, g);
        const auto acc = ref_conv_int(x, w, g, zero, {}, ys);
        const std::string what = std::string(to_string(xt)) + " x " + dims(x.shape) + " i8 w " + dims(w.shape) + " " +
                                 g.text() + (zero_point ? " x zero point " + std::to_string(zero) : "");
        const Tensor y = lab().output(DType::I32, ys);
        expect_exact("conv_integer " + what,
                     lab().run(ops::conv_integer(lab().upload(x), lab().upload(w), y, lab().upload(xz), std::nullopt,
                                                 g.options()),
                               y),
                     as_doubles(acc));
        // Requantised by a power of two: the fused path's candidate.
        Host xs(DType::F32, {}), ws(DType::F32, {}), ysc(DType::F32, {}), yz(xt, {});
        xs.v = {0.5};
        ws.v = {0.25};
        ysc.v = {4.0};
        std::vector<double> want(acc.size());
        for (std::size_t i = 0; i < acc.size(); ++i) want[i] = requantize(acc[i], 0.5, 0.25, 4.0, 0, xt);
        const Tensor yq = lab().output(xt, ys);
        expect_exact("qlinear_conv " + what,
                     lab().run(ops::qlinear_conv(lab().upload(x), lab().upload(xs), lab().upload(xz), lab().upload(w),
                                                 lab().upload(ws), lab().upload(Host(DType::I8, {})), lab().upload(ysc),
                                                 lab().upload(yz), yq, g.options()),
                               yq),
                     want);
      }
}

TEST_P(Ops, QLinearMatMulRequantisesWithTiesToEvenAndSaturation) {
  for (DType at : {DType::U8, DType::I8})
    for (DType bt : {DType::U8, DType::I8})
      for (DType yt : {DType::U8, DType::I8})
        for (int variant = 0; variant < 5; ++variant) {
          // 0 scalars; 1 a per row; 2 b per column; 3 both (every element its
          // own multiplier); 4 power-of-two multipliers (exact ties) and saturation.
          const std::int64_t m = rng_.integer(1, 12), n = rng_.integer(1, 12), k = rng_.integer(1, 24);
          const Host a = rand_int(rng_, at, {m, k}), b = rand_int(rng_, bt, {k, n});
          const bool row = variant == 1 || variant == 3, col = variant == 2 || variant == 3;
          Host as = rand(DType::F32, row ? Shape{m} : Shape{}, 1e-3, 0.05);
          Host bs = rand(DType::F32, col ? Shape{n} : Shape{1}, 1e-3, 0.05);
          Host ysc = rand(DType::F32, {}, 0.02, 0.5);
          if (variant == 4) {
            as.v = {std::ldexp(1.0, static_cast<int>(rng_.integer(-4, 0)))};
            bs.v = {std::ldexp(1.0, static_cast<int>(rng_.integer(-3, 3)))};
            ysc.v = {std::ldexp(1.0, static_cast<int>(rng_.integer(-2, 2)))};
          }
          Host az = rand_int(rng_, at, row ? Shape{m} : Shape{}), bz = rand_int(rng_, bt, col ? Shape{n} : Shape{});
          Host yz = rand_int(rng_, yt, {});
          Shape ys;
          const auto acc = ref_matmul_int(a, b, az.v, bz.v, ys);
          std::vector<double> want;
          for (std::size_t i = 0; i < acc.size(); ++i) {
            const std::size_t r = static_cast<std::size_t>(static_cast<std::int64_t>(i) / n), cc = i % static_cast<std::size_t>(n);
            want.push_back(requantize(acc[i], as.v[row ? r : 0], bs.v[col ? cc : 0], ysc.v[0],
                                      static_cast<std::int64_t>(yz.v[0]), yt));
          }
          const Tensor y = lab().output(yt, ys);
          const Host got = lab().run(ops::qlinear_matmul(lab().upload(a), lab().upload(as), lab().upload(az), lab().upload(b),
                                                         lab().upload(bs), lab().upload(bz), lab().upload(ysc),
                                                         lab().upload(yz), y),
                                     y);
          expect_exact("qlinear_matmul " + std::string(to_string(at)) + " x " + to_string(bt) + " -> " + to_string(yt) +
                           " " + dims(ys) + " variant " + std::to_string(variant),
                       got, want);
        }
}

TEST_P(Ops, QLinearConvRequantisesWithBiasTiesAndSaturation) {
  for (DType xt : {DType::U8, DType::I8})
    for (DType wt : {DType::U8, DType::I8})
      for (DType yt : {DType::U8, DType::I8})
        for (int variant = 0; variant < 4; ++variant) {
          // 0 scalar scales; 1 per channel w scale and zero point, bias;
          // 2 power-of-two multipliers (ties), bias; 3 large multipliers (saturation).
          const ConvCase c = random_conv(rng_, 8);
          const Host x = rand_int(rng_, xt, c.xs), w = rand_int(rng_, wt, c.ws);
          const std::int64_t o = c.ws[0];
          const bool per_channel = variant == 1;
          Host xs = rand(DType::F32, {}, 1e-3, 0.05), ws = rand(DType::F32, per_channel ? Shape{o} : Shape{}, 1e-3, 0.05);
          Host ysc = rand(DType::F32, {1}, 0.05, 1);
          if (variant == 2) {
            xs.v = {0.5};
            ws.v = {std::ldexp(1.0, static_cast<int>(rng_.integer(-3, 0)))};
            ysc.v = {std::ldexp(1.0, static_cast<int>(rng_.integer(0, 3)))};
          } else if (variant == 3) {
            xs.v = {2};
            ws.v = {3};
            ysc.v = {0.5};
          }
          const Host xz = rand_int(rng_, xt, {}), wz = rand_int(rng_, wt, per_channel ? Shape{o} : Shape{});
          const Host yz = rand_int(rng_, yt, {});
          std::optional<Host> bias;
          if (variant == 1 || variant == 2) bias = rand_host(rng_, DType::I32, {o}, -5000, 5000);
          const Shape ys = conv_out_shape(x, c.ws, c.g);
          std::vector<std::int64_t> wzv;
          for (double v : wz.v) wzv.push_back(static_cast<std::int64_t>(v));
          const auto acc = ref_conv_int(x, w, c.g, static_cast<std::int64_t>(xz.v[0]), wzv, ys);
          std::vector<double> want(acc.size());
          for_each_output(ys, c.g.layout, [&](std::int64_t, std::int64_t oc, std::int64_t, std::int64_t, std::int64_t lin) {
            const auto ol = static_cast<std::size_t>(oc);
            const std::int64_t sum = wrap32(acc[static_cast<std::size_t>(lin)] + (bias ? static_cast<std::int64_t>(bias->v[ol]) : 0));
            want[static_cast<std::size_t>(lin)] =
                requantize(sum, xs.v[0], ws.v[per_channel ? ol : 0], ysc.v[0], static_cast<std::int64_t>(yz.v[0]), yt);
          });
          Conv2dOptions opt = c.g.options();
          if (bias) opt.bias = lab().upload(*bias);
          const Tensor y = lab().output(yt, ys);
          const Host got = lab().run(ops::qlinear_conv(lab().upload(x), lab().upload(xs), lab().upload(xz), lab().upload(w),
                                                       lab().upload(ws), lab().upload(wz), lab().upload(ysc),
                                                       lab().upload(yz), y, opt),
                                     y);
          expect_exact("qlinear_conv " + std::string(to_string(xt)) + " x " + dims(c.xs) + " " + to_string(wt) + " w " +
                           dims(c.ws) + " -> " + to_string(yt) + " " + c.g.text() + " variant " + std::to_string(variant),
                       got, want);
        }
}

TEST_P(Ops, QLinearConvWithS8WeightsNoWeightZeroPointAndNoBiasRoundsTheSame) {
  // The case the engine hands to oneDNN with the requantisation fused:
  // it must give the same bytes as everywhere else, ties and saturation
  // included (including 64 input channels of 3x3 taps, where the sums can
  // pass 2^24 only by the worst case).
  for (DType xt : {DType::U8, DType::I8})
    for (DType yt : {DType::U8, DType::I8})
      for (int variant = 0; variant < 4; ++variant) {
        // 0 per channel scales; 1 power-of-two multipliers (exact ties);
        // 2 large multipliers (saturation); 3 a wide layer, per channel.
        ConvCase c = random_conv(rng_, 8);
        if (variant == 3) {
          c.g = ConvGeom{};
          c.g.layout = rng_.coin() ? Layout::NHWC : Layout::NCHW;
          c.g.pads = {1, 1, 1, 1};
          c.xs = img_shape(c.g.layout, 1, 64, 9, 7);
          c.ws = {16, 64, 3, 3};
        }
        const Host x = rand_int(rng_, xt, c.xs), w = rand_int(rng_, DType::I8, c.ws);
        const std::int64_t o = c.ws[0];
        const bool per_channel = variant == 0 || variant == 3;
        Host xs = rand(DType::F32, {}, 1e-3, 0.05), ws = rand(DType::F32, per_channel ? Shape{o} : Shape{}, 1e-3, 0.05);
        Host ysc = rand(DType::F32, {1}, 0.05, 1);
        if (variant == 1) {
          xs.v = {0.5};
          ws.v = {std::ldexp(1.0, static_cast<int>(rng_.integer(-3, 0)))};
          ysc.v = {std::ldexp(1.0, static_cast<int>(rng_.integer(0, 3)))};
        } else if (variant == 2) {
          xs.v = {2};
          ws.v = {3};
          ysc.v = {0.5};
        }
        const Host xz = rand_int(rng_, xt, {});
        Host wz(DType::I8, per_channel ? Shape{o} : Shape{});  // zeros
        const Host yz = rand_int(rng_, yt, {});
        const Shape ys = conv_out_shape(x, c.ws, c.g);
        const auto acc = ref_conv_int(x, w, c.g, static_cast<std::int64_t>(xz.v[0]), {}, ys);
        std::vector<double> want(acc.size());
        for_each_output(ys, c.g.layout, [&](std::int64_t, std::int64_t oc, std::int64_t, std::int64_t, std::int64_t lin) {
          want[static_cast<std::size_t>(lin)] =
              requantize(wrap32(acc[static_cast<std::size_t>(lin)]), xs.v[0], ws.v[per_channel ? static_cast<std::size_t>(oc) : 0],
                         ysc.v[0], static_cast<std::int64_t>(yz.v[0]), yt);
        });
        const Tensor y = lab().output(yt, ys);
        const Host got = lab().run(ops::qlinear_conv(lab().upload(x), lab().upload(xs), lab().upload(xz), lab().upload(w),
                                                     lab().upload(ws), lab().upload(wz), lab().upload(ysc),
                                                     lab().upload(yz), y, c.g.options()),
                                   y);
        expect_exact("qlinear_conv " + std::string(to_string(xt)) + " x " + dims(c.xs) + " s8 w " + dims(c.ws) + " -> " +
                         to_string(yt) + " " + c.g.text() + " variant " + std::to_string(variant),
                     got, want);
      }
}

// ---- resize -----------------------------------------------------------------------------------------------

// ONNX Resize's coordinate transformation; the resized length is in * scale, unrounded.
double source_coordinate(CoordinateMode m, double o, double scale, std::int64_t in) {
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
std::int64_t nearest_index(NearestMode m, double x) {
  const double fl = std::floor(x);
  switch (m) {
    case NearestMode::RoundPreferFloor: return static_cast<std::int64_t>(x - fl == 0.5 ? fl : std::round(x));
    case NearestMode::RoundPreferCeil: return static_cast<std::int64_t>(x - fl == 0.5 ? std::ceil(x) : std::round(x));
    case NearestMode::Floor: return static_cast<std::int64_t>(fl);
    case NearestMode::Ceil: return static_cast<std::int64_t>(std::ceil(x));
  }
  return 0;
}
std::int64_t clamp_index(std::int64_t i, std::int64_t len) { return std::clamp<std::int64_t>(i, 0, len - 1); }
// The source indices nearest mode may pick for coordinate x. The engine
// computes x in f32 (a few ULPs off); where x lies within 1e-5 of a decision
// boundary the neighbour is accepted too, unless `strict` (the test chose
// scales that make f32 exact).
std::vector<std::int64_t> nearest_candidates(NearestMode m, double x, std::int64_t len, bool strict) {
  std::vector<std::int64_t> out{clamp_index(nearest_index(m, x), len)};
  if (!strict) {
    const double eps = 1e-5 * (1 + std::fabs(x));
    out.push_back(clamp_index(nearest_index(m, x - eps), len));
    out.push_back(clamp_index(nearest_index(m, x + eps), len));
  }
  return out;
}
const char* coord_name(CoordinateMode m) {
  static const char* const names[] = {"half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel", "tf_half_pixel_for_nn"};
  return names[static_cast<int>(m)];
}
const char* nearest_name(NearestMode m) {
  static const char* const names[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
  return names[static_cast<int>(m)];
}

class ResizeCheck {
 public:
  ResizeCheck(Lab& lab, std::uint64_t seed) : lab_(lab), seed_(seed) {}
  // Resizes x to y's H x W with `o` and checks every output element.
  void run(const std::string& what, const Host& x, std::int64_t oh, std::int64_t ow, const ResizeOptions& o, bool strict) {
    const Img d = img_dims(x, o.layout);
    const Shape ys = img_shape(o.layout, d.n, d.c, oh, ow);
    const Tensor y = lab_.output(x.dtype, ys);
    const Host got = lab_.run(ops::resize(lab_.upload(x), y, o), y);
    const std::array<double, 2> sc =
        o.scales ? std::array<double, 2>{(*o.scales)[0], (*o.scales)[1]}
                 : std::array<double, 2>{f32(static_cast<double>(static_cast<float>(oh) / static_cast<float>(d.h))),
                                         f32(static_cast<double>(static_cast<float>(ow) / static_cast<float>(d.w)))};
    Report rep(what + " " + (o.mode == ResizeMode::Nearest ? "nearest " + std::string(nearest_name(o.nearest)) : "linear") +
                   " " + coord_name(o.coordinate) + " " + to_string(x.dtype) + " " + dims(x.shape) + " -> " + dims(ys) +
                   (o.layout == Layout::NHWC ? " NHWC" : ""),
               ys);
    for_each_output(ys, o.layout, [&](std::int64_t n, std::int64_t c, std::int64_t r, std::int64_t col, std::int64_t lin) {
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
      const auto y0 = clamp_index(static_cast<std::int64_t>(fy), d.h), y1 = clamp_index(static_cast<std::int64_t>(fy) + 1, d.h);
      const auto x0 = clamp_index(static_cast<std::int64_t>(fx), d.w), x1 = clamp_index(static_cast<std::int64_t>(fx) + 1, d.w);
      auto px = [&](std::int64_t yy, std::int64_t xx) { return img_at(x, o.layout, n, c, yy, xx); };
      const double want = (px(y0, x0) * (1 - wx) + px(y0, x1) * wx) * (1 - wy) + (px(y1, x0) * (1 - wx) + px(y1, x1) * wx) * wy;
      const double maxabs = std::max({std::fabs(px(y0, x0)), std::fabs(px(y0, x1)), std::fabs(px(y1, x0)), std::fabs(px(y1, x1))});
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

const std::vector<CoordinateMode> kCoordinateModes{CoordinateMode::HalfPixel, CoordinateMode::Asymmetric,
                                                   CoordinateMode::AlignCorners, CoordinateMode::PytorchHalfPixel,
                                                   CoordinateMode::TfHalfPixelForNn};
const std::vector<NearestMode> kNearestModes{NearestMode::RoundPreferFloor, NearestMode::RoundPreferCeil,
                                             NearestMode::Floor, NearestMode::Ceil};

TEST_P(Ops, ResizeNearestEveryNearestAndCoordinateMode) {
  ResizeCheck check(lab(), seed_);
  struct Size {
    std::int64_t h, w, oh, ow;
  };
  const std::vector<Size> sizes{{3, 5, 7, 11}, {8, 9, 3, 4}, {4, 4, 2, 8}, {5, 3, 5, 6}};
  for (DType dt : {DType::F32, DType::U8})
    for (NearestMode nm : kNearestModes)
      for (CoordinateMode cm : kCoordinateModes)
        for (const Size& s : sizes) {
          ResizeOptions o;
          o.mode = ResizeMode::Nearest;
          o.nearest = nm;
          o.coordinate = cm;
          o.layout = rng_.coin() ? Layout::NCHW : Layout::NHWC;
          const Host x = is_float(dt) ? rand(dt, img_shape(o.layout, 1, 2, s.h, s.w), -50, 50)
                                      : rand_int(rng_, dt, img_shape(o.layout, 1, 2, s.h, s.w));
          check.run("resize", x, s.oh, s.ow, o, false);
        }
}

TEST_P(Ops, ResizeNearestBreaksExactTiesByItsMode) {
  // Scales that are powers of two keep every coordinate exact in f32, so
  // the ties (x.5) are real and the mode alone decides them.
  ResizeCheck check(lab(), seed_);
  for (NearestMode nm : kNearestModes)
    for (CoordinateMode cm : {CoordinateMode::HalfPixel, CoordinateMode::Asymmetric, CoordinateMode::TfHalfPixelForNn,
                              CoordinateMode::PytorchHalfPixel}) {
      ResizeOptions o;
      o.nearest = nm;
      o.coordinate = cm;
      const Host x = rand(DType::F32, {1, 1, 8, 4}, -50, 50);
      check.run("tie", x, 4, 8, o, true);    // 0.5x rows, 2x columns
      check.run("tie", x, 2, 16, o, true);   // 0.25x, 4x
      check.run("tie", x, 16, 1, o, true);   // 2x, 0.25x
    }
}

TEST_P(Ops, ResizeLinearEveryCoordinateMode) {
  ResizeCheck check(lab(), seed_);
  struct Size {
    std::int64_t h, w, oh, ow;
  };
  const std::vector<Size> sizes{{3, 5, 7, 11}, {8, 9, 3, 4}, {4, 4, 8, 2}, {6, 1, 3, 3}};
  for (DType dt : {DType::F32, DType::F16, DType::U8, DType::I8})
    for (CoordinateMode cm : kCoordinateModes)
      for (const Size& s : sizes) {
        ResizeOptions o;
        o.mode = ResizeMode::Linear;
        o.coordinate = cm;
        o.layout = rng_.coin() ? Layout::NCHW : Layout::NHWC;
        const Host x = is_float(dt) ? rand(dt, img_shape(o.layout, 2, 3, s.h, s.w), -20, 20)
                                    : rand_int(rng_, dt, img_shape(o.layout, 2, 3, s.h, s.w));
        check.run("resize", x, s.oh, s.ow, o, false);
      }
  // Explicit scales (the output is floor(in * scale)).
  for (CoordinateMode cm : kCoordinateModes)
    for (ResizeMode mode : {ResizeMode::Linear, ResizeMode::Nearest}) {
      ResizeOptions o;
      o.mode = mode;
      o.coordinate = cm;
      o.scales = std::array<float, 2>{1.7f, 0.6f};
      const Host x = rand(DType::F32, {1, 2, 4, 10}, -20, 20);
      check.run("explicit scales", x, 6, 6, o, false);
    }
}

// ---- colour conversion ---------------------------------------------------------------------------------------

TEST_P(Ops, Nv12AndI420ToRgbBt601LimitedRange) {
  for (ColorFormat fmt : {ColorFormat::NV12, ColorFormat::I420})
    for (DType yt : {DType::F32, DType::U8, DType::F16, DType::BF16})
      for (bool normalise : {false, true}) {
        const std::int64_t h = 2 * rng_.integer(1, 6), w = 2 * rng_.integer(1, 8);
        const Host luma = rand_int(rng_, DType::U8, {h, w});
        const Host u = rand_int(rng_, DType::U8, {h / 2, w / 2}), v = rand_int(rng_, DType::U8, {h / 2, w / 2});
        ColorConvertOptions o;
        if (normalise) {
          o.mean = {123.675f, 116.28f, 103.53f};
          o.scale = {1 / 58.395f, 1 / 57.12f, 1 / 57.375f};
          if (yt == DType::U8) o.scale = {0.5f, 0.25f, 2.0f};
        }
        const Tensor y = lab().output(yt, {3, h, w});
        Host got;
        if (fmt == ColorFormat::NV12) {
          Host uv(DType::U8, {h / 2, w / 2, 2});
          for (std::size_t i = 0; i < u.size(); ++i) {
            uv.v[2 * i] = u.v[i];
            uv.v[2 * i + 1] = v.v[i];
          }
          got = lab().run(ops::nv12_to_rgb(lab().upload(luma), lab().upload(uv), y, o), y);
        } else {
          got = lab().run(ops::i420_to_rgb(lab().upload(luma), lab().upload(u), lab().upload(v), y, o), y);
        }
        Ref want;
        want.v.resize(got.size());
        want.tol.resize(got.size());
        for (std::int64_t r = 0; r < h; ++r)
          for (std::int64_t c = 0; c < w; ++c) {
            const double Y = luma.v[static_cast<std::size_t>(r * w + c)];
            const double U = u.v[static_cast<std::size_t>((r / 2) * (w / 2) + c / 2)] - 128;
            const double V = v.v[static_cast<std::size_t>((r / 2) * (w / 2) + c / 2)] - 128;
            const double yy = 1.164 * (Y - 16);
            const double rgb[3] = {yy + 1.596 * V, yy - 0.813 * V - 0.391 * U, yy + 2.018 * U};
            for (std::int64_t k = 0; k < 3; ++k) {
              const double val = std::clamp(rgb[k], 0.0, 255.0);
              const double mean = o.mean[static_cast<std::size_t>(k)], sc = o.scale[static_cast<std::size_t>(k)];
              const double out = (val - mean) * sc;
              // f32 evaluation of terms up to ~600: a few roundings of
              // 2^-24 * 1024 each, and the coefficients as f32 (<= 6e-8
              // relative): 2e-4 in all; then one subtraction and one product.
              const double tol = (2e-4 + 2 * kU * (val + std::fabs(mean))) * std::fabs(sc) + 2 * kU * std::fabs(out);
              const auto at = static_cast<std::size_t>((k * h + r) * w + c);
              want.v[at] = out;
              want.tol[at] = tol + (is_float(yt) && yt != DType::F32 ? ulp(yt, out) : 0.0);
            }
          }
        const std::string what = std::string(fmt == ColorFormat::NV12 ? "nv12_to_rgb " : "i420_to_rgb ") + to_string(yt) +
                                 " " + std::to_string(h) + "x" + std::to_string(w) + (normalise ? " normalised" : "");
        if (is_float(yt)) expect(what, got, want);
        else expect_rounded(what, got, want);
      }
}

// ---- programs --------------------------------------------------------------------------------------------------

TEST_P(Ops, ProgramsReplayLikeDirectRunsAndKeepTheirBuffersAlive) {
  const Shape xs{1, 2, 6, 6}, ws{3, 2, 3, 3}, cs{1, 3, 6, 6}, bs{6, 5}, ms{18, 5};
  const std::uint64_t x_bytes = 72 * 4, out_bytes = 90 * 4;
  const Host w = rand(DType::F32, ws, -0.5, 0.5), bias = rand(DType::F32, {3}, -0.5, 0.5), bm = rand(DType::F32, bs);
  struct Pipeline {
    Buffer in, out;  // host memory: the input written and the output read between replays
    Tensor x, w, bias, conv, relu, b, mm, sm;
  };
  auto make = [&] {
    Pipeline p;
    p.in = dev().allocate(x_bytes, Memory::HostPinned);
    p.out = dev().allocate(out_bytes, Memory::HostPinned);
    p.x = Tensor(dev().allocate(x_bytes), DType::F32, xs);
    p.w = lab().upload(w);
    p.bias = lab().upload(bias);
    p.b = lab().upload(bm);
    p.conv = lab().output(DType::F32, cs);
    p.relu = lab().output(DType::F32, cs);
    p.mm = lab().output(DType::F32, ms);
    p.sm = lab().output(DType::F32, ms);
    return p;
  };
  auto record = [&](Batch& b, const Pipeline& p) {
    b.copy(p.in, 0, p.x.buffer(), 0, x_bytes);
    Conv2dOptions o;
    o.pads = {1, 1, 1, 1};
    o.bias = p.bias;
    b.run(ops::conv2d(p.x, p.w, p.conv, o));
    b.run(ops::relu(p.conv, p.relu));
    b.run(ops::matmul(p.relu.reshape({18, 6}), p.b, p.mm));
    b.run(ops::softmax(p.mm, p.sm, -1));
    b.copy(p.sm.buffer(), 0, p.out, 0, out_bytes);
  };
  Buffer prog_in, prog_out;
  Program program;
  const std::uint64_t used_before = dev().memory_stats().device_used;
  {
    Pipeline p = make();
    prog_in = p.in;
    prog_out = p.out;
    program = dev().record([&](Batch& b) { record(b, p); });
  }  // every other handle to the program's buffers goes here
  ASSERT_EQ(program.size(), 6u);
  EXPECT_GE(dev().memory_stats().device_used, used_before + 8 * 64) << "the program's buffers were freed";
  // Were its buffers freed, these would get their memory and scribble on it.
  std::vector<Buffer> scribble;
  for (int i = 0; i < 8; ++i) {
    scribble.push_back(dev().allocate(4096));
    lab().q.fill(scribble.back(), 0, 4096, 0x7F).submit().wait();
  }
  Pipeline direct = make();
  std::vector<std::byte> previous;
  for (int rep = 0; rep < 4; ++rep) {
    const Host x = rand(DType::F32, xs, -2, 2);
    for (std::size_t i = 0; i < x.size(); ++i) {
      store(DType::F32, x.v[i], prog_in.map().data() + 4 * i);
      store(DType::F32, x.v[i], direct.in.map().data() + 4 * i);
    }
    lab().q.run(program).submit().wait();
    {
      Batch b = lab().q.batch();
      record(b, direct);
      b.submit().wait();
    }
    const auto pm = prog_out.map(), dm = direct.out.map();
    EXPECT_EQ(std::memcmp(pm.data(), dm.data(), out_bytes), 0) << "replay " << rep << " differs from the direct run";
    const std::vector<std::byte> now(pm.begin(), pm.begin() + static_cast<std::ptrdiff_t>(out_bytes));
    EXPECT_NE(now, previous) << "replay " << rep << " did not see its new input";
    previous = now;
    // And the chain is right: conv -> relu -> matmul -> softmax in double.
    // Each stage's f32 error stays below 2e-4 here (|conv| <= 10 from 18
    // products of magnitude <= 1, then 6 more products), so softmax
    // outputs (in [0, 1], Lipschitz 1 in the logits) are within 1e-3.
    Host got(DType::F32, ms);
    for (std::size_t i = 0; i < got.size(); ++i) got.v[i] = load(DType::F32, pm.data() + 4 * i);
    ConvGeom g;
    g.pads = {1, 1, 1, 1};
    const Ref conv = ref_conv(x, w, bias, g, ActivationParams::relu(), DType::F32, cs);
    Host relu(DType::F32, {18, 6});
    relu.v = conv.v;
    Shape mys;
    const Ref logits = ref_matmul(relu, bm, MatMulSpec{}, mys);
    Host lg(DType::F32, ms);
    lg.v = logits.v;
    Ref want = ref_softmax(lg, -1, false, DType::F32);
    std::fill(want.tol.begin(), want.tol.end(), 1e-3);
    expect("program replay " + std::to_string(rep) + " against the reference", got, want);
  }
}

TEST_P(Ops, ProgramsRefuseFenceWaitsAndNonComputeQueues) {
  Buffer buf = dev().allocate(4096);
  const Fence f = lab().q.fill(buf, 0, 4096, 1).submit();
  Error e = error_of([&] { dev().record([&](Batch& b) { b.fill(buf, 0, 64, 2).wait(f); }); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("a program cannot wait on a fence"));
  f.wait();

  const Host x = rand(DType::F32, {4, 8}, -1, 1);
  const Tensor tx = lab().upload(x), ty = lab().output(DType::F32, {4, 8});
  const Program p = dev().record([&](Batch& b) { b.run(ops::relu(tx, ty)); });
  Queue copy_q;
  try {
    copy_q = dev().queue(Engine::Copy);
  } catch (const Error& err) {
    GTEST_SKIP() << GetParam() << " has no free copy queue: " << err.what();
  }
  e = error_of([&] { copy_q.run(p); });
  EXPECT_EQ(e.status(), Status::Unsupported);
  EXPECT_THAT(e.what(), HasSubstr("programs need a compute queue"));
  e = error_of([&] { copy_q.run(ops::relu(tx, ty)); });
  EXPECT_EQ(e.status(), Status::Unsupported);
  EXPECT_THAT(e.what(), HasSubstr("activation needs a compute queue"));
  // Where it may, the program runs.
  lab().q.run(p).submit().wait();
  std::vector<double> want;
  for (double v : x.v) want.push_back(v > 0 ? v : 0.0);
  expect_exact("relu program", lab().download(ty), want);
}

// ---- the host's operand checks -------------------------------------------------------------------------------

TEST_P(Ops, HostChecksNameTheOperandAndTheShape) {
  auto t = [&](DType d, Shape s) { return lab().output(d, s); };
  struct Case {
    std::function<void()> f;
    Status status;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases{
      {[&] { ops::matmul(t(DType::F32, {2, 3}), t(DType::F32, {4, 5}), t(DType::F32, {2, 5})); },
       Status::InvalidArgument, {"matmul: a [2, 3] and b [4, 5] disagree on the inner dimension (3 vs 4)"}},
      {[&] { ops::matmul(t(DType::F32, {2, 3}), t(DType::F32, {3, 5}), t(DType::F32, {2, 4})); },
       Status::InvalidArgument, {"matmul: y has shape [2, 4]; expected [2, 5] (from a and b)"}},
      {[&] { ops::matmul(t(DType::F32, {2, 2, 3}), t(DType::F32, {3, 3, 5}), t(DType::F32, {2, 2, 5})); },
       Status::InvalidArgument, {"matmul: a [2, 2, 3] and b [3, 3, 5] have batch dimensions that do not broadcast"}},
      {[&] {
         MatMulOptions o;
         o.c = t(DType::F32, {3});
         ops::matmul(t(DType::F32, {2, 3}), t(DType::F32, {3, 5}), t(DType::F32, {2, 5}), o);
       },
       Status::InvalidArgument, {"matmul: c has shape [3], which does not broadcast to [2, 5]"}},
      {[&] { ops::conv2d(t(DType::F32, {1, 2, 6, 6}), t(DType::F32, {4, 2, 3, 3}), t(DType::F32, {1, 4, 6, 6})); },
       Status::InvalidArgument,
       {"conv2d: y has shape [1, 4, 6, 6]; expected [1, 4, 4, 4] (from x [1, 2, 6, 6], w [4, 2, 3, 3]"}},
      {[&] {
         Conv2dOptions o;
         o.groups = 3;
         ops::conv2d(t(DType::F32, {1, 2, 6, 6}), t(DType::F32, {4, 2, 3, 3}), t(DType::F32, {1, 4, 4, 4}), o);
       },
       Status::InvalidArgument, {"conv2d: groups 3 must divide the input channels (2) and output channels (4)"}},
      {[&] { ops::conv2d(t(DType::F32, {1, 2, 2, 2}), t(DType::F32, {4, 2, 3, 3}), t(DType::F32, {1, 4, 1, 1})); },
       Status::InvalidArgument, {"conv2d: a 3x3 kernel does not fit the padded 2x2 input"}},
      {[&] { ops::add(t(DType::F32, {2, 3}), t(DType::F32, {4}), t(DType::F32, {2, 3})); },
       Status::InvalidArgument, {"add: b has shape [4], which does not broadcast to [2, 3]"}},
      {[&] { ops::softmax(t(DType::F32, {2, 3}), t(DType::F32, {2, 3}), 2); },
       Status::InvalidArgument, {"softmax: axis 2 is out of range for rank 2"}},
      {[&] {
         Pool2dOptions o;
         o.kernel = {3, 3};
         o.pads = {3, 0, 0, 0};
         ops::max_pool2d(t(DType::F32, {1, 1, 6, 6}), t(DType::F32, {1, 1, 7, 4}), o);
       },
       Status::InvalidArgument, {"max_pool2d: pads (3, 0) must be smaller than the window (3)"}},
      {[&] {
         ops::matmul_integer(t(DType::U8, {2, 3}), t(DType::U8, {3, 4}), t(DType::I32, {2, 4}), t(DType::U8, {3}));
       },
       Status::InvalidArgument, {"matmul_integer: a_zero_point has shape [3]; expected a scalar or [2] (one per row)"}},
      {[&] {
         ops::qlinear_matmul(t(DType::U8, {2, 3}), t(DType::F32, {}), t(DType::U8, {}), t(DType::U8, {3, 4}),
                             t(DType::F32, {}), t(DType::U8, {}), t(DType::F32, {4}), t(DType::U8, {}), t(DType::U8, {2, 4}));
       },
       Status::InvalidArgument, {"qlinear_matmul: y_scale and y_zero_point must be scalars"}},
      {[&] {
         ops::quantize(t(DType::F32, {2, 3}), t(DType::F32, {2}), std::nullopt, t(DType::U8, {2, 3}), 1);
       },
       Status::InvalidArgument, {"quantize: scale has 2 elements; expected 1, or one per index of axis 1 of [2, 3]"}},
      {[&] { ops::activation(t(DType::F32, {4}), t(DType::F32, {4}), ActivationParams::clip(2, 1)); },
       Status::InvalidArgument, {"activation: clip minimum 2", "is above its maximum 1"}},
      {[&] { ops::transpose(t(DType::F32, {2, 3}), t(DType::F32, {2, 3}), {1, 0}); },
       Status::InvalidArgument, {"transpose: y has shape [2, 3]; expected [3, 2]"}},
      {[&] { ops::transpose(t(DType::F32, {2, 3}), t(DType::F32, {3, 2}), {1, 1}); },
       Status::InvalidArgument, {"transpose: permute: axis 1 at position 1 is out of range or repeated"}},
      {[&] {
         ResizeOptions o;
         o.scales = std::array<float, 2>{std::numeric_limits<float>::infinity(), 1.0f};
         ops::resize(t(DType::F32, {1, 1, 2, 2}), t(DType::F32, {1, 1, 4, 2}), o);
       },
       Status::InvalidArgument, {"resize: scale inf must be positive and finite"}},
      {[&] { ops::nv12_to_rgb(t(DType::U8, {3, 4}), t(DType::U8, {1, 2, 2}), t(DType::F32, {3, 3, 4})); },
       Status::InvalidArgument, {"nv12_to_rgb: luma [3, 4] must have even height and width"}},
  };
  for (const Case& c : cases) {
    const Error e = error_of(c.f);
    EXPECT_EQ(e.status(), c.status) << e.what();
    for (const auto& s : c.says) EXPECT_THAT(e.what(), HasSubstr(s));
  }
}

TEST_P(Ops, HostChecksRefuseUnsupportedDtypes) {
  auto t = [&](DType d, Shape s) { return lab().output(d, s); };
  const std::vector<std::pair<std::function<void()>, std::string>> cases{
      {[&] { ops::matmul(t(DType::I8, {2, 3}), t(DType::I8, {3, 2}), t(DType::I32, {2, 2})); },
       "matmul: a is i8; supported: f32, f16, bf16"},
      {[&] { ops::matmul(t(DType::F16, {2, 3}), t(DType::F16, {3, 2}), t(DType::BF16, {2, 2})); },
       "matmul: y is bf16; it must be f16 like a, or f32"},
      {[&] { ops::matmul(t(DType::F32, {2, 3}), t(DType::F16, {3, 2}), t(DType::F32, {2, 2})); },
       "matmul: b is f16 but a is f32"},
      {[&] { ops::conv2d(t(DType::I32, {1, 1, 3, 3}), t(DType::I32, {1, 1, 1, 1}), t(DType::I32, {1, 1, 3, 3})); },
       "conv2d: x is i32; supported: f32, f16, bf16"},
      {[&] {
         Pool2dOptions o;
         ops::avg_pool2d(t(DType::U8, {1, 1, 3, 3}), t(DType::U8, {1, 1, 3, 3}), o);
       },
       "avg_pool2d: x is u8; supported: f32, f16, bf16"},
      {[&] {
         Pool2dOptions o;
         ops::max_pool2d(t(DType::I32, {1, 1, 3, 3}), t(DType::I32, {1, 1, 3, 3}), o);
       },
       "max_pool2d: x is i32; supported: f32, f16, bf16, i8, u8"},
      {[&] { ops::softmax(t(DType::U8, {4}), t(DType::U8, {4})); }, "softmax: x is u8; supported: f32, f16, bf16"},
      {[&] { ops::exp(t(DType::I32, {4}), t(DType::I32, {4})); }, "exp: x is i32; supported: f32, f16, bf16"},
      {[&] { ops::add(t(DType::F32, {4}), t(DType::F32, {4}), t(DType::F16, {4})); }, "add: y is f16 but a is f32"},
      {[&] { ops::matmul_integer(t(DType::F32, {2, 3}), t(DType::U8, {3, 2}), t(DType::I32, {2, 2})); },
       "matmul_integer: a is f32; supported: u8, i8"},
      {[&] { ops::matmul_integer(t(DType::U8, {2, 3}), t(DType::U8, {3, 2}), t(DType::F32, {2, 2})); },
       "matmul_integer: y is f32; supported: i32"},
      {[&] { ops::quantize(t(DType::F32, {4}), t(DType::F32, {}), t(DType::I8, {}), t(DType::U8, {4})); },
       "quantize: zero_point is i8 but y is u8"},
      {[&] { ops::quantize(t(DType::F32, {4}), t(DType::F16, {}), std::nullopt, t(DType::U8, {4})); },
       "quantize: scale is f16; supported: f32"},
      {[&] { ops::dequantize(t(DType::F32, {4}), t(DType::F32, {}), std::nullopt, t(DType::F32, {4})); },
       "dequantize: x is f32; supported: u8, i8, i32"},
      {[&] { ops::resize(t(DType::I32, {1, 1, 2, 2}), t(DType::I32, {1, 1, 4, 4})); },
       "resize: x is i32; supported: f32, f16, bf16, u8, i8"},
      {[&] { ops::i420_to_rgb(t(DType::U8, {2, 2}), t(DType::U8, {1, 1}), t(DType::U8, {1, 1}), t(DType::I32, {3, 2, 2})); },
       "i420_to_rgb: y is i32; supported: f32, f16, bf16, u8"},
      {[&] {
         ops::conv_integer(t(DType::U8, {1, 1, 3, 3}), t(DType::U8, {1, 1, 1, 1}), t(DType::I32, {1, 1, 3, 3}),
                           t(DType::I8, {}), std::nullopt);
       },
       "conv_integer: x_zero_point is i8 but x is u8"},
  };
  for (const auto& [f, says] : cases) {
    const Error e = error_of(f);
    EXPECT_EQ(e.status(), Status::InvalidArgument) << e.what();
    EXPECT_THAT(e.what(), HasSubstr(says));
  }
}

TEST_P(Ops, HostChecksRefuseBadViewsOverlapsAndStrideZeroOutputs) {
  Buffer buf = dev().allocate(4096);
  // Views that do not fit their buffer.
  Error e = error_of([&] { Tensor(buf, DType::F32, {32, 33}); });
  EXPECT_EQ(e.status(), Status::OutOfRange);
  EXPECT_THAT(e.what(), HasSubstr("Tensor: f32[32, 33] at offset 0 needs 4224 bytes but the buffer has 4096"));
  e = error_of([&] { Tensor(buf, DType::F32, {1024}, 4); });
  EXPECT_EQ(e.status(), Status::OutOfRange);
  EXPECT_THAT(e.what(), HasSubstr("at offset 4 needs 4096 bytes but the buffer has 4096"));
  e = error_of([&] { Tensor(buf, DType::F32, {2, 3}, {1024, 1}, 0); });
  EXPECT_EQ(e.status(), Status::OutOfRange);
  EXPECT_THAT(e.what(), HasSubstr("needs 4108 bytes"));
  e = error_of([&] { Tensor(buf, DType::F32, {2, -3}); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("shape[1] = -3"));
  e = error_of([&] { Tensor(buf, DType::F32, {1, 1, 1, 1, 1, 1, 1}); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("rank 7 is above the limit of 6"));
  e = error_of([&] { Tensor(buf, DType::F32, {4}, 2); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("offset 2 is not a multiple of the f32 element size 4"));

  // Outputs overlapping an input: in place, partly, and through a view.
  const Tensor a(buf, DType::F32, {2, 3}), b(buf, DType::F32, {2, 3}, 1024);
  e = error_of([&] { ops::relu(a, a); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("activation: the output y overlaps input x (bytes [0, 24) and [0, 24) of the same buffer)"));
  e = error_of([&] { ops::add(a, b, Tensor(buf, DType::F32, {2, 3}, 1032)); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("add: the output y overlaps input b (bytes [1032, 1056) and [1024, 1048)"));
  e = error_of([&] {
    ops::matmul(a, Tensor(buf, DType::F32, {3, 2}, 2048), Tensor(buf, DType::F32, {2, 2}, {1, 2}, 2060));
  });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("matmul: the output y overlaps input b"));
  // Disjoint views of one buffer are fine.
  EXPECT_NO_THROW(ops::add(a, a, Tensor(buf, DType::F32, {2, 3}, 24)));

  // An output with stride 0 would write an element twice.
  e = error_of([&] { ops::add(a, a, Tensor(buf, DType::F32, {2, 3}, {0, 1}, 2048)); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("add: the output y has stride 0 in dimension 0"));
  e = error_of([&] { ops::cast(a, Tensor(buf, DType::I8, {2, 3}, {1, 0}, 2048)); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("cast: the output y has stride 0 in dimension 1"));

  // Empty tensors and freed buffers.
  e = error_of([&] { ops::relu(Tensor(), a); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("empty Tensor"));
  Buffer gone = dev().allocate(64);
  const Tensor tg(gone, DType::F32, {4});
  gone.free();
  e = error_of([&] { ops::relu(tg, Tensor(buf, DType::F32, {4})); });
  EXPECT_EQ(e.status(), Status::FailedPrecondition);
  EXPECT_THAT(e.what(), HasSubstr("activation"));
}

TEST_P(Ops, HostChecksRefuseOperandsFromAnotherDevice) {
  const std::string other_uri = GetParam() == "sim:tiny" ? "sim:0" : "sim:tiny";
  Device other = open(other_uri);
  if (!other.properties().caps.tensor) GTEST_SKIP() << other_uri << " has no tensor engine";
  const Tensor a = lab().output(DType::F32, {2, 3});
  const Tensor b(other.allocate(64), DType::F32, {2, 3});
  const Tensor y = lab().output(DType::F32, {2, 3});
  Error e = error_of([&] { ops::add(a, b, y); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("add: b is on " + other_uri + ", the other operands on " + GetParam()));
  // An op of the other device on a queue of this one.
  const Tensor ob(other.allocate(64), DType::F32, {2, 3}), oy(other.allocate(64), DType::F32, {2, 3});
  const Op foreign = ops::relu(ob, oy);
  EXPECT_EQ(foreign.device().uri(), other_uri);
  e = error_of([&] { lab().q.batch().run(foreign); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("run: activation's operands are on " + other_uri + " but the batch is for " + GetParam()));
  // And a program recorded on the other device.
  const Program prog = other.record([&](Batch& bt) { bt.run(foreign); });
  e = error_of([&] { lab().q.run(prog); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("the program was recorded for " + other_uri));
}

std::string device_name(const ::testing::TestParamInfo<std::string>& p) { return testing::param_name(p.param); }
INSTANTIATE_TEST_SUITE_P(Devices, Ops, ::testing::ValuesIn(testing::conformance_devices()), device_name);

// ---- determinism across engine thread counts ----------------------------------------------------------------

std::string read_text(const std::filesystem::path& p) {
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
std::unique_ptr<Lab> fresh_lab(const TempDir& dir, const char* var, const std::string& value) {
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
  if (saved) ::setenv(var, saved_value.c_str(), 1);
  else ::unsetenv(var);
  return lab;
}

TEST(OpsDeterminism, ResultsAreBitIdenticalWhateverTheEngineThreadCount) {
  // Two boards of the same profile: the engine reads TPUHAL_SIM_THREADS
  // once, when it starts (the first op), and uses min(that, the profile's 8
  // cores, this machine's cores) threads.
  const TempDir dir("tpuhal-ops");
  std::vector<std::unique_ptr<Lab>> labs;
  for (const char* threads : {"1", "8"}) labs.push_back(fresh_lab(dir, "TPUHAL_SIM_THREADS", threads));

  Rng rng;
  const std::uint64_t seed = test_seed();
  rng.seed(seed);
  // Builds the op on a lab from the same host data and returns its output bytes.
  using Build = std::function<Op(Lab&, const std::vector<Tensor>&, const Tensor&)>;
  struct Case {
    std::string name;
    std::vector<Host> inputs;
    DType ydt;
    Shape ys;
    Build build;
  };
  auto R = [&](DType t, Shape s) { return is_float(t) ? rand_host(rng, t, std::move(s), -1, 1) : rand_int(rng, t, std::move(s)); };
  std::vector<Case> cases;
  cases.push_back({"matmul f32 8x8, K 8192", {R(DType::F32, {8, 8192}), R(DType::F32, {8192, 8})}, DType::F32, {8, 8},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) { return ops::matmul(in[0], in[1], y); }});
  cases.push_back({"matmul f32 64x96x80 with c and silu", {R(DType::F32, {64, 80}), R(DType::F32, {80, 96}), R(DType::F32, {96})},
                   DType::F32, {64, 96}, [](Lab&, const std::vector<Tensor>& in, const Tensor& y) {
                     MatMulOptions o;
                     o.c = in[2];
                     o.alpha = 0.5f;
                     o.activation = ActivationParams::silu();
                     return ops::matmul(in[0], in[1], y, o);
                   }});
  cases.push_back({"matmul bf16 batched", {R(DType::BF16, {3, 48, 200}), R(DType::BF16, {200, 40})}, DType::BF16, {3, 48, 40},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) { return ops::matmul(in[0], in[1], y); }});
  cases.push_back({"matmul f16 -> f32", {R(DType::F16, {33, 300}), R(DType::F16, {300, 17})}, DType::F32, {33, 17},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) { return ops::matmul(in[0], in[1], y); }});
  cases.push_back({"conv2d f32 NCHW", {R(DType::F32, {2, 8, 20, 20}), R(DType::F32, {16, 8, 3, 3}), R(DType::F32, {16})},
                   DType::F32, {2, 16, 20, 20}, [](Lab&, const std::vector<Tensor>& in, const Tensor& y) {
                     Conv2dOptions o;
                     o.pads = {1, 1, 1, 1};
                     o.bias = in[2];
                     return ops::conv2d(in[0], in[1], y, o);
                   }});
  cases.push_back({"conv2d f16 NHWC depthwise", {R(DType::F16, {1, 16, 16, 12}), R(DType::F16, {12, 1, 3, 3})}, DType::F16,
                   {1, 8, 8, 12}, [](Lab&, const std::vector<Tensor>& in, const Tensor& y) {
                     Conv2dOptions o;
                     o.layout = Layout::NHWC;
                     o.groups = 12;
                     o.strides = {2, 2};
                     o.pads = {1, 1, 0, 0};
                     o.activation = ActivationParams::relu6();
                     return ops::conv2d(in[0], in[1], y, o);
                   }});
  cases.push_back({"softmax f32 rows", {R(DType::F32, {64, 300})}, DType::F32, {64, 300},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) { return ops::softmax(in[0], y, -1); }});
  cases.push_back({"log_softmax f32 axis 0", {R(DType::F32, {300, 64})}, DType::F32, {300, 64},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) { return ops::softmax(in[0], y, 0, true); }});
  Host qs(DType::F32, {}), qz(DType::U8, {});
  qs.v = {0.01};
  qz.v = {128};
  Host qsy(DType::F32, {});
  qsy.v = {0.37};
  cases.push_back({"qlinear_matmul u8", {R(DType::U8, {64, 512}), qs, qz, R(DType::U8, {512, 32}), qs, qz, qsy, qz},
                   DType::U8, {64, 32}, [](Lab&, const std::vector<Tensor>& in, const Tensor& y) {
                     return ops::qlinear_matmul(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], y);
                   }});
  cases.push_back({"qlinear_conv u8 NHWC", {R(DType::U8, {1, 12, 12, 16}), qs, qz, R(DType::U8, {32, 16, 3, 3}), qs, qz, qsy, qz},
                   DType::U8, {1, 12, 12, 32}, [](Lab&, const std::vector<Tensor>& in, const Tensor& y) {
                     Conv2dOptions o;
                     o.layout = Layout::NHWC;
                     o.pads = {1, 1, 1, 1};
                     return ops::qlinear_conv(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], y, o);
                   }});
  cases.push_back({"matmul_integer i8 K 20000", {R(DType::I8, {16, 20000}), R(DType::I8, {20000, 16})}, DType::I32, {16, 16},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) { return ops::matmul_integer(in[0], in[1], y); }});
  cases.push_back({"avg_pool2d f32", {R(DType::F32, {2, 16, 20, 20})}, DType::F32, {2, 16, 10, 10},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) {
                     Pool2dOptions o;
                     o.kernel = {3, 3};
                     o.strides = {2, 2};
                     o.pads = {1, 1, 0, 0};
                     return ops::avg_pool2d(in[0], y, o);
                   }});
  cases.push_back({"resize linear f32", {R(DType::F32, {2, 8, 17, 13})}, DType::F32, {2, 8, 40, 30},
                   [](Lab&, const std::vector<Tensor>& in, const Tensor& y) {
                     ResizeOptions o;
                     o.mode = ResizeMode::Linear;
                     return ops::resize(in[0], y, o);
                   }});
  for (const Case& c : cases) {
    std::vector<std::vector<std::byte>> results;
    for (auto& l : labs) {
      std::vector<Tensor> in;
      for (const Host& h : c.inputs) in.push_back(l->upload(h));
      const Tensor y = l->output(c.ydt, c.ys);
      l->run(c.build(*l, in, y));
      results.push_back(l->bytes(y.buffer()));
      // The same op again on the same board gives the same bits too.
      l->run(c.build(*l, in, y));
      EXPECT_EQ(l->bytes(y.buffer()), results.back()) << c.name << ": a second run differs (seed " << seed << ")";
    }
    ASSERT_EQ(results[0].size(), results[1].size());
    std::size_t first = results[0].size();
    for (std::size_t i = 0; i < results[0].size() && first == results[0].size(); ++i)
      if (results[0][i] != results[1][i]) first = i;
    EXPECT_EQ(first, results[0].size()) << c.name << ": 1 thread and " << "8 threads differ from byte " << first
                                        << " (seed " << seed << ")";
  }
}

// ---- the same integer results at every instruction-set level ---------------------------------------------------

TEST(OpsIsa, IntegerOpsAreBitIdenticalAtEveryInstructionSetLevel) {
  const TempDir dir("tpuhal-isa");
#if defined(__x86_64__)
  const char* levels[] = {"sse2", "sse41", "avx2", "avx512", "avx512_vnni"};
#elif defined(__aarch64__)
  const char* levels[] = {"generic", "neon"};
#else
  const char* levels[] = {"generic"};
#endif
  // One board per level this CPU has (a cap above it gives the CPU's level).
  std::vector<std::unique_ptr<Lab>> labs;
  std::vector<std::string> names;
  for (const char* level : levels) {
    auto lab = fresh_lab(dir, "TPUHAL_MAX_ISA", level);
    const std::string have = lab->dev.properties().tensor_isa;
    if (std::find(names.begin(), names.end(), have) != names.end()) continue;
    ASSERT_EQ(have, level) << "a board capped at " << level << " runs at " << have;
    names.push_back(have);
    labs.push_back(std::move(lab));
  }
  ASSERT_FALSE(labs.empty());

  Rng rng;
  const std::uint64_t seed = test_seed();
  rng.seed(seed);
  using Build = std::function<Op(const std::vector<Tensor>&, const Tensor&)>;
  struct Case {
    std::string name;
    std::vector<Host> inputs;
    DType ydt;
    Shape ys;
    Build build;
  };
  auto I = [&](DType t, Shape s) { return rand_int(rng, t, std::move(s)); };
  auto scalar = [](DType t, double v) {
    Host h(t, {});
    h.v = {v};
    return h;
  };
  std::vector<Case> cases;
  // Full-range operands and zero points: products and sums as large as
  // int8 gets, sums past 2^24 and wrapping past 2^31.
  cases.push_back({"matmul_integer u8 x i8, row and column zero points, K 3001", {I(DType::U8, {37, 3001}), I(DType::I8, {3001, 45}), I(DType::U8, {37}), I(DType::I8, {45})},
                   DType::I32, {37, 45}, [](const std::vector<Tensor>& in, const Tensor& y) {
                     return ops::matmul_integer(in[0], in[1], y, in[2], in[3]);
                   }});
  cases.push_back({"matmul_integer i8 x u8 batched, K 70000", {I(DType::I8, {2, 3, 70000}), I(DType::U8, {70000, 5}), scalar(DType::I8, -128), scalar(DType::U8, 0)},
                   DType::I32, {2, 3, 5}, [](const std::vector<Tensor>& in, const Tensor& y) {
                     return ops::matmul_integer(in[0], in[1], y, in[2], in[3]);
                   }});
  cases.push_back({"conv_integer u8 x u8 NCHW groups 2, pads, per-channel zero points", {I(DType::U8, {2, 8, 13, 11}), I(DType::U8, {6, 4, 3, 3}), scalar(DType::U8, 131), I(DType::U8, {6})},
                   DType::I32, {2, 6, 7, 5}, [](const std::vector<Tensor>& in, const Tensor& y) {
                     Conv2dOptions o;
                     o.groups = 2;
                     o.strides = {2, 2};
                     o.pads = {1, 1, 1, 0};
                     return ops::conv_integer(in[0], in[1], y, in[2], in[3], o);
                   }});
  cases.push_back({"conv_integer i8 x i8 NHWC dilated", {I(DType::I8, {1, 12, 12, 40}), I(DType::I8, {24, 40, 3, 3}), scalar(DType::I8, -3), scalar(DType::I8, 5)},
                   DType::I32, {1, 10, 10, 24}, [](const std::vector<Tensor>& in, const Tensor& y) {
                     Conv2dOptions o;
                     o.layout = Layout::NHWC;
                     o.dilations = {2, 2};
                     o.pads = {1, 1, 1, 1};
                     return ops::conv_integer(in[0], in[1], y, in[2], in[3], o);
                   }});
  Host qs = scalar(DType::F32, 0.013), qsy = scalar(DType::F32, 0.41);
  cases.push_back({"qlinear_matmul u8 x u8", {I(DType::U8, {64, 700}), qs, scalar(DType::U8, 128), I(DType::U8, {700, 48}), qs, scalar(DType::U8, 3), qsy, scalar(DType::U8, 100)},
                   DType::U8, {64, 48}, [](const std::vector<Tensor>& in, const Tensor& y) {
                     return ops::qlinear_matmul(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], y);
                   }});
  Host ws(DType::F32, {32});
  for (int i = 0; i < 32; ++i) ws.v.push_back(0.001 + 0.0003 * i);
  cases.push_back({"qlinear_conv u8 x i8 NHWC per-channel scales and bias", {I(DType::U8, {2, 14, 14, 64}), scalar(DType::F32, 0.02), scalar(DType::U8, 128), I(DType::I8, {32, 64, 3, 3}), ws, scalar(DType::I8, 0), qsy, scalar(DType::U8, 120), I(DType::I32, {32})},
                   DType::U8, {2, 14, 14, 32}, [](const std::vector<Tensor>& in, const Tensor& y) {
                     Conv2dOptions o;
                     o.layout = Layout::NHWC;
                     o.pads = {1, 1, 1, 1};
                     o.bias = in[8];
                     return ops::qlinear_conv(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], y, o);
                   }});
  cases.push_back({"qlinear_conv u8 x i8 NCHW depthwise", {I(DType::U8, {1, 32, 17, 17}), scalar(DType::F32, 0.02), scalar(DType::U8, 7), I(DType::I8, {32, 1, 3, 3}), ws, scalar(DType::I8, 0), qsy, scalar(DType::U8, 120)},
                   DType::U8, {1, 32, 9, 9}, [](const std::vector<Tensor>& in, const Tensor& y) {
                     Conv2dOptions o;
                     o.groups = 32;
                     o.strides = {2, 2};
                     o.pads = {1, 1, 1, 1};
                     return ops::qlinear_conv(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], y, o);
                   }});
  for (const Case& c : cases) {
    std::vector<std::vector<std::byte>> results;
    for (auto& l : labs) {
      std::vector<Tensor> in;
      for (const Host& h : c.inputs) in.push_back(l->upload(h));
      const Tensor y = l->output(c.ydt, c.ys);
      l->run(c.build(in, y));
      results.push_back(l->bytes(y.buffer()));
    }
    for (std::size_t i = 1; i < results.size(); ++i) {
      std::size_t first = results[0].size();
      for (std::size_t b = 0; b < results[0].size() && first == results[0].size(); ++b)
        if (results[0][b] != results[i][b]) first = b;
      EXPECT_EQ(first, results[0].size()) << c.name << ": " << names[0] << " and " << names[i] << " differ from byte "
                                          << first << " (seed " << seed << ")";
    }
  }
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
  std::shared_ptr<driver::DeviceBackend> dev = tpu::open_device(tpu::make_sim_transport(board), "ops-board:tiny", "tpu-sim");
};

driver::Timeline settle(driver::QueueBackend& q, std::uint64_t value) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  for (;;) {
    auto t = q.timeline();
    if (t.completed >= value || t.failed || std::chrono::steady_clock::now() > deadline) return t;
    q.block(value, 100ms);
  }
}

fw::CommandDescriptor descriptor(fw::Opcode op, std::uint64_t a0 = 0, std::uint64_t a1 = 0, std::uint64_t a2 = 0) {
  fw::CommandDescriptor d{};
  d.opcode = static_cast<std::uint16_t>(op);
  d.args[0] = a0;
  d.args[1] = a1;
  d.args[2] = a2;
  return d;
}

fw::TensorRef tensor_ref(std::uint64_t address, fw::DType dt, std::vector<std::uint64_t> shape) {
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

TEST_F(OpsBoard, AValidBlockInMemoryRuns) {
  auto q = rig_.dev->create_queue(Engine::Compute, {});
  expect_add_runs(*q);
}

TEST_F(OpsBoard, AnOutputOverlappingAnInputIsRefused) {
  AddBlock b = add_block();
  b.t[2].address = base_ + kA + 16;  // y over the tail of a
  expect_refused(b, {"bad argument", "output tensor 2 overlaps input tensor 0"}, kNoCheck);
  // a's bytes are as they were.
  auto m = mem_->map();
  for (int i = 0; i < 16; ++i) {
    float a;
    std::memcpy(&a, m.data() + kA + 4 * i, 4);
    EXPECT_EQ(a, static_cast<float>(i));
  }
}

TEST_F(OpsBoard, ATensorPastTheEndOfDramIsADmaFaultNamingIt) {
  AddBlock b = add_block();
  const std::uint64_t dram = rig_.board->profile().dram_bytes;
  b.t[0].address = dram - 32;  // 64 bytes from 32 before the end
  std::ostringstream hex;
  hex << std::hex << "0x" << dram - 32;
  expect_refused(b, {"DMA fault", "tensor 0 address", hex.str(), "not mapped for DMA (read)"});
}

TEST_F(OpsBoard, AnUnmappedHostAddressIsADmaFaultNamingTheTensor) {
  AddBlock b = add_block();
  b.t[1].address = fw::kHostWindowBase + (1ull << 40);
  expect_refused(b, {"DMA fault", "tensor 1 address", "0x1010000000000", "(read)"});
  b = add_block();
  b.t[2].address = fw::kHostWindowBase + (1ull << 40);
  expect_refused(b, {"DMA fault", "tensor 2 address", "(write)"});
}

TEST_F(OpsBoard, AWrongMagicIsRefused) {
  AddBlock b = add_block();
  b.h.magic = 0xDEADBEEF;
  expect_refused(b, {"bad argument", "op header = 3735928559"});
}

TEST_F(OpsBoard, AnUnknownOpKindIsRefused) {
  AddBlock b = add_block();
  b.h.kind = 99;
  expect_refused(b, {"bad argument", "op kind = 99"});
}

TEST_F(OpsBoard, InconsistentConvolutionShapesAreRefusedNamingTheField) {
  ConvBlock b{};
  b.h.magic = fw::kOpMagic;
  b.h.kind = static_cast<std::uint32_t>(fw::OpKind::kConv2d);
  b.h.num_tensors = 4;
  b.h.attr_bytes = sizeof(fw::ConvAttrs);
  b.t[0] = tensor_ref(base_ + 4096, fw::DType::kF32, {1, 1, 6, 6});
  b.t[1] = tensor_ref(base_ + 8192, fw::DType::kF32, {1, 1, 3, 3});
  b.t[3] = tensor_ref(base_ + kY, fw::DType::kF32, {1, 1, 5, 4});  // 4x4 is what a 3x3 kernel leaves of 6x6
  b.at.groups = 1;
  b.at.stride[0] = b.at.stride[1] = 1;
  b.at.dilation[0] = b.at.dilation[1] = 1;
  expect_refused(b, {"bad argument", "tensor 3 shape[2] = 5 is not valid (expected 4)"});
  // Input channels that do not match the weights.
  b.t[3] = tensor_ref(base_ + kY, fw::DType::kF32, {1, 1, 4, 4});
  b.t[1] = tensor_ref(base_ + 8192, fw::DType::kF32, {1, 2, 3, 3});
  expect_refused(b, {"bad argument", "tensor 1 shape[1] = 2 is not valid (expected 1)"});
}

TEST_F(OpsBoard, OtherQueuesAndLaterWorkStayIntact) {
  auto good = rig_.dev->create_queue(Engine::Compute, {});
  expect_add_runs(*good);
  AddBlock b = add_block();
  b.h.kind = 0;
  expect_refused(b, {"op kind = 0"});
  b = add_block();
  b.t[2].address = base_ + kB;
  expect_refused(b, {"output tensor 2 overlaps input tensor 1"}, kNoCheck);
  // The queue that never failed still runs ops, twice.
  expect_add_runs(*good);
  expect_add_runs(*good);
  EXPECT_FALSE(good->timeline().failed);
}

// A convolution's oneDNN primitive is made on the thread of the queue that
// first runs it and kept; other compute queues (other board threads) must be
// able to run it too, in any order, with the same result.
TEST(OpsAcrossQueues, ConvolutionRunsAlikeOnEveryComputeQueue) {
  Device dev = open("sim:0");
  Queue a = dev.queue(Engine::Compute), b = dev.queue(Engine::Compute);
  const std::int64_t n = 1, c = 16, h = 32, w = 32, o = 32;
  Buffer xb = dev.allocate(n * c * h * w * 4, Memory::DeviceHostVisible);
  Buffer wb = dev.allocate(o * c * 9 * 4, Memory::DeviceHostVisible);
  auto* xp = reinterpret_cast<float*>(xb.map().data());
  auto* wp = reinterpret_cast<float*>(wb.map().data());
  for (std::int64_t i = 0; i < n * c * h * w; ++i) xp[i] = static_cast<float>((i * 37) % 11) - 5.0f;
  for (std::int64_t i = 0; i < o * c * 9; ++i) wp[i] = static_cast<float>((i * 13) % 7) - 3.0f;
  Conv2dOptions opt;
  opt.pads = {1, 1, 1, 1};
  std::vector<std::vector<float>> results;
  for (Queue* q : {&a, &b, &a, &b}) {
    Buffer yb = dev.allocate(n * o * h * w * 4, Memory::DeviceHostVisible);
    q->run(ops::conv2d(Tensor(xb, DType::F32, {n, c, h, w}), Tensor(wb, DType::F32, {o, c, 3, 3}),
                       Tensor(yb, DType::F32, {n, o, h, w}), opt))
        .submit()
        .wait();
    const auto* yp = reinterpret_cast<const float*>(yb.map().data());
    results.emplace_back(yp, yp + n * o * h * w);
  }
  // One element against the definition (integers: exact in f32).
  double want = 0;
  for (std::int64_t ci = 0; ci < c; ++ci)
    for (int kh = 0; kh < 3; ++kh)
      for (int kw = 0; kw < 3; ++kw) want += xp[(ci * h + 4 + kh - 1) * w + 7 + kw - 1] * wp[((5 * c + ci) * 3 + kh) * 3 + kw];
  EXPECT_EQ(results[0][(5 * h + 4) * w + 7], want);
  for (std::size_t i = 1; i < results.size(); ++i) EXPECT_EQ(results[i], results[0]) << "run " << i;
}

}  // namespace
}  // namespace tpuhal
