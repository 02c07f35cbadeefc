// The tensor engine's GEMM kernels for portable C++: the lowest level on arm64 and the only one on other
// architectures
// (fgemm.h, igemm.h): the code is written once, in fgemm_kernels.inc and
// igemm_kernels.inc, over the vector types defined here.
#include <cmath>

#include <cstring>

#include "gemm_kernels.h"

namespace tpuhal::sim::tensor::gemm_generic {
namespace {

struct V {
  struct reg {
    std::uint32_t v[4];
  };
  static reg load(const std::int32_t* p) {
    reg r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
  }
  static void store(std::int32_t* p, reg r) { std::memcpy(p, r.v, sizeof r.v); }
  static reg add(reg a, reg b) {  // wraps, as int32 accumulators do
    for (unsigned i = 0; i < 4; ++i) a.v[i] += b.v[i];
    return a;
  }
};

struct F {  // one fused multiply-add per product, as the vector levels with FMA
  struct reg {
    float v[4];
  };
  static constexpr unsigned kLanes = 4;
  static constexpr bool kFma = true;
  static reg zero() { return reg{}; }
  static reg load(const float* p) {
    reg r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
  }
  static void store(float* p, reg r) { std::memcpy(p, r.v, sizeof r.v); }
  static reg bcast(const float* p) { return reg{{*p, *p, *p, *p}}; }
  static reg fma(reg a, reg b, reg c) {
    for (unsigned i = 0; i < kLanes; ++i) c.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
    return c;
  }
  static V::reg to_int(reg r) {  // the values are integers below 2^24
    V::reg out;
    for (unsigned i = 0; i < kLanes; ++i) out.v[i] = static_cast<std::uint32_t>(static_cast<std::int32_t>(r.v[i]));
    return out;
  }
};
constexpr unsigned FMR = 4, FNV = 1;

#include "fgemm_kernels.inc"
#include "igemm_kernels.inc"

}  // namespace

extern const gemm::Kernels kKernels = {make_float_kernels(Isa::kGeneric), make_int_kernels(Isa::kGeneric)};

}  // namespace tpuhal::sim::tensor::gemm_generic
