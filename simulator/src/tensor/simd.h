// The tensor engine's innermost loops, compiled for several instruction
// sets and chosen at run time (GCC function multi-versioning): the build
// targets baseline x86-64, the machine may have AVX2 or AVX-512.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tpuhal::sim::tensor::simd {

// out[i] += add[i] (two's complement wrap).
void add_i32(std::int32_t* out, const std::int32_t* add, std::size_t n);

// sums[i] += |row[i]| (row s8).
void add_abs_i8(std::uint32_t* sums, const std::int8_t* row, std::size_t n);

// sum of |v[i]| (v s8).
std::uint64_t sum_abs_i8(const std::int8_t* v, std::size_t n);

// out[i] = clamp(round_half_even(acc[i] * mul[i]) + zero, lo, hi) as a byte
// (u8, or i8 two's complement), for |acc[i] * mul[i]| up to 2^22 (beyond,
// the result saturates).
void requantize_u8(const std::int32_t* acc, const float* mul, std::uint8_t* out, std::size_t n, std::int32_t zero,
                   std::int32_t lo, std::int32_t hi);

// Pooling's per-tap steps over a row of outputs: in[i * stride] into out[i].
// max: the larger, a NaN in either kept (in's when in is NaN); add: +=.
void max_strided_f32(float* out, const float* in, std::size_t n, std::size_t stride);
void add_strided_f32(float* out, const float* in, std::size_t n, std::size_t stride);

// Convolution's per-tap step over a row of outputs: out[i] += w * in[i *
// stride], the product rounded to f32, then added (never fused), so that
// every level gives the same bits.
void madd_strided_f32(float* out, const float* in, std::size_t n, std::size_t stride, float w);

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

// The other activations, in place, each element exactly as written:
// relu p > 0 ? p : 0; clip min(max(p, lo), hi); leaky p < 0 ? alpha * p : p;
// hard sigmoid min(max(alpha * p + beta, 0), 1) and hard swish p times it
// (products and sums rounded separately, never fused).
void relu_f32(float* p, std::size_t n);
void clip_f32(float* p, std::size_t n, float lo, float hi);
void leaky_relu_f32(float* p, std::size_t n, float alpha);
void hard_sigmoid_f32(float* p, std::size_t n, float alpha, float beta);
void hard_swish_f32(float* p, std::size_t n, float alpha, float beta);

// Conversions between f16 / bf16 and f32, exactly as numerics.h's
// half_to_float, bf16_to_float, float_to_half and float_to_bf16 convert
// (round to nearest even; NaN as those give it).
void widen_f16(const std::uint16_t* in, float* out, std::size_t n);
void widen_bf16(const std::uint16_t* in, float* out, std::size_t n);
void narrow_f16(const float* in, std::uint16_t* out, std::size_t n);
void narrow_bf16(const float* in, std::uint16_t* out, std::size_t n);

}  // namespace tpuhal::sim::tensor::simd
