// The blocking and threading the float and the integer GEMM share, around
// a packed B (fgemm.cpp, igemm.cpp). Internal to the simulator.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine.h"

namespace tpuhal::sim::tensor::gemm {

inline constexpr std::uint64_t kMC = 96;  // rows of A per block (a multiple of every MR)

// The next B panel's block, fetched into cache a slice per kernel call
// while the current panel is in use: the hardware's prefetchers do not run
// far enough ahead for a panel that comes from L3, which cost a third of
// the kernels' time (measured on AVX2: 58 GFLOPS without, 80 with).
struct NextPanel {
  const void* base;        // null: no next panel
  std::uint64_t bytes;     // of its block
  std::uint64_t rows, mr;  // the calls are rows / mr, one per MR rows
  void prefetch(std::uint64_t r) const {
    if (!base) return;
    const std::uint64_t calls = (rows + mr - 1) / mr, lines = (bytes + 63) / 64;
    const std::uint64_t per = (lines + calls - 1) / calls, first = r / mr * per;
    const auto* p = static_cast<const char*>(base);
    for (std::uint64_t l = first; l < first + per && l < lines; ++l) __builtin_prefetch(p + l * 64, 0, 3);
  }
};

// Whether multiply() splits A's micro-panels among the threads (each
// taking every panel of B), rather than B's panels (each taking all of A).
inline bool by_rows(TensorEngine& e, std::uint64_t m, std::uint64_t n, std::uint64_t mr, std::uint64_t nr) {
  const std::uint64_t panels = (n + nr - 1) / nr, mpanels = (m + mr - 1) / mr;
  return mpanels >= 2 * static_cast<std::uint64_t>(e.threads()) || panels == 1;
}

// C = A * B with B already packed at `bp` (panels of nr columns, each
// kdim x nr floats), blocked as BLIS does: per block of kMC rows of A, A is
// packed `max_kc` columns at a time (pack_a(m0, mc, k0, kc, block)) and each
// MR x NR tile of C computed by kernel(kc, a, b, row, panel, rows, cols,
// accumulate), the B panel staying in L1 while A's micro-panels pass. Each
// thread takes a contiguous range of A's micro-panels and every panel of B,
// or, when A has too few rows for that, a range of B's panels and all of A.
// K is cut into blocks as even as max_kc allows (576 as 3 x 192, not 256 +
// 256 + 64: a short block pays the kernel's fixed costs for little work).
template <class PackA, class Kernel>
void multiply(TensorEngine& e, std::uint64_t m, std::uint64_t n, std::uint64_t kdim, std::uint64_t mr, std::uint64_t nr,
              std::uint64_t max_kc, const float* bp, PackA&& pack_a, Kernel&& kernel) {
  const std::uint64_t panels = (n + nr - 1) / nr, panel_floats = kdim * nr, mpanels = (m + mr - 1) / mr;
  const std::uint64_t kblocks = (kdim + max_kc - 1) / max_kc, kblock = (kdim + kblocks - 1) / kblocks;
  const bool rows_split = by_rows(e, m, n, mr, nr);
  e.pool().parallel_for(rows_split ? mpanels : panels, [&](std::uint64_t u0, std::uint64_t u1) {
    thread_local std::vector<float> block;  // each thread's block of A, kept for its next call
    if (block.size() < kMC * max_kc) block.resize(kMC * max_kc);
    const std::uint64_t r_begin = rows_split ? u0 * mr : 0, r_end = rows_split ? std::min(m, u1 * mr) : m;
    const std::uint64_t q0 = rows_split ? 0 : u0, q1 = rows_split ? panels : u1;
    for (std::uint64_t m0 = r_begin; m0 < r_end; m0 += kMC) {
      const std::uint64_t mc = std::min(kMC, r_end - m0);
      for (std::uint64_t k0 = 0; k0 < kdim; k0 += kblock) {
        const std::uint64_t kc = std::min(kblock, kdim - k0);
        pack_a(m0, mc, k0, kc, block.data());
        for (std::uint64_t q = q0; q < q1; ++q) {
          const float* panel = bp + q * panel_floats + k0 * nr;
          const auto cols = static_cast<unsigned>(std::min(nr, n - q * nr));
          const NextPanel next{q + 1 < q1 ? panel + panel_floats : nullptr, kc * nr * sizeof(float), mc, mr};
          for (std::uint64_t r = 0; r < mc; r += mr) {
            next.prefetch(r);
            kernel(kc, block.data() + r * kc, panel, m0 + r, q, static_cast<unsigned>(std::min(mr, mc - r)), cols,
                   k0 != 0);
          }
        }
      }
    }
  });
}

}  // namespace tpuhal::sim::tensor::gemm
