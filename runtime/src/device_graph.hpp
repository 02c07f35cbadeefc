// The compiled program as the Graph and Io sections hold it
// (docs/model-format.md): tensors placed in the weights or in an instance's
// activation arena, and a list of tpuhal ops over them. The compiler fills
// one and encodes it; the loader decodes and checks it before building ops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tpuhal/rt/model.hpp"

namespace tpuhal::rt::detail {

enum class Storage : std::uint8_t { Weights, Arena };

struct DTensor {
  std::string value;  // the ONNX value it holds ("" for constants and views made by the compiler)
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  Storage storage = Storage::Arena;
  std::uint64_t offset = 0;           // bytes into the weights or the arena
  std::vector<std::int64_t> strides;  // in elements; empty: row-major
  // The compiler's own: the arena tensor whose bytes this view lies in
  // (share_arena moves them together); -1 for one that has bytes of its own.
  std::int64_t base = -1;
  std::uint64_t elements() const;
  std::uint64_t bytes() const;  // the bytes of its elements
  std::uint64_t span() const;   // from its first element to past its last (bytes() when row-major)
};

struct DOp {
  std::string kind;                              // "conv2d", "qlinear_conv", "matmul", ... (docs/model-format.md)
  std::string node;                              // the ONNX node it came from ("" for conversions)
  std::map<std::string, std::int64_t> operands;  // role ("x", "w", "y", ...) -> tensor index
  nlohmann::json attrs = nlohmann::json::object();
  bool global = false;  // the board runs it on its own, DDR to DDR (Op::set_global)
};

struct DeviceGraph {
  std::vector<DTensor> tensors;
  std::vector<DOp> ops;
  std::vector<std::int64_t> inputs;   // f32 arena tensors, in Io order
  std::vector<std::int64_t> outputs;  // f32 arena tensors, in Io order
  std::uint64_t arena_bytes = 0;
  std::uint64_t weight_bytes = 0;

  // Adds a tensor placed at the end of the arena (64-byte aligned).
  std::int64_t add_arena(std::string value, DType dtype, std::vector<std::int64_t> shape);
  // A view of tensor `of` with another shape (same bytes).
  std::int64_t add_view(std::int64_t of, std::vector<std::int64_t> shape);
  // A view of part of arena tensor `of`: `shape` and `strides` (elements,
  // empty for row-major) from `byte_offset` bytes into it.
  std::int64_t add_subview(std::int64_t of, std::vector<std::int64_t> shape, std::vector<std::int64_t> strides,
                           std::uint64_t byte_offset);

  // Lets arena tensors whose lifetimes (first to last op that uses them;
  // inputs from the start, outputs to the end) do not overlap share memory,
  // and shrinks the arena accordingly; a tensor and its views move together.
  // Returns the arena size before.
  std::uint64_t share_arena();
};

std::vector<std::byte> encode_graph(const DeviceGraph& g);
std::vector<std::byte> encode_io(const std::vector<TensorSpec>& inputs, const std::vector<TensorSpec>& outputs);

// Decoding checks structure, dtypes, shapes and that every tensor lies
// inside its storage (`weight_bytes`: the Weights section's size); errors are
// InvalidArgument "NAME: the graph section ...", naming the entry.
DeviceGraph decode_graph(std::span<const std::byte> bytes, std::uint64_t weight_bytes, std::string_view name);
void decode_io(std::span<const std::byte> bytes, std::string_view name, std::vector<TensorSpec>& inputs,
               std::vector<TensorSpec>& outputs);

// A program for a batch below the graph's (the Stages section, a model
// compiled for several batch sizes): its inputs and outputs are the
// graph's with that first dimension.
struct Stage {
  std::int64_t batch = 0;
  DeviceGraph graph;
};
inline constexpr std::size_t kMaxStages = 256;
std::vector<std::byte> encode_stages(const std::vector<Stage>& stages);
// Each stage's graph is checked as decode_graph checks the graph; errors
// are InvalidArgument "NAME: the stages section is damaged: the stage for
// batch B: ...". The batches themselves are the caller's to check.
std::vector<Stage> decode_stages(std::span<const std::byte> bytes, std::uint64_t weight_bytes, std::string_view name);

const char* dtype_name(DType t) noexcept;  // "f32", ...
// Text from a file made fit for a message: printable ASCII, at most 64
// characters.
std::string printable(std::string_view text);
std::uint64_t align64(std::uint64_t v) noexcept;

}  // namespace tpuhal::rt::detail
