// The ONNX front end's table of op handlers: what the compiler does with
// each ONNX op, kept per op family in one file of this folder (conv.cpp,
// matmul.cpp, elementwise.cpp, ...). A handler names its ops and the opsets
// it takes, reads their attributes into a typed struct once, infers the
// output's shape (or folds the node to a constant), and lowers it onto
// tpuhal ops; a few rewrite themselves into other ONNX nodes instead
// (expand). The importer (importer.hpp), the passes (passes.hpp) and the
// lowerer (lowerer.hpp) find everything they know about an op here: the
// supported and foldable lists are this table.
//
// A new op: a handler entry in its family's file (families.inc lists the
// files), a line of the ONNX node tests, and a row of docs/runtime.md
// (docs/adding-an-op.md, step 10).
#pragma once

#include <onnx/onnx_pb.h>

#include <any>
#include <climits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir.hpp"
#include "onnx_attrs.hpp"

namespace tpuhal::rt::detail {

struct Importer;
struct Lowerer;
using onnx_attrs::Attrs;

// The opsets (of the default domain) a handler takes. A model of another
// opset is refused, for a node of this op, with "node 'N' (OP): " and
// `refusal`, in which "{opset}" stands for the model's opset.
struct OpsetRange {
  int first = 1;
  int last = INT_MAX;
  const char* refusal = nullptr;
};

// When a node is folded to a constant at compile time instead of being
// lowered.
enum class Fold {
  Never,
  Always,              // from its inputs' shapes alone (Shape)
  ConstantsOnly,       // always; every input must be a constant (shape computations)
  IfConstant,          // when every input given is a constant
  IfFirstTwoConstant,  // when inputs 0 and 1 are constants (arithmetic)
};

// Whether an activation op fuses into the Conv, Gemm or MatMul before it.
enum class Fuse {
  No,
  Always,     // also in int8, where the convolution applies it by its output's range
  FloatOnly,  // not in int8, where it stays a layer of its own
};

struct OpHandler {
  std::vector<std::string_view> ops = {};  // ONNX op types (default domain)
  OpsetRange opsets = {};
  // The node's attributes as its typed struct (Node::attrs); null: none.
  std::any (*read)(const Attrs& attributes) = nullptr;
  // The output's shape (no data) from the inputs, checking them; may
  // complete Node::attrs with what it resolves from constant inputs.
  Value (*infer)(Importer& im, Node& n) = nullptr;
  // The output as a constant (shape and data), when `folds` says.
  Value (*fold)(Importer& im, Node& n) = nullptr;
  Fold folds = Fold::Never;
  // Instead of infer: the node rewritten as other nodes (or an alias or a
  // constant), each emitted through the importer.
  void (*expand)(Importer& im, Node& n, const onnx::NodeProto& proto) = nullptr;
  // Its tpuhal ops. Null for ops that never reach the device (folded or
  // expanded).
  void (*lower)(Lowerer& l, const Node& n) = nullptr;

  // Its output's shape depends on its inputs' values (NonZero): on values
  // the device computes, it starts the host stage (Graph::host_stage).
  bool data_dependent = false;

  // What the passes need to know.
  int outputs = 1;                // outputs it defines: 1, 2 (TopK's indices), 0 for each one (Split)
  bool writes_fresh = false;      // its lowering writes a new tensor: a Concat may have it write in place
  bool takes_activation = false;  // a Conv, Gemm or MatMul: an activation after it fuses into it
  bool int8_layer = false;        // quantised in int8 (mixed precision moves these to fp16)
  // An activation op's activation, for fusing it (`fuse`) into the layer before.
  ActivationParams (*activation)(const Graph& g, const Node& n) = nullptr;
  Fuse fuse = Fuse::No;
};

// The handler of ONNX op `op` (default domain); null if none.
const OpHandler* find_handler(std::string_view op);
// Every handler, in the order families.inc lists their files.
std::span<const OpHandler* const> handlers();
// The supported ops, and those folded when their inputs are constants (or
// always), each sorted by name.
std::vector<std::string> supported_ops();
std::vector<std::string> foldable_ops();

// A handler's `read` for a struct with `static A read(const Attrs&)`.
template <typename A>
std::any read_attrs(const Attrs& a) {
  return A::read(a);
}

}  // namespace tpuhal::rt::detail
