// The float GEMM: B packed (widened to f32), then gemm::multiply's
// blocking, each C tile carrying its elements' sums from one block of K to
// the next (the kernels are per ISA, in gemm_<isa>.cpp).
#include "fgemm.h"

#include <algorithm>
#include <vector>

#include "engine.h"
#include "gemm_driver.h"

namespace tpuhal::sim::tensor::fgemm {
namespace {

// A with at most one block of rows (kMC) and B with panels enough for every
// thread: a matrix-vector product, a model's last layer at batch 1. The
// general route packs all of B into memory first and reads it back, three
// passes over B where the product itself makes one; here each thread packs
// its next panel of B into its own buffer, which stays in cache while A's
// few rows pass, so that B is read once. A, small, is packed once. The
// kernel calls, their K blocks and their order for each tile are the ones
// gemm::multiply makes: the same bits.
void few_rows(TensorEngine& e, const Kernels& k, std::uint64_t m, std::uint64_t n, std::uint64_t kdim, const Matrix& a,
              const Matrix& b, float* c, std::uint64_t ldc) {
  const std::uint64_t nr = k.nr, mr = k.mr, panels = (n + nr - 1) / nr;
  const std::uint64_t rows = (m + mr - 1) / mr * mr;  // A's rows, packed with zeros to whole micro-panels
  const std::uint64_t kblocks = (kdim + kMaxKc - 1) / kMaxKc, kblock = (kdim + kblocks - 1) / kblocks;
  // Block k0 of A (rows x kc, as pack_a lays it out) at ap + k0 * rows.
  float* const ap = e.scratch_f32(rows * kdim);
  for (std::uint64_t k0 = 0; k0 < kdim; k0 += kblock)
    k.pack_a(a, 0, m, k0, std::min(kblock, kdim - k0), ap + k0 * rows);
  e.pool().parallel_for(panels, [&](std::uint64_t q0, std::uint64_t q1) {
    thread_local std::vector<float> panel;  // each thread's panel of B, kept for its next call
    if (panel.size() < kdim * nr) panel.resize(kdim * nr);
    for (std::uint64_t q = q0; q < q1; ++q) {
      k.pack_b(b, kdim, n, q, q + 1, panel.data());
      const auto cols = static_cast<unsigned>(std::min(nr, n - q * nr));
      for (std::uint64_t k0 = 0; k0 < kdim; k0 += kblock) {
        const std::uint64_t kc = std::min(kblock, kdim - k0);
        for (std::uint64_t r = 0; r < m; r += mr)
          k.kernel(kc, ap + k0 * rows + r * kc, panel.data() + k0 * nr, c + r * ldc + q * nr, ldc,
                   static_cast<unsigned>(std::min(mr, m - r)), cols, k0 != 0);
      }
    }
  });
}

// A few rows of A by a B whose rows are dense (a Linear layer's weights as
// the compiler lays them out, [K, N]): B is read in place, once per row of
// A and block of columns (from cache after the first row), and nothing is
// packed. Each element is the same chain as the kernels' (Kernels::row).
void rows_in_place(TensorEngine& e, const Kernels& k, std::uint64_t m, std::uint64_t n, std::uint64_t kdim,
                   const Matrix& a, const Matrix& b, float* c, std::uint64_t ldc) {
  float* const arows = e.scratch_f32(m * kdim);
  for (std::uint64_t i = 0; i < m; ++i) k.load_row(a, i, kdim, arows + i * kdim);
  constexpr std::uint64_t kBlock = 128;  // columns per part: a multiple of every level's row width
  e.pool().parallel_for((n + kBlock - 1) / kBlock,
                        [&](std::uint64_t p0, std::uint64_t p1) {
                          const std::uint64_t n0 = p0 * kBlock, n1 = std::min(n, p1 * kBlock);
                          for (std::uint64_t i = 0; i < m; ++i) k.row(arows + i * kdim, b, kdim, n0, n1, c + i * ldc);
                        },
                        std::max<std::uint64_t>(1, 65536 / (m * kdim * kBlock + 1)));
}

}  // namespace

void gemm(TensorEngine& e, const Kernels& k, std::uint64_t m, std::uint64_t n, std::uint64_t kdim, const Matrix& a,
          const Matrix& b, float* c, std::uint64_t ldc) {
  if (m == 0 || n == 0) return;
  if (kdim == 0) {
    for (std::uint64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    return;
  }
  const std::uint64_t nr = k.nr, panels = (n + nr - 1) / nr, panel_floats = kdim * nr;
  // Rows of A that would fill a third of the kernel's at most: the kernel
  // computes all of its rows whatever the tile holds.
  if (b.cs == 1 && m * 3 <= k.mr) return rows_in_place(e, k, m, n, kdim, a, b, c, ldc);
  if (m <= gemm::kMC && !gemm::by_rows(e, m, n, k.mr, nr)) return few_rows(e, k, m, n, kdim, a, b, c, ldc);
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
