// Conv (2-D, NCHW, constant weights): conv2d with the activation fused
// into it, or qlinear_conv in int8. A 1-D Conv ([N, C, L]) is conv2d on
// views with H = 1, in float in every precision. A 3-D Conv ([N, C, D, H,
// W]) is one conv2d over (H, W) whose input channels hold the depth taps
// side by side, in float in every precision (lower_conv3d). ConvTranspose
// (1-D and 2-D): conv_transpose2d, in float in every precision; a 3-D one
// is one conv_transpose2d whose input channels hold, for each output
// depth, the input depths that land there (lower_conv_transpose3d).
#include "onnx/attrs.hpp"
#include "onnx/importer.hpp"
#include "onnx/lowerer.hpp"
#include "onnx/window.hpp"
#include "tpuhal/fw/window.h"

namespace tpuhal::rt::detail {
namespace {

// A 3-D convolution (x [N, C, D, H, W], weights [M, C/group, kd, kh, kw])
// as its depth window and the 2-D convolution over (H, W) it becomes.
struct Conv3d {
  std::int64_t kd = 1, stride = 1, dilation = 1, pad_front = 0, pad_back = 0;
  ops::Conv2dOptions plane;
};

Conv3d conv3d_geometry(const ConvAttrs& a, const std::vector<std::int64_t>& x, const std::vector<std::int64_t>& w) {
  const Window3d win = window_3d(a, x, {w[2], w[3], w[4]});
  const auto& p = win.pads;
  Conv3d c;
  c.kd = w[2];
  c.stride = win.strides[0];
  c.dilation = win.dilations[0];
  c.pad_front = p[0];
  c.pad_back = p[3];
  c.plane.strides = {win.strides[1], win.strides[2]};
  c.plane.dilations = {win.dilations[1], win.dilations[2]};
  c.plane.pads = {p[1], p[2], p[4], p[5]};
  c.plane.groups = onnx_attrs::u32(a.groups());
  return c;
}

Value infer_conv3d(Importer& im, Node& n, const std::vector<std::int64_t>& x, const std::vector<std::int64_t>& w) {
  const auto& a = n.attr<ConvAttrs>();
  check_window(im, n, a, 3);
  for (std::size_t i = 2; i < 5; ++i)
    if (w[i] < 1 || w[i] > 0x7fffffff) im.fail_node(n, "weights of shape " + dims_text(w) + " make no kernel");
  if (a.kernel_shape && *a.kernel_shape != std::vector<std::int64_t>(w.begin() + 2, w.end()))
    im.fail_node(n, "kernel_shape " + dims_text(*a.kernel_shape) + " is not that of its weights " + dims_text(w));
  const Conv3d c = conv3d_geometry(a, x, w);
  const auto& o = c.plane;
  if (o.groups == 0 || x[1] != w[1] * o.groups || w[0] % o.groups != 0)
    im.fail_node(n, "input " + dims_text(x) + " and weights " + dims_text(w) + " do not match with group " +
                        std::to_string(o.groups));
  const auto u = [](std::int64_t v) { return static_cast<std::uint32_t>(v); };
  Value out;
  out.shape = {x[0], w[0], pool_out(x[2], u(c.kd), u(c.stride), u(c.dilation), u(c.pad_front), u(c.pad_back), false),
               pool_out(x[3], u(w[3]), o.strides[0], o.dilations[0], o.pads[0], o.pads[2], false),
               pool_out(x[4], u(w[4]), o.strides[1], o.dilations[1], o.pads[1], o.pads[3], false)};
  check_window_fits(im, n, x, out.shape,
                    std::to_string(w[2]) + "x" + std::to_string(w[3]) + "x" + std::to_string(w[4]) + " kernel");
  return out;
}

Value infer_conv(Importer& im, Node& n) {
  const auto& a = n.attr<ConvAttrs>();
  const auto& x = im.in(n, 0).shape;
  const auto& w = im.constant(n, 1, "weights").shape;
  const bool one_d = x.size() == 3;  // [N, C, L]: lowered as H = 1
  if (x.size() < 3)
    im.fail_node(n, "input of rank " + std::to_string(x.size()) + "; a convolution takes [N, C, spatial...]");
  if (x.size() > 5)
    im.unsupported(
        n, std::to_string(x.size() - 2) + "-D convolution; the compiler takes 1-D, 2-D (NCHW) and 3-D (NCDHW) ones");
  if (w.size() != x.size())
    im.fail_node(n, "weights of rank " + std::to_string(w.size()) + " for an input of rank " +
                        std::to_string(x.size()) + " (" + dims_text(w) + " and " + dims_text(x) + ")");
  const auto unknown =
      Attrs::first_unknown(a.present, {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"});
  if (!unknown.empty()) im.unsupported(n, "attribute " + unknown);
  if (im.has(n, 2)) im.constant(n, 2, "bias");
  if (x.size() == 5) return infer_conv3d(im, n, x, w);
  check_window(im, n, a, one_d ? 1 : 2);
  // The kernel as [kh, kw] (kh = 1 in 1-D).
  const std::array<std::int64_t, 2> k = one_d ? std::array<std::int64_t, 2>{1, w[2]} : std::array{w[2], w[3]};
  if (k[0] < 1 || k[1] < 1 || k[0] > 0x7fffffff || k[1] > 0x7fffffff)
    im.fail_node(n, "weights of shape " + dims_text(w) + " make no kernel");
  if (a.kernel_shape && *a.kernel_shape != std::vector<std::int64_t>(w.begin() + 2, w.end()))
    im.fail_node(n, "kernel_shape " + dims_text(*a.kernel_shape) + " is not that of its weights " + dims_text(w));
  const auto o = onnx_attrs::conv_options(a, x, w);
  if (o.groups == 0 || x[1] != w[1] * o.groups || w[0] % o.groups != 0)
    im.fail_node(n, "input " + dims_text(x) + " and weights " + dims_text(w) + " do not match with group " +
                        std::to_string(o.groups));
  const std::int64_t h = one_d ? 1 : x[2], wd = x.back();
  const std::int64_t oh =
      pool_out(h, static_cast<std::uint32_t>(k[0]), o.strides[0], o.dilations[0], o.pads[0], o.pads[2], false);
  const std::int64_t ow =
      pool_out(wd, static_cast<std::uint32_t>(k[1]), o.strides[1], o.dilations[1], o.pads[1], o.pads[3], false);
  Value out;
  out.shape = one_d ? std::vector<std::int64_t>{x[0], w[0], ow} : std::vector<std::int64_t>{x[0], w[0], oh, ow};
  check_window_fits(im, n, x, out.shape,
                    (one_d ? std::to_string(k[1]) : std::to_string(k[0]) + "x" + std::to_string(k[1])) + " kernel");
  return out;
}

// Value x (dense, of shape xs) where views of it may be taken: in the
// arena; a constant is copied there first.
std::int64_t viewable(Lowerer& l, const Node& n, std::int64_t x, DType t, const std::vector<std::int64_t>& xs) {
  if (l.dg().tensors[static_cast<std::size_t>(x)].storage == Storage::Arena) return x;
  const auto copy = l.dg().add_arena("", t, xs);
  l.op("cast", n.name, {{"x", x}, {"y", copy}});
  return copy;
}

// A 3-D op's output y [N, M, OD, OH, OW] computed by a 2-D op over
// [N * OD, M, OH, OW]: what that op writes (y itself where OD is 1), and
// after it the strided copy into y (depths_into).
std::int64_t depths_flat(Lowerer& l, std::int64_t y, DType t, const std::vector<std::int64_t>& shape) {
  const std::vector<std::int64_t> flat{shape[0] * shape[2], shape[1], shape[3], shape[4]};
  return shape[2] == 1 ? l.dg().add_view(y, flat) : l.dg().add_arena("", t, flat);
}
void depths_into(Lowerer& l, const Node& n, std::int64_t flat, std::int64_t y, const std::vector<std::int64_t>& shape) {
  const std::int64_t batch = shape[0], m = shape[1], od = shape[2], plane = shape[3] * shape[4];
  if (od == 1) return;
  l.op("cast", n.name,
       {{"x", l.dg().add_subview(flat, {batch, m, od, plane}, {od * m * plane, plane, m * plane, 1}, 0)},
        {"y", l.dg().add_view(y, {batch, m, od, plane})}});
}

// x [N, C, D, H, W] and weights [M, Cg, kd, kh, kw] (C = groups * Cg):
// the input's depth taps go side by side into the channels of a scratch
// [N * OD, groups * kd * Cg, H, W] (tap t of output depth o is x's depth
// o * stride + t * dilation - pad_front; zero where that lies in the
// padding), and one conv2d with the weights reordered to [M, kd * Cg, kh,
// kw] gives [N * OD, M, OH, OW], which a strided copy turns into [N, M,
// OD, OH, OW]. The scratch is kd times the input; the products are the 3-D
// convolution's own, in one call.
void lower_conv3d(Lowerer& l, const Node& n) {
  const auto& shape = l.shape_of(n.output);
  const auto& xs = l.shape_of(n.inputs[0]);
  const Value& w = l.g.value(n.inputs[1]);
  const Conv3d c = conv3d_geometry(n.attr<ConvAttrs>(), xs, w.shape);
  l.qdq_float(n, "3-D convolutions run in float");
  const DType t = l.act;
  const std::int64_t batch = xs[0], channels = xs[1], depth = xs[2], plane = xs[3] * xs[4];
  const std::int64_t m = w.shape[0], cg = w.shape[1], kd = w.shape[2], taps = w.shape[3] * w.shape[4];
  const std::int64_t groups = c.plane.groups, od = shape[2];
  const auto es = static_cast<std::uint64_t>(size_of(t));

  // Weights [M, Cg, kd, kh, kw] as [M, kd * Cg, kh, kw]: input channel
  // t * Cg + ci of its group holds depth tap t of channel ci.
  const auto& wd = *w.data;
  std::vector<float> reordered(wd.size());
  for (std::int64_t o = 0; o < m; ++o)
    for (std::int64_t ci = 0; ci < cg; ++ci)
      for (std::int64_t t_ = 0; t_ < kd; ++t_)
        std::copy_n(wd.begin() + ((o * cg + ci) * kd + t_) * taps, taps,
                    reordered.begin() + ((o * kd + t_) * cg + ci) * taps);
  const auto weights = l.add_weight(reordered, t, {m, kd * cg, w.shape[3], w.shape[4]});

  const auto x = viewable(l, n, l.dense(l.get(n.inputs[0], t), t, xs), t, xs);
  const auto col = l.dg().add_arena("", t, {batch * od, groups * kd * cg, xs[3], xs[4]});
  // col as [N, OD, groups, Cg, H * W] for tap t: its strides, and x's for
  // the same indices with depth o * stride.
  const std::vector<std::int64_t> col_st{od * groups * kd * cg * plane, groups * kd * cg * plane, kd * cg * plane,
                                         plane, 1};
  const std::vector<std::int64_t> x_st{channels * depth * plane, c.stride * plane, cg * depth * plane, depth * plane,
                                       1};
  const auto col_part = [&](std::int64_t tap, std::int64_t from, std::int64_t to) {
    return l.dg().add_subview(col, {batch, to - from, groups, cg, plane}, col_st,
                              static_cast<std::uint64_t>((from * groups * kd + tap) * cg * plane) * es);
  };
  const auto zero = l.add_weight({0.0f}, t, {});
  for (std::int64_t tap = 0; tap < kd; ++tap) {
    // The output depths o whose tap lands inside x: 0 <= o * stride + shift < depth.
    const std::int64_t shift = tap * c.dilation - c.pad_front;
    const std::int64_t lo = std::min(od, shift >= 0 ? 0 : (-shift + c.stride - 1) / c.stride);
    const std::int64_t hi = std::clamp(depth - shift <= 0 ? 0 : (depth - shift - 1) / c.stride + 1, lo, od);
    if (lo > 0) l.op("cast", n.name, {{"x", zero}, {"y", col_part(tap, 0, lo)}});
    if (hi < od) l.op("cast", n.name, {{"x", zero}, {"y", col_part(tap, hi, od)}});
    if (hi > lo)
      l.op("cast", n.name,
           {{"x", l.dg().add_subview(x, {batch, hi - lo, groups, cg, plane}, x_st,
                                     static_cast<std::uint64_t>((lo * c.stride + shift) * plane) * es)},
            {"y", col_part(tap, lo, hi)}});
  }

  std::map<std::string, std::int64_t> operands{{"x", col}, {"w", weights}};
  if (n.inputs.size() > 2 && !n.inputs[2].empty()) operands["bias"] = l.get(n.inputs[2], DType::F32);
  const auto y = l.produce(n.output, t, shape);
  operands["y"] = depths_flat(l, y, t, shape);
  nlohmann::json at = conv_attrs(c.plane);
  at["activation"] = act_json(n.act);
  l.op("conv2d", n.name, operands, at);
  depths_into(l, n, operands["y"], y, shape);
}

// A 1x1 convolution of a 1x1 image (a squeeze-and-excitation block's
// two, or a classifier written as one) is a matrix product of x [N, C]
// by the weights: lowered as matmul with the weights stored [C, K], so
// that the device reads them row by row in place (fgemm's rows of A by a
// B read as it lies) where a convolution would set up a whole window
// machinery for one output position. x and y are the same bytes in NCHW
// and NHWC at that size. False (nothing lowered) for any other
// convolution, or where x is a strided view or y a part of a Concat.
bool lower_as_matmul(Lowerer& l, const Node& n, const ops::Conv2dOptions& o, const std::string& out,
                     const ActivationParams& act, DType t, bool nhwc) {
  const auto& xs = l.shape_of(n.inputs[0]);
  const Value& w = l.g.value(n.inputs[1]);
  if (xs.size() != 4 || xs[2] != 1 || xs[3] != 1 || w.shape.size() != 4 || w.shape[2] != 1 || w.shape[3] != 1 ||
      o.groups != 1 || !w.data || o.pads != std::array<std::uint32_t, 4>{0, 0, 0, 0} || l.placements.count(out))
    return false;
  const std::int64_t x = nhwc ? l.get_nhwc_float(n.inputs[0]) : l.get(n.inputs[0], t);
  if (!l.dg().tensors.at(static_cast<std::size_t>(x)).strides.empty()) return false;
  const std::int64_t batch = xs[0], c = xs[1], k = w.shape[0];
  const std::int64_t y =
      nhwc ? l.produce_nhwc_float(out, l.shape_of(n.output)) : l.produce(out, t, l.shape_of(n.output));
  std::map<std::string, std::int64_t> operands{{"a", l.dg().add_view(x, {batch, c})},
                                               {"b", l.add_weight_transposed(*w.data, k, c, t)},  // [C, K]
                                               {"y", l.dg().add_view(y, {batch, k})}};
  const bool has_bias = n.inputs.size() > 2 && !n.inputs[2].empty();
  if (has_bias) operands["c"] = l.get(n.inputs[2], DType::F32);
  l.op("matmul", n.name, operands,
       {{"transpose_a", false},
        {"transpose_b", false},
        {"alpha", 1.0},
        {"beta", has_bias ? 1.0 : 0.0},
        {"activation", act_json(act)}});
  return true;
}

void lower_conv(Lowerer& l, const Node& n) {
  const auto& shape = l.shape_of(n.output);
  const auto& xs = l.shape_of(n.inputs[0]);
  if (xs.size() == 5) {
    lower_conv3d(l, n);
    return;
  }
  const Value& w = l.g.value(n.inputs[1]);
  const auto o = onnx_attrs::conv_options(n.attr<ConvAttrs>(), xs, w.shape);
  const bool has_bias = n.inputs.size() > 2 && !n.inputs[2].empty();
  const bool one_d = xs.size() == 3;
  const std::vector<float> bias = has_bias ? *l.g.value(n.inputs[2]).data : std::vector<float>{};
  const QuantizedConstant* wq = w.quantized.get();
  if (!one_d && l.int8() && l.qdq_int8(n, n.inputs[0], wq) &&
      l.int8_bias_fits(n, n.inputs[0], *w.data, static_cast<std::size_t>(w.shape[0]), bias, wq)) {
    const auto xu = l.get_nhwc(n.inputs[0]);
    ops::Conv2dOptions on = o;
    on.layout = Layout::NHWC;
    l.qconv(n, xu, n.inputs[0], *w.data, w.shape, bias, on, shape, {}, wq);
    return;
  }
  if (one_d) l.qdq_float(n, "1-D convolutions run in float");
  const DType t = l.act;
  const bool nhwc = l.float_nhwc && !one_d;
  // A convolution an int8 model runs in float (kept in fp16, or its bias
  // too large) takes the x * Sigmoid(x) after it as its activation, as a
  // float model's does (fuse_gated), rather than running it as two ops.
  const bool in_int8 = l.int8() || l.keep_fp16.count(n.name);  // a kept layer lowers at its own precision
  const auto silu = in_int8 && n.act.kind == Activation::None ? l.silu_of(n.output) : Lowerer::Silu{};
  const std::string& out = silu.mul ? silu.mul->output : n.output;
  // A residual Add fused into it (fuse_residual_adds): it accumulates into
  // a tensor holding that value.
  const std::string* residual = residual_of(n);
  if (!one_d && !residual && lower_as_matmul(l, n, o, out, silu.mul ? ActivationParams::silu() : n.act, t, nhwc)) {
    if (silu.mul) l.fused_into_producer.insert({silu.sigmoid->name, silu.mul->name});
    return;
  }
  std::map<std::string, std::int64_t> operands{{"x", nhwc ? l.get_nhwc_float(n.inputs[0]) : l.get(n.inputs[0], t)},
                                               {"w", l.get(n.inputs[1], t)}};
  if (has_bias) operands["bias"] = l.get(n.inputs[2], DType::F32);
  if (residual)
    operands["y"] = l.accumulator(out, *residual, shape, nhwc, static_cast<std::size_t>(&n - l.g.nodes.data()));
  else
    operands["y"] = nhwc ? l.produce_nhwc_float(out, shape) : l.produce(out, t, shape);
  if (one_d) l.as_2d(operands, {{"x", &xs}, {"w", &w.shape}, {"y", &shape}});
  ops::Conv2dOptions on = o;
  if (nhwc) on.layout = Layout::NHWC;
  nlohmann::json at = conv_attrs(on);
  at["activation"] = act_json(silu.mul ? ActivationParams::silu() : n.act);
  if (residual) at["accumulate"] = true;
  l.op("conv2d", n.name, operands, at);
  if (silu.mul) l.fused_into_producer.insert({silu.sigmoid->name, silu.mul->name});
}

Value infer_conv_transpose(Importer& im, Node& n) {
  const auto& a = n.attr<ConvAttrs>();
  const auto& x = im.in(n, 0).shape;
  const auto& w = im.constant(n, 1, "weights").shape;
  const bool one_d = x.size() == 3 && w.size() == 3;  // [N, C, L]: lowered as H = 1
  const bool three_d = x.size() == 5 && w.size() == 5;
  if (!one_d && !three_d && (x.size() != 4 || w.size() != 4))
    im.unsupported(n, std::to_string(x.size() - 2) +
                          "-D transposed convolution; the compiler takes 1-D, 2-D (NCHW) and 3-D (NCDHW) ones");
  const auto unknown = Attrs::first_unknown(a.present, {"auto_pad", "dilations", "group", "kernel_shape",
                                                        "output_padding", "output_shape", "pads", "strides"});
  if (!unknown.empty()) im.unsupported(n, "attribute " + unknown);
  if (im.has(n, 2)) im.constant(n, 2, "bias");
  check_window(im, n, a, one_d ? 1 : three_d ? 3 : 2);
  const auto geo3 = three_d ? onnx_attrs::conv_transpose3d_options(a, x, w) : onnx_attrs::ConvTranspose3dGeometry{};
  const auto geo = three_d ? geo3.plane : onnx_attrs::conv_transpose_options(a, x, w);
  const auto groups = static_cast<std::int64_t>(geo.options.groups);
  if (groups == 0 || x[1] != w[0] || x[1] % groups != 0)
    im.fail_node(n, "input " + dims_text(x) + " and weights " + dims_text(w) + " do not match with group " +
                        std::to_string(groups));
  for (auto p : geo.options.pads)
    if (p > fw::kMaxWindowValue)
      im.fail_node(n, "pad " + std::to_string(p) + " is above " + std::to_string(fw::kMaxWindowValue));
  if (geo.out[0] < 1 || geo.out[1] < 1 || (three_d && geo3.out_depth < 1))
    im.fail_node(n, "its pads leave an empty output");
  Value out;
  out.shape = one_d ? std::vector<std::int64_t>{x[0], w[1] * groups, geo.out[1]}
                    : std::vector<std::int64_t>{x[0], w[1] * groups, geo.out[0], geo.out[1]};
  if (three_d) {
    if (geo3.stride < 1 || geo3.dilation < 1 || geo3.pad_front > fw::kMaxWindowValue || x[2] < 1 || w[2] < 1)
      im.fail_node(n, "its depth's stride, dilation, pads or kernel make no transposed convolution");
    out.shape.insert(out.shape.begin() + 2, geo3.out_depth);
  }
  return out;
}

// x [N, C, D, H, W] and weights [C, Mg, kd, kh, kw] (C = groups * Cg):
// input depth i with depth tap t lands on output depth o = i * stride +
// t * dilation - pad_front. A scratch [N * OD, groups * kd * Cg, H, W]
// holds, for each output depth o, in channel (g * kd + t) * Cg + ci, the
// input depth that lands on o with tap t (zero where none does), and one
// conv_transpose2d with the weights reordered to [groups * kd * Cg, Mg,
// kh, kw] gives [N * OD, M, OH, OW], which a strided copy turns into [N,
// M, OD, OH, OW]. The bias is added once per output, as ONNX does.
void lower_conv_transpose3d(Lowerer& l, const Node& n) {
  const auto& shape = l.shape_of(n.output);
  const auto& xs = l.shape_of(n.inputs[0]);
  const Value& w = l.g.value(n.inputs[1]);
  const auto g3 = onnx_attrs::conv_transpose3d_options(n.attr<ConvAttrs>(), xs, w.shape);
  const DType t = l.float_type();
  const std::int64_t batch = xs[0], channels = xs[1], depth = xs[2], plane = xs[3] * xs[4];
  const std::int64_t mg = w.shape[1], kd = w.shape[2], taps = w.shape[3] * w.shape[4];
  const std::int64_t groups = g3.plane.options.groups, cg = channels / groups;
  const std::int64_t od = shape[2];
  const auto es = static_cast<std::uint64_t>(size_of(t));

  const auto& wd = *w.data;
  std::vector<float> reordered(wd.size());
  for (std::int64_t gi = 0; gi < groups; ++gi)
    for (std::int64_t tap = 0; tap < kd; ++tap)
      for (std::int64_t ci = 0; ci < cg; ++ci)
        for (std::int64_t mo = 0; mo < mg; ++mo)
          std::copy_n(wd.begin() + (((gi * cg + ci) * mg + mo) * kd + tap) * taps, taps,
                      reordered.begin() + (((gi * kd + tap) * cg + ci) * mg + mo) * taps);
  const auto weights = l.add_weight(reordered, t, {groups * kd * cg, mg, w.shape[3], w.shape[4]});

  const auto x = viewable(l, n, l.dense(l.get(n.inputs[0], t), t, xs), t, xs);
  const std::int64_t width = groups * kd * cg;  // the scratch's channels
  const auto col = l.dg().add_arena("", t, {batch * od, width, xs[3], xs[4]});
  l.op("cast", n.name, {{"x", l.add_weight({0.0f}, t, {})}, {"y", col}});
  for (std::int64_t tap = 0; tap < kd; ++tap) {
    // The input depths i whose output depth i * stride + shift is inside [0, OD).
    const std::int64_t shift = tap * g3.dilation - g3.pad_front, s = g3.stride;
    const std::int64_t lo = std::min(depth, shift >= 0 ? 0 : (-shift + s - 1) / s);
    const std::int64_t hi = std::clamp(od - shift <= 0 ? 0 : (od - shift - 1) / s + 1, lo, depth);
    if (hi <= lo) continue;
    // A copy for the whole batch where its output depths nest within one
    // image's (the board refuses an output whose dimensions interleave);
    // else one per image.
    const bool whole = batch == 1 || (hi - lo) * s <= od;
    const std::int64_t images = whole ? batch : 1;
    const std::vector<std::int64_t> part{images, hi - lo, groups, cg, plane};
    for (std::int64_t b = 0; b < batch; b += images) {
      const auto from =
          l.dg().add_subview(x, part, {channels * depth * plane, plane, cg * depth * plane, depth * plane, 1},
                             static_cast<std::uint64_t>((b * channels * depth + lo) * plane) * es);
      const auto to =
          l.dg().add_subview(col, part, {od * width * plane, s * width * plane, kd * cg * plane, plane, 1},
                             static_cast<std::uint64_t>(((b * od + lo * s + shift) * width + tap * cg) * plane) * es);
      l.op("cast", n.name, {{"x", from}, {"y", to}});
    }
  }

  std::map<std::string, std::int64_t> operands{{"x", col}, {"w", weights}};
  if (n.inputs.size() > 2 && !n.inputs[2].empty()) operands["bias"] = l.get(n.inputs[2], DType::F32);
  const auto y = l.produce(n.output, t, shape);
  operands["y"] = depths_flat(l, y, t, shape);
  nlohmann::json at = conv_attrs(g3.plane.options);
  at["activation"] = act_json(n.act);
  l.op("conv_transpose2d", n.name, operands, at);
  depths_into(l, n, operands["y"], y, shape);
}

// In float in every precision (int8: f32).
void lower_conv_transpose(Lowerer& l, const Node& n) {
  if (l.shape_of(n.inputs[0]).size() == 5) {
    lower_conv_transpose3d(l, n);
    return;
  }
  const auto& shape = l.shape_of(n.output);
  const DType t = l.float_type();
  const Value& w = l.g.value(n.inputs[1]);
  const auto& xs = l.shape_of(n.inputs[0]);
  const auto geo = onnx_attrs::conv_transpose_options(n.attr<ConvAttrs>(), xs, w.shape);
  std::map<std::string, std::int64_t> operands{{"x", l.get(n.inputs[0], t)}, {"w", l.get(n.inputs[1], t)}};
  if (n.inputs.size() > 2 && !n.inputs[2].empty()) operands["bias"] = l.get(n.inputs[2], DType::F32);
  operands["y"] = l.produce(n.output, t, shape);
  if (xs.size() == 3) l.as_2d(operands, {{"x", &xs}, {"w", &w.shape}, {"y", &shape}});
  nlohmann::json at = conv_attrs(geo.options);
  at["activation"] = act_json(n.act);
  l.op("conv_transpose2d", n.name, operands, at);
}

}  // namespace

std::span<const OpHandler> conv_handlers() {
  static const OpHandler h[] = {
      {.ops = {"Conv"},
       .read = read_attrs<ConvAttrs>,
       .infer = infer_conv,
       .lower = lower_conv,
       .writes_fresh = true,
       .takes_activation = true,
       .int8_layer = true},
      {.ops = {"ConvTranspose"},
       .read = read_attrs<ConvAttrs>,
       .infer = infer_conv_transpose,
       .lower = lower_conv_transpose},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
