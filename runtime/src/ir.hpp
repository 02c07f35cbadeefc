// The compiler's graph: ONNX nodes with every shape known, constants
// folded, and BatchNormalization and activations fused where they can be
// (the ONNX front end, onnx/: a handler per op family and the passes),
// ready to be lowered onto tpuhal ops in one precision (onnx/lowerer.hpp).
#pragma once

#include <any>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "device_graph.hpp"
#include "tpuhal/ops.hpp"
#include "tpuhal/rt/compile.hpp"

namespace onnx {
class ModelProto;
}

namespace tpuhal::rt::detail {

// The number of elements of a tensor of `shape`.
inline std::uint64_t elements_of(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

// A constant that a DequantizeLinear made of 8-bit integers (Q/DQ
// weights): those integers less their zero point, and the scale of each
// slice along `axis` (one scale: per tensor). The constant's data is
// exactly (q - zero point) * scale; an int8 layer uses q and the scales
// themselves, not a requantisation of the floats.
struct QuantizedConstant {
  std::vector<std::int32_t> q;
  std::vector<float> scales;
  std::int64_t axis = 0;
};

struct Value {
  std::vector<std::int64_t> shape;
  std::optional<std::vector<float>> data;  // a constant (initializer, Constant node, folded)
  std::vector<std::int64_t> ints;          // an int64 constant's values (Reshape shapes)
  // An 8-bit constant's ONNX element type (INT8, UINT8), or a value that a
  // QuantizeLinear makes; 0 for every other value.
  int int8_type = 0;
  // The ONNX element type of a model input or of a constant read from the
  // model (an initializer, a Constant node); 0 for values the compiler
  // computes (CastLike reads it).
  int onnx_type = 0;
  std::shared_ptr<const QuantizedConstant> quantized;  // see QuantizedConstant
  std::uint64_t elements() const { return elements_of(shape); }
};

struct OpHandler;  // onnx/handler.hpp

struct Node {
  std::string name;                    // the ONNX node name (or "op_type #index" if it has none)
  std::string op;                      // ONNX op type (as reports and notes name it)
  const OpHandler* handler = nullptr;  // what imports and lowers it (onnx/handler.hpp)
  std::vector<std::string> inputs;     // value names; "" for an omitted optional input
  std::string output;                  // the one output used
  std::string output2;                 // TopK's second output (indices), or empty
  // Its handler's typed attributes: read from the ONNX node once, and
  // completed by its shape rule with what it resolved from constant inputs
  // (a Slice's starts and steps, a Pad's pads, a Resize's scales, ...).
  std::any attrs;
  ActivationParams act;  // fused Relu / Clip (Conv, Gemm, MatMul)
  std::string fused;     // what was fused into it, for the report ("Relu 'r1'")

  template <typename A>
  A& attr() {
    return std::any_cast<A&>(attrs);
  }
  template <typename A>
  const A& attr() const {
    return std::any_cast<const A&>(attrs);
  }
};

struct Graph {
  std::map<std::string, Value> values;
  std::vector<Node> nodes;
  std::vector<std::string> inputs;                           // graph inputs (not constants)
  std::set<std::string> integer_inputs;                      // ONNX int32 and int64 inputs: i32 on host and device
  std::vector<std::pair<std::string, std::string>> outputs;  // ONNX output name, value holding it
  int opset = 0;
  bool qdq = false;  // the model quantises with QuantizeLinear / DequantizeLinear (explicit int8)
  // Layers of the compiler's own that an int8 model runs in fp16, as if
  // --keep-fp16 named them: YOLOv5's box decoding (onnx/detect.cpp), whose
  // pixel coordinates one int8 scale would step by pixels.
  std::set<std::string> fp16_in_int8;
  std::vector<std::string> notes;
  // The host stage (onnx/host_stage.cpp, docs/runtime.md): the nodes from
  // the first whose output's shape depends on the device's data (NonZero,
  // NonMaxSuppression, an If on a computed condition) on, which the runtime
  // evaluates on the host after the program, as an ONNX model whose inputs
  // are the program's outputs (`outputs`) and whose outputs are the
  // model's. Null where the program computes the model's outputs.
  std::shared_ptr<const onnx::ModelProto> host_stage;
  const Value& value(const std::string& name) const;
};

// Parses, checks and simplifies an ONNX model (compile.hpp's errors).
// External data files are read relative to `external_dir`; empty: a model
// with external data is refused. `batch` above 0: every input's first
// dimension is that (CompileOptions::max_batch), and must be symbolic in
// the model.
Graph import_onnx(std::span<const std::byte> bytes, const CompileOptions& options, std::string_view name,
                  const std::filesystem::path& external_dir, std::int64_t batch = 0);

// A calibrated range of one value.
struct Range {
  float lo = 0, hi = 0;
};
// u8 asymmetric parameters for a range widened to hold 0.
struct QParams {
  float scale = 1;
  std::int32_t zero_point = 0;
};
QParams qparams(const Range& r);

// Row-major strides, in elements, of a tensor of `shape`.
inline std::vector<std::int64_t> row_major_strides(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> st(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;) st[i - 1] = st[i] * shape[i];
  return st;
}

// How the lowered graph holds an ONNX value (its primary tensor).
struct ValueInfo {
  std::int64_t tensor = -1;
  DType dtype = DType::F32;
  QParams q;          // for u8
  bool nhwc = false;  // held as [N, H, W, C]
};

struct Lowered {
  DeviceGraph graph;
  std::vector<std::byte> weights;
  std::map<std::string, ValueInfo> values;
  nlohmann::json quant = nlohmann::json::object();  // the Quant section (int8)
  // int8: Conv and Gemm layers left in fp32 because their bias, in units
  // of the input scale times the weight scale, would not fit int32.
  std::vector<std::string> fp32_for_bias;
  // int8 of a Q/DQ model: the layers that run in int8 with the model's
  // scales, and those that run in fp32 with why ("its output is not
  // quantized by the model").
  std::vector<std::string> qdq_int8;
  std::vector<std::pair<std::string, std::string>> qdq_float;
  // Values whose bytes a convolution later accumulated into (a residual
  // Add, fused; the residual and its views): by the end of a run they hold
  // that convolution's output.
  std::set<std::string> overwritten;
};

// Lowers onto tpuhal ops. Int8 needs `ranges` for every value; the nodes
// named in `keep_fp16` then run in fp16, or in fp32 where fp16 cannot hold
// their calibrated values (fp16_holds). `nchw`: an fp32 model whose
// convolutions run NCHW (the reference an int8 model is calibrated on,
// whose ranges, and so whose int8 bits, stay as they were), else NHWC.
Lowered lower(const Graph& g, Precision precision, const std::map<std::string, Range>* ranges,
              const std::set<std::string>& keep_fp16 = {}, bool nchw = false);

// Whether fp16 holds node `n`'s first input and its output as calibrated:
// each one's largest magnitude within [2^-6, 2^14] (or 0). Below, most of
// the values would be fp16 subnormals or zero, as in networks whose
// activations shrink layer by layer; above, near its overflow.
bool fp16_holds(const Node& n, const std::map<std::string, Range>& ranges);

}  // namespace tpuhal::rt::detail
