// MaxPool, AveragePool, GlobalAveragePool (4-D, or 3-D as H = 1):
// max_pool2d and avg_pool2d; in int8, a 4-D MaxPool of a u8 value stays u8
// (NHWC), the max of u8 values keeping their scale.
#include "onnx/importer.hpp"
#include "onnx/lowerer.hpp"
#include "onnx/window.hpp"

namespace tpuhal::rt::detail {
namespace {

using PoolAttrs = onnx_attrs::WindowAttrs;

Value infer_pool(Importer& im, Node& n) {
  const auto& a = n.attr<PoolAttrs>();
  const auto& x = im.in(n, 0).shape;
  const bool one_d = x.size() == 3;  // [N, C, L]: pooled as H = 1
  if (a.global && x.size() == 5) {   // [N, C, D, H, W]: pooled as [N, C, 1, D * H * W]
    Value out;
    out.shape = {x[0], x[1], 1, 1, 1};
    return out;
  }
  if (!one_d && x.size() != 4)
    im.unsupported(n, "input of rank " + std::to_string(x.size()) +
                          "; the compiler pools 3-D (NCL) and 4-D (NCHW) tensors, and 5-D ones globally");
  if (a.storage_order != 0) im.fail(Status::Unsupported, "node '" + n.name + "' (MaxPool): storage_order 1");
  if (!a.global) {
    if (!a.kernel_shape) im.fail_node(n, "no kernel_shape");
    check_window(im, n, a, one_d ? 1 : 2);
  }
  const auto o = onnx_attrs::pool_options(a, x);
  for (int k = 0; k < 2; ++k) {  // what the pooling ops take
    const std::uint64_t window = std::uint64_t{o.dilations[k]} * (o.kernel[k] - 1) + 1;
    if (o.pads[k] >= window || o.pads[k + 2] >= window)
      im.fail_node(n, "pads (" + std::to_string(o.pads[k]) + ", " + std::to_string(o.pads[k + 2]) +
                          ") must be smaller than the window (" + std::to_string(window) + ")");
  }
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
  const std::vector<std::int64_t> flat{xs[0], xs[1], 1, xs[2] * xs[3] * xs[4]}, pooled{xs[0], xs[1], 1, 1};
  const auto o = onnx_attrs::pool_options(n.attr<PoolAttrs>(), flat);
  const DType t = l.float_type();
  const auto x = l.dense(l.get(n.inputs[0], t), t, xs);
  const auto y = l.produce(n.output, t, l.shape_of(n.output));
  l.op("avg_pool2d", n.name, {{"x", l.dg().add_view(x, flat)}, {"y", l.dg().add_view(y, pooled)}},
       pool_json(o, Layout::NCHW));
}

void lower_pool(Lowerer& l, const Node& n) {
  const auto& shape = l.shape_of(n.output);
  const auto& xs = l.shape_of(n.inputs[0]);
  if (xs.size() == 5) {
    lower_global_pool_5d(l, n);
    return;
  }
  const auto o = onnx_attrs::pool_options(n.attr<PoolAttrs>(), xs);
  const bool max = n.op == "MaxPool", one_d = xs.size() == 3;
  DType t = l.float_type();
  if (!one_d && l.int8() && max && l.reps.count(n.inputs[0]) && l.reps.at(n.inputs[0]).primary == DType::U8)
    t = DType::U8;
  std::map<std::string, std::int64_t> operands;
  if (t == DType::U8) {  // NHWC; the max of u8 values keeps their scale
    operands["x"] = l.get_nhwc(n.inputs[0]);
    operands["y"] = l.produce_nhwc(n.output, shape, l.reps.at(n.inputs[0]).q);
  } else {
    operands["x"] = l.get(n.inputs[0], t);
    operands["y"] = l.produce(n.output, t, shape);
    if (one_d) l.as_2d(operands, {{"x", &xs}, {"y", &shape}});
  }
  l.op(max ? "max_pool2d" : "avg_pool2d", n.name, operands, pool_json(o, t == DType::U8 ? Layout::NHWC : Layout::NCHW));
}

}  // namespace

std::span<const OpHandler> pool_handlers() {
  static const OpHandler h[] = {
      {.ops = {"MaxPool", "AveragePool", "GlobalAveragePool"},
       .read = read_attrs<PoolAttrs>,
       .infer = infer_pool,
       .lower = lower_pool,
       .writes_fresh = true},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
