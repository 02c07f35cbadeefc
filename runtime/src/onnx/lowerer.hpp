// The compiler's graph onto tpuhal ops in one precision: how each ONNX value
// is held on the device, converted where an op needs it in another type or
// layout (lowerer.cpp), and what the op handlers' lowerings (handler.hpp)
// use to make tensors and ops. fp32, fp16, bf16: every activation in that
// type, weights converted, biases f32, the f32 input cast on the device
// first and the outputs cast back last. int8: Conv, Gemm and MatMul by a
// constant as qlinear_conv over u8 activations (4-D ones NHWC) and
// per-output-channel i8 weights, MaxPool and reshapes on u8 as they are,
// an Add of two u8 NHWC values as qlinear_add (with a Relu after it), an
// activation of one as a table lookup (gather by its bytes), Slice, Split,
// Concat and whole-factor nearest Resize of them as copies of bytes (a
// Concat's inputs requantized by table where their ranges differ),
// everything else in f32 between a dequantize and a quantize; element-wise
// ops between NHWC values stay NHWC, in f32 (docs/runtime.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ir.hpp"
#include "onnx/passes.hpp"

namespace tpuhal::rt::detail {

nlohmann::json act_json(const ActivationParams& a);
nlohmann::json conv_attrs(const ops::Conv2dOptions& o);
std::vector<std::int64_t> to_nhwc(const std::vector<std::int64_t>& s);
// Whether NCHW `s` and its NHWC form hold the same bytes: one channel, or
// H = W = 1 (a squeeze-and-excitation gate, a global pool's output).
bool nhwc_is_nchw(const std::vector<std::int64_t>& s);
// The NHWC dimension of NCHW dimension `d`.
inline std::size_t nhwc_dim(std::size_t d) {
  static constexpr std::size_t kTo[] = {0, 3, 1, 2};
  return kTo[d];
}

// How a value is held. by_dtype: tensors in the value's own (ONNX, NCHW)
// shape. In int8, 4-D u8 activations live NHWC (`nhwc`), where the
// engine's integer convolution and pooling are fast; the NCHW forms are
// made from it only where something needs them. An element-wise op whose
// activation inputs are all held NHWC with its output's shape runs on f32
// NHWC tensors (`nhwc_float`): the same bits as in NCHW, element by element,
// without the transposes.
struct Rep {
  std::map<DType, std::int64_t> by_dtype;
  DType primary = DType::F32;
  std::int64_t nhwc = -1;        // the u8 NHWC tensor, if any
  std::int64_t nhwc_float = -1;  // the f32 NHWC tensor, if any
  bool primary_nhwc = false;     // produced NHWC: as `nhwc` (primary u8) or `nhwc_float` (primary f32)
  QParams q;
  std::int64_t q_scale = -1, q_zero = -1;  // weights tensors holding q
  bool boolean = false;                    // u8 1 or 0 (a comparison's or logic's result), never quantised
  std::int64_t primary_tensor() const {
    return !primary_nhwc ? by_dtype.at(primary) : primary == DType::U8 ? nhwc : nhwc_float;
  }
};

// A 4-D value held u8 NHWC (not a boolean).
bool held_u8_nhwc(const std::map<std::string, Rep>& reps, const std::string& v);

struct Lowerer {
  Lowerer(const Graph& graph, Precision to, const std::map<std::string, Range>* calibrated,
          const std::set<std::string>& fp16_nodes)
      : g(graph), precision(to), ranges(calibrated), keep_fp16(fp16_nodes) {}

  const Graph& g;
  Precision precision;
  const std::map<std::string, Range>* ranges;
  const std::set<std::string>& keep_fp16;  // int8: nodes that run in fp16
  DType act = DType::F32;                  // the activation type of float ops
  Lowered out;
  std::map<std::string, Rep> reps;
  std::map<std::pair<std::string, DType>, std::int64_t> const_cache;
  std::map<std::string, Placement> placements;  // plan_concats
  std::map<std::string, QParams> fixed_q;       // int8 of a Q/DQ model: qdq_params
  std::set<std::string> placed;                 // values produced in their part of their Concat's output

  DeviceGraph& dg() { return out.graph; }
  // A 1-D op runs as the 2-D one with H = 1: each operand of shape [A, B, L]
  // (the name of its device value, and its shape) becomes a view [A, B, 1, L].
  void as_2d(std::map<std::string, std::int64_t>& operands,
             std::initializer_list<std::pair<const char*, const std::vector<std::int64_t>*>> shapes) {
    for (const auto& [name, s] : shapes)
      operands[name] = dg().add_view(operands.at(name), {(*s)[0], (*s)[1], 1, (*s)[2]});
  }
  bool int8() const { return precision == Precision::Int8; }
  // An fp32 model: 2-D convolutions run NHWC (oneDNN's direct kernels; in
  // NCHW it has only a GEMM-based one, with an im2col per layer), and so do
  // the pooling and element-wise ops between them (nhwc_island); a value
  // held NHWC is transposed to NCHW only where an op needs that.
  bool float_nhwc = false;
  bool nchw_only = false;  // an fp32 model without float_nhwc (lower()'s `nchw`)
  // The type of float values held NHWC (nhwc_float): an fp16 or bf16
  // model's own, else f32 (an int8 model's dequantized activations).
  DType nhwc_type = DType::F32;
  // The type of float ops: the activation type, f32 in an int8 model.
  DType float_type() const { return int8() ? DType::F32 : act; }
  // The type an op computes value v in: i32 where the model holds it as
  // integers (positions, indices), else the model's float type.
  DType held_type(const std::string& v) const {
    const auto it = reps.find(v);
    return it != reps.end() && it->second.primary == DType::I32 ? DType::I32 : float_type();
  }
  const std::vector<std::int64_t>& shape_of(const std::string& v) const { return g.value(v).shape; }

  // Weights: raw bytes, floats converted to `t`, scalars.
  std::int64_t add_raw(DType t, std::vector<std::int64_t> shape, const void* data, std::size_t bytes);
  std::int64_t add_weight(const std::vector<float>& v, DType t, std::vector<std::int64_t> shape);
  // The row-major [rows, cols] matrix `m` stored as its transpose, [cols,
  // rows], in `t` (weights the device then reads row by row in place).
  std::int64_t add_weight_transposed(const std::vector<float>& m, std::int64_t rows, std::int64_t cols, DType t);
  std::int64_t add_i32(const std::string& name, const Value& val);
  std::int64_t scalar_f32(float v) { return add_raw(DType::F32, {}, &v, 4); }
  std::int64_t scalar_u8(std::int32_t v);

  // Appends an op; returns its index.
  std::int64_t op(std::string kind, const std::string& node, std::map<std::string, std::int64_t> operands,
                  nlohmann::json attrs = nlohmann::json::object());

  QParams range_q(const std::string& v) const;
  // A new arena tensor that holds value `v` in `t` (its primary form); for
  // a value placed in a Concat, that part of the Concat's output.
  std::int64_t produce(const std::string& v, DType t, const std::vector<std::int64_t>& shape);
  // A new arena tensor that holds boolean value `v` as u8 1 or 0.
  std::int64_t produce_bool(const std::string& v, const std::vector<std::int64_t>& shape);
  // A new u8 NHWC arena tensor holding 4-D value `v` (`shape` NCHW) in `q`.
  std::int64_t produce_nhwc(const std::string& v, const std::vector<std::int64_t>& shape, const QParams& q);
  // Boolean value `v` (a constant, or a comparison's or logic's result) as
  // u8 1 or 0.
  std::int64_t get_bool(const Node& n, const std::string& v);
  // Tensor `id` (dtype `t`, value shape `shape`) dense in row-major order:
  // a strided view (a part of a Concat's output) is copied.
  std::int64_t dense(std::int64_t id, DType t, const std::vector<std::int64_t>& shape);
  // Value `v` in a view of another shape: same bytes, same quantisation.
  void alias(const std::string& v, const std::string& of, const std::vector<std::int64_t>& shape);
  // Value `v` as a tensor of type `t`, converting on the device if needed.
  std::int64_t get(const std::string& v, DType t);
  // 4-D value `v` as a u8 NHWC tensor.
  std::int64_t get_nhwc(const std::string& v);
  // Value `v` in its primary type and NCHW, made from its NHWC form if
  // that is all there is.
  std::int64_t get_nchw(const std::string& v);
  // Whether element-wise node `n` runs NHWC in f32. int8: every one of
  // `xs` an activation held NHWC with the output's (4-D) shape, or, with
  // `gates`, at least one so and the others activations of shape [N, C,
  // 1, 1] (a squeeze-and-excitation gate: the same bytes in both layouts,
  // broadcast over H and W). float_nhwc: a 4-D output and at least one of
  // `xs` held NHWC with its shape; the others 4-D activations (a [N, C, 1,
  // 1] one is the same bytes in both layouts) or constants (permuted when
  // the model is compiled).
  bool nhwc_island(const Node& n, const std::vector<std::string>& xs, bool gates = false) const;
  // int8: whether 4-D activation `v` is held in the form it was produced
  // in, NHWC (u8, or f32 from an NHWC island), so that an op reading it
  // NHWC needs no transpose.
  bool held_nhwc(const std::string& v) const;
  // 4-D value `v` as an f32 NHWC tensor: dequantized once from its u8 NHWC
  // form, or (float_nhwc) transposed once from its NCHW form; a constant
  // of rank 4 or less, as the NHWC form of its 4-D broadcast shape.
  std::int64_t get_nhwc_float(const std::string& v);
  // A new f32 NHWC arena tensor holding 4-D value `v` (`shape` NCHW).
  std::int64_t produce_nhwc_float(const std::string& v, const std::vector<std::int64_t>& shape);
  // The tensor a convolution producing `v` (of `shape`, NCHW; NHWC where
  // `nhwc`) accumulates into, holding `residual` already
  // (onnx/passes.hpp's fuse_residual_adds): `residual`'s own tensor where
  // nothing reads it (or a value sharing its bytes) from node `at` on but
  // as that node's residual, and its bytes are no input's, which then
  // holds `v` (Lowered::overwritten names every value in those bytes);
  // else a new one the residual is copied into first.
  std::int64_t accumulator(const std::string& v, const std::string& residual, const std::vector<std::int64_t>& shape,
                           bool nhwc, std::size_t at);
  // float_nhwc: whether 4-D value `v` was produced f32 NHWC.
  bool held_float_nhwc(const std::string& v) const;
  void ensure_q_tensors(Rep& r);

  // int8 layers (int8.cpp): whether their bias fits, and the layer itself.
  // `wq`: the weights' own integers and scales (a Q/DQ model), else null:
  // symmetric per-channel ones made from `w`.
  bool int8_bias_fits(const Node& n, const std::string& x, const std::vector<float>& w, std::size_t cout,
                      const std::vector<float>& bias, const QuantizedConstant* wq = nullptr);
  void qconv(const Node& n, std::int64_t xv, const std::string& x, const std::vector<float>& w,
             std::vector<std::int64_t> wshape, const std::vector<float>& bias, const ops::Conv2dOptions& o,
             const std::vector<std::int64_t>& yshape, const std::vector<std::int64_t>& yview,
             const QuantizedConstant* wq = nullptr);
  // In a Q/DQ model, whether layer `n` (reading `x`) runs in int8 with the
  // model's parameters: its input and output quantized by pairs
  // (fixed_q), its weights `wq` a DequantizeLinear's integers that fit int8.
  // Where not, it runs in fp32 and the reason is kept (Lowered::qdq_float).
  // Always true in a calibrated model.
  bool qdq_int8(const Node& n, const std::string& x, const QuantizedConstant* wq);
  // A layer of an int8 Q/DQ model that runs in float whatever its pairs
  // say (a 1-D convolution): kept with the reason, as qdq_int8 keeps it.
  void qdq_float(const Node& n, const char* why);

  // int8: Add `n` of two activations held u8 NHWC as qlinear_add into u8
  // NHWC, with the Relu after it (its only consumer) applied by the Relu's
  // range; false (nothing emitted) where it does not apply (int8.cpp).
  bool qadd(const Node& n);
  // int8: Mul `n` of two activations held u8 NHWC, or of one and a gate
  // [n, c, 1, 1] (an SE block's), as qlinear_mul into u8 NHWC quantized to
  // the product's range; false (nothing emitted) where it does not apply.
  bool qmul(const Node& n);
  // int8: GlobalAveragePool `n` (or a ReduceMean over H and W: reduce.cpp)
  // of an activation held u8 NHWC, not a model output, as
  // qlinear_global_avg_pool into u8 (NHWC where 4-D) in its calibrated
  // range (the bits of dequantize, the f32 pool and the quantize an int8
  // layer reading it would do); false (nothing emitted) where it does not
  // apply.
  bool qavgpool(const Node& n);
  // qadd's and qmul's op `kind` of n's two inputs (held u8 NHWC) into
  // `result` (n's output, or the Relu's after it), u8 NHWC in its
  // calibrated range.
  void qbinary(const char* kind, const Node& n, const std::string& result);
  // int8: activation `p` of node `n` over a value held u8 NHWC as a table
  // lookup (gather by byte indices) into u8 NHWC: each of the 256 levels
  // dequantized, activated in double and quantized to the output's range.
  // A Sigmoid or HardSigmoid whose only consumer multiplies it by its input
  // is the SiLU or HardSwish the two make. False (nothing emitted) where it does not apply.
  bool qtable(const Node& n, const ActivationParams& p);
  // A 256-entry u8 table of each level of `in` dequantized, activated by
  // `f` and quantized to `to` (int8.cpp).
  std::int64_t level_table(const QParams& in, const QParams& to, const ActivationParams& f);
  // int8: Slice `n` (lo and step per NCHW dimension) of a 4-D value held
  // u8 NHWC, copied into u8 NHWC with the input's quantisation (the same
  // bytes); fp32 (float_nhwc): of one held f32 NHWC, into f32 NHWC. False
  // (nothing emitted) where it does not apply.
  bool qslice(const Node& n, const std::vector<std::int64_t>& lo, const std::vector<std::int64_t>& step);
  // int8: Concat `n` (along NCHW axis `axis`) of 4-D values held u8 NHWC
  // into u8 NHWC at the output's range: each input copied into its part,
  // through a 256-entry table where its quantisation differs (each level
  // dequantized and quantized again, the bits of doing so in f32). False
  // (nothing emitted) where it does not apply.
  bool qconcat(const Node& n, std::int64_t axis);
  // int8: a nearest Resize `n` that repeats each element `fh` times along H
  // and `fw` times along W, of a value held u8 NHWC: fh * fw strided copies
  // into u8 NHWC with the input's quantisation; fp32 (float_nhwc): of one
  // held f32 NHWC, into f32 NHWC. False where it does not apply.
  bool qrepeat(const Node& n, std::int64_t fh, std::int64_t fw);
  // The node that is the only consumer of value `v` (not a graph output), or null.
  const Node* sole_consumer(const std::string& v) const;
  // x * Sigmoid(x) where that SiLU is all that reads value `x` (not a
  // graph output): its two nodes, or nulls.
  struct Silu {
    const Node* sigmoid = nullptr;
    const Node* mul = nullptr;
  };
  Silu silu_of(const std::string& x) const;
  // Whether value `v` has int8 parameters: a Q/DQ pair's or a calibrated range.
  bool has_q(const std::string& v) const { return fixed_q.count(v) || (ranges && ranges->count(v)); }
  std::set<std::string> fused_into_producer;  // nodes qadd lowered with their producer

  void lower_node(const Node& n);
  void run();

 private:
  std::int64_t from_nhwc(Rep& r, const std::string& v, DType t);
  std::int64_t convert(Rep& r, const std::string& v, DType t);
  void lower_outputs();
  void describe_values();
};

}  // namespace tpuhal::rt::detail
