// The tensor engine's integer GEMM on every instruction-set level this CPU
// has, whatever TPUHAL_MAX_ISA says (the kernels are called directly):
// exact, wrapping int32 results against an int64 reference, for every
// operand type, zero-point form, operand layout, padding and edge tile.
// Its float GEMM, by each of its routes, against the one chain of
// multiply-adds per element that fgemm.h promises.
// Likewise the innermost loops (simd.h) against their scalar rules, and
// which level's version each of their entry points runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "dnnl_state.h"
#include "engine.h"
#include "fgemm.h"
#include "igemm.h"
#include "isa.h"
#include "numerics.h"
#include "simd.h"
#include "tpuhal/base/wait.h"

namespace tpuhal::sim::tensor {
namespace {

std::vector<Isa> levels_here() {
  std::vector<Isa> out;
  const Isa top = isa_detected();
  for (std::string_view name : {"generic", "sse2", "sse41", "avx2", "avx512", "avx512_vnni", "neon"}) {
    const auto isa = parse_isa(name);
    if (isa && static_cast<int>(*isa) <= static_cast<int>(top)) out.push_back(*isa);
  }
  return out;
}

std::uint32_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}

// A line-major operand with some elements as padding and the rest read
// through runs of stride 1 and of stride 3, from two copies of the data.
class MixedLines final : public igemm::Lines {
 public:
  MixedLines(std::uint64_t lines, std::uint64_t len, std::uint32_t seed) : len_(len), seed_(seed) {
    std::mt19937 rng(seed);
    dense_.resize(lines * len);
    for (auto& v : dense_) v = static_cast<std::uint8_t>(rng());
    wide_.resize(lines * len * 3);
    for (std::uint64_t i = 0; i < lines * len; ++i) wide_[i * 3] = dense_[i];
  }
  // 0: padding, 1: stride 1, 2: stride 3.
  int kind(std::uint64_t line, std::uint64_t pos) const {
    const std::uint32_t h = mix((line << 32 | pos) ^ seed_) % 5;
    return h == 0 ? 0 : h < 3 ? 1 : 2;
  }
  std::uint8_t raw(std::uint64_t line, std::uint64_t pos) const { return dense_[line * len_ + pos]; }
  std::size_t segments(std::uint64_t line, std::uint64_t from, std::uint64_t count,
                       igemm::Segment* out) const override {
    std::size_t ns = 0;
    for (std::uint64_t p = from; p < from + count;) {
      const int k = kind(line, p);
      std::uint64_t q = p + 1;
      while (q < from + count && kind(line, q) == k) ++q;
      if (k == 0)
        out[ns++] = {nullptr, q - p, 0};
      else if (k == 1)
        out[ns++] = {&dense_[line * len_ + p], q - p, 1};
      else
        out[ns++] = {&wide_[(line * len_ + p) * 3], q - p, 3};
      p = q;
    }
    return ns;
  }

 private:
  std::uint64_t len_;
  std::uint32_t seed_;
  std::vector<std::uint8_t> dense_, wide_;
};

std::int64_t value(std::uint8_t raw, bool is_signed) {
  return is_signed ? static_cast<std::int8_t>(raw) : static_cast<std::int64_t>(raw);
}

struct Case {
  std::uint64_t m, n, k;
  bool a_signed, b_signed, b_rows;
  int zeros;  // 0: none, 1: scalar, 2: per row of A / per column of B
};

std::string describe(const Case& c, Isa isa) {
  return std::string(isa_name(isa)) + " m " + std::to_string(c.m) + " n " + std::to_string(c.n) + " k " +
         std::to_string(c.k) + (c.a_signed ? " s8" : " u8") + (c.b_signed ? " x s8" : " x u8") +
         (c.b_rows ? " B by rows" : " B by columns") + " zeros " + std::to_string(c.zeros);
}

void check(TensorEngine& e, Isa isa, const Case& c, std::uint32_t seed) {
  SCOPED_TRACE(describe(c, isa));
  MixedLines a(c.m, c.k, seed);
  MixedLines b(c.b_rows ? c.k : c.n, c.b_rows ? c.n : c.k, seed + 1);
  a.is_signed = c.a_signed;
  b.is_signed = c.b_signed;
  std::mt19937 rng(seed + 2);
  auto zero_of = [&](bool is_signed) {
    return static_cast<std::int16_t>(is_signed ? static_cast<int>(rng() % 256) - 128 : static_cast<int>(rng() % 256));
  };
  std::vector<std::int16_t> za(c.m, 0), zb(c.n, 0);
  if (c.zeros == 1) {
    a.zero = zero_of(c.a_signed);
    b.zero = zero_of(c.b_signed);
    std::fill(za.begin(), za.end(), a.zero);
    std::fill(zb.begin(), zb.end(), b.zero);
  } else if (c.zeros == 2) {
    for (auto& z : za) z = zero_of(c.a_signed);
    for (auto& z : zb) z = zero_of(c.b_signed);
    a.zero_per_line = za.data();
    (c.b_rows ? b.zero_along : b.zero_per_line) = zb.data();
  }
  const std::uint64_t ldc = c.n + 3;
  std::vector<std::int32_t> got(c.m * ldc, 0x5A5A5A5A);
  igemm::gemm(e, igemm::kernels(isa), c.m, c.n, c.k, a, b, c.b_rows, got.data(), ldc);
  for (std::uint64_t i = 0; i < c.m; ++i) {
    for (std::uint64_t j = 0; j < c.n; ++j) {
      std::uint64_t sum = 0;
      for (std::uint64_t kk = 0; kk < c.k; ++kk) {
        const std::uint64_t bl = c.b_rows ? kk : j, bp = c.b_rows ? j : kk;
        if (a.kind(i, kk) == 0 || b.kind(bl, bp) == 0) continue;  // padding contributes 0
        const std::int64_t av = value(a.raw(i, kk), c.a_signed) - za[i];
        const std::int64_t bv = value(b.raw(bl, bp), c.b_signed) - zb[j];
        sum += static_cast<std::uint64_t>(av * bv);
      }
      ASSERT_EQ(got[i * ldc + j], static_cast<std::int32_t>(static_cast<std::uint32_t>(sum)))
          << "at [" << i << ", " << j << "]";
    }
    for (std::uint64_t j = c.n; j < ldc; ++j) ASSERT_EQ(got[i * ldc + j], 0x5A5A5A5A) << "written past column " << c.n;
  }
}

TEST(TensorIsa, IntegerProductsAreExactAtEveryLevelThisCpuHas) {
  TensorEngine e(3, isa_detected());
  std::uint32_t seed = 1;
  for (Isa isa : levels_here()) {
    // Shapes around every kernel's MR and NR, odd K, K across packing
    // blocks, a single row or column.
    const std::uint64_t shapes[][3] = {{1, 1, 1},      {7, 13, 5},    {31, 8, 31},  {6, 16, 2},  {97, 33, 257},
                                       {200, 70, 600}, {13, 1, 1000}, {1, 130, 77}, {9, 32, 513}};
    for (const auto& sh : shapes) {
      const bool big = sh[0] * sh[1] * sh[2] > 1000000;  // every variant on the small ones
      for (int t = big ? 3 : 0; t < 4; ++t)
        for (int zeros = big ? 2 : 0; zeros < 3; ++zeros)
          for (bool rows : {true, false})
            check(e, isa, Case{sh[0], sh[1], sh[2], (t & 1) != 0, (t & 2) != 0, rows, zeros}, seed++);
    }
  }
}

// Sums far past 2^31 wrap exactly, and the largest products (255 * 255 and
// (-128 - 127) * (127 + 128) after zero points) never saturate anything.
TEST(TensorIsa, IntegerProductsWrapInInt32AndNothingSaturates) {
  TensorEngine e(2, isa_detected());
  const std::uint64_t m = 3, n = 21, k = 70001;
  std::vector<std::uint8_t> a(m * k), b(k * n);
  for (std::uint64_t i = 0; i < a.size(); ++i) a[i] = i % 7 == 0 ? 0 : 255;
  for (std::uint64_t i = 0; i < b.size(); ++i) b[i] = i % 5 == 0 ? 0x80 : 0x7F;  // s8: -128, 127
  for (Isa isa : levels_here()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    for (int zeros = 0; zeros < 2; ++zeros) {
      igemm::MatrixLines al(a.data(), static_cast<std::int64_t>(k), 1), bl(b.data(), static_cast<std::int64_t>(n), 1);
      bl.is_signed = true;
      const std::int16_t za = zeros ? 3 : 0, zb = zeros ? 127 : 0;
      al.zero = za;
      bl.zero = zb;
      std::vector<std::int32_t> c(m * n);
      igemm::gemm(e, igemm::kernels(isa), m, n, k, al, bl, true, c.data(), n);
      for (std::uint64_t i = 0; i < m; ++i)
        for (std::uint64_t j = 0; j < n; ++j) {
          std::uint64_t sum = 0;
          for (std::uint64_t kk = 0; kk < k; ++kk)
            sum +=
                static_cast<std::uint64_t>((static_cast<std::int64_t>(a[i * k + kk]) - za) *
                                           (static_cast<std::int64_t>(static_cast<std::int8_t>(b[kk * n + j])) - zb));
          ASSERT_EQ(c[i * n + j], static_cast<std::int32_t>(static_cast<std::uint32_t>(sum)))
              << "at [" << i << ", " << j << "], zero points " << zeros;
        }
    }
  }
}

// fgemm.h's contract, bit for bit: every element of C is one chain of
// multiply-adds in k order from 0, fused where the level has FMA, else each
// product rounded before it is added. Shapes reach each route of
// fgemm::gemm (a few rows by B read in place, a few rows by B packed a
// panel at a time, the blocked product), with B by rows and by columns,
// in f32, f16 and bf16, K across the kernels' blocks, C with a row stride
// past its width (not written there).
TEST(TensorIsa, FloatProductsAreOneMultiplyAddChainPerElementAtEveryLevel) {
  TensorEngine e(3, isa_detected());
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  // {1, 5003, 20} and {2, 1500, 33}: a thread's columns past what one pass
  // over B's rows in order takes, and not whole vectors.
  const std::uint64_t shapes[][3] = {{1, 1000, 600}, {2, 257, 300}, {4, 130, 77},  {1, 5, 1},    {5, 130, 513},
                                     {40, 70, 300},  {130, 33, 40}, {1, 5003, 20}, {2, 1500, 33}};
  for (Isa isa : levels_here()) {
    const fgemm::Kernels& k = fgemm::kernels(isa);
    for (const auto& sh : shapes)
      for (const fgemm::Type type : {fgemm::Type::kF32, fgemm::Type::kF16, fgemm::Type::kBF16})
        for (const bool b_rows : {true, false}) {
          const std::uint64_t m = sh[0], n = sh[1], kd = sh[2];
          SCOPED_TRACE(std::string(isa_name(isa)) + " m " + std::to_string(m) + " n " + std::to_string(n) + " k " +
                       std::to_string(kd) + " type " + std::to_string(static_cast<int>(type)) +
                       (b_rows ? " B by rows" : " B by columns"));
          // Values as the type holds them, and their bits in it.
          auto make = [&](std::uint64_t count, std::vector<float>& values, std::vector<std::uint16_t>& halves) {
            values.resize(count);
            halves.resize(count);
            for (std::uint64_t i = 0; i < count; ++i) {
              const float f = dist(rng);
              halves[i] = type == fgemm::Type::kF16 ? fw::f32_to_f16(f) : fw::f32_to_bf16(f);
              values[i] = type == fgemm::Type::kF32   ? f
                          : type == fgemm::Type::kF16 ? fw::f16_to_f32(halves[i])
                                                      : fw::bf16_to_f32(halves[i]);
            }
          };
          std::vector<float> av, bv;
          std::vector<std::uint16_t> ah, bh;
          make(m * kd, av, ah);
          make(kd * n, bv, bh);
          auto base = [&](const std::vector<float>& f, const std::vector<std::uint16_t>& h) {
            return type == fgemm::Type::kF32 ? reinterpret_cast<const std::byte*>(f.data())
                                             : reinterpret_cast<const std::byte*>(h.data());
          };
          // A row-major; B [k, n] by rows (element (kk, j) at kk * n + j) or
          // by columns (at j * kd + kk).
          const fgemm::Matrix a{base(av, ah), static_cast<std::int64_t>(kd), 1, type};
          const fgemm::Matrix b{base(bv, bh), b_rows ? static_cast<std::int64_t>(n) : 1,
                                b_rows ? 1 : static_cast<std::int64_t>(kd), type};
          const std::uint64_t ldc = n + 3;
          std::vector<float> got(m * ldc, -7.0f);
          fgemm::gemm(e, k, m, n, kd, a, b, got.data(), ldc);
          for (std::uint64_t i = 0; i < m; ++i) {
            for (std::uint64_t j = 0; j < n; ++j) {
              float want = 0.0f;
              for (std::uint64_t kk = 0; kk < kd; ++kk) {
                const float x = av[i * kd + kk], y = bv[b_rows ? kk * n + j : j * kd + kk];
                if (k.fma) {
                  want = std::fma(x, y, want);
                } else {
                  volatile float product = x * y;  // rounded on its own
                  want = want + product;
                }
              }
              ASSERT_EQ(std::memcmp(&got[i * ldc + j], &want, 4), 0)
                  << "at [" << i << ", " << j << "]: " << got[i * ldc + j] << " against " << want;
            }
            for (std::uint64_t j = n; j < ldc; ++j) ASSERT_EQ(got[i * ldc + j], -7.0f) << "written past column " << n;
          }
        }
  }
}

TEST(TensorIsa, TheCapComesFromTpuhalMaxIsaAndABadValueIsNamed) {
  const char* saved = std::getenv("TPUHAL_MAX_ISA");
  const std::string saved_value = saved ? saved : "";
  const std::string lowest(isa_name(levels_here().front()));
  ::setenv("TPUHAL_MAX_ISA", lowest.c_str(), 1);
  EXPECT_EQ(isa_name(isa_from_env()), lowest);
  ::setenv("TPUHAL_MAX_ISA", "avx512_vnni", 1);  // above this CPU (or not its arch): capped to what it has
  if (parse_isa("avx512_vnni")) {
    EXPECT_EQ(isa_from_env(), isa_detected());
  }
  ::setenv("TPUHAL_MAX_ISA", "avx3", 1);
  try {
    (void)isa_from_env();
    ADD_FAILURE() << "a bad level was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("TPUHAL_MAX_ISA=avx3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(isa_levels()), std::string::npos) << e.what();
  }
  if (saved)
    ::setenv("TPUHAL_MAX_ISA", saved_value.c_str(), 1);
  else
    ::unsetenv("TPUHAL_MAX_ISA");
}

}  // namespace
}  // namespace tpuhal::sim::tensor

namespace tpuhal::sim::tensor {
namespace {

// The vectorised conversions give the same bits as the scalar rules of
// fw/half.h: every binary16 value, and f32 values around every rounding
// boundary, infinities and NaNs.
TEST(TensorIsa, VectorConversionsMatchTheScalarRulesAtEveryLevel) {
  std::vector<std::uint16_t> halves(65536);
  for (std::uint32_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<std::uint16_t>(i);
  std::vector<float> wide(halves.size());
  for (Isa isa : levels_here()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    simd::kernels(isa).widen_f16(halves.data(), wide.data(), halves.size());
    for (std::uint32_t i = 0; i < halves.size(); ++i) {
      const float want = fw::f16_to_f32(halves[i]);
      ASSERT_EQ(std::memcmp(&wide[i], &want, 4), 0) << "f16 0x" << std::hex << i;
    }
    simd::kernels(isa).widen_bf16(halves.data(), wide.data(), halves.size());
    for (std::uint32_t i = 0; i < halves.size(); ++i) {
      const float want = fw::bf16_to_f32(halves[i]);
      ASSERT_EQ(std::memcmp(&wide[i], &want, 4), 0) << "bf16 0x" << std::hex << i;
    }
  }
  std::vector<float> floats;
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t bits = rng();
    if (i % 3 == 0) bits = (bits & 0xFFFF0000u) | (i % 2 ? 0x8000u : 0x7FFFu);  // ties and near-ties
    float f;
    std::memcpy(&f, &bits, 4);
    floats.push_back(f);
  }
  for (std::uint32_t h = 0; h < 0x7C00; ++h) {  // every finite half, and the f32 values just around its halfway points
    const float lo = fw::f16_to_f32(static_cast<std::uint16_t>(h)),
                hi = fw::f16_to_f32(static_cast<std::uint16_t>(h + 1));
    float mid = lo + (hi - lo) / 2;
    std::uint32_t bits;
    std::memcpy(&bits, &mid, 4);
    for (std::uint32_t d : {bits - 1, bits, bits + 1}) {
      float f;
      std::memcpy(&f, &d, 4);
      floats.push_back(f);
      floats.push_back(-f);
    }
  }
  for (float f : {0.0f, -0.0f, 65504.0f, 65520.0f, 1e-8f, 6.0e-8f, 3.0e-8f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    floats.push_back(f);
  std::vector<std::uint16_t> narrow(floats.size());
  for (Isa isa : levels_here()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    simd::kernels(isa).narrow_bf16(floats.data(), narrow.data(), floats.size());
    for (std::size_t i = 0; i < floats.size(); ++i) ASSERT_EQ(narrow[i], fw::f32_to_bf16(floats[i])) << floats[i];
    simd::kernels(isa).narrow_f16(floats.data(), narrow.data(), floats.size());
    for (std::size_t i = 0; i < floats.size(); ++i) ASSERT_EQ(narrow[i], fw::f32_to_f16(floats[i])) << floats[i];
  }
}

TEST(TensorIsa, PoolingStepsMatchTheScalarRuleAtEveryStrideAndLevel) {
  // Values with NaNs, infinities, signed zeros and ties, at strides 1, 2, 3.
  std::mt19937 rng(11);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            0.0f,
                            -0.0f,
                            1.0f};
  for (Isa isa : levels_here())
    for (std::size_t stride : {1u, 2u, 3u})
      for (std::size_t n : {0u, 1u, 7u, 33u, 1000u}) {
        SCOPED_TRACE(std::string(isa_name(isa)));
        std::vector<float> in(n * stride + 1), out(n), want(n), sums(n), want_sums(n);
        for (auto& v : in)
          v = rng() % 5 == 0 ? specials[rng() % 7] : static_cast<float>(static_cast<int>(rng() % 9) - 4);
        for (std::size_t i = 0; i < n; ++i) {
          out[i] = want[i] = rng() % 7 == 0 ? specials[rng() % 7] : static_cast<float>(static_cast<int>(rng() % 9) - 4);
          sums[i] = want_sums[i] = static_cast<float>(rng() % 1000) / 7.0f;
          const float v = in[i * stride];
          want[i] = v > want[i] || v != v ? v : want[i];
          want_sums[i] += v;
        }
        simd::kernels(isa).max_strided_f32(out.data(), in.data(), n, stride);
        simd::kernels(isa).add_strided_f32(sums.data(), in.data(), n, stride);
        for (std::size_t i = 0; i < n; ++i) {
          ASSERT_EQ(std::memcmp(&out[i], &want[i], 4), 0) << "max, stride " << stride << ", element " << i;
          ASSERT_EQ(std::memcmp(&sums[i], &want_sums[i], 4), 0) << "add, stride " << stride << ", element " << i;
        }
      }
}

TEST(TensorIsa, PoolingBlockStepsMatchTheScalarRuleAtEveryLevel) {
  // NHWC pooling's step for one tap over a row of outputs: blocks of n
  // channels, the inputs in_step apart (a stride of 2: ShuffleNet's 24
  // channels; adjoining blocks: one run), with NaNs, infinities and signed
  // zeros; the floats between the input blocks are not read into the sums.
  // Block lengths take every chunk the steps use (16, 8, 4, then single).
  std::mt19937 rng(14);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::infinity(), 0.0f, -0.0f};
  for (Isa isa : levels_here())
    for (const std::size_t n : {1u, 3u, 12u, 16u, 24u, 29u, 67u})
      for (const std::size_t gap : {0u, 1u, 24u}) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " blocks of " + std::to_string(n) + ", gap " + std::to_string(gap));
        const std::size_t blocks = 13, step = n + gap;
        std::vector<float> in(blocks * step), out(blocks * n), sums(blocks * n);
        for (auto& v : in)
          v = rng() % 6 == 0 ? specials[rng() % 5] : static_cast<float>(static_cast<int>(rng() % 9) - 4);
        for (auto& v : out)
          v = rng() % 8 == 0 ? specials[rng() % 5] : static_cast<float>(static_cast<int>(rng() % 9) - 4);
        for (auto& v : sums) v = static_cast<float>(rng() % 1000) / 7.0f;
        std::vector<float> want = out, want_sums = sums;
        for (std::size_t r = 0; r < blocks; ++r)
          for (std::size_t i = 0; i < n; ++i) {
            const float v = in[r * step + i];
            float& m = want[r * n + i];
            m = v > m || v != v ? v : m;
            want_sums[r * n + i] += v;
          }
        simd::kernels(isa).max_blocks_f32(out.data(), in.data(), n, blocks, step);
        simd::kernels(isa).add_blocks_f32(sums.data(), in.data(), n, blocks, step);
        ASSERT_EQ(std::memcmp(out.data(), want.data(), out.size() * 4), 0) << "max";
        ASSERT_EQ(std::memcmp(sums.data(), want_sums.data(), sums.size() * 4), 0) << "add";
      }
}

TEST(TensorIsa, ByteMaxPoolingStepsMatchTheScalarRuleAtEveryLevel) {
  // Every byte against every other over 256 x 256 pairs, and lengths
  // around each chunk width (64, then 32, 16 and 8, then single bytes); u8
  // compares as unsigned, i8 as signed.
  std::mt19937 rng(13);
  for (Isa isa : levels_here())
    for (const bool is_signed : {false, true})
      for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 15u, 16u, 17u, 24u, 31u, 32u, 33u, 63u, 64u, 65u, 127u, 65536u}) {
        SCOPED_TRACE(std::string(isa_name(isa)) + (is_signed ? " i8" : " u8"));
        std::vector<std::uint8_t> in(n), out(n), want(n);
        for (std::size_t i = 0; i < n; ++i) {
          in[i] = static_cast<std::uint8_t>(n == 65536 ? i : rng());
          out[i] = static_cast<std::uint8_t>(n == 65536 ? i >> 8 : rng());
          want[i] = is_signed ? static_cast<std::uint8_t>(
                                    std::max(static_cast<std::int8_t>(in[i]), static_cast<std::int8_t>(out[i])))
                              : std::max(in[i], out[i]);
        }
        simd::kernels(isa).max_8(out.data(), in.data(), n, 1, 0, is_signed);
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], want[i]) << "element " << i;
      }
  // Blocks: 24 bytes each (ShuffleNet's channels), and other widths, the
  // inputs two blocks apart (a stride of 2), the bytes between them
  // untouched by the max.
  for (Isa isa : levels_here())
    for (const bool is_signed : {false, true})
      for (const std::size_t n : {3u, 12u, 24u, 40u, 72u}) {
        SCOPED_TRACE(std::string(isa_name(isa)) + (is_signed ? " i8" : " u8") + " blocks of " + std::to_string(n));
        const std::size_t blocks = 37, step = 2 * n;
        std::vector<std::uint8_t> in(blocks * step), out(blocks * n), want(blocks * n);
        for (auto& v : in) v = static_cast<std::uint8_t>(rng());
        for (auto& v : out) v = static_cast<std::uint8_t>(rng());
        for (std::size_t r = 0; r < blocks; ++r)
          for (std::size_t i = 0; i < n; ++i) {
            const std::uint8_t u = in[r * step + i], o = out[r * n + i];
            want[r * n + i] =
                is_signed
                    ? static_cast<std::uint8_t>(std::max(static_cast<std::int8_t>(u), static_cast<std::int8_t>(o)))
                    : std::max(u, o);
          }
        simd::kernels(isa).max_8(out.data(), in.data(), n, blocks, step, is_signed);
        ASSERT_EQ(out, want);
      }
}

TEST(TensorIsa, ConvolutionTapStepRoundsTheProductThenAddsAtEveryLevel) {
  // out[i] += w * in[i * stride], product and sum each rounded once: the
  // same bits as the scalar rule, at every level.
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (Isa isa : levels_here())
    for (std::size_t stride : {1u, 2u, 3u})
      for (std::size_t n : {0u, 1u, 7u, 33u, 1000u}) {
        SCOPED_TRACE(std::string(isa_name(isa)));
        std::vector<float> in(n * stride + 1), out(n), want(n);
        for (auto& v : in) v = u(rng);
        for (std::size_t i = 0; i < n; ++i) out[i] = want[i] = u(rng);
        const float w = u(rng);
        for (std::size_t i = 0; i < n; ++i) {
          volatile float product = w * in[i * stride];  // kept from fusing with the sum
          want[i] += product;
        }
        simd::kernels(isa).madd_strided_f32(out.data(), in.data(), n, stride, w);
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_EQ(std::memcmp(&out[i], &want[i], 4), 0) << "stride " << stride << ", element " << i;
      }
}

TEST(TensorIsa, DepthwiseRowsAddRoundedProductsInTapOrderAtEveryLevel) {
  // out[o * ch + c] = bias[c] + in[0][o * step + c] * w[c] + ..., each
  // product and sum rounded once, in tap order: the scalar rule's bits at
  // every level, for channel counts that take every vector width and the
  // scalar tail, and column counts that take every group of columns.
  std::mt19937 rng(14);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (Isa isa : levels_here())
    for (std::size_t ch : {1u, 3u, 4u, 8u, 13u, 16u, 29u, 48u})
      for (std::size_t ow : {1u, 2u, 3u, 4u, 7u, 9u})
        for (std::size_t taps : {1u, 9u})
          for (std::size_t stride : {1u, 2u}) {
            SCOPED_TRACE(std::string(isa_name(isa)) + " ch " + std::to_string(ch) + " ow " + std::to_string(ow) +
                         " taps " + std::to_string(taps) + " stride " + std::to_string(stride));
            const std::size_t step = stride * ch, len = (ow - 1) * step + ch;
            std::vector<std::vector<float>> rows(taps, std::vector<float>(len));
            std::vector<const float*> in;
            for (auto& r : rows) {
              for (auto& v : r) v = u(rng);
              in.push_back(r.data());
            }
            std::vector<float> w(taps * ch), bias(ch), out(ow * ch, -1.0f), want(ow * ch);
            for (auto& v : w) v = u(rng);
            for (auto& v : bias) v = u(rng);
            for (std::size_t o = 0; o < ow; ++o)
              for (std::size_t c = 0; c < ch; ++c) {
                float acc = bias[c];
                for (std::size_t t = 0; t < taps; ++t) {
                  volatile float product = in[t][o * step + c] * w[t * ch + c];  // kept from fusing with the sum
                  acc += product;
                }
                want[o * ch + c] = acc;
              }
            simd::kernels(isa).dw_rows_f32(out.data(), in.data(), w.data(), bias.data(), taps, ow, ch, step);
            for (std::size_t i = 0; i < out.size(); ++i)
              ASSERT_EQ(std::memcmp(&out[i], &want[i], 4), 0) << "element " << i;
          }
}

TEST(TensorIsa, QuadRowsOfADepthwiseIntegerConvolutionRequantiseAtEveryLevel) {
  // quad_bytes_u8 lays a row of bytes out as quads of taps; dw_rows_q8
  // sums u8 x s8 over them and requantises: the exact sums (wrapping
  // through a bias near 2^31), requantize_u8's rounding (ties, saturation,
  // a product past f32's range), at every level (AVX-512 with VNNI
  // where the CPU has it), for channel counts that leave every masked tail
  // and column counts that take every group of columns.
  std::mt19937 rng(21);
  const auto byte = [&] { return static_cast<std::uint8_t>(rng() % 256); };
  for (Isa isa : levels_here())
    for (std::size_t ch : {1u, 7u, 16u, 40u, 64u})
      for (std::size_t ow : {1u, 2u, 3u, 4u, 5u, 9u})
        for (std::size_t quads : {1u, 4u}) {
          SCOPED_TRACE(std::string(isa_name(isa)) + " ch " + std::to_string(ch) + " ow " + std::to_string(ow) +
                       " quads " + std::to_string(quads));
          const simd::Kernels& k = simd::kernels(isa);
          // Rows of quads from plain rows: a partner 2 pixels on, every
          // second pixel's quad, then flipped (an i8 row read as u8).
          const std::size_t step = 2, cols = ow * step + 1, partner = 2 * ch;
          std::vector<std::vector<std::uint8_t>> plain(quads), rows(quads);
          std::vector<const std::uint8_t*> in;
          for (std::size_t q = 0; q < quads; ++q) {
            plain[q].resize((cols + 3 * 2) * ch);
            for (auto& v : plain[q]) v = q == 0 ? static_cast<std::uint8_t>(255) : byte();  // row 0 at the extreme
            rows[q].assign(4 * ow * ch + 64, 0xEE);
            k.quad_bytes_u8(rows[q].data(), plain[q].data(), ch, ow, step * ch, partner, 0x80);
            for (std::size_t o = 0; o < ow; ++o)
              for (std::size_t c = 0; c < ch; ++c)
                for (std::size_t e = 0; e < 4; ++e)
                  ASSERT_EQ(rows[q][4 * (o * ch + c) + e], plain[q][o * step * ch + c + e * partner] ^ 0x80)
                      << "quad " << q << " column " << o << " channel " << c << " tap " << e;
            ASSERT_EQ(rows[q][4 * ow * ch], 0xEE) << "past the last quad";
            in.push_back(rows[q].data());
          }
          std::vector<std::int8_t> w(4 * quads * ch);
          for (auto& v : w) v = static_cast<std::int8_t>(byte());
          for (std::size_t i = 0; i < std::min<std::size_t>(w.size(), 8); ++i) w[i] = -128;  // the largest sums
          std::vector<std::int32_t> bias(ch);
          std::vector<float> mul(ch);
          for (std::size_t c = 0; c < ch; ++c) {
            bias[c] = c % 5 == 1 ? INT32_MAX - 100 : static_cast<std::int32_t>(rng() % 200001) - 100000;
            mul[c] = c % 3 == 0 ? std::ldexp(1.0f, -static_cast<int>(rng() % 12))  // ties
                                : std::ldexp(static_cast<float>(rng() % 1000 + 1), -16);
          }
          if (ch > 2) {
            mul[1] = 3e38f;  // a product of infinity, saturated
            mul[2] = -3e38f;
          }
          for (const bool is_signed : {false, true}) {
            const simd::DwRequant rq{bias.data(), mul.data(), is_signed ? -3 : 128, is_signed ? -128 : 0,
                                     is_signed ? 127 : 255};
            const std::size_t out_step = ch + 5;  // a channel slice of a wider y
            std::vector<std::uint8_t> got(ow * out_step, 0xAB), want(got);
            for (std::size_t o = 0; o < ow; ++o)
              for (std::size_t c = 0; c < ch; ++c) {
                auto a = static_cast<std::uint32_t>(bias[c]);
                for (std::size_t q = 0; q < quads; ++q)
                  for (std::size_t e = 0; e < 4; ++e)
                    a += static_cast<std::uint32_t>(in[q][4 * (o * ch + c) + e] * w[4 * (q * ch + c) + e]);
                volatile float product = static_cast<float>(static_cast<std::int32_t>(a)) * mul[c];
                const float v = std::min(std::max(static_cast<float>(product), -4194304.0f), 4194304.0f);
                const auto rounded = static_cast<std::int32_t>(std::nearbyint(v));  // half to even
                want[o * out_step + c] = static_cast<std::uint8_t>(std::min(std::max(rounded + rq.zero, rq.lo), rq.hi));
              }
            k.dw_rows_q8(got.data(), out_step, in.data(), w.data(), quads, ow, ch, ch, rq);
            for (std::size_t i = 0; i < got.size(); ++i)
              ASSERT_EQ(got[i], want[i]) << (is_signed ? "i8" : "u8") << " column " << i / out_step << " channel "
                                         << i % out_step;
          }
        }
}

TEST(TensorIsa, ExpIsWithinTwoUlpAndItsActivationsMatchTheScalarRule) {
  // Every 1/64 from -110 to 95, random points in between, and the edges.
  std::vector<float> xs;
  for (int k = -110 * 64; k <= 95 * 64; ++k) xs.push_back(static_cast<float>(k) / 64.0f);
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> u(-110.0f, 95.0f);
  for (int k = 0; k < 200000; ++k) xs.push_back(u(rng));
  for (float f : {88.7228317f, 88.7228394f, -87.3365479f, -103.972076f, -103.279f, 1e-8f, -1e-8f, 0.0f, -0.0f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN()})
    xs.push_back(f);
  const double smallest = std::ldexp(1.0, -149);
  double worst_ulp = 0;
  for (float x : xs) {
    const float got = simd::exp_f32(x);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(got));
      continue;
    }
    const double want = std::exp(static_cast<double>(x));
    if (want > std::numeric_limits<float>::max()) {
      ASSERT_TRUE(std::isinf(got) && got > 0) << x;
      continue;
    }
    ASSERT_TRUE(std::isfinite(got)) << x;
    // An ulp of the float nearest e^x (of the smallest subnormal below the normals).
    const double ulp = want < std::numeric_limits<float>::min()
                           ? smallest
                           : std::ldexp(1.0, std::ilogb(static_cast<float>(want)) - 23);
    const double err = std::fabs(got - want) / ulp;
    worst_ulp = std::max(worst_ulp, err);
    ASSERT_LE(err, 2.0) << "exp(" << x << ") = " << got << ", e^x = " << want;
  }
  std::printf("exp_f32: at most %.3f ulp over %zu arguments\n", worst_ulp, xs.size());
  // The vector activations give the scalar formula's bits at every level.
  for (Isa isa : levels_here()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    std::vector<float> sig(xs), silu(xs);
    simd::kernels(isa).sigmoid_f32(sig.data(), sig.size());
    simd::kernels(isa).silu_f32(silu.data(), silu.size());
    for (std::size_t i = 0; i < xs.size(); ++i) {
      if (std::isnan(xs[i])) {  // a NaN's sign and payload are not promised
        ASSERT_TRUE(std::isnan(sig[i]) && std::isnan(silu[i]));
        continue;
      }
      const float e = simd::exp_f32(-xs[i]);
      const float want_sig = 1.0f / (1.0f + e), want_silu = xs[i] / (1.0f + e);
      ASSERT_EQ(std::memcmp(&sig[i], &want_sig, 4), 0) << "sigmoid(" << xs[i] << ")";
      ASSERT_EQ(std::memcmp(&silu[i], &want_silu, 4), 0) << "silu(" << xs[i] << ")";
    }
    // Softmax's exponentials: the difference from the shift rounded first,
    // then the scalar exp's bits (a NaN shift or input gives NaN).
    for (const float shift : {0.0f, 3.5f, -20.25f, 88.0f}) {
      std::vector<float> ex(xs.size());
      simd::kernels(isa).exp_shifted_f32(xs.data(), ex.data(), xs.size(), shift);
      for (std::size_t i = 0; i < xs.size(); ++i) {
        const float want = simd::exp_f32(xs[i] - shift);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(ex[i])) << "exp(" << xs[i] << " - " << shift << ")";
          continue;
        }
        ASSERT_EQ(std::memcmp(&ex[i], &want, 4), 0) << "exp(" << xs[i] << " - " << shift << ")";
      }
    }
    // Every length to 131, past two steps of four AVX-512 vectors (the
    // loops run several vectors a step, then the rest), from an odd start;
    // nothing past the span is written.
    for (std::size_t n = 0; n <= 131; ++n) {
      std::vector<float> ex(n + 1, -7.0f);
      simd::kernels(isa).exp_shifted_f32(xs.data() + 1, ex.data(), n, 1.5f);
      for (std::size_t i = 0; i < n; ++i) {
        const float want = simd::exp_f32(xs[1 + i] - 1.5f);
        ASSERT_TRUE(std::isnan(want) ? std::isnan(ex[i]) : std::memcmp(&ex[i], &want, 4) == 0)
            << "exp_shifted, length " << n << ", element " << i;
      }
      ASSERT_EQ(ex[n], -7.0f) << "exp_shifted wrote past length " << n;
      std::vector<float> s2(xs.begin() + 1, xs.begin() + 1 + n + 1), l2(s2);
      simd::kernels(isa).sigmoid_f32(s2.data(), n);
      simd::kernels(isa).silu_f32(l2.data(), n);
      for (std::size_t i = 0; i <= n; ++i) {
        const float x = xs[1 + i], e = simd::exp_f32(-x);
        const float want_sig = i < n ? 1.0f / (1.0f + e) : x, want_silu = i < n ? x / (1.0f + e) : x;
        ASSERT_EQ(std::memcmp(&s2[i], &want_sig, 4), 0) << "sigmoid, length " << n << ", element " << i;
        ASSERT_EQ(std::memcmp(&l2[i], &want_silu, 4), 0) << "silu, length " << n << ", element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace tpuhal::sim::tensor

namespace tpuhal::sim::tensor {
namespace {

// Floats with NaNs, infinities, signed zeros and values on both sides of
// the activations' bends.
std::vector<float> activation_inputs() {
  std::vector<float> xs = {std::numeric_limits<float>::quiet_NaN(),
                           -std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           0.0f,
                           -0.0f,
                           3.0f,
                           -3.0f,
                           1e-40f,
                           -1e-40f};
  std::mt19937 rng(14);
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  for (int i = 0; i < 10000; ++i) xs.push_back(u(rng));
  return xs;
}

// The board's erf: within 2 ulp of erf over [0, 4.5] (every 61st float;
// past 3.92 it is 1; every float of [0, 4.5] measured 1.31 ulp at most,
// at 0.9943), odd (-0 keeps its sign), 1 at infinity, NaN for NaN; and the
// span loop gives the scalar's bits at every level and length.
TEST(TensorIsa, ErfIsWithinTwoUlpAndItsSpanLoopMatchesTheScalarAtEveryLevel) {
  double worst = 0;
  float worst_at = 0;
  for (std::uint32_t bits = 0; bits <= 0x40900000u; bits += 61) {
    float x;
    std::memcpy(&x, &bits, 4);
    const double want = std::erf(static_cast<double>(x));
    const auto near = static_cast<float>(want);
    // An ulp of the float nearest erf(x): the smaller one just below a
    // power of two; the smallest subnormal below the normals.
    double ulp = std::nextafter(near, 2.0f) - near;
    if (near > 0 && want < near) ulp = near - std::nextafter(near, 0.0f);
    if (near < std::numeric_limits<float>::min()) ulp = std::ldexp(1.0, -149);
    const double err = std::fabs(simd::erf_f32(x) - want) / ulp;
    if (err > worst) {
      worst = err;
      worst_at = x;
    }
    ASSERT_LE(err, 2.0) << "erf(" << x << ") = " << simd::erf_f32(x) << ", want " << want;
    const float neg = simd::erf_f32(-x);
    ASSERT_EQ(neg, -simd::erf_f32(x)) << x;
  }
  std::printf("erf_f32: at most %.3f ulp, at %.9g\n", worst, worst_at);
  EXPECT_TRUE(std::signbit(simd::erf_f32(-0.0f)));
  EXPECT_EQ(simd::erf_f32(std::numeric_limits<float>::infinity()), 1.0f);
  EXPECT_EQ(simd::erf_f32(-std::numeric_limits<float>::infinity()), -1.0f);
  EXPECT_EQ(simd::erf_f32(1e30f), 1.0f);
  EXPECT_TRUE(std::isnan(simd::erf_f32(std::numeric_limits<float>::quiet_NaN())));
  std::vector<float> xs = activation_inputs();
  for (int i = -4000; i <= 4000; ++i) xs.push_back(static_cast<float>(i) / 997.0f);
  for (Isa isa : levels_here()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    std::vector<float> got(xs);
    simd::kernels(isa).erf_f32s(got.data(), got.size());
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const float want = simd::erf_f32(xs[i]);
      ASSERT_TRUE(std::isnan(want) ? std::isnan(got[i]) : std::memcmp(&got[i], &want, 4) == 0)
          << "erf(" << xs[i] << ")";
    }
    for (std::size_t n = 0; n <= 131; ++n) {
      std::vector<float> span(xs.end() - static_cast<std::ptrdiff_t>(n) - 1, xs.end());
      simd::kernels(isa).erf_f32s(span.data(), n);
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(span[i], simd::erf_f32(xs[xs.size() - n - 1 + i])) << "length " << n << ", element " << i;
      ASSERT_EQ(span[n], xs.back()) << "erf_f32s wrote past length " << n;
    }
  }
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {  // a NaN's sign and payload are not promised
      ASSERT_TRUE(std::isnan(got[i])) << what << ", element " << i;
      continue;
    }
    ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0)
        << what << ", element " << i << ": " << got[i] << ", not " << want[i];
  }
}

TEST(TensorIsa, ActivationLoopsMatchTheScalarRulesAtEveryLevel) {
  const std::vector<float> xs = activation_inputs();
  const float alpha = 0.2f, beta = 0.5f, lo = -1.5f, hi = 6.0f;
  std::vector<float> relu(xs), clip(xs), leaky(xs), hsig(xs), hswish(xs);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const float p = xs[i];
    relu[i] = p > 0 ? p : 0.0f;
    clip[i] = std::min(std::max(p, lo), hi);
    volatile float scaled = alpha * p;  // each product rounded, never fused with the sum
    leaky[i] = p < 0 ? static_cast<float>(scaled) : p;
    const float gate = std::min(std::max(static_cast<float>(scaled) + beta, 0.0f), 1.0f);
    hsig[i] = gate;
    hswish[i] = p * gate;
  }
  for (Isa isa : levels_here()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    const simd::Kernels& k = simd::kernels(isa);
    std::vector<float> got(xs);
    k.relu_f32(got.data(), got.size());
    expect_same_bits(got, relu, "relu");
    got = xs;
    k.clip_f32(got.data(), got.size(), lo, hi);
    expect_same_bits(got, clip, "clip");
    got = xs;
    k.leaky_relu_f32(got.data(), got.size(), alpha);
    expect_same_bits(got, leaky, "leaky relu");
    got = xs;
    k.hard_sigmoid_f32(got.data(), got.size(), alpha, beta);
    expect_same_bits(got, hsig, "hard sigmoid");
    got = xs;
    k.hard_swish_f32(got.data(), got.size(), alpha, beta);
    expect_same_bits(got, hswish, "hard swish");
  }
}

// simd.h's yuv_row_f32 as written there, each product rounded on its own.
float yuv_channel(std::size_t k, std::uint8_t luma, std::uint8_t u8, std::uint8_t v8, float mean, float scale) {
  const float u = static_cast<float>(u8) - 128.0f, v = static_cast<float>(v8) - 128.0f;
  volatile float y = 1.164f * (static_cast<float>(luma) - 16.0f);
  volatile float rv = 1.596f * v, gv = 0.813f * v, gu = 0.391f * u, bu = 2.018f * u;
  volatile float g = y - gv;
  const float c = k == 0 ? y + rv : k == 1 ? g - gu : y + bu;
  volatile float shifted = std::min(std::max(c, 0.0f), 255.0f) - mean;
  return shifted * scale;
}

TEST(TensorIsa, ColourRowsGiveTheScalarBitsForEveryStepWidthAndLevel) {
  std::mt19937 rng(11);
  const float mean[3] = {123.675f, 116.28f, 103.53f}, scale[3] = {1 / 58.395f, 1 / 57.12f, 1 / 57.375f};
  for (std::size_t step : {0, 1, 2, 3}) {
    for (std::size_t n : {1, 2, 31, 64, 257, 1920}) {
      std::vector<std::uint8_t> luma(n), u(((n + 1) / 2) * std::max<std::size_t>(step, 1) + 1), v(u.size());
      for (auto& b : luma) b = static_cast<std::uint8_t>(rng());
      for (std::size_t i = 0; i < u.size(); ++i) {
        u[i] = static_cast<std::uint8_t>(rng());
        v[i] = static_cast<std::uint8_t>(rng());
      }
      if (n == 1920)  // every luma value, with several chroma samples each
        for (std::size_t i = 0; i < n; ++i) luma[i] = static_cast<std::uint8_t>(i);
      std::vector<float> want(3 * n);
      for (std::size_t k = 0; k < 3; ++k)
        for (std::size_t i = 0; i < n; ++i)
          want[k * n + i] = yuv_channel(k, luma[i], u[i / 2 * step], v[i / 2 * step], mean[k], scale[k]);
      for (Isa isa : levels_here()) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " step " + std::to_string(step) + " n " + std::to_string(n));
        std::vector<float> got(3 * n, -1.0f);
        simd::kernels(isa).yuv_row_f32(luma.data(), u.data(), v.data(), step, n, mean, scale, got.data());
        expect_same_bits(got, want, "yuv row");
      }
    }
  }
}

TEST(TensorIsa, ArithmeticRowsGiveTheScalarBitsApartInPlaceAndOverlapping) {
  // + - * / over dense rows and single values, with NaN, infinities, zeros
  // of both signs and subnormals among the values; y apart from a and b, y
  // the same as a or as b (in place), and y overlapping a one element on.
  std::mt19937 rng(23);
  const std::size_t n = 1000;
  std::vector<float> a(n + 1), b(n + 1);
  std::uniform_real_distribution<float> any(-1e3f, 1e3f);
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-40f, 3e38f};
  for (std::size_t i = 0; i <= n; ++i) {
    a[i] = i % 17 == 0 ? specials[i / 17 % 8] : any(rng);
    b[i] = i % 13 == 0 ? specials[i / 13 % 8] : any(rng);
  }
  using simd::Arith;
  auto scalar = [](Arith op, float u, float v) {
    switch (op) {
      case Arith::kAdd: return u + v;
      case Arith::kSub: return u - v;
      case Arith::kMul: return u * v;
      case Arith::kDiv: return u / v;
    }
    return 0.0f;
  };
  for (Isa isa : levels_here()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    const simd::Kernels& k = simd::kernels(isa);
    for (Arith op : {Arith::kAdd, Arith::kSub, Arith::kMul, Arith::kDiv})
      for (std::size_t sa : {0u, 1u})
        for (std::size_t sb : {0u, 1u}) {
          std::vector<float> want(n);
          for (std::size_t i = 0; i < n; ++i) want[i] = scalar(op, a[i * sa], b[i * sb]);
          std::vector<float> y(n);
          k.arith_f32(op, y.data(), a.data(), sa, b.data(), sb, n);
          expect_same_bits(y, want, "apart");
          if (sa == 1) {
            std::vector<float> in_place(a.begin(), a.begin() + n);
            k.arith_f32(op, in_place.data(), in_place.data(), 1, b.data(), sb, n);
            expect_same_bits(in_place, want, "in place of a");
          }
          if (sb == 1) {
            std::vector<float> in_place(b.begin(), b.begin() + n);
            k.arith_f32(op, in_place.data(), a.data(), sa, in_place.data(), 1, n);
            expect_same_bits(in_place, want, "in place of b");
          }
          if (sa == 1) {
            // y one element before a, in the same buffer: each y[i] is
            // written after a[i] (= the buffer's i + 1) is read.
            std::vector<float> buf(a), shifted(n);
            for (std::size_t i = 0; i < n; ++i) shifted[i] = scalar(op, a[i + 1], b[i * sb]);
            k.arith_f32(op, buf.data(), buf.data() + 1, 1, b.data(), sb, n);
            expect_same_bits(std::vector<float>(buf.begin(), buf.begin() + n), shifted, "overlapping");
          }
        }
  }
}

TEST(TensorIsa, ATableLookupGivesEachBytesEntryAtEveryLevelAndEveryLength) {
  // Every index (0 to 255, so both halves of the table and bit 7), lengths
  // around the 64-byte blocks of the VBMI version, and offsets that leave
  // the input and output unaligned; the bytes past each output untouched.
  std::mt19937 rng(21);
  std::uint8_t table[256];
  for (auto& t : table) t = static_cast<std::uint8_t>(rng());
  std::vector<std::uint8_t> in(1000);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::uint8_t>(i < 256 ? i : rng());
  for (Isa isa : levels_here()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    const simd::Kernels& k = simd::kernels(isa);
    for (std::size_t n : {0u, 1u, 63u, 64u, 65u, 127u, 128u, 255u, 256u, 257u, 999u}) {
      for (std::size_t at : {0u, 1u}) {
        if (at + n > in.size()) continue;
        std::vector<std::uint8_t> out(n + 2, 0xA5);
        k.lookup_u8(table, in.data() + at, out.data() + 1, n);
        ASSERT_EQ(out.front(), 0xA5);
        ASSERT_EQ(out.back(), 0xA5) << "n " << n;
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(out[1 + i], table[in[at + i]]) << "n " << n << ", i " << i;
      }
    }
  }
}

// interleave_8 and interleave_32 (a transpose's tiles: NCHW planes into
// NHWC pixels, a channel shuffle's groups into each pixel's channels):
// out[p * out_step + i * lines + j] = in[p * in_step + i + j * stride] for
// 2, 3 and 4 lines (the shuffles) and 5 (the plain loop), one plane or
// several, lengths that leave every vector tail, planes apart in out or
// each right after the last, and nothing written between the planes or
// past the last.
template <class T, class Interleave>
void check_interleaving(Interleave interleave, std::mt19937& rng) {
  for (const std::size_t lines : {std::size_t{2}, std::size_t{3}, std::size_t{4}, std::size_t{5}})
    for (const std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{24}, std::size_t{31},
                                std::size_t{64}, std::size_t{100}, std::size_t{341}})
      for (const std::size_t planes : {std::size_t{1}, std::size_t{5}, std::size_t{6}})
        for (const std::size_t gap : {std::size_t{0}, std::size_t{2}}) {
          const std::size_t stride = n + 9, in_step = lines * stride + 3, out_step = lines * n + gap;
          // in ends at the view's last element: a read past it is one past the vector.
          std::vector<T> in((planes - 1) * in_step + (lines - 1) * stride + n);
          std::vector<T> out(planes * out_step + 7, static_cast<T>(0xa5a5a5a5u));
          for (auto& b : in) b = static_cast<T>(rng());
          interleave(out.data(), in.data(), stride, n, lines, planes, out_step, in_step);
          std::vector<T> want(out.size(), static_cast<T>(0xa5a5a5a5u));
          for (std::size_t p = 0; p < planes; ++p)
            for (std::size_t i = 0; i < n; ++i)
              for (std::size_t j = 0; j < lines; ++j)
                want[p * out_step + i * lines + j] = in[p * in_step + i + j * stride];
          ASSERT_EQ(out, want) << sizeof(T) << "-byte elements, " << lines << " lines of " << n << ", " << planes
                               << " planes " << gap << " apart";
        }
}

TEST(TensorIsa, InterleavingGivesEachPlanesLinesInPixelOrderAtEveryLevel) {
  std::mt19937 rng(31);
  for (Isa isa : levels_here()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    const simd::Kernels& k = simd::kernels(isa);
    check_interleaving<std::uint8_t>(k.interleave_8, rng);
    check_interleaving<std::uint32_t>(k.interleave_32, rng);
  }
}

TEST(TensorIsa, IntegerLoopsAndRequantisationMatchTheScalarRulesAtEveryLevel) {
  std::mt19937 rng(15);
  const std::size_t n = 200003;  // past sum_abs_i8's blocks of 65536
  std::vector<std::int8_t> bytes(n);
  for (auto& b : bytes) b = static_cast<std::int8_t>(rng());
  bytes[0] = -128;
  std::vector<std::int32_t> acc(n), add(n);
  for (std::size_t i = 0; i < n; ++i) {
    acc[i] = static_cast<std::int32_t>(rng());
    add[i] = static_cast<std::int32_t>(rng());
  }
  std::uint64_t want_total = 0;
  std::int64_t want_signed = 0, want_signed_part = 0;
  for (std::size_t i = 0; i < n; ++i) want_signed += bytes[i];
  for (std::size_t i = 1; i <= 70000; ++i) want_signed_part += bytes[i];
  std::vector<std::int32_t> want_sum(n);
  std::vector<std::uint32_t> want_abs(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int32_t b = bytes[i];
    want_total += static_cast<std::uint64_t>(b < 0 ? -b : b);
    want_abs[i] = static_cast<std::uint32_t>(i) + static_cast<std::uint32_t>(b < 0 ? -b : b);
    want_sum[i] = static_cast<std::int32_t>(static_cast<std::uint32_t>(acc[i]) + static_cast<std::uint32_t>(add[i]));
  }
  // Requantisation: accumulators and multipliers with products up to and
  // past 2^22, halfway cases, both byte types.
  const std::size_t m = 4099;
  std::vector<std::int32_t> q_acc(m);
  std::vector<float> mul(m);
  std::uniform_real_distribution<float> scale(0.0f, 4.0f);
  for (std::size_t i = 0; i < m; ++i) {
    q_acc[i] = static_cast<std::int32_t>(rng() % 4000001) - 2000000;
    mul[i] = i % 5 == 0 ? 0.5f : i % 7 == 0 ? 8.0f : scale(rng);
    if (i % 11 == 0) q_acc[i] = static_cast<std::int32_t>(i) - 2000;  // small values, many ties at 0.5
  }
  // Biases: small ones, and a few that wrap the int32 sum around.
  std::vector<std::int32_t> q_bias(m);
  for (std::size_t i = 0; i < m; ++i)
    q_bias[i] =
        i % 13 == 0 ? INT32_MAX - static_cast<std::int32_t>(i) : static_cast<std::int32_t>(rng() % 20001) - 10000;
  struct Range {
    std::int32_t zero, lo, hi;
  };
  for (Isa isa : levels_here()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    const simd::Kernels& k = simd::kernels(isa);
    EXPECT_EQ(k.sum_abs_i8(bytes.data(), n), want_total);
    EXPECT_EQ(k.sum_i8(bytes.data(), n), want_signed);
    EXPECT_EQ(k.sum_i8(bytes.data() + 1, 70000), want_signed_part);
    std::vector<std::uint32_t> sums(n);
    for (std::size_t i = 0; i < n; ++i) sums[i] = static_cast<std::uint32_t>(i);
    k.add_abs_i8(sums.data(), bytes.data(), n);
    ASSERT_EQ(sums, want_abs);
    std::vector<std::int32_t> out(acc);
    k.add_i32(out.data(), add.data(), n);
    ASSERT_EQ(out, want_sum);
    // An input's nibbles, and sums over them put back together.
    std::vector<std::uint8_t> high(n), low(n);
    const auto* u = reinterpret_cast<const std::uint8_t*>(bytes.data());
    k.split_nibbles(u, high.data(), low.data(), n);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(std::make_pair(high[i], low[i]),
                std::make_pair(static_cast<std::uint8_t>(u[i] / 16), static_cast<std::uint8_t>(u[i] % 16)))
          << "byte " << i;
    out = acc;
    k.join_nibble_sums(out.data(), add.data(), n);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(out[i], static_cast<std::int32_t>(static_cast<std::int64_t>(acc[i]) * 16 + add[i])) << "element " << i;
    for (const Range r : {Range{128, 0, 255}, Range{-3, -128, 127}})
      for (const bool with_bias : {false, true}) {
        std::vector<std::uint8_t> got(m);
        k.requantize_u8(q_acc.data(), with_bias ? q_bias.data() : nullptr, mul.data(), got.data(), m, r.zero, r.lo,
                        r.hi);
        for (std::size_t i = 0; i < m; ++i) {
          const auto a = with_bias ? static_cast<std::int32_t>(static_cast<std::uint32_t>(q_acc[i]) +
                                                               static_cast<std::uint32_t>(q_bias[i]))
                                   : q_acc[i];
          volatile float product = static_cast<float>(a) * mul[i];
          const float v = std::min(std::max(static_cast<float>(product), -4194304.0f), 4194304.0f);
          const auto rounded = static_cast<std::int32_t>(std::nearbyint(v));  // half to even
          const std::int32_t want = std::min(std::max(rounded + r.zero, r.lo), r.hi);
          ASSERT_EQ(got[i], static_cast<std::uint8_t>(want))
              << a << " * " << mul[i] << ", zero " << r.zero << (with_bias ? ", with a bias" : "");
        }
      }
  }
}

// An integer convolution's dot products of one position with rows of s8
// weights: the exact sums, wrapped to int32, at every level, for lengths
// that leave every vector tail, rows that are not a multiple of any
// block, and the extremes (an input less its zero point is within
// [-255, 255]; the loop takes any int16).
TEST(TensorIsa, IntegerDotRowsGiveTheExactSumsWrappedToInt32AtEveryLevel) {
  std::mt19937 rng(23);
  for (const std::size_t n :
       {std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{33}, std::size_t{1280}, std::size_t{70001}})
    for (const int fill : {0, 1, 2}) {  // random; every product -32768 * -128 (wraps past 2^31); 255 * 127
      const std::size_t rows = 7, stride = n + 3;
      std::vector<std::int16_t> x(n);
      std::vector<std::int8_t> w(rows * stride);
      for (auto& v : x)
        v = fill == 1   ? std::int16_t{-32768}
            : fill == 2 ? std::int16_t{255}
                        : static_cast<std::int16_t>(static_cast<int>(rng() % 511) - 255);
      for (auto& v : w)
        v = fill == 1 ? std::int8_t{-128} : fill == 2 ? std::int8_t{127} : static_cast<std::int8_t>(rng());
      std::vector<std::int32_t> want(rows);
      for (std::size_t r = 0; r < rows; ++r) {
        std::int64_t s = 0;
        for (std::size_t i = 0; i < n; ++i) s += std::int64_t{x[i]} * w[r * stride + i];
        want[r] = static_cast<std::int32_t>(static_cast<std::uint32_t>(static_cast<std::uint64_t>(s)));
      }
      for (Isa isa : levels_here()) {
        SCOPED_TRACE(std::string(isa_name(isa)) + ", " + std::to_string(n) + " long, fill " + std::to_string(fill));
        std::vector<std::int32_t> got(rows + 1, 12345);  // one past the rows stays as it was
        simd::kernels(isa).dot_rows_i8(got.data(), x.data(), w.data(), stride, n, rows);
        EXPECT_EQ(std::vector<std::int32_t>(got.begin(), got.begin() + rows), want);
        EXPECT_EQ(got[rows], 12345);
      }
    }
}

// Quantize and dequantize with one scale: the scalar rules of the ops
// (numerics.h's round_saturate, ties to even, NaN as 0) for values around
// every tie, past the byte's range and past 2^22, infinities and NaN, at
// lengths that leave every vector tail.
TEST(TensorIsa, QuantizeAndDequantizeLoopsMatchTheScalarRulesAtEveryLevel) {
  std::mt19937 rng(43);
  std::uniform_real_distribution<float> wide(-400.0f, 400.0f);
  std::vector<float> in;
  for (int k = -300; k <= 300; ++k) in.push_back(static_cast<float>(k) * 0.5f);  // every half: ties
  for (float v : {0.0f, -0.0f, 4194303.5f, 4194304.5f, -4194305.0f, 1e30f, -1e30f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min()})
    in.push_back(v);
  while (in.size() < 2053) in.push_back(wide(rng));
  struct Scale {
    float scale;
    std::int32_t zero, lo, hi;
  };
  std::vector<std::uint8_t> bytes(in.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(rng());
  for (Isa isa : levels_here()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    const simd::Kernels& k = simd::kernels(isa);
    for (const Scale c :
         {Scale{0.5f, 128, 0, 255}, Scale{1.0f, 0, 0, 255}, Scale{0.0371f, -5, -128, 127}, Scale{3.0f, 255, 0, 255},
          // bounds narrower than the type's, the zero point below or above them (NaN gives a bound)
          Scale{0.25f, 10, 20, 200}, Scale{0.5f, 100, 0, 60}})
      for (const std::size_t n : {in.size(), std::size_t{1}, std::size_t{7}, std::size_t{33}}) {
        std::vector<std::uint8_t> got(n, 0xAA);
        k.quantize_f32(in.data(), got.data(), n, c.scale, c.zero, c.lo, c.hi);
        for (std::size_t i = 0; i < n; ++i) {
          volatile float quotient = in[i] / c.scale;
          const std::int32_t q = round_saturate(quotient, INT32_MIN / 2, INT32_MAX / 2) + c.zero;
          ASSERT_EQ(got[i], static_cast<std::uint8_t>(std::min(std::max(q, c.lo), c.hi)))
              << in[i] << " / " << c.scale << " + " << c.zero;
        }
        for (const bool is_signed : {false, true}) {
          std::vector<float> f(n);
          k.dequantize_8(bytes.data(), f.data(), n, is_signed, c.scale, c.zero);
          for (std::size_t i = 0; i < n; ++i) {
            const std::int64_t x = is_signed ? static_cast<std::int8_t>(bytes[i]) : bytes[i];
            ASSERT_EQ(f[i], static_cast<float>(x - c.zero) * c.scale) << int(bytes[i]) << (is_signed ? " i8" : " u8");
          }
        }
      }
  }
}

// qadd_8 (the qlinear_add op): dequantize, add and quantize with the
// scalar rules, each step one f32 operation, at every level, for every
// signedness and lengths with tails; every pair of bytes in the first run.
TEST(TensorIsa, QuantizedAddLoopMatchesTheScalarRulesAtEveryLevel) {
  std::vector<std::uint8_t> a, b;
  for (int x = 0; x < 256; ++x)
    for (int y = 0; y < 256; ++y) {
      a.push_back(static_cast<std::uint8_t>(x));
      b.push_back(static_cast<std::uint8_t>(y));
    }
  for (Isa isa : levels_here()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    const simd::Kernels& k = simd::kernels(isa);
    // Powers of two give exact ties; 0.0371 and 0.013 do not.
    for (const simd::QAddParams p : {simd::QAddParams{false, false, 0.5f, 0.25f, 1.0f, 128, 3, 7, 0, 255},
                                     simd::QAddParams{true, false, 0.0371f, 0.013f, 0.05f, -5, 128, 0, 0, 255},
                                     simd::QAddParams{false, true, 0.02f, 0.125f, 0.0625f, 0, -128, -3, -128, 127},
                                     simd::QAddParams{true, true, 3.0f, 2.0f, 0.5f, 127, -128, 100, -128, 127}})
      for (const std::size_t n : {a.size(), std::size_t{1}, std::size_t{7}, std::size_t{33}}) {
        std::vector<std::uint8_t> got(n, 0xAA);
        k.qadd_8(a.data(), b.data(), got.data(), n, p);
        for (std::size_t i = 0; i < n; ++i) {
          const std::int32_t x = p.a_signed ? static_cast<std::int8_t>(a[i]) : a[i];
          const std::int32_t y = p.b_signed ? static_cast<std::int8_t>(b[i]) : b[i];
          volatile float fa = static_cast<float>(x - p.a_zero) * p.a_scale;
          volatile float fb = static_cast<float>(y - p.b_zero) * p.b_scale;
          volatile float sum = fa + fb;
          volatile float quotient = sum / p.y_scale;
          const std::int32_t q = round_saturate(quotient, INT32_MIN / 2, INT32_MAX / 2) + p.y_zero;
          ASSERT_EQ(got[i], static_cast<std::uint8_t>(std::min(std::max(q, p.lo), p.hi)))
              << x << " and " << y << " (" << i << " of " << n << ")";
        }
      }
  }
}

// qmul_8 (the qlinear_mul op's step): a byte dequantized, times a float,
// the product quantized, each step one f32 operation with the scalar
// rules, at every level, for both signednesses and lengths with tails;
// every byte against floats of every magnitude and sign, zeros, the
// smallest normals, infinities and NaN (a product past f32 saturates, a
// NaN quantizes as 0 before the zero point).
TEST(TensorIsa, QuantizedMulLoopMatchesTheScalarRulesAtEveryLevel) {
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> mag(-40.0f, 40.0f);
  const float special[] = {0.0f,
                           -0.0f,
                           1.0f,
                           -1.0f,
                           0.5f,
                           1.17549435e-38f,
                           3.0e38f,
                           -3.0e38f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
  std::vector<std::uint8_t> x;
  std::vector<float> f;
  for (int b = 0; b < 256; ++b)
    for (int j = 0; j < 24; ++j) {
      x.push_back(static_cast<std::uint8_t>(b));
      f.push_back(j < 11 ? special[j] : std::ldexp(1.0f, static_cast<int>(mag(rng))) * mag(rng));
    }
  for (Isa isa : levels_here()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    const simd::Kernels& k = simd::kernels(isa);
    // Powers of two give exact ties; 0.0371 and 0.013 do not.
    for (const simd::QMulParams p :
         {simd::QMulParams{false, 0.5f, 1.0f, 128, 3, 0, 255}, simd::QMulParams{true, 0.0371f, 0.013f, -5, 7, 0, 255},
          simd::QMulParams{false, 0.125f, 0.0625f, 0, -3, -128, 127},
          simd::QMulParams{true, 3.0f, 0.5f, 127, 100, -128, 127}})
      for (const std::size_t n : {x.size(), std::size_t{1}, std::size_t{7}, std::size_t{33}, std::size_t{100}}) {
        std::vector<std::uint8_t> got(n + 1, 0xAA);
        k.qmul_8(x.data(), f.data(), got.data(), n, p);
        ASSERT_EQ(got[n], 0xAA) << "written past " << n;
        for (std::size_t i = 0; i < n; ++i) {
          const std::int32_t v = p.x_signed ? static_cast<std::int8_t>(x[i]) : x[i];
          volatile float fx = static_cast<float>(v - p.x_zero) * p.x_scale;
          volatile float product = fx * f[i];
          volatile float quotient = product / p.y_scale;
          const std::int32_t q = round_saturate(quotient, INT32_MIN / 2, INT32_MAX / 2) + p.y_zero;
          ASSERT_EQ(got[i], static_cast<std::uint8_t>(std::min(std::max(q, p.lo), p.hi)))
              << int(x[i]) << " times " << f[i] << " (" << i << " of " << n << ")";
        }
      }
  }
}

// add_dequantized_8 (qlinear_global_avg_pool's sums): each byte
// dequantized, (x - zero) * scale rounded, then added, rounded, row after
// row: the bits of dequantize_8 and an f32 add per tap, at every level;
// every byte in both signednesses, scales that overflow to infinity and
// that underflow, row lengths that leave every vector tail and take every
// block of sums the kernel holds in registers (64, 16, 4 and 1 at a time),
// and nothing touched past n.
TEST(TensorIsa, DequantizedSumsMatchTheScalarStepsAtEveryLevel) {
  std::mt19937 rng(22);
  std::uniform_real_distribution<float> start(-1000.0f, 1000.0f);
  for (Isa isa : levels_here()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    const simd::Kernels& k = simd::kernels(isa);
    for (const bool is_signed : {false, true})
      for (const float scale : {0.0371f, 0.5f, 3.0e37f, 1.0e-40f})
        for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{16}, std::size_t{33}, std::size_t{64},
                                    std::size_t{85}, std::size_t{150}})
          for (const std::size_t rows : {std::size_t{1}, std::size_t{3}, std::size_t{300}}) {
            const std::size_t stride = n + 5;
            const std::int32_t zero = is_signed ? -7 : 131;
            std::vector<std::uint8_t> x(rows * stride);
            for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::uint8_t>(i * 37 + rows);
            std::vector<float> acc(n + 1), want(n + 1);
            for (std::size_t i = 0; i < n; ++i) acc[i] = want[i] = start(rng);
            acc[n] = want[n] = 42.0f;
            k.add_dequantized_8(acc.data(), x.data(), n, rows, stride, is_signed, scale, zero);
            for (std::size_t r = 0; r < rows; ++r)
              for (std::size_t i = 0; i < n; ++i) {
                const std::uint8_t b = x[r * stride + i];
                const std::int32_t v = is_signed ? static_cast<std::int8_t>(b) : b;
                volatile float term = static_cast<float>(v - zero) * scale;
                volatile float sum = want[i] + term;
                want[i] = sum;
              }
            for (std::size_t i = 0; i <= n; ++i)
              ASSERT_EQ(std::memcmp(&acc[i], &want[i], 4), 0)
                  << acc[i] << " against " << want[i] << " at " << i << " of " << n << ", " << rows << " rows";
          }
  }
}

// add_rows_f32 (the f32 global average pool's sums): row after row, each
// element one f32 addition, the bits of add_strided_f32 tap by tap, at
// every level; NaN, infinities of both signs (their sum a NaN), -0, values
// that overflow and that lose their low bits, row lengths that leave every
// vector tail, and nothing touched past n.
TEST(TensorIsa, RowSumsMatchTheScalarStepsAtEveryLevel) {
  std::mt19937 rng(23);
  const float specials[] = {std::nanf(""), INFINITY, -INFINITY, -0.0f, 3.0e38f, 1.0e-40f, 16777217.0f};
  for (Isa isa : levels_here()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    const simd::Kernels& k = simd::kernels(isa);
    for (const std::size_t n : {1u, 7u, 16u, 33u, 64u, 100u})
      for (const std::size_t rows : {1u, 3u, 300u}) {
        const std::size_t stride = n + 5;
        std::vector<float> x(rows * stride);
        for (auto& v : x)
          v = rng() % 11 == 0 ? specials[rng() % 7] : static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 7.0f;
        std::vector<float> acc(n + 1), want(n + 1);
        for (std::size_t i = 0; i < n; ++i) acc[i] = want[i] = static_cast<float>(rng() % 1000) / 3.0f;
        acc[n] = want[n] = 42.0f;
        k.add_rows_f32(acc.data(), x.data(), n, rows, stride);
        for (std::size_t r = 0; r < rows; ++r)
          for (std::size_t i = 0; i < n; ++i) {
            volatile float sum = want[i] + x[r * stride + i];
            want[i] = sum;
          }
        // A NaN's sign and payload are whichever operand the compiler put
        // first (addition commutes); any NaN is the same value here.
        for (std::size_t i = 0; i <= n; ++i)
          ASSERT_TRUE(std::memcmp(&acc[i], &want[i], 4) == 0 || (std::isnan(acc[i]) && std::isnan(want[i])))
              << acc[i] << " against " << want[i] << " at " << i << " of " << n << ", " << rows << " rows";
      }
  }
}

// add_rows_f16 and add_rows_bf16 (a half or bf16 global average pool's
// sums): each element widened by fw/half.h's rule, then the f32 steps of
// add_rows_f32, at every level; every kind of half among the values (NaNs
// signalling and quiet, infinities, subnormals), row lengths that leave
// every vector tail, and nothing touched past n.
TEST(TensorIsa, HalfRowSumsWidenThenMatchTheScalarStepsAtEveryLevel) {
  std::mt19937 rng(29);
  const std::uint16_t specials[] = {0x7C01, 0x7E00, 0xFC00, 0x7C00, 0x8000, 0x0001, 0x03FF, 0x7BFF};
  for (Isa isa : levels_here()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    const simd::Kernels& k = simd::kernels(isa);
    for (const bool bf16 : {false, true})
      for (const std::size_t n : {1u, 7u, 8u, 16u, 33u, 64u, 100u})
        for (const std::size_t rows : {1u, 3u, 300u}) {
          SCOPED_TRACE((bf16 ? "bf16 n " : "f16 n ") + std::to_string(n) + " rows " + std::to_string(rows));
          const std::size_t stride = n + 5;
          std::vector<std::uint16_t> x(rows * stride);
          for (auto& v : x) v = rng() % 13 == 0 ? specials[rng() % 8] : static_cast<std::uint16_t>(rng() & 0xFFFF);
          std::vector<float> acc(n + 1), want(n + 1);
          for (std::size_t i = 0; i < n; ++i) acc[i] = want[i] = static_cast<float>(rng() % 1000) / 3.0f;
          acc[n] = want[n] = 42.0f;
          (bf16 ? k.add_rows_bf16 : k.add_rows_f16)(acc.data(), x.data(), n, rows, stride);
          for (std::size_t r = 0; r < rows; ++r)
            for (std::size_t i = 0; i < n; ++i) {
              const std::uint16_t h = x[r * stride + i];
              volatile float sum = want[i] + (bf16 ? fw::bf16_to_f32(h) : fw::f16_to_f32(h));
              want[i] = sum;
            }
          for (std::size_t i = 0; i <= n; ++i)
            ASSERT_TRUE(std::memcmp(&acc[i], &want[i], 4) == 0 || (std::isnan(acc[i]) && std::isnan(want[i])))
                << acc[i] << " against " << want[i] << " at " << i;
        }
  }
}

// The versions the entry points run follow the level, not the CPU alone:
// capped at the lowest level every entry point runs its baseline version,
// at the top its top one, and at each level between the version that level
// was built for (x86-64: sse2, sse41, avx2, avx512; avx512_vnni runs
// avx512's; elsewhere one version for every level).
Isa own_version(Isa isa) {
#if defined(__x86_64__)
  return isa == Isa::kAvx512Vnni ? Isa::kAvx512 : isa;
#else
  (void)isa;
  return Isa::kGeneric;
#endif
}

std::string version_name(std::optional<Isa> isa) { return isa ? std::string(isa_name(*isa)) : "none"; }

class SimdLevel : public ::testing::Test {
 protected:
  void TearDown() override { simd::use_level(isa_from_env()); }  // as the process started
};

TEST_F(SimdLevel, CappedAtTheLowestLevelEveryVectorEntryPointRunsItsBaselineVersion) {
  const Isa lowest = levels_here().front();
#if defined(__x86_64__)
  ASSERT_EQ(lowest, Isa::kSse2);
#endif
  simd::use_level(lowest);
  ASSERT_EQ(simd::entry_points().size(), 43u);
  for (std::string_view e : simd::entry_points()) {
    EXPECT_EQ(version_name(simd::version(e)), isa_name(lowest)) << e;
    EXPECT_EQ(version_name(simd::version(e, lowest)), isa_name(lowest)) << e;
  }
}

TEST_F(SimdLevel, AtTheTopLevelEveryVectorEntryPointRunsItsTopVersion) {
  const Isa top = isa_detected();
  simd::use_level(top);
  for (std::string_view e : simd::entry_points()) {
    EXPECT_EQ(version_name(simd::version(e)), isa_name(own_version(top))) << e;
    EXPECT_EQ(version_name(simd::version(e, top)), isa_name(own_version(top))) << e;
  }
  std::printf("the vector entry points at %s run %s's versions\n", std::string(isa_name(top)).c_str(),
              std::string(isa_name(own_version(top))).c_str());
}

TEST_F(SimdLevel, AtEveryLevelEveryVectorEntryPointRunsThatLevelsVersion) {
  for (Isa isa : levels_here()) {
    simd::use_level(isa);
    EXPECT_EQ(&simd::active(), &simd::kernels(isa));
    EXPECT_EQ(isa_name(simd::kernels(isa).isa), isa_name(own_version(isa)));
    for (std::string_view e : simd::entry_points()) {
      EXPECT_EQ(version_name(simd::version(e)), isa_name(own_version(isa))) << e << " at " << isa_name(isa);
    }
  }
  EXPECT_EQ(simd::version("no_such_loop"), std::nullopt);
  EXPECT_EQ(simd::version("no_such_loop", isa_detected()), std::nullopt);
}

// Without use_level, the level is isa_from_env()'s: scripts/test.sh runs
// this with TPUHAL_MAX_ISA at every level below the CPU's.
TEST(TensorIsa, VectorEntryPointsRunTheLevelTpuhalMaxIsaGives) {
  const Isa level = isa_from_env();
  for (std::string_view e : simd::entry_points())
    EXPECT_EQ(version_name(simd::version(e)), isa_name(own_version(level))) << e;
}

// An op estimated to take less than kSerialBelowNs on one thread runs on
// one: a parallel region's start and barrier would cost more. Where
// TPUHAL_SIM_SERIAL_BELOW_NS says otherwise (0: never), the pool follows
// it; a value that is not a number keeps the default.
TEST(TensorEngine, ASmallOpRunsOnOneThreadAndALargeOneOnTheTeam) {
  ::setenv("TPUHAL_SIM_FIXED_THREADS", "1", 1);  // no shrinking of the team under load
  struct Want {
    const char* env;
    std::uint64_t below;
  };
  for (const Want& w : {Want{nullptr, WorkerPool::kSerialBelowNs}, Want{"0", 0}, Want{"250000", 250000},
                        Want{"fast", WorkerPool::kSerialBelowNs}, Want{"-5", WorkerPool::kSerialBelowNs}}) {
    SCOPED_TRACE(w.env ? w.env : "unset");
    if (w.env)
      ::setenv("TPUHAL_SIM_SERIAL_BELOW_NS", w.env, 1);
    else
      ::unsetenv("TPUHAL_SIM_SERIAL_BELOW_NS");
    WorkerPool pool(2);
    if (w.below > 0) {
      EXPECT_EQ(pool.begin_op(w.below - 1), 1u);
    }
    EXPECT_EQ(pool.threads(), w.below > 0 ? 1u : 2u);
    EXPECT_EQ(pool.begin_op(w.below), 2u);
    EXPECT_EQ(pool.begin_op(0), w.below > 0 ? 1u : 2u);
    // One thread: parallel_for runs every part on the caller.
    pool.begin_op(0);
    std::atomic<unsigned> parts{0};
    pool.parallel_for(1000, [&](std::uint64_t, std::uint64_t) { parts.fetch_add(1); });
    EXPECT_EQ(parts.load(), w.below > 0 ? 1u : 2u);
  }
  ::unsetenv("TPUHAL_SIM_SERIAL_BELOW_NS");
  ::unsetenv("TPUHAL_SIM_FIXED_THREADS");
}

// An int8 network's streaming op (quantisation, table lookups, the
// quantized adds, multiplications and global pools, byte copies and
// transposes) takes the team from kSerialBelowNs / kStreamingShare while the pool's threads still spin
// from its last region, and from the whole bound when they sleep (a fresh
// pool, or kSpinMs after its last region); other ops always from the
// whole bound. The times are given, so no sleep or load changes it.
TEST(TensorEngine, AStreamingOpTakesTheTeamEarlierWhileItsThreadsSpin) {
  ::setenv("TPUHAL_SIM_FIXED_THREADS", "1", 1);  // no shrinking of the team under load
  ::unsetenv("TPUHAL_SIM_SERIAL_BELOW_NS");
  constexpr std::uint64_t kBound = WorkerPool::kSerialBelowNs, kSmall = kBound / WorkerPool::kStreamingShare;
  constexpr std::uint64_t kSpinNs = static_cast<std::uint64_t>(WorkerPool::kSpinMs) * 1'000'000;
  static_assert(kSmall > 0 && kSmall < kBound);
  WorkerPool pool(2);
  const std::uint64_t start = tpuhal::base::monotonic_ns();
  EXPECT_EQ(pool.begin_op_at(start, kSmall, true), 1u) << "a fresh pool's threads sleep";
  EXPECT_EQ(pool.begin_op_at(start, kBound, true), 2u);
  const std::uint64_t before = tpuhal::base::monotonic_ns();
  std::atomic<unsigned> parts{0};
  pool.parallel_for(1000, [&](std::uint64_t, std::uint64_t) { parts.fetch_add(1); });
  ASSERT_EQ(parts.load(), 2u);
  const std::uint64_t spinning = before + kSpinNs - 1;  // before the region ended + kSpinMs
  EXPECT_EQ(pool.begin_op_at(spinning, kSmall, true), 2u);
  EXPECT_EQ(pool.begin_op_at(spinning, kSmall - 1, true), 1u);
  EXPECT_EQ(pool.begin_op_at(spinning, kSmall, false), 1u) << "not streaming: the whole bound";
  EXPECT_EQ(pool.begin_op_at(spinning, kBound, false), 2u);
  const std::uint64_t asleep = tpuhal::base::monotonic_ns() + kSpinNs + 1;
  EXPECT_EQ(pool.begin_op_at(asleep, kSmall, true), 1u);
  EXPECT_EQ(pool.begin_op_at(asleep, kBound, true), 2u);
  // TPUHAL_SIM_SERIAL_BELOW_NS moves both bounds.
  ::setenv("TPUHAL_SIM_SERIAL_BELOW_NS", "250000", 1);
  WorkerPool moved(2);
  constexpr std::uint64_t kMovedSmall = 250000 / WorkerPool::kStreamingShare;
  const std::uint64_t moved_start = tpuhal::base::monotonic_ns();
  EXPECT_EQ(moved.begin_op_at(moved_start, 250000 - 1, true), 1u);
  EXPECT_EQ(moved.begin_op_at(moved_start, 250000, true), 2u);
  moved.parallel_for(1000, [](std::uint64_t, std::uint64_t) {});
  const std::uint64_t moved_spinning = moved_start + kSpinNs - 1;
  EXPECT_EQ(moved.begin_op_at(moved_spinning, kMovedSmall, true), 2u);
  EXPECT_EQ(moved.begin_op_at(moved_spinning, kMovedSmall - 1, true), 1u);
  ::unsetenv("TPUHAL_SIM_SERIAL_BELOW_NS");
  ::unsetenv("TPUHAL_SIM_FIXED_THREADS");
}

// The serial estimate (what begin_op weighs against its bound): an
// elementwise op's f16 and bf16 tensors at f32's bytes where it computes
// (widened, mapped in f32, rounded), so that an SE block's gate over
// 8x14x14x240 in f16 is estimated as in f32 and takes the team too; at
// their own bytes where it only moves them (a transpose); a broadcast
// operand once.
// A dense view of `shape` (no data), or with `broadcast` one of an [n, h,
// w, c] shape broadcast along h and w: an op's tensors for its estimate.
View shaped_view(fw::DType t, std::uint32_t esize, const std::vector<std::uint64_t>& shape, bool broadcast = false) {
  View v;
  v.dtype = t;
  v.esize = esize;
  v.rank = static_cast<std::uint32_t>(shape.size());
  std::uint64_t step = 1;
  for (std::uint32_t d = v.rank; d-- > 0;) {
    v.shape[d] = shape[d];
    v.strides[d] = broadcast && d > 0 && d < 3 ? 0 : step;
    step *= broadcast && d > 0 && d < 3 ? 1 : shape[d];
  }
  return v;
}

// An elementwise op's block (three tensors), for its estimate.
fw::OpBlock map_block(fw::ElementwiseOp op) {
  fw::OpBlock block;
  block.kind = fw::OpKind::kElementwise;
  block.num_tensors = 3;
  fw::ElementwiseAttrs at{};
  at.op = static_cast<std::uint32_t>(op);
  block.attrs = at;
  return block;
}

TEST(TensorEngine, AHalfFloatMapIsEstimatedAtF32sBytesAndItsCopiesAtTheirOwn) {
  const auto view = shaped_view;
  const auto estimate = [&](fw::DType t, std::uint32_t esize, fw::ElementwiseOp op) {
    const fw::OpBlock block = map_block(op);
    const bool binary = op != fw::ElementwiseOp::kIdentity;
    const View v[3] = {view(t, esize, {8, 14, 14, 240}, false),
                       binary ? view(t, esize, {8, 14, 14, 240}, true) : View{},
                       view(t, esize, {8, 14, 14, 240}, false)};
    return serial_estimate_ns(block, v);
  };
  constexpr std::uint64_t kPixels = 8 * 14 * 14 * 240, kGate = 8 * 240;
  const std::uint64_t f32_mul = estimate(fw::DType::kF32, 4, fw::ElementwiseOp::kMul);
  EXPECT_EQ(f32_mul, (2 * kPixels + kGate) * 4 / 32);
  EXPECT_EQ(estimate(fw::DType::kF16, 2, fw::ElementwiseOp::kMul), f32_mul);
  EXPECT_EQ(estimate(fw::DType::kBF16, 2, fw::ElementwiseOp::kMul), f32_mul);
  EXPECT_GE(f32_mul, WorkerPool::kSerialBelowNs) << "the gate takes the team in every float type";
  const std::uint64_t f32_copy = estimate(fw::DType::kF32, 4, fw::ElementwiseOp::kIdentity);
  EXPECT_EQ(f32_copy, 2 * kPixels * 4 / 32);
  EXPECT_EQ(estimate(fw::DType::kF16, 2, fw::ElementwiseOp::kIdentity), f32_copy / 2);
  EXPECT_EQ(estimate(fw::DType::kU8, 1, fw::ElementwiseOp::kIdentity), f32_copy / 4);
}

// Ops whose elements cost more than their bytes: a map that calls the C
// library (exp, log, ...) at 4 ns an element, softmax at 2 and erf at 1, on
// top of their bytes, so that a transformer's GELU and attention take the
// team; a plain map of the same tensors stays at its bytes.
TEST(TensorEngine, ALibraryMapAndASoftmaxAreEstimatedByTheirElements) {
  const auto dense = [](const std::vector<std::uint64_t>& shape) { return shaped_view(fw::DType::kF32, 4, shape); };
  constexpr std::uint64_t kElements = 128 * 1024, kBytes = 2 * kElements * 4 / 32;
  const View x = dense({1, 128, 1024});
  const auto map = [&](fw::ElementwiseOp op) {
    const View v[3] = {x, View{}, x};
    return serial_estimate_ns(map_block(op), v);
  };
  EXPECT_EQ(map(fw::ElementwiseOp::kNeg), kBytes);
  EXPECT_LT(map(fw::ElementwiseOp::kNeg), WorkerPool::kSerialBelowNs);
  for (fw::ElementwiseOp op :
       {fw::ElementwiseOp::kExp, fw::ElementwiseOp::kLog, fw::ElementwiseOp::kSin, fw::ElementwiseOp::kAtanh}) {
    EXPECT_EQ(map(op), kBytes + 4 * kElements) << static_cast<int>(op);
    EXPECT_GE(map(op), WorkerPool::kSerialBelowNs) << static_cast<int>(op);
  }
  EXPECT_EQ(map(fw::ElementwiseOp::kErf), kBytes + kElements);  // the board's own, in vectors
  EXPECT_GE(map(fw::ElementwiseOp::kErf), WorkerPool::kSerialBelowNs);
  fw::OpBlock softmax;
  softmax.kind = fw::OpKind::kSoftmax;
  softmax.num_tensors = 2;
  softmax.attrs = fw::SoftmaxAttrs{};
  const View s[2] = {dense({4, 128, 128}), dense({4, 128, 128})};
  EXPECT_EQ(serial_estimate_ns(softmax, s), 2 * 65536 * 4 / 32 + 2 * 65536);
  EXPECT_GE(serial_estimate_ns(softmax, s), WorkerPool::kSerialBelowNs);
}

// A kernel's part that throws (memory for its working set, say) on one of
// the engine's threads: the exception reaches the caller, which the board
// turns into its out-of-memory status, once every part has ended; thrown
// out of the OpenMP region it would end the process.
TEST(TensorEngine, AnExceptionThrownInAParallelPartReachesTheCaller) {
  ::setenv("TPUHAL_SIM_FIXED_THREADS", "1", 1);  // no shrinking of the team under load
  WorkerPool pool(2);
  ::unsetenv("TPUHAL_SIM_FIXED_THREADS");
  pool.begin_op(WorkerPool::kSerialBelowNs);
  std::atomic<unsigned> parts{0};
  EXPECT_THROW(pool.parallel_for(1000,
                                 [&](std::uint64_t, std::uint64_t) {
                                   parts.fetch_add(1);
                                   throw std::bad_alloc();
                                 }),
               std::bad_alloc);
  EXPECT_EQ(parts.load(), pool.threads());
  // The pool works on afterwards.
  std::atomic<std::uint64_t> sum{0};
  pool.parallel_for(1000, [&](std::uint64_t begin, std::uint64_t end) { sum.fetch_add(end - begin); });
  EXPECT_EQ(sum.load(), 1000u);
}

// The cache of weights reordered for oneDNN: when full, the weights a model
// ran first stay (emptying it would make a model larger than it miss on
// every layer of every run), and room comes only from entries no lookup
// has served for 4 * (entries + 256) lookups.
TEST(TensorEngine, TheWeightCacheKeepsTheFirstWeightsWhenFullAndMakesRoomFromIdleOnes) {
  DnnlState d(1, nullptr);
  const dnnl::memory::desc desc({256}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::a);  // 1 KiB
  const std::vector<std::byte> a(1024, std::byte{1}), b(1024, std::byte{2}), c(1024, std::byte{3});
  d.capacity = 4096;  // two entries: 1 KiB of source and 1 KiB reordered each
  d.remember_weights("a", a.data(), a.size(), dnnl::memory(desc, d.engine));
  d.remember_weights("b", b.data(), b.size(), dnnl::memory(desc, d.engine));
  d.remember_weights("c", c.data(), c.size(), dnnl::memory(desc, d.engine));
  EXPECT_NE(d.cached_weights("a", a.data(), a.size()), nullptr);
  EXPECT_NE(d.cached_weights("b", b.data(), b.size()), nullptr);
  EXPECT_EQ(d.cached_weights("c", c.data(), c.size()), nullptr) << "a full cache made room by dropping used weights";
  EXPECT_EQ(d.cached_bytes, 4096u);
  // Bytes that changed in place are a miss.
  const std::vector<std::byte> a2(1024, std::byte{9});
  EXPECT_EQ(d.cached_weights("a", a2.data(), a2.size()), nullptr);
  // "b" stays in use; "a" goes idle while other weights are looked up.
  for (int i = 0; i < 4 * (2 + 256) + 1; ++i) {
    ASSERT_NE(d.cached_weights("b", b.data(), b.size()), nullptr);
    EXPECT_EQ(d.cached_weights("c", c.data(), c.size()), nullptr);
  }
  d.remember_weights("c", c.data(), c.size(), dnnl::memory(desc, d.engine));
  EXPECT_NE(d.cached_weights("c", c.data(), c.size()), nullptr) << "an idle entry was not dropped to make room";
  EXPECT_NE(d.cached_weights("b", b.data(), b.size()), nullptr);
  EXPECT_EQ(d.cached_weights("a", a.data(), a.size()), nullptr);
  EXPECT_EQ(d.cached_bytes, 4096u);
  // Other weights under a key that do not fit take its old entry with
  // them: a lookup that does not compare bytes must not get the old ones.
  const std::vector<std::byte> big(2048, std::byte{7});
  d.remember_weights("b", big.data(), big.size(), dnnl::memory(desc, d.engine));
  EXPECT_EQ(d.cached_weights("b", b.data(), b.size(), /*unchanged=*/true), nullptr);
  EXPECT_EQ(d.cached_bytes, 2048u);
}

// Kept weights and the board's DRAM write log (dram_writes.h): bytes past
// the aperture that no write touched since they were last compared are
// taken without reading them; anything else is compared byte for byte.
// A float product's B of 64 KiB or more past the aperture is copied into
// the layout the product reads on the second call that finds it unchanged
// (the first only notes it), read from the copy after, and never copied
// where the host can write it (the aperture); each result is the same.
TEST(TensorEngine, AProductKeepsItsWeightsOnlyOnceSeenUnchangedPastTheAperture) {
  constexpr std::size_t kDram = 4 << 20, kAperture = 1 << 20, k = 512, n = 300;
  std::vector<std::byte> dram(kDram);
  DramWrites log(dram.data(), kDram, kAperture);
  for (const std::size_t m : {std::size_t{1}, std::size_t{8}})  // panels of columns; pack_b's panels
    for (const bool past : {true, false}) {
      SCOPED_TRACE(std::to_string(m) + (past ? " rows, B past the aperture" : " rows, B in the aperture"));
      TensorEngine e(2, isa_detected(), &log);
      auto* const bw = reinterpret_cast<float*>(dram.data() + (past ? 2 << 20 : 0));
      std::mt19937 rng(5);
      std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
      for (std::size_t i = 0; i < k * n; ++i) bw[i] = dist(rng);
      std::vector<float> av(m * k);
      for (auto& v : av) v = dist(rng);
      const fgemm::Matrix a{reinterpret_cast<const std::byte*>(av.data()), k, 1, fgemm::Type::kF32};
      const fgemm::Matrix b{reinterpret_cast<const std::byte*>(bw), n, 1, fgemm::Type::kF32};
      const fgemm::Kernels& kern = fgemm::kernels(e.isa());
      std::vector<float> first(m * n), y(m * n);
      fgemm::gemm(e, kern, m, n, k, a, b, first.data(), n);
      EXPECT_EQ(e.packed_cache().bytes(), 0u) << "copied on the first sighting";
      for (int call = 2; call <= 3; ++call) {
        fgemm::gemm(e, kern, m, n, k, a, b, y.data(), n);
        EXPECT_EQ(std::memcmp(y.data(), first.data(), y.size() * 4), 0) << "call " << call;
        if (past)
          EXPECT_GE(e.packed_cache().bytes(), 2 * k * n * 4) << "call " << call << ": B and its copy kept";
        else
          EXPECT_EQ(e.packed_cache().bytes(), 0u) << "call " << call << ": kept where the host can write";
      }
      // The board rewrites B: the copy is not used, the product is B's now.
      for (std::size_t i = 0; i < k * n; ++i) bw[i] = -bw[i];
      log.wrote(static_cast<std::uint64_t>(reinterpret_cast<std::byte*>(bw) - dram.data()), k * n * 4);
      fgemm::gemm(e, kern, m, n, k, a, b, y.data(), n);
      for (std::size_t i = 0; i < m * n; ++i) ASSERT_EQ(y[i], -first[i]) << "at " << i << " after B was rewritten";
    }
}

// The copy is made for a B of 64 KiB or more (a squeeze-and-excitation
// layer's in bf16 among them), never for a smaller one, whose packing costs
// less than keeping it; each result is the same.
TEST(TensorEngine, AProductKeepsBOf64KiBOrMoreOnly) {
  constexpr std::size_t kDram = 4 << 20, kAperture = 1 << 20, kMin = 64 << 10;
  std::vector<std::byte> dram(kDram);
  DramWrites log(dram.data(), kDram, kAperture);
  struct Operand {
    std::size_t k, n;
    fgemm::Type type;
  };
  for (const Operand& c : {Operand{64, 256, fgemm::Type::kF32}, Operand{63, 256, fgemm::Type::kF32},
                           Operand{144, 576, fgemm::Type::kBF16}, Operand{127, 256, fgemm::Type::kBF16}}) {
    const std::size_t es = c.type == fgemm::Type::kF32 ? 4 : 2, bytes = c.k * c.n * es;
    SCOPED_TRACE(std::to_string(c.k) + " x " + std::to_string(c.n) + ", " + std::to_string(bytes) + " bytes");
    TensorEngine e(2, isa_detected(), &log);
    std::byte* const bw = dram.data() + (2 << 20);
    std::mt19937 rng(9);
    std::uniform_int_distribution<int> bits(0, 0x7F);
    for (std::size_t i = 0; i < bytes; ++i)  // f32 and bf16 values of modest size, either sign
      bw[i] = static_cast<std::byte>(i % es == es - 1 ? 0x3E | (bits(rng) & 0x80) : bits(rng));
    std::vector<float> af(c.k, 0.5f);
    std::vector<std::uint16_t> ah(c.k, 0x3F00);  // 0.5 in bf16
    const fgemm::Matrix a{c.type == fgemm::Type::kF32 ? reinterpret_cast<const std::byte*>(af.data())
                                                      : reinterpret_cast<const std::byte*>(ah.data()),
                          static_cast<std::int64_t>(c.k), 1, c.type};
    const fgemm::Matrix b{bw, static_cast<std::int64_t>(c.n), 1, c.type};
    const fgemm::Kernels& kern = fgemm::kernels(e.isa());
    std::vector<float> first(c.n), y(c.n);
    for (int call = 1; call <= 3; ++call) {
      fgemm::gemm(e, kern, 1, c.n, c.k, a, b, call == 1 ? first.data() : y.data(), c.n);
      if (call > 1) {
        EXPECT_EQ(std::memcmp(y.data(), first.data(), y.size() * 4), 0) << "call " << call;
      }
    }
    if (bytes >= kMin) {
      EXPECT_GT(e.packed_cache().bytes(), bytes) << "B and its copy kept";
    } else {
      EXPECT_EQ(e.packed_cache().bytes(), 0u) << "nothing kept under 64 KiB";
    }
  }
}

TEST(TensorEngine, KeptWeightsAreComparedOnlyWhereTheBoardWroteThemOrTheHostCanWrite) {
  constexpr std::size_t kDram = 1 << 20, kAperture = 128 << 10, kChunk = DramWrites::kChunk;
  std::vector<std::byte> dram(kDram, std::byte{1});
  DramWrites log(dram.data(), kDram, kAperture);
  std::byte* past = dram.data() + 4 * kChunk;  // only the board writes here
  KeptSource kept;
  kept.keep(&log, past, 4096);
  // A change no write announced (which the board cannot make) is not seen:
  // the bytes were not read.
  past[10] = std::byte{2};
  EXPECT_TRUE(kept.holds(&log, past, 4096));
  // A write the board makes anywhere in the weights' chunks makes the next
  // lookup compare them.
  log.wrote(4 * kChunk + kChunk - 1, 1);
  EXPECT_FALSE(kept.holds(&log, past, 4096));
  past[10] = std::byte{1};
  EXPECT_TRUE(kept.holds(&log, past, 4096)) << "equal bytes compared equal";
  past[11] = std::byte{3};
  EXPECT_TRUE(kept.holds(&log, past, 4096)) << "compared equal, then no write: not compared again";
  past[11] = std::byte{1};
  // Writes to other chunks, and a write ending just below them, do not.
  log.wrote(6 * kChunk, 100);
  log.wrote(kChunk, 3 * kChunk);
  past[12] = std::byte{4};
  EXPECT_TRUE(kept.holds(&log, past, 4096));
  past[12] = std::byte{1};
  // Another size is never the kept weights.
  EXPECT_FALSE(kept.holds(&log, past, 4095));
  // In the aperture, across its end, outside DRAM and without a log: the
  // host may have written them, so every lookup compares.
  std::vector<std::byte> host(4096, std::byte{1});
  for (std::byte* at : {dram.data() + kChunk, dram.data() + kAperture - 2048, host.data()})
    for (const DramWrites* with : {static_cast<const DramWrites*>(&log), static_cast<const DramWrites*>(nullptr)}) {
      KeptSource k;
      k.keep(with, at, 4096);
      EXPECT_TRUE(k.holds(with, at, 4096));
      at[100] = std::byte{5};
      EXPECT_FALSE(k.holds(with, at, 4096)) << "at offset " << (at - dram.data());
      at[100] = std::byte{1};
    }
  // A board whose DRAM is all aperture (a SoC) logs nothing.
  DramWrites soc(dram.data(), kDram, kDram);
  KeptSource k;
  k.keep(&soc, past, 4096);
  past[0] = std::byte{6};
  EXPECT_FALSE(k.holds(&soc, past, 4096));
  past[0] = std::byte{1};

  // Values computed from bytes, kept without a copy of them: only past the
  // aperture, and only until a write to the bytes.
  DerivedValues values(&log);
  const DerivedValues::Key key{1, 2, 3, 4};
  std::uint64_t at = values.now();
  values.keep(key, past, 4096, 77, at);
  ASSERT_EQ(values.find(key, past, 4096), std::optional<std::uint64_t>(77));
  log.wrote(4 * kChunk + 100, 8);
  EXPECT_EQ(values.find(key, past, 4096), std::nullopt) << "the bytes were written since";
  at = values.now();
  values.keep(key, past, 4096, 78, at);
  EXPECT_EQ(values.find(key, past, 4096), std::optional<std::uint64_t>(78));
  // A write during the computation: the value is not kept.
  at = values.now();
  log.wrote(4 * kChunk, 1);
  values.keep(key, past, 4096, 79, at);
  EXPECT_EQ(values.find(key, past, 4096), std::nullopt);
  for (std::byte* where : {dram.data() + kChunk, host.data()}) {
    at = values.now();
    values.keep(key, where, 4096, 80, at);
    EXPECT_EQ(values.find(key, where, 4096), std::nullopt) << "the host may write these bytes";
  }
  DerivedValues no_log;
  no_log.keep(key, past, 4096, 81, no_log.now());
  EXPECT_EQ(no_log.find(key, past, 4096), std::nullopt);
}

}  // namespace
}  // namespace tpuhal::sim::tensor
