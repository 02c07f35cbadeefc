#include "tpuhal/rt/model.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <sstream>

#include "model_internal.hpp"
#include "tpuhal/error.hpp"

namespace tpuhal::rt {

using detail::DeviceGraph;
using detail::DOp;
using detail::Storage;
using nlohmann::json;

const char* to_string(Precision p) noexcept {
  switch (p) {
    case Precision::F32: return "fp32";
    case Precision::F16: return "fp16";
    case Precision::BF16: return "bf16";
    case Precision::Int8: return "int8";
  }
  return "unknown";
}

Precision parse_precision(std::string_view text) {
  for (Precision p : {Precision::F32, Precision::F16, Precision::BF16, Precision::Int8})
    if (text == to_string(p)) return p;
  throw Error(Status::InvalidArgument,
              "unknown precision '" + std::string(text) + "'; expected fp32, fp16, bf16 or int8");
}

std::uint64_t TensorSpec::elements() const noexcept {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}
std::uint64_t TensorSpec::bytes() const noexcept { return elements() * size_of(dtype); }
std::string TensorSpec::describe() const {
  std::string s = escape_text(name) + " " + tpuhal::to_string(dtype) + "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace detail {

std::map<std::string, std::string> parse_meta(std::span<const std::byte> bytes) {
  std::map<std::string, std::string> out;
  std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

std::vector<std::byte> encode_meta(const std::map<std::string, std::string>& meta) {
  std::string s;
  for (const auto& [k, v] : meta) {
    std::string value = v;
    for (char& c : value)
      if (c == '\n' || c == '\r') c = ' ';
    s += k + "=" + value + "\n";
  }
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

namespace {

// Reads an op's attributes; a missing or mistyped one is a damaged graph.
struct OpReader {
  const DOp& op;
  std::string where;

  [[noreturn]] void fail(const std::string& what) const { throw Error(Status::InvalidArgument, where + ": " + what); }
  const json& get(const char* key) const {
    auto it = op.attrs.find(key);
    if (it == op.attrs.end()) fail(std::string("attribute '") + key + "' is missing");
    return *it;
  }
  std::int64_t integer(const char* key) const {
    const json& v = get(key);
    if (!v.is_number_integer()) fail(std::string("attribute '") + key + "' is not an integer");
    return v.get<std::int64_t>();
  }
  std::uint32_t u32(const json& v, const char* key) const {
    if (!v.is_number_unsigned() || v.get<std::uint64_t>() > 0xffffffffu)
      fail(std::string("attribute '") + key + "' holds a value that is not a 32-bit unsigned integer");
    return v.get<std::uint32_t>();
  }
  std::uint32_t u32(const char* key) const { return u32(get(key), key); }
  bool flag(const char* key) const {
    const json& v = get(key);
    if (!v.is_boolean()) fail(std::string("attribute '") + key + "' is not a boolean");
    return v.get<bool>();
  }
  float real(const char* key) const { return real(get(key), key); }
  float real(const json& v, const char* key) const {
    if (!v.is_number()) fail(std::string("attribute '") + key + "' is not a number");
    const double d = v.get<double>();
    if (std::isfinite(d) && std::abs(d) > std::numeric_limits<float>::max())
      fail(std::string("attribute '") + key + "' is beyond the range of a float");
    return static_cast<float>(d);
  }
  // An enumeration's value by its name ("add": tpuhal/op_enums.inc).
  template <class E>
  E name(const char* key) const {
    const json& v = get(key);
    if (!v.is_string()) fail(std::string("attribute '") + key + "' is not a name");
    const auto value = parse_enum<E>(v.get<std::string>());
    if (!value) fail(std::string("attribute '") + key + "' has an unknown value '" + v.get<std::string>() + "'");
    return *value;
  }
  template <std::size_t N>
  std::array<std::uint32_t, N> u32s(const char* key) const {
    const json& v = get(key);
    if (!v.is_array() || v.size() != N)
      fail(std::string("attribute '") + key + "' is not " + std::to_string(N) + " integers");
    std::array<std::uint32_t, N> out{};
    for (std::size_t i = 0; i < N; ++i) out[i] = u32(v[i], key);
    return out;
  }
  template <std::size_t N>
  std::array<float, N> reals(const char* key) const {
    const json& v = get(key);
    if (!v.is_array() || v.size() != N)
      fail(std::string("attribute '") + key + "' is not " + std::to_string(N) + " numbers");
    std::array<float, N> out{};
    for (std::size_t i = 0; i < N; ++i) out[i] = real(v[i], key);
    return out;
  }
  // A list of at most kMaxRank indices (a permutation).
  std::vector<std::size_t> indices(const char* key) const {
    const json& v = get(key);
    if (!v.is_array() || v.size() > kMaxRank) fail(std::string("attribute '") + key + "' is malformed");
    std::vector<std::size_t> out;
    for (const auto& e : v) out.push_back(u32(e, key));
    return out;
  }
  ActivationParams activation() const {
    auto it = op.attrs.find("activation");
    if (it == op.attrs.end()) return {};
    const json& a = *it;
    if (!a.is_object() || !a.contains("kind") || !a["kind"].is_string()) fail("attribute 'activation' is malformed");
    const std::string name = a["kind"].get<std::string>();
    const auto kind = parse_enum<Activation>(name);
    if (!kind) fail("unknown activation '" + name + "'");
    ActivationParams p;
    p.kind = *kind;
    if (a.contains("alpha") && a["alpha"].is_number()) p.alpha = a["alpha"].get<float>();
    if (a.contains("beta") && a["beta"].is_number()) p.beta = a["beta"].get<float>();
    return p;
  }
};

// An op's operands by role.
struct Operands {
  const DOp& op;
  const std::vector<Tensor>& t;
  const OpReader& r;
  const Tensor& operator()(const char* role) const {
    auto it = op.operands.find(role);
    if (it == op.operands.end()) r.fail(std::string("operand '") + role + "' is missing");
    return t[static_cast<std::size_t>(it->second)];
  }
  std::optional<Tensor> opt(const char* role) const {
    auto it = op.operands.find(role);
    if (it == op.operands.end()) return std::nullopt;
    return t[static_cast<std::size_t>(it->second)];
  }
};

// The builders of BUILDERS and the kinds with rules; nullopt for the others.
std::optional<Op> build_layer(const std::string& k, const OpReader& r, const Operands& in) {
#include "model_builder_ops.inc"  // matmul, conv2d, ...: the kinds with shape rules of their own
#include "model_rule_ops.inc"     // cumsum, ...: the kinds with rules
  return std::nullopt;
}

Op build_op(const DOp& op, const std::vector<Tensor>& t, const std::string& where) {
  const OpReader r{op, where};
  const Operands in{op, t, r};
  const std::string& k = op.kind;
  if (auto layer = build_layer(k, r, in)) return std::move(*layer);
  // The elementwise maps with a builder (model_map_ops.inc, generated).
  static const std::map<std::string, Op (*)(const Tensor&, const Tensor&, const Tensor&)> binary = {
#define TPUHAL_MODEL_BINARY(name) {#name, ops::name},
#define TPUHAL_MODEL_UNARY(name)
#include "model_map_ops.inc"
#undef TPUHAL_MODEL_UNARY
#undef TPUHAL_MODEL_BINARY
  };
  if (auto it = binary.find(k); it != binary.end()) return it->second(in("a"), in("b"), in("y"));
  static const std::map<std::string, Op (*)(const Tensor&, const Tensor&)> unary = {
#define TPUHAL_MODEL_BINARY(name)
#define TPUHAL_MODEL_UNARY(name) {#name, ops::name},
#include "model_map_ops.inc"
#undef TPUHAL_MODEL_UNARY
#undef TPUHAL_MODEL_BINARY
  };
  if (auto it = unary.find(k); it != unary.end()) return it->second(in("x"), in("y"));
  // A newer tpuhal may have written an op this runtime does not know.
  r.fail("unknown op '" + k + "' (this runtime is tpuhal " + std::string(tpuhal::version()) +
         "; a model compiled by a newer tpuhal needs that version's runtime)");
}

// What a message about a damaged tensor or op of `g` starts with: "NAME:
// the graph section is damaged: ", or the stage's, as decode_stages says.
std::string damaged_in(const ModelState& m, const DeviceGraph& g) {
  for (const Stage& s : m.stages)
    if (&s.graph == &g)
      return m.name + ": the stages section is damaged: the stage for batch " + std::to_string(s.batch) + ": ";
  return m.name + ": the graph section is damaged: ";
}

std::string op_where(const std::string& damaged, std::size_t i, const DOp& op) {
  return damaged + "op " + std::to_string(i) + " (" + op.kind +
         (op.node.empty() ? std::string() : ", node '" + op.node + "'") + ")";
}

// Places every tensor and builds every op over `arena`. A damaged graph that
// slipped past decode_graph's checks is refused here by the ops' own checks.
void place(const ModelState& m, const DeviceGraph& g, const Buffer& arena, std::vector<Tensor>& tensors,
           std::vector<Op>& ops) {
  tensors.clear();
  ops.clear();
  const std::string damaged = damaged_in(m, g);
  for (std::size_t i = 0; i < g.tensors.size(); ++i) {
    const auto& d = g.tensors[i];
    try {
      const Buffer& storage = d.storage == Storage::Weights ? m.weights : arena;
      if (d.strides.empty())
        tensors.emplace_back(storage, d.dtype, d.shape, d.offset);
      else
        tensors.emplace_back(storage, d.dtype, d.shape, d.strides, d.offset);
    } catch (const Error& e) {
      throw Error(Status::InvalidArgument, damaged + "tensor " + std::to_string(i) + ": " + e.what());
    }
  }
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const DOp& op = g.ops[i];
    const std::string where = op_where(damaged, i, op);
    try {
      ops.push_back(build_op(op, tensors, where).set_global(op.global));
    } catch (const Error& e) {
      if (std::string(e.what()).rfind(where, 0) == 0) throw Error(Status::InvalidArgument, e.what());
      throw Error(Status::InvalidArgument, where + ": " + e.what());
    }
  }
}

bool failed(const Queue& q) {
  try {
    q.last_fence().is_complete();
    return false;
  } catch (const Error&) {
    return true;
  }
}

// One compute queue per device for every model on it, claimed when first
// used (live_queue).
std::shared_ptr<SharedQueue> shared_queue(Device& dev) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<SharedQueue>> queues;
  std::lock_guard lock(mutex);
  if (auto q = queues[dev.uri()].lock()) return q;
  auto q = std::make_shared<SharedQueue>();
  queues[dev.uri()] = q;
  return q;
}

Buffer staging(Device& dev, std::uint64_t bytes) {
  return dev.allocate(std::max<std::uint64_t>(bytes, 64), Memory::HostPinned);
}

// The graph and every stage, smallest batch first.
std::vector<const DeviceGraph*> programs_of(const ModelState& m) {
  std::vector<const DeviceGraph*> out;
  for (const Stage& s : m.stages) out.push_back(&s.graph);
  out.push_back(&m.graph);
  return out;
}

std::uint64_t arena_of(const ModelState& m) {
  std::uint64_t bytes = 0;
  for (const DeviceGraph* g : programs_of(m)) bytes = std::max(bytes, g->arena_bytes);
  return bytes;
}

}  // namespace

void record(Device& dev, Placed& p) {
  if (p.recorded) return;
  p.recorded = true;
  try {
    p.program = dev.record([&](Batch& b) {
      for (const auto& op : p.ops) b.run(op);
    });
  } catch (const Error& e) {
    if (e.status() != Status::Unsupported) throw;
  }
}

std::shared_ptr<Queue> live_queue(ModelState& m) {
  SharedQueue& s = *m.queue;
  std::lock_guard lock(s.mu);
  if (s.queue && failed(*s.queue)) s.queue.reset();  // released (and the hardware queue reset) before the claim
  if (!s.queue) s.queue = std::make_shared<Queue>(m.device.queue(Engine::Compute));
  return s.queue;
}

std::vector<std::byte> read_arena(const Instance& instance) {
  InstanceState& s = Access::instance(instance);
  Device dev = s.model->device;
  Buffer host = staging(dev, s.arena.size());
  live_queue(*s.model)->copy(s.arena, 0, host, 0, s.arena.size()).submit().wait();
  auto view = host.map();
  return {view.begin(), view.begin() + static_cast<std::ptrdiff_t>(s.arena.size())};
}

}  // namespace detail

Model Model::load(Device& device, const std::filesystem::path& path) {
  return load(device, read_model_file(path), path.string());
}

namespace detail {

namespace {

// A model compiled for several batch sizes: every input and output has the
// largest batch as its first dimension, and there is a stage for every
// smaller batch, whose inputs and outputs are the same with its batch.
void decode_stages_of(ModelState& m, std::span<const std::byte> bytes, std::uint64_t weight_bytes) {
  auto bad = [&](const std::string& what) {
    throw Error(Status::InvalidArgument, m.name + ": the stages section is damaged: " + what);
  };
  m.stages = decode_stages(bytes, weight_bytes, m.name);
  if (m.inputs.empty() || m.inputs[0].shape.empty()) bad("the model's first input has no batch dimension");
  m.max_batch = m.inputs[0].shape[0];
  for (const auto* specs : {&m.inputs, &m.outputs})
    for (const TensorSpec& s : *specs)
      if (s.shape.empty() || s.shape[0] != m.max_batch)
        bad(s.describe() + " does not have the batch " + std::to_string(m.max_batch) + " as its first dimension");
  if (m.max_batch < 1 || static_cast<std::uint64_t>(m.max_batch) > kMaxStages ||
      m.stages.size() != static_cast<std::size_t>(m.max_batch - 1))
    bad("it has " + std::to_string(m.stages.size()) + " stages for a largest batch of " + std::to_string(m.max_batch));
  for (std::size_t i = 0; i < m.stages.size(); ++i) {
    const Stage& st = m.stages[i];
    const std::string lead = "the stage for batch " + std::to_string(st.batch) + ": ";
    if (st.batch != static_cast<std::int64_t>(i + 1))
      bad("stage " + std::to_string(i) + " is for batch " + std::to_string(st.batch) + ", not " +
          std::to_string(i + 1));
    auto check = [&](const std::vector<TensorSpec>& specs, const std::vector<std::int64_t>& ids, const char* what) {
      if (specs.size() != ids.size())
        bad(lead + "it has " + std::to_string(ids.size()) + " " + what + "s; the io section " +
            std::to_string(specs.size()));
      for (std::size_t k = 0; k < ids.size(); ++k) {
        TensorSpec want = specs[k];
        want.shape[0] = st.batch;
        const DTensor& t = st.graph.tensors[static_cast<std::size_t>(ids[k])];
        if (t.shape != want.shape || t.dtype != want.dtype)
          bad(lead + what + " " + std::to_string(k) + " is not " + want.describe());
      }
    };
    check(m.inputs, st.graph.inputs, "input");
    check(m.outputs, st.graph.outputs, "output");
  }
}

}  // namespace

std::shared_ptr<ModelState> decode_model(const ModelFile& file, std::string_view name) {
  auto m = std::make_shared<ModelState>();
  m->name = std::string(name);
  for (SectionKind kind : {SectionKind::Meta, SectionKind::Io, SectionKind::Graph, SectionKind::Weights})
    if (!file.has(kind))
      throw Error(Status::InvalidArgument, m->name + ": the " + rt::to_string(kind) + " section is missing");
  m->meta = detail::parse_meta(file.get(SectionKind::Meta));
  if (auto it = m->meta.find("precision"); it != m->meta.end()) {
    try {
      m->precision = parse_precision(it->second);
    } catch (const Error& e) {
      throw Error(Status::InvalidArgument, m->name + ": the meta section is damaged: " + e.what());
    }
  }
  detail::decode_io(file.get(SectionKind::Io), m->name, m->inputs, m->outputs);
  const auto weights = file.get(SectionKind::Weights);
  m->graph = detail::decode_graph(file.get(SectionKind::Graph), weights.size(), m->name);
  auto check_io = [&](const std::vector<TensorSpec>& specs, const std::vector<std::int64_t>& ids, const char* what) {
    if (specs.size() != ids.size())
      throw Error(Status::InvalidArgument, m->name + ": the graph section is damaged: it has " +
                                               std::to_string(ids.size()) + " " + what + "s; the io section " +
                                               std::to_string(specs.size()));
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const DTensor& t = m->graph.tensors[static_cast<std::size_t>(ids[i])];
      if (t.shape != specs[i].shape || t.dtype != specs[i].dtype)
        throw Error(Status::InvalidArgument, m->name + ": the graph section is damaged: " + what + " " +
                                                 std::to_string(i) + " does not have the " +
                                                 (t.shape != specs[i].shape ? "shape" : "dtype") + " of " +
                                                 specs[i].describe());
    }
  };
  check_io(m->inputs, m->graph.inputs, "input");
  check_io(m->outputs, m->graph.outputs, "output");
  if (file.has(SectionKind::Stages)) decode_stages_of(*m, file.get(SectionKind::Stages), weights.size());
  if (file.has(SectionKind::HostStage)) {
    if (m->max_batch > 0)
      throw Error(Status::InvalidArgument, m->name + ": a model with a host stage is compiled for one batch");
    m->host = decode_host_stage(file.get(SectionKind::HostStage), m->outputs, m->name);
  }
  return m;
}

namespace {

// A model's weights, in 64 KiB chunks of their own: a board that tracks
// which of its memory it wrote, by such chunks (the simulator's DRAM write
// log, docs/simulator.md), then sees all of them unchanged from run to
// run. An instance's arena allocated right after them shared their last
// chunk, and its writes made the last weights (MobileNetV2's classifier)
// look rewritten every run.
Buffer allocate_weights(Device& device, std::uint64_t bytes) {
  constexpr std::uint64_t kChunk = std::uint64_t{64} << 10;
  AllocOptions options;
  options.alignment = kChunk;
  return device.allocate((std::max<std::uint64_t>(bytes, 64) + kChunk - 1) / kChunk * kChunk, Memory::Device, options);
}

// Builds every op once over an arena allocated for it, so that a graph the
// ops refuse is refused before anything runs.
void build_all(Device& device, const ModelState& m) {
  Buffer arena = device.allocate(std::max<std::uint64_t>(arena_of(m), 64));
  std::vector<Tensor> tensors;
  std::vector<Op> ops;
  for (const DeviceGraph* g : programs_of(m)) place(m, *g, arena, tensors, ops);
}

}  // namespace

void check_model(Device& device, const ModelFile& file, std::string_view name) {
  auto m = decode_model(file, name);
  m->device = device;
  m->weights = allocate_weights(device, file.get(SectionKind::Weights).size());
  build_all(device, *m);
}

}  // namespace detail

Model Model::load(Device& device, const ModelFile& file, std::string_view name) {
  auto m = detail::decode_model(file, name);
  m->device = device;
  const auto weights = file.get(SectionKind::Weights);
  m->queue = detail::shared_queue(device);
  m->weights = detail::allocate_weights(device, weights.size());
  if (!weights.empty()) {
    Buffer host = detail::staging(device, weights.size());
    std::memcpy(host.map().data(), weights.data(), weights.size());
    detail::live_queue(*m)->copy(host, 0, m->weights, 0, weights.size()).submit().wait();
  }
  detail::build_all(device, *m);
  Model model;
  model.state_ = std::move(m);
  return model;
}

namespace {
const detail::ModelState& need(const std::shared_ptr<detail::ModelState>& s) {
  if (!s) throw Error(Status::FailedPrecondition, "this Model is empty (default-constructed); load one first");
  return *s;
}
}  // namespace

const std::vector<TensorSpec>& Model::inputs() const { return need(state_).inputs; }
const std::vector<TensorSpec>& Model::outputs() const { return need(state_).outputs; }
Precision Model::precision() const { return need(state_).precision; }
const std::map<std::string, std::string>& Model::meta() const { return need(state_).meta; }
std::uint64_t Model::weight_bytes() const { return need(state_).graph.weight_bytes; }
std::uint64_t Model::activation_bytes() const { return detail::arena_of(need(state_)); }
std::int64_t Model::max_batch() const { return need(state_).max_batch; }
Device Model::device() const { return need(state_).device; }
const HostStageInfo* Model::host_stage() const {
  const auto& m = need(state_);
  return m.host ? &detail::host_stage_info(*m.host) : nullptr;
}

Instance Model::instance() const {
  const auto& m = need(state_);
  auto s = std::make_shared<detail::InstanceState>();
  s->model = state_;
  Device dev = m.device;
  s->arena = dev.allocate(std::max<std::uint64_t>(detail::arena_of(m), 64));
  for (const detail::DeviceGraph* g : detail::programs_of(m)) {
    detail::Placed& p = s->programs.emplace_back();
    p.graph = g;
    detail::place(m, *g, s->arena, p.tensors, p.ops);
    for (auto id : g->inputs) p.inputs.push_back(p.tensors[static_cast<std::size_t>(id)]);
    for (auto id : g->outputs) p.outputs.push_back(p.tensors[static_cast<std::size_t>(id)]);
  }
  detail::record(dev, s->largest());  // the others when first run
  std::uint64_t in_bytes = 0, out_bytes = 0;
  for (const auto& spec : m.inputs) {
    s->in_offsets.push_back(in_bytes);
    in_bytes += detail::align64(spec.bytes());
  }
  for (const auto& spec : m.outputs) {
    s->out_offsets.push_back(out_bytes);
    out_bytes += detail::align64(spec.bytes());
  }
  s->staging_in = detail::staging(dev, in_bytes);
  s->staging_out = detail::staging(dev, out_bytes);
  Instance inst;
  inst.state_ = std::move(s);
  return inst;
}

namespace {
detail::InstanceState& need(const std::shared_ptr<detail::InstanceState>& s) {
  if (!s)
    throw Error(Status::FailedPrecondition, "this Instance is empty (default-constructed); use Model::instance()");
  return *s;
}

void record_body(const detail::Placed& p, Batch& b) {
  if (p.program.size() > 0 || p.ops.empty()) {
    if (p.program.size() > 0) b.run(p.program);
    return;
  }
  for (const auto& op : p.ops) b.run(op);
}

// The program for `batch` samples (0: the largest), refusing a batch the
// model was not compiled for.
detail::Placed& program_for(detail::InstanceState& s, std::int64_t batch) {
  const auto& m = *s.model;
  if (batch == 0 || batch == m.max_batch) return s.largest();
  if (m.max_batch == 0)
    throw Error(Status::InvalidArgument, m.name + ": a batch of " + std::to_string(batch) +
                                             " was asked for; the model was compiled for its inputs' fixed shapes "
                                             "only (compile it with a maximum batch to run others)");
  if (batch < 1 || batch > m.max_batch)
    throw Error(Status::InvalidArgument, m.name + ": a batch of " + std::to_string(batch) +
                                             " was asked for; the model runs 1 to " + std::to_string(m.max_batch) +
                                             " samples");
  return s.programs[static_cast<std::size_t>(batch - 1)];
}

// The batch a run's arrays hold, for a model compiled for several batch
// sizes: each array's bytes a whole number of its samples, 1 to max_batch,
// the same number in every array. InvalidArgument naming the array that
// does not fit.
std::int64_t batch_of(const detail::ModelState& m, std::span<const HostArray> inputs,
                      std::span<const HostArray> outputs) {
  std::int64_t batch = 0;
  std::string first;
  for (const auto& [given, specs, what] : {std::tuple{inputs, &m.inputs, "input"}, {outputs, &m.outputs, "output"}}) {
    for (std::size_t i = 0; i < specs->size() && i < given.size(); ++i) {
      const TensorSpec& spec = (*specs)[i];
      const std::uint64_t per = spec.bytes() / static_cast<std::uint64_t>(m.max_batch);
      if (per == 0) continue;  // an empty sample says nothing
      const std::string name = std::string(what) + " " + std::to_string(i) + " ('" + spec.name + "')";
      const std::uint64_t n = given[i].bytes / per;
      if (given[i].bytes % per != 0 || n < 1 || n > static_cast<std::uint64_t>(m.max_batch)) {
        TensorSpec sample = spec;
        sample.shape.erase(sample.shape.begin());
        throw Error(Status::InvalidArgument, m.name + ": " + name + " is " + std::to_string(given[i].bytes) +
                                                 " bytes; it takes 1 to " + std::to_string(m.max_batch) +
                                                 " samples of " + sample.describe().substr(sample.name.size() + 1) +
                                                 ", " + std::to_string(per) + " bytes each");
      }
      if (batch == 0) {
        batch = static_cast<std::int64_t>(n);
        first = name;
      } else if (static_cast<std::int64_t>(n) != batch) {
        throw Error(Status::InvalidArgument, m.name + ": " + first + " holds " + std::to_string(batch) +
                                                 " samples and " + name + " " + std::to_string(n) +
                                                 "; every array of a run holds the same batch");
      }
    }
  }
  return batch == 0 ? m.max_batch : batch;
}

}  // namespace

void Instance::run(std::span<const HostArray> inputs, std::span<const HostArray> outputs) {
  auto& s = need(state_);
  const auto& m = *s.model;
  const std::int64_t batch = m.max_batch > 0 ? batch_of(m, inputs, outputs) : 0;
  // A spec's bytes at the run's batch.
  auto bytes_of = [&](const TensorSpec& spec) {
    return batch == 0 ? spec.bytes() : spec.bytes() / static_cast<std::uint64_t>(m.max_batch) * batch;
  };
  auto check = [&](std::span<const HostArray> given, const std::vector<TensorSpec>& specs, const char* what) {
    if (given.size() != specs.size())
      throw Error(Status::InvalidArgument, m.name + ": " + std::to_string(given.size()) + " " + what +
                                               "s given; the model has " + std::to_string(specs.size()));
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (given[i].bytes != bytes_of(specs[i]))
        throw Error(Status::InvalidArgument, m.name + ": " + what + " " + std::to_string(i) + " ('" + specs[i].name +
                                                 "') is " + std::to_string(given[i].bytes) + " bytes; " +
                                                 specs[i].describe() + " takes " + std::to_string(specs[i].bytes()));
      if (given[i].data == nullptr && given[i].bytes > 0)
        throw Error(Status::InvalidArgument,
                    m.name + ": " + what + " " + std::to_string(i) + " ('" + specs[i].name + "') has no data");
    }
  };
  check(inputs, m.inputs, "input");
  check(outputs, m.outputs, "output");
  detail::Placed& p = program_for(s, batch);
  Device dev = m.device;
  detail::record(dev, p);
  auto in_map = s.staging_in.map();
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].bytes) std::memcpy(in_map.data() + s.in_offsets[i], inputs[i].data, inputs[i].bytes);
  const auto queue = live_queue(*s.model);
  Batch b = queue->batch();
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].bytes) b.copy(s.staging_in, s.in_offsets[i], s.arena, p.inputs[i].offset(), inputs[i].bytes);
  record_body(p, b);
  for (std::size_t i = 0; i < outputs.size(); ++i)
    if (outputs[i].bytes) b.copy(s.arena, p.outputs[i].offset(), s.staging_out, s.out_offsets[i], outputs[i].bytes);
  b.submit().wait();
  auto out_map = s.staging_out.map();
  for (std::size_t i = 0; i < outputs.size(); ++i)
    if (outputs[i].bytes) std::memcpy(outputs[i].data, out_map.data() + s.out_offsets[i], outputs[i].bytes);
}

std::vector<Result> Instance::run(std::span<const HostArray> inputs) {
  const auto& m = *need(state_).model;
  const std::int64_t batch = m.max_batch > 0 ? batch_of(m, inputs, {}) : 0;
  std::vector<TensorSpec> specs = m.outputs;
  std::vector<std::vector<float>> values;
  std::vector<HostArray> outputs;
  for (auto& spec : specs) {
    if (batch > 0 && !spec.shape.empty()) spec.shape[0] = batch;
    values.emplace_back(spec.elements());
    outputs.push_back(host(values.back()));
  }
  run(inputs, outputs);
  if (m.host) return detail::run_host_stage(*m.host, specs, std::move(values), m.name);
  std::vector<Result> out;
  for (std::size_t i = 0; i < specs.size(); ++i)
    out.push_back(Result{specs[i].name, specs[i].shape, false, std::move(values[i]), {}});
  return out;
}

const std::vector<Tensor>& Instance::input_tensors() const { return need(state_).largest().inputs; }
const std::vector<Tensor>& Instance::output_tensors() const { return need(state_).largest().outputs; }

Fence Instance::submit(Queue& queue) {
  auto& s = need(state_);
  Batch b = queue.batch();
  record_body(s.largest(), b);
  if (b.size() == 0) return queue.submit();
  return b.submit();
}

Batch& Instance::record(Batch& batch) {
  record_body(need(state_).largest(), batch);
  return batch;
}

namespace {

std::uint64_t median(std::vector<std::uint64_t> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// The op's output: "y", or top_k's indices.
std::int64_t output_of(const detail::DOp& op) {
  auto it = op.operands.find("y");
  if (it == op.operands.end()) it = op.operands.find("indices");
  return it == op.operands.end() ? -1 : it->second;
}

// Board times of each op and of each whole run (a timestamp before the
// first op and after each), and host times of plain runs.
struct Timings {
  std::vector<std::vector<std::uint64_t>> per_op;
  std::vector<std::uint64_t> device, runs;
};

Timings time_runs(detail::InstanceState& s, const detail::Placed& p, Device& dev, unsigned iterations) {
  const std::size_t n = p.ops.size();
  Buffer stamps = dev.allocate(std::max<std::uint64_t>((n + 1) * 8, 64), Memory::HostPinned);
  // One program where the device records them, else one batch per run.
  auto body = [&](Batch& b) {
    b.timestamp(stamps, 0);
    for (std::size_t i = 0; i < n; ++i) {
      b.run(p.ops[i]);
      b.timestamp(stamps, 8 * (i + 1));
    }
  };
  Program timed;
  try {
    timed = dev.record(body);
  } catch (const Error& e) {
    if (e.status() != Status::Unsupported) throw;
  }
  Timings t;
  t.per_op.resize(n);
  const auto queue = live_queue(*s.model);
  for (unsigned it = 0; it < iterations; ++it) {
    Batch b = queue->batch();
    if (timed.size() > 0)
      b.run(timed);
    else
      body(b);
    b.submit().wait();
    auto map = stamps.map();
    std::vector<std::uint64_t> ts(n + 1);
    std::memcpy(ts.data(), map.data(), (n + 1) * 8);
    for (std::size_t i = 0; i < n; ++i) t.per_op[i].push_back(ts[i + 1] >= ts[i] ? ts[i + 1] - ts[i] : 0);
    t.device.push_back(ts[n] >= ts[0] ? ts[n] - ts[0] : 0);
  }
  for (unsigned it = 0; it < iterations; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    Batch b = queue->batch();
    record_body(p, b);
    b.submit().wait();
    t.runs.push_back(static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count()));
  }
  return t;
}

// The runs kept: the middle half by their board time (at least one), so
// that a run disturbed by the host (preempted, its pages faulted) does not
// count, while each layer's time and the run's are means over the same
// runs: the layers add up to the run.
std::vector<std::size_t> middle_half(const std::vector<std::uint64_t>& device) {
  std::vector<std::size_t> order(device.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return device[a] < device[b]; });
  const std::size_t drop = device.size() / 4;
  return {order.begin() + static_cast<std::ptrdiff_t>(drop), order.end() - static_cast<std::ptrdiff_t>(drop)};
}

// The layers of a graph's first `n` ops, by node in the order each first
// runs: each op's layer, and each layer's node and its ops' kinds
// ("conv+relu"). A profile and a modelled run group their ops alike.
struct Layers {
  std::vector<std::size_t> of_op;
  std::vector<std::string> node, kinds;
};

Layers layers_of(const detail::DeviceGraph& g, std::size_t n) {
  Layers r;
  std::map<std::string, std::size_t> at;
  for (std::size_t i = 0; i < n; ++i) {
    const detail::DOp& op = g.ops[i];
    auto [it, fresh] = at.try_emplace(op.node, r.node.size());
    if (fresh) {
      r.node.push_back(op.node);
      r.kinds.emplace_back();
    }
    std::string& kinds = r.kinds[it->second];
    if (("+" + kinds + "+").find("+" + op.kind + "+") == std::string::npos)
      kinds += (kinds.empty() ? "" : "+") + op.kind;
    r.of_op.push_back(it->second);
  }
  return r;
}

// The layers (layers_of): their ops, output shape, time (`mean_of` each
// op's), share, work and peak.
template <typename Mean>
void add_layers(Profile& p, const detail::DeviceGraph& g, const std::vector<Op>& ops, const Properties& props,
                const Timings& t, Mean mean_of) {
  const std::size_t n = t.per_op.size();
  const Layers layers = layers_of(g, n);
  p.layers.resize(layers.node.size());
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    p.layers[i].node = layers.node[i];
    p.layers[i].ops = layers.kinds[i];
  }
  std::vector<long double> exact(p.layers.size(), 0.0L);
  for (std::size_t i = 0; i < n; ++i) {
    const detail::DOp& op = g.ops[i];
    LayerProfile& l = p.layers[layers.of_op[i]];
    if (const auto y = output_of(op); y >= 0) {
      const auto& tensor = g.tensors.at(static_cast<std::size_t>(y));
      l.shape = TensorSpec{"", tensor.dtype, tensor.shape}.describe().substr(1);
    }
    exact[layers.of_op[i]] += mean_of(t.per_op[i]);
    const OpCost cost = ops[i].cost();  // the HAL's count, as in traces
    l.flops += cost.flops;
    l.peak = std::max(l.peak, cost.peak_rate(props));
  }
  long double total = 0;
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    p.layers[i].device_ns = static_cast<std::uint64_t>(std::llround(exact[i]));
    total += exact[i];
  }
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    auto& l = p.layers[i];
    l.share = total > 0 ? static_cast<double>(exact[i] / total) : 0.0;
    l.achieved = l.device_ns ? l.flops / (static_cast<double>(l.device_ns) * 1e-9) : 0.0;
  }
}

}  // namespace

Profile Instance::profile(unsigned iterations, std::int64_t batch) {
  auto& s = need(state_);
  const auto& m = *s.model;
  detail::Placed& placed = program_for(s, batch);
  Device dev = m.device;
  detail::record(dev, placed);
  const Properties props = dev.properties();
  if (!props.caps.timestamps)
    throw Error(Status::Unsupported,
                m.name + ": " + dev.uri() + " keeps no board timestamps, which a profile is measured with");
  iterations = std::max(1u, iterations);
  const Timings t = time_runs(s, placed, dev, iterations);
  const std::vector<std::size_t> kept = middle_half(t.device);
  auto mean_of = [&](const std::vector<std::uint64_t>& v) {
    long double sum = 0;
    for (std::size_t i : kept) sum += static_cast<long double>(v[i]);
    return sum / static_cast<long double>(kept.size());
  };
  Profile p;
  p.iterations = iterations;
  p.runs_kept = static_cast<unsigned>(kept.size());
  p.device_ns = static_cast<std::uint64_t>(std::llround(mean_of(t.device)));
  p.run_ns = median(t.runs);
  p.modelled = props.caps.modelled_time;
  p.host_overhead_ns = !p.modelled && p.run_ns > p.device_ns ? p.run_ns - p.device_ns : 0;
  add_layers(p, *placed.graph, placed.ops, props, t, mean_of);
  if (const auto run = modelled(batch))
    for (std::size_t i = 0; i < p.layers.size() && i < run->layers.size(); ++i)
      p.layers[i].bound = to_string(run->layers[i].bound);
  return p;
}

std::optional<ModelledRun> Instance::modelled(std::int64_t batch) const {
  auto& s = need(state_);
  const auto& m = *s.model;
  const detail::Placed& placed = program_for(s, batch);
  const Device& dev = m.device;
  ModelledRun r;
  const Layers layers = layers_of(*placed.graph, placed.ops.size());
  r.layers.resize(layers.node.size());
  for (std::size_t i = 0; i < r.layers.size(); ++i) {
    r.layers[i].node = layers.node[i];
    r.layers[i].ops = layers.kinds[i];
  }
  std::vector<std::uint64_t> longest(r.layers.size(), 0);
  for (std::size_t i = 0; i < placed.ops.size(); ++i) {
    const auto t = dev.modelled(placed.ops[i]);
    if (!t) return std::nullopt;
    const std::size_t at = layers.of_op[i];
    ModelledLayer& l = r.layers[at];
    l.ns += t->ns;
    l.compute_ns += t->compute_ns;
    l.memory_ns += t->memory_ns;
    l.overhead_ns += t->overhead_ns;
    if (t->ns >= longest[at]) {
      longest[at] = t->ns;
      l.bound = t->bound;
    }
    r.ns += t->ns;
  }
  for (const Tensor& in : placed.inputs)
    if (auto t = dev.modelled_copy(in.elements() * size_of(in.dtype()), Memory::HostPinned, Memory::Device))
      r.input_copy_ns += t->ns;
  for (const Tensor& out : placed.outputs)
    if (auto t = dev.modelled_copy(out.elements() * size_of(out.dtype()), Memory::Device, Memory::HostPinned))
      r.output_copy_ns += t->ns;
  return r;
}

Model Instance::model() const { return detail::Access::wrap(need(state_).model); }

}  // namespace tpuhal::rt
