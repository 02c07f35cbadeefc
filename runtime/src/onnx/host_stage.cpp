// The host stage (docs/runtime.md): where an op's output shape depends on
// values the device computes (NonZero, NonMaxSuppression, an If on a
// computed condition), that node and every node after it that needs its
// result are kept as ONNX nodes, and the runtime evaluates them on the host
// once the program has run, by folding them as the compiler folds
// constants (each op in the model's arithmetic: f32 values rounded once per
// op, integers exact). The program's outputs are the device's values the
// stage takes; the stage's outputs are the model's. tpu-mlir runs such
// layers on the CPU the same way; SOPHGO's bmodel has no other place for
// them.
#include <onnx/onnx_pb.h>

#include <algorithm>

#include "model_internal.hpp"
#include "onnx/importer.hpp"

namespace tpuhal::rt::detail {
namespace {

// The most bytes (as float32) one value of a host stage may take.
constexpr std::uint64_t kHostStageBytes = std::uint64_t{1} << 32;

// The names a node reads from outside itself: its inputs, and those its
// subgraphs (an If's branches) read from outside them.
void outer_inputs(const onnx::NodeProto& p, std::vector<std::string>& out) {
  for (const auto& x : p.input())
    if (!x.empty()) out.push_back(x);
  for (const auto& a : p.attribute()) {
    if (!a.has_g()) continue;
    std::set<std::string> inner;
    for (const auto& i : a.g().input()) inner.insert(i.name());
    for (const auto& t : a.g().initializer()) inner.insert(t.name());
    for (const auto& n : a.g().node()) {
      std::vector<std::string> reads;
      outer_inputs(n, reads);
      for (auto& r : reads)
        if (!inner.count(r)) out.push_back(r);
      for (const auto& o : n.output()) inner.insert(o);
    }
  }
}

// Renames what a node reads from outside (an Identity's output to the
// value it stands for), in its subgraphs too, but for names they define.
void rename_inputs(onnx::NodeProto& p, const Importer& im, const std::set<std::string>& inner = {}) {
  for (auto& x : *p.mutable_input())
    if (!x.empty() && !inner.count(x)) x = im.resolve(x);
  for (auto& a : *p.mutable_attribute()) {
    if (!a.has_g()) continue;
    std::set<std::string> defined = inner;
    for (const auto& i : a.g().input()) defined.insert(i.name());
    for (const auto& t : a.g().initializer()) defined.insert(t.name());
    for (auto& n : *a.mutable_g()->mutable_node()) {
      rename_inputs(n, im, defined);
      for (const auto& o : n.output()) defined.insert(o);
    }
    for (auto& o : *a.mutable_g()->mutable_output())
      if (!defined.count(o.name())) o.set_name(im.resolve(o.name()));
  }
}

// A constant as an initializer: int64 for integers, else float32.
onnx::TensorProto initializer(const std::string& name, const Value& v) {
  onnx::TensorProto t;
  t.set_name(name);
  for (auto d : v.shape) t.add_dims(d);
  if (is_integer(v)) {
    t.set_data_type(onnx::TensorProto::INT64);
    for (auto x : v.ints) t.add_int64_data(x);
  } else {
    t.set_data_type(onnx::TensorProto::FLOAT);
    for (auto x : *v.data) t.add_float_data(x);
  }
  return t;
}

// A host stage folds its nodes: each op (and each op of an If's branches)
// needs a fold, or to be rewritten into ops that have one.
void check_host_ops(const Importer& im, const Node& n, const onnx::NodeProto& p) {
  const OpHandler* h = find_handler(p.op_type());
  if (h && (h->fold || h->expand)) {
    for (const auto& a : p.attribute())
      if (a.has_g())
        for (const auto& inner : a.g().node()) check_host_ops(im, n, inner);
    return;
  }
  const onnx::NodeProto& first = im.host.nodes.empty() ? p : im.host.nodes.front();
  im.unsupported(n, "it needs values known only once the program has run (after " + first.op_type() + " '" +
                        first.name() +
                        "', whose output's shape depends on the device's data), so it would run "
                        "in the host stage, where " +
                        p.op_type() +
                        " has no evaluation (the host stage folds shape computations, indexing, comparisons, "
                        "element-wise arithmetic, Relu, Softmax, Gemm, RoiAlign, TopK and NonMaxSuppression; "
                        "a convolution, pooling or another activation after it needs the device)");
}

}  // namespace

bool Importer::to_host(const onnx::NodeProto& p, const Node& n) {
  std::vector<std::string> reads;
  outer_inputs(p, reads);
  bool needs_host = false;
  for (auto& r : reads) needs_host = needs_host || host.values.count(resolve(r));
  if (!needs_host && n.handler->data_dependent) {
    // Its data decides its shape: folded where it is constant, here if not.
    const std::size_t first = n.op == "If" ? 1 : p.input_size();
    for (std::size_t i = 0; i < std::min<std::size_t>(first, n.inputs.size()); ++i)
      needs_host = needs_host || (!n.inputs[i].empty() && g.values.count(n.inputs[i]) && !g.values[n.inputs[i]].data);
  }
  if (!needs_host) return false;
  check_host_ops(*this, n, p);
  if (!options.detect.head.empty() || batch > 0)
    fail(Status::Unsupported, "node '" + n.name + "' (" + n.op +
                                  ") needs values the device computes to know its "
                                  "output's shape, so it runs in a host stage after the program, which " +
                                  (batch > 0 ? "--max-batch" : "--detect") + " does not take");
  onnx::NodeProto q = p;
  q.set_name(n.name);
  rename_inputs(q, *this);
  for (const auto& r : reads) {
    const std::string v = resolve(r);
    if (host.values.count(v)) continue;
    auto it = g.values.find(v);
    if (it == g.values.end()) fail_node(n, "input '" + r + "' is not produced before it (the graph must be sorted)");
    if (it->second.data) {
      if (it->second.quantized || it->second.int8_type)
        unsupported(n, "it takes the 8-bit constant '" + v + "' in the host stage");
      host.constants.insert(v);
    } else if (std::find(host.feeds.begin(), host.feeds.end(), v) == host.feeds.end()) {
      host.feeds.push_back(v);
    }
  }
  for (const auto& o : p.output())
    if (!o.empty()) host.values.insert(o);
  host.nodes.push_back(std::move(q));
  return true;
}

void Importer::finish_host_stage(const onnx::GraphProto& graph) {
  auto stage = std::make_shared<onnx::ModelProto>();
  stage->set_ir_version(onnx::IR_VERSION);
  auto* opset = stage->add_opset_import();
  opset->set_domain("");
  opset->set_version(g.opset);
  auto* sg = stage->mutable_graph();
  sg->set_name("host stage");
  const std::string first = host.nodes.front().name() + "' (" + host.nodes.front().op_type() + ")";
  for (auto& n : host.nodes) *sg->add_node() = std::move(n);
  for (const auto& o : graph.output()) {
    const std::string v = resolve(o.name());
    const auto it = g.values.find(v);
    if (!host.values.count(v) && it == g.values.end())
      fail(Status::InvalidArgument, "output '" + o.name() + "' is not produced by any node");
    if (it != g.values.end() && it->second.data) host.constants.insert(v);
    if (it != g.values.end() && !it->second.data &&
        std::find(host.feeds.begin(), host.feeds.end(), v) == host.feeds.end())
      host.feeds.push_back(v);  // computed by the program, passed through
    if (v != o.name()) {        // an output named by an Identity
      auto* id = sg->add_node();
      id->set_op_type("Identity");
      id->set_name("output '" + o.name() + "'");
      id->add_input(v);
      id->add_output(o.name());
    }
    sg->add_output()->set_name(o.name());
  }
  for (const auto& c : host.constants) *sg->add_initializer() = initializer(c, g.values[c]);
  if (host.feeds.empty())
    fail(Status::Unsupported, "its outputs depend on no value the device computes; nothing is left to compile");
  g.outputs.clear();
  for (const auto& f : host.feeds) {
    auto* in = sg->add_input();
    in->set_name(f);
    in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    g.outputs.emplace_back(f, f);
  }
  std::map<std::string, int> ops;
  for (const auto& n : sg->node()) ++ops[n.op_type()];
  std::string list;
  for (const auto& [op, count] : ops) list += (list.empty() ? "" : ", ") + std::to_string(count) + " " + op;
  g.notes.push_back("host stage: " + std::to_string(sg->node_size()) + " nodes from '" + first + " on (" + list +
                    ") run on the host after the program, on " + std::to_string(host.feeds.size()) + " of its outputs");
  g.host_stage = std::move(stage);
}

void Importer::evaluate(const onnx::ModelProto& stage, std::vector<Value> inputs) {
  for (const auto& o : stage.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") g.opset = static_cast<int>(o.version());
  const auto& graph = stage.graph();
  check_ops(graph);
  read_initializers(graph);
  constant_limit = kHostStageBytes;
  for (int i = 0; i < graph.input_size(); ++i) g.values[graph.input(i).name()] = std::move(inputs[i]);
  for (int i = 0; i < graph.node_size(); ++i) {
    read_node(graph.node(i), i);
    if (!g.nodes.empty())
      fail(Status::Unsupported, "host stage: node '" + g.nodes.back().name + "' (" + g.nodes.back().op +
                                    ") has no host evaluation; it runs only on the device");
  }
}

// ---- The runtime's side ------------------------------------------------------

struct HostStage {
  onnx::ModelProto model;
  HostStageInfo info;
};

std::shared_ptr<const HostStage> decode_host_stage(std::span<const std::byte> bytes,
                                                   const std::vector<TensorSpec>& outputs, const std::string& name) {
  auto s = std::make_shared<HostStage>();
  auto damaged = [&](const std::string& why) {
    return Error(Status::InvalidArgument, name + ": the host stage section is damaged: " + why);
  };
  if (bytes.size() > 0x7fffffff || !s->model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    throw damaged("it does not parse as an ONNX model");
  const auto& g = s->model.graph();
  if (g.input_size() != static_cast<int>(outputs.size()))
    throw damaged("it takes " + std::to_string(g.input_size()) + " values; the program has " +
                  std::to_string(outputs.size()) + " outputs");
  for (int i = 0; i < g.input_size(); ++i)
    if (g.input(i).name() != outputs[static_cast<std::size_t>(i)].name)
      throw damaged("its input " + std::to_string(i) + " is not the program's output '" +
                    outputs[static_cast<std::size_t>(i)].name + "'");
  for (const auto& o : g.output()) s->info.outputs.push_back(o.name());
  for (const auto& n : g.node()) ++s->info.ops[n.op_type()];
  s->info.nodes = static_cast<std::size_t>(g.node_size());
  return s;
}

const HostStageInfo& host_stage_info(const HostStage& s) { return s.info; }

std::vector<Result> run_host_stage(const HostStage& s, const std::vector<TensorSpec>& specs,
                                   std::vector<std::vector<float>> values, const std::string& name) {
  const auto& g = s.model.graph();
  std::vector<Value> inputs;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    Value v;
    v.shape = specs[i].shape;
    if (g.input(static_cast<int>(i)).type().tensor_type().elem_type() == onnx::TensorProto::INT64)
      v.ints.assign(values[i].begin(), values[i].end());
    v.data = std::move(values[i]);
    inputs.push_back(std::move(v));
  }
  const CompileOptions options;
  Importer im{name, options, {}};
  im.evaluate(s.model, std::move(inputs));
  std::vector<Result> out;
  for (const auto& o : g.output()) {
    const Value& v = im.g.value(im.resolve(o.name()));
    Result r;
    r.name = o.name();
    r.shape = v.shape;
    r.integer = is_integer(v);
    if (r.integer)
      r.ints = v.ints;
    else
      r.floats = *v.data;  // a value may be an output twice: copied
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace tpuhal::rt::detail
