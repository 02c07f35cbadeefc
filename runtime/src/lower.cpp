// The compiler's graph onto tpuhal ops in one precision. fp32, fp16, bf16:
// every activation in that type, weights converted, biases f32, the f32
// input cast on the device first and the outputs cast back last. int8:
// Conv, Gemm and MatMul by a constant as qlinear_conv over u8 activations
// (4-D ones NHWC) and per-output-channel i8 weights, MaxPool and reshapes
// on u8 as they are, everything else in f32 between a dequantize and a
// quantize (docs/runtime.md).
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "ir.hpp"
#include "onnx_attrs.hpp"
#include "tpuhal/error.hpp"

namespace tpuhal::rt::detail {

std::uint16_t to_f16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000;
  const std::uint32_t exp = (x >> 23) & 0xff;
  std::uint32_t man = x & 0x7fffff;
  if (exp == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00 | (man ? 0x200 : 0));
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7c00);
  if (e <= 0) {
    if (e < -10) return static_cast<std::uint16_t>(sign);
    man |= 0x800000;
    const int shift = 14 - e;
    std::uint32_t h = man >> shift;
    const std::uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = (static_cast<std::uint32_t>(e) << 10) | (man >> 13);
  const std::uint32_t rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // may carry into the exponent: correct
  return static_cast<std::uint16_t>(sign | h);
}

float from_f16(std::uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -24);
  if (e == 31) return m ? NAN : sign * INFINITY;
  return sign * std::ldexp(static_cast<float>(m + 1024), e - 25);
}

std::uint16_t to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if (std::isnan(f)) return static_cast<std::uint16_t>((x >> 16) | 0x40);
  const std::uint32_t r = x + 0x7fff + ((x >> 16) & 1);
  return static_cast<std::uint16_t>(r >> 16);
}

float from_bf16(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

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

namespace {

using nlohmann::json;
using onnx_attrs::Attrs;

json act_json(const ActivationParams& a) {
  static const char* names[] = {"none",       "relu", "clip",         "sigmoid",   "silu",
                                "leaky_relu", "tanh", "hard_sigmoid", "hard_swish"};
  return {{"kind", names[static_cast<int>(a.kind)]}, {"alpha", a.alpha}, {"beta", a.beta}};
}

// How a value is held. by_dtype: tensors in the value's own (ONNX, NCHW)
// shape. In int8, 4-D u8 activations live NHWC (`nhwc`), where the
// engine's integer convolution and pooling are fast; the NCHW forms are
// made from it only where something needs them.
struct Rep {
  std::map<DType, std::int64_t> by_dtype;
  DType primary = DType::F32;
  std::int64_t nhwc = -1;     // the u8 NHWC tensor, if any
  bool primary_nhwc = false;  // the value is produced as `nhwc`
  QParams q;
  std::int64_t q_scale = -1, q_zero = -1;  // weights tensors holding q
  bool boolean = false;                    // u8 1 or 0 (a comparison's or logic's result), never quantised
  std::int64_t primary_tensor() const { return primary_nhwc ? nhwc : by_dtype.at(primary); }
};

std::vector<std::int64_t> to_nhwc(const std::vector<std::int64_t>& s) { return {s[0], s[2], s[3], s[1]}; }

struct Lowerer {
  const Graph& g;
  Precision precision;
  const std::map<std::string, Range>* ranges;
  const std::set<std::string>& keep_fp16;  // int8: nodes that run in fp16
  DType act = DType::F32;                  // the activation type of float ops
  Lowered out;
  std::map<std::string, Rep> reps;
  std::map<std::pair<std::string, DType>, std::int64_t> const_cache;

  DeviceGraph& dg() { return out.graph; }

  std::int64_t add_raw(DType t, std::vector<std::int64_t> shape, const void* data, std::size_t bytes) {
    DTensor d;
    d.dtype = t;
    d.shape = std::move(shape);
    d.storage = Storage::Weights;
    d.offset = align64(out.weights.size());
    out.weights.resize(d.offset + bytes);
    if (bytes) std::memcpy(out.weights.data() + d.offset, data, bytes);
    dg().weight_bytes = out.weights.size();
    dg().tensors.push_back(std::move(d));
    return static_cast<std::int64_t>(dg().tensors.size() - 1);
  }

  std::int64_t add_weight(const std::vector<float>& v, DType t, std::vector<std::int64_t> shape) {
    switch (t) {
      case DType::F32: return add_raw(t, std::move(shape), v.data(), v.size() * 4);
      case DType::F16:
      case DType::BF16: {
        std::vector<std::uint16_t> h(v.size());
        for (std::size_t i = 0; i < v.size(); ++i) h[i] = t == DType::F16 ? to_f16(v[i]) : to_bf16(v[i]);
        return add_raw(t, std::move(shape), h.data(), h.size() * 2);
      }
      default: throw Error(Status::Internal, "compiler: add_weight of an integer type");
    }
  }

  std::int64_t scalar_f32(float v) { return add_raw(DType::F32, {}, &v, 4); }
  std::int64_t scalar_u8(std::int32_t v) {
    const auto b = static_cast<std::uint8_t>(v);
    return add_raw(DType::U8, {}, &b, 1);
  }

  std::int64_t op(std::string kind, const std::string& node, std::map<std::string, std::int64_t> operands,
                  json attrs = json::object()) {
    DOp o;
    o.kind = std::move(kind);
    o.node = node;
    o.operands = std::move(operands);
    o.attrs = std::move(attrs);
    dg().ops.push_back(std::move(o));
    return static_cast<std::int64_t>(dg().ops.size() - 1);
  }

  QParams range_q(const std::string& v) const {
    if (!ranges) throw Error(Status::Internal, "compiler: int8 lowering without ranges");
    auto it = ranges->find(v);
    if (it == ranges->end()) throw Error(Status::Internal, "compiler: no calibrated range for '" + v + "'");
    return qparams(it->second);
  }

  // Values written straight into their Concat's output: the Concat's
  // output value and the byte offset of the value's part, in `act`.
  struct Placement {
    std::string concat;
    std::uint64_t offset = 0;
  };
  std::map<std::string, Placement> placements;
  std::set<std::string> placed;  // values produced in their part of their Concat's output

  // A new arena tensor that holds value `v` in `t` (its primary form); for
  // a value placed in a Concat, that part of the Concat's output.
  std::int64_t produce(const std::string& v, DType t, const std::vector<std::int64_t>& shape) {
    std::int64_t id;
    if (auto pl = placements.find(v); pl != placements.end() && t == act) {
      const auto& cv = g.value(pl->second.concat);
      auto it = reps.find(pl->second.concat);
      const std::int64_t whole = it != reps.end() ? it->second.by_dtype.at(t) : produce(pl->second.concat, t, cv.shape);
      id = dg().add_subview(whole, shape, {}, pl->second.offset);
      dg().tensors[static_cast<std::size_t>(id)].value = v;
      placed.insert(v);
    } else {
      id = dg().add_arena(v, t, shape);
    }
    Rep& r = reps[v];
    r.by_dtype[t] = id;
    r.primary = t;
    if (t == DType::U8) r.q = range_q(v);
    return id;
  }

  // A new arena tensor that holds boolean value `v` as u8 1 or 0.
  std::int64_t produce_bool(const std::string& v, const std::vector<std::int64_t>& shape) {
    const auto id = dg().add_arena(v, DType::U8, shape);
    Rep& r = reps[v];
    r.by_dtype[DType::U8] = id;
    r.primary = DType::U8;
    r.boolean = true;
    return id;
  }

  // Boolean value `v` (a constant, or a comparison's or logic's result) as
  // u8 1 or 0.
  std::int64_t get_bool(const Node& n, const std::string& v) {
    const Value& val = g.value(v);
    if (val.data) {
      auto key = std::make_pair(v, DType::U8);
      if (auto it = const_cache.find(key); it != const_cache.end()) return it->second;
      std::vector<std::uint8_t> bits(val.data->size());
      for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = (*val.data)[i] != 0.0f;
      return const_cache[key] = add_raw(DType::U8, val.shape, bits.data(), bits.size());
    }
    auto it = reps.find(v);
    if (it == reps.end() || !it->second.boolean)
      throw Error(Status::Unsupported, "node '" + n.name + "' (" + n.op + "): input '" + v +
                                           "' is not a boolean the device computed (a comparison or logic)");
    return it->second.by_dtype.at(DType::U8);
  }

  // Value `v` in a view of another shape: same bytes, same quantisation.
  void alias(const std::string& v, const std::string& of, const std::vector<std::int64_t>& shape) {
    if (reps.at(of).primary_nhwc) get(of, DType::U8);  // a view needs the NCHW bytes
    Rep& from = reps.at(of);
    auto& held = from.by_dtype.at(from.primary);
    if (!dg().tensors[static_cast<std::size_t>(held)].strides.empty()) {  // a strided view: reshaped as a copy
      const auto copy = dg().add_arena("", from.primary, g.value(of).shape);
      op("cast", "", {{"x", held}, {"y", copy}});
      held = copy;
    }
    const Rep& src = from;
    const auto id = dg().add_view(src.by_dtype.at(src.primary), shape);
    dg().tensors[static_cast<std::size_t>(id)].value = v;
    Rep r;
    r.primary = src.primary;
    r.by_dtype[src.primary] = id;
    r.boolean = src.boolean;
    r.q = src.q;
    r.q_scale = src.q_scale;
    r.q_zero = src.q_zero;
    reps[v] = r;
  }

  void ensure_q_tensors(Rep& r) {
    if (r.q_scale < 0) {
      r.q_scale = scalar_f32(r.q.scale);
      r.q_zero = scalar_u8(r.q.zero_point);
    }
  }

  // Value `v` as a tensor of type `t`, converting on the device if needed.
  std::int64_t get(const std::string& v, DType t) {
    const Value& val = g.value(v);
    if (val.data) {
      if (t == DType::U8) throw Error(Status::Internal, "compiler: a constant as u8 activation");
      auto key = std::make_pair(v, t);
      if (auto it = const_cache.find(key); it != const_cache.end()) return it->second;
      return const_cache[key] = add_weight(*val.data, t, val.shape);
    }
    auto rit = reps.find(v);
    if (rit == reps.end()) throw Error(Status::Internal, "compiler: value '" + v + "' used before it is produced");
    Rep& r = rit->second;
    if (auto it = r.by_dtype.find(t); it != r.by_dtype.end()) return it->second;
    const auto shape = g.value(v).shape;
    std::int64_t id;
    if (r.boolean) {  // 1 or 0 as a number: a cast
      id = dg().add_arena("", t, shape);
      op("cast", "", {{"x", r.by_dtype.at(DType::U8)}, {"y", id}});
      r.by_dtype[t] = id;
      return id;
    }
    if (r.primary_nhwc) {  // back to NCHW: u8 by a transpose, floats dequantized first
      const std::vector<std::size_t> back{0, 3, 1, 2};
      if (t == DType::U8) {
        id = dg().add_arena("", DType::U8, shape);
        op("transpose", "", {{"x", r.nhwc}, {"y", id}}, {{"perm", back}});
      } else {
        ensure_q_tensors(r);
        const auto f = dg().add_arena("", DType::F32, to_nhwc(shape));
        op("dequantize", "", {{"x", r.nhwc}, {"scale", r.q_scale}, {"zero_point", r.q_zero}, {"y", f}}, {{"axis", 1}});
        id = dg().add_arena("", DType::F32, shape);
        op("transpose", "", {{"x", f}, {"y", id}}, {{"perm", back}});
        if (t != DType::F32) {
          r.by_dtype[DType::F32] = id;
          const auto c = dg().add_arena("", t, shape);
          op("cast", "", {{"x", id}, {"y", c}});
          id = c;
        }
      }
      r.by_dtype[t] = id;
      return id;
    }
    const auto src = r.by_dtype.at(r.primary);
    if (t == DType::U8) {
      if (r.primary != DType::F32) get(v, DType::F32);
      r.q = range_q(v);
      ensure_q_tensors(r);
      id = dg().add_arena("", t, shape);
      op("quantize", "", {{"x", r.by_dtype.at(DType::F32)}, {"scale", r.q_scale}, {"zero_point", r.q_zero}, {"y", id}},
         {{"axis", 1}});
    } else if (r.primary == DType::U8) {
      ensure_q_tensors(r);
      const auto f = dg().add_arena("", DType::F32, shape);
      op("dequantize", "", {{"x", src}, {"scale", r.q_scale}, {"zero_point", r.q_zero}, {"y", f}}, {{"axis", 1}});
      r.by_dtype[DType::F32] = f;
      if (t == DType::F32) return f;
      id = dg().add_arena("", t, shape);
      op("cast", "", {{"x", f}, {"y", id}});
    } else {
      id = dg().add_arena("", t, shape);
      op("cast", "", {{"x", src}, {"y", id}});
    }
    r.by_dtype[t] = id;
    return id;
  }

  // 4-D value `v` as a u8 NHWC tensor.
  std::int64_t get_nhwc(const std::string& v) {
    Rep* r = reps.count(v) ? &reps.at(v) : nullptr;
    if (r && r->nhwc >= 0) return r->nhwc;
    const auto u = get(v, DType::U8);
    r = &reps.at(v);
    r->nhwc = dg().add_arena("", DType::U8, to_nhwc(g.value(v).shape));
    op("transpose", "", {{"x", u}, {"y", r->nhwc}}, {{"perm", std::vector<std::size_t>{0, 2, 3, 1}}});
    return r->nhwc;
  }

  static json conv_attrs(const ops::Conv2dOptions& o) {
    return {{"strides", o.strides},
            {"dilations", o.dilations},
            {"pads", o.pads},
            {"groups", o.groups},
            {"layout", o.layout == Layout::NHWC ? "nhwc" : "nchw"}};
  }

  // The per-output-channel scales of symmetric int8 weights w [cout, ...].
  static std::vector<float> weight_scales(const std::vector<float>& w, std::size_t cout) {
    const std::size_t per = w.size() / cout;
    std::vector<float> scales(cout);
    for (std::size_t c = 0; c < cout; ++c) {
      float m = 0;
      for (std::size_t k = 0; k < per; ++k) m = std::max(m, std::fabs(w[c * per + k]));
      scales[c] = m > 0 ? m / 127.0f : 1.0f;
    }
    return scales;
  }

  // Whether every bias of an int8 layer reading `x` fits int32 in units of
  // x's scale times its channel's weight scale. Where activations are many
  // orders of magnitude below the bias (random-weight networks whose values
  // shrink towards 1e-10), it would saturate and the layer be wrong: such a
  // layer runs in fp32, noted in `fp32_for_bias`.
  bool int8_bias_fits(const Node& n, const std::string& x, const std::vector<float>& w, std::size_t cout,
                      const std::vector<float>& bias) {
    if (bias.empty()) return true;
    const auto scales = weight_scales(w, cout);
    const double xs = range_q(x).scale;
    for (std::size_t c = 0; c < cout; ++c)
      if (std::fabs(std::nearbyint(bias[c] / (xs * scales[c]))) > 2147483647.0) {
        out.fp32_for_bias.push_back(n.name);
        return false;
      }
    return true;
  }

  // Per-output-channel symmetric int8 weights w [cout, ...] and i32 bias,
  // then qlinear_conv (NHWC) of u8 x (as `xv`) into a new u8 value: for a
  // 4-D value held NHWC (`yview` empty), else (Gemm) as the view `yview`.
  void qconv(const Node& n, std::int64_t xv, const std::string& x, const std::vector<float>& w,
             std::vector<std::int64_t> wshape, const std::vector<float>& bias, const ops::Conv2dOptions& o,
             const std::vector<std::int64_t>& yshape, const std::vector<std::int64_t>& yview) {
    Rep& xr = reps.at(x);
    ensure_q_tensors(xr);
    const QParams xq = xr.q;
    const auto xs = xr.q_scale, xz = xr.q_zero;
    const auto cout = static_cast<std::size_t>(wshape[0]);
    const std::size_t per = w.size() / cout;
    const std::vector<float> scales = weight_scales(w, cout);
    std::vector<std::int8_t> qw(w.size());
    std::vector<std::int32_t> qb(cout);
    for (std::size_t c = 0; c < cout; ++c) {
      for (std::size_t k = 0; k < per; ++k)
        qw[c * per + k] =
            static_cast<std::int8_t>(std::clamp(std::nearbyint(w[c * per + k] / scales[c]), -127.0f, 127.0f));
      const double b = bias.empty() ? 0.0 : bias[c];
      qb[c] = static_cast<std::int32_t>(
          std::clamp(std::nearbyint(b / (static_cast<double>(xq.scale) * scales[c])), -2147483647.0, 2147483647.0));
    }
    std::vector<std::int8_t> zeros(cout, 0);
    const auto cs = static_cast<std::int64_t>(cout);
    const auto wid = add_raw(DType::I8, wshape, qw.data(), qw.size());
    const auto ws = add_raw(DType::F32, {cs}, scales.data(), scales.size() * 4);
    const auto wz = add_raw(DType::I8, {cs}, zeros.data(), zeros.size());
    // No bias operand where it is all zero: the engine has a faster path without one.
    const bool has_bias = std::any_of(qb.begin(), qb.end(), [](std::int32_t b) { return b != 0; });
    const auto bid = has_bias ? add_raw(DType::I32, {cs}, qb.data(), qb.size() * 4) : -1;
    std::int64_t yv;
    if (yview.empty()) {
      yv = dg().add_arena(n.output, DType::U8, to_nhwc(yshape));
      Rep r;
      r.primary = DType::U8;
      r.primary_nhwc = true;
      r.nhwc = yv;
      r.q = range_q(n.output);
      reps[n.output] = r;
    } else {
      yv = dg().add_view(produce(n.output, DType::U8, yshape), yview);
    }
    Rep& yr = reps[n.output];
    ensure_q_tensors(yr);
    op("qlinear_conv", n.name,
       {{"x", xv},
        {"x_scale", xs},
        {"x_zero_point", xz},
        {"w", wid},
        {"w_scale", ws},
        {"w_zero_point", wz},
        {"y_scale", yr.q_scale},
        {"y_zero_point", yr.q_zero},
        {"y", yv}},
       conv_attrs(o));
    if (has_bias) dg().ops.back().operands["bias"] = bid;
    out.quant["weights"][n.name] = {{"scales", scales}};
  }

  // Gemm / MatMul by a constant in int8, as a 1x1 convolution; false if it
  // cannot be (transA, or a bias that is not one per output).
  bool gemm_int8(const Node& n) {
    const Attrs a{n.proto};
    const bool gemm = n.op == "Gemm";
    const auto& x = g.value(n.inputs[0]);
    const Value& b = g.value(n.inputs[1]);
    if (!b.data || x.shape.size() != 2 || b.shape.size() != 2) return false;
    if (gemm && a.i("transA", 0) != 0) return false;
    const bool tb = gemm && a.i("transB", 0) != 0;
    const float alpha = gemm ? a.f("alpha", 1.0f) : 1.0f, beta = gemm ? a.f("beta", 1.0f) : 1.0f;
    const std::int64_t m = x.shape[0], k = x.shape[1], nn = tb ? b.shape[0] : b.shape[1];
    std::vector<float> bias;
    if (gemm && n.inputs.size() > 2 && !n.inputs[2].empty()) {
      const Value& c = g.value(n.inputs[2]);
      const bool per_out =
          c.elements() == 1 || (c.elements() == static_cast<std::uint64_t>(nn) && c.shape.back() == nn);
      if (!per_out) return false;
      bias.resize(static_cast<std::size_t>(nn));
      for (std::int64_t j = 0; j < nn; ++j)
        bias[static_cast<std::size_t>(j)] = beta * (*c.data)[c.elements() == 1 ? 0 : static_cast<std::size_t>(j)];
    }
    std::vector<float> w(static_cast<std::size_t>(nn * k));
    for (std::int64_t o = 0; o < nn; ++o)
      for (std::int64_t i = 0; i < k; ++i)
        w[static_cast<std::size_t>(o * k + i)] =
            alpha * (*b.data)[static_cast<std::size_t>(tb ? o * k + i : i * nn + o)];
    if (!int8_bias_fits(n, n.inputs[0], w, static_cast<std::size_t>(nn), bias)) return false;
    const auto xu = get(n.inputs[0], DType::U8);
    const auto xv = dg().add_view(xu, {m, 1, 1, k});  // NHWC with H = W = 1: the same bytes as [m, k]
    ops::Conv2dOptions o;
    o.layout = Layout::NHWC;
    qconv(n, xv, n.inputs[0], w, {nn, k, 1, 1}, bias, o, {m, nn}, {m, 1, 1, nn});
    return true;
  }

  void lower_node(const Node& n) {
    if (precision == Precision::Int8 && keep_fp16.count(n.name)) {  // as in an fp16 model, or fp32
      const DType saved = act;
      const bool f16 = !ranges || fp16_holds(n, *ranges);
      act = f16 ? DType::F16 : DType::F32;
      precision = f16 ? Precision::F16 : Precision::F32;
      try {
        lower_node(n);
      } catch (...) {
        act = saved;
        precision = Precision::Int8;
        throw;
      }
      act = saved;
      precision = Precision::Int8;
      return;
    }
    const Attrs a{n.proto};
    const bool int8 = precision == Precision::Int8;
    const auto& shape = g.value(n.output).shape;
    const std::string& op_type = n.op;
    if (op_type == "Conv") {
      const Value& w = g.value(n.inputs[1]);
      const auto o = onnx_attrs::conv_options(a, g.value(n.inputs[0]).shape, w.shape);
      const bool has_bias = n.inputs.size() > 2 && !n.inputs[2].empty();
      const std::vector<float> bias = has_bias ? *g.value(n.inputs[2]).data : std::vector<float>{};
      if (int8 && int8_bias_fits(n, n.inputs[0], *w.data, static_cast<std::size_t>(w.shape[0]), bias)) {
        const auto xu = get_nhwc(n.inputs[0]);
        ops::Conv2dOptions on = o;
        on.layout = Layout::NHWC;
        qconv(n, xu, n.inputs[0], *w.data, w.shape, bias, on, shape, {});
        return;
      }
      std::map<std::string, std::int64_t> operands{{"x", get(n.inputs[0], act)}, {"w", get(n.inputs[1], act)}};
      if (has_bias) operands["bias"] = get(n.inputs[2], DType::F32);
      operands["y"] = produce(n.output, act, shape);
      json at = conv_attrs(o);
      at["activation"] = act_json(n.act);
      op("conv2d", n.name, operands, at);
      return;
    }
    if (op_type == "ConvTranspose") {  // in float in every precision (int8: f32)
      const DType t = int8 ? DType::F32 : act;
      const Value& w = g.value(n.inputs[1]);
      const auto& xs = g.value(n.inputs[0]).shape;
      const auto geo = onnx_attrs::conv_transpose_options(a, xs, w.shape);
      std::map<std::string, std::int64_t> operands{{"x", get(n.inputs[0], t)}, {"w", get(n.inputs[1], t)}};
      if (n.inputs.size() > 2 && !n.inputs[2].empty()) operands["bias"] = get(n.inputs[2], DType::F32);
      operands["y"] = produce(n.output, t, shape);
      if (xs.size() == 3) {  // 1-D: the 2-D op on views with H = 1
        operands["x"] = dg().add_view(operands["x"], {xs[0], xs[1], 1, xs[2]});
        operands["w"] = dg().add_view(operands["w"], {w.shape[0], w.shape[1], 1, w.shape[2]});
        operands["y"] = dg().add_view(operands["y"], {shape[0], shape[1], 1, shape[2]});
      }
      json at = conv_attrs(geo.options);
      at["activation"] = act_json(n.act);
      op("conv_transpose2d", n.name, operands, at);
      return;
    }
    if (op_type == "ArgMax" || op_type == "ArgMin" || op_type == "TopK") {
      // Indices in i32 (consumers and outputs see them as floats, exact
      // below 2^24); TopK's values in the float type.
      const DType t = int8 ? DType::F32 : act;
      const auto axis = static_cast<std::size_t>(n.params.at("axis").at(0));
      auto kept = g.value(n.inputs[0]).shape;
      kept[axis] = op_type == "TopK" ? shape[axis] : 1;
      const bool top_k = op_type == "TopK";
      std::map<std::string, std::int64_t> operands{{"x", get(n.inputs[0], t)}};
      if (top_k) {
        operands["values"] = produce(n.output, t, shape);
        operands["indices"] = produce(n.output2.empty() ? n.name + "/indices" : n.output2, DType::I32, shape);
      } else {
        operands["indices"] = dg().add_view(produce(n.output, DType::I32, shape), kept);
      }
      op("top_k", n.name, operands,
         {{"axis", axis},
          {"largest", n.params.at("largest").at(0) != 0},
          {"last_index", n.params.at("last_index").at(0) != 0}});
      return;
    }
    if (op_type == "Where") {  // the condition as u8 1 or 0, constant or computed
      const DType t = int8 ? DType::F32 : act;
      op("where", n.name,
         {{"cond", get_bool(n, n.inputs[0])},
          {"a", get(n.inputs[1], t)},
          {"b", get(n.inputs[2], t)},
          {"y", produce(n.output, t, shape)}});
      return;
    }
    static const std::map<std::string, std::string> kCompare = {{"Equal", "equal"},
                                                                {"Less", "less"},
                                                                {"LessOrEqual", "less_equal"},
                                                                {"Greater", "greater"},
                                                                {"GreaterOrEqual", "greater_equal"}};
    if (auto it = kCompare.find(op_type); it != kCompare.end()) {  // numbers in, u8 1 or 0 out
      const DType t = int8 ? DType::F32 : act;
      op(it->second, n.name,
         {{"a", get(n.inputs[0], t)}, {"b", get(n.inputs[1], t)}, {"y", produce_bool(n.output, shape)}});
      return;
    }
    static const std::map<std::string, std::string> kLogic = {
        {"And", "logical_and"}, {"Or", "logical_or"}, {"Xor", "logical_xor"}};
    if (auto it = kLogic.find(op_type); it != kLogic.end()) {
      op(it->second, n.name,
         {{"a", get_bool(n, n.inputs[0])}, {"b", get_bool(n, n.inputs[1])}, {"y", produce_bool(n.output, shape)}});
      return;
    }
    if (op_type == "Not") {
      op("logical_not", n.name, {{"x", get_bool(n, n.inputs[0])}, {"y", produce_bool(n.output, shape)}});
      return;
    }
    if (op_type == "Gemm" || op_type == "MatMul") {
      if (int8 && gemm_int8(n)) return;
      const DType t = int8 ? DType::F32 : act;
      std::map<std::string, std::int64_t> operands{{"a", get(n.inputs[0], t)}, {"b", get(n.inputs[1], t)}};
      json at = {{"transpose_a", false},
                 {"transpose_b", false},
                 {"alpha", 1.0f},
                 {"beta", 1.0f},
                 {"activation", act_json(n.act)}};
      if (op_type == "Gemm") {
        at["transpose_a"] = a.i("transA", 0) != 0;
        at["transpose_b"] = a.i("transB", 0) != 0;
        at["alpha"] = a.f("alpha", 1.0f);
        at["beta"] = a.f("beta", 1.0f);
        if (n.inputs.size() > 2 && !n.inputs[2].empty()) operands["c"] = get(n.inputs[2], DType::F32);
      }
      operands["y"] = produce(n.output, t, shape);
      op("matmul", n.name, operands, at);
      return;
    }
    if (op_type == "MaxPool" || op_type == "AveragePool" || op_type == "GlobalAveragePool") {
      const auto o = onnx_attrs::pool_options(a, g.value(n.inputs[0]).shape);
      const bool max = op_type == "MaxPool";
      DType t = int8 ? DType::F32 : act;
      if (int8 && max && reps.count(n.inputs[0]) && reps.at(n.inputs[0]).primary == DType::U8) t = DType::U8;
      std::int64_t x, y;
      if (t == DType::U8) {  // NHWC; the max of u8 values keeps their scale
        x = get_nhwc(n.inputs[0]);
        y = dg().add_arena(n.output, t, to_nhwc(shape));
        Rep r;
        r.primary = DType::U8;
        r.primary_nhwc = true;
        r.nhwc = y;
        r.q = reps.at(n.inputs[0]).q;
        reps[n.output] = r;
      } else {
        x = get(n.inputs[0], t);
        y = produce(n.output, t, shape);
      }
      op(max ? "max_pool2d" : "avg_pool2d", n.name, {{"x", x}, {"y", y}},
         {{"kernel", o.kernel},
          {"strides", o.strides},
          {"dilations", o.dilations},
          {"pads", o.pads},
          {"ceil_mode", o.ceil_mode},
          {"count_include_pad", o.count_include_pad},
          {"layout", t == DType::U8 ? "nhwc" : "nchw"}});
      return;
    }
    if (op_type == "Reshape" || op_type == "Flatten") {
      if (!reps.count(n.inputs[0])) get(n.inputs[0], int8 ? DType::F32 : act);
      alias(n.output, n.inputs[0], shape);
      return;
    }
    if (op_type == "Transpose") {
      if (!reps.count(n.inputs[0])) get(n.inputs[0], int8 ? DType::F32 : act);
      if (reps.at(n.inputs[0]).primary_nhwc) get(n.inputs[0], DType::U8);
      Rep src = reps.at(n.inputs[0]);
      src.primary_nhwc = false;
      src.nhwc = -1;
      auto perm = a.ints("perm");
      if (perm.empty())
        for (std::size_t i = shape.size(); i-- > 0;) perm.push_back(static_cast<std::int64_t>(i));
      const auto x = src.by_dtype.at(src.primary);
      const auto y = dg().add_arena(n.output, src.primary, shape);
      Rep r = src;
      r.by_dtype = {{src.primary, y}};
      reps[n.output] = r;
      op("transpose", n.name, {{"x", x}, {"y", y}}, {{"perm", perm}});
      return;
    }
    // Float ops: in the activation type, or f32 in an int8 model.
    const DType t = int8 ? DType::F32 : act;
    if (op_type == "Relu" || op_type == "Sigmoid" || op_type == "Tanh" || op_type == "LeakyRelu" || op_type == "Clip") {
      ActivationParams p = op_type == "Relu"        ? ActivationParams::relu()
                           : op_type == "Sigmoid"   ? ActivationParams::sigmoid()
                           : op_type == "Tanh"      ? ActivationParams::tanh()
                           : op_type == "LeakyRelu" ? ActivationParams::leaky_relu(a.f("alpha", 0.01f))
                                                    : ActivationParams{};
      if (op_type == "Clip") {
        float lo = -FLT_MAX, hi = FLT_MAX;
        if (g.opset >= 11) {
          if (n.inputs.size() > 1 && !n.inputs[1].empty()) lo = g.value(n.inputs[1]).data->at(0);
          if (n.inputs.size() > 2 && !n.inputs[2].empty()) hi = g.value(n.inputs[2]).data->at(0);
        } else {
          lo = a.f("min", -FLT_MAX);
          hi = a.f("max", FLT_MAX);
        }
        p = ActivationParams::clip(lo, hi);
      }
      const auto x = get(n.inputs[0], t);
      op("activation", n.name, {{"x", x}, {"y", produce(n.output, t, shape)}}, {{"activation", act_json(p)}});
      return;
    }
    if (op_type == "Softmax") {
      const auto x = get(n.inputs[0], t);
      const auto y = produce(n.output, t, shape);
      const auto rank = static_cast<std::int64_t>(shape.size());
      std::int64_t axis = a.i("axis", g.opset >= 13 ? -1 : 1);
      if (axis < 0) axis += rank;
      if (g.opset >= 13 || axis == rank - 1) {
        op("softmax", n.name, {{"x", x}, {"y", y}}, {{"axis", axis}});
      } else {  // before opset 13: over the flattened dimensions from `axis` on
        std::int64_t outer = 1, inner = 1;
        for (std::int64_t i = 0; i < rank; ++i) (i < axis ? outer : inner) *= shape[static_cast<std::size_t>(i)];
        op("softmax", n.name, {{"x", dg().add_view(x, {outer, inner})}, {"y", dg().add_view(y, {outer, inner})}},
           {{"axis", 1}});
      }
      return;
    }
    if (op_type == "Add" || op_type == "Sub" || op_type == "Mul" || op_type == "Div") {
      std::string kind = op_type;
      std::transform(kind.begin(), kind.end(), kind.begin(), [](char c) { return static_cast<char>(std::tolower(c)); });
      const auto x = get(n.inputs[0], t), y2 = get(n.inputs[1], t);
      op(kind, n.name, {{"a", x}, {"b", y2}, {"y", produce(n.output, t, shape)}});
      return;
    }
    if (op_type == "BatchNormalization") {  // not after a Conv: y = x * s + (beta - mean * s), per channel
      const auto c = static_cast<std::size_t>(shape[1]);
      const auto& gamma = *g.value(n.inputs[1]).data;
      const auto& beta = *g.value(n.inputs[2]).data;
      const auto& mean = *g.value(n.inputs[3]).data;
      const auto& var = *g.value(n.inputs[4]).data;
      if (gamma.size() != c || beta.size() != c || mean.size() != c || var.size() != c)
        throw Error(Status::InvalidArgument,
                    "node '" + n.name + "' (BatchNormalization): parameters are not one per channel");
      const float eps = a.f("epsilon", 1e-5f);
      std::vector<float> s(c), b(c);
      for (std::size_t i = 0; i < c; ++i) {
        s[i] = static_cast<float>(gamma[i] / std::sqrt(static_cast<double>(var[i]) + eps));
        b[i] = beta[i] - mean[i] * s[i];
      }
      std::vector<std::int64_t> pshape(shape.size() - 1, 1);
      pshape[0] = static_cast<std::int64_t>(c);
      const auto x = get(n.inputs[0], t);
      const auto tmp = dg().add_arena("", t, shape);
      op("mul", n.name, {{"a", x}, {"b", add_weight(s, t, pshape)}, {"y", tmp}});
      op("add", n.name, {{"a", tmp}, {"b", add_weight(b, t, pshape)}, {"y", produce(n.output, t, shape)}});
      return;
    }
    if (op_type == "HardSigmoid" || op_type == "HardSwish") {
      const auto p = op_type == "HardSwish" ? ActivationParams::hard_swish()
                                            : ActivationParams::hard_sigmoid(a.f("alpha", 0.2f), a.f("beta", 0.5f));
      op("activation", n.name, {{"x", get(n.inputs[0], t)}, {"y", produce(n.output, t, shape)}},
         {{"activation", act_json(p)}});
      return;
    }
    if (op_type == "Sqrt" || op_type == "Exp" || op_type == "Log" || op_type == "Abs" || op_type == "Neg" ||
        op_type == "Erf") {
      std::string kind = op_type;
      std::transform(kind.begin(), kind.end(), kind.begin(), [](char c) { return static_cast<char>(std::tolower(c)); });
      const auto x = get(n.inputs[0], t);
      op(kind, n.name, {{"x", x}, {"y", produce(n.output, t, shape)}});
      return;
    }
    if (op_type == "Reciprocal") {
      const auto x = get(n.inputs[0], t);
      op("div", n.name, {{"a", add_weight({1.0f}, t, {})}, {"b", x}, {"y", produce(n.output, t, shape)}});
      return;
    }
    if (op_type == "Min" || op_type == "Max") {
      const std::string kind = op_type == "Min" ? "min" : "max";
      std::int64_t acc = get(n.inputs[0], t);
      if (n.inputs.size() == 1) {
        op("cast", n.name, {{"x", acc}, {"y", produce(n.output, t, shape)}});
        return;
      }
      for (std::size_t i = 1; i < n.inputs.size(); ++i) {
        const auto y = i + 1 == n.inputs.size() ? produce(n.output, t, shape) : dg().add_arena("", t, shape);
        op(kind, n.name, {{"a", acc}, {"b", get(n.inputs[i], t)}, {"y", y}});
        acc = y;
      }
      return;
    }
    if (op_type == "Pow") {
      lower_pow(n, t);
      return;
    }
    if (op_type == "ReduceMean" || op_type == "ReduceSum" || op_type == "ReduceMax" || op_type == "ReduceMin" ||
        op_type == "ReduceL2") {
      lower_reduce(n, t);
      return;
    }
    if (op_type == "Pad") {
      lower_pad(n, t);
      return;
    }
    if (op_type == "Resize" || op_type == "Upsample") {
      const auto o = onnx_attrs::resize_options(a, g.opset);
      const auto& sc = n.params.at("scales");
      const auto x = get(n.inputs[0], t);
      op("resize", n.name, {{"x", x}, {"y", produce(n.output, t, shape)}},
         {{"mode", o.mode == ResizeMode::Linear ? "linear" : "nearest"},
          {"coordinate", mode_name(coordinate_modes(), o.coordinate)},
          {"nearest", mode_name(nearest_modes(), o.nearest)},
          {"scales", {static_cast<float>(sc[0]), static_cast<float>(sc[1])}}});
      return;
    }
    if (op_type == "Concat") {
      lower_concat(n, t);
      return;
    }
    if (op_type == "Gather") {
      lower_gather(n, t);
      return;
    }
    if (op_type == "Expand") {  // a copy of x viewed with stride 0 along the broadcast dims
      const auto& xs = g.value(n.inputs[0]).shape;
      const auto xst = row_major_strides(xs);
      std::vector<std::int64_t> strides(shape.size(), 0);
      const std::size_t off = shape.size() - xs.size();
      for (std::size_t d = off; d < shape.size(); ++d)
        if (xs[d - off] != 1) strides[d] = xst[d - off];
      const auto view = dg().add_subview(get(n.inputs[0], t), shape, strides, 0);
      op("cast", n.name, {{"x", view}, {"y", produce(n.output, t, shape)}});
      return;
    }
    if (op_type == "Slice") {
      const auto x = get(n.inputs[0], t);
      const auto& xs = g.value(n.inputs[0]).shape;
      const auto st = row_major_strides(xs);
      const auto& lo = n.params.at("lo");
      const auto& step = n.params.at("step");
      std::vector<std::int64_t> strides(xs.size());
      std::uint64_t first = 0;
      for (std::size_t d = 0; d < xs.size(); ++d) {
        first += static_cast<std::uint64_t>(lo[d]) * static_cast<std::uint64_t>(st[d]);
        strides[d] = st[d] * static_cast<std::int64_t>(step[d]);
      }
      const auto view = dg().add_subview(x, shape, strides, first * size_of(t));
      op("cast", n.name, {{"x", view}, {"y", produce(n.output, t, shape)}});
      return;
    }
    throw Error(Status::Internal, "compiler: no lowering for " + op_type);
  }

  // x^e for one constant e: products for small integer powers (and their
  // reciprocals), sqrt for 0.5, else exp(e * log(x)) (NaN for x < 0, as
  // pow gives for a fractional power).
  void lower_pow(const Node& n, DType t) {
    const double e = n.params.at("exponent").at(0);
    const auto& shape = g.value(n.output).shape;
    const auto x = get(n.inputs[0], t);
    const auto y = produce(n.output, t, shape);
    const double whole = std::nearbyint(e);
    if (e == whole && std::fabs(e) <= 16 && e != 0) {
      auto m = static_cast<std::uint32_t>(std::fabs(e));
      // Square-and-multiply, most significant bit first.
      std::int64_t acc = x;
      const int top = 31 - std::countl_zero(m);
      for (int b = top - 1; b >= 0; --b) {
        const auto sq = dg().add_arena("", t, shape);
        op("mul", n.name, {{"a", acc}, {"b", acc}, {"y", sq}});
        acc = sq;
        if ((m >> b) & 1) {
          const auto mx = dg().add_arena("", t, shape);
          op("mul", n.name, {{"a", acc}, {"b", x}, {"y", mx}});
          acc = mx;
        }
      }
      if (e < 0)
        op("div", n.name, {{"a", add_weight({1.0f}, t, {})}, {"b", acc}, {"y", y}});
      else
        op("cast", n.name, {{"x", acc}, {"y", y}});
      return;
    }
    if (e == 0) {  // pow(x, 0) is 1 for every x, NaN included
      op("cast", n.name, {{"x", add_weight({1.0f}, t, {})}, {"y", y}});
      return;
    }
    if (e == 0.5) {
      op("sqrt", n.name, {{"x", x}, {"y", y}});
      return;
    }
    const auto l = dg().add_arena("", t, shape), m = dg().add_arena("", t, shape);
    op("log", n.name, {{"x", x}, {"y", l}});
    op("mul", n.name, {{"a", l}, {"b", add_weight({static_cast<float>(e)}, t, {})}, {"y", m}});
    op("exp", n.name, {{"x", m}, {"y", y}});
  }

  // Reductions as a pool over the innermost dimension of x viewed as
  // [1, 1, outer, inner], the reduced axes moved last first where they are
  // not already: mean and max directly, min as -max(-x), sum as mean * n,
  // L2 as sqrt(sum(x * x)).
  void lower_reduce(const Node& n, DType t) {
    const std::string& op_type = n.op;
    const auto& xs = g.value(n.inputs[0]).shape;
    const auto& shape = g.value(n.output).shape;
    std::vector<bool> reduced(xs.size());
    for (double d : n.params.at("axes")) reduced[static_cast<std::size_t>(d)] = true;
    std::vector<std::size_t> perm;
    std::int64_t outer = 1, inner = 1;
    for (std::size_t d = 0; d < xs.size(); ++d)
      if (!reduced[d]) perm.push_back(d), outer *= xs[d];
    for (std::size_t d = 0; d < xs.size(); ++d)
      if (reduced[d]) perm.push_back(d), inner *= xs[d];
    std::int64_t x = get(n.inputs[0], t);
    const auto y = produce(n.output, t, shape);
    if (inner == 1 || outer == 0) {  // nothing to reduce (or nothing to reduce into): each element alone
      op(op_type == "ReduceL2" ? "abs" : "cast", n.name, {{"x", dg().add_view(x, shape)}, {"y", y}});
      return;
    }
    // Only dimensions larger than 1 decide whether the order changes.
    std::vector<std::size_t> big;
    for (auto d : perm)
      if (xs[d] != 1) big.push_back(d);
    if (!std::is_sorted(big.begin(), big.end())) {
      std::vector<std::int64_t> ps;
      for (auto d : perm) ps.push_back(xs[d]);
      const auto tx = dg().add_arena("", t, ps);
      op("transpose", n.name, {{"x", x}, {"y", tx}}, {{"perm", perm}});
      x = tx;
    }
    const std::vector<std::int64_t> as_pool{1, 1, outer, inner}, pooled{1, 1, outer, 1};
    auto pool = [&](bool max, std::int64_t from, std::int64_t to) {
      op(max ? "max_pool2d" : "avg_pool2d", n.name,
         {{"x", dg().add_view(from, as_pool)}, {"y", dg().add_view(to, pooled)}},
         {{"kernel", {1, static_cast<std::uint32_t>(inner)}},
          {"strides", {1, 1}},
          {"dilations", {1, 1}},
          {"pads", {0, 0, 0, 0}},
          {"ceil_mode", false},
          {"count_include_pad", false},
          {"layout", "nchw"}});
    };
    const std::vector<std::int64_t> flat{outer, inner}, flat_out{outer};
    if (op_type == "ReduceMean" || op_type == "ReduceMax") {
      pool(op_type == "ReduceMax", x, y);
    } else if (op_type == "ReduceMin") {
      const auto nx = dg().add_arena("", t, flat), m = dg().add_arena("", t, flat_out);
      op("neg", n.name, {{"x", dg().add_view(x, flat)}, {"y", nx}});
      pool(true, nx, m);
      op("neg", n.name, {{"x", m}, {"y", dg().add_view(y, flat_out)}});
    } else {  // ReduceSum, ReduceL2
      std::int64_t src = x;
      if (op_type == "ReduceL2") {
        src = dg().add_arena("", t, flat);
        op("mul", n.name, {{"a", dg().add_view(x, flat)}, {"b", dg().add_view(x, flat)}, {"y", src}});
      }
      const auto m = dg().add_arena("", t, flat_out);
      pool(false, src, m);
      const auto count = add_weight({static_cast<float>(inner)}, t, {});
      if (op_type == "ReduceSum") {
        op("mul", n.name, {{"a", m}, {"b", count}, {"y", dg().add_view(y, flat_out)}});
      } else {
        const auto s2 = dg().add_arena("", t, flat_out);
        op("mul", n.name, {{"a", m}, {"b", count}, {"y", s2}});
        op("sqrt", n.name, {{"x", s2}, {"y", dg().add_view(y, flat_out)}});
      }
    }
  }

  // Constant padding: y filled with the value, x copied into its interior.
  void lower_pad(const Node& n, DType t) {
    const Attrs a{n.proto};
    const auto& xs = g.value(n.inputs[0]).shape;
    const auto& shape = g.value(n.output).shape;
    const auto& pads = n.params.at("pads");
    if (std::all_of(pads.begin(), pads.end(), [](double p) { return p == 0; })) {
      if (!reps.count(n.inputs[0])) get(n.inputs[0], t);
      alias(n.output, n.inputs[0], shape);
      return;
    }
    const std::string mode = a.s("mode", "constant");
    const auto x = get(n.inputs[0], t);
    const auto y = produce(n.output, t, shape);
    const auto rank = shape.size();
    auto before = [&](std::size_t d) { return static_cast<std::int64_t>(pads[d]); };
    auto after = [&](std::size_t d) { return static_cast<std::int64_t>(pads[d + rank]); };
    if (mode == "constant") {
      op("cast", n.name, {{"x", add_weight({static_cast<float>(n.params.at("value").at(0))}, t, {})}, {"y", y}});
      const auto st = row_major_strides(shape);
      std::uint64_t first = 0;
      for (std::size_t d = 0; d < rank; ++d) first += static_cast<std::uint64_t>(before(d) * st[d]);
      op("cast", n.name, {{"x", x}, {"y", dg().add_subview(y, xs, st, first * size_of(t))}});
      return;
    }
    // reflect and edge: one padded axis at a time, each stage copied from the
    // one before (the input, then a scratch tensor): the input's part, then
    // each padded position (a slab one position thick) from the position it
    // mirrors or repeats. Later axes pad the earlier ones' pads too, so
    // corners come out as numpy.pad makes them.
    std::size_t last = 0;
    for (std::size_t d = 0; d < rank; ++d)
      if (before(d) || after(d)) last = d;
    std::int64_t cur = x;
    std::vector<std::int64_t> cur_shape = xs;
    const bool reflect = mode == "reflect";
    for (std::size_t d = 0; d < rank; ++d) {
      if (!before(d) && !after(d)) continue;
      std::vector<std::int64_t> next_shape = cur_shape;
      next_shape[d] += before(d) + after(d);
      const auto next = d == last ? y : dg().add_arena("", t, next_shape);
      const auto cst = row_major_strides(cur_shape), nst = row_major_strides(next_shape);
      const std::int64_t len = cur_shape[d];
      auto at = [&](std::int64_t tensor, const std::vector<std::int64_t>& st, std::int64_t pos, std::int64_t thick) {
        std::vector<std::int64_t> part = cur_shape;
        part[d] = thick;
        return dg().add_subview(tensor, part, st, static_cast<std::uint64_t>(pos * st[d]) * size_of(t));
      };
      op("cast", n.name, {{"x", cur}, {"y", at(next, nst, before(d), len)}});
      for (std::int64_t j = 0; j < before(d); ++j)  // mirrors input position before - j, or repeats 0
        op("cast", n.name, {{"x", at(cur, cst, reflect ? before(d) - j : 0, 1)}, {"y", at(next, nst, j, 1)}});
      for (std::int64_t j = 0; j < after(d); ++j)  // mirrors input position len - 2 - j, or repeats len - 1
        op("cast", n.name,
           {{"x", at(cur, cst, reflect ? len - 2 - j : len - 1, 1)}, {"y", at(next, nst, before(d) + len + j, 1)}});
      cur = next;
      cur_shape = next_shape;
    }
  }

  // Gather with constant indices: a copy per run of consecutive indices.
  void lower_gather(const Node& n, DType t) {
    const auto& xs = g.value(n.inputs[0]).shape;
    const auto axis = static_cast<std::size_t>(n.params.at("axis").at(0));
    const auto& idx = n.params.at("indices");
    const auto x = get(n.inputs[0], t);
    const auto y = produce(n.output, t, g.value(n.output).shape);
    const auto xst = row_major_strides(xs);
    // y viewed as x's shape with the indices flattened onto the axis.
    std::vector<std::int64_t> ys = xs;
    ys[axis] = static_cast<std::int64_t>(idx.size());
    const auto yst = row_major_strides(ys);
    for (std::size_t j = 0; j < idx.size();) {
      std::size_t run = 1;
      while (j + run < idx.size() && idx[j + run] == idx[j] + static_cast<double>(run)) ++run;
      std::vector<std::int64_t> part = xs;
      part[axis] = static_cast<std::int64_t>(run);
      const auto from = static_cast<std::uint64_t>(static_cast<std::int64_t>(idx[j]) * xst[axis]) * size_of(t);
      const auto to = static_cast<std::uint64_t>(static_cast<std::int64_t>(j) * yst[axis]) * size_of(t);
      op("cast", n.name, {{"x", dg().add_subview(x, part, xst, from)}, {"y", dg().add_subview(y, part, yst, to)}});
      j += run;
    }
  }

  // Concat: each input not already produced in its part of the output
  // (placements) is copied there.
  void lower_concat(const Node& n, DType t) {
    const Attrs a{n.proto};
    const auto& shape = g.value(n.output).shape;
    const auto rank = static_cast<std::int64_t>(shape.size());
    std::int64_t axis = a.i("axis", 0);
    if (axis < 0) axis += rank;
    std::int64_t y;
    if (auto it = reps.find(n.output); it != reps.end() && it->second.by_dtype.count(t))
      y = it->second.by_dtype.at(t);
    else
      y = produce(n.output, t, shape);
    const auto st = row_major_strides(shape);
    std::int64_t at = 0;
    for (const auto& in : n.inputs) {
      const auto& is = g.value(in).shape;
      const auto part_at = static_cast<std::uint64_t>(at * st[static_cast<std::size_t>(axis)]) * size_of(t);
      at += is[static_cast<std::size_t>(axis)];
      if (placed.count(in) && reps.at(in).primary == t) continue;
      const auto x = get(in, t);
      op("cast", n.name, {{"x", x}, {"y", dg().add_subview(y, is, st, part_at)}});
    }
  }

  // Chooses which Concat inputs are produced straight into the Concat's
  // output: a float value the Concat alone uses, made by a node that writes
  // a fresh tensor, where the Concat's parts are contiguous (nothing but
  // ones before the axis).
  void plan_concats() {
    if (precision == Precision::Int8) return;  // int8 values are u8 NHWC; their Concat copies
    std::map<std::string, std::size_t> uses;
    for (const auto& n : g.nodes)
      for (const auto& x : n.inputs) ++uses[x];
    for (const auto& o : g.outputs) uses[o.second] += 2;
    std::map<std::string, const Node*> producer;
    for (const auto& n : g.nodes) producer[n.output] = &n;
    static const std::set<std::string> kWritesFresh = {
        "Conv",      "Gemm",    "MatMul",     "MaxPool",   "AveragePool", "GlobalAveragePool",
        "Relu",      "Sigmoid", "Tanh",       "LeakyRelu", "Clip",        "HardSigmoid",
        "HardSwish", "Softmax", "Add",        "Sub",       "Mul",         "Div",
        "Min",       "Max",     "Sqrt",       "Exp",       "Log",         "Abs",
        "Neg",       "Erf",     "Reciprocal", "Resize",    "Upsample",    "Concat"};
    for (const auto& n : g.nodes) {
      if (n.op != "Concat") continue;
      const auto& shape = g.value(n.output).shape;
      const auto rank = static_cast<std::int64_t>(shape.size());
      std::int64_t axis = Attrs{n.proto}.i("axis", 0);
      if (axis < 0) axis += rank;
      bool contiguous = true;
      for (std::int64_t d = 0; d < axis; ++d) contiguous = contiguous && shape[static_cast<std::size_t>(d)] == 1;
      if (!contiguous) continue;
      const auto st = row_major_strides(shape);
      std::int64_t at = 0;
      std::set<std::string> seen;
      for (const auto& in : n.inputs) {
        const auto& is = g.value(in).shape;
        const auto offset = static_cast<std::uint64_t>(at * st[static_cast<std::size_t>(axis)]) * size_of(act);
        at += is[static_cast<std::size_t>(axis)];
        const auto p = producer.find(in);
        if (p == producer.end() || uses[in] != 1 || !seen.insert(in).second || !kWritesFresh.count(p->second->op))
          continue;
        placements[in] = {n.output, offset};
      }
    }
  }

  void run() {
    act = precision == Precision::F16 ? DType::F16 : precision == Precision::BF16 ? DType::BF16 : DType::F32;
    for (const auto& in : g.inputs) {
      const auto id = dg().add_arena(in, DType::F32, g.value(in).shape);
      Rep r;
      r.primary = DType::F32;
      r.by_dtype[DType::F32] = id;
      reps[in] = r;
      dg().inputs.push_back(id);
    }
    plan_concats();
    for (const auto& n : g.nodes) lower_node(n);
    for (const auto& [name, v] : g.outputs) {
      std::int64_t id = get(v, DType::F32);
      const auto& t = dg().tensors[static_cast<std::size_t>(id)];
      // Before sharing, arena tensors at one offset are one tensor and its views.
      auto same_bytes = [&](std::int64_t other) {
        return dg().tensors[static_cast<std::size_t>(other)].offset == t.offset;
      };
      const bool taken = t.storage == Storage::Weights || !t.strides.empty() ||
                         std::any_of(dg().inputs.begin(), dg().inputs.end(), same_bytes) ||
                         std::any_of(dg().outputs.begin(), dg().outputs.end(), same_bytes);
      if (taken) {  // an output that is (a view of) an input, a constant or another output: its own copy
        const auto copy = dg().add_arena("", DType::F32, t.shape);
        op("cast", "", {{"x", id}, {"y", copy}});
        id = copy;
      }
      dg().outputs.push_back(id);
    }
    for (const auto& [v, r] : reps) {
      out.values[v] = ValueInfo{r.primary_tensor(), r.primary, r.q, r.primary_nhwc};
      if (precision == Precision::Int8 && ranges) {
        auto it = ranges->find(v);
        json e;
        if (it != ranges->end()) e["range"] = {it->second.lo, it->second.hi};
        if (r.primary == DType::U8) e["u8"] = {{"scale", r.q.scale}, {"zero_point", r.q.zero_point}};
        out.quant["activations"][v] = e;
      }
    }
  }
};

}  // namespace

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
              const std::set<std::string>& keep_fp16) {
  Lowerer l{g, precision, ranges, keep_fp16, DType::F32, {}, {}, {}, {}, {}};
  l.run();
  return std::move(l.out);
}

}  // namespace tpuhal::rt::detail
