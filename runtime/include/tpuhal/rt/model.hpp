// Compiled models on a device: load a `.tpm` file (tpuhal compile writes
// them; docs/runtime.md), then run batches through instances.
//
//   auto dev = tpuhal::open("sim:0");
//   auto model = tpuhal::rt::Model::load(dev, "net.tpm");   // weights uploaded once
//   auto inst = model.instance();                           // activations + program
//   std::vector<float> x(model.inputs()[0].elements()), y(model.outputs()[0].elements());
//   inst.run({tpuhal::rt::host(x)}, {tpuhal::rt::host(y)});
//
// A Model holds the weights in device memory and is shared by any number of
// instances; each Instance has its own activation buffers and recorded
// Program, and is used by one thread at a time. Several models and several
// instances of each may live on one device at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tpuhal/tpuhal.hpp"
#include "tpuhal/rt/model_file.hpp"

namespace tpuhal::rt {

// The precision a model was compiled for. Inputs and outputs are f32 in
// every precision; the conversion happens on the device.
enum class Precision : std::uint32_t { F32 = 0, F16 = 1, BF16 = 2, Int8 = 3 };
const char* to_string(Precision p) noexcept;  // "fp32", "fp16", "bf16", "int8"
// Parses "fp32", "fp16", "bf16", "int8"; InvalidArgument naming the text.
Precision parse_precision(std::string_view text);

// A model input or output: its ONNX name, dtype and fixed shape (the
// largest batch's, for a model with a Model::max_batch()).
struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t elements() const noexcept;
  std::uint64_t bytes() const noexcept;
  std::string describe() const;  // "input f32[8, 1, 28, 28]", the name escaped (escape_text)
};

// Host memory for one input or output, in its spec's dtype and shape.
struct HostArray {
  std::byte* data = nullptr;
  std::uint64_t bytes = 0;
};
template <typename T>
HostArray host(std::vector<T>& v) noexcept {
  return {reinterpret_cast<std::byte*>(v.data()), v.size() * sizeof(T)};
}

// One layer of a profile: the device ops the compiler made from one ONNX
// node (named as `tpuhal compile --report` names it), or its own
// conversions of inputs and outputs (node "").
struct LayerProfile {
  std::string node;
  std::string ops;              // the device ops' kinds, "conv2d" or "transpose+avg_pool2d"
  std::string shape;            // the last op's output: "f32[1, 64, 56, 56]"
  std::uint64_t device_ns = 0;  // mean over the runs kept of the ops' summed board time
  double share = 0;             // of the sum of every layer's device_ns
  double flops = 0;             // operations per run (a multiply-add counts 2)
  double achieved = 0;          // flops per second of device time
  double peak = 0;              // the board's peak for the ops' precision, per second (0: unknown)
  // What bounds the layer in the board's timing model (its longest op's
  // bound: "compute", "memory" or "overhead"); empty where the device has
  // no timing model (Device::modelled).
  std::string bound;
};

// One run of a model in the board's timing model (Instance::modelled,
// docs/timing.md): computed from the ops alone, nothing runs.
struct ModelledLayer {
  std::string node;  // as LayerProfile names it
  std::string ops;
  std::uint64_t ns = 0;  // the layer's ops, each max(compute, memory) + overhead
  std::uint64_t compute_ns = 0, memory_ns = 0, overhead_ns = 0;
  ModelledTime::Bound bound = ModelledTime::Bound::Overhead;  // its longest op's
};
struct ModelledRun {
  std::vector<ModelledLayer> layers;  // in the order they run
  std::uint64_t ns = 0;               // the ops of a run, one after another (the profile's device_ns)
  std::uint64_t input_copy_ns = 0;    // the inputs from host memory to the board
  std::uint64_t output_copy_ns = 0;   // the outputs back
};

// Where a run's time goes, by the board's own clock (docs/runtime.md).
struct Profile {
  std::vector<LayerProfile> layers;  // in the order they run
  unsigned iterations = 0;
  unsigned runs_kept = 0;              // the middle half of the runs by board time, whose means these are
  std::uint64_t device_ns = 0;         // mean board time from the first op's start to the last op's end
  std::uint64_t run_ns = 0;            // median host time of submit() to the fence, without timestamps
  std::uint64_t host_overhead_ns = 0;  // run_ns - device_ns, or 0 (and 0 where modelled)
  // The board's clock is a timing model's (caps.modelled_time, a simulated
  // board; docs/timing.md): device_ns here and in the layers are modelled
  // board time, the same on every host; run_ns stays the host's.
  bool modelled = false;
};
// The profile as JSON text, the one form `tpuhal profile --json` and
// Python's Instance.profile() give: {"layers": [{"node", "ops", "output"
// (LayerProfile::shape), "device_ns", "share", "flops", "achieved_per_s",
// "peak_per_s"}, ...], "iterations", "runs_kept", "device_ns", "run_ns",
// "host_overhead_ns", "board_clock" ("modelled" or "measured")}, keys in
// that order, and where the clock is modelled, "modelled_ms" (device_ns in
// ms) at the top and in each layer; names escaped as JSON escapes them.
std::string to_json(const Profile& p);

// One ONNX output of a whole run (Instance::run(inputs)), of the shape
// this run gave it: a float output in `floats`, an integer one (ONNX
// int64, int32, bool: class labels, indices) in `ints`.
struct Result {
  std::string name;
  std::vector<std::int64_t> shape;
  bool integer = false;
  std::vector<float> floats;
  std::vector<std::int64_t> ints;
};

// A model's host stage (docs/runtime.md): the ONNX nodes from the first
// whose output's shape depends on the device's data (NonZero,
// NonMaxSuppression, an If on a computed condition) on, which the runtime
// evaluates on the host once the program has run. The program's outputs
// (Model::outputs()) are then the values the stage takes, and the stage's
// outputs the model's.
struct HostStageInfo {
  std::vector<std::string> outputs;  // the model's ONNX outputs, in order
  std::size_t nodes = 0;
  std::map<std::string, int> ops;  // ONNX op type -> nodes
};

class Instance;
namespace detail {
struct ModelState;
struct InstanceState;
struct Access;  // the compiler's view inside (calibration, the report)
}  // namespace detail

class Model {
 public:
  Model() = default;
  // Reads and checks the file (model_file.hpp's errors), then uploads the
  // weights. InvalidArgument if a section is damaged in a way the
  // container's checks cannot see (an op or tensor out of range), naming it.
  static Model load(Device& device, const std::filesystem::path& path);
  static Model load(Device& device, const ModelFile& file, std::string_view name = "compiled model");

  const std::vector<TensorSpec>& inputs() const;
  const std::vector<TensorSpec>& outputs() const;
  Precision precision() const;
  // The Meta section: producer, source, precision, calibration, ...
  const std::map<std::string, std::string>& meta() const;
  std::uint64_t weight_bytes() const;  // device memory the weights take
  // Device memory each Instance takes for its activations (tensors share it
  // where their lifetimes allow; planned for the largest batch).
  std::uint64_t activation_bytes() const;
  // A model compiled for several batch sizes (CompileOptions::max_batch)
  // runs 1 to this many samples, its inputs' and outputs' first dimension
  // (inputs() and outputs() give the largest batch's shapes); 0 for a model
  // of fixed shapes.
  std::int64_t max_batch() const;
  Device device() const;
  // The host stage, or null for a model whose program computes its outputs.
  const HostStageInfo* host_stage() const;

  // A new instance: allocates its activation buffers and records its
  // program. Throws OutOfMemory as Device::allocate does.
  Instance instance() const;

  explicit operator bool() const noexcept { return state_ != nullptr; }

 private:
  friend struct detail::Access;
  std::shared_ptr<detail::ModelState> state_;
};

class Instance {
 public:
  Instance() = default;

  // Runs one batch: copies `inputs` (in the order of Model::inputs(), each
  // exactly its spec's bytes) to the device, runs the program, copies the
  // outputs back into `outputs`, and waits. A model with a max_batch()
  // runs as many samples as the arrays hold (1 to max_batch(), the same in
  // every input and output; the specs' bytes divided by max_batch() per
  // sample) on the program for that batch. InvalidArgument naming the
  // input or output whose size is wrong; device errors as Fence::wait.
  void run(std::span<const HostArray> inputs, std::span<const HostArray> outputs);
  // The same with inputs given as const memory.
  void run(std::initializer_list<HostArray> inputs, std::initializer_list<HostArray> outputs) {
    run(std::span<const HostArray>(inputs.begin(), inputs.size()),
        std::span<const HostArray>(outputs.begin(), outputs.size()));
  }

  // Runs the whole model on `inputs` (as above): the program, then its
  // host stage where it has one, and returns every ONNX output with the
  // shape this run gave it (without a host stage: the program's outputs,
  // as floats, at the run's batch). A host stage's errors (an index out of
  // range in its data) are InvalidArgument naming the node.
  std::vector<Result> run(std::span<const HostArray> inputs);
  std::vector<Result> run(std::initializer_list<HostArray> inputs) {
    return run(std::span<const HostArray>(inputs.begin(), inputs.size()));
  }

  // Device-side use: the tensors the program reads its inputs from and
  // writes its outputs to (the largest batch's, for a model with a
  // max_batch()). Fill the inputs (copies, or a previous op on the
  // same device), then submit() on any compute queue of the model's device;
  // the outputs hold the result once its fence is reached.
  const std::vector<Tensor>& input_tensors() const;
  const std::vector<Tensor>& output_tensors() const;
  Fence submit(Queue& queue);
  // The same program appended to a batch of the caller's, after the ops
  // that fill the inputs and before those that read the outputs, so that
  // all of them go in one submission (the video pipeline does so per frame).
  Batch& record(Batch& batch);

  // Runs the program `iterations` times (at least 1) on the data in
  // input_tensors() with a board timestamp between ops, and as it runs
  // normally as many times again. Each layer's time and the run's are means
  // over the same runs, the middle half by board time, so that the layers
  // add up to the run (to within a nanosecond per layer). Unsupported
  // on a device without board timestamps (Properties::caps.timestamps).
  // `batch`: the program for that many samples of a model with a
  // max_batch() (InvalidArgument outside 1 to max_batch()), over the
  // inputs a run() of that batch left in its own tensors; 0, the largest.
  Profile profile(unsigned iterations = 10, std::int64_t batch = 0);
  // One run in the board's timing model, per layer, without running it;
  // nullopt where the device has no timing model. `batch` as profile's.
  std::optional<ModelledRun> modelled(std::int64_t batch = 0) const;

  Model model() const;
  explicit operator bool() const noexcept { return state_ != nullptr; }

 private:
  friend class Model;
  friend struct detail::Access;
  std::shared_ptr<detail::InstanceState> state_;
};

}  // namespace tpuhal::rt
