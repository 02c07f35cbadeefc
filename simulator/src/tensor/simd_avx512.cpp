// The tensor engine's innermost loops (simd.h) for AVX-512 (F, BW, DQ, VL): the code is
// written once, in simd_kernels.inc.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "simd.h"

namespace tpuhal::sim::tensor::simd_avx512 {
namespace {

// lookup_u8 on a CPU with AVX512_VBMI (Ice Lake, Zen 4 and later): the
// table in four registers, 64 indices at a time, two two-register byte
// permutes (index bits 0-6) and a blend by bit 7. False (nothing done)
// without VBMI: the loop in simd_kernels.inc runs instead.
#define TPUHAL_VBMI __attribute__((target("avx512f,avx512bw,avx512vbmi")))
TPUHAL_VBMI inline __m512i look_up_64(__m512i idx, __m512i t0, __m512i t1, __m512i t2, __m512i t3) {
  const __m512i lo = _mm512_permutex2var_epi8(t0, idx, t1), hi = _mm512_permutex2var_epi8(t2, idx, t3);
  return _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi);
}

TPUHAL_VBMI void lookup_vbmi(const std::uint8_t* table, const std::uint8_t* in, std::uint8_t* out, std::size_t n) {
  const __m512i t0 = _mm512_loadu_si512(table), t1 = _mm512_loadu_si512(table + 64);
  const __m512i t2 = _mm512_loadu_si512(table + 128), t3 = _mm512_loadu_si512(table + 192);
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) _mm512_storeu_si512(out + i, look_up_64(_mm512_loadu_si512(in + i), t0, t1, t2, t3));
  if (i < n) {
    const __mmask64 m = (std::uint64_t{1} << (n - i)) - 1;  // n - i < 64
    _mm512_mask_storeu_epi8(out + i, m, look_up_64(_mm512_maskz_loadu_epi8(m, in + i), t0, t1, t2, t3));
  }
}
#undef TPUHAL_VBMI

bool lookup_if_vbmi(const std::uint8_t* table, const std::uint8_t* in, std::uint8_t* out, std::size_t n) {
  static const bool vbmi = __builtin_cpu_supports("avx512vbmi");
  if (!vbmi) return false;
  lookup_vbmi(table, in, out, n);
  return true;
}
#define TPUHAL_SIMD_LOOKUP_VBMI lookup_if_vbmi

// dot_rows_i8 with vpmaddwd: 32 products at a time, summed in pairs into
// 32-bit lanes (a pair is at most 2 * 32768 * 128, inside int32), twice the
// rate of the loop in simd_kernels.inc, which widens each product to 32 bits.
// Integer sums: the same result as that loop.
void dot_rows_madd(std::int32_t* out, const std::int16_t* x, const std::int8_t* w, std::size_t stride, std::size_t n,
                   std::size_t rows) {
  for (std::size_t r = 0; r < rows; ++r) {
    const std::int8_t* wr = w + r * stride;
    __m512i s = _mm512_setzero_si512();
    std::size_t i = 0;
    for (; i + 32 <= n; i += 32) {
      const __m512i wv = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr + i)));
      s = _mm512_add_epi32(s, _mm512_madd_epi16(_mm512_loadu_si512(x + i), wv));
    }
    // Lanes added as the vector adds do, wrapping (GCC's _mm512_reduce_add_epi32
    // adds in signed int, which may not overflow).
    const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
    const __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    const __m128i d = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0x4E));
    auto t = static_cast<std::uint32_t>(_mm_cvtsi128_si32(_mm_add_epi32(d, _mm_shuffle_epi32(d, 0xB1))));
    for (; i < n; ++i) t += static_cast<std::uint32_t>(static_cast<std::int32_t>(x[i]) * wr[i]);
    out[r] = static_cast<std::int32_t>(t);
  }
}
#define TPUHAL_SIMD_DOT_ROWS_I8 dot_rows_madd

// dw_rows_q8 on a CPU with AVX512_VNNI: 16 channels at a time (the last
// ones masked), each quad of taps one vpdpbusd per output column, four
// columns at once so that each weight vector serves them all. vpdpbusd's
// four products of u8 and s8 sum within int32 and add to the accumulator
// wrapping, as the loop in simd_kernels.inc adds. The sums are then
// requantised in registers with requantize_one's operations: the bias
// added wrapping, converted to f32 (rounding to nearest even, as a cast
// does), multiplied, clamped to 2^22 (the caller's multipliers are finite:
// no NaN), rounded to nearest even by the conversion in the default
// rounding mode (the magic constant's result), the zero point added,
// clamped to [lo, hi] and truncated to a byte. False (nothing done)
// without VNNI.
#define TPUHAL_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
template <std::size_t kCols>
TPUHAL_VNNI inline void dw_columns_vnni(std::uint8_t* out, std::size_t out_step, const std::uint8_t* const* in,
                                        const std::int8_t* w, std::size_t quads, std::size_t ch, std::size_t step,
                                        std::size_t o, std::size_t c, __mmask64 lanes, __mmask16 sums,
                                        const simd::DwRequant& rq) {
  __m512i acc[kCols];
  const __m512i bias = _mm512_maskz_loadu_epi32(sums, rq.bias + c);
  for (std::size_t j = 0; j < kCols; ++j) acc[j] = bias;
  for (std::size_t q = 0; q < quads; ++q) {
    const __m512i k = _mm512_maskz_loadu_epi8(lanes, w + 4 * (q * ch + c));
    const std::uint8_t* x = in[q] + 4 * (o * step + c);
    for (std::size_t j = 0; j < kCols; ++j)
      acc[j] = _mm512_dpbusd_epi32(acc[j], _mm512_maskz_loadu_epi8(lanes, x + 4 * j * step), k);
  }
  const __m512 mul = _mm512_maskz_loadu_ps(sums, rq.mul + c);
  const __m512 limit = _mm512_set1_ps(4194304.0f), neg_limit = _mm512_set1_ps(-4194304.0f);
  const __m512i zero = _mm512_set1_epi32(rq.zero), lo = _mm512_set1_epi32(rq.lo), hi = _mm512_set1_epi32(rq.hi);
  for (std::size_t j = 0; j < kCols; ++j) {
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[j]), mul);
    v = _mm512_min_ps(_mm512_max_ps(v, neg_limit), limit);
    __m512i r = _mm512_add_epi32(_mm512_cvtps_epi32(v), zero);
    r = _mm512_min_epi32(_mm512_max_epi32(r, lo), hi);
    _mm_mask_storeu_epi8(out + (o + j) * out_step + c, sums, _mm512_cvtepi32_epi8(r));
  }
}

TPUHAL_VNNI void dw_rows_vnni(std::uint8_t* out, std::size_t out_step, const std::uint8_t* const* in,
                              const std::int8_t* w, std::size_t quads, std::size_t ow, std::size_t ch, std::size_t step,
                              const simd::DwRequant& rq) {
  for (std::size_t c = 0; c < ch; c += 16) {
    const std::size_t left = std::min<std::size_t>(16, ch - c);
    const auto sums = static_cast<__mmask16>((1u << left) - 1);
    const auto lanes = left == 16 ? ~__mmask64{0} : static_cast<__mmask64>((std::uint64_t{1} << (4 * left)) - 1);
    std::size_t o = 0;
    for (; o + 4 <= ow; o += 4) dw_columns_vnni<4>(out, out_step, in, w, quads, ch, step, o, c, lanes, sums, rq);
    if (ow - o == 3) dw_columns_vnni<3>(out, out_step, in, w, quads, ch, step, o, c, lanes, sums, rq);
    if (ow - o == 2) dw_columns_vnni<2>(out, out_step, in, w, quads, ch, step, o, c, lanes, sums, rq);
    if (ow - o == 1) dw_columns_vnni<1>(out, out_step, in, w, quads, ch, step, o, c, lanes, sums, rq);
  }
}
#undef TPUHAL_VNNI

bool dw_rows_if_vnni(std::uint8_t* out, std::size_t out_step, const std::uint8_t* const* in, const std::int8_t* w,
                     std::size_t quads, std::size_t ow, std::size_t ch, std::size_t step, const simd::DwRequant& rq) {
  static const bool vnni = __builtin_cpu_supports("avx512vnni");
  if (!vnni) return false;
  dw_rows_vnni(out, out_step, in, w, quads, ow, ch, step, rq);
  return true;
}
#define TPUHAL_SIMD_DW_ROWS_Q8 dw_rows_if_vnni

// quad_bytes_u8 16 bytes at a time: four loads, a 4x16 byte transpose
// (unpacking bytes, then 16-bit pairs), 64 bytes stored; the last bytes
// of a run one at a time, as in simd_kernels.inc. Byte moves: the same
// result.
void quad_bytes_sse(std::uint8_t* out, const std::uint8_t* in, std::size_t n, std::size_t cols, std::size_t in_step,
                    std::size_t partner, std::uint8_t flip) {
  const __m128i f = _mm_set1_epi8(static_cast<char>(flip));
  const auto load = [&](const std::uint8_t* p) {
    return _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), f);
  };
  for (std::size_t k = 0; k < cols; ++k) {
    const std::uint8_t* src = in + k * in_step;
    std::uint8_t* dst = out + 4 * k * n;
    std::size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m128i a = load(src + i), b = load(src + i + partner), c = load(src + i + 2 * partner),
                    d = load(src + i + 3 * partner);
      const __m128i ab_lo = _mm_unpacklo_epi8(a, b), ab_hi = _mm_unpackhi_epi8(a, b);
      const __m128i cd_lo = _mm_unpacklo_epi8(c, d), cd_hi = _mm_unpackhi_epi8(c, d);
      auto* o = reinterpret_cast<__m128i*>(dst + 4 * i);
      _mm_storeu_si128(o, _mm_unpacklo_epi16(ab_lo, cd_lo));
      _mm_storeu_si128(o + 1, _mm_unpackhi_epi16(ab_lo, cd_lo));
      _mm_storeu_si128(o + 2, _mm_unpacklo_epi16(ab_hi, cd_hi));
      _mm_storeu_si128(o + 3, _mm_unpackhi_epi16(ab_hi, cd_hi));
    }
    for (; i < n; ++i)
      for (std::size_t e = 0; e < 4; ++e) dst[4 * i + e] = static_cast<std::uint8_t>(src[i + e * partner] ^ flip);
  }
}
#define TPUHAL_SIMD_QUAD_BYTES_U8 quad_bytes_sse

#include "simd_kernels.inc"

}  // namespace

extern const simd::Kernels kKernels = make_kernels(Isa::kAvx512);

}  // namespace tpuhal::sim::tensor::simd_avx512
