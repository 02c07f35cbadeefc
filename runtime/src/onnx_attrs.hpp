// ONNX node attributes and their translation into tpuhal op options, shared
// by the compiler (onnx_import.cpp) and the ONNX node tests
// (tests/onnx/onnx_node_test.cpp), so that both read Conv and pooling
// attributes the same way. Header-only: the node tests include it without
// linking the runtime.
#pragma once

#include <onnx/onnx_pb.h>

#include <array>
#include <cstdint>
#include <initializer_list>
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
  // The first attribute present other than `known`; empty if none.
  std::string unknown(std::initializer_list<const char*> known) const {
    for (const auto& a : node.attribute()) {
      bool ok = false;
      for (auto k : known) ok = ok || a.name() == k;
      if (!ok) return a.name();
    }
    return {};
  }
};

inline std::uint32_t u32(std::int64_t v) { return static_cast<std::uint32_t>(v); }

// Pads (top, left, bottom, right) from `pads` or `auto_pad` for a 2-D
// window of `kh` x `kw` over an `h` x `w` input.
inline std::array<std::uint32_t, 4> conv_pads(const Attrs& a, std::int64_t h, std::int64_t w, std::int64_t kh,
                                              std::int64_t kw, const std::vector<std::int64_t>& strides,
                                              const std::vector<std::int64_t>& dil) {
  const std::string autopad = a.s("auto_pad", "NOTSET");
  if (autopad == "SAME_UPPER" || autopad == "SAME_LOWER") {
    const bool lower = autopad == "SAME_LOWER";
    auto ph = ops::same_pads(u32(h), u32(kh), u32(strides[0]), u32(dil[0]), lower);
    auto pw = ops::same_pads(u32(w), u32(kw), u32(strides[1]), u32(dil[1]), lower);
    return {ph[0], pw[0], ph[1], pw[1]};
  }
  if (autopad == "VALID") return {0, 0, 0, 0};
  auto p = a.ints("pads", {0, 0, 0, 0});
  if (p.size() != 4) p = {0, 0, 0, 0};
  return {u32(p[0]), u32(p[1]), u32(p[2]), u32(p[3])};
}

// Conv / ConvInteger / QLinearConv options for a 4-D input x [N, C, H, W]
// and weights [Cout, Cin/groups, kh, kw] (no bias, no activation).
inline ops::Conv2dOptions conv_options(const Attrs& at, const std::vector<std::int64_t>& x,
                                       const std::vector<std::int64_t>& w) {
  ops::Conv2dOptions o;
  auto strides = at.ints("strides", {1, 1});
  auto dil = at.ints("dilations", {1, 1});
  if (strides.size() != 2) strides = {1, 1};
  if (dil.size() != 2) dil = {1, 1};
  o.strides = {u32(strides[0]), u32(strides[1])};
  o.dilations = {u32(dil[0]), u32(dil[1])};
  o.groups = u32(at.i("group", 1));
  o.pads = conv_pads(at, x[2], x[3], w[2], w[3], strides, dil);
  return o;
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
inline ConvTransposeGeometry conv_transpose_options(const Attrs& at, const std::vector<std::int64_t>& x,
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
  auto strides = lead(at.ints("strides", std::vector<std::int64_t>(dims, 1)), 1);
  auto dil = lead(at.ints("dilations", std::vector<std::int64_t>(dims, 1)), 1);
  auto opad = lead(at.ints("output_padding", std::vector<std::int64_t>(dims, 0)), 0);
  if (strides.size() != 2) strides = {1, 1};
  if (dil.size() != 2) dil = {1, 1};
  if (opad.size() != 2) opad = {0, 0};
  ops::Conv2dOptions& o = g.options;
  o.strides = {u32(strides[0]), u32(strides[1])};
  o.dilations = {u32(dil[0]), u32(dil[1])};
  o.groups = u32(at.i("group", 1));
  auto pads = at.ints("pads", std::vector<std::int64_t>(2 * dims, 0));
  if (one_d && pads.size() == 2) pads = {0, pads[0], 0, pads[1]};
  const auto output_shape = lead(at.ints("output_shape"), 1);
  const std::string autopad = at.s("auto_pad", "NOTSET");
  for (std::size_t k = 0; k < 2; ++k) {
    const std::int64_t full = strides[k] * (x4[2 + k] - 1) + opad[k] + (w4[2 + k] - 1) * dil[k] + 1;
    std::int64_t begin = pads.size() == 4 ? pads[k] : 0, end = pads.size() == 4 ? pads[k + 2] : 0;
    std::int64_t want = -1;
    if (output_shape.size() >= 2)
      want = output_shape[output_shape.size() - 2 + k];
    else if (autopad == "SAME_UPPER" || autopad == "SAME_LOWER")
      want = x4[2 + k] * strides[k];
    std::int64_t extra = 0;  // an output_shape beyond the full output: output padding at the end
    if (want >= 0) {
      const std::int64_t total = full - want;
      const bool upper = autopad == "SAME_UPPER";
      begin = total < 0 ? 0 : upper ? total / 2 : total - total / 2;
      end = total < 0 ? 0 : upper ? total - total / 2 : total / 2;
      extra = total < 0 ? -total : 0;
    }
    o.pads[k] = static_cast<std::uint32_t>(begin);
    o.pads[k + 2] = static_cast<std::uint32_t>(end);
    g.out[k] = full - begin - end + extra;
  }
  return g;
}

// MaxPool / AveragePool / GlobalAveragePool / GlobalMaxPool options for an
// input of rank 3 ([N, C, W], pooled as H = 1) or 4 ([N, C, H, W]).
inline ops::Pool2dOptions pool_options(const Attrs& at, const std::vector<std::int64_t>& x) {
  const std::string& op = at.node.op_type();
  const bool global = op.rfind("Global", 0) == 0;
  const bool one_d = x.size() == 3;
  const std::int64_t h = one_d ? 1 : x[2], w = one_d ? x[2] : x[3];
  ops::Pool2dOptions o;
  if (global) {
    o.kernel = {u32(h), u32(w)};
    return o;
  }
  auto k = at.ints("kernel_shape");
  auto s = at.ints("strides", std::vector<std::int64_t>(k.size(), 1));
  auto d = at.ints("dilations", std::vector<std::int64_t>(k.size(), 1));
  if (one_d) {
    k.insert(k.begin(), 1);
    s.insert(s.begin(), 1);
    d.insert(d.begin(), 1);
  }
  if (k.size() != 2 || s.size() != 2 || d.size() != 2) return o;
  o.kernel = {u32(k[0]), u32(k[1])};
  o.strides = {u32(s[0]), u32(s[1])};
  o.dilations = {u32(d[0]), u32(d[1])};
  o.ceil_mode = at.i("ceil_mode", 0) != 0;
  o.count_include_pad = at.i("count_include_pad", 0) != 0;
  const std::string autopad = at.s("auto_pad", "NOTSET");
  if (autopad == "SAME_UPPER" || autopad == "SAME_LOWER") {
    const bool lower = autopad == "SAME_LOWER";
    auto ph = ops::same_pads(u32(h), o.kernel[0], o.strides[0], o.dilations[0], lower);
    auto pw = ops::same_pads(u32(w), o.kernel[1], o.strides[1], o.dilations[1], lower);
    o.pads = {ph[0], pw[0], ph[1], pw[1]};
  } else if (autopad == "NOTSET") {
    auto p = at.ints("pads", std::vector<std::int64_t>(2 * (one_d ? 1 : 2), 0));
    if (one_d && p.size() == 2)
      o.pads = {0, u32(p[0]), 0, u32(p[1])};
    else if (!one_d && p.size() == 4)
      o.pads = {u32(p[0]), u32(p[1]), u32(p[2]), u32(p[3])};
  }
  return o;
}

// Why Resize (or Upsample) with these attributes cannot run on the engine
// at `opset`; empty if it can.
inline std::string resize_unsupported(const Attrs& a, int opset) {
  const std::string mode = a.s("mode", "nearest");
  const std::string coord = a.s("coordinate_transformation_mode", "half_pixel");
  if (a.node.op_type() == "Resize" && opset < 10) return "Resize before opset 10";
  if (mode == "cubic") return "cubic interpolation";
  if (mode != "nearest" && mode != "linear" && mode != "bilinear") return "mode " + mode;
  if (coord == "tf_crop_and_resize") return "tf_crop_and_resize coordinates";
  if (!rt::detail::coordinate_modes().count(coord)) return "coordinate mode " + coord;
  if (a.i("exclude_outside", 0) != 0) return "exclude_outside";
  return {};
}

// Resize options (mode, coordinates, nearest rounding; not the scales).
// Upsample and Resize before opset 11 map coordinates as asymmetric and
// round nearest down, as those versions define.
inline ops::ResizeOptions resize_options(const Attrs& a, int opset) {
  ops::ResizeOptions o;
  const std::string mode = a.s("mode", "nearest");
  o.mode = mode == "nearest" ? ResizeMode::Nearest : ResizeMode::Linear;
  if (a.node.op_type() == "Upsample" || opset < 11) {
    o.coordinate = CoordinateMode::Asymmetric;
    o.nearest = NearestMode::Floor;
    return o;
  }
  const auto& coordinates = rt::detail::coordinate_modes();
  const auto& nearest = rt::detail::nearest_modes();
  const auto c = coordinates.find(a.s("coordinate_transformation_mode", "half_pixel"));
  if (c != coordinates.end()) o.coordinate = c->second;
  const auto nm = nearest.find(a.s("nearest_mode", "round_prefer_floor"));
  if (nm != nearest.end()) o.nearest = nm->second;
  return o;
}

}  // namespace tpuhal::rt::onnx_attrs
