// Transposed convolution on the engine's own loops: every output element is
// bias + the sum of its contributions in one fixed order (input channel,
// kernel row, kernel column), each product rounded to f32 and added, so the
// bits are the same for any thread count, on every host and ISA level.
#include <algorithm>
#include <vector>

#include "engine.h"
#include "numerics.h"

namespace tpuhal::sim::tensor {

fw::Problem run_conv_transpose2d(TensorEngine& e, const fw::ConvAttrs& at, const View* v) {
  const bool nhwc = at.layout == static_cast<std::uint32_t>(fw::Layout::kNHWC);
  const std::uint32_t dc = nhwc ? 3 : 1, dh = nhwc ? 1 : 2, dw = nhwc ? 2 : 3;
  // f16 and bf16 operands widen (exactly) to f32 first.
  const View x = v[0].dtype == fw::DType::kF32 ? v[0] : widened(e, v[0], Staged::kX);
  const View w = v[1].dtype == fw::DType::kF32 ? v[1] : widened_weights(e, v[1], Staged::kW);
  const View& y = v[3];
  const std::uint64_t n = x.shape[0], cin = x.shape[dc], h = x.shape[dh], wd = x.shape[dw];
  const std::uint64_t cout = y.shape[dc], oh = y.shape[dh], ow = y.shape[dw];
  const std::uint64_t groups = at.groups, cin_g = cin / groups, cout_g = cout / groups;
  const std::uint64_t kh = w.shape[2], kw = w.shape[3];
  const std::int64_t sh = at.stride[0], sw = at.stride[1], dlh = at.dilation[0], dlw = at.dilation[1];
  const std::int64_t pt = at.pad[0], pl = at.pad[1];
  std::vector<float> bias(cout, 0.0f);
  if (v[2].present())
    for (std::uint64_t o = 0; o < cout; ++o) bias[o] = load_float(v[2].at(o * v[2].strides[0]), v[2].dtype);
  const auto* xp = reinterpret_cast<const float*>(x.data);
  const auto* wp = reinterpret_cast<const float*>(w.data);
  const auto act = static_cast<fw::Activation>(at.activation);
  // Output columns ow = iw * sw - pl + b * dlw for iw in [first, last).
  auto span = [](std::int64_t out_len, std::int64_t in_len, std::int64_t stride, std::int64_t shift) {
    // iw with 0 <= iw * stride + shift < out_len
    const std::int64_t first = shift >= 0 ? 0 : (-shift + stride - 1) / stride;
    const std::int64_t last = out_len - shift <= 0 ? 0 : std::min(in_len, (out_len - shift + stride - 1) / stride);
    return std::pair{first, std::max(first, last)};
  };
  e.pool().parallel_for(n * cout, [&](std::uint64_t begin, std::uint64_t end) {
    std::vector<float> acc(oh * ow);
    for (std::uint64_t no = begin; no < end; ++no) {
      const std::uint64_t ni = no / cout, o = no % cout, g = o / cout_g, ol = o % cout_g;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (std::uint64_t ci = g * cin_g; ci < (g + 1) * cin_g; ++ci) {
        const float* xc = xp + ni * x.strides[0] + ci * x.strides[dc];
        for (std::uint64_t a = 0; a < kh; ++a) {
          const auto [h0, h1] = span(static_cast<std::int64_t>(oh), static_cast<std::int64_t>(h), sh,
                                     static_cast<std::int64_t>(a) * dlh - pt);
          for (std::uint64_t b = 0; b < kw; ++b) {
            const float wv = wp[ci * w.strides[0] + ol * w.strides[1] + a * w.strides[2] + b * w.strides[3]];
            const std::int64_t shift = static_cast<std::int64_t>(b) * dlw - pl;
            const auto [w0, w1] = span(static_cast<std::int64_t>(ow), static_cast<std::int64_t>(wd), sw, shift);
            for (std::int64_t ih = h0; ih < h1; ++ih) {
              const std::int64_t r = ih * sh + static_cast<std::int64_t>(a) * dlh - pt;
              float* row = acc.data() + static_cast<std::uint64_t>(r) * ow;
              const float* xr = xc + static_cast<std::uint64_t>(ih) * x.strides[dh];
              for (std::int64_t iw = w0; iw < w1; ++iw) {
                const float p = xr[static_cast<std::uint64_t>(iw) * x.strides[dw]] * wv;
                row[iw * sw + shift] += p;
              }
            }
          }
        }
      }
      std::byte* yb = y.data + (ni * y.strides[0] + o * y.strides[dc]) * y.esize;
      for (std::uint64_t r = 0; r < oh; ++r)
        for (std::uint64_t c = 0; c < ow; ++c)
          store_float(yb + (r * y.strides[dh] + c * y.strides[dw]) * y.esize, y.dtype,
                      activate(act, at.act_alpha, at.act_beta, acc[r * ow + c] + bias[o]));
    }
  });
  return {};
}

}  // namespace tpuhal::sim::tensor
