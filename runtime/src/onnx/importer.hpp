// ONNX in: what every op handler (handler.hpp) uses to check its node's
// inputs, infer its output and fold constants, and the import itself: parse,
// list unsupported ops, read the initializers and inputs, and run each
// node's handler in order (importer.cpp); the initializers' and Constant
// nodes' data, including external data files (constants.cpp).
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "beneath.hpp"
#include "ir.hpp"
#include "onnx/handler.hpp"
#include "tpuhal/error.hpp"

namespace tpuhal::rt::detail {

// "[1, 3, 224, 224]"
std::string dims_text(const std::vector<std::int64_t>& s);

// A constant from values (held as floats, and as integers when `integer`).
Value make_constant(std::vector<std::int64_t> shape, const std::vector<double>& values, bool integer);
// Whether a constant holds integers (an empty one counts as either).
bool is_integer(const Value& v);
// A constant's values, as doubles.
std::vector<double> values_of(const Value& v);
// Element `i` of a constant, without copying the rest.
inline double value_at(const Value& v, std::size_t i) {
  return v.ints.empty() ? static_cast<double>((*v.data)[i]) : static_cast<double>(v.ints[i]);
}
// The flat position in a tensor of shape `s` of the element broadcast to
// flat position `flat` of `shape`.
std::size_t broadcast_index(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& s,
                            std::uint64_t flat);

// An external data file, opened once however many tensors it holds.
struct ExternalFile {
  UniqueFd fd;
  std::uint64_t size = 0;
};

struct Importer {
  Importer(std::string name, const CompileOptions& compile_options, std::filesystem::path data_dir)
      : model_name(std::move(name)), options(compile_options), external_dir(std::move(data_dir)) {}

  std::string model_name;
  const CompileOptions& options;
  std::filesystem::path external_dir;  // empty: external data is refused
  Graph g;
  std::map<std::string, std::string> alias;  // Identity / Dropout outputs -> their input
  std::uint64_t constant_limit = 0;          // bytes: the largest constant folding may make
  std::int64_t batch = 0;                    // above 0: every input's first dimension (import_onnx)

  // Errors: "MODEL: what"; a node's: "MODEL: node 'N' (OP): what".
  [[noreturn]] void fail(Status s, const std::string& what) const { throw Error(s, model_name + ": " + what); }
  [[noreturn]] void fail_node(const Node& n, const std::string& what) const {
    fail(Status::InvalidArgument, "node '" + n.name + "' (" + n.op + "): " + what);
  }
  [[noreturn]] void unsupported(const Node& n, const std::string& what) const {
    fail(Status::Unsupported, "node '" + n.name + "' (" + n.op + "): " + what);
  }
  // A constant that folding node `n` would make, of `shape`, must fit
  // constant_limit as float32: checked before any memory is taken for it.
  void check_folded(const Node& n, const std::vector<std::int64_t>& shape) const;

  // Node inputs: input `i` (it must be given and defined before), as a
  // constant (else Unsupported, naming `what`), and whether it is given.
  const Value& in(const Node& n, std::size_t i) const;
  const Value& constant(const Node& n, std::size_t i, const char* what) const;
  bool has(const Node& n, std::size_t i) const { return i < n.inputs.size() && !n.inputs[i].empty(); }
  // Every given input of `n` is a constant.
  bool constant_inputs(const Node& n) const;
  // Two shapes broadcast (numpy's rules), or the node is refused.
  std::vector<std::int64_t> broadcast(const Node& n, std::vector<std::int64_t> a, std::vector<std::int64_t> b) const;
  // An axis attribute or entry, made non-negative for `rank`.
  std::int64_t axis_of(const Node& n, std::int64_t axis, std::int64_t rank) const;
  // A list of integers from constant input `input` where it is given (since
  // the opset that made the attribute an input), else the attribute's value.
  std::vector<std::int64_t> int_list(const Node& n, std::size_t input, const char* what,
                                     const std::vector<std::int64_t>& attribute) const;

  // A constant's values from a TensorProto (constants.cpp).
  Value tensor_value(const onnx::TensorProto& t, const std::string& what) const;

  // Infers a node's output and keeps it, or its folded constant (its
  // handler's read, then fold or infer). Its shape must be one a compiled
  // model holds (device_graph.cpp, as the loader checks it): dimensions
  // below 2^32, fewer than 2^40 elements.
  void emit(Node n, const onnx::NodeProto& proto);
  // A node of the importer's own, standing for part of `from`: named
  // "FROM/suffix", found in the handlers by `op`. `proto` gets its op type
  // and name; add its attributes there before emitting it.
  Node derived(const Node& from, const std::string& suffix, const std::string& op, std::vector<std::string> inputs,
               std::string output, onnx::NodeProto& proto) const;
  // Emits a derived node with no attributes.
  void emit_derived(const Node& from, const std::string& suffix, const std::string& op, std::vector<std::string> inputs,
                    std::string output);
  // A constant value of the importer's own.
  std::string add_constant(const std::string& name, std::vector<std::int64_t> shape, const std::vector<double>& v,
                           bool integer);

  // The whole model (importer.cpp).
  void import(const onnx::ModelProto& model);
  // Node `index` of a graph, through its handler (or into the host stage).
  void read_node(const onnx::NodeProto& p, int index);
  // The value an Identity's output stands for (itself if none).
  std::string resolve(const std::string& v) const;
  // A folded TopK's indices (its fold returns the values).
  std::optional<Value> folded_second;

  // The host stage (host_stage.cpp): the nodes that need values known only
  // once the program has run, in order; those values; and what the nodes
  // take from before them: the device's values (the program's outputs) and
  // constants.
  struct HostStage {
    std::vector<onnx::NodeProto> nodes;
    std::set<std::string> values;
    std::vector<std::string> feeds;
    std::set<std::string> constants;
  } host;
  // Whether node `n` (of `p`) belongs in the host stage; if so, adds it.
  bool to_host(const onnx::NodeProto& p, const Node& n);
  // The model's ONNX outputs once the nodes are read: the host stage's
  // model (Graph::host_stage) where it has nodes, the program computing
  // what it takes from the device.
  void finish_host_stage(const onnx::GraphProto& graph);
  // Runs a host stage's model on its inputs' values (host_stage.cpp).
  void evaluate(const onnx::ModelProto& stage, std::vector<Value> inputs);

 private:
  Value infer(Node& n);
  // Refuses a node whose handler does not take the model's opset.
  void check_opset(const Node& n) const;
  bool folds(const OpHandler& h, const Node& n) const;
  void check_ops(const onnx::GraphProto& graph) const;
  std::uint64_t read_initializers(const onnx::GraphProto& graph);
  void read_inputs(const onnx::GraphProto& graph, const std::set<std::string>& initializers);
  Value input_value(const onnx::ValueInfoProto& input) const;
  void check_outputs(const onnx::GraphProto& graph);

  // External data (constants.cpp).
  std::string external_bytes(const onnx::TensorProto& t, const std::string& what,
                             const std::vector<std::int64_t>& shape, std::uint64_t bytes) const;
  ExternalFile open_external(const std::filesystem::path& rel, const std::string& in_file) const;
  mutable UniqueFd external_dir_fd;                            // external_dir, opened at the first use
  mutable std::map<std::string, ExternalFile> external_files;  // by location
};

}  // namespace tpuhal::rt::detail
