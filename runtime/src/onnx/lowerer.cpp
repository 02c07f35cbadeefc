// How values are held and converted while lowering (lowerer.hpp), and the
// lowering itself: each node through its handler, in graph order.
#include "onnx/lowerer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "onnx/handler.hpp"
#include "tpuhal/error.hpp"
#include "tpuhal/fw/half.h"

namespace tpuhal::rt::detail {

using nlohmann::json;

json act_json(const ActivationParams& a) { return {{"kind", to_string(a.kind)}, {"alpha", a.alpha}, {"beta", a.beta}}; }

json conv_attrs(const ops::Conv2dOptions& o) {
  return {{"strides", o.strides},
          {"dilations", o.dilations},
          {"pads", o.pads},
          {"groups", o.groups},
          {"layout", o.layout == Layout::NHWC ? "nhwc" : "nchw"}};
}

std::vector<std::int64_t> to_nhwc(const std::vector<std::int64_t>& s) { return {s[0], s[2], s[3], s[1]}; }

bool nhwc_is_nchw(const std::vector<std::int64_t>& s) { return s[1] == 1 || (s[2] == 1 && s[3] == 1); }

namespace {
bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }
}  // namespace

std::int64_t Lowerer::add_raw(DType t, std::vector<std::int64_t> shape, const void* data, std::size_t bytes) {
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

std::int64_t Lowerer::add_weight(const std::vector<float>& v, DType t, std::vector<std::int64_t> shape) {
  switch (t) {
    case DType::F32: return add_raw(t, std::move(shape), v.data(), v.size() * 4);
    case DType::F16:
    case DType::BF16: {
      std::vector<std::uint16_t> h(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) h[i] = t == DType::F16 ? fw::f32_to_f16(v[i]) : fw::f32_to_bf16(v[i]);
      return add_raw(t, std::move(shape), h.data(), h.size() * 2);
    }
    default: throw Error(Status::Internal, "compiler: add_weight of an integer type");
  }
}

std::int64_t Lowerer::add_weight_transposed(const std::vector<float>& m, std::int64_t rows, std::int64_t cols,
                                            DType t) {
  std::vector<float> w(m.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      w[static_cast<std::size_t>(c * rows + r)] = m[static_cast<std::size_t>(r * cols + c)];
  return add_weight(w, t, {cols, rows});
}

// An integer constant (indices) as i32, each value exact: one that is not
// an integer within int32's range is refused.
std::int64_t Lowerer::add_i32(const std::string& name, const Value& val) {
  std::vector<std::int32_t> w(val.elements());
  const bool ints = val.ints.size() == w.size();
  for (std::size_t i = 0; i < w.size(); ++i) {
    const double x = ints ? static_cast<double>(val.ints[i]) : static_cast<double>((*val.data)[i]);
    if (x != std::trunc(x) || std::abs(x) > 2147483647.0)
      throw Error(Status::Unsupported, "constant '" + name + "' holds " + std::to_string(x) +
                                           ", which is not a 32-bit integer; the board takes it as i32");
    w[i] = static_cast<std::int32_t>(x);
  }
  return add_raw(DType::I32, val.shape, w.data(), w.size() * 4);
}

std::int64_t Lowerer::scalar_u8(std::int32_t v) {
  const auto b = static_cast<std::uint8_t>(v);
  return add_raw(DType::U8, {}, &b, 1);
}

std::int64_t Lowerer::op(std::string kind, const std::string& node, std::map<std::string, std::int64_t> operands,
                         json attrs) {
  DOp o;
  o.kind = std::move(kind);
  o.node = node;
  o.operands = std::move(operands);
  o.attrs = std::move(attrs);
  dg().ops.push_back(std::move(o));
  return static_cast<std::int64_t>(dg().ops.size() - 1);
}

QParams Lowerer::range_q(const std::string& v) const {
  if (auto f = fixed_q.find(v); f != fixed_q.end()) return f->second;
  if (!ranges) throw Error(Status::Internal, "compiler: int8 lowering without ranges");
  auto it = ranges->find(v);
  if (it == ranges->end()) throw Error(Status::Internal, "compiler: no calibrated range for '" + v + "'");
  return qparams(it->second);
}

std::int64_t Lowerer::produce(const std::string& v, DType t, const std::vector<std::int64_t>& shape) {
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

std::int64_t Lowerer::produce_bool(const std::string& v, const std::vector<std::int64_t>& shape) {
  const auto id = dg().add_arena(v, DType::U8, shape);
  Rep& r = reps[v];
  r.by_dtype[DType::U8] = id;
  r.primary = DType::U8;
  r.boolean = true;
  return id;
}

std::int64_t Lowerer::produce_nhwc(const std::string& v, const std::vector<std::int64_t>& shape, const QParams& q) {
  const auto id = dg().add_arena(v, DType::U8, to_nhwc(shape));
  Rep r;
  r.primary = DType::U8;
  r.primary_nhwc = true;
  r.nhwc = id;
  r.q = q;
  reps[v] = r;
  return id;
}

std::int64_t Lowerer::get_bool(const Node& n, const std::string& v) {
  const Value& val = g.value(v);
  if (val.data) {
    auto key = std::make_pair(v, DType::U8);
    if (auto it = const_cache.find(key); it != const_cache.end()) return it->second;
    std::vector<std::uint8_t> bits(val.data->size());
    for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = (*val.data)[i] != 0.0f;
    return const_cache[key] = add_raw(DType::U8, val.shape, bits.data(), bits.size());
  }
  auto it = reps.find(v);
  if (it != reps.end() && !it->second.boolean && g.integer_inputs.count(v)) {
    // A bool model input, held as i32 (0 or 1): true above 0.
    Rep& r = it->second;
    const auto b = dg().add_arena("", DType::U8, val.shape);
    const std::int32_t zero = 0;
    op("greater", "", {{"a", r.by_dtype.at(DType::I32)}, {"b", add_raw(DType::I32, {}, &zero, 4)}, {"y", b}});
    r.by_dtype[DType::U8] = b;
    return b;
  }
  if (it == reps.end() || !it->second.boolean)
    throw Error(Status::Unsupported, "node '" + n.name + "' (" + n.op + "): input '" + v +
                                         "' is not a boolean the device computed (a comparison or logic) or a model "
                                         "input");
  return it->second.by_dtype.at(DType::U8);
}

std::int64_t Lowerer::dense(std::int64_t id, DType t, const std::vector<std::int64_t>& shape) {
  if (dg().tensors[static_cast<std::size_t>(id)].strides.empty()) return id;
  const auto copy = dg().add_arena("", t, shape);
  op("cast", "", {{"x", id}, {"y", copy}});
  return copy;
}

void Lowerer::alias(const std::string& v, const std::string& of, const std::vector<std::int64_t>& shape) {
  get_nchw(of);  // a view needs the NCHW bytes
  Rep& from = reps.at(of);
  auto& held = from.by_dtype.at(from.primary);
  held = dense(held, from.primary, g.value(of).shape);  // a strided view is reshaped as a copy
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

void Lowerer::ensure_q_tensors(Rep& r) {
  if (r.q_scale < 0) {
    r.q_scale = scalar_f32(r.q.scale);
    r.q_zero = scalar_u8(r.q.zero_point);
  }
}

// A value held NHWC, back to NCHW: u8 by a transpose of the u8 form
// (quantized from the float one if need be), floats by a transpose of the
// float form (dequantized from the u8 one if need be), then cast.
std::int64_t Lowerer::from_nhwc(Rep& r, const std::string& v, DType t) {
  const auto shape = g.value(v).shape;
  const std::vector<std::size_t> back{0, 3, 1, 2};
  std::int64_t id;
  if (t == DType::U8) {
    const auto u = get_nhwc(v);
    id = dg().add_arena("", DType::U8, shape);
    op("transpose", "", {{"x", u}, {"y", id}}, {{"perm", back}});
  } else {
    const auto f = get_nhwc_float(v);
    if (float_nhwc && nhwc_is_nchw(shape)) {
      id = dg().add_view(f, shape);
    } else if (t != nhwc_type && is_float(t)) {
      // Converted and transposed in one cast, reading the NHWC bytes in
      // NCHW's order (an fp16 model's f32 output).
      const std::int64_t c = shape[1], h = shape[2], w = shape[3];
      id = dg().add_arena("", t, shape);
      op("cast", "", {{"x", dg().add_subview(f, shape, {h * w * c, 1, w * c, c}, 0)}, {"y", id}});
      r.by_dtype[t] = id;
      return id;
    } else {
      id = dg().add_arena("", nhwc_type, shape);
      op("transpose", "", {{"x", f}, {"y", id}}, {{"perm", back}});
    }
    if (t != nhwc_type) {
      r.by_dtype[nhwc_type] = id;
      const auto c = dg().add_arena("", t, shape);
      op("cast", "", {{"x", id}, {"y", c}});
      id = c;
    }
  }
  r.by_dtype[t] = id;
  return id;
}

// A value held NCHW, in another type: quantized, dequantized or cast.
std::int64_t Lowerer::convert(Rep& r, const std::string& v, DType t) {
  const auto shape = g.value(v).shape;
  const auto src = r.by_dtype.at(r.primary);
  std::int64_t id;
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

std::int64_t Lowerer::get(const std::string& v, DType t) {
  const Value& val = g.value(v);
  if (val.data) {
    if (t == DType::U8) throw Error(Status::Internal, "compiler: a constant as u8 activation");
    auto key = std::make_pair(v, t);
    if (auto it = const_cache.find(key); it != const_cache.end()) return it->second;
    if (t == DType::I32) return const_cache[key] = add_i32(v, val);
    return const_cache[key] = add_weight(*val.data, t, val.shape);
  }
  auto rit = reps.find(v);
  if (rit == reps.end()) throw Error(Status::Internal, "compiler: value '" + v + "' used before it is produced");
  Rep& r = rit->second;
  if (auto it = r.by_dtype.find(t); it != r.by_dtype.end()) return it->second;
  if (r.boolean) {  // 1 or 0 as a number: a cast
    const auto id = dg().add_arena("", t, g.value(v).shape);
    op("cast", "", {{"x", r.by_dtype.at(DType::U8)}, {"y", id}});
    r.by_dtype[t] = id;
    return id;
  }
  if (r.primary_nhwc) return from_nhwc(r, v, t);
  return convert(r, v, t);
}

std::int64_t Lowerer::get_nhwc(const std::string& v) {
  Rep* r = reps.count(v) ? &reps.at(v) : nullptr;
  if (r && r->nhwc >= 0) return r->nhwc;
  if (r && r->nhwc_float >= 0) {  // quantized where it is, NHWC
    r->q = range_q(v);
    ensure_q_tensors(*r);
    r->nhwc = dg().add_arena("", DType::U8, to_nhwc(g.value(v).shape));
    op("quantize", "", {{"x", r->nhwc_float}, {"scale", r->q_scale}, {"zero_point", r->q_zero}, {"y", r->nhwc}},
       {{"axis", 1}});
    return r->nhwc;
  }
  const auto u = get(v, DType::U8);
  r = &reps.at(v);
  r->nhwc = dg().add_arena("", DType::U8, to_nhwc(g.value(v).shape));
  op("transpose", "", {{"x", u}, {"y", r->nhwc}}, {{"perm", std::vector<std::size_t>{0, 2, 3, 1}}});
  return r->nhwc;
}

std::int64_t Lowerer::get_nchw(const std::string& v) {
  Rep& r = reps.at(v);
  return r.primary_nhwc ? get(v, r.primary) : r.by_dtype.at(r.primary);
}

bool Lowerer::held_float_nhwc(const std::string& v) const {
  const auto it = reps.find(v);
  return float_nhwc && shape_of(v).size() == 4 && it != reps.end() && it->second.primary_nhwc &&
         it->second.primary == nhwc_type && it->second.nhwc_float >= 0 && !it->second.boolean;
}

bool Lowerer::held_nhwc(const std::string& v) const {
  const auto it = reps.find(v);
  // Only a form that holds the value exactly: the one it was produced in.
  return !g.value(v).data && it != reps.end() && it->second.primary_nhwc && !it->second.boolean &&
         shape_of(v).size() == 4;
}

bool Lowerer::nhwc_island(const Node& n, const std::vector<std::string>& xs, bool gates) const {
  if (shape_of(n.output).size() != 4) return false;
  if (float_nhwc) {
    bool any = false;
    for (const auto& x : xs) {
      const Value& val = g.value(x);
      if (val.data) {
        if (val.shape.size() > 4) return false;
        continue;
      }
      const auto it = reps.find(x);
      if (it == reps.end() || it->second.boolean || val.shape.size() != 4) return false;
      any = any || (held_float_nhwc(x) && val.shape == shape_of(n.output));
    }
    return any;
  }
  if (!int8()) return false;
  const auto& ys = shape_of(n.output);
  auto whole = [&](const std::string& x) { return held_nhwc(x) && shape_of(x) == ys; };
  if (!gates) return std::all_of(xs.begin(), xs.end(), whole);
  auto gate = [&](const std::string& x) {
    const auto it = reps.find(x);
    const auto& s = shape_of(x);
    return !g.value(x).data && it != reps.end() && !it->second.boolean && s.size() == 4 && s[0] == ys[0] &&
           s[1] == ys[1] && s[2] == 1 && s[3] == 1;
  };
  return std::any_of(xs.begin(), xs.end(), whole) &&
         std::all_of(xs.begin(), xs.end(), [&](const std::string& x) { return whole(x) || gate(x); });
}

std::int64_t Lowerer::get_nhwc_float(const std::string& v) {
  const Value& val = g.value(v);
  if (val.data) {  // [.., C, H, W] padded to 4-D, its data permuted to NHWC
    const auto key = std::make_pair(v + "\x01nhwc", nhwc_type);
    if (auto it = const_cache.find(key); it != const_cache.end()) return it->second;
    std::vector<std::int64_t> s4(4 - val.shape.size(), 1);
    s4.insert(s4.end(), val.shape.begin(), val.shape.end());
    const auto from = row_major_strides(s4);
    std::vector<float> data(val.data->size());
    std::size_t i = 0;
    for (std::int64_t a = 0; a < s4[0]; ++a)
      for (std::int64_t h = 0; h < s4[2]; ++h)
        for (std::int64_t w = 0; w < s4[3]; ++w)
          for (std::int64_t c = 0; c < s4[1]; ++c)
            data[i++] = (*val.data)[static_cast<std::size_t>(a * from[0] + c * from[1] + h * from[2] + w * from[3])];
    return const_cache[key] = add_weight(data, nhwc_type, to_nhwc(s4));
  }
  Rep& r = reps.at(v);
  if (r.nhwc_float >= 0) return r.nhwc_float;
  if (r.nhwc < 0) {  // held NCHW (float_nhwc): transposed once, or viewed where that moves nothing
    const auto& shape = val.shape;
    if (!nhwc_is_nchw(shape) && !r.by_dtype.count(nhwc_type) && r.primary != nhwc_type && is_float(r.primary)) {
      // In another float type (an fp16 model's f32 input): converted and
      // transposed in one cast, reading the NCHW bytes in NHWC's order.
      const auto x = dense(r.by_dtype.at(r.primary), r.primary, shape);
      const std::int64_t c = shape[1], h = shape[2], w = shape[3];
      const auto in_nhwc_order = dg().add_subview(x, to_nhwc(shape), {c * h * w, w, 1, h * w}, 0);
      r.nhwc_float = dg().add_arena("", nhwc_type, to_nhwc(shape));
      op("cast", "", {{"x", in_nhwc_order}, {"y", r.nhwc_float}});
      return r.nhwc_float;
    }
    const auto x = dense(get(v, nhwc_type), nhwc_type, shape);
    if (nhwc_is_nchw(shape)) {
      r.nhwc_float = dg().add_view(x, to_nhwc(shape));
    } else {
      r.nhwc_float = dg().add_arena("", nhwc_type, to_nhwc(shape));
      op("transpose", "", {{"x", x}, {"y", r.nhwc_float}}, {{"perm", std::vector<std::size_t>{0, 2, 3, 1}}});
    }
    return r.nhwc_float;
  }
  ensure_q_tensors(r);
  r.nhwc_float = dg().add_arena("", DType::F32, to_nhwc(g.value(v).shape));
  op("dequantize", "", {{"x", r.nhwc}, {"scale", r.q_scale}, {"zero_point", r.q_zero}, {"y", r.nhwc_float}},
     {{"axis", 1}});
  return r.nhwc_float;
}

std::int64_t Lowerer::produce_nhwc_float(const std::string& v, const std::vector<std::int64_t>& shape) {
  const auto id = dg().add_arena(v, nhwc_type, to_nhwc(shape));
  Rep r;
  r.primary = nhwc_type;
  r.primary_nhwc = true;
  r.nhwc_float = id;
  reps[v] = r;
  return id;
}

std::int64_t Lowerer::accumulator(const std::string& v, const std::string& residual,
                                  const std::vector<std::int64_t>& shape, bool nhwc, std::size_t at) {
  const DType t = nhwc ? nhwc_type : act;
  // Whether `value` is read by the convolution itself (but as its
  // residual), by a later node, or as an output.
  auto read_after = [&](const std::string& value) {
    for (std::size_t i = at; i < g.nodes.size(); ++i) {
      const auto& in = g.nodes[i].inputs;
      for (std::size_t k = 0; k < in.size(); ++k)
        if (in[k] == value && !(i == at && k == 3)) return true;
    }
    return std::any_of(g.outputs.begin(), g.outputs.end(), [&](const auto& o) { return o.second == value; });
  };
  std::int64_t held = -1;
  if (auto it = reps.find(residual); it != reps.end()) {
    if (nhwc) {
      held = it->second.nhwc_float;
    } else if (auto d = it->second.by_dtype.find(t); d != it->second.by_dtype.end()) {
      held = d->second;
    }
  }
  bool reuse = held >= 0 && !placements.count(v) && !read_after(residual);
  std::set<std::string> sharing{residual};  // the values whose bytes the convolution overwrites
  if (reuse) {
    const DTensor& h = dg().tensors[static_cast<std::size_t>(held)];
    // Tensors at one offset are one tensor and its views (before
    // share_arena): an input's view (a one-channel input's NHWC form, a
    // Reshape of it) is the input's bytes, which stay intact for the next
    // run.
    const auto same_bytes = [&](std::int64_t id) {
      const DTensor& o = dg().tensors[static_cast<std::size_t>(id)];
      return o.storage == Storage::Arena && (o.offset == h.offset || o.base == held);
    };
    reuse = h.storage == Storage::Arena && h.strides.empty() && h.base < 0 && h.dtype == t &&
            h.shape == (nhwc ? to_nhwc(shape) : shape) &&
            std::none_of(dg().inputs.begin(), dg().inputs.end(), same_bytes) &&
            std::none_of(dg().outputs.begin(), dg().outputs.end(), same_bytes);
    // Another value in the same bytes read later keeps them.
    for (const auto& [other, rep] : reps) {
      std::vector<std::int64_t> ids{rep.nhwc, rep.nhwc_float};
      for (const auto& [_, id] : rep.by_dtype) ids.push_back(id);
      for (std::int64_t id : ids) {
        if (id < 0 || !same_bytes(id)) continue;
        sharing.insert(other);
        if (read_after(other)) reuse = false;
      }
    }
  }
  if (reuse) {
    Rep r;
    r.primary = t;
    if (nhwc) {
      r.primary_nhwc = true;
      r.nhwc_float = held;
    } else {
      r.by_dtype[t] = held;
    }
    reps[v] = r;
    out.overwritten.insert(sharing.begin(), sharing.end());
    return held;
  }
  const std::int64_t from = nhwc ? get_nhwc_float(residual) : get(residual, t);
  const std::int64_t y = nhwc ? produce_nhwc_float(v, shape) : produce(v, t, shape);
  op("cast", "", {{"x", from}, {"y", y}});
  return y;
}

void Lowerer::lower_node(const Node& n) {
  if (fused_into_producer.count(n.name)) return;
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
  if (!n.handler->lower) throw Error(Status::Internal, "compiler: no lowering for " + n.op);
  n.handler->lower(*this, n);
}

// The graph's outputs, each an f32 arena tensor of its own.
void Lowerer::lower_outputs() {
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
}

// Where each value lies (calibration and the report read them), and in
// int8 the Quant section's activations.
void Lowerer::describe_values() {
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

void Lowerer::run() {
  act = precision == Precision::F16 ? DType::F16 : precision == Precision::BF16 ? DType::BF16 : DType::F32;
  for (const auto& in : g.inputs) {
    const DType t = g.integer_inputs.count(in) ? DType::I32 : DType::F32;
    const auto id = dg().add_arena(in, t, g.value(in).shape);
    Rep r;
    r.primary = t;
    r.by_dtype[t] = id;
    reps[in] = r;
    dg().inputs.push_back(id);
  }
  float_nhwc = precision != Precision::Int8 && !nchw_only;
  nhwc_type = precision == Precision::Int8 ? DType::F32 : act;
  // int8 values are u8 NHWC: Concats copy. In fp32 a value made NHWC is
  // not made in its part (produce_nhwc_float), and a Concat with one copies
  // (lower_concat).
  if (precision != Precision::Int8) placements = plan_concats(g, act);
  for (const auto& n : g.nodes) lower_node(n);
  lower_outputs();
  describe_values();
}

}  // namespace tpuhal::rt::detail
