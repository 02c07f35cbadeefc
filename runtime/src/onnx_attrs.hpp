// ONNX node attributes and their translation into tpuhal op options, shared
// by the compiler (its op handlers, onnx/) and the ONNX node tests
// (tests/onnx/onnx_node_test.cpp), so that both read Conv, pooling and
// Resize attributes the same way. The compiler reads a node's attributes
// once, into the typed structs below; the node tests use the overloads that
// take the node's Attrs. Header-only: the node tests include it without
// linking the runtime.
#pragma once

#include <onnx/onnx_pb.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "resize_names.hpp"
#include "tpuhal/ops.hpp"

namespace tpuhal::rt::onnx_attrs {

struct Attrs {
  const onnx::NodeProto& node;
  const onnx::AttributeProto* find(const char* name) const {
    for (const auto& a : node.attribute())
      if (a.name() == name) return &a;
    return nullptr;
  }
  std::int64_t i(const char* name, std::int64_t def) const {
    auto* a = find(name);
    return a ? a->i() : def;
  }
  float f(const char* name, float def) const {
    auto* a = find(name);
    return a ? a->f() : def;
  }
  std::string s(const char* name, const std::string& def) const {
    auto* a = find(name);
    return a ? a->s() : def;
  }
  std::vector<std::int64_t> ints(const char* name, std::vector<std::int64_t> def = {}) const {
    auto* a = find(name);
    return a ? std::vector<std::int64_t>(a->ints().begin(), a->ints().end()) : def;
  }
  // An INT attribute, or nullopt where the node has none of that name.
  std::optional<std::int64_t> opt_i(const char* name) const {
    auto* a = find(name);
    return a ? std::optional<std::int64_t>(a->i()) : std::nullopt;
  }
  // An INTS attribute, or nullopt where the node has none of that name.
  std::optional<std::vector<std::int64_t>> opt_ints(const char* name) const {
    auto* a = find(name);
    return a ? std::optional(ints(name)) : std::nullopt;
  }
  // The names of its attributes, in the node's order.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& a : node.attribute()) out.push_back(a.name());
    return out;
  }
  // The first attribute present other than `known`; empty if none.
  std::string unknown(std::initializer_list<const char*> known) const { return first_unknown(names(), known); }
  static std::string first_unknown(const std::vector<std::string>& present, std::initializer_list<const char*> known) {
    for (const auto& name : present) {
      bool ok = false;
      for (auto k : known) ok = ok || name == k;
      if (!ok) return name;
    }
    return {};
  }
};

inline std::uint32_t u32(std::int64_t v) { return static_cast<std::uint32_t>(v); }

// The window attributes of Conv, ConvTranspose and the pools, as the node
// gives them (nullopt: absent).
struct WindowAttrs {
  std::optional<std::vector<std::int64_t>> kernel_shape, strides, dilations, pads, output_padding, output_shape;
  std::optional<std::int64_t> group;
  std::string auto_pad = "NOTSET";
  bool ceil_mode = false, count_include_pad = false;
  std::int64_t storage_order = 0;
  bool global = false;               // GlobalAveragePool, GlobalMaxPool: the whole plane
  std::vector<std::string> present;  // every attribute's name, for the unknown-attribute checks

  static WindowAttrs read(const Attrs& a) {
    WindowAttrs w;
    w.kernel_shape = a.opt_ints("kernel_shape");
    w.strides = a.opt_ints("strides");
    w.dilations = a.opt_ints("dilations");
    w.pads = a.opt_ints("pads");
    w.output_padding = a.opt_ints("output_padding");
    w.output_shape = a.opt_ints("output_shape");
    w.group = a.opt_i("group");
    w.auto_pad = a.s("auto_pad", "NOTSET");
    w.ceil_mode = a.i("ceil_mode", 0) != 0;
    w.count_include_pad = a.i("count_include_pad", 0) != 0;
    w.storage_order = a.i("storage_order", 0);
    w.global = a.node.op_type().rfind("Global", 0) == 0;
    w.present = a.names();
    return w;
  }
  std::int64_t groups() const { return group.value_or(1); }
};

// Pads (top, left, bottom, right) from `pads` or `auto_pad` for a 2-D
// window of `kh` x `kw` over an `h` x `w` input.
inline std::array<std::uint32_t, 4> conv_pads(const WindowAttrs& a, std::int64_t h, std::int64_t w, std::int64_t kh,
                                              std::int64_t kw, const std::vector<std::int64_t>& strides,
                                              const std::vector<std::int64_t>& dil) {
  if (a.auto_pad == "SAME_UPPER" || a.auto_pad == "SAME_LOWER") {
    const bool lower = a.auto_pad == "SAME_LOWER";
    auto ph = ops::same_pads(u32(h), u32(kh), u32(strides[0]), u32(dil[0]), lower);
    auto pw = ops::same_pads(u32(w), u32(kw), u32(strides[1]), u32(dil[1]), lower);
    return {ph[0], pw[0], ph[1], pw[1]};
  }
  if (a.auto_pad == "VALID") return {0, 0, 0, 0};
  auto p = a.pads.value_or(std::vector<std::int64_t>{0, 0, 0, 0});
  if (p.size() != 4) p = {0, 0, 0, 0};
  return {u32(p[0]), u32(p[1]), u32(p[2]), u32(p[3])};
}

// Conv / ConvInteger / QLinearConv options for a 4-D input x [N, C, H, W]
// and weights [Cout, Cin/groups, kh, kw], or a 3-D one (x [N, C, L],
// weights [Cout, Cin/groups, k]: the 2-D one with H = 1, its strides and
// dilations led by 1, its pads by 0 at each end). No bias, no activation.
inline ops::Conv2dOptions conv_options(const WindowAttrs& at, const std::vector<std::int64_t>& x,
                                       const std::vector<std::int64_t>& w) {
  const bool one_d = x.size() == 3;
  auto lead = [&](std::vector<std::int64_t> v) {
    if (one_d && v.size() == 1) v.insert(v.begin(), 1);
    return v;
  };
  ops::Conv2dOptions o;
  auto strides = lead(at.strides.value_or(std::vector<std::int64_t>{1, 1}));
  auto dil = lead(at.dilations.value_or(std::vector<std::int64_t>{1, 1}));
  if (strides.size() != 2) strides = {1, 1};
  if (dil.size() != 2) dil = {1, 1};
  o.strides = {u32(strides[0]), u32(strides[1])};
  o.dilations = {u32(dil[0]), u32(dil[1])};
  o.groups = u32(at.groups());
  if (one_d) {
    WindowAttrs a = at;
    if (a.pads && a.pads->size() == 2) a.pads = std::vector<std::int64_t>{0, (*a.pads)[0], 0, (*a.pads)[1]};
    o.pads = conv_pads(a, 1, x[2], 1, w.size() > 2 ? w[2] : 1, strides, dil);
  } else {
    o.pads = conv_pads(at, x[2], x[3], w[2], w[3], strides, dil);
  }
  return o;
}
inline ops::Conv2dOptions conv_options(const Attrs& at, const std::vector<std::int64_t>& x,
                                       const std::vector<std::int64_t>& w) {
  return conv_options(WindowAttrs::read(at), x, w);
}

// ConvTranspose for a 4-D input x [N, C, H, W] and weights [Cin,
// Cout/groups, kh, kw], or a 3-D one ([N, C, L], [Cin, Cout/groups, k],
// as H = 1; out[0] is then 1): the options (pads from `pads`, or worked out from
// output_shape or auto_pad as ONNX says) and the output's H and W. An
// output_shape larger than the full output adds output padding at the end
// (which the op takes up to max(stride, dilation) - 1 of).
struct ConvTransposeGeometry {
  ops::Conv2dOptions options;
  std::array<std::int64_t, 2> out{};
};

// One dimension of a transposed convolution: `in` inputs, a kernel of `k`
// taps, the pads given, or worked out from the output length wanted
// (output_shape, or auto_pad SAME: `want`, -1 for none) as ONNX says: the
// pads at both ends and the output's length. A wanted length beyond the
// full output is output padding at the end.
struct TransposeExtent {
  std::int64_t begin = 0, end = 0, out = 0;
};
inline TransposeExtent transpose_extent(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t dilation,
                                        std::int64_t output_padding, std::int64_t begin, std::int64_t end,
                                        std::int64_t want, bool upper) {
  const std::int64_t full = stride * (in - 1) + output_padding + (k - 1) * dilation + 1;
  std::int64_t extra = 0;
  if (want >= 0) {
    const std::int64_t total = full - want;
    begin = total < 0 ? 0 : upper ? total / 2 : total - total / 2;
    end = total < 0 ? 0 : upper ? total - total / 2 : total / 2;
    extra = total < 0 ? -total : 0;
  }
  return {begin, end, full - begin - end + extra};
}

inline ConvTransposeGeometry conv_transpose_options(const WindowAttrs& at, const std::vector<std::int64_t>& x,
                                                    const std::vector<std::int64_t>& w) {
  // A 1-D one (x [N, C, L], weights [Cin, Cout/groups, k]) is the 2-D one
  // with H = 1: its attributes gain a leading 1 (strides, dilations), 0
  // (output_padding, each end's pads) or 1 (output_shape's H).
  const bool one_d = x.size() == 3;
  const std::vector<std::int64_t> x4 = one_d ? std::vector<std::int64_t>{x[0], x[1], 1, x[2]} : x;
  const std::vector<std::int64_t> w4 = one_d ? std::vector<std::int64_t>{w[0], w[1], 1, w.size() > 2 ? w[2] : 1} : w;
  const std::size_t dims = one_d ? 1 : 2;
  auto lead = [&](std::vector<std::int64_t> v, std::int64_t first) {
    if (one_d && v.size() == 1) v.insert(v.begin(), first);
    return v;
  };
  ConvTransposeGeometry g;
  auto strides = lead(at.strides.value_or(std::vector<std::int64_t>(dims, 1)), 1);
  auto dil = lead(at.dilations.value_or(std::vector<std::int64_t>(dims, 1)), 1);
  auto opad = lead(at.output_padding.value_or(std::vector<std::int64_t>(dims, 0)), 0);
  if (strides.size() != 2) strides = {1, 1};
  if (dil.size() != 2) dil = {1, 1};
  if (opad.size() != 2) opad = {0, 0};
  ops::Conv2dOptions& o = g.options;
  o.strides = {u32(strides[0]), u32(strides[1])};
  o.dilations = {u32(dil[0]), u32(dil[1])};
  o.groups = u32(at.groups());
  auto pads = at.pads.value_or(std::vector<std::int64_t>(2 * dims, 0));
  if (one_d && pads.size() == 2) pads = {0, pads[0], 0, pads[1]};
  const auto output_shape = lead(at.output_shape.value_or(std::vector<std::int64_t>{}), 1);
  for (std::size_t k = 0; k < 2; ++k) {
    std::int64_t want = -1;
    if (output_shape.size() >= 2)
      want = output_shape[output_shape.size() - 2 + k];
    else if (at.auto_pad == "SAME_UPPER" || at.auto_pad == "SAME_LOWER")
      want = x4[2 + k] * strides[k];
    const TransposeExtent e =
        transpose_extent(x4[2 + k], w4[2 + k], strides[k], dil[k], opad[k], pads.size() == 4 ? pads[k] : 0,
                         pads.size() == 4 ? pads[k + 2] : 0, want, at.auto_pad == "SAME_UPPER");
    o.pads[k] = static_cast<std::uint32_t>(e.begin);
    o.pads[k + 2] = static_cast<std::uint32_t>(e.end);
    g.out[k] = e.out;
  }
  return g;
}

// ConvTranspose for a 5-D input x [N, C, D, H, W] and weights [Cin,
// Cout/groups, kd, kh, kw]: the 2-D geometry over (H, W), as above, and
// the depth's own.
struct ConvTranspose3dGeometry {
  ConvTransposeGeometry plane;
  std::int64_t stride = 1, dilation = 1, pad_front = 0, out_depth = 0;
};

inline ConvTranspose3dGeometry conv_transpose3d_options(const WindowAttrs& at, const std::vector<std::int64_t>& x,
                                                        const std::vector<std::int64_t>& w) {
  // Each attribute's last three values (an output_shape may be the whole
  // shape; pads are six) split into the depth's and those of H and W.
  auto tail = [](const std::optional<std::vector<std::int64_t>>& v) -> std::optional<std::vector<std::int64_t>> {
    if (!v || v->size() < 3) return std::nullopt;
    return std::vector<std::int64_t>{(*v)[v->size() - 2], (*v)[v->size() - 1]};
  };
  auto first = [](const std::optional<std::vector<std::int64_t>>& v, std::int64_t def) {
    return v && v->size() >= 3 ? (*v)[v->size() - 3] : def;
  };
  WindowAttrs hw = at;
  hw.strides = tail(at.strides);
  hw.dilations = tail(at.dilations);
  hw.output_padding = tail(at.output_padding);
  hw.output_shape = tail(at.output_shape);
  const bool six = at.pads && at.pads->size() == 6;
  hw.pads = six ? std::optional<std::vector<std::int64_t>>({(*at.pads)[1], (*at.pads)[2], (*at.pads)[4], (*at.pads)[5]})
                : std::nullopt;
  ConvTranspose3dGeometry g;
  g.plane = conv_transpose_options(hw, {x[0], x[1], x[3], x[4]}, {w[0], w[1], w[3], w[4]});
  g.stride = first(at.strides, 1);
  g.dilation = first(at.dilations, 1);
  std::int64_t want = first(at.output_shape, -1);
  if (want < 0 && (at.auto_pad == "SAME_UPPER" || at.auto_pad == "SAME_LOWER")) want = x[2] * g.stride;
  const TransposeExtent e =
      transpose_extent(x[2], w[2], g.stride, g.dilation, first(at.output_padding, 0), six ? (*at.pads)[0] : 0,
                       six ? (*at.pads)[3] : 0, want, at.auto_pad == "SAME_UPPER");
  g.pad_front = e.begin;
  g.out_depth = e.out;
  return g;
}
inline ConvTransposeGeometry conv_transpose_options(const Attrs& at, const std::vector<std::int64_t>& x,
                                                    const std::vector<std::int64_t>& w) {
  return conv_transpose_options(WindowAttrs::read(at), x, w);
}

// MaxPool / AveragePool / GlobalAveragePool / GlobalMaxPool options for an
// input of rank 3 ([N, C, W], pooled as H = 1) or 4 ([N, C, H, W]).
inline ops::Pool2dOptions pool_options(const WindowAttrs& at, const std::vector<std::int64_t>& x) {
  const bool one_d = x.size() == 3;
  const std::int64_t h = one_d ? 1 : x[2], w = one_d ? x[2] : x[3];
  ops::Pool2dOptions o;
  if (at.global) {
    o.kernel = {u32(h), u32(w)};
    return o;
  }
  auto k = at.kernel_shape.value_or(std::vector<std::int64_t>{});
  auto s = at.strides.value_or(std::vector<std::int64_t>(k.size(), 1));
  auto d = at.dilations.value_or(std::vector<std::int64_t>(k.size(), 1));
  if (one_d) {
    k.insert(k.begin(), 1);
    s.insert(s.begin(), 1);
    d.insert(d.begin(), 1);
  }
  if (k.size() != 2 || s.size() != 2 || d.size() != 2) return o;
  o.kernel = {u32(k[0]), u32(k[1])};
  o.strides = {u32(s[0]), u32(s[1])};
  o.dilations = {u32(d[0]), u32(d[1])};
  o.ceil_mode = at.ceil_mode;
  o.count_include_pad = at.count_include_pad;
  if (at.auto_pad == "SAME_UPPER" || at.auto_pad == "SAME_LOWER") {
    const bool lower = at.auto_pad == "SAME_LOWER";
    auto ph = ops::same_pads(u32(h), o.kernel[0], o.strides[0], o.dilations[0], lower);
    auto pw = ops::same_pads(u32(w), o.kernel[1], o.strides[1], o.dilations[1], lower);
    o.pads = {ph[0], pw[0], ph[1], pw[1]};
  } else if (at.auto_pad == "NOTSET") {
    auto p = at.pads.value_or(std::vector<std::int64_t>(2 * (one_d ? 1 : 2), 0));
    if (one_d && p.size() == 2)
      o.pads = {0, u32(p[0]), 0, u32(p[1])};
    else if (!one_d && p.size() == 4)
      o.pads = {u32(p[0]), u32(p[1]), u32(p[2]), u32(p[3])};
  }
  return o;
}
inline ops::Pool2dOptions pool_options(const Attrs& at, const std::vector<std::int64_t>& x) {
  return pool_options(WindowAttrs::read(at), x);
}

// Resize's and Upsample's attributes.
struct ResizeAttrs {
  bool upsample = false;  // Upsample (always asymmetric, nearest rounded down)
  std::string mode = "nearest";
  std::string coordinate = "half_pixel";  // coordinate_transformation_mode
  std::string nearest_mode = "round_prefer_floor";
  std::int64_t exclude_outside = 0;

  static ResizeAttrs read(const Attrs& a) {
    ResizeAttrs r;
    r.upsample = a.node.op_type() == "Upsample";
    r.mode = a.s("mode", "nearest");
    r.coordinate = a.s("coordinate_transformation_mode", "half_pixel");
    r.nearest_mode = a.s("nearest_mode", "round_prefer_floor");
    r.exclude_outside = a.i("exclude_outside", 0);
    return r;
  }
};

// Why Resize (or Upsample) with these attributes cannot run on the engine
// at `opset`; empty if it can.
inline std::string resize_unsupported(const ResizeAttrs& a, int opset) {
  if (!a.upsample && opset < 10) return "Resize before opset 10";
  if (a.mode == "cubic") return "cubic interpolation";
  if (a.mode != "nearest" && a.mode != "linear" && a.mode != "bilinear") return "mode " + a.mode;
  if (a.coordinate == "tf_crop_and_resize") return "tf_crop_and_resize coordinates";
  if (!rt::detail::coordinate_modes().count(a.coordinate)) return "coordinate mode " + a.coordinate;
  if (a.exclude_outside != 0) return "exclude_outside";
  return {};
}
inline std::string resize_unsupported(const Attrs& a, int opset) {
  return resize_unsupported(ResizeAttrs::read(a), opset);
}

// Resize options (mode, coordinates, nearest rounding; not the scales).
// Upsample and Resize before opset 11 map coordinates as asymmetric and
// round nearest down, as those versions define.
inline ops::ResizeOptions resize_options(const ResizeAttrs& a, int opset) {
  ops::ResizeOptions o;
  o.mode = a.mode == "nearest" ? ResizeMode::Nearest : ResizeMode::Linear;
  if (a.upsample || opset < 11) {
    o.coordinate = CoordinateMode::Asymmetric;
    o.nearest = NearestMode::Floor;
    return o;
  }
  const auto& coordinates = rt::detail::coordinate_modes();
  const auto& nearest = rt::detail::nearest_modes();
  const auto c = coordinates.find(a.coordinate);
  if (c != coordinates.end()) o.coordinate = c->second;
  const auto nm = nearest.find(a.nearest_mode);
  if (nm != nearest.end()) o.nearest = nm->second;
  return o;
}
inline ops::ResizeOptions resize_options(const Attrs& a, int opset) {
  return resize_options(ResizeAttrs::read(a), opset);
}

}  // namespace tpuhal::rt::onnx_attrs
