// The tensor engine's GEMM kernels for arm64's Advanced SIMD
// (fgemm.h, igemm.h): the code is written once, in fgemm_kernels.inc and
// igemm_kernels.inc, over the vector types defined here.
#include <arm_neon.h>

#include <cstring>

#include "gemm_kernels.h"

namespace tpuhal::sim::tensor::gemm_neon {
namespace {

struct V {
  using reg = int32x4_t;
  static reg load(const std::int32_t* p) { return vld1q_s32(p); }
  static void store(std::int32_t* p, reg r) { vst1q_s32(p, r); }
  static reg add(reg a, reg b) { return vaddq_s32(a, b); }
};

struct F {
  using reg = float32x4_t;
  static constexpr unsigned kLanes = 4;
  static constexpr bool kFma = true;
  static reg zero() { return vdupq_n_f32(0.0f); }
  static reg load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, reg r) { vst1q_f32(p, r); }
  static reg bcast(const float* p) { return vld1q_dup_f32(p); }
  static reg fma(reg a, reg b, reg c) { return vfmaq_f32(c, a, b); }
  static int32x4_t to_int(reg r) { return vcvtnq_s32_f32(r); }
};
constexpr unsigned FMR = 8, FNV = 2;

#include "fgemm_kernels.inc"
#include "igemm_kernels.inc"

}  // namespace

extern const gemm::Kernels kKernels = {make_float_kernels(Isa::kNeon), make_int_kernels(Isa::kNeon)};

}  // namespace tpuhal::sim::tensor::gemm_neon
