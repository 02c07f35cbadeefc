// Floating-point matrix products for the tensor engine's matmul, on every
// instruction set (isa.h). Internal to the simulator.
//
//   C[m, n] = sum_k A[m, k] * B[k, n]   in f32
//
// A and B are f32, f16 or bf16, widened to f32 as they are packed (exact).
// Every element of C is one chain of fused multiply-adds in k order,
// starting from 0, computed by one thread: the blocking, the tiling and the
// number of threads never change a bit of it. Levels with FMA instructions
// (x86 avx2 and up, arm64) therefore agree bit for bit with each other and
// with std::fma in a loop; sse2 and sse41, which have no FMA, round each
// product before adding it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "isa.h"

namespace tpuhal::sim::tensor {
class TensorEngine;
}

namespace tpuhal::sim::tensor::fgemm {

enum class Type : std::uint8_t { kF32, kF16, kBF16 };

// Element (i, j) at base + (i * rs + j * cs) * element size; strides in
// elements, any sign, 0 for a broadcast.
struct Matrix {
  const std::byte* base;
  std::int64_t rs, cs;
  Type type;
};

// One instruction set's kernels. Packed layouts (f32):
//  - A: micro-panels of MR rows, each kc x MR (k-major), rows past the
//    block's end zero;
//  - B: panels of NR columns, each k x NR (k-major), columns past n zero.
struct Kernels {
  Isa isa;
  unsigned mr, nr;
  unsigned row_cols;  // the columns `row` sums in registers at a time
  bool fma;
  // A rows [m0, m0 + mc), columns [k0, k0 + kc) (kc <= kMaxKc).
  void (*pack_a)(const Matrix& a, std::uint64_t m0, std::uint64_t mc, std::uint64_t k0, std::uint64_t kc, float* out);
  // B panels [q0, q1) of all k rows; panel q at out + (q - q0) * k * NR.
  void (*pack_b)(const Matrix& b, std::uint64_t k, std::uint64_t n, std::uint64_t q0, std::uint64_t q1, float* out);
  // C tile (mr x nr of MR x NR, row stride ldc) = (accumulate ? C : 0)
  // followed by kc multiply-adds of an A micro-panel and a B panel's rows.
  void (*kernel)(std::uint64_t kc, const float* a, const float* b, float* c, std::uint64_t ldc, unsigned mr,
                 unsigned nr, bool accumulate);
  // C[i, j] for j in [n0, n1) = row i of A (`arow`: its kdim elements,
  // widened) times B, whose rows are dense (cs == 1), read where they are:
  // one chain of multiply-adds in k order from 0 per element, as above.
  void (*row)(const float* arow, const Matrix& b, std::uint64_t kdim, std::uint64_t n0, std::uint64_t n1, float* c);
  // arow = row i of A, widened.
  void (*load_row)(const Matrix& a, std::uint64_t i, std::uint64_t kdim, float* arow);
};

inline constexpr std::uint64_t kMaxKc = 256;

const Kernels& kernels(Isa isa);

// C (m x n, row stride ldc) = A (m x k) * B (k x n) on the engine's threads.
void gemm(TensorEngine& e, const Kernels& k, std::uint64_t m, std::uint64_t n, std::uint64_t kdim, const Matrix& a,
          const Matrix& b, float* c, std::uint64_t ldc);

}  // namespace tpuhal::sim::tensor::fgemm
