// The entry points of simd.h, each through the table of the level in use
// (simd_<level>.cpp). A table of function pointers, not compiler-made
// function clones: the clones' resolvers pick by the CPU alone, ignoring
// TPUHAL_MAX_ISA, and ThreadSanitizer builds cannot have them (the dynamic
// loader runs resolvers before the sanitizer's runtime is up).
#include "simd.h"

#include <array>
#include <atomic>
#include <stdexcept>

namespace tpuhal::sim::tensor {

#if defined(__x86_64__)
namespace simd_sse41 {
extern const simd::Kernels kKernels;
}
namespace simd_avx2 {
extern const simd::Kernels kKernels;
}
namespace simd_avx512 {
extern const simd::Kernels kKernels;
}
#endif
namespace simd_baseline {
extern const simd::Kernels kKernels;
}

namespace {

// Every level's own table, lowest first.
#if defined(__x86_64__)
constexpr const simd::Kernels* kOwn[] = {&simd_baseline::kKernels, &simd_sse41::kKernels, &simd_avx2::kKernels,
                                         &simd_avx512::kKernels};
#else
constexpr const simd::Kernels* kOwn[] = {&simd_baseline::kKernels};
#endif

constexpr std::string_view kNames[] = {
#define TPUHAL_SIMD_NAME(name) #name,
    TPUHAL_SIMD_ENTRY_POINTS(TPUHAL_SIMD_NAME)
#undef TPUHAL_SIMD_NAME
};

std::atomic<const simd::Kernels*> g_active{nullptr};

const simd::Kernels& from_env() {
  try {
    return simd::kernels(isa_from_env());
  } catch (const std::invalid_argument&) {
    return *kOwn[0];
  }
}

// A table's entries as plain function pointers, in the list's order, to
// compare.
using Erased = void (*)();
std::array<Erased, std::size(kNames)> erased(const simd::Kernels& k) {
  return {
#define TPUHAL_SIMD_ERASED(name) reinterpret_cast<Erased>(k.name),
      TPUHAL_SIMD_ENTRY_POINTS(TPUHAL_SIMD_ERASED)
#undef TPUHAL_SIMD_ERASED
  };
}

// The level whose own table holds the version of entry point `name` that
// `k` holds.
std::optional<Isa> owner(std::string_view name, const simd::Kernels& k) {
  for (std::size_t i = 0; i < std::size(kNames); ++i) {
    if (kNames[i] != name) continue;
    const Erased fn = erased(k)[i];
    for (const simd::Kernels* own : kOwn)
      if (erased(*own)[i] == fn) return own->isa;
  }
  return std::nullopt;
}

}  // namespace

const simd::Kernels& simd::kernels(Isa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case Isa::kSse41: return simd_sse41::kKernels;
    case Isa::kAvx2: return simd_avx2::kKernels;
    case Isa::kAvx512:
    case Isa::kAvx512Vnni: return simd_avx512::kKernels;
#endif
    default: return simd_baseline::kKernels;
  }
}

const simd::Kernels& simd::active() {
  if (const Kernels* k = g_active.load(std::memory_order_acquire)) [[likely]]
    return *k;
  const Kernels* expected = nullptr;
  g_active.compare_exchange_strong(expected, &from_env(), std::memory_order_acq_rel);
  return *g_active.load(std::memory_order_acquire);
}

void simd::use_level(Isa isa) { g_active.store(&kernels(isa), std::memory_order_release); }

std::span<const std::string_view> simd::entry_points() { return kNames; }

std::optional<Isa> simd::version(std::string_view entry, Isa isa) { return owner(entry, kernels(isa)); }
std::optional<Isa> simd::version(std::string_view entry) { return owner(entry, active()); }

namespace simd {

void add_i32(std::int32_t* out, const std::int32_t* add, std::size_t n) { active().add_i32(out, add, n); }
void add_abs_i8(std::uint32_t* sums, const std::int8_t* row, std::size_t n) { active().add_abs_i8(sums, row, n); }
std::uint64_t sum_abs_i8(const std::int8_t* v, std::size_t n) { return active().sum_abs_i8(v, n); }
std::int64_t sum_i8(const std::int8_t* v, std::size_t n) { return active().sum_i8(v, n); }
void dot_rows_i8(std::int32_t* out, const std::int16_t* x, const std::int8_t* w, std::size_t stride, std::size_t n,
                 std::size_t rows) {
  active().dot_rows_i8(out, x, w, stride, n, rows);
}
void lookup_u8(const std::uint8_t* table, const std::uint8_t* in, std::uint8_t* out, std::size_t n) {
  active().lookup_u8(table, in, out, n);
}
void interleave_8(std::uint8_t* out, const std::uint8_t* in, std::size_t stride, std::size_t n, std::size_t lines,
                  std::size_t planes, std::size_t out_step, std::size_t in_step) {
  active().interleave_8(out, in, stride, n, lines, planes, out_step, in_step);
}
void interleave_32(std::uint32_t* out, const std::uint32_t* in, std::size_t stride, std::size_t n, std::size_t lines,
                   std::size_t planes, std::size_t out_step, std::size_t in_step) {
  active().interleave_32(out, in, stride, n, lines, planes, out_step, in_step);
}
void split_nibbles(const std::uint8_t* v, std::uint8_t* hi, std::uint8_t* lo, std::size_t n) {
  active().split_nibbles(v, hi, lo, n);
}
void join_nibble_sums(std::int32_t* out, const std::int32_t* lo, std::size_t n) {
  active().join_nibble_sums(out, lo, n);
}
void max_8(std::uint8_t* out, const std::uint8_t* in, std::size_t n, std::size_t blocks, std::size_t in_step,
           bool is_signed) {
  active().max_8(out, in, n, blocks, in_step, is_signed);
}
void requantize_u8(const std::int32_t* acc, const std::int32_t* bias, const float* mul, std::uint8_t* out,
                   std::size_t n, std::int32_t zero, std::int32_t lo, std::int32_t hi) {
  active().requantize_u8(acc, bias, mul, out, n, zero, lo, hi);
}
void quantize_f32(const float* in, std::uint8_t* out, std::size_t n, float scale, std::int32_t zero, std::int32_t lo,
                  std::int32_t hi) {
  active().quantize_f32(in, out, n, scale, zero, lo, hi);
}
void dequantize_8(const std::uint8_t* in, float* out, std::size_t n, bool is_signed, float scale, std::int32_t zero) {
  active().dequantize_8(in, out, n, is_signed, scale, zero);
}
void add_dequantized_8(float* acc, const std::uint8_t* x, std::size_t n, std::size_t rows, std::size_t stride,
                       bool is_signed, float scale, std::int32_t zero) {
  active().add_dequantized_8(acc, x, n, rows, stride, is_signed, scale, zero);
}
void qadd_8(const std::uint8_t* a, const std::uint8_t* b, std::uint8_t* out, std::size_t n, const QAddParams& p) {
  active().qadd_8(a, b, out, n, p);
}
void qmul_8(const std::uint8_t* x, const float* f, std::uint8_t* out, std::size_t n, const QMulParams& p) {
  active().qmul_8(x, f, out, n, p);
}
void arith_f32(Arith op, float* y, const float* a, std::size_t sa, const float* b, std::size_t sb, std::size_t n) {
  active().arith_f32(op, y, a, sa, b, sb, n);
}
void add_rows_f32(float* acc, const float* x, std::size_t n, std::size_t rows, std::size_t stride) {
  active().add_rows_f32(acc, x, n, rows, stride);
}
void add_rows_f16(float* acc, const std::uint16_t* x, std::size_t n, std::size_t rows, std::size_t stride) {
  active().add_rows_f16(acc, x, n, rows, stride);
}
void add_rows_bf16(float* acc, const std::uint16_t* x, std::size_t n, std::size_t rows, std::size_t stride) {
  active().add_rows_bf16(acc, x, n, rows, stride);
}
void max_strided_f32(float* out, const float* in, std::size_t n, std::size_t stride) {
  active().max_strided_f32(out, in, n, stride);
}
void add_strided_f32(float* out, const float* in, std::size_t n, std::size_t stride) {
  active().add_strided_f32(out, in, n, stride);
}
void max_blocks_f32(float* out, const float* in, std::size_t n, std::size_t blocks, std::size_t in_step) {
  active().max_blocks_f32(out, in, n, blocks, in_step);
}
void add_blocks_f32(float* out, const float* in, std::size_t n, std::size_t blocks, std::size_t in_step) {
  active().add_blocks_f32(out, in, n, blocks, in_step);
}
void madd_strided_f32(float* out, const float* in, std::size_t n, std::size_t stride, float w) {
  active().madd_strided_f32(out, in, n, stride, w);
}
void dw_rows_f32(float* out, const float* const* in, const float* w, const float* bias, std::size_t taps,
                 std::size_t ow, std::size_t ch, std::size_t step) {
  active().dw_rows_f32(out, in, w, bias, taps, ow, ch, step);
}

void dw_rows_q8(std::uint8_t* out, std::size_t out_step, const std::uint8_t* const* in, const std::int8_t* w,
                std::size_t quads, std::size_t ow, std::size_t ch, std::size_t step, const DwRequant& rq) {
  active().dw_rows_q8(out, out_step, in, w, quads, ow, ch, step, rq);
}
void quad_bytes_u8(std::uint8_t* out, const std::uint8_t* in, std::size_t n, std::size_t cols, std::size_t in_step,
                   std::size_t partner, std::uint8_t flip) {
  active().quad_bytes_u8(out, in, n, cols, in_step, partner, flip);
}
void sigmoid_f32(float* p, std::size_t n) { active().sigmoid_f32(p, n); }
void erf_f32s(float* p, std::size_t n) { active().erf_f32s(p, n); }
void exp_shifted_f32(const float* in, float* out, std::size_t n, float shift) {
  active().exp_shifted_f32(in, out, n, shift);
}
void silu_f32(float* p, std::size_t n) { active().silu_f32(p, n); }
void relu_f32(float* p, std::size_t n) { active().relu_f32(p, n); }
void clip_f32(float* p, std::size_t n, float lo, float hi) { active().clip_f32(p, n, lo, hi); }
void leaky_relu_f32(float* p, std::size_t n, float alpha) { active().leaky_relu_f32(p, n, alpha); }
void hard_sigmoid_f32(float* p, std::size_t n, float alpha, float beta) {
  active().hard_sigmoid_f32(p, n, alpha, beta);
}
void hard_swish_f32(float* p, std::size_t n, float alpha, float beta) { active().hard_swish_f32(p, n, alpha, beta); }
void widen_f16(const std::uint16_t* in, float* out, std::size_t n) { active().widen_f16(in, out, n); }
void widen_bf16(const std::uint16_t* in, float* out, std::size_t n) { active().widen_bf16(in, out, n); }
void narrow_f16(const float* in, std::uint16_t* out, std::size_t n) { active().narrow_f16(in, out, n); }
void narrow_bf16(const float* in, std::uint16_t* out, std::size_t n) { active().narrow_bf16(in, out, n); }
void yuv_row_f32(const std::uint8_t* luma, const std::uint8_t* u, const std::uint8_t* v, std::size_t step,
                 std::size_t n, const float* mean, const float* scale, float* rgb) {
  active().yuv_row_f32(luma, u, v, step, n, mean, scale, rgb);
}

}  // namespace simd
}  // namespace tpuhal::sim::tensor
