// The compiler's passes over the imported graph, each a note per change in
// Graph::notes (docs/runtime.md): BatchNormalization folded into the Conv
// before it (or made a depthwise Conv), activations fused into the Conv,
// Gemm or MatMul before them, SiLU and HardSwish as PyTorch writes them
// fused likewise; and, for the lowering, the Concat inputs written in place.
// What they know of ops comes from the handlers (handler.hpp): which ops
// take an activation, which are activations, which write a fresh tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "ir.hpp"

namespace tpuhal::rt::detail {

struct Importer;

// Q/DQ (quantize.cpp): every QuantizeLinear left after the pairs were made
// must have had DequantizeLinear readers only; it is then removed (the
// pairs read what it quantized). Else the model is refused, naming the
// reader.
void finish_qdq(Importer& im);
// Whether `n` is a QuantizeLinear + DequantizeLinear pair.
bool is_qdq_pair(const Node& n);
// int8 of a Q/DQ model: the u8 parameters the pairs give values: each
// pair's output, and the value it quantizes where all of that value's
// readers are pairs of the same parameters. Per-tensor pairs only.
std::map<std::string, QParams> qdq_params(const Graph& g);

// A Mul or Div by a constant that is the only reader of the output of a
// Conv whose weights a DequantizeLinear made, one factor per output channel
// (or one for all), folds into the Conv's weights and bias, the weights'
// integers kept: quantization-aware training's exports divide each
// convolution by its BatchNormalization's scale.
void fold_scales(Importer& im);

// Each BatchNormalization that is the only reader of a Conv's output (one
// with no activation yet) folds into it: weights and bias rescaled. One on
// another 4-D value becomes a depthwise 1x1 Conv (weight gamma / sqrt(var +
// eps) per channel, bias beta - mean * weight): one pass instead of a
// multiply and an add, and a Relu after it fuses.
void fold_batch_norm(Importer& im);

// A residual connection's Add of a 2-D Conv's output and another value of
// the same 4-D shape (not a 1x1 image: a convolution of one is lowered as
// a matrix product), where the Conv has no activation yet and the Add
// alone reads its output, becomes that Conv accumulating into the other
// value (its fourth input, Conv2dOptions::accumulate), at the Add's place
// in the graph: the Relu after it then fuses as its activation. Float
// models only (int8 has qlinear_add).
void fuse_residual_adds(Importer& im);
// An Add of a MatMul's output and a constant of one value per column (a
// Linear layer's bias, [N] against [..., N]), where the Add alone reads the
// MatMul's output, becomes the MatMul's C (y = A @ B + C, each element the
// product rounded to f32, then C added and rounded: an f32 model's bits
// unchanged; an fp16 or bf16 one rounds once where it rounded twice), so
// that an activation after the Add fuses too. Float models only.
void fuse_matmul_bias(Importer& im);
// A Conv's residual (the value a fused Add added to it), or null.
const std::string* residual_of(const Node& n);

// An activation whose handler says it fuses, after a Conv, Gemm or MatMul
// whose output nothing else reads, becomes that layer's activation. In int8
// only Relu and Clip do: convolutions apply them by their output's range.
void fuse_activations(Importer& im);

// SiLU and HardSwish as PyTorch writes them at opset 13, Mul(x, Sigmoid(x))
// and Mul(x, HardSigmoid(x)), after a Conv, Gemm or MatMul whose output
// nothing else reads: the Silu or HardSwish activation of that node (not
// in int8, where activations other than Relu and Clip are layers of their
// own).
void fuse_gated(Importer& im);

// CompileOptions::detect: the model's one output ends in a Detect node (a
// YOLO head's boxes and scores through NMS, onnx/detect.cpp), whose
// output is the graph's; refuses heads and options it cannot take.
void add_detect(Importer& im);

// Where a value is written straight into its Concat's output: the Concat's
// output value and the byte offset of the value's part.
// How many times value `v` is used: as a node's input (once per input
// slot) or as a graph output.
std::size_t consumers(const Graph& g, const std::string& v);

struct Placement {
  std::string concat;
  std::uint64_t offset = 0;
};
// Chooses which Concat inputs are produced straight into the Concat's
// output (for float activations of type `act`): a value the Concat alone
// uses, made by a node that writes a fresh tensor, where the Concat's parts
// are contiguous (nothing but ones before the axis).
std::map<std::string, Placement> plan_concats(const Graph& g, DType act);

}  // namespace tpuhal::rt::detail
