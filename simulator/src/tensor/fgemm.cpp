// The float GEMM: B packed once (widened to f32), then gemm::multiply's
// blocking, each C tile carrying its elements' sums from one block of K to
// the next (the kernels are per ISA, in gemm_<isa>.cpp).
#include "fgemm.h"

#include <algorithm>

#include "engine.h"
#include "gemm_driver.h"

namespace tpuhal::sim::tensor::fgemm {

void gemm(TensorEngine& e, const Kernels& k, std::uint64_t m, std::uint64_t n, std::uint64_t kdim, const Matrix& a,
          const Matrix& b, float* c, std::uint64_t ldc) {
  if (m == 0 || n == 0) return;
  if (kdim == 0) {
    for (std::uint64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    return;
  }
  const std::uint64_t nr = k.nr, panels = (n + nr - 1) / nr, panel_floats = kdim * nr;
  // B, packed once for every block of A, into memory kept from call to call
  // (the engine runs one op at a time).
  float* const bp = e.scratch_f32(panels * panel_floats);
  e.pool().parallel_for(
      panels, [&](std::uint64_t q0, std::uint64_t q1) { k.pack_b(b, kdim, n, q0, q1, bp + q0 * panel_floats); });
  gemm::multiply(
      e, m, n, kdim, k.mr, nr, kMaxKc, bp,
      [&](std::uint64_t m0, std::uint64_t mc, std::uint64_t k0, std::uint64_t kc, float* block) {
        k.pack_a(a, m0, mc, k0, kc, block);
      },
      [&](std::uint64_t kc, const float* ap, const float* panel, std::uint64_t row, std::uint64_t q, unsigned rows,
          unsigned cols,
          bool accumulate) { k.kernel(kc, ap, panel, c + row * ldc + q * nr, ldc, rows, cols, accumulate); });
}

}  // namespace tpuhal::sim::tensor::fgemm
