// ONNX in: parse, list unsupported ops, read the initializers and inputs,
// run each node's handler (handler.hpp) in order, then the passes
// (passes.hpp): BatchNormalization folded, activations fused.
#include "onnx/importer.hpp"

#include <algorithm>

#include "onnx/passes.hpp"

namespace tpuhal::rt::detail {

std::string dims_text(const std::vector<std::int64_t>& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

Value make_constant(std::vector<std::int64_t> shape, const std::vector<double>& values, bool integer) {
  Value v;
  v.shape = std::move(shape);
  v.data = std::vector<float>(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) (*v.data)[i] = static_cast<float>(values[i]);
  if (integer) {
    v.ints.resize(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) v.ints[i] = static_cast<std::int64_t>(values[i]);
  }
  return v;
}

bool is_integer(const Value& v) { return !v.ints.empty() || (v.data && v.data->empty() && v.elements() == 0); }

std::vector<double> values_of(const Value& v) {
  std::vector<double> out;
  if (!v.ints.empty()) {
    for (auto x : v.ints) out.push_back(static_cast<double>(x));
  } else {
    for (auto x : *v.data) out.push_back(x);
  }
  return out;
}

std::size_t broadcast_index(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& s,
                            std::uint64_t flat) {
  const auto st = row_major_strides(shape), ss = row_major_strides(s);
  std::int64_t at = 0;
  const std::size_t off = shape.size() - s.size();
  for (std::size_t d = off; d < shape.size(); ++d) {
    const std::int64_t coord = static_cast<std::int64_t>(flat) / st[d] % shape[d];
    if (s[d - off] != 1) at += coord * ss[d - off];
  }
  return static_cast<std::size_t>(at);
}

void Importer::check_folded(const Node& n, const std::vector<std::int64_t>& shape) const {
  std::uint64_t elements = 1;
  bool over = false;
  for (auto d : shape) {
    if (d < 0) fail_node(n, "a constant of shape " + dims_text(shape));
    over = over || __builtin_mul_overflow(elements, static_cast<std::uint64_t>(d), &elements);
  }
  if (over || elements > constant_limit / 4)
    fail(Status::ResourceExhausted,
         "node '" + n.name + "' (" + n.op + "): folded on constants it makes a constant of shape " + dims_text(shape) +
             (over ? std::string() : " (" + std::to_string(elements * 4) + " bytes as float32)") +
             ", above the limit of " + std::to_string(constant_limit) +
             " bytes (tpuhal compile --max-constant-bytes, CompileOptions::max_constant_bytes)");
}

std::string Importer::resolve(const std::string& v) const {
  auto it = alias.find(v);
  return it == alias.end() ? v : it->second;
}

const Value& Importer::in(const Node& n, std::size_t i) const {
  if (i >= n.inputs.size() || n.inputs[i].empty()) fail_node(n, "input " + std::to_string(i) + " is missing");
  auto it = g.values.find(n.inputs[i]);
  if (it == g.values.end())
    fail_node(n, "input '" + n.inputs[i] + "' is not produced before it (the graph must be sorted)");
  return it->second;
}

const Value& Importer::constant(const Node& n, std::size_t i, const char* what) const {
  const Value& v = in(n, i);
  if (!v.data)
    fail(Status::Unsupported, "node '" + n.name + "' (" + n.op + "): its " + what + " ('" + n.inputs[i] +
                                  "') is computed, not a constant; the compiler needs constant " + what);
  return v;
}

bool Importer::constant_inputs(const Node& n) const {
  bool constants = true;
  for (std::size_t i = 0; i < n.inputs.size(); ++i) constants = constants && (!has(n, i) || in(n, i).data);
  return constants;
}

std::vector<std::int64_t> Importer::broadcast(const Node& n, std::vector<std::int64_t> a,
                                              std::vector<std::int64_t> b) const {
  if (a.size() < b.size()) std::swap(a, b);
  b.insert(b.begin(), a.size() - b.size(), 1);
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i] || b[i] == 1) continue;
    if (a[i] == 1) {
      a[i] = b[i];
      continue;
    }
    fail_node(n, "shapes " + dims_text(a) + " and " + dims_text(b) + " do not broadcast");
  }
  return a;
}

std::int64_t Importer::axis_of(const Node& n, std::int64_t axis, std::int64_t rank) const {
  if (axis < -rank || axis >= rank) fail_node(n, "axis " + std::to_string(axis) + " for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

std::vector<std::int64_t> Importer::int_list(const Node& n, std::size_t input, const char* what,
                                             const std::vector<std::int64_t>& attribute) const {
  if (has(n, input)) {
    const Value& v = constant(n, input, what);
    if (!is_integer(v)) fail_node(n, std::string("its ") + what + " are not integers");
    return v.ints;
  }
  return attribute;
}

void Importer::check_opset(const Node& n) const {
  const OpHandler& h = *n.handler;
  if (g.opset >= h.opsets.first && g.opset <= h.opsets.last) return;
  std::string why = h.opsets.refusal ? h.opsets.refusal : "opset {opset}";
  if (auto at = why.find("{opset}"); at != std::string::npos) why.replace(at, 7, std::to_string(g.opset));
  unsupported(n, why);
}

// The handler's shape rule, or its fold; first the opset.
Value Importer::infer(Node& n) {
  const OpHandler& h = *n.handler;
  check_opset(n);
  if (h.fold && folds(h, n)) return h.fold(*this, n);
  if (!h.infer) fail_node(n, "no shape rule");
  return h.infer(*this, n);
}

bool Importer::folds(const OpHandler& h, const Node& n) const {
  switch (h.folds) {
    case Fold::Never: return false;
    case Fold::Always: return true;
    case Fold::ConstantsOnly:
      for (std::size_t i = 0; i < n.inputs.size(); ++i)
        if (has(n, i) && !in(n, i).data)
          unsupported(n, "input '" + n.inputs[i] + "' is computed on the device; the compiler evaluates " + n.op +
                             " only on constants and shapes (shape computations)");
      return true;
    case Fold::IfConstant: return constant_inputs(n);
    case Fold::IfFirstTwoConstant: return in(n, 0).data && in(n, 1).data;
  }
  return false;
}

void Importer::emit(Node n, const onnx::NodeProto& proto) {
  if (g.values.count(n.output)) fail_node(n, "output '" + n.output + "' is defined twice");
  if (n.handler->read) n.attrs = n.handler->read(Attrs{proto});
  Value v = infer(n);
  std::uint64_t elements = 1;
  bool over = false;
  for (auto d : v.shape)
    over = over || d < 0 || d >= (std::int64_t{1} << 32) ||
           __builtin_mul_overflow(elements, static_cast<std::uint64_t>(d), &elements);
  if (over || elements >= (std::uint64_t{1} << 40))
    fail_node(n, "its output of shape " + dims_text(v.shape) +
                     " is beyond what a compiled model holds (dimensions below 2^32, fewer than 2^40 elements)");
  g.values[n.output] = std::move(v);
  if (!n.output2.empty()) {  // TopK's indices: folded, or the values' shape
    if (g.values.count(n.output2)) fail_node(n, "output '" + n.output2 + "' is defined twice");
    Value indices;
    indices.shape = g.values[n.output].shape;
    if (g.values[n.output].data && folded_second) indices = std::move(*folded_second);
    g.values[n.output2] = std::move(indices);
  }
  folded_second.reset();
  if (g.values[n.output].data) {
    g.notes.push_back("folded " + n.op + " '" + n.name + "' of a constant");
    return;
  }
  g.nodes.push_back(std::move(n));
}

Node Importer::derived(const Node& from, const std::string& suffix, const std::string& op,
                       std::vector<std::string> inputs, std::string output, onnx::NodeProto& proto) const {
  Node n;
  n.name = from.name + "/" + suffix;
  n.op = op;
  n.handler = find_handler(op);
  if (!n.handler) throw Error(Status::Internal, "compiler: no handler for " + op);
  proto.set_op_type(op);
  proto.set_name(n.name);
  n.inputs = std::move(inputs);
  n.output = std::move(output);
  return n;
}

void Importer::emit_derived(const Node& from, const std::string& suffix, const std::string& op,
                            std::vector<std::string> inputs, std::string output) {
  onnx::NodeProto p;
  Node n = derived(from, suffix, op, std::move(inputs), std::move(output), p);
  emit(std::move(n), p);
}

std::string Importer::add_constant(const std::string& name, std::vector<std::int64_t> shape,
                                   const std::vector<double>& v, bool integer) {
  g.values[name] = make_constant(std::move(shape), v, integer);
  return name;
}

// Every unsupported node, in one error.
void Importer::check_ops(const onnx::GraphProto& graph) const {
  std::vector<std::string> refused;
  for (int i = 0; i < graph.node_size(); ++i) {
    const auto& n = graph.node(i);
    const std::string name = n.name().empty() ? n.op_type() + " #" + std::to_string(i) : n.name();
    if (!(n.domain().empty() || n.domain() == "ai.onnx") || !find_handler(n.op_type()))
      refused.push_back("'" + name + "' (" + (n.domain().empty() ? "" : n.domain() + ".") + n.op_type() + ")");
  }
  if (refused.empty()) return;
  std::string list;
  for (std::size_t i = 0; i < refused.size(); ++i) list += (i ? ", " : "") + refused[i];
  fail(Status::Unsupported, std::to_string(refused.size()) + " node" + (refused.size() == 1 ? "" : "s") +
                                " with ops the compiler does not support: " + list + " (supported: docs/runtime.md)");
}

// The initializers as constants; returns their bytes as float32.
std::uint64_t Importer::read_initializers(const onnx::GraphProto& graph) {
  std::uint64_t own = 0;
  for (const auto& t : graph.initializer()) {
    g.values[t.name()] = tensor_value(t, "initializer '" + t.name() + "'");
    own += g.values[t.name()].elements() * 4;
  }
  return own;
}

namespace {
// The model inputs the runtime takes as float32: float16 and bfloat16
// values exactly, float64 rounded.
bool float_input(int type) {
  return type == onnx::TensorProto::FLOAT || type == onnx::TensorProto::FLOAT16 ||
         type == onnx::TensorProto::BFLOAT16 || type == onnx::TensorProto::DOUBLE;
}
// And as int32 (exactly; int64 within int32's range): ids, masks, images.
bool integer_input(int type) {
  switch (type) {
    case onnx::TensorProto::INT64:
    case onnx::TensorProto::INT32:
    case onnx::TensorProto::INT16:
    case onnx::TensorProto::INT8:
    case onnx::TensorProto::UINT16:
    case onnx::TensorProto::UINT8:
    case onnx::TensorProto::BOOL: return true;
    default: return false;
  }
}
}  // namespace

// A graph input's fixed shape: given, or the model's own.
Value Importer::input_value(const onnx::ValueInfoProto& input) const {
  Value v;
  auto given = options.shapes.find(input.name());
  const auto& tt = input.type().tensor_type();
  if (!float_input(tt.elem_type()) && !integer_input(tt.elem_type()))
    fail(Status::Unsupported, "input '" + input.name() + "' has ONNX element type " + std::to_string(tt.elem_type()) +
                                  "; model inputs must be floats (float32, float16, bfloat16, float64), integers "
                                  "(int64, int32, int16, int8, uint16, uint8) or bool");
  // Compiled for several batch sizes: the first dimension is the batch
  // being compiled, whatever was given for it, and the model's own must
  // be symbolic, for a model exported for one batch may have it written
  // into its reshapes.
  if (batch > 0 && tt.has_shape() && tt.shape().dim_size() > 0) {
    const auto& d = tt.shape().dim(0);
    if (d.has_dim_value() && d.dim_value() > 0)
      fail(Status::InvalidArgument,
           "input '" + input.name() + "' has its batch (dimension 0) fixed at " + std::to_string(d.dim_value()) +
               " in the model; compiling for several batch sizes needs it symbolic: export the model with a "
               "dynamic batch axis (torch.onnx.export(..., dynamic_axes={'" +
               input.name() + "': {0: 'batch'}}))");
  }
  auto batched = [&](std::vector<std::int64_t> shape) {
    if (batch > 0 && !shape.empty()) shape[0] = batch;
    return shape;
  };
  if (given != options.shapes.end()) {
    v.shape = batched(given->second);
    if (tt.has_shape() && tt.shape().dim_size() != static_cast<int>(v.shape.size()))
      fail(Status::InvalidArgument, "input '" + input.name() + "' has rank " + std::to_string(tt.shape().dim_size()) +
                                        "; the shape given for it, " + dims_text(v.shape) + ", has rank " +
                                        std::to_string(v.shape.size()));
    for (int i = 0; tt.has_shape() && i < tt.shape().dim_size(); ++i) {
      const auto& d = tt.shape().dim(i);
      if (d.has_dim_value() && d.dim_value() > 0 && d.dim_value() != v.shape[static_cast<std::size_t>(i)])
        fail(Status::InvalidArgument, "input '" + input.name() + "' has dimension " + std::to_string(i) + " fixed at " +
                                          std::to_string(d.dim_value()) + "; the shape given is " + dims_text(v.shape));
    }
  } else {
    if (!tt.has_shape())
      fail(Status::InvalidArgument, "input '" + input.name() + "' has no shape in the model; give one (--shape " +
                                        input.name() + "=1x3x224x224)");
    for (int i = 0; i < tt.shape().dim_size(); ++i) {
      const auto& d = tt.shape().dim(i);
      if (i == 0 && batch > 0) {
        v.shape.push_back(batch);
        continue;
      }
      if (!d.has_dim_value() || d.dim_value() <= 0)
        fail(Status::InvalidArgument, "input '" + input.name() + "' has a symbolic dimension " + std::to_string(i) +
                                          (d.dim_param().empty() ? std::string() : " ('" + d.dim_param() + "')") +
                                          "; give its fixed shape (--shape " + input.name() + "=...)");
      v.shape.push_back(d.dim_value());
    }
  }
  if (batch > 0 && v.shape.empty())
    fail(Status::InvalidArgument,
         "input '" + input.name() + "' is a scalar, with no batch dimension to compile several batch sizes for");
  for (auto d : v.shape)
    if (d <= 0 || d > (std::int64_t{1} << 31))
      fail(Status::InvalidArgument, "input '" + input.name() + "' has shape " + dims_text(v.shape));
  if (v.shape.size() > kMaxRank) fail(Status::Unsupported, "input '" + input.name() + "' has rank above 6");
  return v;
}

void Importer::read_inputs(const onnx::GraphProto& graph, const std::set<std::string>& initializers) {
  for (const auto& input : graph.input()) {
    if (initializers.count(input.name())) continue;
    g.values[input.name()] = input_value(input);
    g.inputs.push_back(input.name());
    const int type = input.type().tensor_type().elem_type();
    g.values[input.name()].onnx_type = type;
    if (integer_input(type)) {
      g.integer_inputs.insert(input.name());
      if (type == onnx::TensorProto::INT64)
        g.notes.push_back("input '" + input.name() + "' (int64) is taken as i32: values outside int32 are refused");
    }
    if (type == onnx::TensorProto::DOUBLE)
      g.notes.push_back("input '" + input.name() + "' (float64) is taken as float32");
  }
  for (const auto& [name, _] : options.shapes)
    if (std::find(g.inputs.begin(), g.inputs.end(), name) == g.inputs.end())
      fail(Status::InvalidArgument, "a shape is given for '" + name + "', which is not an input of the model");
  if (g.inputs.empty()) fail(Status::InvalidArgument, "the model has no inputs");
}

// Node `index` of the graph, through its handler.
void Importer::read_node(const onnx::NodeProto& p, int index) {
  Node n;
  n.name = p.name().empty() ? p.op_type() + " #" + std::to_string(index) : p.name();
  n.op = p.op_type();
  n.handler = find_handler(n.op);
  for (const auto& x : p.input()) n.inputs.push_back(x.empty() ? x : resolve(x));
  if (p.output_size() < 1) fail_node(n, "no output");
  n.output = p.output(0);
  if (n.handler->outputs == 2 && p.output_size() > 1) n.output2 = p.output(1);
  if (g.values.count(n.output)) fail_node(n, "output '" + n.output + "' is defined twice");
  if (to_host(p, n)) return;
  if (!n.handler->expand) {
    emit(std::move(n), p);
    return;
  }
  check_opset(n);
  if (n.handler->read) n.attrs = n.handler->read(Attrs{p});
  n.handler->expand(*this, n, p);
}

// Other outputs of a node (MaxPool's indices, Dropout's mask) must be
// unused; Split's are its parts, TopK's second its indices.
void Importer::check_outputs(const onnx::GraphProto& graph) {
  std::set<std::string> produced;
  for (int i = 0; i < graph.node_size(); ++i) {
    const auto& node = graph.node(i);
    const int first = find_handler(node.op_type())->outputs;
    for (int o = first; first > 0 && o < node.output_size(); ++o)
      if (!node.output(o).empty()) produced.insert(node.output(o));
  }
  auto check_used = [&](const std::string& v, const std::string& by) {
    if (produced.count(v))
      fail(Status::Unsupported,
           "'" + v + "', a second output of its node, is used by " + by + "; the compiler supports only first outputs");
  };
  for (const auto& n : g.nodes)
    for (const auto& x : n.inputs) check_used(x, "node '" + n.name + "'");
  if (!host.nodes.empty()) return finish_host_stage(graph);
  for (const auto& o : graph.output()) {
    check_used(o.name(), "the graph's outputs");
    const std::string v = resolve(o.name());
    if (!g.values.count(v)) fail(Status::InvalidArgument, "output '" + o.name() + "' is not produced by any node");
    g.outputs.emplace_back(o.name(), v);
  }
}

void Importer::import(const onnx::ModelProto& model) {
  for (const auto& o : model.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") g.opset = static_cast<int>(o.version());
  const auto& graph = model.graph();
  check_ops(graph);
  const std::uint64_t own = read_initializers(graph);
  std::set<std::string> initializers;
  for (const auto& t : graph.initializer()) initializers.insert(t.name());
  constant_limit = options.max_constant_bytes ? options.max_constant_bytes : std::max(kDefaultMaxConstantBytes, own);
  read_inputs(graph, initializers);
  for (int i = 0; i < graph.node_size(); ++i) read_node(graph.node(i), i);
  check_outputs(graph);
}

const Value& Graph::value(const std::string& name) const {
  auto it = values.find(name);
  if (it == values.end()) throw Error(Status::Internal, "compiler: no value '" + name + "'");
  return it->second;
}

Graph import_onnx(std::span<const std::byte> bytes, const CompileOptions& options, std::string_view name,
                  const std::filesystem::path& external_dir, std::int64_t batch) {
  onnx::ModelProto model;
  if (bytes.size() > static_cast<std::size_t>(INT32_MAX))
    throw Error(Status::InvalidArgument,
                std::string(name) + ": the ONNX model is " + std::to_string(bytes.size()) +
                    " bytes; protobuf cannot parse a model over 2 GiB. Save it with its weights as external data "
                    "(onnx.save_model(model, path, save_as_external_data=True); PyTorch's exporter does so for "
                    "models over 2 GB) and compile the .onnx file by its path");
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    throw Error(Status::InvalidArgument, std::string(name) + ": not an ONNX model (it does not parse as a ModelProto)");
  Importer im{std::string(name), options, external_dir};
  im.batch = batch;
  im.import(model);
  finish_qdq(im);
  fold_scales(im);
  fold_batch_norm(im);
  fuse_residual_adds(im);
  fuse_matmul_bias(im);
  fuse_activations(im);
  fuse_gated(im);
  add_detect(im);
  return std::move(im.g);
}

}  // namespace tpuhal::rt::detail
