// Conv (2-D, NCHW, constant weights): conv2d with the activation fused
// into it, or qlinear_conv in int8. A 1-D Conv ([N, C, L]) is conv2d on
// views with H = 1, in float in every precision. ConvTranspose (1-D and
// 2-D): conv_transpose2d, in float in every precision.
#include "onnx/attrs.hpp"
#include "onnx/importer.hpp"
#include "onnx/lowerer.hpp"
#include "onnx/window.hpp"

namespace tpuhal::rt::detail {
namespace {

Value infer_conv(Importer& im, Node& n) {
  const auto& a = n.attr<ConvAttrs>();
  const auto& x = im.in(n, 0).shape;
  const auto& w = im.constant(n, 1, "weights").shape;
  const bool one_d = x.size() == 3;  // [N, C, L]: lowered as H = 1
  if (x.size() < 3)
    im.fail_node(n, "input of rank " + std::to_string(x.size()) + "; a convolution takes [N, C, spatial...]");
  if (x.size() > 4)
    im.unsupported(n, std::to_string(x.size() - 2) + "-D convolution; the compiler takes 1-D and 2-D (NCHW) ones");
  if (w.size() != x.size())
    im.fail_node(n, "weights of rank " + std::to_string(w.size()) + " for an input of rank " +
                        std::to_string(x.size()) + " (" + dims_text(w) + " and " + dims_text(x) + ")");
  const auto unknown =
      Attrs::first_unknown(a.present, {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"});
  if (!unknown.empty()) im.unsupported(n, "attribute " + unknown);
  if (im.has(n, 2)) im.constant(n, 2, "bias");
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

void lower_conv(Lowerer& l, const Node& n) {
  const auto& shape = l.shape_of(n.output);
  const auto& xs = l.shape_of(n.inputs[0]);
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
  std::map<std::string, std::int64_t> operands{{"x", l.get(n.inputs[0], t)}, {"w", l.get(n.inputs[1], t)}};
  if (has_bias) operands["bias"] = l.get(n.inputs[2], DType::F32);
  operands["y"] = l.produce(n.output, t, shape);
  if (one_d) l.as_2d(operands, {{"x", &xs}, {"w", &w.shape}, {"y", &shape}});
  nlohmann::json at = conv_attrs(o);
  at["activation"] = act_json(n.act);
  l.op("conv2d", n.name, operands, at);
}

Value infer_conv_transpose(Importer& im, Node& n) {
  const auto& a = n.attr<ConvAttrs>();
  const auto& x = im.in(n, 0).shape;
  const auto& w = im.constant(n, 1, "weights").shape;
  const bool one_d = x.size() == 3 && w.size() == 3;  // [N, C, L]: lowered as H = 1
  if (!one_d && (x.size() != 4 || w.size() != 4))
    im.unsupported(
        n, std::to_string(x.size() - 2) + "-D transposed convolution; the compiler takes 1-D and 2-D (NCHW) ones");
  const auto unknown = Attrs::first_unknown(a.present, {"auto_pad", "dilations", "group", "kernel_shape",
                                                        "output_padding", "output_shape", "pads", "strides"});
  if (!unknown.empty()) im.unsupported(n, "attribute " + unknown);
  if (im.has(n, 2)) im.constant(n, 2, "bias");
  check_window(im, n, a, one_d ? 1 : 2);
  const auto geo = onnx_attrs::conv_transpose_options(a, x, w);
  const auto groups = static_cast<std::int64_t>(geo.options.groups);
  if (groups == 0 || x[1] != w[0] || x[1] % groups != 0)
    im.fail_node(n, "input " + dims_text(x) + " and weights " + dims_text(w) + " do not match with group " +
                        std::to_string(groups));
  for (auto p : geo.options.pads)
    if (p > 65536) im.fail_node(n, "pad " + std::to_string(p) + " is above 65536");
  if (geo.out[0] < 1 || geo.out[1] < 1) im.fail_node(n, "its pads leave an empty output");
  Value out;
  out.shape = one_d ? std::vector<std::int64_t>{x[0], w[1] * groups, geo.out[1]}
                    : std::vector<std::int64_t>{x[0], w[1] * groups, geo.out[0], geo.out[1]};
  return out;
}

// In float in every precision (int8: f32).
void lower_conv_transpose(Lowerer& l, const Node& n) {
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
