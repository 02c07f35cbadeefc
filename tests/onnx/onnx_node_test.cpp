// ONNX's own node tests (Debian's libonnx-testdata), run through the HAL on
// every device with a tensor engine. Each test is a one-node model with
// input and expected output tensors; the node is lowered onto tpuhal ops,
// the inputs uploaded, the op run on the device, and the output compared
// within ONNX's tolerance (relative 1e-3, absolute 1e-7; integers exact).
// float64 data is computed in f32 (the engine has no f64), except by Cast.
//
// Tests whose op or attributes the engine does not support are not
// registered; `onnx_node_test --list-skipped` prints them with the reason,
// and OnnxNodeCoverage checks that every op family the engine claims keeps
// passing tests.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <variant>

#include "onnx_attrs.hpp"  // runtime/src: shared with the model compiler
#include "tpuhal/tpuhal.hpp"

namespace fs = std::filesystem;

namespace tpuhal {
namespace {

fs::path data_root() {
  if (const char* env = std::getenv("TPUHAL_ONNX_TESTDATA")) return env;
  return "/usr/share/libonnx-testdata/data/node";
}

// ---- ONNX tensors on the host ---------------------------------------------------

struct HostTensor {
  int onnx_type = 0;
  std::optional<DType> dtype;  // nullopt: a type the engine has no use for
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;  // in dtype's layout (or int64 / double raw)

  std::uint64_t elements() const {
    std::uint64_t n = 1;
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n;
  }
  // Values as double, for small constant inputs (scales, sizes, clip bounds).
  std::vector<double> values() const {
    std::vector<double> out(elements());
    for (std::size_t i = 0; i < out.size(); ++i) {
      switch (onnx_type) {
        case onnx::TensorProto::FLOAT: {
          float f;
          std::memcpy(&f, &bytes[i * 4], 4);
          out[i] = f;
          break;
        }
        case onnx::TensorProto::INT64: {
          std::int64_t v;
          std::memcpy(&v, &bytes[i * 8], 8);
          out[i] = static_cast<double>(v);
          break;
        }
        case onnx::TensorProto::INT32: {
          std::int32_t v;
          std::memcpy(&v, &bytes[i * 4], 4);
          out[i] = v;
          break;
        }
        case onnx::TensorProto::INT8: out[i] = static_cast<std::int8_t>(bytes[i]); break;
        case onnx::TensorProto::UINT8: out[i] = static_cast<std::uint8_t>(bytes[i]); break;
        case onnx::TensorProto::DOUBLE: {
          double v;
          std::memcpy(&v, &bytes[i * 8], 8);
          out[i] = v;
          break;
        }
        default: out[i] = 0; break;
      }
    }
    return out;
  }
};

std::optional<DType> to_dtype(int t) {
  switch (t) {
    case onnx::TensorProto::FLOAT: return DType::F32;
    case onnx::TensorProto::FLOAT16: return DType::F16;
    case onnx::TensorProto::BFLOAT16: return DType::BF16;
    case onnx::TensorProto::INT8: return DType::I8;
    case onnx::TensorProto::UINT8: return DType::U8;
    case onnx::TensorProto::INT32: return DType::I32;
    case onnx::TensorProto::BOOL: return DType::U8;  // one byte, 0 or 1
    default: return std::nullopt;
  }
}

std::size_t onnx_size(int t) {
  switch (t) {
    case onnx::TensorProto::FLOAT:
    case onnx::TensorProto::INT32: return 4;
    case onnx::TensorProto::FLOAT16:
    case onnx::TensorProto::BFLOAT16: return 2;
    case onnx::TensorProto::INT8:
    case onnx::TensorProto::UINT8:
    case onnx::TensorProto::BOOL: return 1;
    case onnx::TensorProto::INT64:
    case onnx::TensorProto::DOUBLE: return 8;
    default: return 0;
  }
}

// `declared` is the element type the model declares for the value: ONNX
// 1.12 stores bfloat16 test data as UINT16 bit patterns.
HostTensor read_tensor(const fs::path& path, int declared = 0) {
  onnx::TensorProto p;
  std::ifstream in(path, std::ios::binary);
  if (!p.ParseFromIstream(&in)) throw std::runtime_error("cannot parse " + path.string());
  HostTensor t;
  t.onnx_type = p.data_type();
  if (t.onnx_type == onnx::TensorProto::UINT16 && declared == onnx::TensorProto::BFLOAT16)
    t.onnx_type = onnx::TensorProto::BFLOAT16;
  t.dtype = to_dtype(t.onnx_type);
  t.shape.assign(p.dims().begin(), p.dims().end());
  const std::size_t esize = onnx_size(t.onnx_type);
  if (esize == 0) return t;  // strings and the like: nothing the engine reads
  const std::uint64_t n = t.elements();
  t.bytes.resize(n * esize);
  if (!p.raw_data().empty()) {
    if (p.raw_data().size() != t.bytes.size()) throw std::runtime_error("raw data size mismatch in " + path.string());
    std::memcpy(t.bytes.data(), p.raw_data().data(), t.bytes.size());
    return t;
  }
  for (std::uint64_t i = 0; i < n; ++i) {
    std::byte* dst = &t.bytes[i * esize];
    switch (t.onnx_type) {
      case onnx::TensorProto::FLOAT: {
        const float f = p.float_data(static_cast<int>(i));
        std::memcpy(dst, &f, 4);
        break;
      }
      case onnx::TensorProto::DOUBLE: {
        const double d = p.double_data(static_cast<int>(i));
        std::memcpy(dst, &d, 8);
        break;
      }
      case onnx::TensorProto::INT64: {
        const std::int64_t v = p.int64_data(static_cast<int>(i));
        std::memcpy(dst, &v, 8);
        break;
      }
      default: {  // int32_data carries int32, int8, uint8, bool, float16, bfloat16
        const std::int32_t v = p.int32_data(static_cast<int>(i));
        std::memcpy(dst, &v, esize);
        break;
      }
    }
  }
  return t;
}

// ---- Node attributes ---------------------------------------------------------------

// Read as the model compiler reads them (runtime/src/onnx_attrs.hpp).
using rt::onnx_attrs::Attrs;

// ---- Lowering a node onto tpuhal ops ---------------------------------------------------

// Thrown while lowering with the test data at hand: the case is skipped.
struct Skip : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool is_float_dtype(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// The node's inputs as device tensors (absent ones nullopt) and its output.
using Inputs = std::vector<std::optional<Tensor>>;
using Build = std::function<Op(const Inputs& in, const Tensor& out, const std::vector<HostTensor>& host)>;

using BuildOutputs =
    std::function<Op(const Inputs& in, const std::vector<Tensor>& outs, const std::vector<HostTensor>& host)>;

struct Lowering {
  Build build;
  std::set<int> host_only;                 // inputs read on the host (scales, sizes, bounds), not uploaded
  BuildOutputs build_outputs = {};         // instead of `build`, for a node of several outputs
  bool int64_as_i32 = false;               // int64 outputs (indices) are computed in i32 and compared by value
  std::set<int> int64_inputs_as_i32 = {};  // int64 inputs (indices) uploaded as i32 (the values fit)
};
using LowerResult = std::variant<Lowering, std::string>;  // or the reason it is skipped

LowerResult lower(const onnx::NodeProto& node, int opset) {
  const std::string& op = node.op_type();
  const Attrs a{node};
  const int outputs = node.output_size();
  if (op == "TopK") {
    if (opset < 10) return "TopK before opset 10 (k as an attribute)";
    if (outputs != 2) return "TopK with " + std::to_string(outputs) + " outputs";
    const std::int64_t axis = a.i("axis", -1);
    const bool largest = a.i("largest", 1) != 0;
    if (a.i("sorted", 1) == 0) return "unsorted TopK (the order of its outputs is unspecified)";
    Lowering l{nullptr, {1}};
    l.build_outputs = [axis, largest](const Inputs& in, const std::vector<Tensor>& outs, const auto&) {
      return ops::top_k(*in[0], outs[0], outs[1], {axis, largest, false});
    };
    l.int64_as_i32 = true;
    return l;
  }
  if (outputs != 1) return "the node has " + std::to_string(outputs) + " outputs";
  if (op == "ArgMax" || op == "ArgMin") {
    const std::int64_t axis = a.i("axis", 0);
    const bool keep = a.i("keepdims", 1) != 0, last = a.i("select_last_index", 0) != 0, max = op == "ArgMax";
    Lowering l{[axis, keep, last, max](const Inputs& in, const Tensor& out, const auto&) {
                 // Without keepdims, the output viewed with the axis kept.
                 auto shape = in[0]->shape();
                 const auto rank = static_cast<std::int64_t>(shape.size());
                 shape[static_cast<std::size_t>(axis < 0 ? axis + rank : axis)] = 1;
                 const Tensor y = keep ? out : out.reshape(shape);
                 return max ? ops::argmax(*in[0], y, axis, last) : ops::argmin(*in[0], y, axis, last);
               },
               {}};
    l.int64_as_i32 = true;
    return l;
  }
  if (op == "Where") {
    return Lowering{
        [](const Inputs& in, const Tensor& out, const auto&) { return ops::where(*in[0], *in[1], *in[2], out); }, {}};
  }
  if (op == "Mod") {
    const bool fmod = a.i("fmod", 0) != 0;
    return Lowering{[fmod](const Inputs& in, const Tensor& out, const auto&) {
                      return fmod ? ops::fmod(*in[0], *in[1], out) : ops::mod(*in[0], *in[1], out);
                    },
                    {}};
  }
  if (op == "CumSum") {
    const bool exclusive = a.i("exclusive", 0) != 0, reverse = a.i("reverse", 0) != 0;
    return Lowering{[exclusive, reverse](const Inputs& in, const Tensor& out, const auto& host) {
                      const auto axis = static_cast<std::int64_t>(host[1].values().at(0));
                      return ops::cumsum(*in[0], out, axis, exclusive, reverse);
                    },
                    {1}};
  }
  if (op == "Gather") {
    const std::int64_t axis = a.i("axis", 0);
    Lowering l{
        [axis](const Inputs& in, const Tensor& out, const auto&) { return ops::gather(*in[0], *in[1], out, axis); },
        {}};
    l.int64_inputs_as_i32 = {1};
    return l;
  }
  if (op == "RoiAlign") {
    const std::string coordinates =
        a.s("coordinate_transformation_mode", opset >= 16 ? "half_pixel" : "output_half_pixel");
    if (coordinates != "half_pixel" && coordinates != "output_half_pixel")
      return "RoiAlign with coordinate_transformation_mode " + coordinates;
    const RoiAlignMode mode = a.s("mode", "avg") == "max" ? RoiAlignMode::Max : RoiAlignMode::Average;
    const std::int64_t ratio = a.i("sampling_ratio", 0);
    const float scale = a.f("spatial_scale", 1.0f);
    const bool half = coordinates == "half_pixel";
    Lowering l{[mode, ratio, scale, half](const Inputs& in, const Tensor& out, const auto&) {
                 return ops::roi_align(*in[0], *in[1], *in[2], out, mode, ratio, scale, half);
               },
               {}};
    l.int64_inputs_as_i32 = {2};
    return l;
  }
  if (op == "ScatterElements" || op == "Scatter") {
    const std::int64_t axis = a.i("axis", 0);
    const std::string name = a.s("reduction", "none");
    const auto reduction = parse_enum<ScatterReduction>(name);
    if (!reduction) return "reduction " + name;
    Lowering l{[axis, r = *reduction](const Inputs& in, const Tensor& out, const auto&) {
                 return ops::scatter_elements(*in[0], *in[1], *in[2], out, axis, r);
               },
               {}};
    l.int64_inputs_as_i32 = {1};
    return l;
  }
  if (op == "ConvTranspose") {
    const auto unknown = a.unknown(
        {"auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape", "pads", "strides"});
    if (!unknown.empty()) return "attribute " + unknown;
    return Lowering{[node_copy = node](const Inputs& in, const Tensor& out, const auto&) {
                      Tensor x = *in[0], w = *in[1], y = out;
                      const auto g = rt::onnx_attrs::conv_transpose_options(Attrs{node_copy}, x.shape(), w.shape());
                      if (x.rank() == 3 && w.rank() == 3) {  // 1-D as 2-D with H = 1
                        x = x.reshape({x.shape()[0], x.shape()[1], 1, x.shape()[2]});
                        w = w.reshape({w.shape()[0], w.shape()[1], 1, w.shape()[2]});
                        y = y.reshape({y.shape()[0], y.shape()[1], 1, y.shape()[2]});
                      }
                      if (x.rank() != 4) throw Skip(std::to_string(x.rank() - 2) + "-D transposed convolution");
                      ops::Conv2dOptions o = g.options;
                      if (in.size() > 2 && in[2]) o.bias = *in[2];
                      return ops::conv_transpose2d(x, w, y, o);
                    },
                    {}};
  }

  // Elementwise binary ops with broadcasting.
  static const std::map<std::string, Op (*)(const Tensor&, const Tensor&, const Tensor&)> kBinary = {
      {"Add", ops::add},
      {"Sub", ops::sub},
      {"Mul", ops::mul},
      {"Div", ops::div},
      {"Equal", ops::equal},
      {"Less", ops::less},
      {"LessOrEqual", ops::less_equal},
      {"Greater", ops::greater},
      {"GreaterOrEqual", ops::greater_equal},
      {"And", ops::logical_and},
      {"Or", ops::logical_or},
      {"Xor", ops::logical_xor}};
  if (auto it = kBinary.find(op); it != kBinary.end()) {
    if (node.input_size() != 2) return "needs two inputs";
    auto fn = it->second;
    return Lowering{[fn](const Inputs& in, const Tensor& out, const auto&) { return fn(*in[0], *in[1], out); }, {}};
  }
  if (op == "Max" || op == "Min") {
    if (node.input_size() != 2) return "variadic " + op + " with " + std::to_string(node.input_size()) + " inputs";
    auto fn = op == "Max" ? ops::max : ops::min;
    return Lowering{[fn](const Inputs& in, const Tensor& out, const auto&) { return fn(*in[0], *in[1], out); }, {}};
  }
  static const std::map<std::string, Op (*)(const Tensor&, const Tensor&)> kUnary = {
      {"Relu", ops::relu},   {"Abs", ops::abs},     {"Neg", ops::neg},     {"Exp", ops::exp},
      {"Log", ops::log},     {"Sqrt", ops::sqrt},   {"Erf", ops::erf},     {"Not", ops::logical_not},
      {"Ceil", ops::ceil},   {"Floor", ops::floor}, {"Round", ops::round}, {"Sin", ops::sin},
      {"Cos", ops::cos},     {"Tan", ops::tan},     {"Asin", ops::asin},   {"Acos", ops::acos},
      {"Atan", ops::atan},   {"Sinh", ops::sinh},   {"Cosh", ops::cosh},   {"Asinh", ops::asinh},
      {"Acosh", ops::acosh}, {"Atanh", ops::atanh}};
  if (auto it = kUnary.find(op); it != kUnary.end()) {
    auto fn = it->second;
    return Lowering{[fn](const Inputs& in, const Tensor& out, const auto&) { return fn(*in[0], out); }, {}};
  }
  if (op == "Sigmoid" || op == "Tanh" || op == "LeakyRelu" || op == "HardSigmoid") {
    ActivationParams act = op == "Sigmoid"     ? ActivationParams::sigmoid()
                           : op == "Tanh"      ? ActivationParams::tanh()
                           : op == "LeakyRelu" ? ActivationParams::leaky_relu(a.f("alpha", 0.01f))
                                               : ActivationParams::hard_sigmoid(a.f("alpha", 0.2f), a.f("beta", 0.5f));
    return Lowering{
        [act](const Inputs& in, const Tensor& out, const auto&) { return ops::activation(*in[0], out, act); }, {}};
  }
  if (op == "Clip") {
    if (opset < 11) return "Clip before opset 11 (bounds as attributes)";
    return Lowering{[](const Inputs& in, const Tensor& out, const std::vector<HostTensor>& host) {
                      float lo = -FLT_MAX, hi = FLT_MAX;
                      if (host.size() > 1 && !host[1].bytes.empty()) lo = static_cast<float>(host[1].values()[0]);
                      if (host.size() > 2 && !host[2].bytes.empty()) hi = static_cast<float>(host[2].values()[0]);
                      if (!is_float_dtype(in[0]->dtype())) throw Skip("integer Clip (the engine clips floats)");
                      return ops::activation(*in[0], out, ActivationParams::clip(lo, hi));
                    },
                    {1, 2}};
  }
  if (op == "Softmax" || op == "LogSoftmax") {
    if (opset < 13) return op + " before opset 13 (flattening semantics)";
    const std::int64_t axis = a.i("axis", -1);
    const bool log = op == "LogSoftmax";
    return Lowering{
        [axis, log](const Inputs& in, const Tensor& out, const auto&) { return ops::softmax(*in[0], out, axis, log); },
        {}};
  }
  if (op == "Transpose") {
    auto perm = a.ints("perm");
    return Lowering{[perm](const Inputs& in, const Tensor& out, const auto&) {
                      std::vector<std::size_t> p;
                      if (perm.empty())
                        for (std::size_t i = in[0]->rank(); i-- > 0;) p.push_back(i);
                      else
                        for (auto x : perm) p.push_back(static_cast<std::size_t>(x));
                      return ops::transpose(*in[0], out, p);
                    },
                    {}};
  }
  if (op == "Cast") {
    if (!to_dtype(static_cast<int>(a.i("to", 0)))) return "Cast to a type the engine does not have";
    if (a.i("to", 0) == onnx::TensorProto::BFLOAT16)
      return "ONNX 1.12's expected bfloat16 output truncates; the engine rounds to nearest even (as ONNX 1.13 "
             "and bfloat16 hardware do)";
    return Lowering{[](const Inputs& in, const Tensor& out, const auto&) { return ops::cast(*in[0], out); }, {}};
  }
  if (op == "Gemm") {
    if (!a.unknown({"alpha", "beta", "transA", "transB"}).empty())
      return "attribute " + a.unknown({"alpha", "beta", "transA", "transB"});
    ops::MatMulOptions o;
    o.alpha = a.f("alpha", 1.0f);
    o.beta = a.f("beta", 1.0f);
    o.transpose_a = a.i("transA", 0) != 0;
    o.transpose_b = a.i("transB", 0) != 0;
    return Lowering{[o](const Inputs& in, const Tensor& out, const auto&) {
                      ops::MatMulOptions oo = o;
                      if (in.size() > 2 && in[2]) oo.c = *in[2];
                      return ops::matmul(*in[0], *in[1], out, oo);
                    },
                    {}};
  }
  if (op == "MatMul") {
    return Lowering{[](const Inputs& in, const Tensor& out, const auto&) {
                      if (in[0]->rank() < 2 || in[1]->rank() < 2) throw Skip("1-D MatMul operands");
                      return ops::matmul(*in[0], *in[1], out);
                    },
                    {}};
  }
  if (op == "MatMulInteger") {
    return Lowering{[](const Inputs& in, const Tensor& out, const auto&) {
                      return ops::matmul_integer(*in[0], *in[1], out, in.size() > 2 ? in[2] : std::nullopt,
                                                 in.size() > 3 ? in[3] : std::nullopt);
                    },
                    {}};
  }
  if (op == "QLinearMatMul") {
    return Lowering{[](const Inputs& in, const Tensor& out, const auto&) {
                      return ops::qlinear_matmul(*in[0], *in[1], *in[2], *in[3], *in[4], *in[5], *in[6], *in[7], out);
                    },
                    {}};
  }
  if (op == "QuantizeLinear" || op == "DequantizeLinear") {
    const std::int64_t axis = a.i("axis", 1);
    const bool q = op == "QuantizeLinear";
    return Lowering{[axis, q](const Inputs& in, const Tensor& out, const auto&) {
                      std::optional<Tensor> zp = in.size() > 2 ? in[2] : std::nullopt;
                      return q ? ops::quantize(*in[0], *in[1], zp, out, axis)
                               : ops::dequantize(*in[0], *in[1], zp, out, axis);
                    },
                    {}};
  }
  if (op == "Conv" || op == "ConvInteger" || op == "QLinearConv") {
    if (!a.unknown({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}).empty())
      return "attribute " + a.unknown({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"});
    const std::string kind = op;
    return Lowering{[a_copy = node, kind](const Inputs& in, const Tensor& out, const auto&) {
                      const Attrs at{a_copy};
                      const Tensor& x = *in[0];
                      const Tensor& w = kind == "QLinearConv" ? *in[3] : *in[1];
                      if (x.rank() != 4) throw Skip(std::to_string(x.rank() - 2) + "-D convolution");
                      ops::Conv2dOptions o = rt::onnx_attrs::conv_options(at, x.shape(), w.shape());
                      if (kind == "Conv") {
                        if (in.size() > 2 && in[2]) o.bias = *in[2];
                        return ops::conv2d(x, w, out, o);
                      }
                      if (kind == "ConvInteger")
                        return ops::conv_integer(x, w, out, in.size() > 2 ? in[2] : std::nullopt,
                                                 in.size() > 3 ? in[3] : std::nullopt, o);
                      if (in.size() > 8 && in[8]) o.bias = *in[8];
                      return ops::qlinear_conv(x, *in[1], *in[2], w, *in[4], *in[5], *in[6], *in[7], out, o);
                    },
                    {}};
  }
  if (op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool" || op == "GlobalMaxPool") {
    if (a.i("storage_order", 0) != 0) return "MaxPool with storage_order 1";
    const bool max = op == "MaxPool" || op == "GlobalMaxPool";
    return Lowering{[node_copy = node, max](const Inputs& in, const Tensor& out, const auto&) {
                      const Attrs at{node_copy};
                      Tensor x = *in[0];
                      Tensor y = out;
                      if (x.rank() == 3) {  // 1-D pooling as 2-D with H = 1
                        x = x.reshape({x.shape()[0], x.shape()[1], 1, x.shape()[2]});
                        y = y.reshape({y.shape()[0], y.shape()[1], 1, y.shape()[2]});
                      }
                      if (x.rank() != 4) throw Skip(std::to_string(x.rank() - 2) + "-D pooling");
                      const ops::Pool2dOptions o = rt::onnx_attrs::pool_options(at, in[0]->shape());
                      return max ? ops::max_pool2d(x, y, o) : ops::avg_pool2d(x, y, o);
                    },
                    {}};
  }
  if (op == "Resize") {
    if (opset < 11) return "Resize before opset 11";
    if (const std::string why = rt::onnx_attrs::resize_unsupported(a, opset); !why.empty()) return why;
    const ops::ResizeOptions o = rt::onnx_attrs::resize_options(a, opset);
    return Lowering{[o](const Inputs& in, const Tensor& out, const std::vector<HostTensor>& host) {
                      ops::ResizeOptions oo = o;
                      // Inputs: X, roi, scales, sizes. With scales, ONNX maps
                      // coordinates by the given scale; with sizes, by out/in.
                      if (host.size() > 2 && !host[2].bytes.empty()) {
                        auto s = host[2].values();
                        if (s.size() != 4 || s[0] != 1 || s[1] != 1) throw Skip("scales other than on H and W");
                        oo.scales = std::array<float, 2>{static_cast<float>(s[2]), static_cast<float>(s[3])};
                      } else if (host.size() > 3 && !host[3].bytes.empty()) {
                        auto s = host[3].values();
                        if (s.size() != 4 || s[0] != in[0]->shape()[0] || s[1] != in[0]->shape()[1])
                          throw Skip("sizes other than on H and W");
                      }
                      if (in[0]->rank() != 4) throw Skip("Resize of a non-4-D tensor");
                      return ops::resize(*in[0], out, oo);
                    },
                    {1, 2, 3}};
  }
  return "op " + op + " is not in the engine's op set";
}

// ---- Test cases --------------------------------------------------------------------

struct Case {
  std::string name;
  fs::path dir;
  onnx::NodeProto node;
  std::vector<std::string> graph_inputs;  // names, in the order of input_N.pb
  std::vector<int> input_types;           // declared element types
  std::vector<int> output_types;          // declared element types, in the order of output_N.pb
  int opset = 0;
};

struct Catalogue {
  std::vector<Case> supported;
  std::vector<std::pair<std::string, std::string>> skipped;  // name, why
};

const Catalogue& catalogue() {
  static const Catalogue c = [] {
    Catalogue cat;
    std::error_code ec;
    std::vector<fs::path> dirs;
    for (const auto& e : fs::directory_iterator(data_root(), ec))
      if (e.is_directory()) dirs.push_back(e.path());
    std::sort(dirs.begin(), dirs.end());
    for (const auto& dir : dirs) {
      const std::string name = dir.filename().string();
      onnx::ModelProto model;
      std::ifstream in(dir / "model.onnx", std::ios::binary);
      if (!model.ParseFromIstream(&in)) {
        cat.skipped.emplace_back(name, "model does not parse");
        continue;
      }
      const auto& g = model.graph();
      if (g.node_size() != 1) {
        cat.skipped.emplace_back(name, std::to_string(g.node_size()) + " nodes (an expanded function)");
        continue;
      }
      if (!fs::exists(dir / "test_data_set_0")) {
        cat.skipped.emplace_back(name, "no test data");
        continue;
      }
      Case k;
      k.name = name;
      k.dir = dir;
      k.node = g.node(0);
      for (const auto& i : g.input()) {
        k.graph_inputs.push_back(i.name());
        k.input_types.push_back(i.type().tensor_type().elem_type());
      }
      for (const auto& o : g.output()) k.output_types.push_back(o.type().tensor_type().elem_type());
      for (const auto& o : model.opset_import())
        if (o.domain().empty() || o.domain() == "ai.onnx") k.opset = static_cast<int>(o.version());
      auto lowered = lower(k.node, k.opset);
      if (auto* why = std::get_if<std::string>(&lowered)) {
        cat.skipped.emplace_back(name, *why);
        continue;
      }
      cat.supported.push_back(std::move(k));
    }
    return cat;
  }();
  return c;
}

std::vector<std::string> devices_with_tensor_engine() {
  std::vector<std::string> out;
  for (auto& d : enumerate()) out.push_back(d.uri);
  out.push_back("sim:tiny");
  std::vector<std::string> keep;
  for (auto& uri : out) {
    try {
      if (open(uri).properties().caps.tensor) keep.push_back(uri);
    } catch (const Error&) {
    }
  }
  return keep;
}

struct Param {
  std::string device;
  const Case* test;
};
// How ctest and failure messages show a parameter.
void PrintTo(const Param& p, std::ostream* os) { *os << p.test->name << " on " << p.device; }

std::string param_name(const ::testing::TestParamInfo<Param>& p) {
  std::string s = p.param.test->name + "_on_" + p.param.device;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (const auto& dev : devices_with_tensor_engine())
    for (const auto& c : catalogue().supported) out.push_back({dev, &c});
  return out;
}

class OnnxNode : public ::testing::TestWithParam<Param> {};

// Uploads a host tensor into device memory (through pinned staging).
Tensor upload(Device& dev, Queue& q, const HostTensor& t) {
  const std::uint64_t bytes = std::max<std::uint64_t>(t.bytes.size(), 1);
  Buffer staging = dev.allocate(bytes, Memory::HostPinned);
  Buffer dst = dev.allocate(bytes);
  std::memcpy(staging.map().data(), t.bytes.data(), t.bytes.size());
  q.copy(staging, dst).submit().wait();
  return Tensor(dst, *t.dtype, t.shape);
}

double element(const std::byte* p, DType t) {
  switch (t) {
    case DType::F32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::F16:
    case DType::BF16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      if (t == DType::BF16) {
        const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
        float f;
        std::memcpy(&f, &bits, 4);
        return f;
      }
      const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
      const double sign = (h & 0x8000) ? -1.0 : 1.0;
      if (e == 0) return sign * std::ldexp(m, -24);
      if (e == 31) return m ? NAN : sign * INFINITY;
      return sign * std::ldexp(m + 1024, e - 25);
    }
    case DType::I8: return static_cast<std::int8_t>(*p);
    case DType::U8: return static_cast<std::uint8_t>(*p);
    case DType::I32: {
      std::int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
  }
  return 0;
}

// Runs one case on `device`. Returns the reason it was skipped, or nothing;
// a mismatch is reported in `mismatch`.
std::optional<std::string> run_case(const Case& c, const std::string& device, std::string& mismatch) {
  Device dev = open(device);
  Queue q = dev.queue(Engine::Compute);
  const fs::path data = c.dir / "test_data_set_0";

  // Node inputs by position; an empty name is an omitted optional input.
  std::vector<HostTensor> host(static_cast<std::size_t>(c.node.input_size()));
  std::vector<bool> given(host.size());
  for (int i = 0; i < c.node.input_size(); ++i) {
    const std::string& name = c.node.input(i);
    if (name.empty()) continue;
    auto it = std::find(c.graph_inputs.begin(), c.graph_inputs.end(), name);
    if (it == c.graph_inputs.end()) return "input " + name + " is not a graph input";
    const auto index = static_cast<std::size_t>(it - c.graph_inputs.begin());
    host[i] = read_tensor(data / ("input_" + std::to_string(index) + ".pb"), c.input_types[index]);
    given[i] = true;
  }
  auto lowered = std::get<Lowering>(lower(c.node, c.opset));
  // float64 data (the engine has no f64) is computed in f32 and compared
  // within ONNX's tolerance: the op's arithmetic is what the test checks.
  // Not for a cast from float64, whose conversion would be this harness's.
  const bool f64_as_f32 = c.node.op_type() != "Cast" && c.node.op_type() != "CastLike";
  // The outputs as ONNX gives them, and the dtype each is computed in.
  std::vector<HostTensor> expected;
  std::vector<DType> out_types;
  for (std::size_t k = 0; k < c.output_types.size(); ++k) {
    expected.push_back(read_tensor(data / ("output_" + std::to_string(k) + ".pb"), c.output_types[k]));
    const HostTensor& e = expected.back();
    if (e.onnx_type == onnx::TensorProto::INT64 && lowered.int64_as_i32)
      out_types.push_back(DType::I32);
    else if (e.onnx_type == onnx::TensorProto::DOUBLE && f64_as_f32)
      out_types.push_back(DType::F32);
    else if (e.dtype)
      out_types.push_back(*e.dtype);
    else
      return "output type " + std::to_string(e.onnx_type) + " is not an engine dtype";
  }

  for (const int i : lowered.int64_inputs_as_i32) {
    HostTensor& h = host[static_cast<std::size_t>(i)];
    if (h.onnx_type != onnx::TensorProto::INT64) continue;
    std::vector<std::byte> narrow(h.elements() * 4);
    for (std::uint64_t k = 0; k < h.elements(); ++k) {
      std::int64_t v;
      std::memcpy(&v, &h.bytes[k * 8], 8);
      if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max())
        return "an int64 index outside int32";
      const auto n = static_cast<std::int32_t>(v);
      std::memcpy(&narrow[k * 4], &n, 4);
    }
    h.onnx_type = onnx::TensorProto::INT32;
    h.dtype = DType::I32;
    h.bytes = std::move(narrow);
  }
  for (std::size_t i = 0; i < host.size(); ++i) {
    HostTensor& h = host[i];
    if (!given[i] || h.onnx_type != onnx::TensorProto::DOUBLE || !f64_as_f32 ||
        lowered.host_only.count(static_cast<int>(i)))
      continue;
    const std::vector<double> v = h.values();
    h.bytes.resize(v.size() * 4);
    for (std::size_t k = 0; k < v.size(); ++k) {
      const auto f = static_cast<float>(v[k]);
      std::memcpy(&h.bytes[k * 4], &f, 4);
    }
    h.onnx_type = onnx::TensorProto::FLOAT;
    h.dtype = DType::F32;
  }
  Inputs in(host.size());
  for (std::size_t i = 0; i < host.size(); ++i) {
    if (!given[i] || lowered.host_only.count(static_cast<int>(i))) continue;
    if (!host[i].dtype)
      return "input " + std::to_string(i) + " has type " + std::to_string(host[i].onnx_type) + ", not an engine dtype";
    in[i] = upload(dev, q, host[i]);
  }
  std::vector<Tensor> outs;
  std::vector<Buffer> out_host;
  for (std::size_t k = 0; k < expected.size(); ++k) {
    const std::uint64_t bytes = std::max<std::uint64_t>(expected[k].elements() * size_of(out_types[k]), 1);
    outs.emplace_back(dev.allocate(bytes), out_types[k], expected[k].shape);
    out_host.push_back(dev.allocate(bytes, Memory::HostPinned));
  }
  Op op;
  try {
    op = lowered.build_outputs ? lowered.build_outputs(in, outs, host) : lowered.build(in, outs.at(0), host);
  } catch (const Skip& s) {
    return std::string(s.what());
  }
  Batch b = q.batch();
  b.run(op);
  for (std::size_t k = 0; k < outs.size(); ++k) b.copy(outs[k].buffer(), out_host[k]);
  b.submit().wait();

  for (std::size_t k = 0; k < outs.size(); ++k) {
    const DType t = out_types[k];
    const std::size_t es = size_of(t);
    const auto got = out_host[k].map();
    const std::vector<double> want_values = expected[k].dtype ? std::vector<double>{} : expected[k].values();
    std::size_t bad = 0;
    std::string first;
    for (std::uint64_t i = 0; i < expected[k].elements(); ++i) {
      const double g = element(&got[i * es], t);
      const double e = expected[k].dtype ? element(&expected[k].bytes[i * es], t) : want_values[i];
      const bool ok = is_float_dtype(t) ? ((std::isnan(g) && std::isnan(e)) || g == e ||
                                           std::fabs(g - e) <= 1e-7 + 1e-3 * std::fabs(e))
                                        : g == e;
      if (!ok && bad++ == 0)
        first = "element " + std::to_string(i) + ": got " + std::to_string(g) + ", expected " + std::to_string(e);
    }
    if (bad)
      mismatch += (mismatch.empty() ? "" : "; ") + std::string("output ") + std::to_string(k) + ": " +
                  std::to_string(bad) + " of " + std::to_string(expected[k].elements()) +
                  " elements differ; first: " + first;
  }
  return std::nullopt;
}

TEST_P(OnnxNode, MatchesTheExpectedOutput) {
  std::string mismatch;
  if (auto skip = run_case(*GetParam().test, GetParam().device, mismatch)) GTEST_SKIP() << *skip;
  EXPECT_TRUE(mismatch.empty()) << mismatch;
}

INSTANTIATE_TEST_SUITE_P(Node, OnnxNode, ::testing::ValuesIn(params()), param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(OnnxNode);

// The devices the node tests do not run on, and why: a GPU without the
// tensor ops, a driver with no devices here. Skipped with that list, so a
// run says what it did not test.
TEST(OnnxNodeCoverage, DevicesNotTestedSayWhy) {
  EXPECT_FALSE(devices_with_tensor_engine().empty()) << "the simulated boards have a tensor engine";
  std::string untested;
  auto add = [&](const std::string& what, const std::string& why) {
    untested += (untested.empty() ? "" : "; ") + what + ": " + why;
  };
  for (const auto& d : enumerate()) {
    try {
      if (!open(d.uri).properties().caps.tensor) add(d.uri, "no tensor engine");
    } catch (const Error& e) {
      add(d.uri, e.what());
    }
  }
  for (const auto& [driver, why] : unavailable_drivers()) add(driver, why);
  if (!untested.empty()) GTEST_SKIP() << "not run on: " << untested;
}

// Every op family the engine takes on must keep tests in the catalogue: a
// lowering that silently starts skipping a whole family fails here.
TEST(OnnxNodeCoverage, EveryOpFamilyTheEngineClaimsHasTests) {
  std::map<std::string, int> per_op;
  for (const auto& c : catalogue().supported) ++per_op[c.node.op_type()];
  for (const char* op : {"Gemm",           "MatMul",           "Conv",          "MaxPool",     "AveragePool",
                         "Relu",           "Softmax",          "Add",           "Mul",         "Sub",
                         "Sigmoid",        "LeakyRelu",        "Clip",          "Transpose",   "Cast",
                         "QuantizeLinear", "DequantizeLinear", "MatMulInteger", "ConvInteger", "QLinearMatMul",
                         "QLinearConv",    "Resize",           "Where",         "Gather",      "Equal",
                         "Less",           "Greater",          "And",           "Not",         "RoiAlign"})
    EXPECT_GT(per_op[op], 0) << op << " has no ONNX node test left in the catalogue";
  EXPECT_GE(catalogue().supported.size(), 150u);
}

}  // namespace
}  // namespace tpuhal

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--list-skipped") {
      // Skipped by op or attributes, then by what the test data holds.
      auto skipped = tpuhal::catalogue().skipped;
      for (const auto& c : tpuhal::catalogue().supported) {
        std::string mismatch;
        if (auto why = tpuhal::run_case(c, "sim:tiny", mismatch)) skipped.emplace_back(c.name, *why);
      }
      std::sort(skipped.begin(), skipped.end());
      for (const auto& [name, why] : skipped) std::printf("%s: %s\n", name.c_str(), why.c_str());
      return 0;
    }
    if (std::string(argv[i]) == "--list-supported") {
      for (const auto& c : tpuhal::catalogue().supported) std::printf("%s\n", c.name.c_str());
      return 0;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
