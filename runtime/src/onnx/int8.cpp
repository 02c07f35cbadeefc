// int8 layers: symmetric per-output-channel i8 weights, an i32 bias in
// units of the input's scale times each channel's weight scale, and
// qlinear_conv over u8 NHWC activations (Conv, and Gemm and MatMul by a
// constant as 1x1 convolutions).
#include <algorithm>
#include <array>
#include <cmath>

#include "onnx/lowerer.hpp"

namespace tpuhal::rt::detail {
namespace {

// The per-output-channel scales of symmetric int8 weights w [cout, ...].
std::vector<float> weight_scales(const std::vector<float>& w, std::size_t cout) {
  const std::size_t per = w.size() / cout;
  std::vector<float> scales(cout);
  for (std::size_t c = 0; c < cout; ++c) {
    float m = 0;
    for (std::size_t k = 0; k < per; ++k) m = std::max(m, std::fabs(w[c * per + k]));
    scales[c] = m > 0 ? m / 127.0f : 1.0f;
  }
  return scales;
}

// Whether quantizing to `q` applies activation `a`, none, a Relu or a Clip
// (the int8 layer's requantisation clamps to u8 and applies nothing else):
// where the activation's bounds quantize to 0 and 255 or beyond. Calibrated ranges do by construction (the activation's
// output is what was calibrated), so only Q/DQ models are checked. The u8 level that `v` quantizes to in `q`, before
// saturation.
float u8_level(float v, const QParams& q) { return std::nearbyint(v / q.scale) + static_cast<float>(q.zero_point); }

// The bounds of a Relu or Clip (int8 fuses no other activation).
float lower_bound(const ActivationParams& a) { return a.kind == Activation::Relu ? 0.0f : a.alpha; }

bool applied_by_range(const ActivationParams& a, const QParams& q) {
  if (a.kind == Activation::None) return true;
  return u8_level(lower_bound(a), q) <= 0 && (a.kind == Activation::Relu || u8_level(a.beta, q) >= 255);
}

// The scale of each output channel of a Q/DQ model's weights.
std::vector<float> model_scales(const QuantizedConstant& wq, std::size_t cout) {
  return wq.scales.size() == 1 ? std::vector<float>(cout, wq.scales[0]) : wq.scales;
}

}  // namespace

bool Lowerer::qdq_int8(const Node& n, const std::string& x, const QuantizedConstant* wq) {
  if (!g.qdq) return true;
  const char* why = nullptr;
  auto held = reps.find(x);
  const bool x_u8 =
      fixed_q.count(x) || (held != reps.end() && held->second.primary == DType::U8 && !held->second.boolean);
  if (!wq)
    why = "its weights are not dequantized from int8 by the model";
  else if (wq->axis != 0 && wq->scales.size() != 1)
    why = "its weights are not quantized per output channel";
  else if (std::any_of(wq->q.begin(), wq->q.end(), [](std::int32_t q) { return q < -128 || q > 127; }))
    why = "its weights less their zero point do not fit int8";
  else if (!x_u8)
    why = "its input is not quantized by the model (no per-tensor QuantizeLinear / DequantizeLinear pair)";
  else if (!fixed_q.count(n.output))
    why = "its output is not quantized by the model (no per-tensor QuantizeLinear / DequantizeLinear pair)";
  if (!why) {
    out.qdq_int8.push_back(n.name);
    return true;
  }
  out.qdq_float.emplace_back(n.name, why);
  return false;
}

void Lowerer::qdq_float(const Node& n, const char* why) {
  if (int8() && g.qdq) out.qdq_float.emplace_back(n.name, why);
}

// Whether every bias of an int8 layer reading `x` fits int32 in units of
// x's scale times its channel's weight scale. Where activations are many
// orders of magnitude below the bias (random-weight networks whose values
// shrink towards 1e-10), it would saturate and the layer be wrong: such a
// layer runs in fp32, noted in `fp32_for_bias`.
bool Lowerer::int8_bias_fits(const Node& n, const std::string& x, const std::vector<float>& w, std::size_t cout,
                             const std::vector<float>& bias, const QuantizedConstant* wq) {
  if (bias.empty()) return true;
  const auto scales = wq ? model_scales(*wq, cout) : weight_scales(w, cout);
  // The scale x is held at, which qconv uses: a Slice's or MaxPool's output
  // keeps its input's, not its own calibrated range's.
  auto held = reps.find(x);
  const double xs = held != reps.end() && held->second.primary == DType::U8 ? held->second.q.scale : range_q(x).scale;
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
void Lowerer::qconv(const Node& n, std::int64_t xv, const std::string& x, const std::vector<float>& w,
                    std::vector<std::int64_t> wshape, const std::vector<float>& bias, const ops::Conv2dOptions& o,
                    const std::vector<std::int64_t>& yshape, const std::vector<std::int64_t>& yview,
                    const QuantizedConstant* wq) {
  Rep& xr = reps.at(x);
  ensure_q_tensors(xr);
  const QParams xq = xr.q;
  const auto xs = xr.q_scale, xz = xr.q_zero;
  const auto cout = static_cast<std::size_t>(wshape[0]);
  const std::size_t per = w.size() / cout;
  const std::vector<float> scales = wq ? model_scales(*wq, cout) : weight_scales(w, cout);
  std::vector<std::int8_t> qw(w.size());
  std::vector<std::int32_t> qb(cout);
  for (std::size_t c = 0; c < cout; ++c) {
    for (std::size_t k = 0; k < per; ++k)
      qw[c * per + k] =
          wq ? static_cast<std::int8_t>(wq->q[c * per + k])
             : static_cast<std::int8_t>(std::clamp(std::nearbyint(w[c * per + k] / scales[c]), -127.0f, 127.0f));
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
  std::int64_t yv = yview.empty() ? produce_nhwc(n.output, yshape, range_q(n.output))
                                  : dg().add_view(produce(n.output, DType::U8, yshape), yview);
  Rep& yr = reps[n.output];
  ensure_q_tensors(yr);
  // A fused Relu or Clip that the output's u8 range does not apply by
  // itself (a zero point above 0: int8 from a Q/DQ model): the sums go to a
  // scratch tensor, then the activation's bounds as u8 levels clamp them.
  const std::int64_t y_final = yv;
  const bool clamp = g.qdq && !applied_by_range(n.act, yr.q);
  if (clamp) yv = dg().add_arena("", DType::U8, dg().tensors[static_cast<std::size_t>(y_final)].shape);
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
  if (clamp) {
    const auto level = [&](float v) { return static_cast<std::int32_t>(std::clamp(u8_level(v, yr.q), 0.0f, 255.0f)); };
    const bool upper = n.act.kind == Activation::Clip;
    const auto lo = scalar_u8(level(lower_bound(n.act)));
    const std::int64_t mid =
        upper ? dg().add_arena("", DType::U8, dg().tensors[static_cast<std::size_t>(yv)].shape) : y_final;
    op("max", n.name, {{"a", yv}, {"b", lo}, {"y", mid}});
    if (upper) op("min", n.name, {{"a", mid}, {"b", scalar_u8(level(n.act.beta))}, {"y", y_final}});
  }
}

const Node* Lowerer::sole_consumer(const std::string& v) const {
  if (consumers(g, v) != 1) return nullptr;
  for (const auto& c : g.nodes)
    if (std::find(c.inputs.begin(), c.inputs.end(), v) != c.inputs.end()) return &c;
  return nullptr;  // its one use is as a graph output
}

Lowerer::Silu Lowerer::silu_of(const std::string& x) const {
  if (consumers(g, x) != 2) return {};
  const Node *sigmoid = nullptr, *mul = nullptr;
  for (const auto& c : g.nodes) {
    if (std::find(c.inputs.begin(), c.inputs.end(), x) == c.inputs.end()) continue;
    if (c.op == "Sigmoid" && c.inputs.size() == 1)
      sigmoid = &c;
    else if (c.op == "Mul" && c.inputs.size() == 2)
      mul = &c;
  }
  if (!sigmoid || !mul || sole_consumer(sigmoid->output) != mul || fused_into_producer.count(sigmoid->name)) return {};
  const bool pair = (mul->inputs[0] == x && mul->inputs[1] == sigmoid->output) ||
                    (mul->inputs[1] == x && mul->inputs[0] == sigmoid->output);
  return pair ? Silu{sigmoid, mul} : Silu{};
}

bool Lowerer::qadd(const Node& n) {
  if (!int8() || n.op != "Add" || !nhwc_island(n, {n.inputs[0], n.inputs[1]})) return false;
  for (const auto& x : n.inputs)
    if (reps.at(x).primary != DType::U8) return false;  // an f32 island's value: exact only there
  // A Relu that is the sum's only consumer: quantized to the Relu's range,
  // which applies it (its lower bound quantizes to level 0).
  const Node* relu = sole_consumer(n.output);
  if (relu && (relu->op != "Relu" || keep_fp16.count(relu->name) || !has_q(relu->output) ||
               !applied_by_range(ActivationParams::relu(), range_q(relu->output))))
    relu = nullptr;
  const std::string& sum = relu ? relu->output : n.output;
  if (!has_q(sum)) return false;
  qbinary("qlinear_add", n, sum);
  if (relu) fused_into_producer.insert(relu->name);
  return true;
}

bool Lowerer::qmul(const Node& n) {
  if (!int8() || n.op != "Mul" || keep_fp16.count(n.name) || !nhwc_island(n, {n.inputs[0], n.inputs[1]}, true))
    return false;
  for (const auto& x : n.inputs)
    if (reps.at(x).primary != DType::U8 || reps.at(x).nhwc < 0) return false;
  if (!has_q(n.output)) return false;
  qbinary("qlinear_mul", n, n.output);  // a gate [n, c, 1, 1] is held [n, 1, 1, c]: the op broadcasts it
  return true;
}

bool Lowerer::qavgpool(const Node& n) {
  const std::string& x = n.inputs[0];
  const auto& xs = shape_of(x);
  const auto& ys = shape_of(n.output);
  if (!int8() || keep_fp16.count(n.name) || xs.size() != 4 || !held_u8_nhwc(reps, x) || !has_q(n.output)) return false;
  // A model output (a feature extractor's) keeps its f32 mean.
  for (const auto& [name, value] : g.outputs)
    if (value == n.output) return false;
  Rep& xr = reps.at(x);
  ensure_q_tensors(xr);
  // [N, C, 1, 1] held NHWC; a ReduceMean's [N, C] (keepdims 0): the same bytes.
  const auto y = ys.size() == 4 ? produce_nhwc(n.output, ys, range_q(n.output))
                                : dg().add_view(produce(n.output, DType::U8, ys), {xs[0], 1, 1, xs[1]});
  Rep& r = reps.at(n.output);
  ensure_q_tensors(r);
  op("qlinear_global_avg_pool", n.name,
     {{"x", xr.nhwc},
      {"x_scale", xr.q_scale},
      {"x_zero_point", xr.q_zero},
      {"y_scale", r.q_scale},
      {"y_zero_point", r.q_zero},
      {"y", y}});
  return true;
}

void Lowerer::qbinary(const char* kind, const Node& n, const std::string& result) {
  for (const auto& x : n.inputs) ensure_q_tensors(reps.at(x));
  const Rep &a = reps.at(n.inputs[0]), &b = reps.at(n.inputs[1]);
  const auto y = produce_nhwc(result, shape_of(result), range_q(result));
  Rep& r = reps.at(result);
  ensure_q_tensors(r);
  op(kind, n.name,
     {{"a", a.nhwc},
      {"a_scale", a.q_scale},
      {"a_zero_point", a.q_zero},
      {"b", b.nhwc},
      {"b_scale", b.q_scale},
      {"b_zero_point", b.q_zero},
      {"y_scale", r.q_scale},
      {"y_zero_point", r.q_zero},
      {"y", y}});
}

namespace {

double activated(const ActivationParams& p, double x) {
  const auto clamp01 = [](double v) { return std::clamp(v, 0.0, 1.0); };
  switch (p.kind) {
    case Activation::None: return x;
    case Activation::Relu: return std::max(x, 0.0);
    case Activation::Clip: return std::clamp(x, static_cast<double>(p.alpha), static_cast<double>(p.beta));
    case Activation::Sigmoid: return 1 / (1 + std::exp(-x));
    case Activation::Silu: return x / (1 + std::exp(-x));
    case Activation::LeakyRelu: return x < 0 ? p.alpha * x : x;
    case Activation::Tanh: return std::tanh(x);
    case Activation::HardSigmoid: return clamp01(p.alpha * x + p.beta);
    case Activation::HardSwish: return x * clamp01(p.alpha * x + p.beta);
  }
  return x;
}

}  // namespace

// A 256-entry u8 table: each level of `in` dequantized (as the board does,
// in f32), activated in double, rounded to f32 and quantized to `to` as
// the board's quantize does.
std::int64_t Lowerer::level_table(const QParams& in, const QParams& to, const ActivationParams& f) {
  std::array<std::uint8_t, 256> table{};
  for (int level = 0; level < 256; ++level) {
    const float v = static_cast<float>(level - in.zero_point) * in.scale;
    const auto y = static_cast<float>(activated(f, v));
    const float q = std::nearbyint(y / to.scale) + static_cast<float>(to.zero_point);
    table[static_cast<std::size_t>(level)] = static_cast<std::uint8_t>(std::clamp(q, 0.0f, 255.0f));
  }
  return add_raw(DType::U8, {256}, table.data(), table.size());
}

bool Lowerer::qtable(const Node& n, const ActivationParams& p) {
  if (!int8() || !nhwc_island(n, {n.inputs[0]})) return false;
  const std::string& x = n.inputs[0];
  if (reps.at(x).primary != DType::U8) return false;
  ActivationParams f = p;
  // x * Sigmoid(x) and x * HardSigmoid(x): the SiLU and the HardSwish, one
  // table into the Mul's output.
  const bool gate = p.kind == Activation::Sigmoid || p.kind == Activation::HardSigmoid;
  const Node* mul = gate ? sole_consumer(n.output) : nullptr;
  if (mul &&
      (mul->op != "Mul" || keep_fp16.count(mul->name) || !has_q(mul->output) ||
       !((mul->inputs[0] == x && mul->inputs[1] == n.output) || (mul->inputs[1] == x && mul->inputs[0] == n.output))))
    mul = nullptr;
  if (mul) f = p.kind == Activation::Sigmoid ? ActivationParams::silu() : ActivationParams::hard_swish(p.alpha, p.beta);
  const std::string& result = mul ? mul->output : n.output;
  if (!has_q(result)) return false;
  const QParams to = range_q(result);
  const auto t = level_table(reps.at(x).q, to, f);
  const auto y = produce_nhwc(result, shape_of(result), to);
  op("gather", n.name, {{"x", t}, {"indices", reps.at(x).nhwc}, {"y", y}}, {{"axis", 0}});
  if (mul) fused_into_producer.insert(mul->name);
  return true;
}

bool held_u8_nhwc(const std::map<std::string, Rep>& reps, const std::string& v) {
  auto it = reps.find(v);
  return it != reps.end() && it->second.primary == DType::U8 && it->second.nhwc >= 0 && !it->second.boolean;
}

bool Lowerer::qslice(const Node& n, const std::vector<std::int64_t>& lo, const std::vector<std::int64_t>& step) {
  const std::string& x = n.inputs[0];
  if (std::any_of(step.begin(), step.end(), [](std::int64_t s) { return s <= 0; })) return false;
  const bool f32 = held_float_nhwc(x);  // a float model: the same copy of float elements
  if (!f32 && (!int8() || keep_fp16.count(n.name) || shape_of(x).size() != 4 || !held_u8_nhwc(reps, x))) return false;
  const Rep& r = reps.at(x);
  const auto st = row_major_strides(to_nhwc(shape_of(x)));
  std::vector<std::int64_t> strides(4);
  std::uint64_t first = 0;
  for (std::size_t d = 0; d < 4; ++d) {
    const std::size_t h = nhwc_dim(d);
    first += static_cast<std::uint64_t>(lo[d] * st[h]);
    strides[h] = st[h] * step[d];
  }
  const auto& shape = shape_of(n.output);
  const auto view =
      dg().add_subview(f32 ? r.nhwc_float : r.nhwc, to_nhwc(shape), strides, first * (f32 ? size_of(nhwc_type) : 1));
  const QParams q = r.q;  // produce_nhwc replaces the output's Rep, not x's; a copy keeps it plain
  op("cast", n.name,
     {{"x", view}, {"y", f32 ? produce_nhwc_float(n.output, shape) : produce_nhwc(n.output, shape, q)}});
  return true;
}

bool Lowerer::qrepeat(const Node& n, std::int64_t fh, std::int64_t fw) {
  const std::string& x = n.inputs[0];
  const bool f32 = held_float_nhwc(x);  // a float model: the same copies of float elements
  if (!f32 && (!int8() || keep_fp16.count(n.name) || shape_of(x).size() != 4 || !held_u8_nhwc(reps, x))) return false;
  const std::int64_t xv = f32 ? reps.at(x).nhwc_float : reps.at(x).nhwc;
  const QParams q = reps.at(x).q;
  const auto xs = to_nhwc(shape_of(x));
  const auto y = f32 ? produce_nhwc_float(n.output, shape_of(n.output)) : produce_nhwc(n.output, shape_of(n.output), q);
  const auto st = row_major_strides(to_nhwc(shape_of(n.output)));
  const std::uint64_t bytes = f32 ? size_of(nhwc_type) : 1;
  // Y[n, h * fh + i, w * fw + j, c] = X[n, h, w, c]: one copy per (i, j).
  for (std::int64_t i = 0; i < fh; ++i)
    for (std::int64_t j = 0; j < fw; ++j) {
      const auto part = dg().add_subview(y, xs, {st[0], st[1] * fh, st[2] * fw, st[3]},
                                         static_cast<std::uint64_t>(i * st[1] + j * st[2]) * bytes);
      op("cast", n.name, {{"x", xv}, {"y", part}});
    }
  return true;
}

bool Lowerer::qconcat(const Node& n, std::int64_t axis) {
  const auto& shape = shape_of(n.output);
  if (!int8() || keep_fp16.count(n.name) || shape.size() != 4 || !has_q(n.output)) return false;
  for (const auto& x : n.inputs)
    if (!held_u8_nhwc(reps, x)) return false;
  const QParams to = range_q(n.output);
  const auto y = produce_nhwc(n.output, shape, to);
  const auto st = row_major_strides(to_nhwc(shape));
  const std::size_t ax = nhwc_dim(static_cast<std::size_t>(axis));
  std::int64_t at = 0;
  for (const auto& x : n.inputs) {
    const Rep& r = reps.at(x);
    const auto xs = to_nhwc(shape_of(x));
    const auto part = dg().add_subview(y, xs, st, static_cast<std::uint64_t>(at * st[ax]));
    at += xs[ax];
    std::int64_t from = r.nhwc;
    if (r.q.scale != to.scale || r.q.zero_point != to.zero_point) {
      // Requantized by table into a dense tensor (the lookup's fast
      // path), then copied into the part.
      from = dg().add_arena("", DType::U8, xs);
      op("gather", n.name, {{"x", level_table(r.q, to, ActivationParams{})}, {"indices", r.nhwc}, {"y", from}},
         {{"axis", 0}});
    }
    op("cast", n.name, {{"x", from}, {"y", part}});
  }
  return true;
}

}  // namespace tpuhal::rt::detail
