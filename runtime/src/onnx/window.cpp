// Window attributes, checked (window.hpp).
#include "onnx/window.hpp"

#include "tpuhal/fw/window.h"

namespace tpuhal::rt::detail {

void check_window(const Importer& im, const Node& n, const onnx_attrs::WindowAttrs& a, std::size_t spatial) {
  constexpr std::int64_t kMaxStep = 0x7fffffff, kMaxPad = fw::kMaxWindowValue;
  auto each = [&](const char* attr, const std::optional<std::vector<std::int64_t>>& given, std::size_t count,
                  std::int64_t lo, std::int64_t hi) {
    if (!given) return;
    const auto& v = *given;
    if (count && v.size() != count)
      im.fail_node(n, std::string(attr) + " " + dims_text(v) + " has " + std::to_string(v.size()) + " entries; " +
                          std::to_string(spatial) + "-D windows take " + std::to_string(count));
    for (auto x : v)
      if (x < lo || x > hi)
        im.fail_node(n, std::string(attr) + " " + dims_text(v) + " has an entry outside [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]");
  };
  each("kernel_shape", a.kernel_shape, spatial, 1, kMaxStep);
  each("strides", a.strides, spatial, 1, kMaxStep);
  each("dilations", a.dilations, spatial, 1, kMaxStep);
  each("pads", a.pads, 2 * spatial, 0, kMaxPad);
  each("output_padding", a.output_padding, spatial, 0, kMaxPad);
  each("output_shape", a.output_shape, 0, 1, kMaxStep);
  if (a.group && (*a.group < 1 || *a.group > kMaxStep))
    im.fail_node(n, "group " + std::to_string(*a.group) + " is outside [1, " + std::to_string(kMaxStep) + "]");
  if (a.auto_pad != "NOTSET" && a.auto_pad != "SAME_UPPER" && a.auto_pad != "SAME_LOWER" && a.auto_pad != "VALID")
    im.fail_node(n, "auto_pad '" + a.auto_pad + "' is not NOTSET, SAME_UPPER, SAME_LOWER or VALID");
}

void check_window_fits(const Importer& im, const Node& n, const std::vector<std::int64_t>& x,
                       const std::vector<std::int64_t>& out, const std::string& window) {
  std::string extent;
  bool fits = true;
  for (std::size_t d = 2; d < out.size() && d < x.size(); ++d) {
    fits = fits && out[d] >= 1;
    extent += (d > 2 ? "x" : "") + std::to_string(x[d]);
  }
  if (!fits) im.fail_node(n, "its " + window + " does not fit the padded " + extent + " input");
}

Window3d window_3d(const onnx_attrs::WindowAttrs& a, const std::vector<std::int64_t>& x,
                   const std::array<std::int64_t, 3>& kernel) {
  using onnx_attrs::u32;
  Window3d w;
  for (std::size_t i = 0; i < 3; ++i) {
    if (a.strides && a.strides->size() == 3) w.strides[i] = u32((*a.strides)[i]);
    if (a.dilations && a.dilations->size() == 3) w.dilations[i] = u32((*a.dilations)[i]);
  }
  if (a.auto_pad == "SAME_UPPER" || a.auto_pad == "SAME_LOWER") {
    for (std::size_t i = 0; i < 3; ++i) {
      const auto p =
          ops::same_pads(u32(x[2 + i]), u32(kernel[i]), w.strides[i], w.dilations[i], a.auto_pad == "SAME_LOWER");
      w.pads[i] = p[0];
      w.pads[3 + i] = p[1];
    }
  } else if (a.auto_pad == "NOTSET" && a.pads && a.pads->size() == 6) {
    for (std::size_t i = 0; i < 6; ++i) w.pads[i] = u32((*a.pads)[i]);
  }
  return w;
}

std::int64_t pool_out(std::int64_t in, std::uint32_t k, std::uint32_t s, std::uint32_t d, std::uint32_t pb,
                      std::uint32_t pe, bool ceil) {
  if (in < 0) return 0;
  return static_cast<std::int64_t>(fw::window_output(static_cast<std::uint64_t>(in), k, s, d, pb, pe, ceil));
}

}  // namespace tpuhal::rt::detail
