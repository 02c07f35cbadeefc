// The integer GEMM: B packed once (zero points taken off, in f32), then
// gemm::multiply's blocking, each block of at most kMaxKc products summed
// exactly and added to C in int32 (the kernels are per ISA, in
// gemm_<isa>.cpp).
#include "igemm.h"

#include <algorithm>
#include <vector>

#include "engine.h"
#include "gemm_driver.h"

namespace tpuhal::sim::tensor::igemm {

std::size_t MatrixLines::segments(std::uint64_t line, std::uint64_t from, std::uint64_t count, Segment* out) const {
  out[0] = Segment{base_ + static_cast<std::int64_t>(line) * line_stride_ + static_cast<std::int64_t>(from) * stride_,
                   count, stride_};
  return 1;
}

std::uint64_t packed_b_floats(const Kernels& k, std::uint64_t n, std::uint64_t kdim) {
  return (n + k.nr - 1) / k.nr * kdim * k.nr;
}

void pack_b(TensorEngine& e, const Kernels& k, std::uint64_t n, std::uint64_t kdim, const Lines& b, bool b_rows,
            float* bp) {
  const std::uint64_t nr = k.nr, panels = (n + nr - 1) / nr, panel_floats = kdim * nr;
  if (b_rows) {
    e.pool().parallel_for(kdim, [&](std::uint64_t k0, std::uint64_t k1) {
      std::vector<float> line(n);
      std::vector<Segment> segs(n + 2);
      k.pack_b_rows(b, n, k0, k1, bp, panel_floats, line.data(), segs.data());
    });
  } else {
    std::fill(bp + (panels - 1) * panel_floats, bp + panels * panel_floats, 0.0f);
    e.pool().parallel_for(n, [&](std::uint64_t n0, std::uint64_t n1) {
      std::vector<float> line(kdim);
      std::vector<Segment> segs(kdim + 2);
      k.pack_b_cols(b, kdim, n0, n1, bp, panel_floats, line.data(), segs.data());
    });
  }
}

void gemm_packed(TensorEngine& e, const Kernels& k, std::uint64_t m, std::uint64_t n, std::uint64_t kdim,
                 const Lines& a, const float* bp, std::int32_t* c, std::uint64_t ldc) {
  if (m == 0 || n == 0) return;
  if (kdim == 0) {  // nothing packed: every sum is empty
    for (std::uint64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0);
    return;
  }
  const std::uint64_t nr = k.nr;
  gemm::multiply(
      e, m, n, kdim, k.mr, nr, kMaxKc, bp,
      [&](std::uint64_t m0, std::uint64_t mc, std::uint64_t k0, std::uint64_t kc, float* block) {
        thread_local std::vector<Segment> segs;  // each thread's, kept for its next call
        if (segs.size() < kMaxKc + 2) segs.resize(kMaxKc + 2);
        k.pack_a(a, m0, mc, k0, kc, block, segs.data());
      },
      [&](std::uint64_t kc, const float* ap, const float* panel, std::uint64_t row, std::uint64_t q, unsigned rows,
          unsigned cols,
          bool accumulate) { k.kernel(kc, ap, panel, c + row * ldc + q * nr, ldc, rows, cols, accumulate); });
}

void gemm(TensorEngine& e, const Kernels& k, std::uint64_t m, std::uint64_t n, std::uint64_t kdim, const Lines& a,
          const Lines& b, bool b_rows, std::int32_t* c, std::uint64_t ldc) {
  if (m == 0 || n == 0 || kdim == 0) return gemm_packed(e, k, m, n, kdim, a, nullptr, c, ldc);
  // B, packed once for every block of A, into memory kept from call to call
  // (the engine runs one op at a time).
  float* const bp = e.scratch_f32(packed_b_floats(k, n, kdim));
  pack_b(e, k, n, kdim, b, b_rows, bp);
  gemm_packed(e, k, m, n, kdim, a, bp, c, ldc);
}

}  // namespace tpuhal::sim::tensor::igemm
