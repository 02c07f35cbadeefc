// Pooling, resizing and colour conversion: the image-shaped ops.
#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>

#include "engine.h"
#include "numerics.h"
#include "simd.h"
#include "tpuhal/fw/roi_align.h"

namespace tpuhal::sim::tensor {
namespace {

// The most channels of a global pool a thread takes at a time.
constexpr std::uint64_t kChannelBlock = 64;

// A global pool's channels a thread takes at a time: kChannelBlock, or 32
// or 16 where that would leave a thread idle (EfficientNet-B0's first
// squeeze, 32 channels, ran on one). A block of any width gives each
// channel the same sums.
std::uint64_t channel_block(const TensorEngine& e, std::uint64_t n, std::uint64_t c) {
  std::uint64_t block = kChannelBlock;
  while (block > 16 && n * ((c + block - 1) / block) < e.threads()) block /= 2;
  return block;
}

// Element offset of (n, c, h, w) in a 4-D view of either layout.
std::uint64_t at4(const View& v, bool nhwc, std::uint64_t n, std::uint64_t c, std::uint64_t h, std::uint64_t w) {
  return nhwc ? n * v.strides[0] + h * v.strides[1] + w * v.strides[2] + c * v.strides[3]
              : n * v.strides[0] + c * v.strides[1] + h * v.strides[2] + w * v.strides[3];
}

}  // namespace

fw::Problem run_pool2d(TensorEngine& e, const fw::PoolAttrs& at, const View* v) {
  const View &x = v[0], &y = v[1];
  const bool nhwc = at.layout == static_cast<std::uint32_t>(fw::Layout::kNHWC);
  const bool max = at.kind == static_cast<std::uint32_t>(fw::PoolKind::kMax);
  const std::uint64_t n = x.shape[0], c = nhwc ? x.shape[3] : x.shape[1];
  const std::int64_t h = static_cast<std::int64_t>(nhwc ? x.shape[1] : x.shape[2]);
  const std::int64_t w = static_cast<std::int64_t>(nhwc ? x.shape[2] : x.shape[3]);
  const std::uint64_t oh = nhwc ? y.shape[1] : y.shape[2], ow = nhwc ? y.shape[2] : y.shape[3];
  const std::uint32_t cd = nhwc ? 3 : 1;  // the channels' dimension
  // f16 and bf16 global pooling over dense channels widens a row's taps
  // as the loop below reaches them, into memory that stays in cache: a
  // whole-tensor pass (written, then read again) cost EfficientNet-B0's
  // squeeze-and-excitation pools twice their f32 time.
  const bool half = x.dtype == y.dtype && (x.dtype == fw::DType::kF16 || x.dtype == fw::DType::kBF16);
  const bool half_global = half && oh == 1 && ow == 1 && x.strides[cd] == 1 && y.strides[cd] == 1;
  // Likewise NHWC pooling over dense rows (an fp16 or bf16 model's stem max
  // pool): each input row is widened as the row loop below reaches it, and
  // each output row rounded as it is done, in cache; widening the whole
  // input first took ShuffleNet's stem pool at batch 8 twice its f32 time.
  const bool half_rows =
      half && !half_global && nhwc && x.strides[3] == 1 && x.strides[2] == c && y.strides[3] == 1 && y.strides[2] == c;
  if (half && !half_global && !half_rows) {
    // Through the f32 loops below: widened exactly, each output formed in
    // f32 as the element loop at the end forms it, then rounded once.
    const View f32[2] = {widened(e, x, Staged::kX), staged_like(e, y, Staged::kY)};
    run_pool2d(e, at, f32);
    narrow_into(e, f32[1], y);
    return {};
  }
  const std::int64_t kh = at.kernel[0], kw = at.kernel[1], sh = at.stride[0], sw = at.stride[1];
  const std::int64_t dh = at.dilation[0], dw = at.dilation[1], pt = at.pad[0], pl = at.pad[1];
  const std::int64_t pb = at.pad[2], pr = at.pad[3];
  // count_include_pad divides by the window clipped to the padded input
  // (PyTorch and ONNX); otherwise by the valid elements.
  auto divisor = [&](std::int64_t h0, std::int64_t w0, std::int64_t count) {
    if (!at.count_include_pad) return count;
    const std::int64_t hend = std::min(h0 + (kh - 1) * dh + 1, h + pb);
    const std::int64_t wend = std::min(w0 + (kw - 1) * dw + 1, w + pr);
    return ((hend - h0 + dh - 1) / dh) * ((wend - w0 + dw - 1) / dw);
  };
  // Taps k in [k0, k1) of a window starting at `start` that fall inside
  // [0, len): start + k * dil in range. (Likewise the output columns, k of
  // them, that one tap at offset `start` reaches, `dil` the stride.)
  auto taps = [](std::int64_t start, std::int64_t dil, std::int64_t k, std::int64_t len) {
    const std::int64_t k0 = start >= 0 ? 0 : (-start + dil - 1) / dil;
    const std::int64_t k1 = start >= len ? 0 : std::min(k, (len - start + dil - 1) / dil);
    return std::pair{k0, std::max(k0, k1)};
  };
  if (max && nhwc && x.dtype == y.dtype && (x.dtype == fw::DType::kU8 || x.dtype == fw::DType::kI8) && x.contiguous() &&
      y.contiguous()) {
    // Byte max pooling NHWC (int8 models): an output row at a time. The
    // window's input rows are first reduced to one, their maxima over
    // whole rows of pixels in whole vectors; then each column tap is one
    // step over every output column it falls inside, all the channels of
    // each. A step over a few channels (ShuffleNet's 24) is a vector and a
    // part of one, so a step per row and column tap took its stem pool
    // 42 us, and takes 23 so (a call per tap and column took 0.5 ms).
    // Integer max is exact in any order, so the row starts at the type's
    // least value; a window with no tap inside the input gives 0, as below.
    const auto* xp = reinterpret_cast<const std::uint8_t*>(x.data);
    auto* yp = reinterpret_cast<std::uint8_t*>(y.data);
    const bool is_signed = x.dtype == fw::DType::kI8;
    const auto ows = static_cast<std::int64_t>(ow);
    const std::uint64_t row_bytes = static_cast<std::uint64_t>(w) * c;
    e.pool().parallel_for(n * oh, [&](std::uint64_t begin, std::uint64_t end) {
      std::vector<std::uint8_t> rows_max(kh > 1 ? row_bytes : 0);
      for (std::uint64_t row = begin; row < end; ++row) {
        const std::uint64_t ni = row / oh, r = row % oh;
        const std::int64_t h0 = static_cast<std::int64_t>(r) * sh - pt;
        const auto [a0, a1] = taps(h0, dh, kh, h);
        std::uint8_t* out = yp + row * ow * c;
        std::memset(out, a0 == a1 || !is_signed ? 0 : 0x80, ow * c);
        if (a0 == a1) continue;
        auto input_row = [&](std::int64_t a) {
          return xp + (ni * static_cast<std::uint64_t>(h) + static_cast<std::uint64_t>(h0 + a * dh)) * row_bytes;
        };
        const std::uint8_t* in = input_row(a0);
        if (a1 - a0 > 1 && row_bytes > 0) {  // (no channels: nothing to reduce, nor any buffer)
          std::memcpy(rows_max.data(), in, row_bytes);
          for (std::int64_t a = a0 + 1; a < a1; ++a)
            simd::max_8(rows_max.data(), input_row(a), row_bytes, 1, 0, is_signed);
          in = rows_max.data();
        }
        for (std::int64_t b = 0; b < kw; ++b) {
          // Columns col with 0 <= col * sw + off < w.
          const std::int64_t off = b * dw - pl;
          const auto [c0, c1] = taps(off, sw, ows, w);
          if (c0 >= c1) continue;
          simd::max_8(out + static_cast<std::uint64_t>(c0) * c, in + static_cast<std::uint64_t>(c0 * sw + off) * c, c,
                      static_cast<std::uint64_t>(c1 - c0), static_cast<std::uint64_t>(sw) * c, is_signed);
        }
        if (!is_signed) continue;  // u8: a window with no tap inside kept its 0
        for (std::uint64_t col = 0; col < ow; ++col) {
          const auto [b0, b1] = taps(static_cast<std::int64_t>(col) * sw - pl, dw, kw, w);
          if (b0 == b1) std::memset(out + col * c, 0, c);
        }
      }
    });
    return {};
  }
  if ((x.dtype == fw::DType::kF32 && y.dtype == fw::DType::kF32) || half_global || half_rows) {
    // The same loops on f32 pointers, over the taps inside the input: each
    // output is formed exactly as below (the same values in the same order;
    // max keeps the first of equal values and turns NaN once one is met).
    const std::uint32_t hd = nhwc ? 1 : 2, wd = nhwc ? 2 : 3;
    const auto xh = static_cast<std::int64_t>(x.strides[hd]), xw = static_cast<std::int64_t>(x.strides[wd]);
    if (!half && !max && !nhwc && ow == 1 && kh == 1 && dw == 1 && pt == 0 && pb == 0 && oh > 1 && x.strides[3] == 1) {
      // One window per row (ReduceMean over the last axis, LayerNorm's):
      // the loop below would take each tap as a call over one column.
      // Here eight rows' sums go on side by side, each still 0 plus its
      // taps in column order, as below.
      const std::int64_t w0 = -pl;
      const auto cols = taps(w0, dw, kw, w);
      const std::int64_t b0 = cols.first, b1 = cols.second;
      const std::int64_t div = divisor(0, w0, b1 - b0);
      const std::uint64_t rows = n * c * oh;
      e.pool().parallel_for((rows + 7) / 8,
                            [&](std::uint64_t begin, std::uint64_t end) {
                              for (std::uint64_t g = begin; g < end; ++g) {
                                const std::uint64_t first = g * 8, count = std::min<std::uint64_t>(8, rows - first);
                                const float* in[8];
                                float* out[8];
                                float acc[8] = {};
                                for (std::uint64_t k = 0; k < count; ++k) {
                                  const std::uint64_t i = first + k, r = i % oh, nc = i / oh, ni = nc / c, ci = nc % c;
                                  // Row r * sh (no padding above or below), from its column 0.
                                  in[k] = reinterpret_cast<const float*>(x.data) + ni * x.strides[0] +
                                          ci * x.strides[1] + r * static_cast<std::uint64_t>(sh) * x.strides[2];
                                  out[k] = reinterpret_cast<float*>(y.data) + ni * y.strides[0] + ci * y.strides[1] +
                                           r * y.strides[2];
                                }
                                for (std::int64_t b = b0; b < b1; ++b)
                                  for (std::uint64_t k = 0; k < count; ++k) acc[k] += in[k][w0 + b];
                                for (std::uint64_t k = 0; k < count; ++k)
                                  *out[k] = div ? acc[k] / static_cast<float>(div) : 0.0f;
                              }
                            },
                            std::max<std::uint64_t>(1, 2048 / std::max<std::int64_t>(1, kw)));
      return {};
    }
    if (oh == 1 && ow == 1) {
      // One window per channel (global pooling): the loop below would take
      // its taps one call at a time. Here each tap is one step over a block
      // of channels; every output still meets its taps in (row, column)
      // order.
      const std::uint64_t block = half ? kChannelBlock : channel_block(e, n, c);
      // Sums over dense channels: a row's taps (or every row's, where they
      // are evenly apart) in one call, in (row, column) order; a call per
      // tap cost the 32-channel squeeze 70 us. Halves and bf16 words widen
      // as they are added.
      const bool row_sums = !max && x.strides[cd] == 1;
      const std::uint64_t blocks = (c + block - 1) / block;
      const std::int64_t h0 = -pt, w0 = -pl;
      const auto rows = taps(h0, dh, kh, h), cols = taps(w0, dw, kw, w);
      const std::int64_t a0 = rows.first, a1 = rows.second, b0 = cols.first, b1 = cols.second;
      const std::int64_t div = divisor(h0, w0, (a1 - a0) * (b1 - b0));
      e.pool().parallel_for(
          n * blocks,
          [&](std::uint64_t begin, std::uint64_t end) {
            float acc[kChannelBlock];
            // Max pooling's halves as f32, a row's taps side by side (cn
            // floats each): widened in one call where the block is every
            // channel of dense rows, else a tap at a time.
            const bool by_row = half && blocks == 1 && dw == 1 && xw == static_cast<std::int64_t>(c);
            const auto row_taps = static_cast<std::uint64_t>(b1 - b0);
            std::vector<float> wide(half && max ? row_taps * std::min(block, c) : 0);
            auto widen = [&](std::uint64_t from, std::uint64_t count, float* into) {
              const auto* hp = reinterpret_cast<const std::uint16_t*>(x.data) + from;
              x.dtype == fw::DType::kF16 ? simd::widen_f16(hp, into, count) : simd::widen_bf16(hp, into, count);
            };
            for (std::uint64_t nb = begin; nb < end; ++nb) {
              const std::uint64_t ni = nb / blocks, c0 = nb % blocks * block, cn = std::min(block, c - c0);
              const std::uint64_t first = ni * x.strides[0] + c0 * x.strides[cd];
              std::fill(acc, acc + cn, max ? -std::numeric_limits<float>::infinity() : 0.0f);
              if (row_sums) {
                const auto step = static_cast<std::uint64_t>(dw * xw), cols_n = static_cast<std::uint64_t>(b1 - b0);
                // The taps from row a's first, `count` of them `step` apart.
                auto add_rows = [&](std::int64_t a, std::uint64_t count) {
                  const std::uint64_t from =
                      first + static_cast<std::uint64_t>((h0 + a * dh) * xh + (w0 + b0 * dw) * xw);
                  if (x.dtype == fw::DType::kF32)
                    simd::add_rows_f32(acc, reinterpret_cast<const float*>(x.data) + from, cn, count, step);
                  else if (x.dtype == fw::DType::kF16)
                    simd::add_rows_f16(acc, reinterpret_cast<const std::uint16_t*>(x.data) + from, cn, count, step);
                  else
                    simd::add_rows_bf16(acc, reinterpret_cast<const std::uint16_t*>(x.data) + from, cn, count, step);
                };
                if (a0 < a1 && static_cast<std::uint64_t>(dh * xh) == cols_n * step)
                  add_rows(a0, static_cast<std::uint64_t>(a1 - a0) * cols_n);
                else
                  for (std::int64_t a = a0; a < a1; ++a) add_rows(a, cols_n);
              }
              for (std::int64_t a = a0; !row_sums && a < a1; ++a) {
                const std::int64_t row = (h0 + a * dh) * xh;
                auto tap_at = [&](std::int64_t b) {
                  return first + static_cast<std::uint64_t>(row + (w0 + b * dw) * xw);
                };
                if (half) {
                  if (by_row)
                    widen(tap_at(b0), row_taps * cn, wide.data());
                  else
                    for (std::int64_t b = b0; b < b1; ++b)
                      widen(tap_at(b), cn, wide.data() + static_cast<std::uint64_t>(b - b0) * cn);
                }
                for (std::int64_t b = b0; b < b1; ++b) {
                  const float* in = half ? wide.data() + static_cast<std::uint64_t>(b - b0) * cn
                                         : reinterpret_cast<const float*>(x.data) + tap_at(b);
                  if (max)
                    simd::max_strided_f32(acc, in, cn, half ? 1 : x.strides[cd]);
                  else
                    simd::add_strided_f32(acc, in, cn, half ? 1 : x.strides[cd]);
                }
              }
              for (std::uint64_t k = 0; k < cn; ++k) {
                if (max)
                  acc[k] = acc[k] != acc[k] ? std::numeric_limits<float>::quiet_NaN() : acc[k];
                else
                  acc[k] = div ? acc[k] / static_cast<float>(div) : 0.0f;
              }
              const std::uint64_t out = ni * y.strides[0] + c0 * y.strides[cd];
              if (half) {
                auto* yp = reinterpret_cast<std::uint16_t*>(y.data) + out;
                y.dtype == fw::DType::kF16 ? simd::narrow_f16(acc, yp, cn) : simd::narrow_bf16(acc, yp, cn);
              } else {
                for (std::uint64_t k = 0; k < cn; ++k)
                  reinterpret_cast<float*>(y.data)[out + k * y.strides[cd]] = acc[k];
              }
            }
          },
          std::max<std::uint64_t>(1, 16384 / std::max<std::uint64_t>(1, block * static_cast<std::uint64_t>(kh * kw))));
      return {};
    }
    if (nhwc && x.strides[3] == 1 && y.strides[3] == 1) {
      // NHWC (fp32 models; f16 and bf16 ones a widened row at a time,
      // half_rows): an output row at a time, each tap one step over every
      // column it falls inside, all the channels of each (a call per tap
      // and position took ShuffleNet's 24-channel stem pool 1.3 ms at batch
      // 8); every output still meets its taps in (row, column) order.
      e.pool().parallel_for(
          n * oh,
          [&](std::uint64_t begin, std::uint64_t end) {
            std::vector<float> acc(ow * c);
            std::vector<float> wide(half_rows ? static_cast<std::uint64_t>(w) * c : 0);  // a widened input row
            const auto ows = static_cast<std::int64_t>(ow);
            for (std::uint64_t nr = begin; nr < end; ++nr) {
              const std::uint64_t ni = nr / oh, r = nr % oh;
              const std::int64_t h0 = static_cast<std::int64_t>(r) * sh - pt;
              const auto [a0, a1] = taps(h0, dh, kh, h);
              const std::uint64_t image = ni * x.strides[0];
              float* yr =
                  half_rows ? acc.data() : reinterpret_cast<float*>(y.data) + ni * y.strides[0] + r * y.strides[1];
              std::fill(acc.begin(), acc.end(), max ? -std::numeric_limits<float>::infinity() : 0.0f);
              for (std::int64_t a = a0; a < a1; ++a) {
                const auto from = image + static_cast<std::uint64_t>((h0 + a * dh) * xh);
                const float* row = wide.data();
                if (!half_rows)
                  row = reinterpret_cast<const float*>(x.data) + from;
                else if (x.dtype == fw::DType::kF16)
                  simd::widen_f16(reinterpret_cast<const std::uint16_t*>(x.data) + from, wide.data(), wide.size());
                else
                  simd::widen_bf16(reinterpret_cast<const std::uint16_t*>(x.data) + from, wide.data(), wide.size());
                for (std::int64_t b = 0; b < kw; ++b) {
                  // Columns col with 0 <= col * sw + off < w.
                  const std::int64_t off = b * dw - pl;
                  const auto [c0, c1] = taps(off, sw, ows, w);
                  if (c0 >= c1) continue;
                  float* out = acc.data() + static_cast<std::uint64_t>(c0) * c;
                  const float* in = row + (c0 * sw + off) * xw;
                  const auto cols = static_cast<std::uint64_t>(c1 - c0), step = static_cast<std::uint64_t>(sw * xw);
                  if (max)
                    simd::max_blocks_f32(out, in, c, cols, step);
                  else
                    simd::add_blocks_f32(out, in, c, cols, step);
                }
              }
              for (std::uint64_t col = 0; col < ow; ++col) {
                const std::int64_t w0 = static_cast<std::int64_t>(col) * sw - pl;
                const auto [b0, b1] = taps(w0, dw, kw, w);
                const float* got = acc.data() + col * c;
                float* out = yr + col * y.strides[2];
                const std::int64_t div = max ? 1 : divisor(h0, w0, (a1 - a0) * (b1 - b0));
                for (std::uint64_t k = 0; k < c; ++k)
                  out[k] = max ? (got[k] != got[k] ? std::numeric_limits<float>::quiet_NaN() : got[k])
                               : (div ? got[k] / static_cast<float>(div) : 0.0f);
              }
              if (half_rows) {  // the row formed in place in acc, rounded once
                auto* yp = reinterpret_cast<std::uint16_t*>(y.data) + ni * y.strides[0] + r * y.strides[1];
                y.dtype == fw::DType::kF16 ? simd::narrow_f16(acc.data(), yp, ow * c)
                                           : simd::narrow_bf16(acc.data(), yp, ow * c);
              }
            }
          },
          std::max<std::uint64_t>(1, 16384 / std::max<std::uint64_t>(1, ow * c * static_cast<std::uint64_t>(kh * kw))));
      return {};
    }
    e.pool().parallel_for(
        n * c,
        [&](std::uint64_t begin, std::uint64_t end) {
          for (std::uint64_t nc = begin; nc < end; ++nc) {
            const std::uint64_t ni = nc / c, ci = nc % c;
            const float* xp = reinterpret_cast<const float*>(x.data) + ni * x.strides[0] + ci * x.strides[cd];
            float* yp = reinterpret_cast<float*>(y.data) + ni * y.strides[0] + ci * y.strides[cd];
            std::vector<float> acc(ow);
            for (std::uint64_t r = 0; r < oh; ++r) {
              const std::int64_t h0 = static_cast<std::int64_t>(r) * sh - pt;
              const auto [a0, a1] = taps(h0, dh, kh, h);
              std::fill(acc.begin(), acc.end(), max ? -std::numeric_limits<float>::infinity() : 0.0f);
              // Tap by tap, each over the output columns it reaches: every
              // output still meets its taps in (row, column) order.
              for (std::int64_t a = a0; a < a1; ++a) {
                const float* row = xp + (h0 + a * dh) * xh;
                for (std::int64_t b = 0; b < kw; ++b) {
                  // Columns col with 0 <= col * sw - pl + b * dw < w.
                  const std::int64_t shift = b * dw - pl;
                  const auto [c0, c1] = taps(shift, sw, static_cast<std::int64_t>(ow), w);
                  if (c1 <= c0) continue;
                  const auto n_cols = static_cast<std::size_t>(c1 - c0);
                  const float* in = row + (c0 * sw + shift) * xw;
                  const auto step = static_cast<std::size_t>(sw * xw);
                  if (max)  // a NaN, once met, stays
                    simd::max_strided_f32(acc.data() + c0, in, n_cols, step);
                  else
                    simd::add_strided_f32(acc.data() + c0, in, n_cols, step);
                }
              }
              float* yr = yp + r * y.strides[hd];
              for (std::uint64_t col = 0; col < ow; ++col) {
                float out = acc[col];
                if (max) {
                  if (out != out) out = std::numeric_limits<float>::quiet_NaN();
                } else {
                  const std::int64_t w0 = static_cast<std::int64_t>(col) * sw - pl;
                  const auto [b0, b1] = taps(w0, dw, kw, w);
                  const std::int64_t div = divisor(h0, w0, (a1 - a0) * (b1 - b0));
                  out = div ? out / static_cast<float>(div) : 0.0f;
                }
                yr[col * y.strides[wd]] = out;
              }
            }
          }
        },
        std::max<std::uint64_t>(1, 16384 / std::max<std::uint64_t>(1, oh * ow * static_cast<std::uint64_t>(kh * kw))));
    return {};
  }
  e.pool().parallel_for(n * c, [&](std::uint64_t begin, std::uint64_t end) {
    for (std::uint64_t nc = begin; nc < end; ++nc) {
      const std::uint64_t ni = nc / c, ci = nc % c;
      for (std::uint64_t r = 0; r < oh; ++r) {
        for (std::uint64_t col = 0; col < ow; ++col) {
          const std::int64_t h0 = static_cast<std::int64_t>(r) * sh - pt;
          const std::int64_t w0 = static_cast<std::int64_t>(col) * sw - pl;
          float best = -std::numeric_limits<float>::infinity();
          std::int64_t best_i = std::numeric_limits<std::int64_t>::min();
          float sum = 0;
          std::int64_t count = 0;
          for (std::int64_t a = 0; a < kh; ++a) {
            const std::int64_t ih = h0 + a * dh;
            if (ih < 0 || ih >= h) continue;
            for (std::int64_t b = 0; b < kw; ++b) {
              const std::int64_t iw = w0 + b * dw;
              if (iw < 0 || iw >= w) continue;
              const std::byte* p =
                  x.at(at4(x, nhwc, ni, ci, static_cast<std::uint64_t>(ih), static_cast<std::uint64_t>(iw)));
              if (max && !is_float(x.dtype)) {
                best_i = std::max(best_i, load_int(p, x.dtype));
              } else {
                const float val = load_float(p, x.dtype);
                if (max)
                  best = std::isnan(val) || std::isnan(best) ? std::numeric_limits<float>::quiet_NaN()
                                                             : std::max(best, val);
                else
                  sum += val;
              }
              ++count;
            }
          }
          std::byte* out = y.at(at4(y, nhwc, ni, ci, r, col));
          if (max && !is_float(x.dtype)) {
            store_int_wrap(out, y.dtype, best_i);
          } else if (max) {
            store_float(out, y.dtype, best);
          } else {
            const std::int64_t div = divisor(h0, w0, count);
            store_float(out, y.dtype, div ? sum / static_cast<float>(div) : 0.0f);
          }
        }
      }
    }
  });
  return {};
}

namespace {

// Position in the input that output coordinate `o` maps to (ONNX Resize).
// As ONNX does, the resized length these use is in_len * scale, unrounded.
float source_coordinate(fw::CoordinateMode mode, float o, float scale, std::uint64_t in_len) {
  const float resized = static_cast<float>(in_len) * scale;
  switch (mode) {
    case fw::CoordinateMode::kHalfPixel: return (o + 0.5f) / scale - 0.5f;
    case fw::CoordinateMode::kAsymmetric: return o / scale;
    case fw::CoordinateMode::kAlignCorners:
      return resized == 1.0f ? 0.0f : o * static_cast<float>(in_len - 1) / (resized - 1.0f);
    case fw::CoordinateMode::kPytorchHalfPixel: return resized > 1.0f ? (o + 0.5f) / scale - 0.5f : 0.0f;
    case fw::CoordinateMode::kTfHalfPixelForNn: return (o + 0.5f) / scale;
  }
  return o / scale;
}

std::int64_t nearest_index(fw::NearestMode mode, float x) {
  switch (mode) {
    case fw::NearestMode::kRoundPreferFloor:
      return x == std::floor(x) + 0.5f ? static_cast<std::int64_t>(std::floor(x))
                                       : static_cast<std::int64_t>(std::round(x));
    case fw::NearestMode::kRoundPreferCeil:
      return x == std::floor(x) + 0.5f ? static_cast<std::int64_t>(std::ceil(x))
                                       : static_cast<std::int64_t>(std::round(x));
    case fw::NearestMode::kFloor: return static_cast<std::int64_t>(std::floor(x));
    case fw::NearestMode::kCeil: return static_cast<std::int64_t>(std::ceil(x));
  }
  return static_cast<std::int64_t>(std::floor(x));
}

}  // namespace

fw::Problem run_qlinear_global_avg_pool(TensorEngine& e, const fw::QuantAttrs& /*a*/, const View* v) {
  // X [N, H, W, C], XScale, XZeroPoint, YScale, YZeroPoint, Y [N, 1, 1, C].
  // The steps of dequantize, the f32 global pool above and quantize: each
  // byte dequantized, the sums over the taps in (row, column) order, the
  // mean by a division, then quantized; only the bytes are read.
  const View &x = v[0], &y = v[5];
  const std::uint64_t n = x.shape[0], h = x.shape[1], w = x.shape[2], c = x.shape[3];
  const std::uint64_t block = channel_block(e, n, c), blocks = (c + block - 1) / block, taps = h * w;
  // An image of no pixels (X, its scale and zero point empty, nothing to
  // read): each mean is 0, as the f32 pool gives.
  const float xs = taps ? load_float(v[1].data, fw::DType::kF32) : 0.0f;
  const auto xz = taps ? static_cast<std::int32_t>(load_int(v[2].data, v[2].dtype)) : 0;
  const float ys = load_float(v[3].data, fw::DType::kF32);
  const auto yz = static_cast<std::int32_t>(load_int(v[4].data, v[4].dtype));
  const bool x_signed = x.dtype == fw::DType::kI8;
  // Rows one after another (a dense image): every tap in one call.
  const bool even = x.strides[1] == w * x.strides[2];
  const auto* xp = reinterpret_cast<const std::uint8_t*>(x.data);
  e.pool().parallel_for(n * blocks, [&](std::uint64_t begin, std::uint64_t end) {
    float acc[kChannelBlock];
    std::uint8_t q[kChannelBlock];
    for (std::uint64_t nb = begin; nb < end; ++nb) {
      const std::uint64_t ni = nb / blocks, c0 = nb % blocks * block, cn = std::min(block, c - c0);
      std::fill(acc, acc + cn, 0.0f);
      // A vector of channels per tap, or (channels apart) one at a time.
      const std::uint64_t lanes = x.strides[3] == 1 ? cn : 1;
      for (std::uint64_t k = 0; taps && k < cn; k += lanes) {
        const std::uint8_t* first = xp + ni * x.strides[0] + (c0 + k) * x.strides[3];
        for (std::uint64_t a = 0; a < (even ? std::min<std::uint64_t>(h, 1) : h); ++a)
          simd::add_dequantized_8(acc + k, first + a * x.strides[1], lanes, even ? taps : w, x.strides[2], x_signed, xs,
                                  xz);
      }
      for (std::uint64_t k = 0; k < cn; ++k) acc[k] = taps ? acc[k] / static_cast<float>(taps) : 0.0f;
      simd::quantize_f32(acc, q, cn, ys, yz, int_min(y.dtype), int_max(y.dtype));
      for (std::uint64_t k = 0; k < cn; ++k)
        reinterpret_cast<std::uint8_t*>(y.data)[ni * y.strides[0] + (c0 + k) * y.strides[3]] = q[k];
    }
  });
  return {};
}

fw::Problem run_resize(TensorEngine& e, const fw::ResizeAttrs& at, const View* v) {
  const View &x = v[0], &y = v[1];
  const bool nhwc = at.layout == static_cast<std::uint32_t>(fw::Layout::kNHWC);
  const auto mode = static_cast<fw::CoordinateMode>(at.coordinate);
  const auto nearest = static_cast<fw::NearestMode>(at.nearest);
  const bool linear = at.mode == static_cast<std::uint32_t>(fw::ResizeMode::kLinear);
  const std::uint64_t n = x.shape[0], c = nhwc ? x.shape[3] : x.shape[1];
  const std::uint64_t ih = nhwc ? x.shape[1] : x.shape[2], iw = nhwc ? x.shape[2] : x.shape[3];
  const std::uint64_t oh = nhwc ? y.shape[1] : y.shape[2], ow = nhwc ? y.shape[2] : y.shape[3];
  auto clampi = [](std::int64_t i, std::uint64_t len) {
    return static_cast<std::uint64_t>(std::clamp<std::int64_t>(i, 0, static_cast<std::int64_t>(len) - 1));
  };
  // Where each output row and column reads, worked out once: the nearest
  // index, or the two neighbours (edges replicated) and the weight of the
  // second.
  struct Tap {
    std::uint64_t i0, i1;
    float w;
  };
  auto taps = [&](std::uint64_t out_len, float scale, std::uint64_t in_len) {
    std::vector<Tap> t(out_len);
    for (std::uint64_t o = 0; o < out_len; ++o) {
      const float src = source_coordinate(mode, static_cast<float>(o), scale, in_len);
      if (!linear) {
        t[o].i0 = t[o].i1 = clampi(nearest_index(nearest, src), in_len);
        continue;
      }
      const float f = std::floor(src);
      t[o] = {clampi(static_cast<std::int64_t>(f), in_len), clampi(static_cast<std::int64_t>(f) + 1, in_len), src - f};
    }
    return t;
  };
  const std::vector<Tap> rows = taps(oh, at.scale[0], ih), cols = taps(ow, at.scale[1], iw);
  const bool f32 = x.dtype == fw::DType::kF32 && y.dtype == fw::DType::kF32;
  e.pool().parallel_for(n * c, [&](std::uint64_t begin, std::uint64_t end) {
    for (std::uint64_t nc = begin; nc < end; ++nc) {
      const std::uint64_t ni = nc / c, ci = nc % c;
      for (std::uint64_t r = 0; r < oh; ++r) {
        const Tap& ty = rows[r];
        if (f32 && linear) {  // the same arithmetic as below, on f32 pointers
          const auto* r0 = reinterpret_cast<const float*>(x.at(at4(x, nhwc, ni, ci, ty.i0, 0)));
          const auto* r1 = reinterpret_cast<const float*>(x.at(at4(x, nhwc, ni, ci, ty.i1, 0)));
          auto* out = reinterpret_cast<float*>(y.at(at4(y, nhwc, ni, ci, r, 0)));
          const std::uint64_t xs = x.strides[nhwc ? 2 : 3], ys = y.strides[nhwc ? 2 : 3];
          for (std::uint64_t col = 0; col < ow; ++col) {
            const Tap& tx = cols[col];
            const float top = r0[tx.i0 * xs] * (1 - tx.w) + r0[tx.i1 * xs] * tx.w;
            const float bottom = r1[tx.i0 * xs] * (1 - tx.w) + r1[tx.i1 * xs] * tx.w;
            out[col * ys] = top * (1 - ty.w) + bottom * ty.w;
          }
          continue;
        }
        for (std::uint64_t col = 0; col < ow; ++col) {
          const Tap& tx = cols[col];
          std::byte* out = y.at(at4(y, nhwc, ni, ci, r, col));
          if (!linear) {
            std::memcpy(out, x.at(at4(x, nhwc, ni, ci, ty.i0, tx.i0)), x.esize);
            continue;
          }
          auto px = [&](std::uint64_t yy, std::uint64_t xx) {
            return load_float(x.at(at4(x, nhwc, ni, ci, yy, xx)), x.dtype);
          };
          const float top = px(ty.i0, tx.i0) * (1 - tx.w) + px(ty.i0, tx.i1) * tx.w;
          const float bottom = px(ty.i1, tx.i0) * (1 - tx.w) + px(ty.i1, tx.i1) * tx.w;
          store_float(out, y.dtype, top * (1 - ty.w) + bottom * ty.w);
        }
      }
    }
  });
  return {};
}

// BT.601 limited range:
//   R = 1.164 (Y - 16) + 1.596 (V - 128)
//   G = 1.164 (Y - 16) - 0.813 (V - 128) - 0.391 (U - 128)
//   B = 1.164 (Y - 16) + 2.018 (U - 128)
// clamped to [0, 255], then (value - mean) * scale per channel.
namespace {

// A plane's row of bytes: in place where its elements are adjacent, else
// gathered into `tmp`.
const std::uint8_t* byte_row(const std::byte* p, std::uint64_t stride, std::uint64_t n, std::uint8_t* tmp) {
  const auto* b = reinterpret_cast<const std::uint8_t*>(p);
  if (stride == 1) return b;
  for (std::uint64_t i = 0; i < n; ++i) tmp[i] = b[i * stride];
  return tmp;
}

// Image row r in f32 planar RGB (planes w apart in `rgb`), from the chroma
// row of r / 2: in place where the chroma of a row is every byte (I420) or
// every other byte (NV12's pairs), gathered otherwise.
void color_row(const fw::ColorConvertAttrs& at, const View* v, bool nv12, std::uint64_t r, std::uint8_t* tmp,
               float* rgb) {
  const View &luma = v[0], &c1 = v[1], &c2 = v[2];
  const std::uint64_t w = luma.shape[1], cw = (w + 1) / 2;
  const std::uint8_t* lp = byte_row(luma.at(r * luma.strides[0]), luma.strides[1], w, tmp);
  const auto* up = reinterpret_cast<const std::uint8_t*>(c1.at(r / 2 * c1.strides[0]));
  const auto* vp = nv12 ? up + c1.strides[2] : reinterpret_cast<const std::uint8_t*>(c2.at(r / 2 * c2.strides[0]));
  const std::uint64_t us = c1.strides[1], vs = nv12 ? c1.strides[1] : c2.strides[1];
  const bool gathered = us != vs || us > 2;  // then each plane into tmp, at step 1
  if (gathered) {
    up = byte_row(reinterpret_cast<const std::byte*>(up), us, cw, tmp + w);
    vp = byte_row(reinterpret_cast<const std::byte*>(vp), vs, cw, tmp + w + cw);
  }
  simd::yuv_row_f32(lp, up, vp, gathered ? 1 : us, w, at.mean, at.scale, rgb);
}

// n f32 values into y's row at `out`, its elements y.strides[2] apart, as
// store_float would store each: whole rows through the vector conversions
// where the row is dense.
void store_row(const float* in, std::byte* out, std::uint64_t n, const View& y) {
  const fw::DType t = y.dtype;
  const std::uint64_t stride = y.strides[2];
  const bool dense = stride == 1;
  if (dense && t == fw::DType::kF32) {
    std::memcpy(out, in, n * 4);
  } else if (dense && t == fw::DType::kF16) {
    simd::narrow_f16(in, reinterpret_cast<std::uint16_t*>(out), n);
  } else if (dense && t == fw::DType::kBF16) {
    simd::narrow_bf16(in, reinterpret_cast<std::uint16_t*>(out), n);
  } else if (dense && (t == fw::DType::kU8 || t == fw::DType::kI8)) {
    simd::quantize_f32(in, reinterpret_cast<std::uint8_t*>(out), n, 1.0f, 0, int_min(t), int_max(t));
  } else {
    for (std::uint64_t i = 0; i < n; ++i) store_float(out + i * stride * y.esize, t, in[i]);
  }
}

}  // namespace

fw::Problem run_color_convert(TensorEngine& e, const fw::ColorConvertAttrs& at, const View* v) {
  const View &luma = v[0], &y = v[3];
  const bool nv12 = at.format == static_cast<std::uint32_t>(fw::ColorFormat::kNV12);
  const std::uint64_t h = luma.shape[0], w = luma.shape[1];
  e.pool().parallel_for(h, [&](std::uint64_t begin, std::uint64_t end) {
    std::vector<float> rgb(3 * w);
    std::vector<std::uint8_t> tmp(2 * w + 2);
    for (std::uint64_t r = begin; r < end; ++r) {
      color_row(at, v, nv12, r, tmp.data(), rgb.data());
      for (std::uint64_t k = 0; k < 3; ++k)
        store_row(rgb.data() + k * w, y.at(k * y.strides[0] + r * y.strides[1]), w, y);
    }
  });
  return {};
}

// ---- RoiAlign ---------------------------------------------------------------

namespace {

// The most samples one region may take over all its bins: a bound on the
// work a region asks for (Mask R-CNN's 14x14 bins of 2x2 samples take 784;
// a 200x200 feature map pooled to 7x7 with sampling_ratio 0, 41 thousand).
constexpr std::uint64_t kMaxRoiSamples = std::uint64_t{1} << 20;

// One region's geometry, as ONNX Runtime's RoiAlign computes it in f32.
struct Region {
  std::uint64_t batch = 0;
  float start_h = 0, start_w = 0, bin_h = 0, bin_w = 0;
  std::uint64_t grid_h = 0, grid_w = 0;  // samples per bin along each axis; 0: none
  std::uint64_t count = 1;               // the divisor of a bin's mean: grid_h * grid_w, at least 1
};

// The sampling grid along one axis: the ratio, or the extent per bin rounded
// up; a negative one (a degenerate region) samples nothing.
std::uint64_t roi_grid(std::uint32_t ratio, float extent, std::uint64_t bins) {
  if (ratio > 0) return ratio;
  const float g = std::ceil(extent / static_cast<float>(bins));
  if (!(g > 0)) return 0;
  return g > static_cast<float>(kMaxRoiSamples) ? kMaxRoiSamples + 1 : static_cast<std::uint64_t>(g);
}

// Region r of Rois, checked: its batch index in [-N, N) (negative from the
// end, as gather's), its coordinates finite once scaled, its samples at most
// kMaxRoiSamples.
fw::Problem read_region(const fw::RoiAlignAttrs& at, const View* v, std::uint64_t r, Region& out) {
  const View &x = v[0], &rois = v[1], &idx = v[2], &y = v[3];
  const std::int64_t b = load_int(idx.at(r * idx.strides[0]), idx.dtype);
  const auto batches = static_cast<std::int64_t>(x.shape[0]);
  if (b < -batches || b >= batches)
    return {fw::CmdStatus::kBadArgument, fw::tensor_data_field(2), static_cast<std::uint64_t>(b), x.shape[0]};
  const float offset = at.half_pixel ? 0.5f : 0.0f;
  float c[4];
  for (std::uint64_t k = 0; k < 4; ++k) {
    c[k] = load_float(rois.at(r * rois.strides[0] + k * rois.strides[1]), rois.dtype) * at.spatial_scale - offset;
    if (!std::isfinite(c[k])) return {fw::CmdStatus::kBadArgument, fw::tensor_row_field(1), r, 0};
  }
  float width = c[2] - c[0], height = c[3] - c[1];
  if (!at.half_pixel) {  // output_half_pixel: a malformed region is made 1x1
    width = std::max(width, 1.0f);
    height = std::max(height, 1.0f);
  }
  const std::uint64_t oh = y.shape[2], ow = y.shape[3];
  out.batch = static_cast<std::uint64_t>(b < 0 ? b + batches : b);
  out.start_w = c[0];
  out.start_h = c[1];
  out.bin_h = height / static_cast<float>(oh);
  out.bin_w = width / static_cast<float>(ow);
  out.grid_h = roi_grid(at.sampling_ratio, height, oh);
  out.grid_w = roi_grid(at.sampling_ratio, width, ow);
  if (out.grid_h > kMaxRoiSamples || out.grid_w > kMaxRoiSamples ||
      out.grid_h * out.grid_w > kMaxRoiSamples / (oh * ow))
    return {fw::CmdStatus::kBadArgument, fw::tensor_row_field(1), r, kMaxRoiSamples};
  out.count = std::max<std::uint64_t>(out.grid_h * out.grid_w, 1);
  return {};
}

using Tap = fw::RoiTap;

// The taps of every bin along one axis, bin-major: bins * grid of them.
void roi_taps(std::vector<Tap>& taps, float start, float bin, std::uint64_t bins, std::uint64_t grid,
              std::uint64_t size) {
  taps.assign(bins * grid, Tap{});
  for (std::uint64_t p = 0; p < bins; ++p)
    for (std::uint64_t i = 0; i < grid; ++i) taps[p * grid + i] = fw::roi_tap(start, bin, p, i, grid, size);
}

// One sample of a bin: the element offsets of its four pixels in an X
// plane and their weights; outside X, four zero weights on the first
// pixel, as ONNX Runtime has it (a NaN or an infinity there still shows).
struct Sample {
  std::uint64_t o[4];
  float w[4];
};

// A region's samples, bin by bin (row-major), each bin's grid_h x grid_w
// of them row-major, from the taps along each axis.
void roi_samples(std::vector<Sample>& out, const std::vector<Tap>& ty, const std::vector<Tap>& tx, const Region& g,
                 std::uint64_t oh, std::uint64_t ow, std::uint64_t sh, std::uint64_t sw) {
  out.clear();
  for (std::uint64_t ph = 0; ph < oh; ++ph)
    for (std::uint64_t pw = 0; pw < ow; ++pw)
      for (std::uint64_t iy = 0; iy < g.grid_h; ++iy)
        for (std::uint64_t ix = 0; ix < g.grid_w; ++ix) {
          const Tap& a = ty[ph * g.grid_h + iy];
          const Tap& b = tx[pw * g.grid_w + ix];
          if (!a.inside || !b.inside) {
            out.push_back(Sample{{0, 0, 0, 0}, {0.0f, 0.0f, 0.0f, 0.0f}});
            continue;
          }
          out.push_back(Sample{
              {a.low * sh + b.low * sw, a.low * sh + b.high * sw, a.high * sh + b.low * sw, a.high * sh + b.high * sw},
              {a.h * b.h, a.h * b.l, a.l * b.h, a.l * b.l}});
        }
}

// Y's bins of one region and channel from its samples: the mean (each
// sample's weighted corners summed, then added) or ONNX's max.
template <class Load>
void roi_bins(const std::vector<Sample>& samples, std::uint64_t per_bin, std::uint64_t count, bool max, Load value,
              float* out, std::uint64_t bins) {
  const Sample* s = samples.data();
  for (std::uint64_t b = 0; b < bins; ++b) {
    float acc = 0.0f;
    for (std::uint64_t k = 0; k < per_bin; ++k, ++s) {
      const float c0 = s->w[0] * value(s->o[0]), c1 = s->w[1] * value(s->o[1]);
      const float c2 = s->w[2] * value(s->o[2]), c3 = s->w[3] * value(s->o[3]);
      if (!max)
        acc += c0 + c1 + c2 + c3;
      else
        acc = k == 0 ? std::max(std::max(std::max(c0, c1), c2), c3)
                     : std::max(acc, std::max(std::max(std::max(c0, c1), c2), c3));
    }
    out[b] = max ? acc : acc / static_cast<float>(count);
  }
}

}  // namespace

fw::Problem run_roi_align(TensorEngine& e, const fw::RoiAlignAttrs& at, const View* v) {
  // X [N, C, H, W], Rois [R, 4], BatchIndices [R], Y [R, C, OH, OW]; every
  // region checked before Y is written.
  const View &x = v[0], &y = v[3];
  const std::uint64_t regions = y.shape[0], channels = y.shape[1], oh = y.shape[2], ow = y.shape[3];
  const std::uint64_t height = x.shape[2], width = x.shape[3];
  if (y.elements() == 0) return {};
  std::vector<Region> region(regions);
  for (std::uint64_t r = 0; r < regions; ++r)
    if (fw::Problem p = read_region(at, v, r, region[r]); p.status != fw::CmdStatus::kOk) return p;
  const bool max = at.mode == static_cast<std::uint32_t>(fw::RoiAlignMode::kMax);
  const bool empty = height == 0 || width == 0;  // every sample outside: each bin pools to 0
  e.pool().parallel_for(regions * channels, [&](std::uint64_t begin, std::uint64_t end) {
    std::vector<Tap> ty, tx;
    std::vector<Sample> samples;
    std::vector<float> bins(oh * ow);
    std::uint64_t have = UINT64_MAX;  // the region whose samples `samples` holds
    for (std::uint64_t rc = begin; rc < end; ++rc) {
      const std::uint64_t r = rc / channels, c = rc % channels;
      const Region& g = region[r];
      const std::uint64_t per_bin = empty ? 0 : g.grid_h * g.grid_w;
      if (r != have && per_bin > 0) {
        roi_taps(ty, g.start_h, g.bin_h, oh, g.grid_h, height);
        roi_taps(tx, g.start_w, g.bin_w, ow, g.grid_w, width);
        roi_samples(samples, ty, tx, g, oh, ow, x.strides[2], x.strides[3]);
        have = r;
      }
      // An empty X may have no data at all: nothing is read from it.
      const std::byte* plane = empty ? x.data : x.at(g.batch * x.strides[0] + c * x.strides[1]);
      if (x.dtype == fw::DType::kF32) {
        const auto* f = reinterpret_cast<const float*>(plane);
        roi_bins(
            samples, per_bin, g.count, max, [f](std::uint64_t o) { return f[o]; }, bins.data(), oh * ow);
      } else {
        const fw::DType t = x.dtype;
        const std::uint64_t es = x.esize;
        roi_bins(
            samples, per_bin, g.count, max, [=](std::uint64_t o) { return load_float(plane + o * es, t); }, bins.data(),
            oh * ow);
      }
      for (std::uint64_t b = 0; b < oh * ow; ++b)
        store_float(y.at(r * y.strides[0] + c * y.strides[1] + b / ow * y.strides[2] + b % ow * y.strides[3]), y.dtype,
                    bins[b]);
    }
  });
  return {};
}

}  // namespace tpuhal::sim::tensor
