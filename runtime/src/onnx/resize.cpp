// Resize (opset 10 on) and Upsample: nearest and linear, every coordinate
// mode but tf_crop_and_resize, every nearest rounding; scales or sizes on H
// and W of 4-D (NCHW) tensors: resize.
#include <algorithm>
#include <cmath>

#include "onnx/importer.hpp"
#include "onnx/lowerer.hpp"

namespace tpuhal::rt::detail {
namespace {

struct ResizeAttrs {
  onnx_attrs::ResizeAttrs given;
  std::array<double, 2> scales{};  // H and W: given, or out / in (its shape rule resolves them)
  static ResizeAttrs read(const Attrs& a) { return {onnx_attrs::ResizeAttrs::read(a), {}}; }
};

// The output shape from constant scales (Upsample's and opset 10's second
// input, else the third) or sizes (the fourth); `scales` the given ones.
std::vector<std::int64_t> resized(Importer& im, const Node& n, std::vector<double>& scales) {
  const auto& x = im.in(n, 0).shape;
  const std::size_t scales_at = (n.op == "Upsample" || im.g.opset < 11) ? 1 : 2;
  std::vector<std::int64_t> out;
  if (im.has(n, scales_at) && im.constant(n, scales_at, "scales").elements() > 0)
    scales = values_of(im.constant(n, scales_at, "scales"));
  if (!scales.empty()) {
    if (scales.size() != 4) im.fail_node(n, std::to_string(scales.size()) + " scales for rank 4");
    if (scales[0] != 1 || scales[1] != 1) im.unsupported(n, "scales on N or C");
    for (std::size_t d = 0; d < 4; ++d) {
      if (!(scales[d] > 0)) im.fail_node(n, "scale " + std::to_string(scales[d]));
      out.push_back(static_cast<std::int64_t>(std::floor(static_cast<double>(x[d]) * scales[d])));
    }
  } else if (scales_at == 2 && im.has(n, 3)) {
    const Value& sz = im.constant(n, 3, "sizes");
    if (!is_integer(sz) || sz.ints.size() != 4) im.fail_node(n, "sizes are not 4 integers");
    if (sz.ints[0] != x[0] || sz.ints[1] != x[1]) im.unsupported(n, "sizes that change N or C");
    out = sz.ints;
  } else {
    im.fail_node(n, "neither scales nor sizes");
  }
  return out;
}

Value infer_resize(Importer& im, Node& n) {
  auto& a = n.attr<ResizeAttrs>();
  const auto& x = im.in(n, 0).shape;
  if (x.size() != 4)
    im.unsupported(n, "input of rank " + std::to_string(x.size()) + "; the compiler resizes 4-D (NCHW) tensors");
  if (const std::string why = onnx_attrs::resize_unsupported(a.given, im.g.opset); !why.empty()) im.unsupported(n, why);
  std::vector<double> scales;
  Value out;
  out.shape = resized(im, n, scales);
  for (auto d : out.shape)
    if (d <= 0) im.fail_node(n, "an output of shape " + dims_text(out.shape));
  if (!scales.empty())
    a.scales = {scales[2], scales[3]};
  else
    a.scales = {static_cast<double>(out.shape[2]) / static_cast<double>(x[2]),
                static_cast<double>(out.shape[3]) / static_cast<double>(x[3])};
  return out;
}

// Whether nearest resizing by `o` maps every output index along an axis
// (in_len -> out_len, at `scale`) to index / factor: a whole-factor
// upsample that repeats each element. The ONNX coordinate and rounding
// rules, in f32 as the engine computes them.
bool repeats(const ops::ResizeOptions& o, std::int64_t in_len, std::int64_t out_len, float scale,
             std::int64_t& factor) {
  if (o.mode != ResizeMode::Nearest || in_len <= 0 || out_len % in_len != 0) return false;
  factor = out_len / in_len;
  const float resized = static_cast<float>(in_len) * scale;
  for (std::int64_t i = 0; i < out_len; ++i) {
    const auto f = static_cast<float>(i);
    float x = f / scale;
    switch (o.coordinate) {
      case CoordinateMode::HalfPixel: x = (f + 0.5f) / scale - 0.5f; break;
      case CoordinateMode::Asymmetric: break;
      case CoordinateMode::AlignCorners:
        x = resized == 1.0f ? 0.0f : f * static_cast<float>(in_len - 1) / (resized - 1.0f);
        break;
      case CoordinateMode::PytorchHalfPixel: x = resized > 1.0f ? (f + 0.5f) / scale - 0.5f : 0.0f; break;
      case CoordinateMode::TfHalfPixelForNn: x = (f + 0.5f) / scale; break;
    }
    const bool half = x == std::floor(x) + 0.5f;
    float r = std::floor(x);
    switch (o.nearest) {
      case NearestMode::RoundPreferFloor: r = half ? std::floor(x) : std::round(x); break;
      case NearestMode::RoundPreferCeil: r = half ? std::ceil(x) : std::round(x); break;
      case NearestMode::Floor: break;
      case NearestMode::Ceil: r = std::ceil(x); break;
    }
    const auto at = std::clamp(static_cast<std::int64_t>(r), std::int64_t{0}, in_len - 1);
    if (at != i / factor) return false;
  }
  return true;
}

void lower_resize(Lowerer& l, const Node& n) {
  const auto& a = n.attr<ResizeAttrs>();
  const auto o = onnx_attrs::resize_options(a.given, l.g.opset);
  const auto& xs = l.shape_of(n.inputs[0]);
  const auto& ys = l.shape_of(n.output);
  std::int64_t fh = 0, fw = 0;
  if (repeats(o, xs[2], ys[2], static_cast<float>(a.scales[0]), fh) &&
      repeats(o, xs[3], ys[3], static_cast<float>(a.scales[1]), fw) && l.qrepeat(n, fh, fw))
    return;
  const DType t = l.float_type();
  const auto x = l.get(n.inputs[0], t);
  l.op("resize", n.name, {{"x", x}, {"y", l.produce(n.output, t, l.shape_of(n.output))}},
       {{"mode", o.mode == ResizeMode::Linear ? "linear" : "nearest"},
        {"coordinate", mode_name(coordinate_modes(), o.coordinate)},
        {"nearest", mode_name(nearest_modes(), o.nearest)},
        {"scales", {static_cast<float>(a.scales[0]), static_cast<float>(a.scales[1])}}});
}

}  // namespace

std::span<const OpHandler> resize_handlers() {
  static const OpHandler h[] = {
      {.ops = {"Resize"},
       .opsets = {.first = 10, .refusal = "Resize before opset 10"},
       .read = read_attrs<ResizeAttrs>,
       .infer = infer_resize,
       .lower = lower_resize,
       .writes_fresh = true},
      {.ops = {"Upsample"},
       .read = read_attrs<ResizeAttrs>,
       .infer = infer_resize,
       .lower = lower_resize,
       .writes_fresh = true},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
