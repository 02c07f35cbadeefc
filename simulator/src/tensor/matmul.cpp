// Matrix products: float (f32, f16, bf16 in f32) on the engine's own kernels
// (fgemm.h), and integer, exact in int32: on the engine's own kernels
// (igemm.h), or on oneDNN where its int8 kernels are exact (AVX-512 VNNI).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>

#include "dnnl_state.h"
#include "engine.h"
#include "fgemm.h"
#include "igemm.h"
#include "isa.h"
#include "numerics.h"
#include "simd.h"

namespace tpuhal::sim::tensor {

void DnnlState::bind_threads() const { omp_set_num_threads(threads); }

namespace {

using dt = dnnl::memory::data_type;

dnnl::memory::dims plain_strides(const dnnl::memory::dims& d) {
  dnnl::memory::dims s(d.size());
  dnnl::memory::dim step = 1;
  for (std::size_t i = d.size(); i-- > 0;) {
    s[i] = step;
    step *= d[i];
  }
  return s;
}

dt matmul_dnnl_type(fw::DType t) {
  switch (t) {
    case fw::DType::kF32: return dt::f32;
    case fw::DType::kF16: return dt::f16;
    case fw::DType::kBF16: return dt::bf16;
    case fw::DType::kI8: return dt::s8;
    case fw::DType::kU8: return dt::u8;
    case fw::DType::kI32: return dt::s32;
    case fw::DType::kNone: break;
  }
  return dt::undef;
}

// A 2-D (or batched) matrix view as oneDNN sees it: dims collapse broadcast
// batch dimensions (stride 0) to 1. Returns false if oneDNN cannot describe
// it (it then takes the reference path).
bool dnnl_desc(const View& v, bool transpose, dnnl::memory::desc& out) {
  const std::uint32_t r = v.rank;
  dnnl::memory::dims dims(r), strides(r);
  for (std::uint32_t d = 0; d < r; ++d) {
    const bool broadcast = v.strides[d] == 0 && v.shape[d] > 1;
    if (broadcast && d + 2 >= r) return false;  // a broadcast row or column
    dims[d] = broadcast ? 1 : static_cast<dnnl::memory::dim>(v.shape[d]);
    strides[d] = static_cast<dnnl::memory::dim>(v.strides[d]);
  }
  if (transpose) {
    std::swap(dims[r - 2], dims[r - 1]);
    std::swap(strides[r - 2], strides[r - 1]);
  }
  try {
    out = dnnl::memory::desc(dims, matmul_dnnl_type(v.dtype), strides);
  } catch (const dnnl::error&) {
    return false;
  }
  return true;
}

// Element offset of (batch index b, row i, column j) of a [batch..., R, C]
// view, optionally transposed.
struct Indexer {
  const View& v;
  bool transpose;
  std::uint64_t batch_offset(std::uint64_t b, const View& y) const {
    std::uint64_t off = 0;
    for (std::uint32_t d = y.rank - 2; d-- > 0;) {
      off += (b % y.shape[d]) * v.strides[d];
      b /= y.shape[d];
    }
    return off;
  }
  std::uint64_t rc(std::uint64_t i, std::uint64_t j) const {
    const std::uint32_t r = v.rank;
    return transpose ? j * v.strides[r - 2] + i * v.strides[r - 1] : i * v.strides[r - 2] + j * v.strides[r - 1];
  }
};

std::uint64_t batches(const View& y) {
  std::uint64_t n = 1;
  for (std::uint32_t d = 0; d + 2 < y.rank; ++d) n *= y.shape[d];
  return n;
}

fgemm::Type float_type(fw::DType t) {
  return t == fw::DType::kF16 ? fgemm::Type::kF16 : t == fw::DType::kBF16 ? fgemm::Type::kBF16 : fgemm::Type::kF32;
}

// Products of fewer rows than this (a squeeze-and-excitation block's or a
// classifier's [1, K] x [K, N]) are bf16 on the engine's own kernels even
// where the CPU multiplies bf16: each of native_bf16_product's tiles
// describes and creates a oneDNN primitive, tens of microseconds, where
// such a product takes a few. EfficientNet-B0's 33 took 2.7 times their
// f32 time that way.
constexpr std::uint64_t kNativeBf16MinRows = 16;

// bf16 products on oneDNN where the CPU multiplies bf16 in hardware
// (AVX512_BF16, AMX: twice to several times the f32 rate): out (f32, as
// float_product) over fixed tiles of the output, each computed by one
// thread with oneDNN held to that thread, so that the tiles, and every
// element's sum, depend on the shapes alone and never on the thread count.
// False (some tiles possibly written) if oneDNN cannot take the operands,
// or before anything is written for fewer than kNativeBf16MinRows rows.
bool native_bf16_product(TensorEngine& e, const View& a, const View& b, bool ta, bool tb, const View& y, float* out) {
  const std::uint32_t r = y.rank;
  auto describable = [r](const View& v) {  // oneDNN takes no broadcast row or column
    return !(v.strides[r - 2] == 0 && v.shape[r - 2] > 1) && !(v.strides[r - 1] == 0 && v.shape[r - 1] > 1);
  };
  if (a.dtype != fw::DType::kBF16 || b.dtype != fw::DType::kBF16 || !describable(a) || !describable(b) ||
      y.shape[r - 2] < kNativeBf16MinRows)
    return false;
  const std::uint64_t m = y.shape[r - 2], n = y.shape[r - 1];
  const std::uint64_t k = ta ? a.shape[r - 2] : a.shape[r - 1];
  const std::uint64_t nb = batches(y);
  // Tiles of at most 256 x 256, halved (down to 64) until there are 16.
  std::uint64_t tm = std::min<std::uint64_t>(m, 256), tn = std::min<std::uint64_t>(n, 256);
  auto count = [&] { return nb * ((m + tm - 1) / tm) * ((n + tn - 1) / tn); };
  while (count() < 16 && tm > 64) tm = (tm + 1) / 2;
  while (count() < 16 && tn > 64) tn = (tn + 1) / 2;
  const std::uint64_t mt = (m + tm - 1) / tm, nt = (n + tn - 1) / tn;
  const Indexer ia{a, ta}, ib{b, tb};
  const auto D = [](std::uint64_t v) { return static_cast<dnnl::memory::dim>(v); };
  const std::uint64_t ars = ta ? a.strides[r - 1] : a.strides[r - 2], acs = ta ? a.strides[r - 2] : a.strides[r - 1];
  const std::uint64_t brs = tb ? b.strides[r - 1] : b.strides[r - 2], bcs = tb ? b.strides[r - 2] : b.strides[r - 1];
  std::atomic<bool> failed{false};
  e.pool().parallel_for(nb * mt * nt, [&](std::uint64_t begin, std::uint64_t end) {
    // No threads of oneDNN's own on this thread (restored after: the
    // caller's thread runs this itself when there is one part).
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    try {
      dnnl::stream stream(e.dnnl().engine);
      for (std::uint64_t t = begin; t < end && !failed.load(std::memory_order_relaxed); ++t) {
        const std::uint64_t bi = t / (mt * nt), m0 = t / nt % mt * tm, n0 = t % nt * tn;
        const std::uint64_t rows = std::min(tm, m - m0), cols = std::min(tn, n - n0);
        const dnnl::memory::desc ad({D(rows), D(k)}, dt::bf16, {D(ars), D(acs)});
        const dnnl::memory::desc bd({D(k), D(cols)}, dt::bf16, {D(brs), D(bcs)});
        const dnnl::memory::desc yd({D(rows), D(cols)}, dt::f32, {D(n), 1});
        dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, yd), e.dnnl().engine);
        dnnl::matmul prim(pd);
        dnnl::memory am(ad, e.dnnl().engine, const_cast<std::byte*>(a.at(ia.batch_offset(bi, y) + m0 * ars)));
        dnnl::memory bm(bd, e.dnnl().engine, const_cast<std::byte*>(b.at(ib.batch_offset(bi, y) + n0 * bcs)));
        dnnl::memory ym(yd, e.dnnl().engine, out + (bi * m + m0) * n + n0);
        prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, ym}});
        stream.wait();
      }
    } catch (const dnnl::error&) {
      failed.store(true);
    }
    omp_set_num_threads(saved);
  });
  return !failed.load();
}

// Where B is the same matrix for every batch (its batch strides 0) and A
// (not transposed) steps from the last row of one batch to the first of
// the next by its row stride, the batches are one matrix of batches x M
// rows (a transformer's [sequence, 1, d] x [d, 3d], as a model exported
// with its batch dimension after the sequence has it): that many rows, else
// M. Each element is the same chain of multiply-adds either way (fgemm.h);
// one product reads B once, where a product per batch read it per row.
std::uint64_t merged_rows(const View& a, bool ta, const View& b, const View& y) {
  const std::uint32_t r = y.rank;
  const std::uint64_t m = y.shape[r - 2];
  if (r < 3 || ta || a.rank != r || b.rank != r) return m;
  std::uint64_t rows = m, step = m * a.strides[r - 2];
  for (std::uint32_t d = r - 2; d-- > 0;) {
    if (y.shape[d] == 1) continue;
    if (b.strides[d] != 0 || a.shape[d] != y.shape[d] || a.strides[d] != step) return m;
    rows *= y.shape[d];
    step *= y.shape[d];
  }
  return rows;
}

// out (f32, [batch, M, N] with row stride n, batch stride m * n) = op(A) @
// op(B) on the engine's own kernels (fgemm.h): each element one chain of
// multiply-adds in k order, whatever the threads; bf16 on oneDNN where the
// CPU multiplies it in hardware (above).
void float_product(TensorEngine& e, const View& a, const View& b, bool ta, bool tb, const View& y, float* out) {
  const std::uint32_t r = y.rank;
  const std::uint64_t m = y.shape[r - 2], n = y.shape[r - 1];
  const std::uint64_t k = ta ? a.shape[r - 2] : a.shape[r - 1];
  const std::uint64_t nb = batches(y);
  if (k != 0 && m != 0 && n != 0 && onednn_has_native_bf16() && native_bf16_product(e, a, b, ta, tb, y, out)) return;
  const fgemm::Kernels& kern = fgemm::kernels(e.isa());
  const Indexer ia{a, ta}, ib{b, tb};
  const std::uint64_t rows = merged_rows(a, ta, b, y);
  const auto S = [](std::uint64_t v) { return static_cast<std::int64_t>(v); };
  // An empty operand (K = 0) may have no memory at all: no offset from null.
  const auto base = [&](const View& v, const Indexer& ix, std::uint64_t bi) {
    return v.data ? v.at(ix.batch_offset(bi, y)) : nullptr;
  };
  if (rows > m) {  // one product of rows x K by B
    const fgemm::Matrix ma{base(a, ia, 0), S(a.strides[r - 2]), S(a.strides[r - 1]), float_type(a.dtype)};
    const fgemm::Matrix mb{base(b, ib, 0), S(tb ? b.strides[r - 1] : b.strides[r - 2]),
                           S(tb ? b.strides[r - 2] : b.strides[r - 1]), float_type(b.dtype)};
    fgemm::gemm(e, kern, rows, n, k, ma, mb, out, n);
    return;
  }
  for (std::uint64_t bi = 0; bi < nb; ++bi) {
    const fgemm::Matrix ma{base(a, ia, bi), S(ta ? a.strides[r - 1] : a.strides[r - 2]),
                           S(ta ? a.strides[r - 2] : a.strides[r - 1]), float_type(a.dtype)};
    const fgemm::Matrix mb{base(b, ib, bi), S(tb ? b.strides[r - 1] : b.strides[r - 2]),
                           S(tb ? b.strides[r - 2] : b.strides[r - 1]), float_type(b.dtype)};
    fgemm::gemm(e, kern, m, n, k, ma, mb, out + bi * m * n, n);
  }
}

// Whether C is a float type (f32, f16, bf16) whose last dimension steps
// by one element or none (a bias broadcast over the rows, or a whole
// matrix): then each row of y reads one run of C. y = C + A @ B in place
// (C in y's memory) is left to the loop that computes the product apart
// first.
bool rows_of_floats(const View& c, const View& y) {
  const bool float_c = c.dtype == fw::DType::kF32 || c.dtype == fw::DType::kF16 || c.dtype == fw::DType::kBF16;
  return float_c && c.rank > 0 && c.strides[c.rank - 1] <= 1 && apart(y, c);
}

// The element offset in C (broadcast to y's shape) of y's row `row`, the
// rows counted over all of y's dimensions but the last.
std::uint64_t row_offset(const View& c, const View& y, std::uint64_t row) {
  std::uint64_t off = 0;
  for (std::uint32_t d = y.rank - 1; d-- > 0;) {
    const std::uint64_t i = row % y.shape[d];
    row /= y.shape[d];
    if (d + c.rank >= y.rank) off += i * c.strides[d + c.rank - y.rank];
  }
  return off;
}

// C's run for y's row `row` as f32: in place where C is f32, else widened
// (exactly) into `into` (n floats; one where C is broadcast along the row).
const float* c_row(const View& c, const View& y, std::uint64_t row, std::uint64_t n, float* into) {
  const std::byte* p = c.at(row_offset(c, y, row));
  if (c.dtype == fw::DType::kF32) return reinterpret_cast<const float*>(p);
  const std::uint64_t len = c.strides[c.rank - 1] ? n : 1;
  (c.dtype == fw::DType::kF16 ? simd::widen_f16 : simd::widen_bf16)(reinterpret_cast<const std::uint16_t*>(p), into,
                                                                    len);
  return into;
}

}  // namespace

fw::Problem run_matmul(TensorEngine& e, const fw::MatMulAttrs& at, const View* v) {
  const View &a = v[0], &b = v[1], &c = v[2], &y = v[3];
  const bool plain = at.alpha == 1.0f && !c.present() && at.activation == 0;
  // The common case straight into y: f32 out, dense, nothing to add.
  if (plain && y.dtype == fw::DType::kF32 && y.contiguous()) {
    float_product(e, a, b, at.trans_a, at.trans_b, y, reinterpret_cast<float*>(y.data));
    return {};
  }
  const auto act = static_cast<fw::Activation>(at.activation);
  const bool half_y = y.dtype == fw::DType::kF16 || y.dtype == fw::DType::kBF16;
  if ((y.dtype == fw::DType::kF32 || half_y) && y.contiguous() && (!c.present() || rows_of_floats(c, y))) {
    // Straight into y (f32) or f32 rows of its own, then each row finished
    // there and rounded once into y: the same operations per element as
    // the loop below (the vector conversions give store_float's bits), a
    // row at a time.
    std::vector<float> sums(half_y ? y.elements() : 0);
    float* out = half_y ? sums.data() : reinterpret_cast<float*>(y.data);
    float_product(e, a, b, at.trans_a, at.trans_b, y, out);
    const std::uint64_t n = y.rank ? y.shape[y.rank - 1] : 1, rows = n ? y.elements() / n : 0;
    const std::uint64_t c_step = c.present() && c.rank ? c.strides[c.rank - 1] : 0;
    const auto narrow = y.dtype == fw::DType::kF16 ? simd::narrow_f16 : simd::narrow_bf16;
    e.pool().parallel_for(
        rows,
        [&](std::uint64_t begin, std::uint64_t end) {
          std::vector<float> widened_c(c.present() && c.dtype != fw::DType::kF32 ? n : 0);
          for (std::uint64_t row = begin; row < end; ++row) {
            float* yr = out + row * n;
            if (c.present()) {
              const float* cr = c_row(c, y, row, n, widened_c.data());
              for (std::uint64_t j = 0; j < n; ++j) yr[j] = at.alpha * yr[j] + at.beta * cr[j * c_step];
            } else {
              for (std::uint64_t j = 0; j < n; ++j) yr[j] = at.alpha * yr[j] + at.beta * 0.0f;
            }
            activate_span(act, at.act_alpha, at.act_beta, yr, n);
            if (half_y) narrow(yr, reinterpret_cast<std::uint16_t*>(y.data) + row * n, n);
          }
        },
        std::max<std::uint64_t>(1, 4096 / std::max<std::uint64_t>(n, 1)));
    return {};
  }
  std::vector<float> acc(y.elements());
  float_product(e, a, b, at.trans_a, at.trans_b, y, acc.data());
  const View* views[2] = {&y, &c};
  const View* y_only[1] = {&y};
  // alpha * product + beta * C in acc, the activation over the span (the
  // same bits as activate() element by element, in whole vectors), then y.
  e.pool().parallel_for(y.elements(), [&](std::uint64_t begin, std::uint64_t end) {
    std::uint64_t i = begin;
    if (c.present())
      for_each_index(y.shape, y.rank, views, begin, end, [&](const std::uint64_t* off) {
        acc[i] = at.alpha * acc[i] + at.beta * load_float(c.at(off[1]), c.dtype);
        ++i;
      });
    else
      for (; i < end; ++i) acc[i] = at.alpha * acc[i] + at.beta * 0.0f;
    activate_span(act, at.act_alpha, at.act_beta, acc.data() + begin, end - begin);
    i = begin;
    for_each_index(y.shape, y.rank, y_only, begin, end,
                   [&](const std::uint64_t* off) { store_float(y.at(off[0]), y.dtype, acc[i++]); });
  });
  return {};
}

// Integer product with zero points, exact in int32 (two's complement
// wrap-around, as every int32 accumulator behaves):
//   sum_k (a - az)(b - bz) = sum ab - bz sum_k a - az sum_k b + K az bz
// with sum ab on oneDNN (u8/s8 x s8; u8 weights shifted by 128) where it
// can describe the operands.
void matmul_integer(TensorEngine& e, const View& a, const View& b, const View* az, const View* bz, std::int32_t* acc) {
  const std::uint32_t r = a.rank;
  const std::uint64_t m = a.shape[r - 2], k = a.shape[r - 1], n = b.shape[r - 1];
  View y{};  // the output's geometry: batch dims from a (already broadcast)
  y.rank = r;
  for (std::uint32_t d = 0; d + 2 < r; ++d) y.shape[d] = a.shape[d];
  y.shape[r - 2] = m;
  y.shape[r - 1] = n;
  const std::uint64_t nb = batches(y);
  if (!nb || !m || !n) return;
  if (!k) {
    std::fill(acc, acc + nb * m * n, 0);
    return;
  }
  const Indexer ia{a, false}, ib{b, false};

  if (!onednn_int8_exact(e.isa())) {
    // The engine's own kernels, exact on every ISA: the zero points are
    // subtracted as the operands are packed.
    const igemm::Kernels& kern = igemm::kernels(e.isa());
    std::vector<std::int16_t> za(m), zb(n);
    for (std::uint64_t bi = 0; bi < nb; ++bi) {
      for (std::uint64_t i = 0; i < m; ++i)
        za[i] = az ? static_cast<std::int16_t>(
                         load_int(az->at(Indexer{*az, false}.batch_offset(bi, y) + i * az->strides[r - 2]), az->dtype))
                   : 0;
      for (std::uint64_t j = 0; j < n; ++j)
        zb[j] = bz ? static_cast<std::int16_t>(
                         load_int(bz->at(Indexer{*bz, false}.batch_offset(bi, y) + j * bz->strides[r - 1]), bz->dtype))
                   : 0;
      const auto* pa = reinterpret_cast<const std::uint8_t*>(a.at(ia.batch_offset(bi, y)));
      const auto* pb = reinterpret_cast<const std::uint8_t*>(b.at(ib.batch_offset(bi, y)));
      igemm::MatrixLines al(pa, static_cast<std::int64_t>(a.strides[r - 2]),
                            static_cast<std::int64_t>(a.strides[r - 1]));
      al.is_signed = a.dtype == fw::DType::kI8;
      al.zero_per_line = za.data();
      // B by rows when they are contiguous (or neither way is), else by columns.
      const bool rows = b.strides[r - 1] == 1 || b.strides[r - 2] != 1;
      igemm::MatrixLines bl = rows ? igemm::MatrixLines(pb, static_cast<std::int64_t>(b.strides[r - 2]),
                                                        static_cast<std::int64_t>(b.strides[r - 1]))
                                   : igemm::MatrixLines(pb, static_cast<std::int64_t>(b.strides[r - 1]),
                                                        static_cast<std::int64_t>(b.strides[r - 2]));
      bl.is_signed = b.dtype == fw::DType::kI8;
      (rows ? bl.zero_along : bl.zero_per_line) = zb.data();
      igemm::gemm(e, kern, m, n, k, al, bl, rows, acc + bi * m * n, n);
    }
    return;
  }

  // Raw sums of a over k (per row) and of b over k (per column), where the
  // zero points or the u8 weight shift need them.
  const bool need_rows = bz || b.dtype == fw::DType::kU8, need_cols = az != nullptr;
  std::vector<std::int64_t> row_sum(nb * m, 0), col_sum(nb * n, 0);
  for (std::uint64_t bi = 0; bi < nb && (need_rows || need_cols); ++bi) {
    const std::byte* pa = a.at(ia.batch_offset(bi, y));
    const std::byte* pb = b.at(ib.batch_offset(bi, y));
    for (std::uint64_t i = 0; i < m && need_rows; ++i)
      for (std::uint64_t kk = 0; kk < k; ++kk) row_sum[bi * m + i] += load_int(pa + ia.rc(i, kk) * a.esize, a.dtype);
    for (std::uint64_t kk = 0; kk < k && need_cols; ++kk)
      for (std::uint64_t j = 0; j < n; ++j) col_sum[bi * n + j] += load_int(pb + ib.rc(kk, j) * b.esize, b.dtype);
  }

  // sum ab.
  bool done = false;
  dnnl::memory::desc ad, bd;
  if (dnnl_desc(a, false, ad)) {
    // Weights must be s8: shift u8 weights by -128 into a dense s8 copy.
    std::vector<std::int8_t> shifted;
    View bs = b;
    if (b.dtype == fw::DType::kU8) {
      shifted.resize(b.elements());
      const View* views[1] = {&b};
      std::uint64_t i = 0;
      for_each_index(b.shape, b.rank, views, 0, b.elements(), [&](const std::uint64_t* off) {
        shifted[i++] = static_cast<std::int8_t>(static_cast<std::uint8_t>(*b.at(off[0])) ^ 0x80);
      });
      bs.data = reinterpret_cast<std::byte*>(shifted.data());
      bs.dtype = fw::DType::kI8;
      std::uint64_t step = 1;
      for (std::uint32_t d = b.rank; d-- > 0;) {
        bs.strides[d] = step;
        step *= b.shape[d];
      }
    }
    // oneDNN accumulates int8 products in s32 but passes the final sums
    // through f32 on the way out, exact only below 2^24 in magnitude (a sum
    // at or past 2^24 cannot round to below it). So the product runs once
    // over all of K, and the sums that came out at or past 2^24 are not
    // trusted: a few are recomputed here one by one; if many, the product
    // runs again over slices of K, cut so that amax * sum |b| stays below
    // 2^24 in every column of every slice, added here in int32. (That oneDNN
    // keeps partial sums in s32 is checked by the ops test whose partial
    // sums pass 2^24 and cancel.)
    constexpr std::uint64_t kExact = std::uint64_t{1} << 24, kBlock = 64;
    const std::uint64_t amax = a.dtype == fw::DType::kU8 ? 255 : 128;
    // Slice starts then k: greedily from the column sums of |b| over blocks
    // of 64 rows (a block alone stays below the limit: 64 * 255 * 128 < 2^24).
    auto slices = [&] {
      std::vector<std::uint64_t> cuts{0};
      const std::uint64_t nbb = batches(bs), cols = nbb * n, blocks = (k + kBlock - 1) / kBlock;
      std::vector<std::uint32_t> sums(blocks * cols, 0);  // [block][batch, column]
      const std::uint64_t sj = bs.strides[r - 1];
      e.pool().parallel_for(blocks * nbb, [&](std::uint64_t begin, std::uint64_t end) {
        for (std::uint64_t t = begin; t < end; ++t) {
          const std::uint64_t blk = t / nbb, bi = t % nbb;
          std::uint64_t base = 0, rem = bi;
          for (std::uint32_t d = r - 2; d-- > 0;) {
            base += (rem % bs.shape[d]) * bs.strides[d];
            rem /= bs.shape[d];
          }
          std::uint32_t* col = &sums[blk * cols + bi * n];
          for (std::uint64_t kk = blk * kBlock; kk < std::min(k, (blk + 1) * kBlock); ++kk) {
            const auto* row = reinterpret_cast<const std::int8_t*>(bs.at(base + kk * bs.strides[r - 2]));
            if (sj == 1) {
              simd::add_abs_i8(col, row, n);
            } else {
              for (std::uint64_t j = 0; j < n; ++j)
                col[j] += static_cast<std::uint32_t>(row[j * sj] < 0 ? -row[j * sj] : row[j * sj]);
            }
          }
        }
      });
      const std::uint64_t limit = (kExact - 1) / amax;
      std::vector<std::uint64_t> run(cols, 0);
      for (std::uint64_t blk = 0; blk < blocks; ++blk) {
        const std::uint32_t* s = &sums[blk * cols];
        bool fits = true;
        for (std::uint64_t j = 0; j < cols && fits; ++j) fits = run[j] + s[j] <= limit;
        if (!fits) {
          cuts.push_back(blk * kBlock);
          std::fill(run.begin(), run.end(), std::uint64_t{0});
        }
        for (std::uint64_t j = 0; j < cols; ++j) run[j] += s[j];
      }
      cuts.push_back(k);
      return cuts;
    };
    if (dnnl_desc(bs, false, bd)) {
      dnnl::memory::dims ydims(r);
      for (std::uint32_t d = 0; d < r; ++d) ydims[d] = static_cast<dnnl::memory::dim>(y.shape[d]);
      const dnnl::memory::desc yd(ydims, dt::s32, plain_strides(ydims));
      const std::uint64_t total = nb * m * n;
      // The product over the slices `cuts` into acc.
      auto product = [&](const std::vector<std::uint64_t>& cuts) {
        std::vector<std::int32_t> part;
        for (std::size_t sl = 0; sl + 1 < cuts.size(); ++sl) {
          const std::uint64_t k0 = cuts[sl], kc = cuts[sl + 1] - k0;
          View as = a, bsl = bs;
          as.shape[r - 1] = kc;
          as.data = a.data + k0 * a.strides[r - 1] * a.esize;
          bsl.shape[r - 2] = kc;
          bsl.data = bs.data + k0 * bs.strides[r - 2] * bs.esize;
          dnnl::memory::desc adc, bdc;
          if (!dnnl_desc(as, false, adc) || !dnnl_desc(bsl, false, bdc)) throw dnnl::error(dnnl_unimplemented, "slice");
          dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(adc, bdc, yd), e.dnnl().engine);
          dnnl::matmul prim(pd);
          if (sl == 1) part.resize(total);
          std::int32_t* out = sl == 0 ? acc : part.data();
          dnnl::memory am(adc, e.dnnl().engine, as.data), bm(bdc, e.dnnl().engine, bsl.data),
              ym(yd, e.dnnl().engine, out);
          prim.execute(e.dnnl().stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, ym}});
          e.dnnl().stream.wait();
          if (sl != 0)
            e.pool().parallel_for(total, [&](std::uint64_t begin, std::uint64_t end) {
              simd::add_i32(acc + begin, part.data() + begin, end - begin);
            });
        }
      };
      // |v| >= 2^24, as one unsigned comparison.
      auto large = [](std::int32_t v) {
        return static_cast<std::uint32_t>(v) + static_cast<std::uint32_t>(kExact - 1) > 2 * (kExact - 1);
      };
      try {
        e.dnnl().bind_threads();
        product({0, k});
        std::atomic<std::uint64_t> count{0};
        if (k * amax * 128 >= kExact)
          e.pool().parallel_for(total, [&](std::uint64_t begin, std::uint64_t end) {
            std::uint64_t c = 0;
            for (std::uint64_t i = begin; i < end; ++i) c += large(acc[i]);
            if (c) count.fetch_add(c, std::memory_order_relaxed);
          });
        if (count.load() > total / 16) {
          product(slices());
        } else if (count.load() > 0) {
          std::vector<std::uint64_t> redo;
          for (std::uint64_t i = 0; i < total; ++i)
            if (large(acc[i])) redo.push_back(i);
          e.pool().parallel_for(redo.size(), [&](std::uint64_t begin, std::uint64_t end) {
            for (std::uint64_t t = begin; t < end; ++t) {
              const std::uint64_t idx = redo[t], bi = idx / (m * n), i = idx / n % m, j = idx % n;
              const std::byte* pa = a.at(ia.batch_offset(bi, y));
              std::uint64_t bbase = 0, rem = bi;
              for (std::uint32_t d = r - 2; d-- > 0;) {
                bbase += (rem % y.shape[d]) % bs.shape[d] * bs.strides[d];
                rem /= y.shape[d];
              }
              std::uint32_t sum = 0;
              for (std::uint64_t kk = 0; kk < k; ++kk)
                sum += static_cast<std::uint32_t>(load_int(pa + ia.rc(i, kk) * a.esize, a.dtype) *
                                                  static_cast<std::int64_t>(*reinterpret_cast<const std::int8_t*>(
                                                      bs.at(bbase + kk * bs.strides[r - 2] + j * bs.strides[r - 1]))));
              acc[idx] = static_cast<std::int32_t>(sum);
            }
          });
        }
        if (b.dtype == fw::DType::kU8)  // undo the shift: + 128 * sum_k a
          for (std::uint64_t row = 0; row < nb * m; ++row)
            for (std::uint64_t j = 0; j < n; ++j)
              acc[row * n + j] = static_cast<std::int32_t>(static_cast<std::uint32_t>(acc[row * n + j]) +
                                                           static_cast<std::uint32_t>(128 * row_sum[row]));
        done = true;
      } catch (const dnnl::error&) {
      }
    }
  }
  if (!done) {
    e.pool().parallel_for(nb * m, [&](std::uint64_t begin, std::uint64_t end) {
      for (std::uint64_t row = begin; row < end; ++row) {
        const std::uint64_t bi = row / m, i = row % m;
        const std::byte* pa = a.at(ia.batch_offset(bi, y));
        const std::byte* pb = b.at(ib.batch_offset(bi, y));
        for (std::uint64_t j = 0; j < n; ++j) {
          std::uint32_t s = 0;
          for (std::uint64_t kk = 0; kk < k; ++kk)
            s += static_cast<std::uint32_t>(load_int(pa + ia.rc(i, kk) * a.esize, a.dtype) *
                                            load_int(pb + ib.rc(kk, j) * b.esize, b.dtype));
          acc[row * n + j] = static_cast<std::int32_t>(s);
        }
      }
    });
  }

  // Zero-point corrections.
  if (!az && !bz) return;
  for (std::uint64_t bi = 0; bi < nb; ++bi) {
    for (std::uint64_t i = 0; i < m; ++i) {
      std::int64_t za = 0;
      if (az) za = load_int(az->at(Indexer{*az, false}.batch_offset(bi, y) + i * az->strides[r - 2]), az->dtype);
      for (std::uint64_t j = 0; j < n; ++j) {
        std::int64_t zb = 0;
        if (bz) zb = load_int(bz->at(Indexer{*bz, false}.batch_offset(bi, y) + j * bz->strides[r - 1]), bz->dtype);
        const std::int64_t fix =
            -zb * row_sum[bi * m + i] - za * col_sum[bi * n + j] + static_cast<std::int64_t>(k) * za * zb;
        std::int32_t& out = acc[(bi * m + i) * n + j];
        out = static_cast<std::int32_t>(static_cast<std::uint32_t>(out) + static_cast<std::uint32_t>(fix));
      }
    }
  }
}

}  // namespace tpuhal::sim::tensor
