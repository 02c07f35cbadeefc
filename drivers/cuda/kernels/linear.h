// Linear kernels (kernel.h): matmul, conv2d, conv_transpose2d and pooling
// in float, and the integer products (matmul_integer, conv_integer,
// qlinear_matmul, qlinear_conv). One output element per item, which loops
// over its own sum or window: no item reads another's result, so the
// parallel schedule cannot change a bit.
//
// The simulator's rules these follow (simulator/src/tensor): matmul sums
// each element as one chain of fused multiply-adds in k order from 0
// (fgemm.h on every FMA level); conv_transpose2d and pooling add in the
// orders docs/ops.md fixes; the integer sums are exact in int32, wrapping,
// and requantise as engine.cpp's requantize() does.
#pragma once

#include <math.h>

#include "activation.h"
#include "kernel.h"

namespace tpuhal::cuda::k {

namespace lin {

// y = saturate(round_half_even(float(acc) * m) + zero), as the simulator's
// requantize(): the product clamped to +-2^22 and rounded by adding and
// removing 1.5 * 2^23 (two IEEE additions). A NaN product (a NaN or
// infinite scale) counts as 0, the rule for rounding NaN to an integer.
TK_FN std::int32_t requantize(std::int32_t acc, float m, std::int32_t zero, std::uint32_t dtype) {
  constexpr float kMagic = 12582912.0f, kLimit = 4194304.0f;
  float v = static_cast<float>(acc) * m;
  v = v != v ? 0.0f : v;
  v = v < -kLimit ? -kLimit : v;
  v = v > kLimit ? kLimit : v;
  const float r = (v + kMagic) - kMagic;
  const std::int32_t lo = dtype == kI8 ? -128 : 0, hi = dtype == kI8 ? 127 : 255;
  std::int32_t q = static_cast<std::int32_t>(r) + zero;
  q = q < lo ? lo : q;
  return q > hi ? hi : q;
}

// (a - za) * (b - zb) added to acc modulo 2^32 (|a - za| <= 255, so the
// product itself is exact in int32).
TK_FN std::uint32_t add_product(std::uint32_t acc, std::int32_t a, std::int32_t b) {
  return acc + static_cast<std::uint32_t>(a * b);
}

// The offset in `t` of batch index `batch` of `y` (row-major over y's
// dimensions but the last two), t having y's rank.
TK_FN std::int64_t batch_offset(const Tensor& y, const Tensor& t, std::uint64_t batch) {
  std::int64_t off = 0;
  for (std::uint32_t d = y.rank - 2; d-- > 0;) {
    const std::uint64_t s = y.shape[d];
    off += static_cast<std::int64_t>(batch % s) * t.strides[d];
    batch /= s;
  }
  return off;
}

// ---- Matrix products ------------------------------------------------------------

// matmul(a, b, c, y): y = act(alpha * op(a) @ op(b) + beta * c). a and b
// have y's rank, their batch dimensions broadcast to y's; c is broadcast
// to y's shape. The launcher gives op(a)'s row and k strides and op(b)'s k
// and column strides (the transposes).
struct MatMulParams {
  std::uint64_t n;
  Tensor a, b, c, y;
  std::int64_t a_row, a_k, b_k, b_col;
  std::uint64_t k;
  float alpha, beta;
  Act act;
  std::uint32_t plain;  // alpha 1, no c, no activation: y is the sum itself
};
TK_FN void matmul_body(const MatMulParams& p, std::uint64_t i) {
  const std::uint32_t r = p.y.rank;
  const std::uint64_t cols = p.y.shape[r - 1], rows = p.y.shape[r - 2];
  const auto col = static_cast<std::int64_t>(i % cols), row = static_cast<std::int64_t>(i / cols % rows);
  const std::uint64_t batch = i / cols / rows;
  const std::int64_t ao = batch_offset(p.y, p.a, batch) + row * p.a_row;
  const std::int64_t bo = batch_offset(p.y, p.b, batch) + col * p.b_col;
  float acc = 0.0f;
  for (std::uint64_t kk = 0; kk < p.k; ++kk) {
    const auto s = static_cast<std::int64_t>(kk);
    acc = ::fmaf(load_f(p.a, ao + s * p.a_k), load_f(p.b, bo + s * p.b_k), acc);
  }
  float v = acc;
  if (!p.plain) {
    const float cv = p.c.addr ? load_f(p.c, offset_of(p.c, i)) : 0.0f;
    v = activate(p.act, p.alpha * acc + p.beta * cv);
  }
  store_f(p.y, offset_of(p.y, i), v);
}

// matmul_integer and qlinear_matmul: acc = (A - AZp) @ (B - BZp), exact
// in int32, wrapping. The zero points and scales are views over a's or
// b's shape (constant along k). With `ys` absent (matmul_integer) y is
// acc; else y = requantize(acc, AScale * BScale / YScale) in y's u8 or i8
// (the multiplier 0 where K = 0, as the simulator forms it).
struct IntMatMulParams {
  std::uint64_t n;
  Tensor a, b, az, bz, y;
  Tensor as, bs, ys, yz;
  std::uint64_t k;
};
TK_FN void int_matmul_body(const IntMatMulParams& p, std::uint64_t i) {
  const std::uint32_t r = p.y.rank;
  const std::uint64_t cols = p.y.shape[r - 1], rows = p.y.shape[r - 2];
  const auto col = static_cast<std::int64_t>(i % cols), row = static_cast<std::int64_t>(i / cols % rows);
  const std::uint64_t batch = i / cols / rows;
  const std::int64_t ao = batch_offset(p.y, p.a, batch) + row * p.a.strides[r - 2];
  const std::int64_t bo = batch_offset(p.y, p.b, batch) + col * p.b.strides[r - 1];
  const std::int64_t ak = p.a.strides[r - 1], bk = p.b.strides[r - 2];
  const std::int32_t za = p.az.addr ? load_i(p.az, batch_offset(p.y, p.az, batch) + row * p.az.strides[r - 2]) : 0;
  const std::int32_t zb = p.bz.addr ? load_i(p.bz, batch_offset(p.y, p.bz, batch) + col * p.bz.strides[r - 1]) : 0;
  std::uint32_t acc = 0;
  for (std::uint64_t kk = 0; kk < p.k; ++kk) {
    const auto s = static_cast<std::int64_t>(kk);
    acc = add_product(acc, load_i(p.a, ao + s * ak) - za, load_i(p.b, bo + s * bk) - zb);
  }
  const std::int64_t yo = offset_of(p.y, i);
  if (!p.ys.addr) {
    store_i(p.y, yo, static_cast<std::int32_t>(acc));
    return;
  }
  float m = 0.0f;
  if (p.k) {
    const float sa = load_f(p.as, batch_offset(p.y, p.as, batch) + row * p.as.strides[r - 2]);
    const float sb = load_f(p.bs, batch_offset(p.y, p.bs, batch) + col * p.bs.strides[r - 1]);
    m = sa * sb / load_f(p.ys, 0);
  }
  store_i(p.y, yo, requantize(static_cast<std::int32_t>(acc), m, load_i(p.yz, 0), p.y.dtype));
}

// ---- Images: convolutions and pooling ---------------------------------------------

// A 4-D image tensor's sizes and strides in N, C, H, W order, whichever
// its layout.
struct Nchw {
  std::uint64_t n, c, h, w;
  std::int64_t sn, sc, sh, sw;
};
TK_FN Nchw nchw_of(const Tensor& t, bool nhwc) {
  const std::uint32_t c = nhwc ? 3 : 1, h = nhwc ? 1 : 2, w = nhwc ? 2 : 3;
  return {t.shape[0], t.shape[c], t.shape[h], t.shape[w], t.strides[0], t.strides[c], t.strides[h], t.strides[w]};
}
TK_FN std::int64_t image_offset(const Nchw& t, std::uint64_t n, std::uint64_t c, std::int64_t h, std::int64_t w) {
  return static_cast<std::int64_t>(n) * t.sn + static_cast<std::int64_t>(c) * t.sc + h * t.sh + w * t.sw;
}

// The position of row-major element `i` of an image in its own layout.
struct Pos {
  std::uint64_t n, c;
  std::int64_t h, w;
};
TK_FN Pos position_of(const Nchw& t, bool nhwc, std::uint64_t i) {
  Pos p{};
  if (nhwc) {
    p.c = i % t.c;
    i /= t.c;
  }
  p.w = static_cast<std::int64_t>(i % t.w);
  i /= t.w;
  p.h = static_cast<std::int64_t>(i % t.h);
  i /= t.h;
  if (!nhwc) {
    p.c = i % t.c;
    i /= t.c;
  }
  p.n = i;
  return p;
}

// Taps [k0, k1) of a window of k taps, dilation `dil`, starting at `start`,
// that fall inside [0, len).
struct Taps {
  std::int64_t k0, k1;
};
TK_FN Taps taps_inside(std::int64_t start, std::int64_t dil, std::int64_t k, std::int64_t len) {
  const std::int64_t k0 = start >= 0 ? 0 : (-start + dil - 1) / dil;
  std::int64_t k1 = start >= len ? 0 : (len - start + dil - 1) / dil;
  k1 = k1 < k ? k1 : k;
  return {k0, k1 > k0 ? k1 : k0};
}

// A convolution's geometry (ConvAttrs): [0] along H, [1] along W.
struct ConvGeom {
  std::uint32_t nhwc, groups;
  std::int64_t stride[2], dil[2], pad[2];  // pad: top, left
};

// The window of output position `o` and the channels of its group.
struct Window {
  std::uint64_t ci0, cin_g;
  std::int64_t h0, w0;
  Taps rows, cols;
};
TK_FN Window window_of(const ConvGeom& g, const Nchw& x, const Nchw& y, const Tensor& w, const Pos& o) {
  Window win{};
  win.cin_g = w.shape[1];
  win.ci0 = o.c / (y.c / g.groups) * win.cin_g;
  win.h0 = o.h * g.stride[0] - g.pad[0];
  win.w0 = o.w * g.stride[1] - g.pad[1];
  win.rows = taps_inside(win.h0, g.dil[0], static_cast<std::int64_t>(w.shape[2]), static_cast<std::int64_t>(x.h));
  win.cols = taps_inside(win.w0, g.dil[1], static_cast<std::int64_t>(w.shape[3]), static_cast<std::int64_t>(x.w));
  return win;
}

// conv2d(x, w, bias, y) in f32: each output the sum of its taps inside x
// (padding adds nothing), in (input channel, kernel row, kernel column)
// order, each product rounded and then added; then the bias, what y held
// where it accumulates (ConvAttrs::accumulate), and the activation.
struct ConvParams {
  std::uint64_t n;
  Tensor x, w, bias, y;
  ConvGeom g;
  Act act;
  std::uint32_t accumulate;
};
TK_FN void conv_body(const ConvParams& p, std::uint64_t i) {
  const bool nhwc = p.g.nhwc != 0;
  const Nchw x = nchw_of(p.x, nhwc), y = nchw_of(p.y, nhwc);
  const Pos o = position_of(y, nhwc, i);
  const Window win = window_of(p.g, x, y, p.w, o);
  const std::int64_t* ws = p.w.strides;
  const std::int64_t w_o = static_cast<std::int64_t>(o.c) * ws[0];
  float acc = 0.0f;
  for (std::uint64_t ci = 0; ci < win.cin_g; ++ci) {
    const std::int64_t xc = image_offset(x, o.n, win.ci0 + ci, 0, 0), wc = w_o + static_cast<std::int64_t>(ci) * ws[1];
    for (std::int64_t a = win.rows.k0; a < win.rows.k1; ++a) {
      const std::int64_t xr = xc + (win.h0 + a * p.g.dil[0]) * x.sh, wr = wc + a * ws[2];
      for (std::int64_t b = win.cols.k0; b < win.cols.k1; ++b)
        acc += load_f(p.x, xr + (win.w0 + b * p.g.dil[1]) * x.sw) * load_f(p.w, wr + b * ws[3]);
    }
  }
  const float bias = p.bias.addr ? load_f(p.bias, static_cast<std::int64_t>(o.c) * p.bias.strides[0]) : 0.0f;
  const std::int64_t at = image_offset(y, o.n, o.c, o.h, o.w);
  const float sum = acc + bias;
  store_f(p.y, at, activate(p.act, p.accumulate ? sum + load_f(p.y, at) : sum));
}

// conv_integer and qlinear_conv: acc = sum over the taps inside x of
// (x - XZp)(w - WZp), exact in int32, wrapping. XZp (a scalar view) and
// WZp (per output channel, along w's dimension 0) may be absent. With
// `ys` absent (conv_integer) y is acc; else acc plus the i32 bias
// (wrapping) requantised by XScale * WScale[o] / YScale.
struct IntConvParams {
  std::uint64_t n;
  Tensor x, w, xz, wz, y;
  Tensor xs, ws, ys, yz, bias;
  ConvGeom g;
};
TK_FN std::uint32_t int_conv_sum(const IntConvParams& p, const Nchw& x, const Pos& o, const Window& win) {
  const std::int32_t zx = p.xz.addr ? load_i(p.xz, 0) : 0;
  const auto oc = static_cast<std::int64_t>(o.c);
  const std::int32_t zw = p.wz.addr ? load_i(p.wz, oc * p.wz.strides[0]) : 0;
  const std::int64_t* ws = p.w.strides;
  std::uint32_t acc = 0;
  for (std::uint64_t ci = 0; ci < win.cin_g; ++ci) {
    const std::int64_t xc = image_offset(x, o.n, win.ci0 + ci, 0, 0),
                       wc = oc * ws[0] + static_cast<std::int64_t>(ci) * ws[1];
    for (std::int64_t a = win.rows.k0; a < win.rows.k1; ++a) {
      const std::int64_t xr = xc + (win.h0 + a * p.g.dil[0]) * x.sh, wr = wc + a * ws[2];
      for (std::int64_t b = win.cols.k0; b < win.cols.k1; ++b)
        acc =
            add_product(acc, load_i(p.x, xr + (win.w0 + b * p.g.dil[1]) * x.sw) - zx, load_i(p.w, wr + b * ws[3]) - zw);
    }
  }
  return acc;
}
TK_FN void int_conv_body(const IntConvParams& p, std::uint64_t i) {
  const bool nhwc = p.g.nhwc != 0;
  const Nchw x = nchw_of(p.x, nhwc), y = nchw_of(p.y, nhwc);
  const Pos o = position_of(y, nhwc, i);
  std::uint32_t acc = int_conv_sum(p, x, o, window_of(p.g, x, y, p.w, o));
  const std::int64_t yo = image_offset(y, o.n, o.c, o.h, o.w);
  if (!p.ys.addr) {
    store_i(p.y, yo, static_cast<std::int32_t>(acc));
    return;
  }
  const auto oc = static_cast<std::int64_t>(o.c);
  if (p.bias.addr) acc += static_cast<std::uint32_t>(load_i(p.bias, oc * p.bias.strides[0]));
  const float m = load_f(p.xs, 0) * load_f(p.ws, oc * p.ws.strides[0]) / load_f(p.ys, 0);
  store_i(p.y, yo, requantize(static_cast<std::int32_t>(acc), m, load_i(p.yz, 0), p.y.dtype));
}

// conv_transpose2d(x, w, bias, y), x [N, Cin, H, W] (or NHWC), w [Cin,
// Cout/groups, kh, kw]: input (ih, iw) reaches output (ih * stride - pad
// + a * dilation, ...). Each output sums the products that reach it in
// (input channel, kernel row, kernel column) order from 0, each product
// rounded and then added (docs/ops.md), then act(sum + bias): the
// simulator's bits (conv_transpose.cpp).
struct ConvTransposeParams {
  std::uint64_t n;
  Tensor x, w, bias, y;
  ConvGeom g;
  Act act;
};
// The input index that kernel tap `a` maps to output `out`, or -1.
TK_FN std::int64_t transposed_source(std::int64_t out, std::int64_t a, std::int64_t stride, std::int64_t dil,
                                     std::int64_t pad, std::uint64_t len) {
  const std::int64_t t = out + pad - a * dil;
  if (t < 0 || t % stride != 0 || t / stride >= static_cast<std::int64_t>(len)) return -1;
  return t / stride;
}
TK_FN void conv_transpose_body(const ConvTransposeParams& p, std::uint64_t i) {
  const bool nhwc = p.g.nhwc != 0;
  const Nchw x = nchw_of(p.x, nhwc), y = nchw_of(p.y, nhwc);
  const Pos o = position_of(y, nhwc, i);
  const std::uint64_t cout_g = p.w.shape[1], cin_g = x.c / p.g.groups;
  const std::uint64_t ci0 = o.c / cout_g * cin_g;
  const auto ol = static_cast<std::int64_t>(o.c % cout_g);
  const std::int64_t* ws = p.w.strides;
  const auto kh = static_cast<std::int64_t>(p.w.shape[2]), kw = static_cast<std::int64_t>(p.w.shape[3]);
  float acc = 0.0f;
  for (std::uint64_t ci = ci0; ci < ci0 + cin_g; ++ci) {
    const std::int64_t xc = image_offset(x, o.n, ci, 0, 0), wc = static_cast<std::int64_t>(ci) * ws[0] + ol * ws[1];
    for (std::int64_t a = 0; a < kh; ++a) {
      const std::int64_t ih = transposed_source(o.h, a, p.g.stride[0], p.g.dil[0], p.g.pad[0], x.h);
      if (ih < 0) continue;
      for (std::int64_t b = 0; b < kw; ++b) {
        const std::int64_t iw = transposed_source(o.w, b, p.g.stride[1], p.g.dil[1], p.g.pad[1], x.w);
        if (iw < 0) continue;
        const float prod = load_f(p.x, xc + ih * x.sh + iw * x.sw) * load_f(p.w, wc + a * ws[2] + b * ws[3]);
        acc += prod;
      }
    }
  }
  const float bias = p.bias.addr ? load_f(p.bias, static_cast<std::int64_t>(o.c) * p.bias.strides[0]) : 0.0f;
  store_f(p.y, image_offset(y, o.n, o.c, o.h, o.w), activate(p.act, acc + bias));
}

// ---- Pooling ------------------------------------------------------------------------

// max_pool2d and avg_pool2d (the simulator's run_pool2d): each window's
// taps inside x in (row, column) order. Max over floats starts from -inf,
// keeps the first of equal values and gives NaN once a NaN is met; over
// i8 and u8 it is exact. Average adds the taps in f32 from 0 and divides
// by their count, or with count_include_pad by the window clipped to the
// padded input.
struct PoolParams {
  std::uint64_t n;
  Tensor x, y;
  std::uint32_t nhwc, max, include_pad, reserved;
  std::int64_t kernel[2], stride[2], dil[2], pad[4];  // pad: top, left, bottom, right
};
TK_FN std::int64_t pool_divisor(const PoolParams& p, const Nchw& x, std::int64_t h0, std::int64_t w0,
                                std::int64_t count) {
  if (!p.include_pad) return count;
  std::int64_t hend = h0 + (p.kernel[0] - 1) * p.dil[0] + 1, wend = w0 + (p.kernel[1] - 1) * p.dil[1] + 1;
  const std::int64_t hlim = static_cast<std::int64_t>(x.h) + p.pad[2], wlim = static_cast<std::int64_t>(x.w) + p.pad[3];
  hend = hend < hlim ? hend : hlim;
  wend = wend < wlim ? wend : wlim;
  return ((hend - h0 + p.dil[0] - 1) / p.dil[0]) * ((wend - w0 + p.dil[1] - 1) / p.dil[1]);
}
TK_FN void pool_body(const PoolParams& p, std::uint64_t i) {
  const bool nhwc = p.nhwc != 0;
  const Nchw x = nchw_of(p.x, nhwc), y = nchw_of(p.y, nhwc);
  const Pos o = position_of(y, nhwc, i);
  const std::int64_t h0 = o.h * p.stride[0] - p.pad[0], w0 = o.w * p.stride[1] - p.pad[1];
  const Taps rows = taps_inside(h0, p.dil[0], p.kernel[0], static_cast<std::int64_t>(x.h));
  const Taps cols = taps_inside(w0, p.dil[1], p.kernel[1], static_cast<std::int64_t>(x.w));
  const std::int64_t base = image_offset(x, o.n, o.c, 0, 0), yo = image_offset(y, o.n, o.c, o.h, o.w);
  const bool ints = !is_float(p.x.dtype);
  float best = -bits_float(0x7f800000u), sum = 0.0f;
  std::int32_t best_i = -2147483647 - 1;
  for (std::int64_t a = rows.k0; a < rows.k1; ++a)
    for (std::int64_t b = cols.k0; b < cols.k1; ++b) {
      const std::int64_t off = base + (h0 + a * p.dil[0]) * x.sh + (w0 + b * p.dil[1]) * x.sw;
      if (ints) {
        const std::int32_t v = load_i(p.x, off);
        best_i = v > best_i ? v : best_i;
        continue;
      }
      const float v = load_f(p.x, off);
      if (p.max)
        best = v > best || v != v ? v : best;
      else
        sum += v;
    }
  const std::int64_t count = (rows.k1 - rows.k0) * (cols.k1 - cols.k0);
  if (ints) {
    store_i(p.y, yo, count ? best_i : 0);
  } else if (p.max) {
    store_f(p.y, yo, best != best ? bits_float(0x7fc00000u) : best);
  } else {
    const std::int64_t div = pool_divisor(p, x, h0, w0, count);
    store_f(p.y, yo, div ? sum / static_cast<float>(div) : 0.0f);
  }
}

}  // namespace lin

}  // namespace tpuhal::cuda::k
