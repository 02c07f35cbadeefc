// Selection kernels (kernel.h): top_k (argmax, argmin), gather,
// scatter_elements and nms. They copy elements or compare them, so both
// builds give the simulator's bits (simulator/src/tensor/selection.cpp,
// nms.cpp). None has scratch memory: an item that needs an order (the k
// best of a lane, the candidates of a batch by score) finds each next
// element by scanning again for the best one after the last it took.
#pragma once

#include "kernel.h"

namespace tpuhal::cuda::k {

namespace sel {

// The offset in `t` of lane `lane`: the row-major number of a position in
// `shape`'s dimensions but `axis`, with `t`'s strides (t may be larger
// than `shape` there, as scatter_elements' Y is than its Indices).
TK_FN std::int64_t lane_offset(const Tensor& shape, const Tensor& t, std::uint32_t axis, std::uint64_t lane) {
  std::int64_t off = 0;
  for (std::uint32_t d = shape.rank; d-- > 0;) {
    if (d == axis) continue;
    const std::uint64_t s = shape.shape[d];
    off += static_cast<std::int64_t>(lane % s) * t.strides[d];
    lane /= s;
  }
  return off;
}

// The number of lanes of `t` along `axis`: none where the axis is empty.
TK_FN std::uint64_t lanes(const Tensor& t, std::uint32_t axis) {
  if (t.shape[axis] == 0) return 0;
  return numel(t) / t.shape[axis];
}

// Copies one element's bytes, so every dtype (and every NaN) is exact.
TK_FN void copy_element(const Tensor& to, std::int64_t to_off, const Tensor& from, std::int64_t from_off) {
  const std::uint32_t size = size_of(to.dtype);
  const auto* s = reinterpret_cast<const unsigned char*>(from.addr) + from_off * size;
  auto* d = reinterpret_cast<unsigned char*>(to.addr) + to_off * size;
  for (std::uint32_t b = 0; b < size; ++b) d[b] = s[b];
}

// Whether `v` is a valid index into an axis of `dim` entries.
TK_FN bool in_axis(std::int64_t v, std::int64_t dim) { return v >= -dim && v < dim; }

// The NaN an f32 operation on a and b gives on the simulator's x86 host,
// where the GPU would give its one canonical NaN: a NaN operand comes out
// quieted, the first if both are; an invalid operation (inf - inf, 0 *
// inf) gives the default NaN, negative. `r` is the operation's result.
TK_FN float x86_nan(float a, float b, float r) {
  if (a != a) return bits_float(float_bits(a) | 0x400000u);
  if (b != b) return bits_float(float_bits(b) | 0x400000u);
  if (r != r) return bits_float(0xffc00000u);
  return r;
}

}  // namespace sel

// ---- top_k ---------------------------------------------------------------------

// top_k(x, values, indices): one item per lane (a position of every
// dimension but the axis) selects its k elements best first.
struct TopKParams {
  std::uint64_t n;            // lanes
  Tensor x, values, indices;  // values.addr == 0: absent
  std::uint32_t axis, largest, last_index;
};

namespace sel {

// Element `off` of x as a sort key: f32 and i32 alike are exact in double.
TK_FN double top_k_key(const Tensor& x, std::int64_t off) {
  return is_float(x.dtype) ? static_cast<double>(load_f(x, off)) : static_cast<double>(load_i(x, off));
}

// docs/ops.md's order: NaN first; then by value (descending for largest);
// then by index, ascending unless last_index. A strict total order.
TK_FN bool top_k_before(const TopKParams& p, double a, std::int64_t ai, double b, std::int64_t bi) {
  const bool an = a != a, bn = b != b;
  if (an != bn) return an;
  if (!an && a != b) return p.largest ? a > b : a < b;
  return p.last_index ? ai > bi : ai < bi;
}

}  // namespace sel

TK_FN void top_k_body(const TopKParams& p, std::uint64_t lane) {
  const std::uint32_t axis = p.axis;
  const auto len = static_cast<std::int64_t>(p.x.shape[axis]);
  const auto k = static_cast<std::int64_t>(p.indices.shape[axis]);
  const std::int64_t xo = sel::lane_offset(p.x, p.x, axis, lane), xs = p.x.strides[axis];
  const std::int64_t io = sel::lane_offset(p.x, p.indices, axis, lane), is = p.indices.strides[axis];
  const std::int64_t vo = p.values.addr ? sel::lane_offset(p.x, p.values, axis, lane) : 0;
  double last_value = 0;
  std::int64_t last = -1;
  for (std::int64_t j = 0; j < k; ++j) {
    // The best element after the one taken last.
    double best_value = 0;
    std::int64_t best = -1;
    for (std::int64_t i = 0; i < len; ++i) {
      const double v = sel::top_k_key(p.x, xo + i * xs);
      if (last >= 0 && !sel::top_k_before(p, last_value, last, v, i)) continue;
      if (best < 0 || sel::top_k_before(p, v, i, best_value, best)) best = i, best_value = v;
    }
    if (best < 0) return;  // k > len: the builder refuses it
    store_i(p.indices, io + j * is, static_cast<std::int32_t>(best));
    if (p.values.addr) sel::copy_element(p.values, vo + j * p.values.strides[axis], p.x, xo + best * xs);
    last = best, last_value = best_value;
  }
}

// ---- Index checks (gather, scatter_elements) ------------------------------------

// Raises kFaultIndexOutOfRange for an element of Indices outside
// [-dim, dim), one item per element; the op's other kernels then write
// nothing.
struct SelectionIndexCheckParams {
  std::uint64_t n;  // Indices' elements
  Tensor indices;
  std::int64_t dim;
  std::uint32_t tensor;  // Indices' position among the op's tensors
  std::uint32_t reserved;
  Fault fault;
};

TK_FN void selection_index_check_body(const SelectionIndexCheckParams& p, std::uint64_t i) {
  const std::int64_t v = load_i(p.indices, offset_of(p.indices, i));
  if (!sel::in_axis(v, p.dim)) raise(p.fault, kFaultIndexOutOfRange, p.tensor, v, p.dim);
}

// ---- gather ---------------------------------------------------------------------

// gather(x, indices, y): one item per element of Y, whose dimensions are
// X's before the axis, Indices', then X's after the axis.
struct GatherParams {
  std::uint64_t n;  // Y's elements
  Tensor x, indices, y;
  std::uint32_t axis, reserved;
  Fault fault;
};

TK_FN void gather_body(const GatherParams& p, std::uint64_t i) {
  if (raised(p.fault)) return;
  const std::uint32_t axis = p.axis, ir = p.indices.rank;
  std::int64_t xo = 0, io = 0;
  std::uint64_t rem = i;
  for (std::uint32_t d = p.y.rank; d-- > 0;) {
    const auto c = static_cast<std::int64_t>(rem % p.y.shape[d]);
    rem /= p.y.shape[d];
    if (d < axis)
      xo += c * p.x.strides[d];
    else if (d < axis + ir)
      io += c * p.indices.strides[d - axis];
    else
      xo += c * p.x.strides[d - ir + 1];
  }
  const auto dim = static_cast<std::int64_t>(p.x.shape[axis]);
  const std::int64_t v = load_i(p.indices, io);
  if (!sel::in_axis(v, dim)) return;  // the check raised the fault
  sel::copy_element(p.y, offset_of(p.y, i), p.x, xo + (v < 0 ? v + dim : v) * p.x.strides[axis]);
}

// ---- scatter_elements -----------------------------------------------------------

// Y = X, one item per element; nothing once a fault is raised.
struct SelectionCopyParams {
  std::uint64_t n;  // Y's elements
  Tensor x, y;
  Fault fault;
};

TK_FN void selection_copy_body(const SelectionCopyParams& p, std::uint64_t i) {
  if (raised(p.fault)) return;
  sel::copy_element(p.y, offset_of(p.y, i), p.x, offset_of(p.x, i));
}

// The updates: one item per lane of Indices along the axis. The updates of
// one lane land in one lane of Y and no other lane's do, so applying each
// lane's in order along the axis is Indices' row-major order wherever two
// of them meet.
struct ScatterParams {
  std::uint64_t n;  // lanes of Indices
  Tensor indices, updates, y;
  std::uint32_t axis, reduction;  // ScatterReduction: none, add, mul, max, min
  Fault fault;
};

namespace sel {

enum : std::uint32_t { kScatterNone = 0, kScatterAdd = 1, kScatterMul = 2, kScatterMax = 3, kScatterMin = 4 };

// Floats combine in f32 and round to Y's dtype; a NaN on either side of
// max or min gives NaN; otherwise std::max and std::min's choice.
TK_FN float combine_f(float a, float b, std::uint32_t r) {
  const bool nan = a != a || b != b;
  switch (r) {
    case kScatterAdd: return x86_nan(a, b, a + b);
    case kScatterMul: return x86_nan(a, b, a * b);
    case kScatterMax: return nan ? bits_float(0x7fc00000u) : (a < b ? b : a);
    case kScatterMin: return nan ? bits_float(0x7fc00000u) : (b < a ? b : a);
    default: return a;
  }
}

// Integers combine exactly in 64 bits (|a|, |b| <= 2^31) and wrap.
TK_FN std::int64_t combine_i(std::int64_t a, std::int64_t b, std::uint32_t r) {
  switch (r) {
    case kScatterAdd: return a + b;
    case kScatterMul: return a * b;
    case kScatterMax: return a < b ? b : a;
    case kScatterMin: return b < a ? b : a;
    default: return a;
  }
}

TK_FN void scatter_combine(const Tensor& y, std::int64_t yo, const Tensor& u, std::int64_t uo, std::uint32_t r) {
  if (r == kScatterNone) {
    copy_element(y, yo, u, uo);
  } else if (is_float(y.dtype)) {
    store_f(y, yo, combine_f(load_f(y, yo), load_f(u, uo), r));
  } else {
    const std::int64_t v = combine_i(load_i(y, yo), load_i(u, uo), r);
    store_i(y, yo, static_cast<std::int32_t>(static_cast<std::uint32_t>(static_cast<std::uint64_t>(v))));
  }
}

}  // namespace sel

TK_FN void scatter_body(const ScatterParams& p, std::uint64_t lane) {
  if (raised(p.fault)) return;
  const std::uint32_t axis = p.axis;
  const std::int64_t io = sel::lane_offset(p.indices, p.indices, axis, lane);
  const std::int64_t uo = sel::lane_offset(p.indices, p.updates, axis, lane);
  const std::int64_t yo = sel::lane_offset(p.indices, p.y, axis, lane);
  const auto dim = static_cast<std::int64_t>(p.y.shape[axis]);
  const std::uint64_t count = p.indices.shape[axis];
  for (std::uint64_t j = 0; j < count; ++j) {
    const auto step = static_cast<std::int64_t>(j);
    const std::int64_t v = load_i(p.indices, io + step * p.indices.strides[axis]);
    if (!sel::in_axis(v, dim)) continue;  // the check raised the fault
    const std::int64_t at = yo + (v < 0 ? v + dim : v) * p.y.strides[axis];
    sel::scatter_combine(p.y, at, p.updates, uo + step * p.updates.strides[axis], p.reduction);
  }
}

// ---- nms ------------------------------------------------------------------------

// nms(boxes, scores, y): one item per batch does the whole greedy
// suppression. The candidates are taken in order by scanning for the
// best after the last taken; each kept box's index is held in its own row
// of Y (raw bits in the row's first element, or first two for 16-bit
// dtypes) until the rows are written at the end, so a kept box is read
// back from the inputs exactly, whatever Y's dtype.
struct NmsParams {
  std::uint64_t n;  // batches
  Tensor boxes, scores, y;
  float iou_threshold, score_threshold;
  std::uint32_t center, class_agnostic;
};

namespace sel {

struct NmsBox {
  float score;
  std::uint32_t cls;
  float x1, y1, x2, y2, area;
};

// A box's score: its best class's, the first of the highest; NaN never wins.
TK_FN float nms_score(const NmsParams& p, std::uint64_t b, std::uint64_t i, std::uint32_t* cls) {
  const Tensor& s = p.scores;
  const std::int64_t base = static_cast<std::int64_t>(b) * s.strides[0] + static_cast<std::int64_t>(i) * s.strides[1];
  float best = bits_float(0xff800000u);  // -inf
  *cls = 0;
  for (std::uint64_t c = 0; c < s.shape[2]; ++c) {
    const float v = load_f(s, base + static_cast<std::int64_t>(c) * s.strides[2]);
    if (v > best) best = v, *cls = static_cast<std::uint32_t>(c);
  }
  return best;
}

// Box i's corners and area, in the simulator's f32 operations.
TK_FN NmsBox nms_box(const NmsParams& p, std::uint64_t b, std::uint64_t i) {
  const Tensor& t = p.boxes;
  const std::int64_t base = static_cast<std::int64_t>(b) * t.strides[0] + static_cast<std::int64_t>(i) * t.strides[1];
  float v[4];
  for (std::int64_t c = 0; c < 4; ++c) v[c] = load_f(t, base + c * t.strides[2]);
  NmsBox k{};
  k.score = nms_score(p, b, i, &k.cls);
  if (p.center) {
    const float hw = x86_nan(v[2], 2.0f, v[2] / 2), hh = x86_nan(v[3], 2.0f, v[3] / 2);
    k.x1 = x86_nan(v[0], hw, v[0] - hw), k.y1 = x86_nan(v[1], hh, v[1] - hh);
    k.x2 = x86_nan(v[0], hw, v[0] + hw), k.y2 = x86_nan(v[1], hh, v[1] + hh);
  } else {
    k.x1 = v[0], k.y1 = v[1], k.x2 = v[2], k.y2 = v[3];
  }
  k.area = (k.x2 - k.x1) * (k.y2 - k.y1);
  return k;
}

// std::max and std::min, NaN cases included.
TK_FN float max_of(float a, float b) { return a < b ? b : a; }
TK_FN float min_of(float a, float b) { return b < a ? b : a; }

// torchvision's IoU of a kept box and a candidate.
TK_FN float nms_iou(const NmsBox& a, const NmsBox& b) {
  const float w = max_of(0.0f, min_of(a.x2, b.x2) - max_of(a.x1, b.x1));
  const float h = max_of(0.0f, min_of(a.y2, b.y2) - max_of(a.y1, b.y1));
  const float inter = w * h;
  return inter / (a.area + b.area - inter);
}

// The next candidate after (score, index) `last` (none: first), by score
// descending then index ascending; the box count when there is none.
TK_FN std::uint64_t nms_next(const NmsParams& p, std::uint64_t b, bool first, float last_score, std::uint64_t last) {
  const std::uint64_t n = p.boxes.shape[1];
  std::uint64_t best = n;
  float best_score = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint32_t cls = 0;
    const float s = nms_score(p, b, i, &cls);
    if (!(s > p.score_threshold)) continue;
    if (!first && !(s < last_score || (s == last_score && i > last))) continue;
    if (best == n || s > best_score) best = i, best_score = s;
  }
  return best;
}

TK_FN std::int64_t nms_at(const NmsParams& p, std::uint64_t b, std::uint64_t row, std::int64_t col) {
  const Tensor& y = p.y;
  return static_cast<std::int64_t>(b) * y.strides[0] + static_cast<std::int64_t>(row) * y.strides[1] +
         col * y.strides[2];
}

TK_FN void nms_hold(const NmsParams& p, std::uint64_t b, std::uint64_t row, std::uint64_t box) {
  const auto v = static_cast<std::uint32_t>(box);
  if (size_of(p.y.dtype) == 4) {
    *at<std::uint32_t>(p.y, nms_at(p, b, row, 0)) = v;
  } else {
    *at<std::uint16_t>(p.y, nms_at(p, b, row, 0)) = static_cast<std::uint16_t>(v & 0xffffu);
    *at<std::uint16_t>(p.y, nms_at(p, b, row, 1)) = static_cast<std::uint16_t>(v >> 16);
  }
}

TK_FN std::uint64_t nms_held(const NmsParams& p, std::uint64_t b, std::uint64_t row) {
  if (size_of(p.y.dtype) == 4) return *at<const std::uint32_t>(p.y, nms_at(p, b, row, 0));
  const std::uint32_t lo = *at<const std::uint16_t>(p.y, nms_at(p, b, row, 0));
  const std::uint32_t hi = *at<const std::uint16_t>(p.y, nms_at(p, b, row, 1));
  return lo | (hi << 16);
}

// Whether one of the `kept` boxes held in Y suppresses `k`.
TK_FN bool nms_suppressed(const NmsParams& p, std::uint64_t b, std::uint64_t kept, const NmsBox& k) {
  for (std::uint64_t r = 0; r < kept; ++r) {
    const NmsBox other = nms_box(p, b, nms_held(p, b, r));
    if ((p.class_agnostic || other.cls == k.cls) && nms_iou(other, k) > p.iou_threshold) return true;
  }
  return false;
}

// Y's rows from the held indices, then 0, 0, 0, 0, 0, -1 after them.
TK_FN void nms_write_rows(const NmsParams& p, std::uint64_t b, std::uint64_t kept) {
  for (std::uint64_t r = 0; r < p.y.shape[1]; ++r) {
    float row[6] = {0, 0, 0, 0, 0, -1};
    if (r < kept) {
      const NmsBox k = nms_box(p, b, nms_held(p, b, r));
      row[0] = k.x1, row[1] = k.y1, row[2] = k.x2, row[3] = k.y2, row[4] = k.score;
      row[5] = static_cast<float>(k.cls);
    }
    for (std::int64_t c = 0; c < 6; ++c) store_f(p.y, nms_at(p, b, r, c), row[c]);
  }
}

}  // namespace sel

TK_FN void nms_body(const NmsParams& p, std::uint64_t b) {
  const std::uint64_t rows = p.y.shape[1], n = p.boxes.shape[1];
  std::uint64_t kept = 0, last = 0;
  float last_score = 0;
  for (bool first = true; kept < rows; first = false) {
    const std::uint64_t i = sel::nms_next(p, b, first, last_score, last);
    if (i == n) break;
    const sel::NmsBox k = sel::nms_box(p, b, i);
    if (!sel::nms_suppressed(p, b, kept, k)) sel::nms_hold(p, b, kept++, i);
    last = i, last_score = k.score;
  }
  sel::nms_write_rows(p, b, kept);
}

}  // namespace tpuhal::cuda::k
