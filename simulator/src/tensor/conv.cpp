// 2-D convolution: float on oneDNN (f16, and bf16 without AVX-512, through
// f32), integer exact in int32 on the engine's own kernels (igemm.h) or, with
// AVX-512 VNNI, on oneDNN with exact zero-point corrections; a reference loop
// for anything oneDNN cannot describe.
#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <new>
#include <string>
#include <string_view>
#include <cstring>
#include <unordered_map>
#include <vector>
#include <oneapi/dnnl/dnnl.hpp>

#include "dnnl_state.h"
#include "engine.h"
#include "igemm.h"
#include "isa.h"
#include "numerics.h"
#include "simd.h"

namespace tpuhal::sim::tensor {
namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

struct Geometry {
  bool nhwc;
  std::uint64_t n, c, h, w;      // input
  std::uint64_t o, oh, ow;       // output
  std::uint64_t kh, kw, groups;  // kernel
  std::uint64_t sh, sw, dh, dw, pt, pl, pb, pr;

  Geometry(const fw::ConvAttrs& a, const View& x, const View& wt, const View& y) {
    nhwc = a.layout == static_cast<std::uint32_t>(fw::Layout::kNHWC);
    n = x.shape[0];
    c = nhwc ? x.shape[3] : x.shape[1];
    h = nhwc ? x.shape[1] : x.shape[2];
    w = nhwc ? x.shape[2] : x.shape[3];
    o = wt.shape[0];
    kh = wt.shape[2];
    kw = wt.shape[3];
    oh = nhwc ? y.shape[1] : y.shape[2];
    ow = nhwc ? y.shape[2] : y.shape[3];
    groups = a.groups;
    sh = a.stride[0];
    sw = a.stride[1];
    dh = a.dilation[0];
    dw = a.dilation[1];
    pt = a.pad[0];
    pl = a.pad[1];
    pb = a.pad[2];
    pr = a.pad[3];
  }
  // One input and one output channel per group: oneDNN's depthwise kernels.
  bool depthwise() const { return groups > 1 && c == groups && o == groups; }
  // Element offsets in NCHW logical order for an NCHW or NHWC view.
  std::uint64_t act(const View& v, std::uint64_t ni, std::uint64_t ci, std::uint64_t hi, std::uint64_t wi) const {
    return nhwc ? ni * v.strides[0] + hi * v.strides[1] + wi * v.strides[2] + ci * v.strides[3]
                : ni * v.strides[0] + ci * v.strides[1] + hi * v.strides[2] + wi * v.strides[3];
  }
  static std::uint64_t wgt(const View& v, std::uint64_t oi, std::uint64_t ci, std::uint64_t a, std::uint64_t b) {
    return oi * v.strides[0] + ci * v.strides[1] + a * v.strides[2] + b * v.strides[3];
  }
  // Input row for output row `r` and kernel row `k`, or -1 in the padding.
  std::int64_t in_row(std::uint64_t r, std::uint64_t k) const {
    return static_cast<std::int64_t>(r * sh + k * dh) - static_cast<std::int64_t>(pt);
  }
  std::int64_t in_col(std::uint64_t col, std::uint64_t k) const {
    return static_cast<std::int64_t>(col * sw + k * dw) - static_cast<std::int64_t>(pl);
  }
};

dt dnnl_type(fw::DType t) {
  switch (t) {
    case fw::DType::kF32: return dt::f32;
    case fw::DType::kBF16: return dt::bf16;
    case fw::DType::kI8: return dt::s8;
    case fw::DType::kU8: return dt::u8;
    case fw::DType::kI32: return dt::s32;
    default: return dt::undef;
  }
}

// A view in oneDNN's logical NCHW order, with its own strides.
dnnl::memory::desc act_desc(const View& v, bool nhwc, dt type) {
  const auto s = [&](int d) { return static_cast<dnnl::memory::dim>(v.strides[d]); };
  const auto e = [&](int d) { return static_cast<dnnl::memory::dim>(v.shape[d]); };
  if (nhwc) return dnnl::memory::desc({e(0), e(3), e(1), e(2)}, type, {s(0), s(3), s(1), s(2)});
  return dnnl::memory::desc({e(0), e(1), e(2), e(3)}, type, {s(0), s(1), s(2), s(3)});
}

// Requantisation fused into a oneDNN integer convolution: per output
// channel scales, then rounding half to even (an eltwise_round post-op),
// then the output zero point, then saturation: exactly the engine's own
// requantize() whenever every sum is below 2^24 (so that its conversion to
// f32 is exact in both) and there is no bias (oneDNN adds it in f32).
struct FusedRequant {
  const std::vector<float>* scales;
  std::int32_t zero;
};

// Runs a primitive dnnl_conv made (or found), with the weights in the
// layout the primitive takes: its runs set the operands in memory objects
// of their own (the primitive's arguments are the calling thread's).
using ConvRunner = std::function<void(const DnnlState::Conv&, const dnnl::memory& weights)>;

// Runs a oneDNN forward convolution; weights are reordered into the layout
// the primitive prefers. Returns false if oneDNN has no implementation (or,
// with `requant`, only a reference one). `src_zero`, when given, is
// subtracted from x with oneDNN's zero-point attribute (its padding then
// contributes 0, as ONNX defines). `depthwise_kernel`: only one of
// oneDNN's depthwise kernels (jit, weights blocked by group alone), which
// widen int8 to 32 bits before multiplying (onednn_int8_depthwise_exact).
// `weights_serial`: nonzero, wdata holds the floats of the packed cache's
// entry of that serial (widened_weights' `serial`), so that weights oneDNN
// reordered from them before are taken without comparing their bytes
// again; floats packed anew have another serial, whatever their address,
// and are reordered anew (DnnlState::cached_weights). `sum`: the result is
// added to what ydata holds (oneDNN's sum post-op, after the bias: each
// output rounded once more, as a separate addition would round it).
// `runner`: given, it runs the primitive in place of the single run here.
bool dnnl_conv(TensorEngine& e, const Geometry& g, const View& x, dt xt, const View& wt, const void* wdata, dt wtype,
               const View* bias, const View& y, dt yt, void* ydata, const std::int32_t* src_zero = nullptr,
               const FusedRequant* requant = nullptr, bool depthwise_kernel = false, std::uint64_t weights_serial = 0,
               bool sum = false, const ConvRunner* runner = nullptr) {
  try {
    const auto D = [](std::uint64_t v) { return static_cast<dnnl::memory::dim>(v); };
    const dnnl::memory::desc xd = act_desc(x, g.nhwc, xt);
    dnnl::memory::desc yd = act_desc(y, g.nhwc, yt);
    if (ydata != y.data) {  // a dense scratch output in the same layout
      yd = g.nhwc ? dnnl::memory::desc({D(g.n), D(g.o), D(g.oh), D(g.ow)}, yt, dnnl::memory::format_tag::nhwc)
                  : dnnl::memory::desc({D(g.n), D(g.o), D(g.oh), D(g.ow)}, yt, dnnl::memory::format_tag::nchw);
    }
    // A convolution of a few input channels (a network's first) in NCHW
    // runs on oneDNN's direct kernels when they may write a blocked layout,
    // reordered into y after (an exact copy); in y's own layout it has
    // only the GEMM-based one, several times slower.
    const bool dst_blocked =
        !g.nhwc && g.groups == 1 && g.c <= 4 && xt == dt::f32 && yt == dt::f32 && !requant && !src_zero && !sum;
    const std::uint64_t og = g.o / g.groups, cg = g.c / g.groups;
    dnnl::memory::desc wd_user, wd_any;
    const auto ws = [&](int d) { return static_cast<dnnl::memory::dim>(wt.strides[d]); };
    if (g.groups == 1) {
      wd_user = dnnl::memory::desc({D(g.o), D(cg), D(g.kh), D(g.kw)}, wtype, {ws(0), ws(1), ws(2), ws(3)});
      wd_any = dnnl::memory::desc({D(g.o), D(cg), D(g.kh), D(g.kw)}, wtype, dnnl::memory::format_tag::any);
    } else {
      wd_user = dnnl::memory::desc({D(g.groups), D(og), D(cg), D(g.kh), D(g.kw)}, wtype,
                                   {ws(0) * D(og), ws(0), ws(1), ws(2), ws(3)});
      wd_any = dnnl::memory::desc({D(g.groups), D(og), D(cg), D(g.kh), D(g.kw)}, wtype, dnnl::memory::format_tag::any);
    }
    const dims strides{D(g.sh), D(g.sw)}, dil{D(g.dh - 1), D(g.dw - 1)};
    const dims pad_l{D(g.pt), D(g.pl)}, pad_r{D(g.pb), D(g.pr)};
    dnnl::memory::desc bd;
    if (bias)
      bd = dnnl::memory::desc({D(g.o)}, dnnl_type(bias->dtype), {static_cast<dnnl::memory::dim>(bias->strides[0])});
    // The primitive for this exact geometry, layouts and types, made once:
    // its key holds each of them as 8 bytes, in a fixed order.
    std::string conv_key;
    conv_key.reserve(64 * 8 + (requant ? requant->scales->size() * sizeof(float) : 0));
    const auto put = [&conv_key](auto v) {
      const auto word = static_cast<std::int64_t>(v);
      conv_key.append(reinterpret_cast<const char*>(&word), sizeof word);
    };
    for (const auto v : {static_cast<std::int64_t>(xt), static_cast<std::int64_t>(wtype), static_cast<std::int64_t>(yt),
                         bias ? static_cast<std::int64_t>(bias->dtype) : -1})
      put(v);
    for (const std::uint64_t v :
         {g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.groups, g.sh, g.sw, g.dh, g.dw, g.pt, g.pl, g.pb, g.pr})
      put(v);
    put(src_zero ? 1 : 0);
    for (const dnnl::memory::desc* dsc : std::array<const dnnl::memory::desc*, 3>{&xd, &yd, &wd_user})
      for (int i = 0; i < dsc->data.ndims; ++i) put(dsc->data.format_desc.blocking.strides[i]);
    put(bias ? bias->strides[0] : 0);
    put(dst_blocked);
    put(depthwise_kernel);
    // oneDNN sizes a primitive's work split by the threads when it is made,
    // and the engine's team changes with the CPU it gets (CpuShare).
    put(e.dnnl().threads);
    put(sum);
    put(requant != nullptr);
    if (requant) {
      // The scales and zero point are part of the primitive.
      put(requant->zero);
      conv_key.append(reinterpret_cast<const char*>(requant->scales->data()), requant->scales->size() * sizeof(float));
    }
    auto cached = e.dnnl().convs.find(conv_key);
    if (cached == e.dnnl().convs.end()) {
      if (e.dnnl().refused.count(conv_key)) return false;  // never in convs: looked up on a miss only
      const dnnl::memory::desc yd_made =
          dst_blocked ? dnnl::memory::desc({D(g.n), D(g.o), D(g.oh), D(g.ow)}, yt, dnnl::memory::format_tag::any) : yd;
      auto desc =
          bias
              ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                                xd, wd_any, bd, yd_made, strides, dil, pad_l, pad_r)
              : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                                xd, wd_any, yd_made, strides, dil, pad_l, pad_r);
      dnnl::primitive_attr attr;
      // The primitive runs on whichever command processor's thread uses it
      // next; oneDNN's default scratchpad lives in the creating thread's
      // storage, so this one gets its own.
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      // f32 arithmetic whatever ONEDNN_DEFAULT_FPMATH_MODE says: the float
      // bound of docs/ops.md, and the exact integer sums of
      // integer_sums_as_f32, rest on it.
      attr.set_fpmath_mode(dnnl::fpmath_mode::strict);
      if (src_zero) attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
      if (requant) {
        attr.set_output_scales(2, *requant->scales);
        dnnl::post_ops po;
        po.append_eltwise(1.0f, dnnl::algorithm::eltwise_round, 0.0f, 0.0f);
        attr.set_post_ops(po);
        attr.set_zero_points(DNNL_ARG_DST, 0, {requant->zero});
      } else if (sum) {
        dnnl::post_ops po;
        po.append_sum(1.0f);
        attr.set_post_ops(po);
      }
      e.dnnl().bind_threads();
      dnnl::convolution_forward::primitive_desc made(desc, attr, e.dnnl().engine);
      const std::string_view impl = made.impl_info_str();
      // The fused path is for speed: a reference implementation is not.
      // And oneDNN 2.6's GEMM-based grouped int8 convolution compensates
      // wrongly for some geometries (an s8 input, or an input zero point:
      // every sum of a channel off by the same constant), so it runs only
      // on u8 inputs without a zero point, where there is nothing to
      // compensate; conv_integer() shifts s8 inputs to u8 for it.
      // Its SSE4.1 depthwise kernel with a sum post-op reads outside its
      // buffers (an NHWC x [1, 8, 8, 5], w [5, 1, 4, 3], strides 3, 3,
      // dilations 2, 1, pads 2, 2, 1, 3, with a bias, crashed in its jitted
      // code): such an accumulating convolution takes the loops below.
      const auto& wblk = made.weights_desc().data.format_desc.blocking;
      const bool dw_kernel = impl.starts_with("jit") && made.weights_desc().data.format_kind == dnnl_blocked &&
                             wblk.inner_nblks == 1 && wblk.inner_idxs[0] == 0;
      if ((requant && impl.starts_with("ref")) || (depthwise_kernel && !dw_kernel) ||
          (sum && impl.starts_with("jit_dw:sse41")) ||
          (g.groups > 1 && impl.find("gemm_s8") != std::string_view::npos && (xt == dt::s8 || src_zero))) {
        e.dnnl().refused.insert(conv_key);
        return false;
      }
      if (e.dnnl().convs.size() > 256) e.dnnl().release_thread();
      DnnlState::Conv conv;
      conv.pd = made;
      conv.primitive = dnnl::convolution_forward(made);
      conv.scratchpad = dnnl::memory(made.scratchpad_desc(), e.dnnl().engine);
      conv.maker = std::this_thread::get_id();
      if (made.dst_desc() != yd) {  // dst_blocked, and oneDNN chose another layout
        conv.dst = dnnl::memory(made.dst_desc(), e.dnnl().engine);
        conv.to_user =
            dnnl::reorder(dnnl::reorder::primitive_desc(e.dnnl().engine, made.dst_desc(), e.dnnl().engine, yd));
      }
      const dnnl::memory::desc preferred = made.weights_desc();
      conv.reorders_weights = preferred != wd_user;
      conv.weights_layout = std::hash<std::string_view>{}(
          std::string_view(reinterpret_cast<const char*>(&preferred.data), sizeof(dnnl_memory_desc_t)));
      auto& eng = e.dnnl().engine;
      conv.x = dnnl::memory(xd, eng, DNNL_MEMORY_NONE);
      conv.y = dnnl::memory(yd, eng, DNNL_MEMORY_NONE);
      conv.w_user = dnnl::memory(wd_user, eng, DNNL_MEMORY_NONE);
      conv.args = {{DNNL_ARG_SRC, conv.x},
                   {DNNL_ARG_WEIGHTS, conv.w_user},
                   {DNNL_ARG_DST, conv.dst ? conv.dst : conv.y},
                   {DNNL_ARG_SCRATCHPAD, conv.scratchpad}};
      if (bias) {
        conv.bias = dnnl::memory(bd, eng, DNNL_MEMORY_NONE);
        conv.args.emplace(DNNL_ARG_BIAS, conv.bias);
      }
      if (src_zero) {
        conv.src_zero = dnnl::memory({{1}, dt::s32, {1}}, eng, DNNL_MEMORY_NONE);
        conv.args.emplace(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, conv.src_zero);
      }
      cached = e.dnnl().convs.emplace(conv_key, std::move(conv)).first;
    }
    auto& c = cached->second;
    e.dnnl().bind_threads();
    auto& eng = e.dnnl().engine;
    auto& stream = e.dnnl().stream;
    // Where this run's operands are (the memory objects are the primitive's).
    c.x.set_data_handle(x.data);
    c.y.set_data_handle(ydata);
    c.w_user.set_data_handle(const_cast<void*>(wdata));
    if (bias) c.bias.set_data_handle(bias->data);
    if (src_zero) c.src_zero.set_data_handle(const_cast<std::int32_t*>(src_zero));
    dnnl::memory wmem = c.w_user;
    if (c.reorders_weights) {
      // Reordering weights costs tens of microseconds; a network runs the
      // same weights again and again, so keep them reordered while their
      // bytes stay the same. Weights with gaps (strided) are not cached.
      // The key: where they are, their dimensions and type, and the layout
      // the primitive wants (8 bytes each).
      const std::size_t wbytes = wd_user.get_size();
      const bool dense_w = wbytes == g.o * (g.c / g.groups) * g.kh * g.kw * dnnl::memory::data_type_size(wtype);
      std::string k;
      for (const auto v :
           {static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(wdata)), g.o, g.c, g.kh, g.kw,
            static_cast<std::uint64_t>(wtype), g.groups, static_cast<std::uint64_t>(cached->second.weights_layout)})
        k.append(reinterpret_cast<const char*>(&v), sizeof v);
      const auto* src = static_cast<const std::byte*>(wdata);
      const dnnl::memory* hit = dense_w ? e.dnnl().cached_weights(k, src, wbytes, weights_serial) : nullptr;
      if (hit) {
        wmem = *hit;
      } else {
        wmem = dnnl::memory(c.pd.weights_desc(), eng);
        dnnl::reorder(c.w_user, wmem).execute(stream, c.w_user, wmem);
        if (dense_w) e.dnnl().remember_weights(k, src, wbytes, wmem, weights_serial);
      }
    }
    if (runner) {
      (*runner)(c, wmem);
      return true;
    }
    c.args[DNNL_ARG_WEIGHTS] = wmem;
    c.primitive.execute(stream, c.args);
    if (c.dst) c.to_user.execute(stream, c.dst, c.y);
    stream.wait();
    // Nothing of this run stays in the arguments but the handles.
    c.args[DNNL_ARG_WEIGHTS] = c.w_user;
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

// The largest sum of |w| over one output channel's taps of a convolution
// with s8 weights `wt` (dense s8 or with their own strides; read as the
// view says), or its worst case where that already keeps every sum within
// 2^24 for |x| up to 255. Every sum stays within 2^24 in magnitude, |x|
// being at most amax, where amax times it is below 2^24 (sums_within_2_24).
// Dense weights' sums are kept (DerivedValues) while the weights hold the
// same bytes (`keep`: wdata is the op's own weights, not a copy made for
// this run), as a model's weights do from run to run.
std::uint64_t weight_abs_sum_max(TensorEngine& e, const Geometry& g, const View& wt, const void* wdata, bool keep) {
  constexpr std::uint64_t kExact = std::uint64_t{1} << 24;
  const std::uint64_t cg = g.c / g.groups, per_o = cg * g.kh * g.kw;
  if (per_o * 255 * 128 < kExact) return per_o * 128;
  const auto* wbytes = static_cast<const std::int8_t*>(wdata);
  const bool dense =
      wt.strides[3] == 1 && wt.strides[2] == g.kw && wt.strides[1] == g.kh * g.kw && wt.strides[0] == per_o;
  constexpr std::int64_t kAbsSums = 0x4153;  // "AS"
  const DerivedValues::Key key{kAbsSums, static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(wdata)),
                               static_cast<std::int64_t>(g.o), static_cast<std::int64_t>(per_o)};
  const std::size_t bytes = g.o * per_o;
  if (keep && dense)
    if (const auto kept = e.derived_values().find(key, wdata, bytes)) return *kept;
  const std::uint64_t at = e.derived_values().now();
  std::uint64_t wsum_max = 0;
  for (std::uint64_t oi = 0; oi < g.o; ++oi) {
    std::uint64_t s = 0;
    if (dense) {
      s = simd::sum_abs_i8(wbytes + oi * per_o, per_o);
    } else {
      for (std::uint64_t ci = 0; ci < cg; ++ci)
        for (std::uint64_t a = 0; a < g.kh; ++a)
          for (std::uint64_t b = 0; b < g.kw; ++b) {
            const auto v = wbytes[Geometry::wgt(wt, oi, ci, a, b)];
            s += static_cast<std::uint64_t>(v < 0 ? -v : v);
          }
    }
    wsum_max = std::max(wsum_max, s);
  }
  if (keep && dense) e.derived_values().keep(key, wdata, bytes, wsum_max, at);
  return wsum_max;
}

bool sums_within_2_24(std::uint64_t weight_abs_sum, std::uint64_t amax) {
  return amax * weight_abs_sum < (std::uint64_t{1} << 24);
}

// Without VNNI: whether an integer convolution of an input of dtype `xt`
// runs exactly on whole bytes in oneDNN's depthwise kernels
// (onednn_int8_depthwise_exact). u8 only: oneDNN 2.6's depthwise kernels
// take an s8 input wrongly at the borders (NHWC) and with a zero point, so
// conv_integer() flips s8 inputs to u8 for them.
bool depthwise_whole_bytes(Isa isa, const Geometry& g, fw::DType xt) {
  return !onednn_int8_exact(isa) && g.depthwise() && xt == fw::DType::kU8 && onednn_int8_depthwise_exact(isa);
}

// An integer convolution on oneDNN into the dense int32 `acc` (s8 weights),
// exact where sums_within_2_24() says so: oneDNN passes its s32 sums
// through f32 on the way out.
bool dnnl_conv_s32(TensorEngine& e, const Geometry& g, const View& x, dt xt, const View& wt, const void* wdata,
                   const View& y, std::int32_t* acc, const std::int32_t* src_zero = nullptr,
                   bool depthwise_kernel = false) {
  return dnnl_conv(e, g, x, xt, wt, wdata, dt::s8, nullptr, y, dt::s32, acc, src_zero, nullptr, depthwise_kernel);
}

// The most taps an output of integer_sums_as_f32 sums: each product is at
// most 255 * 255 in magnitude, so every partial sum of as many stays below
// 2^24, where f32 holds every integer.
constexpr std::uint64_t kAsF32MaxTaps = 256;
static_assert(kAsF32MaxTaps * 255 * 255 < (std::uint64_t{1} << 24));

// An integer convolution as oneDNN's f32 convolution of the same integers,
// its sums dense in y's shape in the engine's staged kY floats (returned;
// null where it does not apply): x less its zero point and w
// less theirs, each at most 255 in magnitude, widened to f32 (exactly) and
// convolved by oneDNN's direct f32 kernel. With at most kAsF32MaxTaps taps
// an output, every partial sum is an integer f32 holds exactly, whatever
// the order of the additions and with or without FMA: each result is the
// exact sum, the same at every level and thread count. The weights as
// floats are kept while their bytes stay the same (a model's weights, run
// after run), and so oneDNN's reordered copy of them. Null past
// kAsF32MaxTaps taps, for an empty image, or where oneDNN refuses the
// convolution.
const float* integer_sums_as_f32(TensorEngine& e, const Geometry& g, const View& x, const View& w, std::int64_t x_zero,
                                 const View* wz, const View& y) {
  const std::uint64_t cg = g.c / g.groups, per_o = cg * g.kh * g.kw;
  // An empty image (its outputs all padding) is left to the other routes.
  if (per_o > kAsF32MaxTaps || g.h == 0 || g.w == 0) return nullptr;
  const auto fill = [&](float* out) {
    for (std::uint64_t oi = 0; oi < g.o; ++oi) {
      const std::int64_t zero = wz ? load_int(wz->at(oi * wz->strides[0]), wz->dtype) : 0;
      for (std::uint64_t ci = 0; ci < cg; ++ci)
        for (std::uint64_t a = 0; a < g.kh; ++a)
          for (std::uint64_t b = 0; b < g.kw; ++b)
            out[oi * per_o + (ci * g.kh + a) * g.kw + b] =
                static_cast<float>(load_int(w.at(Geometry::wgt(w, oi, ci, a, b)), w.dtype) - zero);
    }
  };
  constexpr std::int64_t kIntegerFloats = 0x4946;  // "IF"
  PackedCache::Key key{kIntegerFloats, reinterpret_cast<std::intptr_t>(w.data)};
  for (const std::uint64_t v : {static_cast<std::uint64_t>(w.dtype), g.o, cg, g.kh, g.kw, w.strides[0], w.strides[1],
                                w.strides[2], w.strides[3]})
    key.push_back(static_cast<std::int64_t>(v));
  for (std::uint64_t oi = 0; wz && oi < g.o; ++oi) key.push_back(load_int(wz->at(oi * wz->strides[0]), wz->dtype));
  std::uint64_t span = 1;
  for (std::uint32_t d = 0; d < w.rank; ++d) span += (w.shape[d] - 1) * w.strides[d];
  std::uint64_t serial = 0;  // oneDNN's reordered copy of them is kept by it
  const float* wf = e.packed_cache().find(key, w.data, span * w.esize, &serial);
  if (!wf) {
    float* into = e.packed_cache().insert(std::move(key), w.data, span * w.esize, g.o * per_o, &serial);
    if (!into) into = e.staged(Staged::kW, g.o * per_o);
    fill(into);
    wf = into;
  }
  // x less its zero point, dense in x's layout.
  const View xf = staged_like(e, x, Staged::kX);
  const std::uint64_t xn = xf.elements();
  auto* const xs = reinterpret_cast<float*>(xf.data);
  const bool is_signed = x.dtype == fw::DType::kI8;
  const auto zero = static_cast<std::int32_t>(x_zero);
  if (x.contiguous()) {
    const auto* src = reinterpret_cast<const std::uint8_t*>(x.data);
    e.pool().parallel_for(
        xn,
        [&](std::uint64_t begin, std::uint64_t end) {
          simd::dequantize_8(src + begin, xs + begin, end - begin, is_signed, 1.0f, zero);
        },
        16384);
  } else {
    const View* views[1] = {&x};
    std::uint64_t i = 0;
    for_each_index(x.shape, x.rank, views, 0, xn, [&](const std::uint64_t* off) {
      xs[i++] = static_cast<float>(load_int(x.at(off[0]), x.dtype) - x_zero);
    });
  }
  // The kept floats are only read (dense, in w's shape).
  const View wv = staged_like(e, w, Staged::kW, const_cast<float*>(wf));
  const View yf = staged_like(e, y, Staged::kY);
  if (!dnnl_conv(e, g, xf, dt::f32, wv, wf, dt::f32, nullptr, yf, dt::f32, yf.data, nullptr, nullptr, false, serial))
    return nullptr;
  return reinterpret_cast<const float*>(yf.data);
}

// Whether an integer convolution runs as integer_sums_as_f32 on this
// engine: on x86 CPUs without VNNI, where oneDNN's int8 kernels saturate
// and it is exact only over the input's nibbles (two convolutions with
// int32 outputs, a pass to split the input and one to join the sums), or,
// below AVX2, not at all (the engine's own kernels), for layers of at most
// kAsF32MaxTaps taps an output with at least as many output channels as
// input channels, whose outputs the int32 passes weigh on most. Measured
// per layer (`tpuhal profile` at TPUHAL_MAX_ISA=avx2, 2-core Zen 5):
// MobileNetV2's expanding 1x1 layers took 0.64 to 0.83 of the nibbles'
// time and its first convolution 0.63; ResNet-50's first 0.44; but its 3x3
// layers (576 taps and more) 1.1 to 1.2 times, and MobileNetV2's
// projecting 1x1 layers 0.8 to 1.3. Not a depthwise one where oneDNN's
// depthwise kernels take whole bytes (an i8 input as u8).
bool sums_as_f32(const TensorEngine& e, const Geometry& g) {
  const Isa isa = e.isa();
  const bool x86_without_vnni = isa == Isa::kSse2 || isa == Isa::kSse41 || isa == Isa::kAvx2 || isa == Isa::kAvx512;
  return x86_without_vnni && g.o >= g.c && g.c / g.groups * g.kh * g.kw <= kAsF32MaxTaps &&
         !depthwise_whole_bytes(isa, g, fw::DType::kU8);
}

// conv_integer by integer_sums_as_f32, into the dense int32 `acc` (y's
// shape).
bool conv_integer_as_f32(TensorEngine& e, const Geometry& g, const View& x, const View& w, std::int64_t x_zero,
                         const View* wz, const View& y, std::int32_t* acc) {
  const float* ys = integer_sums_as_f32(e, g, x, w, x_zero, wz, y);
  if (!ys) return false;
  e.pool().parallel_for(
      y.elements(),
      [&](std::uint64_t begin, std::uint64_t end) {
        for (std::uint64_t i = begin; i < end; ++i) acc[i] = static_cast<std::int32_t>(ys[i]);
      },
      16384);
  return true;
}

// The same for u8 `u` where the sums pass 2^24 but those of u's nibbles do
// not (sums_within_2_24() with 15), or without VNNI, where oneDNN is exact
// only on nibbles (onednn_int8_exact_on_nibbles): u = 16 * hi + lo, so the sums are
// 16 * conv(hi, w) + conv(lo, w), each exact on oneDNN, added in int32
// (wrapping as any int32 accumulator does; the sums themselves are exact).
// Two convolutions at oneDNN's speed against one on the engine's own
// kernels, 3 to 10 times slower at ResNet-50's 3x3 layers over 256 and 512
// channels. The nibbles are dense copies in u's layout, so the same
// primitive and reordered weights serve both.
bool dnnl_conv_s32_nibbles(TensorEngine& e, const Geometry& g, const View& u, const View& wt, const void* wdata,
                           const View& y, std::int32_t* acc) {
  View hi = u, lo = u;
  std::uint64_t step = 1;
  for (std::uint32_t d = u.rank; d-- > 0;) {
    hi.strides[d] = lo.strides[d] = step;
    step *= u.shape[d];
  }
  const std::uint64_t n = u.elements();
  // In the engine's scratch (nothing else of an integer convolution's uses
  // it): no fresh pages to fault in and zero on every op.
  auto* const high = reinterpret_cast<std::uint8_t*>(e.staged(Staged::kX, (2 * n + 3) / 4));
  auto* const low = high + n;
  std::int32_t* const sums_low = e.scratch_packed_i32(y.elements());
  hi.data = reinterpret_cast<std::byte*>(high);
  lo.data = reinterpret_cast<std::byte*>(low);
  const bool dense = u.contiguous();
  const View* views[1] = {&u};
  e.pool().parallel_for(
      n,
      [&](std::uint64_t begin, std::uint64_t end) {
        if (dense) {
          simd::split_nibbles(reinterpret_cast<const std::uint8_t*>(u.data) + begin, high + begin, low + begin,
                              end - begin);
          return;
        }
        std::uint64_t i = begin;
        for_each_index(u.shape, u.rank, views, begin, end, [&](const std::uint64_t* off) {
          const auto v = static_cast<std::uint8_t>(*u.at(off[0]));
          high[i] = static_cast<std::uint8_t>(v >> 4);
          low[i++] = static_cast<std::uint8_t>(v & 15);
        });
      },
      65536);
  if (!dnnl_conv_s32(e, g, hi, dt::u8, wt, wdata, y, acc) || !dnnl_conv_s32(e, g, lo, dt::u8, wt, wdata, y, sums_low))
    return false;
  e.pool().parallel_for(
      y.elements(),
      [&](std::uint64_t begin, std::uint64_t end) {
        simd::join_nibble_sums(acc + begin, sums_low + begin, end - begin);
      },
      65536);
  return true;
}

// ---- exact integer convolution on the engine's own kernels (igemm.h) ----------------------------------------

// The rows of the im2col matrix of an NHWC input for one group: line = output
// position (n, r, col), along K = (ky, kx, c) with c fastest, so that each
// tap is one run of the group's channels (or padding).
class Im2colRows final : public igemm::Lines {
 public:
  Im2colRows(const Geometry& g, const View& x, std::uint64_t group) : g_(g), x_(x), c0_(group * (g.c / g.groups)) {}
  std::size_t segments(std::uint64_t line, std::uint64_t from, std::uint64_t count,
                       igemm::Segment* out) const override {
    const std::uint64_t cg = g_.c / g_.groups, col = line % g_.ow, r = line / g_.ow % g_.oh,
                        ni = line / (g_.ow * g_.oh);
    std::size_t ns = 0;
    for (std::uint64_t k = from, end = from + count; k < end;) {
      const std::uint64_t tap = k / cg, ci = k % cg, run = std::min(cg - ci, end - k);
      const std::int64_t ih = g_.in_row(r, tap / g_.kw), iw = g_.in_col(col, tap % g_.kw);
      const bool inside =
          ih >= 0 && ih < static_cast<std::int64_t>(g_.h) && iw >= 0 && iw < static_cast<std::int64_t>(g_.w);
      const std::uint8_t* src =
          inside ? reinterpret_cast<const std::uint8_t*>(
                       x_.at(g_.act(x_, ni, c0_ + ci, static_cast<std::uint64_t>(ih), static_cast<std::uint64_t>(iw))))
                 : nullptr;
      if (!src && ns && !out[ns - 1].src) {
        out[ns - 1].count += run;  // padding continues
      } else {
        out[ns++] = igemm::Segment{src, run, static_cast<std::int64_t>(x_.strides[3])};
      }
      k += run;
    }
    return ns;
  }

 private:
  const Geometry& g_;
  const View& x_;
  std::uint64_t c0_;
};

// The im2col matrix of one NCHW image and group as k-lines: line = (c, ky,
// kx) with kx fastest, along the output positions (r, col) of the image.
class Im2colLines final : public igemm::Lines {
 public:
  Im2colLines(const Geometry& g, const View& x, std::uint64_t image, std::uint64_t group)
      : g_(g), x_(x), ni_(image), c0_(group * (g.c / g.groups)) {}
  std::size_t segments(std::uint64_t line, std::uint64_t from, std::uint64_t count,
                       igemm::Segment* out) const override {
    const std::uint64_t kx = line % g_.kw, ky = line / g_.kw % g_.kh, ci = line / (g_.kw * g_.kh);
    // The output columns whose input column is inside the image: [lo, hi).
    const std::int64_t first = g_.in_col(0, kx);
    std::uint64_t lo = first >= 0 ? 0 : (static_cast<std::uint64_t>(-first) + g_.sw - 1) / g_.sw;
    std::uint64_t hi = 0;
    if (const std::int64_t span = static_cast<std::int64_t>(g_.w) - first; span > 0)
      hi = std::min<std::uint64_t>(g_.ow, (static_cast<std::uint64_t>(span) + g_.sw - 1) / g_.sw);
    lo = std::min(lo, hi);
    std::size_t ns = 0;
    auto emit = [&](const std::uint8_t* src, std::uint64_t n, std::int64_t stride) {
      if (!n) return;
      if (!src && ns && !out[ns - 1].src)
        out[ns - 1].count += n;
      else
        out[ns++] = igemm::Segment{src, n, stride};
    };
    const auto col_stride = static_cast<std::int64_t>(g_.sw * x_.strides[3]);
    for (std::uint64_t p = from, end = from + count; p < end;) {
      const std::uint64_t r = p / g_.ow, col = p % g_.ow, run_end = std::min(end, (r + 1) * g_.ow);
      const std::uint64_t c1 = col + (run_end - p);  // this row's columns [col, c1)
      const std::int64_t ih = g_.in_row(r, ky);
      if (ih < 0 || ih >= static_cast<std::int64_t>(g_.h)) {
        emit(nullptr, c1 - col, 0);
      } else {
        const std::uint64_t a = std::clamp(lo, col, c1), b = std::clamp(hi, col, c1);
        emit(nullptr, a - col, 0);
        if (b > a)
          emit(reinterpret_cast<const std::uint8_t*>(x_.at(g_.act(x_, ni_, c0_ + ci, static_cast<std::uint64_t>(ih),
                                                                  static_cast<std::uint64_t>(g_.in_col(a, kx))))),
               b - a, col_stride);
        emit(nullptr, c1 - std::max(a, b), 0);
      }
      p = run_end;
    }
    return ns;
  }

 private:
  const Geometry& g_;
  const View& x_;
  std::uint64_t ni_, c0_;
};

// The weights of one group, one line per output channel, along K in the
// order the input side uses: (ky, kx, c) for NHWC, (c, ky, kx) for NCHW.
class WeightLines final : public igemm::Lines {
 public:
  WeightLines(const Geometry& g, const View& w, std::uint64_t group) : g_(g), w_(w), o0_(group * (g.o / g.groups)) {}
  std::size_t segments(std::uint64_t line, std::uint64_t from, std::uint64_t count,
                       igemm::Segment* out) const override {
    const std::uint64_t cg = g_.c / g_.groups, oi = o0_ + line;
    const auto* base = reinterpret_cast<const std::uint8_t*>(w_.data);
    std::size_t ns = 0;
    for (std::uint64_t k = from, end = from + count; k < end;) {
      std::uint64_t ci, ky, kx, run;
      std::int64_t stride;
      if (g_.nhwc) {  // runs of channels
        const std::uint64_t tap = k / cg;
        ci = k % cg;
        ky = tap / g_.kw;
        kx = tap % g_.kw;
        run = std::min(cg - ci, end - k);
        stride = static_cast<std::int64_t>(w_.strides[1]);
      } else {  // runs of a kernel row
        kx = k % g_.kw;
        ky = k / g_.kw % g_.kh;
        ci = k / (g_.kw * g_.kh);
        run = std::min(g_.kw - kx, end - k);
        stride = static_cast<std::int64_t>(w_.strides[3]);
      }
      out[ns++] = igemm::Segment{base + Geometry::wgt(w_, oi, ci, ky, kx), run, stride};
      k += run;
    }
    return ns;
  }

 private:
  const Geometry& g_;
  const View& w_;
  std::uint64_t o0_;
};

// Depthwise (one input channel per group): direct loops, each output
// element summed in one place over its valid taps in (ky, kx) order.
void depthwise_integer(TensorEngine& e, const Geometry& g, const View& x, const View& w, std::int32_t x_zero,
                       const std::vector<std::int16_t>& w_zero, std::int32_t* acc) {
  const std::uint64_t og = g.o / g.groups, taps = g.kh * g.kw;
  const bool xs = x.dtype == fw::DType::kI8;
  std::vector<std::int32_t> wt(taps * g.o);  // [tap][o], zero point removed
  for (std::uint64_t oi = 0; oi < g.o; ++oi)
    for (std::uint64_t t = 0; t < taps; ++t) {
      const std::byte* p = w.at(Geometry::wgt(w, oi, 0, t / g.kw, t % g.kw));
      wt[t * g.o + oi] = static_cast<std::int32_t>(load_int(p, w.dtype)) - w_zero[oi];
    }
  auto xv = [&](const std::byte* p) -> std::int32_t {
    return (xs ? static_cast<std::int32_t>(static_cast<std::int8_t>(*p))
               : static_cast<std::int32_t>(static_cast<std::uint8_t>(*p))) -
           x_zero;
  };
  if (g.nhwc) {
    e.pool().parallel_for(g.n * g.oh, [&](std::uint64_t begin, std::uint64_t end) {
      std::vector<std::int32_t> xin(g.c);
      for (std::uint64_t nr = begin; nr < end; ++nr) {
        const std::uint64_t ni = nr / g.oh, r = nr % g.oh;
        for (std::uint64_t col = 0; col < g.ow; ++col) {
          std::uint32_t* out = reinterpret_cast<std::uint32_t*>(acc + ((ni * g.oh + r) * g.ow + col) * g.o);
          std::fill(out, out + g.o, 0u);
          for (std::uint64_t t = 0; t < taps; ++t) {
            const std::int64_t ih = g.in_row(r, t / g.kw), iw = g.in_col(col, t % g.kw);
            if (ih < 0 || ih >= static_cast<std::int64_t>(g.h) || iw < 0 || iw >= static_cast<std::int64_t>(g.w))
              continue;
            const std::byte* px = x.at(g.act(x, ni, 0, static_cast<std::uint64_t>(ih), static_cast<std::uint64_t>(iw)));
            for (std::uint64_t c = 0; c < g.c; ++c) xin[c] = xv(px + c * x.strides[3]);
            const std::int32_t* wrow = &wt[t * g.o];
            if (og == 1) {
              for (std::uint64_t oi = 0; oi < g.o; ++oi)
                out[oi] += static_cast<std::uint32_t>(xin[oi]) * static_cast<std::uint32_t>(wrow[oi]);
            } else {
              for (std::uint64_t oi = 0; oi < g.o; ++oi)
                out[oi] += static_cast<std::uint32_t>(xin[oi / og]) * static_cast<std::uint32_t>(wrow[oi]);
            }
          }
        }
      }
    });
    return;
  }
  e.pool().parallel_for(g.n * g.o, [&](std::uint64_t begin, std::uint64_t end) {
    std::vector<std::int32_t> xin(g.w);
    for (std::uint64_t no = begin; no < end; ++no) {
      const std::uint64_t ni = no / g.o, oi = no % g.o, ci = oi / og;
      auto* plane = reinterpret_cast<std::uint32_t*>(acc + (ni * g.o + oi) * g.oh * g.ow);
      std::fill(plane, plane + g.oh * g.ow, 0u);
      for (std::uint64_t r = 0; r < g.oh; ++r) {
        std::uint32_t* out = plane + r * g.ow;
        for (std::uint64_t ky = 0; ky < g.kh; ++ky) {
          const std::int64_t ih = g.in_row(r, ky);
          if (ih < 0 || ih >= static_cast<std::int64_t>(g.h)) continue;
          const std::byte* row = x.at(g.act(x, ni, ci, static_cast<std::uint64_t>(ih), 0));
          for (std::uint64_t i = 0; i < g.w; ++i) xin[i] = xv(row + i * x.strides[3]);
          for (std::uint64_t kx = 0; kx < g.kw; ++kx) {
            const auto wv = static_cast<std::uint32_t>(wt[(ky * g.kw + kx) * g.o + oi]);
            for (std::uint64_t col = 0; col < g.ow; ++col) {
              const std::int64_t iw = g.in_col(col, kx);
              if (iw >= 0 && iw < static_cast<std::int64_t>(g.w))
                out[col] += static_cast<std::uint32_t>(xin[static_cast<std::uint64_t>(iw)]) * wv;
            }
          }
        }
      }
    }
  });
}

// The weights of group `gi` as the GEMM's B (NHWC: columns along (ky, kx,
// c)), packed: from the engine's cache where they were packed before from
// the same bytes, else packed now (and kept, where dense and there is room).
const float* packed_weights(TensorEngine& e, const igemm::Kernels& kern, const Geometry& g, const View& w,
                            const std::vector<std::int16_t>& w_zero, std::uint64_t gi) {
  const std::uint64_t og = g.o / g.groups, k = g.c / g.groups * g.kh * g.kw;
  WeightLines wl(g, w, gi);
  wl.is_signed = w.dtype == fw::DType::kI8;
  wl.zero_per_line = w_zero.data() + gi * og;
  const std::uint64_t floats = igemm::packed_b_floats(kern, og, k);
  if (w.contiguous()) {
    // Where the weights are and everything their packing depends on.
    PackedCache::Key key{reinterpret_cast<std::intptr_t>(w.data), reinterpret_cast<std::intptr_t>(&kern)};
    for (const std::uint64_t v :
         {static_cast<std::uint64_t>(w.dtype), std::uint64_t{g.nhwc}, gi, g.groups, g.o, g.c, g.kh, g.kw})
      key.push_back(static_cast<std::int64_t>(v));
    key.insert(key.end(), wl.zero_per_line, wl.zero_per_line + og);
    const std::size_t bytes = w.elements() * w.esize;
    if (const float* hit = e.packed_cache().find(key, w.data, bytes)) return hit;
    if (float* bp = e.packed_cache().insert(std::move(key), w.data, bytes, floats)) {
      igemm::pack_b(e, kern, og, k, wl, false, bp);
      return bp;
    }
  }
  float* bp = e.scratch_f32(floats);
  igemm::pack_b(e, kern, og, k, wl, false, bp);
  return bp;
}

// conv_integer on the engine's own kernels: exact on every ISA.
void conv_integer_exact(TensorEngine& e, const Geometry& g, const View& x, const View& w, std::int32_t x_zero,
                        const std::vector<std::int16_t>& w_zero, std::int32_t* acc) {
  const std::uint64_t og = g.o / g.groups, cg = g.c / g.groups, k = cg * g.kh * g.kw;
  if (cg == 1 && g.groups > 1) {
    depthwise_integer(e, g, x, w, x_zero, w_zero, acc);
    return;
  }
  const igemm::Kernels& kern = igemm::kernels(e.isa());
  for (std::uint64_t gi = 0; gi < g.groups; ++gi) {
    WeightLines wl(g, w, gi);
    wl.is_signed = w.dtype == fw::DType::kI8;
    wl.zero_per_line = w_zero.data() + gi * og;
    if (g.nhwc) {
      Im2colRows xr(g, x, gi);
      xr.is_signed = x.dtype == fw::DType::kI8;
      xr.zero = static_cast<std::int16_t>(x_zero);
      const float* bp = k && og ? packed_weights(e, kern, g, w, w_zero, gi) : nullptr;  // none to pack
      igemm::gemm_packed(e, kern, g.n * g.oh * g.ow, og, k, xr, bp, acc + gi * og, g.o);
    } else {
      for (std::uint64_t ni = 0; ni < g.n; ++ni) {
        Im2colLines xl(g, x, ni, gi);
        xl.is_signed = x.dtype == fw::DType::kI8;
        xl.zero = static_cast<std::int16_t>(x_zero);
        igemm::gemm(e, kern, og, g.oh * g.ow, k, wl, xl, true, acc + (ni * g.o + gi * og) * g.oh * g.ow, g.oh * g.ow);
      }
    }
  }
}
// Grouped f32 convolutions in NCHW with at most this many input channels
// per group (depthwise ones) run on the engine's own loop: oneDNN has only
// its GEMM-based kernel for them in this layout, one small GEMM per group
// over an im2col copy, several times slower. With 8 channels per group
// (regnet's) oneDNN's was the faster.
constexpr std::uint64_t kOwnGroupedMaxChannels = 1;

// y = conv(x, w) + b for such a convolution with equal strides along both
// axes, into `out`: y's data, or a dense NCHW f32 scratch. Each input
// channel is copied into a zero-padded plane, so that each tap is one
// multiply-add pass over all outputs of the channel (with the columns past
// the output's width computed and dropped).
// Each output is 0 plus its products in (input channel, kernel row, kernel
// column) order, taps in the padding included (w * 0, as ONNX pads), each
// product rounded and then added (never fused), then the bias added: the
// same bits at every instruction-set level and thread count.
bool grouped_f32(TensorEngine& e, const Geometry& g, const View& x, const View& w, const View* b, const View& y,
                 void* out, bool accumulate) {
  const std::uint64_t og = g.o / g.groups, cg = g.c / g.groups;
  const bool to_y = out == y.data;
  if (g.nhwc || g.groups == 1 || cg > kOwnGroupedMaxChannels || g.sh != g.sw || g.oh == 0 || g.ow == 0 ||
      x.dtype != fw::DType::kF32 || w.dtype != fw::DType::kF32 || (b && b->dtype != fw::DType::kF32) ||
      (to_y && y.dtype != fw::DType::kF32))
    return false;
  const std::uint64_t s = g.sw;
  // The padded plane, `pw` wide: output (r, col) at r * pw + col reads
  // plane element s * (r * pw + col) + a * dh * pw + b * dw, so each tap
  // is one pass with stride s; outputs past the width are dropped. Rows
  // for the last pass's reach.
  const std::uint64_t pw = std::max(g.w + g.pl + g.pr, (g.ow - 1) * s + (g.kw - 1) * g.dw + 1), ow_p = pw;
  const std::uint64_t ph = s * g.oh + (g.kh - 1) * g.dh + 1;
  const auto* xbase = reinterpret_cast<const float*>(x.data);
  const auto* wbase = reinterpret_cast<const float*>(w.data);
  const auto* bbase = b ? reinterpret_cast<const float*>(b->data) : nullptr;
  auto* obase = static_cast<float*>(out);
  const std::uint64_t work = std::max<std::uint64_t>(1, g.oh * ow_p * cg * g.kh * g.kw);
  e.pool().parallel_for(
      g.n * g.o,
      [&](std::uint64_t begin, std::uint64_t end) {
        std::vector<float> plane(ph * pw, 0.0f), acc(g.oh * ow_p);
        for (std::uint64_t no = begin; no < end; ++no) {
          const std::uint64_t ni = no / g.o, oi = no % g.o, gi = oi / og;
          const float* wo = wbase + oi * w.strides[0];
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (std::uint64_t ci = 0; ci < cg; ++ci) {
            const float* xc = xbase + ni * x.strides[0] + (gi * cg + ci) * x.strides[1];
            for (std::uint64_t r = 0; r < g.h && r + g.pt < ph; ++r) {
              float* row = plane.data() + (r + g.pt) * pw + g.pl;
              const float* in = xc + r * x.strides[2];
              const std::uint64_t cols = std::min(g.w, pw - g.pl);
              for (std::uint64_t col = 0; col < cols; ++col) row[col] = in[col * x.strides[3]];
            }
            for (std::uint64_t a = 0; a < g.kh; ++a)
              for (std::uint64_t bb = 0; bb < g.kw; ++bb)
                simd::madd_strided_f32(acc.data(), plane.data() + a * g.dh * pw + bb * g.dw, acc.size(), s,
                                       wo[ci * w.strides[1] + a * w.strides[2] + bb * w.strides[3]]);
          }
          const float bias = bbase ? bbase[oi * b->strides[0]] : 0.0f;
          for (std::uint64_t r = 0; r < g.oh; ++r) {
            const float* src = acc.data() + r * ow_p;
            float* dst = to_y ? obase + ni * y.strides[0] + oi * y.strides[1] + r * y.strides[2]
                              : obase + ((ni * g.o + oi) * g.oh + r) * g.ow;
            const std::uint64_t step = to_y ? y.strides[3] : 1;
            if (to_y && accumulate) {  // then what y held (the scratch's finish adds it otherwise)
              for (std::uint64_t col = 0; col < g.ow; ++col)
                dst[col * step] = (bbase ? src[col] + bias : src[col]) + dst[col * step];
            } else if (bbase) {
              for (std::uint64_t col = 0; col < g.ow; ++col) dst[col * step] = src[col] + bias;
            } else {
              for (std::uint64_t col = 0; col < g.ow; ++col) dst[col * step] = src[col];
            }
          }
        }
      },
      std::max<std::uint64_t>(1, 16384 / work));
  return true;
}

// A depthwise convolution of f16 or bf16 in NHWC (one channel per group,
// channels dense in x and y), on the engine's own loop, for the CPUs where
// oneDNN has no kernel for the type. Each thread widens the input rows its
// outputs read into a few padded rows of its own (kept while the next
// output row reads them too) and rounds each output row once, while it is
// in the first-level cache. Widening the whole input before oneDNN's f32
// kernel and rounding its whole output after cost two more passes over
// memory than the convolution itself: MobileNetV2's depthwise layers in
// fp16 took 2 to 3 times their fp32 time.
// Each output is its bias plus its products in (kernel row, kernel column)
// order, taps in the padding included (w * 0, as ONNX pads), each product
// rounded and then added (never fused) (simd::dw_rows_f32), then what y
// held where it accumulates, then the activation: the same bits at every
// instruction-set level and thread count.
bool depthwise_nhwc_16(TensorEngine& e, const Geometry& g, const fw::ConvAttrs& at, const View& x, const View& w,
                       const View& bias, const View& y) {
  const bool f16 = x.dtype == fw::DType::kF16;
  if (!g.nhwc || !g.depthwise() || (!f16 && x.dtype != fw::DType::kBF16) || y.dtype != x.dtype || x.strides[3] != 1 ||
      y.strides[3] != 1 || g.oh == 0 || g.ow == 0)
    return false;
  const std::uint64_t ch = g.c, taps = g.kh * g.kw;
  // Weights tap-major, [kh * kw, ch], in f32: kept while their bytes stay
  // the same (a model's weights run after run), and the bias.
  const auto fill = [&](float* wt) {
    for (std::uint64_t ci = 0; ci < ch; ++ci)
      for (std::uint64_t a = 0; a < g.kh; ++a)
        for (std::uint64_t bb = 0; bb < g.kw; ++bb)
          wt[(a * g.kw + bb) * ch + ci] = load_float(w.at(Geometry::wgt(w, ci, 0, a, bb)), w.dtype);
  };
  const float* wt = nullptr;
  if (w.contiguous()) {
    constexpr std::int64_t kTapMajor = 0x544D;  // "TM": what the entry is (engine.cpp's widened floats: "WD")
    PackedCache::Key key{kTapMajor, reinterpret_cast<std::intptr_t>(w.data)};
    for (const std::uint64_t v : {static_cast<std::uint64_t>(w.dtype), ch, g.kh, g.kw})
      key.push_back(static_cast<std::int64_t>(v));
    const std::size_t bytes = w.elements() * w.esize;
    wt = e.packed_cache().find(key, w.data, bytes);
    if (!wt)
      if (float* into = e.packed_cache().insert(std::move(key), w.data, bytes, taps * ch)) {
        fill(into);
        wt = into;
      }
  }
  std::vector<float> own, bv(ch, 0.0f);
  if (!wt) {
    own.resize(taps * ch);
    fill(own.data());
    wt = own.data();
  }
  if (bias.present())
    for (std::uint64_t ci = 0; ci < ch; ++ci) bv[ci] = load_float(bias.at(ci * bias.strides[0]), bias.dtype);
  const auto widen = f16 ? simd::widen_f16 : simd::widen_bf16;
  const auto narrow = f16 ? simd::narrow_f16 : simd::narrow_bf16;
  const auto act = static_cast<fw::Activation>(at.activation);
  const bool accumulate = at.accumulate != 0;
  // A padded row: pl zero columns, the input's w, zeros to the last tap's
  // reach. An output row reads kh input rows within a span of `span`
  // rows, distinct modulo span: row ih is kept in slot ih % span.
  const std::uint64_t cols = std::max(g.pl + g.w + g.pr, (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1);
  const std::uint64_t row_len = cols * ch, span = (g.kh - 1) * g.dh + 1;
  const auto* xbase = reinterpret_cast<const std::uint16_t*>(x.data);
  auto* ybase = reinterpret_cast<std::uint16_t*>(y.data);
  e.pool().parallel_for(
      g.n * g.oh,
      [&](std::uint64_t begin, std::uint64_t end) {
        // Each thread's rows stay from op to op (fresh ones of this size
        // were fresh pages, faulted in at every call), each on a cache line
        // of its own: rows, the padding's row, the output row and y's.
        thread_local std::vector<float> mem;
        const std::uint64_t row_stride = (row_len + 15) / 16 * 16, out_len = (g.ow * ch + 15) / 16 * 16;
        mem.resize(std::max<std::size_t>(mem.size(), (span + 1) * row_stride + 2 * out_len + 16));
        float* const rows =
            reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(mem.data()) + 63) & ~std::uintptr_t{63});
        float* const zero = rows + span * row_stride;
        float* const out = zero + row_stride;
        float* const held = out + out_len;
        std::fill(zero, zero + row_len, 0.0f);
        for (std::uint64_t slot = 0; slot < span; ++slot) {  // the padding columns of each kept row
          float* row = rows + slot * row_stride;
          std::fill(row, row + g.pl * ch, 0.0f);
          std::fill(row + (g.pl + g.w) * ch, row + row_len, 0.0f);
        }
        std::vector<std::int64_t> tag(span, -1);  // the input row (n * h + ih) each slot holds
        std::vector<const float*> in(taps);
        for (std::uint64_t nr = begin; nr < end; ++nr) {
          const std::uint64_t ni = nr / g.oh, r = nr % g.oh;
          for (std::uint64_t a = 0; a < g.kh; ++a) {
            const std::int64_t ih = g.in_row(r, a);
            const float* row = zero;
            if (ih >= 0 && ih < static_cast<std::int64_t>(g.h)) {
              const std::uint64_t slot = static_cast<std::uint64_t>(ih) % span;
              float* into = rows + slot * row_stride;
              const auto key = static_cast<std::int64_t>(ni * g.h) + ih;
              if (tag[slot] != key) {
                const std::uint16_t* src = xbase + ni * x.strides[0] + static_cast<std::uint64_t>(ih) * x.strides[1];
                if (x.strides[2] == ch)
                  widen(src, into + g.pl * ch, g.w * ch);
                else
                  for (std::uint64_t col = 0; col < g.w; ++col)
                    widen(src + col * x.strides[2], into + (g.pl + col) * ch, ch);
                tag[slot] = key;
              }
              row = into;
            }
            for (std::uint64_t bb = 0; bb < g.kw; ++bb) in[a * g.kw + bb] = row + bb * g.dw * ch;
          }
          simd::dw_rows_f32(out, in.data(), wt, bv.data(), taps, g.ow, ch, g.sw * ch);
          std::uint16_t* dst = ybase + ni * y.strides[0] + r * y.strides[1];
          const bool dense_y = y.strides[2] == ch;
          if (accumulate) {
            if (dense_y)
              widen(dst, held, g.ow * ch);
            else
              for (std::uint64_t col = 0; col < g.ow; ++col) widen(dst + col * y.strides[2], held + col * ch, ch);
            for (std::uint64_t i = 0; i < g.ow * ch; ++i) out[i] += held[i];
          }
          activate_span(act, at.act_alpha, at.act_beta, out, g.ow * ch);
          if (dense_y)
            narrow(out, dst, g.ow * ch);
          else
            for (std::uint64_t col = 0; col < g.ow; ++col) narrow(out + col * ch, dst + col * y.strides[2], ch);
        }
      },
      std::max<std::uint64_t>(1, 16384 / std::max<std::uint64_t>(1, g.ow * ch * taps)));
  return true;
}

// The element step between the pixels of an NHWC view whose pixels lie
// at one step from each other, channels dense (a channel slice of a wider
// tensor included); 0 where they do not (a broadcast view among them: a
// dimension of stride 0).
std::uint64_t pixel_step(const View& v) {
  if (v.strides[3] != 1 && v.shape[3] > 1) return 0;
  std::uint64_t step = 0;
  for (int d = 2; d >= 0; --d)
    if (v.shape[d] > 1) {
      if (v.strides[d] == 0) return 0;
      if (step == 0) step = v.strides[d];
    }
  if (step == 0) return std::max<std::uint64_t>(v.shape[3], 1);  // one pixel
  std::uint64_t pixels = 1;
  for (int d = 2; d >= 0; --d) {
    if (v.shape[d] > 1 && v.strides[d] != step * pixels) return 0;
    pixels *= v.shape[d];
  }
  return step;
}

// Where a band of a convolution in NHWC reads and writes: ranges of x's
// and y's pixels (in N, H, W order), and the geometry of the convolution
// of that band alone (Bands::geometries).
struct BandSpan {
  std::uint64_t x0, xn, y0, yn;
  std::size_t geometry;
};

// A convolution in NHWC cut into bands that each hold at most `budget`
// floats of input and output together (at least one output row): bands
// of pixels where outputs read their own pixel alone (1x1, stride 1, no
// padding), else bands of output rows of one image, each reading its
// input rows with the padding it meets. The bands depend on the geometry
// alone, never on the threads.
struct Bands {
  std::vector<Geometry> geometries;
  std::vector<BandSpan> spans;

  Bands(const Geometry& g, std::uint64_t budget) {
    if (g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && (g.pt | g.pl | g.pb | g.pr) == 0) {
      const std::uint64_t pixels = g.n * g.h * g.w;
      const std::uint64_t band = even(pixels, std::max<std::uint64_t>(16, budget / (g.c + g.o) / 16 * 16), 16);
      for (std::uint64_t p0 = 0; p0 < pixels; p0 += band) {
        Geometry gb = g;
        gb.n = gb.h = gb.oh = 1;
        gb.w = gb.ow = std::min(band, pixels - p0);
        spans.push_back({p0, gb.w, p0, gb.w, add(gb)});
      }
      return;
    }
    // Each output row reads sh more input rows; the first reads `reach`.
    const std::uint64_t reach = (g.kh - 1) * g.dh + 1, row = g.ow * g.o + g.sh * g.w * g.c;
    const std::uint64_t first = reach > g.sh ? (reach - g.sh) * g.w * g.c : 0;
    const std::uint64_t rows = even(g.oh, std::max<std::uint64_t>(1, budget > first ? (budget - first) / row : 1), 1);
    for (std::uint64_t ni = 0; ni < g.n; ++ni)
      for (std::uint64_t r0 = 0; r0 < g.oh; r0 += rows) {
        const std::uint64_t r1 = std::min(g.oh, r0 + rows);
        const auto i0 = static_cast<std::int64_t>(r0 * g.sh) - static_cast<std::int64_t>(g.pt);
        const std::int64_t i1 = i0 + static_cast<std::int64_t>((r1 - 1 - r0) * g.sh + reach);
        const auto top = static_cast<std::uint64_t>(std::max<std::int64_t>(i0, 0));
        const auto end = static_cast<std::uint64_t>(std::clamp<std::int64_t>(i1, 0, static_cast<std::int64_t>(g.h)));
        Geometry gb = g;
        gb.n = 1;
        gb.h = end > top ? end - top : 0;
        gb.pt = static_cast<std::uint64_t>(std::max<std::int64_t>(-i0, 0));
        gb.pb = static_cast<std::uint64_t>(std::max<std::int64_t>(i1 - static_cast<std::int64_t>(g.h), 0));
        gb.oh = r1 - r0;
        spans.push_back({(ni * g.h + top) * g.w, gb.h * g.w, (ni * g.oh + r0) * g.ow, gb.oh * g.ow, add(gb)});
      }
  }

 private:
  // n cut into parts of at most `most` (a multiple of `unit` where it can
  // be), as even as that allows, and an even number of them where there
  // is more than one (two threads, the usual team, take equal shares): the
  // length of the parts but the last.
  static std::uint64_t even(std::uint64_t n, std::uint64_t most, std::uint64_t unit) {
    std::uint64_t parts = (n + most - 1) / std::max<std::uint64_t>(most, 1);
    if (parts > 1 && parts % 2 && n >= (parts + 1) * unit) ++parts;
    return std::min(n, ((n + parts - 1) / std::max<std::uint64_t>(parts, 1) + unit - 1) / unit * unit);
  }
  std::size_t add(const Geometry& gb) {
    for (std::size_t i = 0; i < geometries.size(); ++i) {
      const Geometry& o = geometries[i];
      if (o.n == gb.n && o.h == gb.h && o.w == gb.w && o.oh == gb.oh && o.ow == gb.ow && o.pt == gb.pt && o.pb == gb.pb)
        return i;
    }
    geometries.push_back(gb);
    return geometries.size() - 1;
  }
};

// A convolution of f16 or bf16 in NHWC but a depthwise one, on CPUs where
// oneDNN has no kernel for the type: oneDNN's f32 kernel over bands
// (Bands), each thread taking bands of its own (oneDNN runs on the calling
// thread alone inside the engine's parallel region): a band's input is
// widened into the thread's memory, convolved into more of it, and the
// result finished (what y held where it accumulates, the activation) and
// rounded into y while it is in cache. Widening the whole input first and
// rounding the whole output after took two passes over memory more than
// the convolution's own (MobileNetV2's 1x1 layers in fp16: 1.1 to 2.5
// times their fp32 time). Each output is what oneDNN's kernel gives for
// its window; the bands are the same whatever the threads.
bool banded_nhwc_16(TensorEngine& e, const Geometry& g, const fw::ConvAttrs& at, const View& x0, const View& w0,
                    const View& bias, const View& y) {
  const bool f16 = x0.dtype == fw::DType::kF16;
  if (!g.nhwc || (!f16 && x0.dtype != fw::DType::kBF16) || y.dtype != x0.dtype || g.c == 0 || g.o == 0 || g.oh == 0 ||
      g.ow == 0 || g.h == 0 || g.w == 0)
    return false;
  const std::uint64_t xstep = pixel_step(x0), ystep = pixel_step(y);
  if (xstep == 0 || ystep == 0) return false;
  const Bands bands(g, 65536);
  std::uint64_t xmost = 0, ymost = 0;
  for (const BandSpan& s : bands.spans) {
    if (s.xn == 0) return false;  // a band all in the padding
    xmost = std::max(xmost, s.xn);
    ymost = std::max(ymost, s.yn);
  }
  std::uint64_t serial = 0;
  const View w = widened_weights(e, w0, Staged::kW, &serial);
  View b = bias;
  if (bias.present() && bias.dtype != fw::DType::kF32) b = widened(e, bias, Staged::kBias);
  // A primitive per band geometry, made (and its weights reordered) on this
  // thread before any band runs, so that y is written whole or not at all;
  // the handles keep it while the bands run.
  struct Made {
    dnnl::convolution_forward primitive;
    dnnl::memory::desc src, dst, bias, scratchpad;
    dnnl::memory weights;
  };
  std::vector<Made> made(bands.geometries.size());
  for (std::size_t i = 0; i < made.size(); ++i) {
    const Geometry& gb = bands.geometries[i];
    View xb, yb;
    for (View* v : {&xb, &yb}) {
      const bool in = v == &xb;
      const std::uint64_t shape[4] = {gb.n, in ? gb.h : gb.oh, in ? gb.w : gb.ow, in ? gb.c : gb.o};
      v->dtype = fw::DType::kF32;
      v->esize = 4;
      v->rank = 4;
      std::copy(shape, shape + 4, v->shape);
      v->strides[3] = 1;
      for (int d = 2; d >= 0; --d) v->strides[d] = v->strides[d + 1] * shape[d + 1];
    }
    const ConvRunner keep = [&](const DnnlState::Conv& c, const dnnl::memory& weights) {
      made[i] = {c.primitive, c.pd.src_desc(), c.pd.dst_desc(), c.pd.bias_desc(), c.pd.scratchpad_desc(), weights};
    };
    if (!dnnl_conv(e, gb, xb, dt::f32, w, w.data, dt::f32, b.present() ? &b : nullptr, yb, dt::f32, yb.data, nullptr,
                   nullptr, false, serial, false, &keep))
      return false;
  }
  const auto widen = f16 ? simd::widen_f16 : simd::widen_bf16;
  const auto narrow = f16 ? simd::narrow_f16 : simd::narrow_bf16;
  const auto act = static_cast<fw::Activation>(at.activation);
  const bool accumulate = at.accumulate != 0;
  const auto* xbase = reinterpret_cast<const std::uint16_t*>(x0.data);
  auto* ybase = reinterpret_cast<std::uint16_t*>(y.data);
  auto& eng = e.dnnl().engine;
  std::size_t scratch = 0;
  for (const Made& m : made) scratch = std::max(scratch, m.scratchpad.get_size());
  // oneDNN fails a primitive it has made only for want of memory (for a
  // stream or a memory object): the command then fails as out of memory,
  // as others do (y partly written), rather than end the process.
  try {
    e.pool().parallel_for(bands.spans.size(), [&](std::uint64_t u0, std::uint64_t u1) {
      // The thread's own stream, memory objects and memory.
      dnnl::stream stream(eng);
      thread_local std::vector<float> mem;
      const std::uint64_t xlen = (xmost * g.c + 15) / 16 * 16, ylen = (ymost * g.o + 15) / 16 * 16;
      mem.resize(std::max<std::size_t>(mem.size(), xlen + 2 * ylen + (scratch + 63) / 4 + 16));
      float* const xf =
          reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(mem.data()) + 63) & ~std::uintptr_t{63});
      float* const yf = xf + xlen;
      float* const held = yf + ylen;
      std::vector<std::unordered_map<int, dnnl::memory>> args(made.size());  // per geometry, made when first run
      for (std::uint64_t u = u0; u < u1; ++u) {
        const BandSpan& s = bands.spans[u];
        const Made& m = made[s.geometry];
        auto& a = args[s.geometry];
        if (a.empty()) {
          a = {{DNNL_ARG_SRC, dnnl::memory(m.src, eng, xf)},
               {DNNL_ARG_WEIGHTS, m.weights},
               {DNNL_ARG_DST, dnnl::memory(m.dst, eng, yf)},
               {DNNL_ARG_SCRATCHPAD, dnnl::memory(m.scratchpad, eng, held + ylen)}};
          if (b.present()) a.emplace(DNNL_ARG_BIAS, dnnl::memory(m.bias, eng, b.data));
        }
        if (xstep == g.c)
          widen(xbase + s.x0 * xstep, xf, s.xn * g.c);
        else
          for (std::uint64_t i = 0; i < s.xn; ++i) widen(xbase + (s.x0 + i) * xstep, xf + i * g.c, g.c);
        m.primitive.execute(stream, a);
        stream.wait();
        const auto finish = [&](float* v, std::uint64_t n, std::uint16_t* dst) {
          if (accumulate) {
            widen(dst, held, n);
            for (std::uint64_t i = 0; i < n; ++i) v[i] += held[i];
          }
          activate_span(act, at.act_alpha, at.act_beta, v, n);
          narrow(v, dst, n);
        };
        if (ystep == g.o)
          finish(yf, s.yn * g.o, ybase + s.y0 * ystep);
        else
          for (std::uint64_t i = 0; i < s.yn; ++i) finish(yf + i * g.o, g.o, ybase + (s.y0 + i) * ystep);
      }
    });
  } catch (const dnnl::error&) {
    throw std::bad_alloc();
  }
  return true;
}

// A depthwise integer convolution in NHWC of bytes (one channel per
// group, channels dense in x and y; s8 weights without zero points) on
// the engine's own loop, for CPUs with AVX-512 VNNI: each output is the
// sum of x' * w over its taps, x' = x as u8 (an i8 x plus 128: `flip`)
// and the padding's taps x' = `pad` (x_zero so read), requantised with
// `rq` (simd::dw_rows_q8). oneDNN's int8
// depthwise kernels widen each byte to 32 bits and ran no faster than its
// f32 ones; here vpdpbusd takes four taps of a kernel row at once. Each
// thread keeps the input rows its outputs read (as depthwise_nhwc_16
// does), each byte beside the next three taps' (dilation dw apart).
void depthwise_quads_nhwc(TensorEngine& e, const Geometry& g, const View& x, std::uint8_t flip, std::uint8_t pad,
                          const std::int8_t* wq, const simd::DwRequant& rq, const View& y) {
  const std::uint64_t ch = g.c, per_row = (g.kw + 3) / 4, quads = g.kh * per_row;
  // A padded row of bytes: pl columns of `pad`, the input's w, `pad` to
  // the last tap's reach and 3 dw columns further; as quads over `cols`
  // columns. Where every tap's first column is a multiple of the stride
  // (4 dw is), only those columns' quads are made: half of them at stride 2.
  const std::uint64_t cols = std::max(g.pl + g.w + g.pr, (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1);
  const std::uint64_t every = 4 * g.dw % g.sw == 0 ? g.sw : 1, quad_cols = (cols + every - 1) / every;
  const std::uint64_t bytes_len = (quad_cols * every + 3 * g.dw) * ch, row_len = 4 * quad_cols * ch;
  const std::uint64_t span = (g.kh - 1) * g.dh + 1;
  const auto* xbase = reinterpret_cast<const std::uint8_t*>(x.data);
  const auto pad_x = static_cast<std::uint8_t>(pad ^ flip);  // as x holds it
  auto* ybase = reinterpret_cast<std::uint8_t*>(y.data);
  e.pool().parallel_for(
      g.n * g.oh,
      [&](std::uint64_t begin, std::uint64_t end) {
        // Each thread's rows stay from op to op, each on cache lines of its
        // own: the kept rows, the padding's row, the bytes.
        thread_local std::vector<std::uint8_t> mem;
        const auto line = [](std::uint64_t n) { return (n + 63) / 64 * 64; };
        const std::uint64_t row_stride = line(row_len), bytes_stride = line(bytes_len);
        mem.resize(std::max<std::size_t>(mem.size(), (span + 1) * row_stride + bytes_stride + 64));
        std::uint8_t* const rows =
            reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(mem.data()) + 63) & ~std::uintptr_t{63});
        std::uint8_t* const padding = rows + span * row_stride;
        std::uint8_t* const padded = padding + row_stride;
        std::fill(padding, padding + row_len, pad);
        std::fill(padded, padded + bytes_len, pad_x);
        std::vector<std::int64_t> tag(span, -1);  // the input row (n * h + ih) each slot holds
        std::vector<const std::uint8_t*> in(quads);
        for (std::uint64_t nr = begin; nr < end; ++nr) {
          const std::uint64_t ni = nr / g.oh, r = nr % g.oh;
          for (std::uint64_t a = 0; a < g.kh; ++a) {
            const std::int64_t ih = g.in_row(r, a);
            const std::uint8_t* row = padding;
            if (ih >= 0 && ih < static_cast<std::int64_t>(g.h)) {
              const std::uint64_t slot = static_cast<std::uint64_t>(ih) % span;
              std::uint8_t* into = rows + slot * row_stride;
              const auto key = static_cast<std::int64_t>(ni * g.h) + ih;
              if (tag[slot] != key) {
                const std::uint8_t* src = xbase + ni * x.strides[0] + static_cast<std::uint64_t>(ih) * x.strides[1];
                if (x.strides[2] == ch)
                  std::memcpy(padded + g.pl * ch, src, g.w * ch);
                else
                  for (std::uint64_t col = 0; col < g.w; ++col)
                    std::memcpy(padded + (g.pl + col) * ch, src + col * x.strides[2], ch);
                if (every == 1)
                  simd::quad_bytes_u8(into, padded, cols * ch, 1, 0, g.dw * ch, flip);
                else
                  simd::quad_bytes_u8(into, padded, ch, quad_cols, every * ch, g.dw * ch, flip);
                tag[slot] = key;
              }
              row = into;
            }
            for (std::uint64_t j = 0; j < per_row; ++j) in[a * per_row + j] = row + 4 * (4 * j * g.dw / every * ch);
          }
          simd::dw_rows_q8(ybase + ni * y.strides[0] + r * y.strides[1], y.strides[2], in.data(), wq, quads, g.ow, ch,
                           g.sw / every * ch, rq);
        }
      },
      std::max<std::uint64_t>(1, 16384 / std::max<std::uint64_t>(1, g.ow * ch * g.kh * g.kw)));
}

}  // namespace

bool qlinear_conv_depthwise(TensorEngine& e, const fw::ConvAttrs& at, const View& x, const View& w, const View* xz,
                            const View* wz, const View& y, const std::vector<float>& multipliers,
                            const std::int32_t* bias, std::int32_t y_zero) {
  const Geometry g(at, x, w, y);
  const auto byte = [](fw::DType t) { return t == fw::DType::kU8 || t == fw::DType::kI8; };
  if (e.isa() != Isa::kAvx512Vnni || !g.nhwc || !g.depthwise() || g.kw < 4 || !byte(x.dtype) ||
      w.dtype != fw::DType::kI8 || !byte(y.dtype) || x.strides[3] != 1 || y.strides[3] != 1 ||
      multipliers.size() != g.c || g.n * g.oh * g.ow == 0)
    return false;
  for (std::uint64_t ci = 0; wz && ci < g.c; ++ci)
    if (load_int(wz->at(ci * wz->strides[0]), wz->dtype) != 0) return false;
  for (float m : multipliers)  // requantize()'s result for a NaN product is the C++ cast's, not the vector's
    if (!std::isfinite(m)) return false;
  // An i8 x reads as u8 plus 128 (x'); its zero point likewise.
  const std::uint8_t flip = x.dtype == fw::DType::kI8 ? 0x80 : 0;
  const auto x_zero = static_cast<std::int32_t>(xz ? load_int(xz->data, xz->dtype) : 0);
  const std::int32_t zero_read = x_zero + (flip ? 128 : 0);
  if (zero_read < 0 || zero_read > 255) return false;  // not a zero point of x's type
  const std::uint64_t ch = g.c, per_row = (g.kw + 3) / 4, quads = g.kh * per_row;
  // The weights as quads, [kh][per_row][ch][4], the slots past a kernel
  // row's end 0; then each channel's weight sum, as int32s. Kept while
  // their bytes stay the same (a model's weights run after run).
  const std::uint64_t wlen = quads * ch * 4;
  const auto fill = [&](std::int8_t* wq) {
    auto* wsum = reinterpret_cast<std::int32_t*>(wq + wlen);
    std::fill(wsum, wsum + ch, 0);
    for (std::uint64_t a = 0; a < g.kh; ++a)
      for (std::uint64_t j = 0; j < per_row; ++j)
        for (std::uint64_t ci = 0; ci < ch; ++ci)
          for (std::uint64_t t = 0; t < 4; ++t) {
            const std::uint64_t b = 4 * j + t;
            const auto v = b < g.kw ? static_cast<std::int8_t>(load_int(w.at(Geometry::wgt(w, ci, 0, a, b)), w.dtype))
                                    : std::int8_t{0};
            wq[((a * per_row + j) * ch + ci) * 4 + t] = v;
            wsum[ci] += v;
          }
  };
  const std::size_t floats = (wlen + 4 * ch + 3) / 4;
  const std::int8_t* wq = nullptr;
  if (w.contiguous()) {
    constexpr std::int64_t kQuadTaps = 0x5154;  // "QT"
    PackedCache::Key key{kQuadTaps, reinterpret_cast<std::intptr_t>(w.data)};
    for (const std::uint64_t v : {ch, g.kh, g.kw}) key.push_back(static_cast<std::int64_t>(v));
    const std::size_t bytes = w.elements() * w.esize;
    wq = reinterpret_cast<const std::int8_t*>(e.packed_cache().find(key, w.data, bytes));
    if (!wq)
      if (float* into = e.packed_cache().insert(std::move(key), w.data, bytes, floats)) {
        fill(reinterpret_cast<std::int8_t*>(into));
        wq = reinterpret_cast<const std::int8_t*>(into);
      }
  }
  std::vector<float> own;
  if (!wq) {
    own.resize(floats);
    fill(reinterpret_cast<std::int8_t*>(own.data()));
    wq = reinterpret_cast<const std::int8_t*>(own.data());
  }
  const auto* wsum = reinterpret_cast<const std::int32_t*>(wq + wlen);
  // The sums of x' * w exceed the reference's sums of (x - x_zero) * w by
  // zero_read times the weights' sum, taken off through the bias (in
  // int32, wrapping, as requantize() adds it).
  std::vector<std::int32_t> bias_read(ch);
  for (std::uint64_t ci = 0; ci < ch; ++ci)
    bias_read[ci] =
        static_cast<std::int32_t>((bias ? static_cast<std::uint32_t>(bias[ci]) : 0u) -
                                  static_cast<std::uint32_t>(zero_read) * static_cast<std::uint32_t>(wsum[ci]));
  const simd::DwRequant rq{bias_read.data(), multipliers.data(), y_zero, int_min(y.dtype), int_max(y.dtype)};
  depthwise_quads_nhwc(e, g, x, flip, static_cast<std::uint8_t>(zero_read), wq, rq, y);
  return true;
}

fw::Problem run_conv2d(TensorEngine& e, const fw::ConvAttrs& at, const View* v) {
  const View &x0 = v[0], &w0 = v[1], &bias = v[2], &y = v[3];
  const Geometry g(at, x0, w0, y);
  const auto act = static_cast<fw::Activation>(at.activation);

  // Floats oneDNN has no kernel for here are widened to f32 (exact): f16
  // always, bf16 on CPUs without AVX-512.
  const bool f16 = x0.dtype == fw::DType::kF16 || (x0.dtype == fw::DType::kBF16 && !onednn_has_bf16());
  if (f16 && (depthwise_nhwc_16(e, g, at, x0, w0, bias, y) || banded_nhwc_16(e, g, at, x0, w0, bias, y))) return {};
  const View x = f16 ? widened(e, x0, Staged::kX) : x0;
  std::uint64_t serial = 0;
  const View w = f16 ? widened_weights(e, w0, Staged::kW, &serial) : w0;
  View b = bias;
  if (bias.present() && (bias.dtype == fw::DType::kF16 || (bias.dtype != x.dtype && bias.dtype != fw::DType::kF32)))
    b = widened(e, bias, Staged::kBias);

  // oneDNN writes straight into y when y is f32/bf16 and no activation
  // follows, or y is dense f32 (the activation then runs in place);
  // otherwise into an f32 scratch that the loop below finishes.
  const bool in_place_act = y.dtype == fw::DType::kF32 && y.contiguous();
  // oneDNN 2.6's brgconv drops the bias of an output whose window lies all
  // in the padding when it adds y (its sum post-op): such a convolution
  // accumulates while the scratch is finished instead.
  const bool accumulate = at.accumulate != 0;
  const bool empty_window = accumulate && (fw::first_empty_window(g.h, g.oh, g.kh, g.sh, g.dh, g.pt) != UINT64_MAX ||
                                           fw::first_empty_window(g.w, g.ow, g.kw, g.sw, g.dw, g.pl) != UINT64_MAX);
  const bool direct =
      !f16 && (act == fw::Activation::kNone || in_place_act) && !(accumulate && (empty_window || g.c == 0));
  float* scratch = nullptr;  // every element written by oneDNN or the loop below
  void* out = y.data;
  dt yt = dnnl_type(y.dtype);
  if (!direct) {
    scratch = e.staged(Staged::kY, g.n * g.o * g.oh * g.ow);
    out = scratch;
    yt = dt::f32;
  }
  const dt xt = dnnl_type(x.dtype);
  // Accumulating (ConvAttrs::accumulate): what y holds is added after the
  // bias, before the activation; by oneDNN or grouped_f32 where they write
  // y, else when the scratch is finished below.
  bool done = grouped_f32(e, g, x, w, b.present() ? &b : nullptr, y, out, accumulate) ||
              dnnl_conv(e, g, x, xt, w, w.data, xt, b.present() ? &b : nullptr, y, yt, out, nullptr, nullptr, false,
                        serial, accumulate && out == y.data);
  if (!done) {
    // Reference: direct loops, f32 accumulation in (c, kh, kw) order.
    if (direct) {
      scratch = e.staged(Staged::kY, g.n * g.o * g.oh * g.ow);
      out = scratch;
    }
    const std::uint64_t og = g.o / g.groups, cg = g.c / g.groups;
    e.pool().parallel_for(g.n * g.o, [&](std::uint64_t begin, std::uint64_t end) {
      for (std::uint64_t no = begin; no < end; ++no) {
        const std::uint64_t ni = no / g.o, oi = no % g.o, gi = oi / og;
        for (std::uint64_t r = 0; r < g.oh; ++r)
          for (std::uint64_t col = 0; col < g.ow; ++col) {
            float s = b.present() ? load_float(b.at(oi * b.strides[0]), b.dtype) : 0.0f;
            for (std::uint64_t ci = 0; ci < cg; ++ci)
              for (std::uint64_t a = 0; a < g.kh; ++a) {
                const std::int64_t ih = g.in_row(r, a);
                if (ih < 0 || ih >= static_cast<std::int64_t>(g.h)) continue;
                for (std::uint64_t bb = 0; bb < g.kw; ++bb) {
                  const std::int64_t iw = g.in_col(col, bb);
                  if (iw < 0 || iw >= static_cast<std::int64_t>(g.w)) continue;
                  s += load_float(x.at(g.act(x, ni, gi * cg + ci, static_cast<std::uint64_t>(ih),
                                             static_cast<std::uint64_t>(iw))),
                                  x.dtype) *
                       load_float(w.at(Geometry::wgt(w, oi, ci, a, bb)), w.dtype);
                }
              }
            const std::uint64_t dense =
                g.nhwc ? ((ni * g.oh + r) * g.ow + col) * g.o + oi : ((ni * g.o + oi) * g.oh + r) * g.ow + col;
            scratch[dense] = s;
          }
      }
    });
    done = true;
  }
  if (out == y.data) {
    if (act != fw::Activation::kNone) {
      auto* p = reinterpret_cast<float*>(y.data);
      e.pool().parallel_for(
          y.elements(),
          [&](std::uint64_t begin, std::uint64_t end) {
            activate_span(act, at.act_alpha, at.act_beta, p + begin, end - begin);
          },
          16384);
    }
    return {};
  }
  // Finish from the f32 scratch (dense, y's layout): activation, conversion.
  if (y.contiguous() && (y.dtype == fw::DType::kBF16 || y.dtype == fw::DType::kF16)) {
    auto* dst = reinterpret_cast<std::uint16_t*>(y.data);
    const bool bf16 = y.dtype == fw::DType::kBF16;
    e.pool().parallel_for(y.elements(), [&](std::uint64_t begin, std::uint64_t end) {
      // A block at a time, narrowed while the activation's output is still
      // in the first-level cache: one pass over the scratch, not two.
      constexpr std::uint64_t kBlock = 2048;
      float held[kBlock];
      for (std::uint64_t b0 = begin; b0 < end; b0 += kBlock) {
        const std::uint64_t n = std::min(kBlock, end - b0);
        if (accumulate) {
          if (bf16)
            simd::widen_bf16(dst + b0, held, n);
          else
            simd::widen_f16(dst + b0, held, n);
          for (std::uint64_t i = 0; i < n; ++i) scratch[b0 + i] += held[i];
        }
        activate_span(act, at.act_alpha, at.act_beta, scratch + b0, n);
        if (bf16)
          simd::narrow_bf16(scratch + b0, dst + b0, n);
        else
          simd::narrow_f16(scratch + b0, dst + b0, n);
      }
    });
    return {};
  }
  const View* views[1] = {&y};
  e.pool().parallel_for(y.elements(), [&](std::uint64_t begin, std::uint64_t end) {
    std::uint64_t i = begin;
    for_each_index(y.shape, y.rank, views, begin, end, [&](const std::uint64_t* off) {
      const float out_value = accumulate ? scratch[i++] + load_float(y.at(off[0]), y.dtype) : scratch[i++];
      store_float(y.at(off[0]), y.dtype, activate(act, at.act_alpha, at.act_beta, out_value));
    });
  });
  return {};
}

// acc (y's shape, dense) = sum over valid taps of (x - xz)(w - wz), exact in
// int32. With oneDNN: S = conv(x, w') on raw values (zero padding), w' = w
// shifted to s8 for u8 weights, then
//   acc = S + 128*X - wz*X - xz*Wv + xz*wz*N
// where, per output position, X sums x over the valid taps, Wv sums w[o]
// over the valid taps and N counts them.
namespace {

// For an input zero point's correction: wtap[o * kh * kw + tap], the sum
// of output channel o's weights at that tap over its group's input
// channels, and wfull[o], that over all taps. Dense s8 weights (every
// model's) are read in memory order, each tap's running sum in int32
// (|w| <= 128 over at most 2^24 channels), a 1x1 kernel's in the vector
// loop: a Linear layer's 1280 x 1000 took 2 ms through the general loop.
void weight_sums(const Geometry& g, const View& w, std::vector<std::int64_t>& wtap, std::vector<std::int64_t>& wfull) {
  const std::uint64_t cg = g.c / g.groups, ntaps = g.kh * g.kw;
  wtap.assign(g.o * ntaps, 0);
  wfull.assign(g.o, 0);
  if (w.dtype == fw::DType::kI8 && w.strides[3] == 1 && w.strides[2] == g.kw && w.strides[1] == ntaps &&
      w.strides[0] == cg * ntaps) {
    const auto* wb = reinterpret_cast<const std::int8_t*>(w.data);
    std::vector<std::int32_t> sums(ntaps);
    for (std::uint64_t oi = 0; oi < g.o; ++oi) {
      const std::int8_t* p = wb + oi * cg * ntaps;
      std::fill(sums.begin(), sums.end(), 0);
      if (ntaps == 1) {
        sums[0] = static_cast<std::int32_t>(simd::sum_i8(p, cg));
      } else {
        for (std::uint64_t ci = 0; ci < cg; ++ci)
          for (std::uint64_t t = 0; t < ntaps; ++t) sums[t] += p[ci * ntaps + t];
      }
      for (std::uint64_t t = 0; t < ntaps; ++t) {
        wtap[oi * ntaps + t] = sums[t];
        wfull[oi] += sums[t];
      }
    }
    return;
  }
  for (std::uint64_t oi = 0; oi < g.o; ++oi)
    for (std::uint64_t a = 0; a < g.kh; ++a)
      for (std::uint64_t b = 0; b < g.kw; ++b) {
        std::int64_t s = 0;
        for (std::uint64_t ci = 0; ci < cg; ++ci) s += load_int(w.at(Geometry::wgt(w, oi, ci, a, b)), w.dtype);
        wtap[(oi * g.kh + a) * g.kw + b] = s;
        wfull[oi] += s;
      }
}

// A 1x1 convolution over a few positions: a Linear layer (a network's
// classifier, 1280 x 1000 in EfficientNet-B0) or a squeeze-and-excitation
// block's, on a 1x1 image. Each output is a dot product of a position's
// channels with an output channel's s8 weights, read in place
// (simd::dot_rows_i8), exact in int32 on every level. oneDNN made such a
// layer a kernel call for a row or two, and where its sums could pass 2^24
// (the classifier's) two, one per nibble of the input, with the weights'
// sums for the input's zero point made again each run: EfficientNet-B0's
// classifier took 240 us a run, and takes 50 this way. One position (a
// batch of one) always runs this way: a squeeze-and-excitation block's two
// layers on oneDNN cost its parallel region more than their arithmetic.
// Up to 8 (a batch of 8) run this way where oneDNN cannot take whole bytes
// (sums past 2^24, or no VNNI); where it can, its kernels were as fast or
// faster for 2 to 8 positions.
constexpr std::uint64_t kFewPositions = 8, kDotFirst = 1;

bool few_positions(const Geometry& g, const View& w) {
  return g.groups == 1 && g.kh == 1 && g.kw == 1 && g.pt + g.pl + g.pb + g.pr == 0 &&
         g.n * g.oh * g.ow <= kFewPositions && (g.nhwc || g.oh * g.ow == 1) && w.dtype == fw::DType::kI8 &&
         w.strides[1] == 1;
}
bool dot_first(const Geometry& g, const View& w) { return few_positions(g, w) && g.n * g.oh * g.ow <= kDotFirst; }

void few_positions_integer(TensorEngine& e, const Geometry& g, const View& x, const View& w, std::int64_t x_zero,
                           const View* wz, std::int32_t* acc) {
  const std::uint64_t positions = g.n * g.oh * g.ow;
  // Each position's channels less the zero point (|x - zero| <= 255), and
  // their sum for the weights' zero points.
  std::vector<std::int16_t> xs(positions * g.c);
  std::vector<std::int64_t> xsum(positions, 0);
  for (std::uint64_t p = 0; p < positions; ++p) {
    const std::uint64_t ni = p / (g.oh * g.ow), r = p / g.ow % g.oh, col = p % g.ow;
    const auto ih = static_cast<std::uint64_t>(g.in_row(r, 0)), iw = static_cast<std::uint64_t>(g.in_col(col, 0));
    for (std::uint64_t ci = 0; ci < g.c; ++ci) {
      const auto v = static_cast<std::int16_t>(load_int(x.at(g.act(x, ni, ci, ih, iw)), x.dtype) - x_zero);
      xs[p * g.c + ci] = v;
      xsum[p] += v;
    }
  }
  // Blocks of output channels whose weights stay in the first-level cache
  // while every position reads them.
  constexpr std::uint64_t kRows = 16;
  const std::uint64_t blocks = (g.o + kRows - 1) / kRows;
  const std::uint64_t grain = std::max<std::uint64_t>(1, 65536 / std::max<std::uint64_t>(1, kRows * g.c * positions));
  const auto* wb = reinterpret_cast<const std::int8_t*>(w.data);
  const auto stride = static_cast<std::size_t>(w.strides[0]);
  e.pool().parallel_for(
      blocks,
      [&](std::uint64_t begin, std::uint64_t end) {
        for (std::uint64_t b = begin; b < end; ++b) {
          const std::uint64_t o0 = b * kRows, rows = std::min(kRows, g.o - o0);
          for (std::uint64_t p = 0; p < positions; ++p)
            simd::dot_rows_i8(acc + p * g.o + o0, xs.data() + p * g.c, wb + o0 * stride, stride, g.c, rows);
        }
      },
      grain);
  if (!wz) return;
  // (x - xz)(w - wz) summed: the products with w, less wz times x's sum.
  for (std::uint64_t oi = 0; oi < g.o; ++oi) {
    const std::int64_t wzo = load_int(wz->at(oi * wz->strides[0]), wz->dtype);
    for (std::uint64_t p = 0; wzo != 0 && p < positions; ++p) {
      std::int32_t& out = acc[p * g.o + oi];
      out = static_cast<std::int32_t>(static_cast<std::uint32_t>(out) -
                                      static_cast<std::uint32_t>(static_cast<std::uint64_t>(wzo * xsum[p])));
    }
  }
}

}  // namespace

void conv_integer(TensorEngine& e, const fw::ConvAttrs& at, const View& x, const View& w, const View* xz,
                  const View* wz, std::int32_t* acc) {
  View y{};
  y.rank = 4;
  const bool nhwc = at.layout == static_cast<std::uint32_t>(fw::Layout::kNHWC);
  {
    // y's geometry from the op's rules (the decoder checked y has it).
    const std::uint64_t h = nhwc ? x.shape[1] : x.shape[2], wd = nhwc ? x.shape[2] : x.shape[3];
    const std::uint64_t oh =
        fw::window_output(h, w.shape[2], at.stride[0], at.dilation[0], at.pad[0], at.pad[2], false);
    const std::uint64_t ow =
        fw::window_output(wd, w.shape[3], at.stride[1], at.dilation[1], at.pad[1], at.pad[3], false);
    const std::uint64_t n = x.shape[0], o = w.shape[0];
    const std::uint64_t shape[4] = {n, nhwc ? oh : o, nhwc ? ow : oh, nhwc ? o : ow};
    std::uint64_t step = 1;
    for (int d = 3; d >= 0; --d) {
      y.shape[d] = shape[d];
      y.strides[d] = step;
      step *= shape[d];
    }
  }
  const Geometry g(at, x, w, y);
  const std::uint64_t og = g.o / g.groups, cg = g.c / g.groups;
  if (g.n * g.o * g.oh * g.ow == 0) return;
  if (g.c == 0) {  // sums over no input channels: 0, whatever the zero points (none is read)
    std::fill(acc, acc + g.n * g.o * g.oh * g.ow, 0);
    return;
  }
  std::int64_t x_zero = xz ? load_int(xz->data, xz->dtype) : 0;
  const bool few = few_positions(g, w);
  if (dot_first(g, w)) return few_positions_integer(e, g, x, w, x_zero, wz, acc);
  auto w_zero = [&](std::uint64_t oi) -> std::int64_t {
    return wz ? load_int(wz->at(oi * wz->strides[0]), wz->dtype) : 0;
  };
  auto own_kernels = [&] {
    std::vector<std::int16_t> wzs(g.o);
    for (std::uint64_t oi = 0; oi < g.o; ++oi) wzs[oi] = static_cast<std::int16_t>(w_zero(oi));
    conv_integer_exact(e, g, x, w, static_cast<std::int32_t>(x_zero), wzs, acc);
  };
  // Without VNNI, oneDNN is exact only on the input's nibbles, or on a u8
  // input's whole bytes in its depthwise kernels (an s8 one goes as u8).
  const bool whole_bytes = onednn_int8_exact(e.isa());
  const bool depthwise = depthwise_whole_bytes(e.isa(), g, fw::DType::kU8);
  if (!few && sums_as_f32(e, g) && conv_integer_as_f32(e, g, x, w, x_zero, wz, y, acc)) return;
  if (!whole_bytes && !depthwise && !onednn_int8_exact_on_nibbles(e.isa()))
    return few ? few_positions_integer(e, g, x, w, x_zero, wz, acc) : own_kernels();
  auto dense = [&](std::uint64_t ni, std::uint64_t oi, std::uint64_t r, std::uint64_t col) {
    return nhwc ? ((ni * g.oh + r) * g.ow + col) * g.o + oi : ((ni * g.o + oi) * g.oh + r) * g.ow + col;
  };

  // S on oneDNN: weights as s8 (u8 shifted by -128, dense copy).
  std::vector<std::int8_t> shifted;
  const void* wdata = w.data;
  View ws = w;
  if (w.dtype == fw::DType::kU8) {
    shifted.resize(w.elements());
    std::uint64_t i = 0;
    for (std::uint64_t oi = 0; oi < g.o; ++oi)
      for (std::uint64_t ci = 0; ci < cg; ++ci)
        for (std::uint64_t a = 0; a < g.kh; ++a)
          for (std::uint64_t b = 0; b < g.kw; ++b)
            shifted[i++] =
                static_cast<std::int8_t>(static_cast<std::uint8_t>(*w.at(Geometry::wgt(w, oi, ci, a, b))) ^ 0x80);
    wdata = shifted.data();
    ws.dtype = fw::DType::kI8;
    ws.strides[3] = 1;
    ws.strides[2] = g.kw;
    ws.strides[1] = g.kh * g.kw;
    ws.strides[0] = cg * g.kh * g.kw;
  }
  // oneDNN is exact only where every sum stays within 2^24 (|x - zero
  // point| <= 255 on every path below), and without VNNI only on the
  // input's nibbles. Past 2^24, the input's nibbles
  // (dnnl_conv_s32_nibbles) keep it there while their sums stay within
  // 2^24; past that too, the engine's own exact kernels run it. (Slicing
  // the reduction over input channels instead makes an NHWC input a
  // strided view that oneDNN runs slowly: ResNet-50's 3x3 convolutions at
  // 14x14 and 7x7 took 300 ms each.)
  const std::uint64_t wsum = weight_abs_sum_max(e, g, ws, wdata, wdata == w.data);
  const bool within = sums_within_2_24(wsum, 255), direct = whole_bytes && within;
  if (few && !direct) return few_positions_integer(e, g, x, w, x_zero, wz, acc);
  const bool nibbles = !direct && onednn_int8_exact_on_nibbles(e.isa()) && sums_within_2_24(wsum, 15);
  if (!direct && !(depthwise && within) && !nibbles) return own_kernels();
  // Whether oneDNN takes input `in` on whole bytes (depthwise: on its
  // depthwise kernels only).
  const auto whole = [&](const View& in) { return direct || (within && depthwise_whole_bytes(e.isa(), g, in.dtype)); };
  // Weights with no zero points: oneDNN subtracts the input's zero point
  // itself and nothing is left to correct.
  bool any_wz = false;
  for (std::uint64_t oi = 0; oi < g.o && wz; ++oi) any_wz = any_wz || w_zero(oi) != 0;
  if (whole(x) && w.dtype == fw::DType::kI8 && !any_wz && x_zero != 0) {
    const auto zero = static_cast<std::int32_t>(x_zero);
    if (dnnl_conv_s32(e, g, x, dnnl_type(x.dtype), w, w.data, y, acc, &zero, !direct)) return;
  }
  // Whole bytes where they are exact; else (or where oneDNN chose no
  // depthwise kernel) a u8 input's nibbles.
  const auto on_onednn = [&](const View& in) {
    if (whole(in) && dnnl_conv_s32(e, g, in, dnnl_type(in.dtype), ws, wdata, y, acc, nullptr, !direct)) return true;
    return nibbles && in.dtype == fw::DType::kU8 && dnnl_conv_s32_nibbles(e, g, in, ws, wdata, y, acc);
  };
  bool onednn = on_onednn(x);
  // oneDNN refuses some s8 inputs (see dnnl_conv()); as u8, x + 128 with
  // the zero point moved by as much, they give the same differences.
  View xin = x;  // the input as the sums below read it
  std::vector<std::byte> flipped;
  if (!onednn && x.dtype == fw::DType::kI8 && x.elements() != 0) {
    std::uint64_t span = 1;
    for (std::uint32_t d = 0; d < x.rank; ++d) span += (x.shape[d] - 1) * x.strides[d];
    flipped.resize(span);
    for (std::uint64_t i = 0; i < span; ++i) flipped[i] = x.data[i] ^ std::byte{0x80};
    View u = x;
    u.dtype = fw::DType::kU8;
    u.data = flipped.data();
    if (on_onednn(u)) {
      onednn = true;
      xin = u;
      x_zero += 128;
    }
  }
  if (!onednn && !direct) return own_kernels();  // the reference loop below only where VNNI is
  if (!onednn) {
    // Reference: the definition, directly.
    e.pool().parallel_for(g.n * g.o, [&](std::uint64_t begin, std::uint64_t end) {
      for (std::uint64_t no = begin; no < end; ++no) {
        const std::uint64_t ni = no / g.o, oi = no % g.o, gi = oi / og;
        const std::int64_t wzo = w_zero(oi);
        for (std::uint64_t r = 0; r < g.oh; ++r)
          for (std::uint64_t col = 0; col < g.ow; ++col) {
            std::uint32_t s = 0;
            for (std::uint64_t ci = 0; ci < cg; ++ci)
              for (std::uint64_t a = 0; a < g.kh; ++a) {
                const std::int64_t ih = g.in_row(r, a);
                if (ih < 0 || ih >= static_cast<std::int64_t>(g.h)) continue;
                for (std::uint64_t b = 0; b < g.kw; ++b) {
                  const std::int64_t iw = g.in_col(col, b);
                  if (iw < 0 || iw >= static_cast<std::int64_t>(g.w)) continue;
                  const std::int64_t xv = load_int(xin.at(g.act(xin, ni, gi * cg + ci, static_cast<std::uint64_t>(ih),
                                                                static_cast<std::uint64_t>(iw))),
                                                   xin.dtype) -
                                          x_zero;
                  const std::int64_t wv = load_int(w.at(Geometry::wgt(w, oi, ci, a, b)), w.dtype) - wzo;
                  s += static_cast<std::uint32_t>(xv * wv);
                }
              }
            acc[dense(ni, oi, r, col)] = static_cast<std::int32_t>(s);
          }
      }
    });
    return;
  }

  // Corrections over the valid taps of each output position.
  const bool shifted_w = w.dtype == fw::DType::kU8;
  const bool need_x = shifted_w || any_wz;
  // Per output channel and tap: sum of w over the group's input channels;
  // and over all taps, for positions whose window lies wholly inside.
  std::vector<std::int64_t> wtap, wfull;
  if (x_zero != 0) weight_sums(g, w, wtap, wfull);
  if (x_zero == 0 && !need_x) return;
  std::vector<std::int64_t> wz_all(g.o);
  for (std::uint64_t oi = 0; oi < g.o; ++oi) wz_all[oi] = w_zero(oi);
  // With no per-position input sums, a window wholly inside the image gets
  // the same correction for every position: -xz * sum(w[o]).
  std::vector<std::int32_t> interior(g.o, 0);
  for (std::uint64_t oi = 0; oi < g.o && x_zero != 0; ++oi)
    interior[oi] = static_cast<std::int32_t>(static_cast<std::uint32_t>(
        -x_zero * wfull[oi] + x_zero * wz_all[oi] * static_cast<std::int64_t>(g.kh * g.kw * cg)));
  e.pool().parallel_for(g.n * g.oh, [&](std::uint64_t begin, std::uint64_t end) {
    std::vector<std::int64_t> xsum(g.groups);
    std::vector<std::int32_t> fix(g.o);
    for (std::uint64_t nr = begin; nr < end; ++nr) {
      const std::uint64_t ni = nr / g.oh, r = nr % g.oh;
      for (std::uint64_t col = 0; col < g.ow; ++col) {
        if (!need_x && g.nhwc && g.in_row(r, 0) >= 0 && g.in_row(r, g.kh - 1) < static_cast<std::int64_t>(g.h) &&
            g.in_col(col, 0) >= 0 && g.in_col(col, g.kw - 1) < static_cast<std::int64_t>(g.w)) {
          simd::add_i32(&acc[dense(ni, 0, r, col)], interior.data(), g.o);
          continue;
        }
        std::int64_t taps = 0;
        bool inside = true;
        std::fill(xsum.begin(), xsum.end(), 0);
        for (std::uint64_t a = 0; a < g.kh; ++a) {
          const std::int64_t ih = g.in_row(r, a);
          if (ih < 0 || ih >= static_cast<std::int64_t>(g.h)) {
            inside = false;
            continue;
          }
          for (std::uint64_t b = 0; b < g.kw; ++b) {
            const std::int64_t iw = g.in_col(col, b);
            if (iw < 0 || iw >= static_cast<std::int64_t>(g.w)) {
              inside = false;
              continue;
            }
            ++taps;
            if (need_x)
              for (std::uint64_t c = 0; c < g.c; ++c)
                xsum[c / cg] +=
                    load_int(xin.at(g.act(xin, ni, c, static_cast<std::uint64_t>(ih), static_cast<std::uint64_t>(iw))),
                             xin.dtype);
          }
        }
        // fix[o] = 128*X (u8 weights) - wz*X - xz*Wv + xz*wz*N, mod 2^32.
        for (std::uint64_t oi = 0; oi < g.o; ++oi) {
          const std::int64_t wzo = wz_all[oi], xs = need_x ? xsum[oi / og] : 0;
          std::int64_t f = (shifted_w ? 128 * xs : 0) - wzo * xs + x_zero * wzo * taps * static_cast<std::int64_t>(cg);
          if (x_zero != 0) {
            std::int64_t wv = 0;
            if (inside) {
              wv = wfull[oi];
            } else {
              for (std::uint64_t a = 0; a < g.kh; ++a) {
                const std::int64_t ih = g.in_row(r, a);
                if (ih < 0 || ih >= static_cast<std::int64_t>(g.h)) continue;
                for (std::uint64_t b = 0; b < g.kw; ++b) {
                  const std::int64_t iw = g.in_col(col, b);
                  if (iw >= 0 && iw < static_cast<std::int64_t>(g.w)) wv += wtap[(oi * g.kh + a) * g.kw + b];
                }
              }
            }
            f -= x_zero * wv;
          }
          fix[oi] = static_cast<std::int32_t>(static_cast<std::uint32_t>(f));
        }
        if (g.nhwc) {  // the channels of one position are contiguous
          std::int32_t* out = &acc[dense(ni, 0, r, col)];
          for (std::uint64_t oi = 0; oi < g.o; ++oi)
            out[oi] =
                static_cast<std::int32_t>(static_cast<std::uint32_t>(out[oi]) + static_cast<std::uint32_t>(fix[oi]));
        } else {
          for (std::uint64_t oi = 0; oi < g.o; ++oi) {
            std::int32_t& out = acc[dense(ni, oi, r, col)];
            out = static_cast<std::int32_t>(static_cast<std::uint32_t>(out) + static_cast<std::uint32_t>(fix[oi]));
          }
        }
      }
    }
  });
}

bool qlinear_conv_as_f32(TensorEngine& e, const fw::ConvAttrs& at, const View& x, const View& w, const View* xz,
                         const View* wz, const View& y, const std::vector<float>& multipliers, const std::int32_t* bias,
                         std::int32_t y_zero) {
  const Geometry g(at, x, w, y);
  if (!g.nhwc || !y.contiguous() || g.n * g.o * g.oh * g.ow == 0 || g.c == 0 || multipliers.size() != g.o ||
      !sums_as_f32(e, g) || few_positions(g, w))
    return false;
  const std::uint64_t positions = g.n * g.oh * g.ow;
  const float* ys = integer_sums_as_f32(e, g, x, w, xz ? load_int(xz->data, xz->dtype) : 0, wz, y);
  if (!ys) return false;
  // Each position's sums to int32 (exact) and requantised while they are
  // in the first-level cache: requantize()'s arithmetic, one pass.
  const std::int32_t lo = int_min(y.dtype), hi = int_max(y.dtype);
  auto* out = reinterpret_cast<std::uint8_t*>(y.data);
  e.pool().parallel_for(
      positions,
      [&](std::uint64_t begin, std::uint64_t end) {
        thread_local std::vector<std::int32_t> sums;
        sums.resize(g.o);
        for (std::uint64_t p = begin; p < end; ++p) {
          const float* row = ys + p * g.o;
          for (std::uint64_t oi = 0; oi < g.o; ++oi) sums[oi] = static_cast<std::int32_t>(row[oi]);
          simd::requantize_u8(sums.data(), bias, multipliers.data(), out + p * g.o, g.o, y_zero, lo, hi);
        }
      },
      std::max<std::uint64_t>(1, 16384 / g.o));
  return true;
}

bool qlinear_conv_fused(TensorEngine& e, const fw::ConvAttrs& at, const View& x, const View& w, const View* xz,
                        const View* wz, const View& y, const std::vector<float>& multipliers, std::int32_t y_zero) {
  const Geometry g(at, x, w, y);
  if (dot_first(g, w)) return false;  // conv_integer's dot products are the faster
  // Its int8 kernels are exact with VNNI, and without it only its
  // depthwise ones, on u8 inputs.
  const bool depthwise_kernel = depthwise_whole_bytes(e.isa(), g, x.dtype);
  if (!onednn_int8_exact(e.isa()) && !depthwise_kernel) return false;
  if (w.dtype != fw::DType::kI8 || (x.dtype != fw::DType::kU8 && x.dtype != fw::DType::kI8) ||
      (y.dtype != fw::DType::kU8 && y.dtype != fw::DType::kI8))
    return false;
  for (float m : multipliers)
    if (!std::isfinite(m)) return false;
  if (g.n * g.o * g.oh * g.ow == 0 || multipliers.size() != g.o) return false;
  for (std::uint64_t oi = 0; wz && oi < g.o; ++oi)
    if (load_int(wz->at(oi * wz->strides[0]), wz->dtype) != 0) return false;
  // |x - zero point| <= 255: the sums must stay within 2^24 for the f32
  // conversion before scaling to be exact, in oneDNN as in requantize().
  if (!sums_within_2_24(weight_abs_sum_max(e, g, w, w.data, true), 255)) return false;
  const std::int32_t x_zero = xz ? static_cast<std::int32_t>(load_int(xz->data, xz->dtype)) : 0;
  const FusedRequant rq{&multipliers, y_zero};
  return dnnl_conv(e, g, x, dnnl_type(x.dtype), w, w.data, dt::s8, nullptr, y, dnnl_type(y.dtype), y.data,
                   x_zero != 0 ? &x_zero : nullptr, &rq, depthwise_kernel);
}

}  // namespace tpuhal::sim::tensor
