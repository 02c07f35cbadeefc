// The tensor engine's innermost loops, compiled once per instruction-set
// level (simd_<level>.cpp, from the one source simd_kernels.inc) and chosen
// at run time through a table per level, as the GEMMs' kernels are: the
// level isa_from_env() gives (the CPU's, capped by TPUHAL_MAX_ISA) picks
// the versions. Every level gives the same bits: the loops are built
// without contraction into FMA, and TensorIsa tests each level this CPU has.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "isa.h"

namespace tpuhal::sim::tensor::simd {

// out[i] += add[i] (two's complement wrap).
void add_i32(std::int32_t* out, const std::int32_t* add, std::size_t n);

// sums[i] += |row[i]| (row s8).
void add_abs_i8(std::uint32_t* sums, const std::int8_t* row, std::size_t n);

// sum of |v[i]| (v s8).
std::uint64_t sum_abs_i8(const std::int8_t* v, std::size_t n);
// sum of v[i] (v s8).
std::int64_t sum_i8(const std::int8_t* v, std::size_t n);
// out[r] = x[0] * w[r * stride] + ... + x[n - 1] * w[r * stride + n - 1]
// for each r < rows: an integer convolution's dot products of one input
// position with `rows` output channels' weights (s8), each product and
// sum in 32 bits, wrapping as the int32 accumulators do. Exact integer
// arithmetic, so every level gives the same result.
void dot_rows_i8(std::int32_t* out, const std::int16_t* x, const std::int8_t* w, std::size_t stride, std::size_t n,
                 std::size_t rows);

// out[i] = table[in[i]]: a lookup in a table of 256 bytes (an int8
// model's activation as a table; AVX-512 with VBMI looks 64 up at once).
void lookup_u8(const std::uint8_t* table, const std::uint8_t* in, std::uint8_t* out, std::size_t n);

// out[p * out_step + i * lines + j] = in[p * in_step + i + j * stride] for
// p < planes, i < n and j < lines (2, 3 or 4 with the level's shuffles;
// more, one at a time): lines of bytes `stride` apart interleaved, an int8
// image's NCHW planes into NHWC pixels, or a channel shuffle's groups into
// each pixel's channels (planes of it, one per pixel: ShuffleNet's are 48
// bytes, a call each took longer than the bytes).
void interleave_8(std::uint8_t* out, const std::uint8_t* in, std::size_t stride, std::size_t n, std::size_t lines,
                  std::size_t planes, std::size_t out_step, std::size_t in_step);
// interleave_8 for 4-byte elements (f32, i32): an fp32 image's planes into
// pixels (the transpose sends it lines of 3 and 4; 2 to 4 lines go by the
// level's shuffles, more one element at a time).
void interleave_32(std::uint32_t* out, const std::uint32_t* in, std::size_t stride, std::size_t n, std::size_t lines,
                   std::size_t planes, std::size_t out_step, std::size_t in_step);

// hi[i] = v[i] >> 4 and lo[i] = v[i] & 15 (u8): an input's nibbles.
void split_nibbles(const std::uint8_t* v, std::uint8_t* hi, std::uint8_t* lo, std::size_t n);
// out[i] = out[i] * 16 + lo[i] (int32, wrapping): the sums over an input's
// high nibbles (out) and low nibbles put together.
void join_nibble_sums(std::int32_t* out, const std::int32_t* lo, std::size_t n);

// out[r * n + i] = max(out[r * n + i], in[r * in_step + i]) for r <
// blocks and i < n, over bytes: u8, or (is_signed) i8 two's complement.
// Byte max pooling's step for one tap over a row of outputs, n channels
// each, their inputs in_step apart.
void max_8(std::uint8_t* out, const std::uint8_t* in, std::size_t n, std::size_t blocks, std::size_t in_step,
           bool is_signed);

// out[i] = clamp(round_half_even(a * mul[i]) + zero, lo, hi) as a byte
// (u8, or i8 two's complement), for |a * mul[i]| up to 2^22 (beyond, the
// result saturates), where a = acc[i] + bias[i] in int32, wrapping (bias
// may be null: a = acc[i]).
void requantize_u8(const std::int32_t* acc, const std::int32_t* bias, const float* mul, std::uint8_t* out,
                   std::size_t n, std::int32_t zero, std::int32_t lo, std::int32_t hi);

// Quantize and dequantize with one scale and zero point, the rules of the
// quantize and dequantize ops: out[i] = clamp(round_half_even(in[i] /
// scale) + zero, lo, hi) as a byte (u8, or i8 two's complement), NaN
// quantizing as 0 before the zero point is added; and out[i] = (in[i] -
// zero) * scale in f32, in[i] a u8 or (is_signed) an i8.
void quantize_f32(const float* in, std::uint8_t* out, std::size_t n, float scale, std::int32_t zero, std::int32_t lo,
                  std::int32_t hi);
void dequantize_8(const std::uint8_t* in, float* out, std::size_t n, bool is_signed, float scale, std::int32_t zero);

// acc[i] += (x[r * stride + i] - zero) * scale for i < n and r < rows, in
// row order: each byte (u8, or is_signed i8) dequantized as dequantize_8
// does, then added, each step rounded once. A quantized global average
// pool's sums over its taps (qlinear_global_avg_pool), a vector of
// channels per tap.
void add_dequantized_8(float* acc, const std::uint8_t* x, std::size_t n, std::size_t rows, std::size_t stride,
                       bool is_signed, float scale, std::int32_t zero);

// The qlinear_add op over dense bytes: each of a and b dequantized as
// dequantize_8 does, the two added in f32, the sum quantized as
// quantize_f32 does: the bits of those three ops in a row.
struct QAddParams {
  bool a_signed, b_signed;
  float a_scale, b_scale, y_scale;
  std::int32_t a_zero, b_zero, y_zero, lo, hi;
};
void qadd_8(const std::uint8_t* a, const std::uint8_t* b, std::uint8_t* out, std::size_t n, const QAddParams& p);
// The qlinear_mul op's step over dense bytes: out[i] = x[i] dequantized as
// dequantize_8 does (x_signed, x_scale, x_zero) times f[i], the other
// operand already dequantized by dequantize_8, in f32, the product
// quantized as quantize_f32 does (y_scale, y_zero, lo, hi). The product is
// commutative in IEEE arithmetic: either operand may be x.
struct QMulParams {
  bool x_signed;
  float x_scale, y_scale;
  std::int32_t x_zero, y_zero, lo, hi;
};
void qmul_8(const std::uint8_t* x, const float* f, std::uint8_t* out, std::size_t n, const QMulParams& p);

// y[i] = a[i * sa] OP b[i * sb] in f32, OP one of + - * / (each rounded
// once, as the scalar operation), sa and sb 0 (one value) or 1 (a dense
// row). y may be a or b itself; any other overlap runs element by element.
enum class Arith : unsigned { kAdd, kSub, kMul, kDiv };
void arith_f32(Arith op, float* y, const float* a, std::size_t sa, const float* b, std::size_t sb, std::size_t n);

// Pooling's per-tap steps over a row of outputs: in[i * stride] into out[i].
// max: the larger, a NaN in either kept (in's when in is NaN); add: +=.
void max_strided_f32(float* out, const float* in, std::size_t n, std::size_t stride);
void add_strided_f32(float* out, const float* in, std::size_t n, std::size_t stride);
// The same over blocks: out[r * n + i] and in[r * in_step + i] for r <
// blocks and i < n (NHWC pooling's step for one tap over a row of outputs,
// n channels each, their inputs in_step apart).
void max_blocks_f32(float* out, const float* in, std::size_t n, std::size_t blocks, std::size_t in_step);
void add_blocks_f32(float* out, const float* in, std::size_t n, std::size_t blocks, std::size_t in_step);
// acc[i] += x[r * stride + i] for i < n and r < rows, in row order: a
// global pool's sums over its taps (channels last), a vector of channels
// per tap, each step one f32 addition, as add_strided_f32 tap by tap.
void add_rows_f32(float* acc, const float* x, std::size_t n, std::size_t rows, std::size_t stride);
// The same over halves or bf16 words, each widened exactly before it is
// added (a NaN's payload aside, which a sum does not pin: addition commutes).
void add_rows_f16(float* acc, const std::uint16_t* x, std::size_t n, std::size_t rows, std::size_t stride);
void add_rows_bf16(float* acc, const std::uint16_t* x, std::size_t n, std::size_t rows, std::size_t stride);

// Convolution's per-tap step over a row of outputs: out[i] += w * in[i *
// stride], the product rounded to f32, then added (never fused), so that
// every level gives the same bits.
void madd_strided_f32(float* out, const float* in, std::size_t n, std::size_t stride, float w);

// A depthwise convolution's row of outputs, channels innermost (NHWC):
// for each output column o < ow and channel c < ch,
//   out[o * ch + c] = bias[c] + in[0][o * step + c] * w[c] + ...
//                       + in[taps - 1][o * step + c] * w[(taps - 1) * ch + c]
// each product rounded to f32, then added (never fused), in tap order, so
// that every level gives the same bits. in[t] is tap t's input row.
void dw_rows_f32(float* out, const float* const* in, const float* w, const float* bias, std::size_t taps,
                 std::size_t ow, std::size_t ch, std::size_t step);

// How dw_rows_q8 requantises each channel's sum, as requantize_u8 does:
// bias and mul one per channel.
struct DwRequant {
  const std::int32_t* bias;
  const float* mul;
  std::int32_t zero, lo, hi;
};
// A depthwise integer convolution's row of outputs from rows of quads,
// requantised: for each output column o < ow and channel c < ch, with
// i = 4 * (o * step + c),
//   a = sum over q < quads and e < 4 of in[q][i + e] * w[4 * (q * ch + c) + e]
// (in u8, w s8), in 32 bits, wrapping, and out[o * out_step + c] is a
// requantised as requantize_u8 does with rq.bias[c] and rq.mul[c] (finite
// multipliers: for a NaN product requantize_u8 gives its cast's value). in[q]
// holds a row's pixels, channels innermost, each value beside the next
// three taps' of its kernel row (quad_bytes_u8): AVX-512 VNNI's vpdpbusd
// multiplies and adds four taps in one step. Exact integer sums and the
// same requantisation, so every level gives the same bytes.
void dw_rows_q8(std::uint8_t* out, std::size_t out_step, const std::uint8_t* const* in, const std::int8_t* w,
                std::size_t quads, std::size_t ow, std::size_t ch, std::size_t step, const DwRequant& rq);
// out[4 * (k * n + i) + e] = in[k * in_step + i + e * partner] ^ flip for
// k < cols, i < n and e < 4: `cols` runs of n bytes (a pixel's channels)
// as dw_rows_q8's input, each byte beside the next three taps' (flip 0x80
// reads i8 as u8, plus 128).
void quad_bytes_u8(std::uint8_t* out, const std::uint8_t* in, std::size_t n, std::size_t cols, std::size_t in_step,
                   std::size_t partner, std::uint8_t flip);

// e^x in f32 from IEEE additions and multiplications only (Cody-Waite
// reduction by ln 2, a degree-5 polynomial, two exact scalings), so every
// level and host gives the same bits: within 2 ulp of e^x for normal
// results; 0 below about -103.9 (subnormals rounded once), inf above
// 88.72; a quiet NaN for NaN.
float exp_f32(float x);

// The activations built on it, in place: sigmoid p = 1 / (1 + exp_f32(-p)),
// silu p = p / (1 + exp_f32(-p)); each element exactly as written with the
// scalar exp_f32.
void sigmoid_f32(float* p, std::size_t n);
void silu_f32(float* p, std::size_t n);
// erf in f32 from IEEE operations and exp_f32 only, so every level and host
// gives the same bits: within 2 ulp of erf; NaN for NaN. erf_f32s: in
// place over a span, each element exactly as the scalar erf_f32 gives it.
float erf_f32(float x);
void erf_f32s(float* p, std::size_t n);
// out[i] = exp_f32(in[i] - shift), the difference rounded to f32 first:
// softmax's exponentials, each exactly as written with the scalar exp_f32.
void exp_shifted_f32(const float* in, float* out, std::size_t n, float shift);

// The other activations, in place, each element exactly as written:
// relu p > 0 ? p : 0; clip min(max(p, lo), hi); leaky p < 0 ? alpha * p : p;
// hard sigmoid min(max(alpha * p + beta, 0), 1) and hard swish p times it
// (products and sums rounded separately, never fused).
void relu_f32(float* p, std::size_t n);
void clip_f32(float* p, std::size_t n, float lo, float hi);
void leaky_relu_f32(float* p, std::size_t n, float alpha);
void hard_sigmoid_f32(float* p, std::size_t n, float alpha, float beta);
void hard_swish_f32(float* p, std::size_t n, float alpha, float beta);

// Conversions between f16 / bf16 and f32, exactly as fw/half.h's
// f16_to_f32, bf16_to_f32, f32_to_f16 and f32_to_bf16 convert
// (round to nearest even; NaN as those give it).
void widen_f16(const std::uint16_t* in, float* out, std::size_t n);
void widen_bf16(const std::uint16_t* in, float* out, std::size_t n);
void narrow_f16(const float* in, std::uint16_t* out, std::size_t n);
void narrow_bf16(const float* in, std::uint16_t* out, std::size_t n);

// One image row of BT.601 limited-range YUV as normalised planar RGB:
// pixel i has Y = luma[i], U = u[i / 2 * step], V = v[i / 2 * step], and
//   y = 1.164 (Y - 16), R = y + 1.596 (V - 128),
//   G = y - 0.813 (V - 128) - 0.391 (U - 128), B = y + 2.018 (U - 128)
// in f32 as written (each product and sum rounded, never fused); then
// rgb[k * n + i] = (min(max(C_k, 0), 255) - mean[k]) * scale[k].
void yuv_row_f32(const std::uint8_t* luma, const std::uint8_t* u, const std::uint8_t* v, std::size_t step,
                 std::size_t n, const float* mean, const float* scale, float* rgb);

// The vector entry points above (all but the scalar exp_f32 and erf_f32), in one list:
// each level's table, the dispatch and its checks are expanded from it.
#define TPUHAL_SIMD_ENTRY_POINTS(X) \
  X(add_i32)                        \
  X(add_abs_i8)                     \
  X(sum_abs_i8)                     \
  X(sum_i8)                         \
  X(dot_rows_i8)                    \
  X(lookup_u8)                      \
  X(interleave_8)                   \
  X(interleave_32)                  \
  X(split_nibbles)                  \
  X(join_nibble_sums)               \
  X(max_8)                          \
  X(requantize_u8)                  \
  X(quantize_f32)                   \
  X(dequantize_8)                   \
  X(add_dequantized_8)              \
  X(qadd_8)                         \
  X(qmul_8)                         \
  X(arith_f32)                      \
  X(max_strided_f32)                \
  X(add_strided_f32)                \
  X(max_blocks_f32)                 \
  X(add_blocks_f32)                 \
  X(add_rows_f32)                   \
  X(add_rows_f16)                   \
  X(add_rows_bf16)                  \
  X(madd_strided_f32)               \
  X(dw_rows_f32)                    \
  X(dw_rows_q8)                     \
  X(quad_bytes_u8)                  \
  X(sigmoid_f32)                    \
  X(silu_f32)                       \
  X(exp_shifted_f32)                \
  X(erf_f32s)                       \
  X(relu_f32)                       \
  X(clip_f32)                       \
  X(leaky_relu_f32)                 \
  X(hard_sigmoid_f32)               \
  X(hard_swish_f32)                 \
  X(widen_f16)                      \
  X(widen_bf16)                     \
  X(narrow_f16)                     \
  X(narrow_bf16)                    \
  X(yuv_row_f32)

// One level's versions of the entry points.
struct Kernels {
  Isa isa;  // the level they were built for
#define TPUHAL_SIMD_MEMBER(name) decltype(&simd::name) name;
  TPUHAL_SIMD_ENTRY_POINTS(TPUHAL_SIMD_MEMBER)
#undef TPUHAL_SIMD_MEMBER
};

// The versions for an engine at `isa`: those of the highest level at or
// below it that has its own (x86-64: sse2, sse41, avx2, avx512; elsewhere
// one portable build, which on arm64 uses Advanced SIMD as its baseline).
const Kernels& kernels(Isa isa);

// The versions the entry points run: kernels(isa_from_env()) as it is at
// the first call (where it refuses TPUHAL_MAX_ISA, the lowest level's:
// opening a board refuses the value first, naming it), or those of the
// level last given to use_level().
const Kernels& active();
// From now on, in the whole process, the entry points run kernels(isa)
// (tests compare levels in one process).
void use_level(Isa isa);

// The entry points' names, in TPUHAL_SIMD_ENTRY_POINTS's order.
std::span<const std::string_view> entry_points();
// The level whose version of `entry` kernels(isa) holds, or that the entry
// point runs now (active()); nullopt for a name that is not an entry point.
std::optional<Isa> version(std::string_view entry, Isa isa);
std::optional<Isa> version(std::string_view entry);

}  // namespace tpuhal::sim::tensor::simd
