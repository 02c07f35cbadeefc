// The activations and the exp they use, as the simulator computes them
// (kernel.h): shared by the elementwise maps and the fused epilogues of
// matmul and the convolutions.
#pragma once

#include <math.h>

#include "kernel.h"

namespace tpuhal::cuda::k {

// tpuhal::Activation's values (the launchers check they agree).
enum ActKind : std::uint32_t {
  kActNone,
  kActRelu,
  kActClip,
  kActSigmoid,
  kActSilu,
  kActLeakyRelu,
  kActTanh,
  kActHardSigmoid,
  kActHardSwish,
};

struct Act {
  std::uint32_t kind = kActNone;
  float alpha = 0, beta = 0;
};

// std::max's and std::min's rules (NaN and signed zeros included), which
// the simulator's clip and hard sigmoid follow.
TK_FN float max_of(float a, float b) { return a < b ? b : a; }
TK_FN float min_of(float a, float b) { return b < a ? b : a; }

TK_FN float quiet_nan() { return bits_float(0x7fc00000u); }

// The simulator's e^x (simd.h exp_f32): a Cody-Waite reduction by ln 2, a
// degree-5 polynomial and two exact scalings, IEEE additions and
// multiplications only, so its sigmoid and silu have the same bits here.
TK_FN float exp_f32(float x) {
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693359375f;  // 9 bits: n * kLn2Hi is exact for |n| < 2^15
  const float kLn2Lo = -2.12194440e-4f;
  const float kMagic = 12582912.0f;  // 1.5 * 2^23: adding and removing it rounds to an integer
  float c = x != x ? 0.0f : x;
  c = c < -104.0f ? -104.0f : c;  // below: 0 after rounding
  c = c > 89.0f ? 89.0f : c;      // above: inf
  const float nf = (c * kLog2e + kMagic) - kMagic;
  const float r = (c - nf * kLn2Hi) - nf * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = (p * (r * r) + r) + 1.0f;
  // 2^n as two normal factors (n in [-150, 128]): the first product is
  // exact, the second rounds once, into the subnormals or to inf.
  const auto n = static_cast<std::int32_t>(nf);
  const std::int32_t h = n >> 1;
  const float e = (y * bits_float(static_cast<std::uint32_t>(h + 127) << 23)) *
                  bits_float(static_cast<std::uint32_t>(n - h + 127) << 23);
  return x != x ? quiet_nan() : e;
}

// The simulator's activations (engine.cpp activate, simd_kernels.inc),
// each product and sum rounded on its own.
TK_FN float activate(const Act& a, float x) {
  switch (a.kind) {
    case kActRelu: return x > 0 ? x : 0.0f;
    case kActClip: return min_of(max_of(x, a.alpha), a.beta);
    case kActSigmoid: return 1.0f / (1.0f + exp_f32(-x));
    case kActSilu: return x / (1.0f + exp_f32(-x));
    case kActLeakyRelu: return x < 0 ? a.alpha * x : x;
    case kActTanh: return ::tanhf(x);
    case kActHardSigmoid: return min_of(max_of(a.alpha * x + a.beta, 0.0f), 1.0f);
    case kActHardSwish: return x * min_of(max_of(a.alpha * x + a.beta, 0.0f), 1.0f);
    default: return x;
  }
}

// After a matrix product computed elsewhere (cuBLAS) into t = alpha * a @ b
// in f32: y = act(t + beta * c), c broadcast to y's shape (absent: 0), the
// same operations matmul_body does after its sum.
struct EpilogueParams {
  std::uint64_t n;
  Tensor t, c, y;
  float beta;
  Act act;
};
TK_FN void epilogue_body(const EpilogueParams& p, std::uint64_t i) {
  const float cv = p.c.addr ? load_f(p.c, offset_of(p.c, i)) : 0.0f;
  store_f(p.y, offset_of(p.y, i), activate(p.act, load_f(p.t, offset_of(p.t, i)) + p.beta * cv));
}

}  // namespace tpuhal::cuda::k
