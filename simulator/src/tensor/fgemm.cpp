// The float GEMM: B packed (widened to f32), then gemm::multiply's
// blocking, each C tile carrying its elements' sums from one block of K to
// the next (the kernels are per ISA, in gemm_<isa>.cpp).
#include "fgemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "engine.h"
#include "gemm_driver.h"

namespace tpuhal::sim::tensor::fgemm {
namespace {

// A copy of B made by `fill` (`floats` floats, `layout` naming how they
// are laid out), kept from one call to the next (a Linear layer's weights,
// run after run), or null. Only B worth it (kMinKeptBytes) and seen
// before with no write to it since, which the board's DRAM write log
// vouches for (derived_values): an operand computed every run (an
// attention's values) is never copied, and neither are bytes the host can
// write (the aperture). B with a negative or zero stride is not kept.
// From 64 KiB: a squeeze-and-excitation block's products at batch 8 in
// bf16 (144 x 576, 162 KiB) packed B on every call and took four times
// their f32 time; kept, MobileNetV3-Small bf16's products at batch 8 went
// from 1280 to 1059 us and EfficientNet-B0 fp32's from 1273 to 1068 us.
constexpr std::uint64_t kMinKeptBytes = std::uint64_t{64} << 10;

template <class Fill>
const float* kept_copy(TensorEngine& e, std::int64_t layout, std::uint64_t n, std::uint64_t kdim, const Matrix& b,
                       std::uint64_t floats, Fill&& fill) {
  if (b.rs <= 0 || b.cs <= 0) return nullptr;
  const std::uint64_t es = b.type == Type::kF32 ? 4 : 2;
  const std::uint64_t bytes =
      ((kdim - 1) * static_cast<std::uint64_t>(b.rs) + (n - 1) * static_cast<std::uint64_t>(b.cs) + 1) * es;
  if (bytes < kMinKeptBytes) return nullptr;
  const auto at = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(b.base));
  const auto S = [](std::uint64_t v) { return static_cast<std::int64_t>(v); };
  PackedCache::Key key{layout, at, b.rs, b.cs, static_cast<std::int64_t>(b.type), S(kdim), S(n)};
  if (const float* hit = e.packed_cache().find(key, b.base, bytes)) return hit;
  const DerivedValues::Key seen{layout, at, S(kdim), S(n)};
  if (!e.derived_values().find(seen, b.base, bytes)) {
    e.derived_values().keep(seen, b.base, bytes, 1, e.derived_values().now());
    return nullptr;
  }
  float* const into = e.packed_cache().insert(std::move(key), b.base, bytes, floats);
  if (into) fill(into);
  return into;
}

// B's columns in panels of k.row_cols, each all of B's rows in B's type,
// dense and the last padded with zeros (kept_copy), or null. A thread's
// panels are then one stretch of memory: reading a 4 MB classifier's rows
// in halves, one per thread, ran at 17 to 30 GB/s on a 2-core Zen 5, the
// two halves of the same bytes at 33 to 69.
const std::byte* kept_panels(TensorEngine& e, const Kernels& k, std::uint64_t n, std::uint64_t kdim, const Matrix& b) {
  const std::uint64_t rc = k.row_cols, es = b.type == Type::kF32 ? 4 : 2;
  if (n < 2 * rc || b.cs != 1 || b.rs < static_cast<std::int64_t>(n)) return nullptr;
  const auto rs = static_cast<std::uint64_t>(b.rs);
  const std::uint64_t panels = (n + rc - 1) / rc, panel = kdim * rc * es;
  const auto fill = [&](float* into) {
    auto* const out = reinterpret_cast<std::byte*>(into);
    e.pool().parallel_for(panels, [&](std::uint64_t q0, std::uint64_t q1) {
      for (std::uint64_t q = q0; q < q1; ++q) {
        const std::uint64_t c0 = q * rc, cols = std::min(rc, n - c0);
        for (std::uint64_t kk = 0; kk < kdim; ++kk) {
          std::byte* const to = out + q * panel + kk * rc * es;
          std::memcpy(to, b.base + (kk * rs + c0) * es, cols * es);
          std::memset(to + cols * es, 0, (rc - cols) * es);
        }
      }
    });
  };
  constexpr std::int64_t kRowPanels = 0x5250;  // "RP"
  const float* kept =
      kept_copy(e, kRowPanels + static_cast<std::int64_t>(rc << 16), n, kdim, b, (panels * panel + 3) / 4, fill);
  return reinterpret_cast<const std::byte*>(kept);
}

// B packed as Kernels::pack_b lays it out (panels of k.nr columns, f32),
// kept (kept_copy), or null: the general route and few_rows then read it
// in order instead of packing it on every call, which read a few columns
// of every row of B.
const float* kept_packed_b(TensorEngine& e, const Kernels& k, std::uint64_t n, std::uint64_t kdim, const Matrix& b) {
  const std::uint64_t nr = k.nr, panels = (n + nr - 1) / nr, panel_floats = kdim * nr;
  constexpr std::int64_t kPackedB = 0x5042;  // "PB"
  return kept_copy(e, kPackedB + static_cast<std::int64_t>(nr << 16), n, kdim, b, panels * panel_floats,
                   [&](float* into) {
                     e.pool().parallel_for(panels, [&](std::uint64_t q0, std::uint64_t q1) {
                       k.pack_b(b, kdim, n, q0, q1, into + q0 * panel_floats);
                     });
                   });
}

// A with at most one block of rows (kMC) and B with panels enough for every
// thread: a matrix-vector product, a model's last layer at batch 1. The
// general route packs all of B into memory first and reads it back, three
// passes over B where the product itself makes one; here each thread packs
// its next panel of B into its own buffer, which stays in cache while A's
// few rows pass, so that B is read once. A, small, is packed once. The
// kernel calls, their K blocks and their order for each tile are the ones
// gemm::multiply makes: the same bits. B kept packed (kept_packed_b) is
// read as it is, in order.
void few_rows(TensorEngine& e, const Kernels& k, std::uint64_t m, std::uint64_t n, std::uint64_t kdim, const Matrix& a,
              const Matrix& b, float* c, std::uint64_t ldc) {
  const std::uint64_t nr = k.nr, mr = k.mr, panels = (n + nr - 1) / nr;
  const std::uint64_t rows = (m + mr - 1) / mr * mr;  // A's rows, packed with zeros to whole micro-panels
  const std::uint64_t kblocks = (kdim + kMaxKc - 1) / kMaxKc, kblock = (kdim + kblocks - 1) / kblocks;
  // Block k0 of A (rows x kc, as pack_a lays it out) at ap + k0 * rows.
  float* const ap = e.scratch_f32(rows * kdim);
  for (std::uint64_t k0 = 0; k0 < kdim; k0 += kblock)
    k.pack_a(a, 0, m, k0, std::min(kblock, kdim - k0), ap + k0 * rows);
  const float* const kept = kept_packed_b(e, k, n, kdim, b);
  e.pool().parallel_for(panels, [&](std::uint64_t q0, std::uint64_t q1) {
    thread_local std::vector<float> panel;  // each thread's panel of B, kept for its next call
    if (!kept && panel.size() < kdim * nr) panel.resize(kdim * nr);
    for (std::uint64_t q = q0; q < q1; ++q) {
      const float* bq = kept ? kept + q * kdim * nr : panel.data();
      if (!kept) k.pack_b(b, kdim, n, q, q + 1, panel.data());
      const auto cols = static_cast<unsigned>(std::min(nr, n - q * nr));
      for (std::uint64_t k0 = 0; k0 < kdim; k0 += kblock) {
        const std::uint64_t kc = std::min(kblock, kdim - k0);
        for (std::uint64_t r = 0; r < m; r += mr)
          k.kernel(kc, ap + k0 * rows + r * kc, bq + k0 * nr, c + r * ldc + q * nr, ldc,
                   static_cast<unsigned>(std::min(mr, m - r)), cols, k0 != 0);
      }
    }
  });
}

// rows_in_place over kept_panels' `panels`: each panel's columns by
// Kernels::row, a few rows of A in turn (the last panel's padding summed
// into a buffer and dropped). The same chains as in place.
void rows_by_panels(TensorEngine& e, const Kernels& k, std::uint64_t m, std::uint64_t n, std::uint64_t kdim,
                    const float* arows, const std::byte* panels, Type type, float* c, std::uint64_t ldc) {
  const std::uint64_t rc = k.row_cols, panel = kdim * rc * (type == Type::kF32 ? 4 : 2);
  e.pool().parallel_for((n + rc - 1) / rc, [&](std::uint64_t q0, std::uint64_t q1) {
    std::vector<float> part;
    for (std::uint64_t q = q0; q < q1; ++q) {
      const Matrix p{panels + q * panel, static_cast<std::int64_t>(rc), 1, type};
      const std::uint64_t c0 = q * rc, cols = std::min(rc, n - c0);
      for (std::uint64_t i = 0; i < m; ++i) {
        if (cols == rc) {
          k.row(arows + i * kdim, p, kdim, 0, rc, c + i * ldc + c0);
          continue;
        }
        part.resize(rc);
        k.row(arows + i * kdim, p, kdim, 0, rc, part.data());
        std::copy_n(part.data(), cols, c + i * ldc + c0);
      }
    }
  });
}

// A few rows of A by a B whose rows are dense (a Linear layer's weights as
// the compiler lays them out, [K, N]): B is read in place, once per row of
// A and block of columns (from cache after the first row), or from its
// kept panels (kept_panels). Each element is the same chain as the
// kernels' (Kernels::row).
void rows_in_place(TensorEngine& e, const Kernels& k, std::uint64_t m, std::uint64_t n, std::uint64_t kdim,
                   const Matrix& a, const Matrix& b, float* c, std::uint64_t ldc) {
  float* const arows = e.scratch_f32(m * kdim);
  for (std::uint64_t i = 0; i < m; ++i) k.load_row(a, i, kdim, arows + i * kdim);
  if (const std::byte* panels = kept_panels(e, k, n, kdim, b))
    return rows_by_panels(e, k, m, n, kdim, arows, panels, b.type, c, ldc);
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
  // (the engine runs one op at a time), or kept packed from the last call.
  const float* bp = kept_packed_b(e, k, n, kdim, b);
  if (!bp) {
    float* const into = e.scratch_f32(panels * panel_floats);
    e.pool().parallel_for(
        panels, [&](std::uint64_t q0, std::uint64_t q1) { k.pack_b(b, kdim, n, q0, q1, into + q0 * panel_floats); });
    bp = into;
  }
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
