// Elementwise maps (with cast and transpose as strided identity), softmax,
// quantize and dequantize.
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine.h"
#include "numerics.h"

namespace tpuhal::sim::tensor {
namespace {

std::int64_t int_binary(fw::ElementwiseOp op, std::int64_t a, std::int64_t b) {
  switch (op) {
    case fw::ElementwiseOp::kAdd: return a + b;
    case fw::ElementwiseOp::kSub: return a - b;
    case fw::ElementwiseOp::kMul: return a * b;
    case fw::ElementwiseOp::kDiv: return b == 0 ? 0 : a / b;  // toward zero; x / 0 = 0
    case fw::ElementwiseOp::kMax: return std::max(a, b);
    case fw::ElementwiseOp::kMin: return std::min(a, b);
    default: return a;
  }
}

float float_binary(fw::ElementwiseOp op, float a, float b) {
  switch (op) {
    case fw::ElementwiseOp::kAdd: return a + b;
    case fw::ElementwiseOp::kSub: return a - b;
    case fw::ElementwiseOp::kMul: return a * b;
    case fw::ElementwiseOp::kDiv: return a / b;
    case fw::ElementwiseOp::kMax:
      return std::isnan(a) || std::isnan(b) ? std::numeric_limits<float>::quiet_NaN() : std::max(a, b);
    case fw::ElementwiseOp::kMin:
      return std::isnan(a) || std::isnan(b) ? std::numeric_limits<float>::quiet_NaN() : std::min(a, b);
    default: return a;
  }
}

float float_unary(const fw::ElementwiseAttrs& at, float x) {
  switch (static_cast<fw::ElementwiseOp>(at.op)) {
    case fw::ElementwiseOp::kActivation:
      return activate(static_cast<fw::Activation>(at.activation), at.alpha, at.beta, x);
    case fw::ElementwiseOp::kAbs: return std::fabs(x);
    case fw::ElementwiseOp::kNeg: return -x;
    case fw::ElementwiseOp::kExp: return std::exp(x);
    case fw::ElementwiseOp::kLog: return std::log(x);
    case fw::ElementwiseOp::kSqrt: return std::sqrt(x);
    case fw::ElementwiseOp::kErf: return std::erf(x);
    default: return x;
  }
}

// Casts one element: to float types round to nearest even; float to integer
// rounds toward zero and saturates (NaN: 0); integer to narrower integer
// saturates.
void cast_one(const std::byte* src, fw::DType st, std::byte* dst, fw::DType dt) {
  if (is_float(dt)) {
    store_float(dst, dt, is_float(st) ? load_float(src, st) : static_cast<float>(load_int(src, st)));
    return;
  }
  const std::int64_t v = is_float(st) ? truncate_saturate(load_float(src, st), int_min(dt), int_max(dt))
                                      : std::clamp<std::int64_t>(load_int(src, st), int_min(dt), int_max(dt));
  store_int_wrap(dst, dt, v);
}

}  // namespace

void elementwise(TensorEngine& e, const fw::ElementwiseAttrs& at, const View* v) {
  const View &a = v[0], &b = v[1], &y = v[2];
  const auto op = static_cast<fw::ElementwiseOp>(at.op);
  const bool binary = fw::is_binary(op);
  const View* views[3] = {&y, &a, &b};
  const View* unary_views[2] = {&y, &a};
  // Dense same-dtype copies go straight through memcpy.
  if (op == fw::ElementwiseOp::kIdentity && a.dtype == y.dtype && a.contiguous() && y.contiguous()) {
    std::memcpy(y.data, a.data, y.elements() * y.esize);
    return;
  }
  e.pool().parallel_for(y.elements(), [&](std::uint64_t begin, std::uint64_t end) {
    if (op == fw::ElementwiseOp::kIdentity) {
      for_each_index(y.shape, y.rank, unary_views, begin, end,
                     [&](const std::uint64_t* off) { cast_one(a.at(off[1]), a.dtype, y.at(off[0]), y.dtype); });
    } else if (binary && is_float(y.dtype)) {
      for_each_index(y.shape, y.rank, views, begin, end, [&](const std::uint64_t* off) {
        store_float(y.at(off[0]), y.dtype,
                    float_binary(op, load_float(a.at(off[1]), a.dtype), load_float(b.at(off[2]), b.dtype)));
      });
    } else if (binary) {
      for_each_index(y.shape, y.rank, views, begin, end, [&](const std::uint64_t* off) {
        store_int_wrap(y.at(off[0]), y.dtype,
                       int_binary(op, load_int(a.at(off[1]), a.dtype), load_int(b.at(off[2]), b.dtype)));
      });
    } else if (is_float(y.dtype)) {
      for_each_index(y.shape, y.rank, unary_views, begin, end, [&](const std::uint64_t* off) {
        store_float(y.at(off[0]), y.dtype, float_unary(at, load_float(a.at(off[1]), a.dtype)));
      });
    } else {  // integer abs / neg
      for_each_index(y.shape, y.rank, unary_views, begin, end, [&](const std::uint64_t* off) {
        const std::int64_t x = load_int(a.at(off[1]), a.dtype);
        store_int_wrap(y.at(off[0]), y.dtype, op == fw::ElementwiseOp::kNeg ? -x : (x < 0 ? -x : x));
      });
    }
  });
}

void softmax(TensorEngine& e, const fw::SoftmaxAttrs& at, const View* v) {
  const View &x = v[0], &y = v[1];
  const std::uint32_t axis = at.axis;
  const std::uint64_t len = x.shape[axis];
  // Iterate over every index with the axis dimension collapsed to 1.
  View xs = x, ys = y;
  xs.shape[axis] = 1;
  ys.shape[axis] = 1;
  const View* views[2] = {&xs, &ys};
  const std::uint64_t rows = xs.elements();
  e.pool().parallel_for(rows, [&](std::uint64_t begin, std::uint64_t end) {
    std::vector<float> buf(len);
    for_each_index(xs.shape, xs.rank, views, begin, end, [&](const std::uint64_t* off) {
      float mx = -std::numeric_limits<float>::infinity();
      for (std::uint64_t i = 0; i < len; ++i) {
        buf[i] = load_float(x.at(off[0] + i * x.strides[axis]), x.dtype);
        mx = std::max(mx, buf[i]);
      }
      float sum = 0;
      for (std::uint64_t i = 0; i < len; ++i) sum += std::exp(buf[i] - mx);
      const float log_sum = std::log(sum);
      for (std::uint64_t i = 0; i < len; ++i) {
        const float r = at.log ? buf[i] - mx - log_sum : std::exp(buf[i] - mx) / sum;
        store_float(y.at(off[1] + i * y.strides[axis]), y.dtype, r);
      }
    });
  });
}

// y = saturate(round_half_even(x / scale) + zero_point), in f32.
void quantize(TensorEngine& e, const View* v) {
  const View &x = v[0], &scale = v[1], &zp = v[2], &y = v[3];
  const View zero{};
  const View* views[4] = {&y, &x, &scale, zp.present() ? &zp : &zero};
  const std::int32_t lo = int_min(y.dtype), hi = int_max(y.dtype);
  e.pool().parallel_for(y.elements(), [&](std::uint64_t begin, std::uint64_t end) {
    for_each_index(y.shape, y.rank, views, begin, end, [&](const std::uint64_t* off) {
      const float xv =
          is_float(x.dtype) ? load_float(x.at(off[1]), x.dtype) : static_cast<float>(load_int(x.at(off[1]), x.dtype));
      const float s = load_float(scale.at(off[2]), fw::DType::kF32);
      const std::int32_t z = zp.present() ? static_cast<std::int32_t>(load_int(zp.at(off[3]), zp.dtype)) : 0;
      const std::int32_t q = round_saturate(xv / s, INT32_MIN / 2, INT32_MAX / 2) + z;
      store_int_wrap(y.at(off[0]), y.dtype, std::min(std::max(q, lo), hi));
    });
  });
}

// y = (x - zero_point) * scale, in f32.
void dequantize(TensorEngine& e, const View* v) {
  const View &x = v[0], &scale = v[1], &zp = v[2], &y = v[3];
  const View zero{};
  const View* views[4] = {&y, &x, &scale, zp.present() ? &zp : &zero};
  e.pool().parallel_for(y.elements(), [&](std::uint64_t begin, std::uint64_t end) {
    for_each_index(y.shape, y.rank, views, begin, end, [&](const std::uint64_t* off) {
      const std::int64_t z = zp.present() ? load_int(zp.at(off[3]), zp.dtype) : 0;
      const float r =
          static_cast<float>(load_int(x.at(off[1]), x.dtype) - z) * load_float(scale.at(off[2]), fw::DType::kF32);
      store_float(y.at(off[0]), y.dtype, r);
    });
  });
}

}  // namespace tpuhal::sim::tensor
