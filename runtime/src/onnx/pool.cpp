// MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool (4-D, 3-D as
// H = 1, 5-D as two 2-D pools): max_pool2d and avg_pool2d; in int8, a 4-D
// max of a u8 value stays u8 (NHWC), the max of u8 values keeping their
// scale. RoiAlign: the board's roi_align, in the model's float type, the
// regions in f32 (in fp16, a 1080p frame's coordinates would step by a pixel).
#include <algorithm>
#include <cmath>

#include "onnx/importer.hpp"
#include "onnx/lowerer.hpp"
#include "onnx/window.hpp"
#include "tpuhal/fw/roi_align.h"

namespace tpuhal::rt::detail {
namespace {

using PoolAttrs = onnx_attrs::WindowAttrs;

// A 3-D pool of [N, C, D, H, W] as two 2-D ones: `plane` over (H, W) of
// the [N, C * D, H, W] view, then `depth` (a kd x 1 window) over the
// [N * C, 1, D, OH * OW] view of its result. Both kinds separate so: the
// max of the planes' maxima is the window's, and an average's divisor (the
// window's positions inside the input, or inside the padded input with
// count_include_pad) is the product of the axes' own.
struct Pool3d {
  ops::Pool2dOptions plane, depth;
};

Pool3d pool3d_options(const PoolAttrs& a, const std::vector<std::int64_t>& x) {
  const bool given = a.kernel_shape && a.kernel_shape->size() == 3;
  const std::array<std::int64_t, 3> k =
      given ? std::array{(*a.kernel_shape)[0], (*a.kernel_shape)[1], (*a.kernel_shape)[2]}
            : std::array<std::int64_t, 3>{1, 1, 1};
  const Window3d win = window_3d(a, x, k);
  const auto& s = win.strides;
  const auto& d = win.dilations;
  const auto& p = win.pads;
  const auto u = [](std::int64_t v) { return onnx_attrs::u32(v); };
  Pool3d o;
  for (ops::Pool2dOptions* q : {&o.plane, &o.depth}) {
    q->ceil_mode = a.ceil_mode;
    q->count_include_pad = a.count_include_pad;
  }
  o.plane.kernel = {u(k[1]), u(k[2])};
  o.plane.strides = {s[1], s[2]};
  o.plane.dilations = {d[1], d[2]};
  o.plane.pads = {p[1], p[2], p[4], p[5]};
  o.depth.kernel = {u(k[0]), 1};
  o.depth.strides = {s[0], 1};
  o.depth.dilations = {d[0], 1};
  o.depth.pads = {p[0], 0, p[3], 0};
  return o;
}

// What the pooling ops take: each pad smaller than its window.
void check_pads(const Importer& im, const Node& n, const ops::Pool2dOptions& o) {
  for (int k = 0; k < 2; ++k) {
    const std::uint64_t window = std::uint64_t{o.dilations[k]} * (o.kernel[k] - 1) + 1;
    if (o.pads[k] >= window || o.pads[k + 2] >= window)
      im.fail_node(n, "pads (" + std::to_string(o.pads[k]) + ", " + std::to_string(o.pads[k + 2]) +
                          ") must be smaller than the window (" + std::to_string(window) + ")");
  }
}

std::int64_t pooled(std::int64_t in, const ops::Pool2dOptions& o, int axis) {
  const auto a = static_cast<std::size_t>(axis);
  return pool_out(in, o.kernel[a], o.strides[a], o.dilations[a], o.pads[a], o.pads[a + 2], o.ceil_mode);
}

Value infer_pool3d(Importer& im, Node& n, const std::vector<std::int64_t>& x) {
  const auto& a = n.attr<PoolAttrs>();
  if (!a.kernel_shape) im.fail_node(n, "no kernel_shape");
  check_window(im, n, a, 3);
  const Pool3d o = pool3d_options(a, x);
  check_pads(im, n, o.depth);
  check_pads(im, n, o.plane);
  Value out;
  out.shape = {x[0], x[1], pooled(x[2], o.depth, 0), pooled(x[3], o.plane, 0), pooled(x[4], o.plane, 1)};
  check_window_fits(im, n, x, out.shape,
                    std::to_string(o.depth.kernel[0]) + "x" + std::to_string(o.plane.kernel[0]) + "x" +
                        std::to_string(o.plane.kernel[1]) + " window");
  return out;
}

Value infer_pool(Importer& im, Node& n) {
  const auto& a = n.attr<PoolAttrs>();
  const auto& x = im.in(n, 0).shape;
  const bool one_d = x.size() == 3;  // [N, C, L]: pooled as H = 1
  if (a.global && x.size() == 5) {   // [N, C, D, H, W]: pooled as [N, C, 1, D * H * W]
    Value out;
    out.shape = {x[0], x[1], 1, 1, 1};
    return out;
  }
  if (!one_d && x.size() != 4 && x.size() != 5)
    im.unsupported(n, "input of rank " + std::to_string(x.size()) +
                          "; the compiler pools 3-D (NCL), 4-D (NCHW) and 5-D (NCDHW) tensors");
  if (a.storage_order != 0) im.fail(Status::Unsupported, "node '" + n.name + "' (MaxPool): storage_order 1");
  if (x.size() == 5) return infer_pool3d(im, n, x);
  if (!a.global) {
    if (!a.kernel_shape) im.fail_node(n, "no kernel_shape");
    check_window(im, n, a, one_d ? 1 : 2);
  }
  const auto o = onnx_attrs::pool_options(a, x);
  check_pads(im, n, o);
  const std::int64_t ow =
      pool_out(x.back(), o.kernel[1], o.strides[1], o.dilations[1], o.pads[1], o.pads[3], o.ceil_mode);
  Value out;
  out.shape =
      one_d ? std::vector<std::int64_t>{x[0], x[1], ow}
            : std::vector<std::int64_t>{
                  x[0], x[1],
                  pool_out(x[2], o.kernel[0], o.strides[0], o.dilations[0], o.pads[0], o.pads[2], o.ceil_mode), ow};
  check_window_fits(
      im, n, x, out.shape,
      (one_d ? std::to_string(o.kernel[1]) : std::to_string(o.kernel[0]) + "x" + std::to_string(o.kernel[1])) +
          " window");
  return out;
}

bool is_max(const Node& n) { return n.op == "MaxPool" || n.op == "GlobalMaxPool"; }

nlohmann::json pool_json(const ops::Pool2dOptions& o, Layout layout) {
  return {{"kernel", o.kernel},
          {"strides", o.strides},
          {"dilations", o.dilations},
          {"pads", o.pads},
          {"ceil_mode", o.ceil_mode},
          {"count_include_pad", o.count_include_pad},
          {"layout", layout == Layout::NHWC ? "nhwc" : "nchw"}};
}

// A global pool of [N, C, D, H, W]: the 2-D one of its [N, C, 1, D * H * W] view.
void lower_global_pool_5d(Lowerer& l, const Node& n) {
  const auto& xs = l.shape_of(n.inputs[0]);
  const std::vector<std::int64_t> flat{xs[0], xs[1], 1, xs[2] * xs[3] * xs[4]}, one{xs[0], xs[1], 1, 1};
  const auto o = onnx_attrs::pool_options(n.attr<PoolAttrs>(), flat);
  const DType t = l.float_type();
  const auto x = l.dense(l.get(n.inputs[0], t), t, xs);
  const auto y = l.produce(n.output, t, l.shape_of(n.output));
  l.op(is_max(n) ? "max_pool2d" : "avg_pool2d", n.name,
       {{"x", l.dg().add_view(x, flat)}, {"y", l.dg().add_view(y, one)}}, pool_json(o, Layout::NCHW));
}

// A 3-D MaxPool or AveragePool (pool3d_options), in float in every
// precision. A step whose window is one element with stride 1 and no
// padding (the depth step of a 1 x kh x kw window, as video networks'
// stems have) is left out.
void lower_pool3d(Lowerer& l, const Node& n) {
  const auto& xs = l.shape_of(n.inputs[0]);
  const auto& shape = l.shape_of(n.output);
  const Pool3d o = pool3d_options(n.attr<PoolAttrs>(), xs);
  const char* kind = is_max(n) ? "max_pool2d" : "avg_pool2d";
  const auto none = [](const ops::Pool2dOptions& q) {
    return q.kernel == std::array<std::uint32_t, 2>{1, 1} && q.strides == std::array<std::uint32_t, 2>{1, 1} &&
           q.pads == std::array<std::uint32_t, 4>{};
  };
  const bool plane = !none(o.plane), depth = !none(o.depth);
  const DType t = l.float_type();
  const auto x = l.dense(l.get(n.inputs[0], t), t, xs);
  const auto y = l.produce(n.output, t, shape);
  // The plane step's result, [N, C * D, OH, OW]: y itself without a depth step.
  const std::vector<std::int64_t> mid_shape{xs[0], xs[1] * xs[2], shape[3], shape[4]};
  std::int64_t mid = x;
  if (plane || !depth) {
    mid = depth ? l.dg().add_arena("", t, mid_shape) : l.dg().add_view(y, mid_shape);
    l.op(kind, n.name, {{"x", l.dg().add_view(x, {xs[0], xs[1] * xs[2], xs[3], xs[4]})}, {"y", mid}},
         pool_json(o.plane, Layout::NCHW));
  }
  if (depth) {
    const std::int64_t planes = xs[0] * xs[1], area = shape[3] * shape[4];
    l.op(
        kind, n.name,
        {{"x", l.dg().add_view(mid, {planes, 1, xs[2], area})}, {"y", l.dg().add_view(y, {planes, 1, shape[2], area})}},
        pool_json(o.depth, Layout::NCHW));
  }
}

void lower_pool(Lowerer& l, const Node& n) {
  const auto& shape = l.shape_of(n.output);
  const auto& xs = l.shape_of(n.inputs[0]);
  if (xs.size() == 5) {
    if (n.attr<PoolAttrs>().global)
      lower_global_pool_5d(l, n);
    else
      lower_pool3d(l, n);
    return;
  }
  if (n.op == "GlobalAveragePool" && l.qavgpool(n)) return;
  const auto o = onnx_attrs::pool_options(n.attr<PoolAttrs>(), xs);
  const bool max = is_max(n), one_d = xs.size() == 3;
  DType t = l.float_type();
  if (!one_d && l.int8() && max && l.reps.count(n.inputs[0]) && l.reps.at(n.inputs[0]).primary == DType::U8)
    t = DType::U8;
  std::map<std::string, std::int64_t> operands;
  // fp32: NHWC where the input is held so (the same bits: each output
  // meets its taps in the same order); int8 (other than a global average,
  // qavgpool's): in f32 NHWC, dequantized from the u8 NHWC input, rather
  // than transposed to NCHW.
  const bool f32_nhwc = !one_d && (l.held_float_nhwc(n.inputs[0]) || (l.int8() && l.held_nhwc(n.inputs[0])));
  if (t == DType::U8) {  // NHWC; the max of u8 values keeps their scale
    operands["x"] = l.get_nhwc(n.inputs[0]);
    operands["y"] = l.produce_nhwc(n.output, shape, l.reps.at(n.inputs[0]).q);
  } else if (f32_nhwc) {
    operands["x"] = l.get_nhwc_float(n.inputs[0]);
    operands["y"] = l.produce_nhwc_float(n.output, shape);
  } else {
    operands["x"] = l.get(n.inputs[0], t);
    operands["y"] = l.produce(n.output, t, shape);
    if (one_d) l.as_2d(operands, {{"x", &xs}, {"y", &shape}});
  }
  l.op(max ? "max_pool2d" : "avg_pool2d", n.name, operands,
       pool_json(o, t == DType::U8 || f32_nhwc ? Layout::NHWC : Layout::NCHW));
}

// RoiAlign's attributes. Opset 10 has no coordinate_transformation_mode and
// maps as output_half_pixel; opset 16 added it, half_pixel by default.
struct RoiAlignAttrs {
  std::string mode, coordinates;  // coordinates: "" where the node gives none
  std::int64_t height = 1, width = 1, sampling_ratio = 0;
  float spatial_scale = 1.0f;
  bool half_pixel = true;  // resolved by the opset
  static RoiAlignAttrs read(const Attrs& a) {
    return {a.s("mode", "avg"),       a.s("coordinate_transformation_mode", ""),
            a.i("output_height", 1),  a.i("output_width", 1),
            a.i("sampling_ratio", 0), a.f("spatial_scale", 1.0f)};
  }
};

// X [N, C, H, W], rois [R, 4], batch_indices [R] -> [R, C, output_height,
// output_width].
Value infer_roi_align(Importer& im, Node& n) {
  auto& a = n.attr<RoiAlignAttrs>();
  const auto& x = im.in(n, 0).shape;
  const auto& rois = im.in(n, 1).shape;
  const auto& idx = im.in(n, 2).shape;
  if (x.size() != 4) im.fail_node(n, "X has rank " + std::to_string(x.size()) + "; RoiAlign takes [N, C, H, W]");
  if (rois.size() != 2 || rois[1] != 4 || idx.size() != 1 || idx[0] != rois[0])
    im.fail_node(n, "rois " + dims_text(rois) + " and batch_indices " + dims_text(idx) + " must be [R, 4] and [R]");
  if (a.mode != "avg" && a.mode != "max") im.fail_node(n, "mode '" + a.mode + "'; expected avg or max");
  const std::string coordinates =
      a.coordinates.empty() ? (im.g.opset >= 16 ? "half_pixel" : "output_half_pixel") : a.coordinates;
  if (coordinates != "half_pixel" && coordinates != "output_half_pixel")
    im.fail_node(n, "coordinate_transformation_mode '" + coordinates + "'; expected half_pixel or output_half_pixel");
  a.half_pixel = coordinates == "half_pixel";
  if (a.height < 1 || a.width < 1)
    im.fail_node(n, "output " + std::to_string(a.height) + "x" + std::to_string(a.width) + "; both at least 1");
  if (a.sampling_ratio < 0 || a.sampling_ratio > 65536)
    im.fail_node(n, "sampling_ratio " + std::to_string(a.sampling_ratio) + "; expected 0 to 65536");
  if (!std::isfinite(a.spatial_scale) || a.spatial_scale < 0)
    im.fail_node(n, "spatial_scale " + std::to_string(a.spatial_scale) + "; expected a finite number, at least 0");
  Value out;
  out.shape = {rois[0], x[1], a.height, a.width};
  return out;
}

// RoiAlign of constants (the host stage's: regions from proposals the
// data chose), as the device's roi_align computes it (ops.md), in f32.
Value fold_roi_align(Importer& im, Node& n) {
  Value out = infer_roi_align(im, n);
  im.check_folded(n, out.shape);
  const auto& a = n.attr<RoiAlignAttrs>();
  const Value &x = im.in(n, 0), &rois = im.in(n, 1), &idx = im.in(n, 2);
  const std::int64_t channels = x.shape[1], height = x.shape[2], width = x.shape[3];
  const std::int64_t oh = a.height, ow = a.width;
  std::vector<double> y(out.elements());
  const float offset = a.half_pixel ? 0.5f : 0.0f;
  const bool empty = height == 0 || width == 0;  // every sample outside: each bin pools to 0
  for (std::int64_t r = 0; r < out.shape[0]; ++r) {
    auto b = static_cast<std::int64_t>(value_at(idx, static_cast<std::size_t>(r)));
    if (b < -x.shape[0] || b >= x.shape[0])
      im.fail_node(n, "region " + std::to_string(r) + " has the batch index " + std::to_string(b) + ", outside [" +
                          std::to_string(-x.shape[0]) + ", " + std::to_string(x.shape[0]) + ")");
    if (b < 0) b += x.shape[0];
    float c[4];
    for (int k = 0; k < 4; ++k) {
      c[k] = static_cast<float>(value_at(rois, static_cast<std::size_t>(r * 4 + k))) * a.spatial_scale - offset;
      if (!std::isfinite(c[k])) im.fail_node(n, "region " + std::to_string(r) + " is not finite once scaled");
    }
    float rw = c[2] - c[0], rh = c[3] - c[1];
    if (!a.half_pixel) rw = std::max(rw, 1.0f), rh = std::max(rh, 1.0f);
    const float bin_h = rh / static_cast<float>(oh), bin_w = rw / static_cast<float>(ow);
    const auto grid = [&](float extent, std::int64_t bins) -> std::int64_t {
      if (a.sampling_ratio > 0) return a.sampling_ratio;
      const float g = std::ceil(extent / static_cast<float>(bins));
      return g > 0 ? static_cast<std::int64_t>(std::min(g, 1048576.0f)) : 0;
    };
    const std::int64_t gh = empty ? 0 : grid(rh, oh), gw = empty ? 0 : grid(rw, ow);
    if (gh * gw > (std::int64_t{1} << 20) / (oh * ow))  // the device's bound on one region's work
      im.fail_node(n, "region " + std::to_string(r) + " asks for more than 1048576 samples");
    const float count = static_cast<float>(std::max<std::int64_t>(gh * gw, 1));
    for (std::int64_t ch = 0; ch < channels; ++ch) {
      const std::size_t plane = static_cast<std::size_t>((b * channels + ch) * height * width);
      const auto px = [&](std::int64_t yy, std::int64_t xx) {
        return static_cast<float>(value_at(x, plane + static_cast<std::size_t>(yy * width + xx)));
      };
      for (std::int64_t ph = 0; ph < oh; ++ph)
        for (std::int64_t pw = 0; pw < ow; ++pw) {
          float acc = 0.0f;
          bool first = true;
          for (std::int64_t iy = 0; iy < gh; ++iy)
            for (std::int64_t ix = 0; ix < gw; ++ix) {
              const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
              const fw::RoiTap ty = fw::roi_tap(c[1], bin_h, u(ph), u(iy), u(gh), u(height));
              const fw::RoiTap tx = fw::roi_tap(c[0], bin_w, u(pw), u(ix), u(gw), u(width));
              float c0 = 0, c1 = 0, c2 = 0, c3 = 0;
              if (ty.inside && tx.inside) {
                const auto i = [](std::uint64_t v) { return static_cast<std::int64_t>(v); };
                c0 = ty.h * tx.h * px(i(ty.low), i(tx.low));
                c1 = ty.h * tx.l * px(i(ty.low), i(tx.high));
                c2 = ty.l * tx.h * px(i(ty.high), i(tx.low));
                c3 = ty.l * tx.l * px(i(ty.high), i(tx.high));
              }
              if (a.mode == "max") {
                const float m = std::max(std::max(std::max(c0, c1), c2), c3);
                acc = first ? m : std::max(acc, m);
              } else {
                acc += c0 + c1 + c2 + c3;
              }
              first = false;
            }
          y[static_cast<std::size_t>(((r * channels + ch) * oh + ph) * ow + pw)] = a.mode == "max" ? acc : acc / count;
        }
    }
  }
  return make_constant(out.shape, y, false);
}

void lower_roi_align(Lowerer& l, const Node& n) {
  const auto& a = n.attr<RoiAlignAttrs>();
  const DType t = l.float_type();
  l.op("roi_align", n.name,
       {{"x", l.get(n.inputs[0], t)},
        {"rois", l.get(n.inputs[1], DType::F32)},
        {"batch_indices", l.get(n.inputs[2], DType::I32)},
        {"y", l.produce(n.output, t, l.shape_of(n.output))}},
       {{"mode", a.mode},
        {"sampling_ratio", a.sampling_ratio},
        {"spatial_scale", a.spatial_scale},
        {"half_pixel", a.half_pixel}});
}

}  // namespace

std::span<const OpHandler> pool_handlers() {
  static const OpHandler h[] = {
      {.ops = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"},
       .read = read_attrs<PoolAttrs>,
       .infer = infer_pool,
       .lower = lower_pool,
       .writes_fresh = true},
      {.ops = {"RoiAlign"},
       .opsets = {.first = 10, .refusal = "opset below 10 (no RoiAlign)"},
       .read = read_attrs<RoiAlignAttrs>,
       .infer = infer_roi_align,
       .fold = fold_roi_align,
       .folds = Fold::IfConstant,
       .lower = lower_roi_align,
       .writes_fresh = true},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
