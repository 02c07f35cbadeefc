// Gemm (constant B) and MatMul (batched, broadcasting): matmul with the
// activation fused into it; in int8, by a constant 2-D B, a 1x1
// qlinear_conv.
#include <algorithm>
#include <optional>

#include "onnx/importer.hpp"
#include "onnx/lowerer.hpp"

namespace tpuhal::rt::detail {
namespace {

struct GemmAttrs {
  bool gemm = false;  // Gemm; MatMul has none of the others
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 1.0f;
  static GemmAttrs read(const Attrs& a) {
    return {true, a.i("transA", 0) != 0, a.i("transB", 0) != 0, a.f("alpha", 1.0f), a.f("beta", 1.0f)};
  }
};

std::any read_matmul(const Attrs&) { return GemmAttrs{}; }

Value infer_gemm(Importer& im, Node& n) {
  const auto& a = n.attr<GemmAttrs>();
  const auto& x = im.in(n, 0).shape;
  const auto& b = im.constant(n, 1, "weights (B)").shape;
  if (x.size() != 2 || b.size() != 2) im.fail_node(n, "A " + dims_text(x) + " and B " + dims_text(b) + " must be 2-D");
  const std::int64_t m = a.trans_a ? x[1] : x[0], k = a.trans_a ? x[0] : x[1];
  const std::int64_t kb = a.trans_b ? b[1] : b[0], nn = a.trans_b ? b[0] : b[1];
  if (k != kb) im.fail_node(n, "A " + dims_text(x) + " and B " + dims_text(b) + " do not multiply");
  if (im.has(n, 2)) im.broadcast(n, {m, nn}, im.constant(n, 2, "bias (C)").shape);
  Value out;
  out.shape = {m, nn};
  return out;
}

Value infer_matmul(Importer& im, Node& n) {
  const auto& x = im.in(n, 0).shape;
  const auto& b = im.in(n, 1).shape;
  if (x.size() < 2 || b.size() < 2) im.unsupported(n, "1-D operands");
  if (x.back() != b[b.size() - 2]) im.fail_node(n, "A " + dims_text(x) + " and B " + dims_text(b) + " do not multiply");
  auto batch = im.broadcast(n, std::vector<std::int64_t>(x.begin(), x.end() - 2),
                            std::vector<std::int64_t>(b.begin(), b.end() - 2));
  batch.push_back(x[x.size() - 2]);
  batch.push_back(b.back());
  Value out;
  out.shape = batch;
  return out;
}

// A constant's values as floats (integers converted).
std::vector<float> floats_of(const Value& v) {
  if (v.ints.empty()) return *v.data;
  return std::vector<float>(v.ints.begin(), v.ints.end());
}

// Gemm of constants (in the host stage, A the program's): alpha times each
// dot product, summed in double and rounded once, plus beta times C.
Value fold_gemm(Importer& im, Node& n) {
  Value out = infer_gemm(im, n);
  im.check_folded(n, out.shape);
  const auto& a = n.attr<GemmAttrs>();
  const Value& av = im.in(n, 0);
  const std::int64_t m = out.shape[0], nn = out.shape[1];
  const std::int64_t k = a.trans_a ? av.shape[0] : av.shape[1];
  const std::vector<float> x = floats_of(av), w = floats_of(im.in(n, 1));
  std::vector<double> y(static_cast<std::size_t>(m * nn)), row(static_cast<std::size_t>(nn));
  for (std::int64_t i = 0; i < m; ++i) {
    const auto xa = [&](std::int64_t j) {
      return static_cast<double>(x[static_cast<std::size_t>(a.trans_a ? j * m + i : i * k + j)]);
    };
    if (a.trans_b) {  // B [N, K]: each output a dot product of two rows
      for (std::int64_t j = 0; j < nn; ++j) {
        double acc = 0;
        const float* b = w.data() + j * k;
        for (std::int64_t t = 0; t < k; ++t) acc += xa(t) * static_cast<double>(b[t]);
        row[static_cast<std::size_t>(j)] = acc;
      }
    } else {
      std::fill(row.begin(), row.end(), 0.0);
      for (std::int64_t t = 0; t < k; ++t) {
        const double v = xa(t);
        const float* b = w.data() + t * nn;
        for (std::int64_t j = 0; j < nn; ++j) row[static_cast<std::size_t>(j)] += v * static_cast<double>(b[j]);
      }
    }
    for (std::int64_t j = 0; j < nn; ++j)
      y[static_cast<std::size_t>(i * nn + j)] = a.alpha * row[static_cast<std::size_t>(j)];
  }
  if (im.has(n, 2)) {
    const Value& c = im.in(n, 2);
    for (std::uint64_t f = 0; f < y.size(); ++f)
      y[f] = static_cast<float>(static_cast<float>(y[f]) +
                                a.beta * static_cast<float>(value_at(c, broadcast_index(out.shape, c.shape, f))));
  }
  return make_constant(out.shape, y, false);
}

// Gemm / MatMul by a constant in int8, as a 1x1 convolution; false if it
// cannot be (transA, or a bias that is not one per output).
bool gemm_int8(Lowerer& l, const Node& n) {
  const auto& a = n.attr<GemmAttrs>();
  const auto& x = l.g.value(n.inputs[0]);
  const Value& b = l.g.value(n.inputs[1]);
  if (!b.data || x.shape.size() != 2 || b.shape.size() != 2) return false;
  if (a.trans_a) return false;
  const bool tb = a.trans_b;
  const std::int64_t m = x.shape[0], k = x.shape[1], nn = tb ? b.shape[0] : b.shape[1];
  std::vector<float> bias;
  if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
    const Value& c = l.g.value(n.inputs[2]);
    const bool per_out = c.elements() == 1 || (c.elements() == static_cast<std::uint64_t>(nn) && c.shape.back() == nn);
    if (!per_out) return false;
    bias.resize(static_cast<std::size_t>(nn));
    for (std::int64_t j = 0; j < nn; ++j)
      bias[static_cast<std::size_t>(j)] = a.beta * (*c.data)[c.elements() == 1 ? 0 : static_cast<std::size_t>(j)];
  }
  std::vector<float> w(static_cast<std::size_t>(nn * k));
  for (std::int64_t o = 0; o < nn; ++o)
    for (std::int64_t i = 0; i < k; ++i)
      w[static_cast<std::size_t>(o * k + i)] =
          a.alpha * (*b.data)[static_cast<std::size_t>(tb ? o * k + i : i * nn + o)];
  // A Q/DQ model's weights as [nn, k] integers: per tensor, or per output
  // (axis 0 of B transposed, else axis 1).
  std::optional<QuantizedConstant> wq;
  if (const QuantizedConstant* bq = b.quantized.get();
      bq && a.alpha == 1.0f && (bq->scales.size() == 1 || bq->axis == (tb ? 0 : 1))) {
    wq.emplace();
    wq->scales = bq->scales;
    wq->q.resize(w.size());
    for (std::int64_t o = 0; o < nn; ++o)
      for (std::int64_t i = 0; i < k; ++i)
        wq->q[static_cast<std::size_t>(o * k + i)] = bq->q[static_cast<std::size_t>(tb ? o * k + i : i * nn + o)];
  }
  const QuantizedConstant* wp = wq ? &*wq : nullptr;
  if (!l.qdq_int8(n, n.inputs[0], wp) || !l.int8_bias_fits(n, n.inputs[0], w, static_cast<std::size_t>(nn), bias, wp))
    return false;
  const auto xu = l.get(n.inputs[0], DType::U8);
  const auto xv = l.dg().add_view(xu, {m, 1, 1, k});  // NHWC with H = W = 1: the same bytes as [m, k]
  ops::Conv2dOptions o;
  o.layout = Layout::NHWC;
  l.qconv(n, xv, n.inputs[0], w, {nn, k, 1, 1}, bias, o, {m, nn}, {m, 1, 1, nn}, wp);
  return true;
}

// A constant B given transposed ([N, K], a Linear layer's weights) as the
// [K, N] it stands for: the device then reads B's rows whole, where it
// would gather each column of K from N rows (a network's last layer at
// batch 1 took ten times ONNX Runtime's time). The products and their
// order are the same. -1 where B is not such a constant.
std::int64_t transposed_weights(Lowerer& l, const Node& n, const GemmAttrs& a, DType t) {
  const Value& b = l.g.value(n.inputs[1]);
  if (!a.trans_b || !b.data || b.shape.size() != 2) return -1;
  return l.add_weight_transposed(*b.data, b.shape[0], b.shape[1], t);
}

void lower_matmul(Lowerer& l, const Node& n) {
  if (l.int8() && gemm_int8(l, n)) return;
  const auto& a = n.attr<GemmAttrs>();
  const DType t = l.float_type();
  const std::int64_t bt = transposed_weights(l, n, a, t);
  std::map<std::string, std::int64_t> operands{{"a", l.get(n.inputs[0], t)},
                                               {"b", bt >= 0 ? bt : l.get(n.inputs[1], t)}};
  const nlohmann::json at = {{"transpose_a", a.trans_a},
                             {"transpose_b", a.trans_b && bt < 0},
                             {"alpha", a.alpha},
                             {"beta", a.beta},
                             {"activation", act_json(n.act)}};
  // Gemm's C, or a MatMul's bias (fuse_matmul_bias).
  if (n.inputs.size() > 2 && !n.inputs[2].empty()) operands["c"] = l.get(n.inputs[2], DType::F32);
  operands["y"] = l.produce(n.output, t, l.shape_of(n.output));
  l.op("matmul", n.name, operands, at);
}

}  // namespace

std::span<const OpHandler> matmul_handlers() {
  static const OpHandler h[] = {
      {.ops = {"Gemm"},
       .read = read_attrs<GemmAttrs>,
       .infer = infer_gemm,
       .fold = fold_gemm,
       .folds = Fold::IfConstant,
       .lower = lower_matmul,
       .writes_fresh = true,
       .takes_activation = true,
       .int8_layer = true},
      {.ops = {"MatMul"},
       .read = read_matmul,
       .infer = infer_matmul,
       .lower = lower_matmul,
       .writes_fresh = true,
       .takes_activation = true,
       .int8_layer = true},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
