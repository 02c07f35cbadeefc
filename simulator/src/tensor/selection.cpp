// Ops that pick elements rather than compute them: top_k (and argmax),
// where, gather and scatter_elements. They copy bits (scatter_elements'
// reductions combine one pair at a time, in a fixed order), so they are
// exact on every host and ISA level.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "engine.h"
#include "numerics.h"
#include "simd.h"

namespace tpuhal::sim::tensor {

fw::Problem run_top_k(TensorEngine& e, const fw::TopKAttrs& at, const View* v) {
  const View &x = v[0], &values = v[1], &idx = v[2];
  const std::uint32_t axis = at.axis;
  const std::uint64_t len = x.shape[axis], k = idx.shape[axis];
  std::uint64_t outer = 1, inner = 1;
  for (std::uint32_t d = 0; d < axis; ++d) outer *= x.shape[d];
  for (std::uint32_t d = axis + 1; d < x.rank; ++d) inner *= x.shape[d];
  if (outer == 0 || inner == 0) return {};
  const bool floats = is_float(x.dtype), largest = at.largest != 0, last = at.last_index != 0;
  // The lane's offset (in elements) in a view, from the lane's number:
  // outer and inner indices unfolded over the dimensions around the axis.
  auto lane_offset = [&](const View& t, std::uint64_t lane) {
    std::uint64_t off = 0, rem = lane;
    for (std::uint32_t d = t.rank; d-- > 0;) {
      if (d == axis) continue;
      off += (rem % t.shape[d]) * t.strides[d];
      rem /= t.shape[d];
    }
    return off;
  };
  struct Key {
    double value;  // exact for every dtype (i32 included)
    bool nan;
    std::int64_t index;
  };
  // NaN first; then by value (descending for largest); then by index.
  auto before = [&](const Key& a, const Key& b) {
    if (a.nan != b.nan) return a.nan;
    if (!a.nan && a.value != b.value) return largest ? a.value > b.value : a.value < b.value;
    return last ? a.index > b.index : a.index < b.index;
  };
  e.pool().parallel_for(
      outer * inner,
      [&](std::uint64_t begin, std::uint64_t end) {
        std::vector<Key> keys(len);
        for (std::uint64_t lane = begin; lane < end; ++lane) {
          const std::uint64_t xo = lane_offset(x, lane);
          for (std::uint64_t i = 0; i < len; ++i) {
            const std::byte* p = x.at(xo + i * x.strides[axis]);
            if (floats) {
              const float f = load_float(p, x.dtype);
              keys[i] = {f, std::isnan(f), static_cast<std::int64_t>(i)};
            } else {
              keys[i] = {static_cast<double>(load_int(p, x.dtype)), false, static_cast<std::int64_t>(i)};
            }
          }
          std::partial_sort(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(k), keys.end(), before);
          const std::uint64_t io = lane_offset(idx, lane);
          const std::uint64_t vo = values.present() ? lane_offset(values, lane) : 0;
          for (std::uint64_t j = 0; j < k; ++j) {
            const auto index = static_cast<std::int32_t>(keys[j].index);
            std::memcpy(idx.at(io + j * idx.strides[axis]), &index, 4);
            if (values.present())
              std::memcpy(values.at(vo + j * values.strides[axis]),
                          x.at(xo + static_cast<std::uint64_t>(keys[j].index) * x.strides[axis]), x.esize);
          }
        }
      },
      std::max<std::uint64_t>(1, 16384 / std::max<std::uint64_t>(1, len)));
  return {};
}

fw::Problem run_where(TensorEngine& e, const fw::QuantAttrs& /*a*/, const View* v) {
  const View &cond = v[0], &a = v[1], &b = v[2], &y = v[3];
  const View* views[4] = {&cond, &a, &b, &y};
  const std::uint32_t esize = y.esize;
  e.pool().parallel_for(
      y.elements(),
      [&](std::uint64_t begin, std::uint64_t end) {
        for_each_index(y.shape, y.rank, views, begin, end, [&](const std::uint64_t* off) {
          const bool c = *cond.at(off[0]) != std::byte{0};
          std::memcpy(y.at(off[3]), c ? a.at(off[1]) : b.at(off[2]), esize);
        });
      },
      16384);
  return {};
}

fw::Problem run_gather(TensorEngine& e, const fw::GatherAttrs& at, const View* v) {
  const View &x = v[0], &idx = v[1], &y = v[2];
  const std::uint32_t axis = at.axis;
  const auto dim = static_cast<std::int64_t>(x.shape[axis]);
  auto index = [&](std::uint64_t off) { return load_int(idx.at(off), idx.dtype); };  // i32, u8 or i8
  // A table lookup: dense u8 indices into a dense 1-D table of at least
  // 256 byte-sized entries, each index in range by its type; i8 ones read
  // as two's complement bytes index the same entries (-1 is entry 255).
  if (x.rank == 1 && dim >= 256 && x.esize == 1 && (idx.dtype == fw::DType::kU8 || idx.dtype == fw::DType::kI8) &&
      x.contiguous() && idx.contiguous() && y.contiguous()) {
    const auto* table = reinterpret_cast<const std::uint8_t*>(x.data);
    const auto* in = reinterpret_cast<const std::uint8_t*>(idx.data);
    auto* out = reinterpret_cast<std::uint8_t*>(y.data);
    const std::uint64_t last = static_cast<std::uint64_t>(dim) - 256;  // i8: -1 is entry dim - 1
    const bool is_signed = idx.dtype == fw::DType::kI8;
    e.pool().parallel_for(y.elements(), [&](std::uint64_t begin, std::uint64_t end) {
      // The pointers as locals: a byte store may alias anything, so through
      // the captures the loop would load them again for every element.
      const std::uint8_t* const t = table;
      const std::uint8_t* const src = in;
      std::uint8_t* const dst = out;
      const std::uint64_t top = last;
      if (!is_signed || top == 0) {
        simd::lookup_u8(t, src + begin, dst + begin, end - begin);
      } else {
        for (std::uint64_t i = begin; i < end; ++i) dst[i] = t[src[i] + (src[i] >= 128 ? top : 0)];
      }
    });
    return {};
  }
  // Every index checked before Y is written: a bad one leaves Y as it was.
  const View* iviews[1] = {&idx};
  fw::Problem bad;
  for_each_index(idx.shape, idx.rank, iviews, 0, idx.elements(), [&](const std::uint64_t* off) {
    const std::int64_t i = index(off[0]);
    if ((i < -dim || i >= dim) && bad.status == fw::CmdStatus::kOk)
      bad = {fw::CmdStatus::kBadArgument, fw::tensor_data_field(1), static_cast<std::uint64_t>(i),
             static_cast<std::uint64_t>(dim)};
  });
  if (bad.status != fw::CmdStatus::kOk) return bad;
  // Y's index space over three views: X's offset without the axis, the
  // index's offset in Indices, and Y.
  View xv, iv;
  xv.rank = iv.rank = y.rank;
  for (std::uint32_t i = 0; i < axis; ++i) xv.strides[i] = x.strides[i];
  for (std::uint32_t i = 0; i < idx.rank; ++i) iv.strides[axis + i] = idx.strides[i];
  for (std::uint32_t i = axis + 1; i < x.rank; ++i) xv.strides[i - 1 + idx.rank] = x.strides[i];
  const View* views[3] = {&xv, &iv, &y};
  const std::uint64_t along = x.strides[axis];
  e.pool().parallel_for(
      y.elements(),
      [&](std::uint64_t begin, std::uint64_t end) {
        for_each_index(y.shape, y.rank, views, begin, end, [&](const std::uint64_t* off) {
          const std::int64_t i = index(off[1]);
          std::memcpy(y.at(off[2]), x.at(off[0] + static_cast<std::uint64_t>(i < 0 ? i + dim : i) * along), y.esize);
        });
      },
      16384);
  return {};
}

namespace {

// The element at p combined with the update at u by `r` (ScatterElementsAttrs):
// floats in f32, rounded to t; integers wrapping.
void scatter_combine(std::byte* p, const std::byte* u, fw::DType t, std::uint32_t esize, fw::ScatterReduction r) {
  using R = fw::ScatterReduction;
  if (r == R::kNone) {
    std::memcpy(p, u, esize);
    return;
  }
  if (is_float(t)) {
    const float a = load_float(p, t), b = load_float(u, t);
    const bool nan = std::isnan(a) || std::isnan(b);
    float out = a;
    switch (r) {
      case R::kAdd: out = a + b; break;
      case R::kMul: out = a * b; break;
      case R::kMax: out = nan ? std::numeric_limits<float>::quiet_NaN() : std::max(a, b); break;
      case R::kMin: out = nan ? std::numeric_limits<float>::quiet_NaN() : std::min(a, b); break;
      case R::kNone: break;
    }
    store_float(p, t, out);
    return;
  }
  const std::int64_t a = load_int(p, t), b = load_int(u, t);  // |a|, |b| <= 2^31: a * b fits
  std::int64_t out = a;
  switch (r) {
    case R::kAdd: out = a + b; break;
    case R::kMul: out = a * b; break;
    case R::kMax: out = std::max(a, b); break;
    case R::kMin: out = std::min(a, b); break;
    case R::kNone: break;
  }
  store_int_wrap(p, t, out);
}

}  // namespace

fw::Problem run_scatter_elements(TensorEngine& e, const fw::ScatterElementsAttrs& at, const View* v) {
  const View &x = v[0], &idx = v[1], &upd = v[2], &y = v[3];
  const std::uint32_t axis = at.axis;
  const auto dim = static_cast<std::int64_t>(x.shape[axis]);
  // Every index checked before Y is written: a bad one leaves Y as it was.
  const View* iviews[1] = {&idx};
  fw::Problem bad;
  for_each_index(idx.shape, idx.rank, iviews, 0, idx.elements(), [&](const std::uint64_t* off) {
    const std::int64_t i = load_int(idx.at(off[0]), idx.dtype);
    if ((i < -dim || i >= dim) && bad.status == fw::CmdStatus::kOk)
      bad = {fw::CmdStatus::kBadArgument, fw::tensor_data_field(1), static_cast<std::uint64_t>(i),
             static_cast<std::uint64_t>(dim)};
  });
  if (bad.status != fw::CmdStatus::kOk) return bad;
  // Y = X, unless Y is X itself: the HAL's builder refuses that, but the
  // board does not check a block's output against its inputs, and a copy
  // onto itself would be memcpy of overlapping bytes.
  const bool in_place = x.data == y.data && std::equal(x.strides, x.strides + x.rank, y.strides);
  if (!in_place) {
    const View* copy[2] = {&x, &y};
    e.pool().parallel_for(
        y.elements(),
        [&](std::uint64_t begin, std::uint64_t end) {
          for_each_index(y.shape, y.rank, copy, begin, end,
                         [&](const std::uint64_t* off) { std::memcpy(y.at(off[1]), x.at(off[0]), y.esize); });
        },
        16384);
  }
  // The updates one at a time, in Indices' row-major order: where indices
  // repeat, the later one lands later. Y's offset of each position without
  // its coordinate along the axis, which the index gives.
  View yv;
  yv.rank = idx.rank;
  for (std::uint32_t d = 0; d < idx.rank; ++d) yv.strides[d] = d == axis ? 0 : y.strides[d];
  const View* views[3] = {&idx, &upd, &yv};
  const auto reduction = static_cast<fw::ScatterReduction>(at.reduction);
  for_each_index(idx.shape, idx.rank, views, 0, idx.elements(), [&](const std::uint64_t* off) {
    const std::int64_t i = load_int(idx.at(off[0]), idx.dtype);
    const auto at_axis = static_cast<std::uint64_t>(i < 0 ? i + dim : i);
    scatter_combine(y.at(off[2] + at_axis * y.strides[axis]), upd.at(off[1]), y.dtype, y.esize, reduction);
  });
  return {};
}

}  // namespace tpuhal::sim::tensor
