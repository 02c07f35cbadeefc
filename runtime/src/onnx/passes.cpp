// The passes over the imported graph (passes.hpp).
#include "onnx/passes.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include "onnx/attrs.hpp"
#include "onnx/importer.hpp"

namespace tpuhal::rt::detail {

std::size_t consumers(const Graph& g, const std::string& v) {
  std::size_t c = 0;
  for (const auto& n : g.nodes)
    for (const auto& x : n.inputs) c += x == v;
  for (const auto& o : g.outputs) c += o.second == v;
  return c;
}

namespace {

// The node (index) whose only consumer is node `i`'s first input, if `fits` it.
template <typename Fits>
std::optional<std::size_t> sole_producer(const Graph& g, std::size_t i, Fits fits) {
  const std::string& x = g.nodes[i].inputs.empty() ? std::string() : g.nodes[i].inputs[0];
  for (std::size_t j = 0; j < i; ++j) {
    if (g.nodes[j].output != x) continue;
    if (!fits(g.nodes[j]) || consumers(g, x) != 1) return std::nullopt;
    return j;
  }
  return std::nullopt;
}

bool takes_activation(const Node& n) { return n.handler->takes_activation && n.act.kind == Activation::None; }

// The node (index) that produces value `v`, if one does.
std::optional<std::size_t> producer(const Graph& g, const std::string& v) {
  for (std::size_t j = 0; j < g.nodes.size(); ++j)
    if (g.nodes[j].output == v) return j;
  return std::nullopt;
}

// A BatchNormalization's parameters, checked to be one per channel.
struct BatchNorm {
  const std::vector<float>&gamma, &beta, &mean, &var;
  float eps;
};
BatchNorm batch_norm(const Importer& im, const Node& bn, std::size_t channels) {
  const Graph& g = im.g;
  BatchNorm p{*g.value(bn.inputs[1]).data, *g.value(bn.inputs[2]).data, *g.value(bn.inputs[3]).data,
              *g.value(bn.inputs[4]).data, bn.attr<BatchNormAttrs>().epsilon};
  for (const auto* v : {&p.gamma, &p.beta, &p.mean, &p.var})
    if (v->size() != channels)
      im.fail_node(bn, "its parameters do not have one value per channel (" + std::to_string(channels) + ")");
  return p;
}

// A BatchNormalization of a 4-D value that follows no Conv, as a depthwise
// 1x1 Conv.
void batch_norm_as_conv(Importer& im, Node& bn) {
  Graph& g = im.g;
  const auto& x = g.value(bn.inputs[0]);
  if (x.shape.size() != 4) return;
  const auto c = static_cast<std::size_t>(x.shape[1]);
  const auto [gamma, beta, mean, var, eps] = batch_norm(im, bn, c);
  Value w, b;
  w.shape = {static_cast<std::int64_t>(c), 1, 1, 1};
  b.shape = {static_cast<std::int64_t>(c)};
  w.data = std::vector<float>(c);
  b.data = std::vector<float>(c);
  for (std::size_t k = 0; k < c; ++k) {
    const double scale = gamma[k] / std::sqrt(static_cast<double>(var[k]) + eps);
    (*w.data)[k] = static_cast<float>(scale);
    (*b.data)[k] = static_cast<float>(beta[k] - mean[k] * scale);
  }
  const std::string wn = bn.name + "/depthwise", bname = bn.name + "/depthwise_bias";
  g.values[wn] = std::move(w);
  g.values[bname] = std::move(b);
  bn.inputs = {bn.inputs[0], wn, bname};
  bn.op = "Conv";
  bn.handler = find_handler("Conv");
  ConvAttrs conv;
  conv.group = static_cast<std::int64_t>(c);
  conv.present = {"group"};
  bn.attrs = conv;
  bn.fused = "BatchNormalization as a depthwise 1x1 convolution";
  g.notes.push_back("BatchNormalization '" + bn.name + "' runs as a depthwise 1x1 Conv");
}

// Conv `conv`'s output channel c multiplied by s[c] and shifted, as new
// weights and bias named for `by`: weights w * s[c], bias (b - less[c]) *
// s[c] + plus[c] (empty `less` and `plus`: 0). Weights that a DequantizeLinear made keep their
// integers, their scales multiplied (one per output channel).
void rescale_conv(Graph& g, Node& conv, const std::vector<double>& s, const std::vector<float>& less,
                  const std::vector<float>& plus, const std::string& by) {
  const auto& w = g.value(conv.inputs[1]);
  const auto cout = static_cast<std::size_t>(w.shape[0]);
  Value nw = w, nb;
  nb.shape = {static_cast<std::int64_t>(cout)};
  nb.data = std::vector<float>(cout, 0.0f);
  const std::vector<float>* bias =
      conv.inputs.size() > 2 && !conv.inputs[2].empty() ? &*g.value(conv.inputs[2]).data : nullptr;
  const std::size_t per = w.elements() / cout;
  for (std::size_t c = 0; c < cout; ++c) {
    for (std::size_t k = 0; k < per; ++k) (*nw.data)[c * per + k] = static_cast<float>((*w.data)[c * per + k] * s[c]);
    const float b = (bias ? (*bias)[c] : 0.0f) - (less.empty() ? 0.0f : less[c]);
    (*nb.data)[c] = static_cast<float>(b * s[c] + (plus.empty() ? 0.0 : static_cast<double>(plus[c])));
  }
  nw.quantized = nullptr;
  if (w.quantized && (w.quantized->axis == 0 || w.quantized->scales.size() == 1)) {
    auto q = std::make_shared<QuantizedConstant>(*w.quantized);
    q->axis = 0;
    q->scales.resize(cout);
    for (std::size_t c = 0; c < cout; ++c)
      q->scales[c] = static_cast<float>(w.quantized->scales[w.quantized->scales.size() == 1 ? 0 : c] * s[c]);
    nw.quantized = std::move(q);
  }
  const std::string wn = conv.name + "/weights+" + by, bname = conv.name + "/bias+" + by;
  g.values[wn] = std::move(nw);
  g.values[bname] = std::move(nb);
  conv.inputs.resize(3);
  conv.inputs[1] = wn;
  conv.inputs[2] = bname;
}

// BatchNormalization `bn` folded into Conv `conv`, its only input's producer.
void fold_into_conv(Importer& im, Node& conv, const Node& bn) {
  Graph& g = im.g;
  const auto cout = static_cast<std::size_t>(g.value(conv.inputs[1]).shape[0]);
  const auto [gamma, beta, mean, var, eps] = batch_norm(im, bn, cout);
  std::vector<double> s(cout);
  for (std::size_t c = 0; c < cout; ++c) s[c] = gamma[c] / std::sqrt(static_cast<double>(var[c]) + eps);
  rescale_conv(g, conv, s, mean, beta, bn.name);
  conv.output = bn.output;
  conv.fused += (conv.fused.empty() ? "" : ", ") + std::string("BatchNormalization '") + bn.name + "'";
  g.notes.push_back("folded BatchNormalization '" + bn.name + "' into Conv '" + conv.name + "'");
}

}  // namespace

void fold_batch_norm(Importer& im) {
  Graph& g = im.g;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    Node& bn = g.nodes[i];
    if (bn.op != "BatchNormalization") continue;
    auto p = sole_producer(g, i, [](const Node& n) { return n.op == "Conv"; });
    if (!p || g.nodes[*p].act.kind != Activation::None) {
      batch_norm_as_conv(im, bn);
      continue;
    }
    fold_into_conv(im, g.nodes[*p], bn);
    g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i));
    --i;
  }
}

void fold_scales(Importer& im) {
  Graph& g = im.g;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& m = g.nodes[i];
    if ((m.op != "Mul" && m.op != "Div") || m.inputs.size() != 2) continue;
    const Value& f = g.value(m.inputs[1]);
    if (!f.data || f.elements() == 0) continue;
    auto p = sole_producer(g, i, [&](const Node& n) {
      return n.op == "Conv" && n.act.kind == Activation::None && g.value(n.inputs[1]).quantized;
    });
    if (!p) continue;
    Node& conv = g.nodes[*p];
    const auto& ys = g.value(conv.output).shape;
    const auto cout = static_cast<std::size_t>(ys[1]);
    // One factor, or one per channel: broadcast against [N, C, spatial...]
    // (right-aligned), C at the channel axis and 1 elsewhere ([C, 1, 1] or
    // [1, C, 1, 1] for a 2-D convolution, [C, 1, 1, 1] for a 3-D one).
    const std::size_t rank = ys.size(), k = f.shape.size();
    bool per_channel = f.elements() == cout && k + 1 >= rank && k <= rank;
    for (std::size_t d = 0; per_channel && d < k; ++d) per_channel = f.shape[d] == (d + rank - k == 1 ? ys[1] : 1);
    if (f.elements() != 1 && !per_channel) continue;
    if (g.value(m.output).shape != ys) continue;
    std::vector<double> s(cout);
    bool finite = true;
    for (std::size_t c = 0; c < cout; ++c) {
      const double v = (*f.data)[f.elements() == 1 ? 0 : c];
      s[c] = m.op == "Mul" ? v : 1.0 / v;
      finite = finite && std::isfinite(s[c]) && v != 0;
    }
    if (!finite) continue;
    rescale_conv(g, conv, s, {}, {}, m.name);
    conv.output = m.output;
    conv.fused += (conv.fused.empty() ? "" : ", ") + m.op + " '" + m.name + "'";
    g.notes.push_back("folded " + m.op + " '" + m.name + "' by a constant into Conv '" + conv.name + "'");
    g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i));
    --i;
  }
}

const std::string* residual_of(const Node& n) {
  return n.op == "Conv" && n.inputs.size() > 3 && !n.inputs[3].empty() ? &n.inputs[3] : nullptr;
}

namespace {

// Calls fuse(g, i) on each Add of two different values in a float model
// (an int8 model keeps its qlinear_add); fuse returns whether it replaced
// the Add with one node less before it, and the loop then looks at index i
// again.
template <class Fuse>
void fuse_adds(Importer& im, Fuse fuse) {
  if (im.options.precision == Precision::Int8) return;
  Graph& g = im.g;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& add = g.nodes[i];
    if (add.op != "Add" || add.inputs.size() != 2 || add.inputs[0] == add.inputs[1]) continue;
    if (fuse(g, i)) --i;
  }
}

// Whether constant `c` adds one value per column of a [..., N] product
// (shape [N], [1, ..., N] or one value): a Linear layer's bias.
bool column_bias(const Value& c, std::int64_t n) {
  if (!c.data || c.int8_type != 0 || c.quantized ||
      (c.elements() != 1 && c.elements() != static_cast<std::uint64_t>(n)))
    return false;
  return c.shape.empty() || c.shape.back() == n || c.elements() == 1;
}

}  // namespace

void fuse_residual_adds(Importer& im) {
  fuse_adds(im, [](Graph& g, std::size_t i) {
    const Node& add = g.nodes[i];
    // Of a 1x1 image a convolution is a matrix product (lower_as_matmul),
    // which does not accumulate: a squeeze-and-excitation block's stays.
    const auto& shape = g.value(add.output).shape;
    if (shape.size() != 4 || (shape[2] == 1 && shape[3] == 1)) return false;
    for (int side = 0; side < 2; ++side) {
      const std::string &x = add.inputs[side], &r = add.inputs[1 - side];
      const Value& rv = g.value(r);
      const auto c = producer(g, x);
      if (!c || *c > i || rv.data || rv.shape != shape || g.value(x).shape != shape || consumers(g, x) != 1) continue;
      Node& conv = g.nodes[*c];
      if (conv.op != "Conv" || !takes_activation(conv) || conv.inputs.size() > 3 ||
          g.value(conv.inputs[0]).shape.size() != 4)
        continue;
      Node fused = std::move(conv);
      fused.inputs.resize(4);  // no bias: ""
      fused.inputs[3] = r;
      fused.output = add.output;
      fused.fused += (fused.fused.empty() ? "" : ", ") + std::string("Add '") + add.name + "'";
      g.notes.push_back("fused Add '" + add.name + "' into Conv '" + fused.name + "' (it adds its result to " + r +
                        ")");
      g.nodes[i] = std::move(fused);  // the Add's place: every input is made by then
      g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(*c));
      return true;
    }
    return false;
  });
}

void fuse_matmul_bias(Importer& im) {
  fuse_adds(im, [](Graph& g, std::size_t i) {
    const Node& add = g.nodes[i];
    const auto& shape = g.value(add.output).shape;
    for (int side = 0; side < 2; ++side) {
      const std::string &x = add.inputs[side], &c = add.inputs[1 - side];
      const auto p = producer(g, x);
      if (!p || *p > i || shape.empty() || g.value(x).shape != shape || consumers(g, x) != 1 ||
          !column_bias(g.value(c), shape.back()))
        continue;
      Node& mm = g.nodes[*p];
      if (mm.op != "MatMul" || !takes_activation(mm) || mm.inputs.size() != 2) continue;
      mm.inputs.push_back(c);
      mm.output = add.output;
      mm.fused += (mm.fused.empty() ? "" : ", ") + std::string("Add '") + add.name + "'";
      g.notes.push_back("fused Add '" + add.name + "' into MatMul '" + mm.name + "' (its bias " + c + ")");
      g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i));
      return true;
    }
    return false;
  });
}

void fuse_activations(Importer& im) {
  Graph& g = im.g;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    Node& r = g.nodes[i];
    const OpHandler& h = *r.handler;
    if (!h.activation || h.fuse == Fuse::No) continue;
    if (h.fuse == Fuse::FloatOnly && im.options.precision == Precision::Int8) continue;
    auto p = sole_producer(g, i, [](const Node& n) { return n.handler->takes_activation; });
    if (!p || g.nodes[*p].act.kind != Activation::None) continue;
    Node& c = g.nodes[*p];
    c.act = h.activation(g, r);
    c.output = r.output;
    c.fused += (c.fused.empty() ? "" : ", ") + r.op + " '" + r.name + "'";
    g.notes.push_back("fused " + r.op + " '" + r.name + "' into " + c.op + " '" + c.name + "'");
    g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i));
    --i;
  }
}

void fuse_gated(Importer& im) {
  if (im.options.precision == Precision::Int8) return;
  Graph& g = im.g;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& m = g.nodes[i];
    if (m.op != "Mul" || m.inputs.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      const std::string& x = m.inputs[side];
      const auto s = producer(g, m.inputs[1 - side]);
      if (!s || (g.nodes[*s].op != "Sigmoid" && g.nodes[*s].op != "HardSigmoid") || g.nodes[*s].inputs[0] != x ||
          consumers(g, m.inputs[1 - side]) != 1 || consumers(g, x) != 2)
        continue;
      const auto c = producer(g, x);
      if (!c || !takes_activation(g.nodes[*c])) continue;
      Node& conv = g.nodes[*c];
      const Node& gate = g.nodes[*s];
      const bool hard = gate.op == "HardSigmoid";
      const ActivationParams sigmoid = gate.handler->activation(g, gate);
      conv.act = hard ? ActivationParams::hard_swish(sigmoid.alpha, sigmoid.beta) : ActivationParams::silu();
      conv.output = m.output;
      const std::string what =
          std::string(hard ? "HardSwish" : "SiLU") + " (" + gate.op + " '" + gate.name + "', Mul '" + m.name + "')";
      conv.fused += (conv.fused.empty() ? "" : ", ") + what;
      g.notes.push_back("fused " + what + " into " + conv.op + " '" + conv.name + "'");
      const std::size_t hi = std::max(i, *s), lo = std::min(i, *s);
      g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(hi));
      g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(lo));
      i = lo == 0 ? static_cast<std::size_t>(-1) : lo - 1;
      break;
    }
  }
}

std::map<std::string, Placement> plan_concats(const Graph& g, DType act) {
  std::map<std::string, Placement> placements;
  std::map<std::string, std::size_t> uses;
  for (const auto& n : g.nodes)
    for (const auto& x : n.inputs) ++uses[x];
  for (const auto& o : g.outputs) uses[o.second] += 2;
  std::map<std::string, const Node*> producer;
  for (const auto& n : g.nodes) producer[n.output] = &n;
  for (const auto& n : g.nodes) {
    if (n.op != "Concat") continue;
    const auto& shape = g.value(n.output).shape;
    const auto axis = n.attr<ConcatAttrs>().resolved;
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
      if (p == producer.end() || uses[in] != 1 || !seen.insert(in).second || !p->second->handler->writes_fresh)
        continue;
      placements[in] = {n.output, offset};
    }
  }
  return placements;
}

}  // namespace tpuhal::rt::detail
