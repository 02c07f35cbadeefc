// Exact integer matrix products for the tensor engine's int8 ops, on every
// instruction set (isa.h). Internal to the simulator.
//
//   C[m, n] = sum_k (A[m, k] - za) * (B[k, n] - zb)   in int32, modulo 2^32
//
// Operands are u8 or s8. Packing subtracts the zero points (|a - za|,
// |b - zb| <= 255) and the kernels sum blocks of at most kMaxKc products in
// f32, where every partial sum of a block is an integer below 2^24 and so
// exact (igemm_kernels.inc says why that is the fastest exact way); blocks
// are added in int32, wrapping like any int32 accumulator. Nothing
// saturates and nothing is rounded, so the result is the same bits on every
// ISA, thread count and blocking.
#pragma once

#include <cstddef>
#include <cstdint>

#include "isa.h"

namespace tpuhal::sim::tensor {
class TensorEngine;
}

namespace tpuhal::sim::tensor::igemm {

// `count` elements of one line of an operand, `stride` bytes apart from
// `src`; or padding (src null), which contributes 0 whatever the zero point.
struct Segment {
  const std::uint8_t* src;
  std::uint64_t count;
  std::int64_t stride;
};

// An int8 operand read as lines: the rows of A (a line runs along K), the
// rows of B (k-lines, along N) or its columns (n-lines, along K).
class Lines {
 public:
  virtual ~Lines() = default;
  // Fills `out` with the segments that make up elements [from, from + count)
  // of line `line`, in order; returns how many (at most count + 1).
  virtual std::size_t segments(std::uint64_t line, std::uint64_t from, std::uint64_t count, Segment* out) const = 0;

  bool is_signed = false;
  // Subtracted from every element that is not padding: `zero`, or one value
  // per line (`zero_per_line[line]`), or one per position along every line
  // (`zero_along[position]`).
  std::int16_t zero = 0;
  const std::int16_t* zero_per_line = nullptr;
  const std::int16_t* zero_along = nullptr;
};

// A strided matrix as lines: element (line i, position j) at
// base + i * line_stride + j * stride (bytes).
class MatrixLines final : public Lines {
 public:
  MatrixLines(const std::uint8_t* base, std::int64_t line_stride, std::int64_t stride)
      : base_(base), line_stride_(line_stride), stride_(stride) {}
  std::size_t segments(std::uint64_t line, std::uint64_t from, std::uint64_t count, Segment* out) const override;

 private:
  const std::uint8_t* base_;
  std::int64_t line_stride_, stride_;
};

inline constexpr std::uint64_t kMaxKc = 256;  // products per exact f32 block

// One instruction set's kernels. Packed layouts (f32 values of the operands
// less their zero points):
//  - A: micro-panels of MR rows of kc values each (row-major), rows past
//    the block's end zero;
//  - B: panels of NR columns, each k x NR (k-major), columns past n zero.
struct Kernels {
  Isa isa;
  unsigned mr, nr;
  // A rows [m0, m0 + mc), elements [k0, k0 + kc) (kc <= kMaxKc); `segs` has
  // room for kc + 2 segments.
  void (*pack_a)(const Lines& a, std::uint64_t m0, std::uint64_t mc, std::uint64_t k0, std::uint64_t kc, float* out,
                 Segment* segs);
  // Rows [k0, k1) of every panel, from k-lines (rows of B) of n columns.
  // `panel_floats` is the distance between panels (k * NR); `line` has room
  // for n floats and `segs` for n + 2 segments.
  void (*pack_b_rows)(const Lines& b, std::uint64_t n, std::uint64_t k0, std::uint64_t k1, float* out,
                      std::uint64_t panel_floats, float* line, Segment* segs);
  // Columns [n0, n1) from n-lines (columns of B) of k rows: `line` has room
  // for k floats, `segs` for k + 2 segments.
  void (*pack_b_cols)(const Lines& b, std::uint64_t k, std::uint64_t n0, std::uint64_t n1, float* out,
                      std::uint64_t panel_floats, float* line, Segment* segs);
  // C tile (mr x nr of MR x NR, int32) = (accumulate ? C : 0) + the exact
  // sum of kc (<= kMaxKc) products of an A micro-panel and a B panel's rows.
  void (*kernel)(std::uint64_t kc, const float* a, const float* b, std::int32_t* c, std::uint64_t ldc, unsigned mr,
                 unsigned nr, bool accumulate);
};

// The kernels of `isa` (each level has its own; a level this build has no
// kernels for gets the next one below).
const Kernels& kernels(Isa isa);

// C (M x N, row stride ldc in elements) = A (M x K) * B (K x N) as above;
// B given by its rows (`b_rows`, k-lines) or its columns (n-lines). Runs on
// the engine's threads.
void gemm(TensorEngine& e, const Kernels& k, std::uint64_t m, std::uint64_t n, std::uint64_t kdim, const Lines& a,
          const Lines& b, bool b_rows, std::int32_t* c, std::uint64_t ldc);

// gemm() in two steps, for a B used again: packed_b_floats(k, n, kdim)
// floats at `bp` filled by pack_b(), then any number of gemm_packed() (`bp`
// unused, and may be null, where n or kdim is 0). pack_b: n and kdim are
// at least 1.
std::uint64_t packed_b_floats(const Kernels& k, std::uint64_t n, std::uint64_t kdim);
void pack_b(TensorEngine& e, const Kernels& k, std::uint64_t n, std::uint64_t kdim, const Lines& b, bool b_rows,
            float* bp);
void gemm_packed(TensorEngine& e, const Kernels& k, std::uint64_t m, std::uint64_t n, std::uint64_t kdim,
                 const Lines& a, const float* bp, std::int32_t* c, std::uint64_t ldc);

}  // namespace tpuhal::sim::tensor::igemm
