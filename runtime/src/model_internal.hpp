// What a loaded Model and an Instance hold, for model.cpp and the compiler
// (which runs models to calibrate and to measure the precision report).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "device_graph.hpp"
#include "tpuhal/rt/model.hpp"

namespace tpuhal::rt::detail {

// The one compute queue of a device that every model on it submits to.
struct SharedQueue {
  std::mutex mu;  // guards `queue`
  std::shared_ptr<Queue> queue;
};

struct HostStage;

struct ModelState {
  Device device;
  std::string name;
  std::vector<TensorSpec> inputs, outputs;
  std::map<std::string, std::string> meta;
  Precision precision = Precision::F32;
  DeviceGraph graph;  // the program; for a model compiled for several batch sizes, the largest batch's
  // A model compiled for batches 1 to max_batch (its inputs' and outputs'
  // first dimension): the programs for batches 1 to max_batch - 1, in
  // order. max_batch is 0 for a model of fixed shapes.
  std::vector<Stage> stages;
  std::int64_t max_batch = 0;
  Buffer weights;
  // The compute queue run() submits to: one per device, shared by every
  // model on it (boards have few hardware queues), released with the last.
  // Read it through live_queue().
  std::shared_ptr<SharedQueue> queue;
  // The host stage (onnx/host_stage.cpp), or null.
  std::shared_ptr<const HostStage> host;
};

// A model file's host stage section, checked against the program's
// outputs it takes; Unsupported in a runtime built without ONNX.
std::shared_ptr<const HostStage> decode_host_stage(std::span<const std::byte> bytes,
                                                   const std::vector<TensorSpec>& outputs, const std::string& name);
const HostStageInfo& host_stage_info(const HostStage& s);
// Evaluates the stage on the program's outputs (`specs`, at the run's
// batch, and their values).
std::vector<Result> run_host_stage(const HostStage& s, const std::vector<TensorSpec>& specs,
                                   std::vector<std::vector<float>> values, const std::string& name);

// The device's queue for a model's next submission: a queue that failed (a
// run refused by the board, an index outside its axis; a fault) is released
// and replaced by a new one, for every model on the device, so that later
// runs go on. A run in flight on the queue when another fails it fails too.
std::shared_ptr<Queue> live_queue(ModelState& m);

// One program of a model placed over an instance's arena.
struct Placed {
  const DeviceGraph* graph = nullptr;  // the model's graph, or a stage's
  std::vector<Tensor> tensors;         // graph->tensors, placed
  std::vector<Tensor> inputs, outputs;
  std::vector<Op> ops;
  Program program;        // empty where the device cannot record: ops run one by one
  bool recorded = false;  // record() has been (a stage's program, when first run)
};
// Records `p`'s program once (where the device records programs).
void record(Device& dev, Placed& p);
struct InstanceState {
  std::shared_ptr<ModelState> model;
  Buffer arena;  // planned for the largest program
  // The model's programs: for batches 1 to max_batch, in order, where it
  // has stages; else the graph's alone. back() is the graph's.
  std::vector<Placed> programs;
  Placed& largest() { return programs.back(); }
  Buffer staging_in, staging_out;
  std::vector<std::uint64_t> in_offsets, out_offsets;  // into the staging buffers
};

struct Access {
  static const ModelState& model(const Model& m) { return *m.state_; }
  static InstanceState& instance(const Instance& i) { return *i.state_; }
  static Model wrap(std::shared_ptr<ModelState> state) {
    Model m;
    m.state_ = std::move(state);
    return m;
  }
};

// Copies the whole arena of `instance` to the host (after a run).
std::vector<std::byte> read_arena(const Instance& instance);

// What Model::load checks without a device: the sections there, and the
// meta, io and graph sections decoded and checked against each other (the
// state's device, queue and weights left empty). Errors as Model::load's.
std::shared_ptr<ModelState> decode_model(const ModelFile& file, std::string_view name);
// Everything Model::load checks, on `device`, without loading: decode_model,
// then every tensor placed and every op built (the ops' own checks) over
// weights and an arena allocated there, never written. The compiler runs it
// on what it made, so that it writes no model the loader refuses.
void check_model(Device& device, const ModelFile& file, std::string_view name);

// Parses "key=value" lines.
std::map<std::string, std::string> parse_meta(std::span<const std::byte> bytes);
std::vector<std::byte> encode_meta(const std::map<std::string, std::string>& meta);

}  // namespace tpuhal::rt::detail
