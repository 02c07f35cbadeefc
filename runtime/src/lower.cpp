// Lowering's entry point (the lowerer itself: onnx/lowerer.hpp) and the
// conversions and quantisation parameters it shares with the compiler.
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "ir.hpp"
#include "onnx/lowerer.hpp"

namespace tpuhal::rt::detail {

QParams qparams(const Range& r) {
  const float lo = std::min(r.lo, 0.0f), hi = std::max(r.hi, 0.0f);
  QParams q;
  q.scale = (hi - lo) / 255.0f;
  // Any normal scale works, however small the range (outputs of networks
  // with untrained weights can lie within 1e-14 of zero); a range of zero
  // has none.
  if (!(q.scale >= std::numeric_limits<float>::min()) || !std::isfinite(q.scale)) q.scale = 1.0f / 255.0f;
  q.zero_point = static_cast<std::int32_t>(std::clamp(std::nearbyint(-lo / q.scale), 0.0f, 255.0f));
  return q;
}

bool fp16_holds(const Node& n, const std::map<std::string, Range>& ranges) {
  for (const std::string* v : {&n.inputs.at(0), &n.output}) {
    const auto it = ranges.find(*v);
    if (it == ranges.end()) continue;
    const float m = std::max(std::fabs(it->second.lo), std::fabs(it->second.hi));
    if (m != 0 && (m < 0x1p-6f || m > 0x1p14f)) return false;
  }
  return true;
}

Lowered lower(const Graph& g, Precision precision, const std::map<std::string, Range>* ranges,
              const std::set<std::string>& keep_fp16, bool nchw) {
  Lowerer l{g, precision, ranges, keep_fp16};
  l.nchw_only = nchw;
  if (precision == Precision::Int8 && g.qdq) l.fixed_q = qdq_params(g);
  l.run();
  return std::move(l.out);
}

}  // namespace tpuhal::rt::detail
