// The driver interface on the CUDA driver API: the device (the GPU's primary
// context, its queue slots, the streams released queues leave running) and
// the "cuda" provider. Its memory is in memory.cpp, its programs in
// program.cpp, its queues in queue.cpp; device_impl.h declares them.
#include <spdlog/spdlog.h>

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "device_impl.h"
#include "tpuhal/base/log.h"
#include "tpuhal/base/units.h"

namespace tpuhal::cuda {

using base::format_bytes;

const std::shared_ptr<spdlog::logger>& log() {
  static const auto l = base::logger("cuda");
  return l;
}

namespace {

// The GPU's UUID as nvidia-smi prints it: "GPU-" and 8-4-4-4-12 hex digits.
std::string uuid_text(const Api& api, CUdevice dev) {
  CUuuid u{};
  if (api.cuDeviceGetUuid(&u, dev) != CUDA_SUCCESS) return {};
  static const char* digits = "0123456789abcdef";
  std::string s = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    const auto b = static_cast<unsigned char>(u.bytes[i]);
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

std::uint16_t pci_device_id(const std::string& bus_id) {
  // The PCI ID is not a CUDA attribute; sysfs has it.
  std::string lower = bus_id;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::ifstream f("/sys/bus/pci/devices/" + lower + "/device");
  std::string text;
  if (!(f >> text) || text.size() < 3) return 0;
  unsigned v = 0;
  std::from_chars(text.data() + 2, text.data() + text.size(), v, 16);
  return static_cast<std::uint16_t>(v);
}

}  // namespace

CudaDevice::CudaDevice(const Api& api, std::string uri, int ordinal) : api_(api), ordinal_(ordinal) {
  check(api_, api_.cuDeviceGet(&dev_, ordinal), uri + ": cuDeviceGet");
  char name[256] = {};
  check(api_, api_.cuDeviceGetName(name, sizeof name - 1, dev_), uri + ": cuDeviceGetName");
  std::size_t total = 0;
  check(api_, api_.cuDeviceTotalMem(&total, dev_), uri + ": cuDeviceTotalMem");
  auto attribute = [&](CUdevice_attribute a) {
    int v = 0;
    return api_.cuDeviceGetAttribute(&v, a, dev_) == CUDA_SUCCESS ? v : 0;
  };
  char bus[32] = {};
  if (api_.cuDeviceGetPCIBusId(bus, sizeof bus - 1, dev_) != CUDA_SUCCESS) bus[0] = 0;

  props_.uri = std::move(uri);
  props_.driver = "cuda";
  props_.board = name;
  props_.bus = bus[0] ? std::string("pcie ") + bus : "pcie";
  props_.serial = uuid_text(api_, dev_);
  props_.firmware_version = version_text(api_.driver_version);
  props_.interface_version = "CUDA driver API " + version_text(kPinnedVersion);
  props_.pci_vendor = 0x10de;
  props_.pci_device = bus[0] ? pci_device_id(bus) : 0;
  props_.memory_bytes = total;
  props_.min_alignment = kMinAlignment;
  props_.engines = {{Engine::Compute, kComputeQueues}, {Engine::Copy, kCopyQueues}};
  props_.caps.import_host_memory = attribute(CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED) != 0;
  props_.caps.wait_value = attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS) != 0;
  if (!attribute(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING) || !attribute(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY))
    throw Error(Status::Unsupported, props_.uri + ": " + props_.board +
                                         " lacks unified addressing or mapped host memory, which the shim needs");
  if (!props_.caps.wait_value)
    throw Error(Status::Unsupported, props_.uri + ": " + props_.board +
                                         " lacks 64-bit stream memory operations, which the shim's fences need");

  check(api_, api_.cuDevicePrimaryCtxRetain(&ctx_, dev_), props_.uri + ": cuDevicePrimaryCtxRetain");
  try {
    heap_ = std::make_unique<DeviceHeap>(api_, ctx_, ordinal_, total);
  } catch (...) {
    api_.cuDevicePrimaryCtxRelease(dev_);
    throw;
  }
  props_.heaps = {HeapInfo{"device", Memory::Device, heap_->base(), heap_->size(), true}};
  // The board clock: without its kernels the device works, untimed.
  // TPUHAL_CUDA_TIMESTAMPS=0 leaves them out on purpose: each submission
  // is then a kernel launch cheaper (docs/cuda.md, Timestamps).
  const char* env = std::getenv("TPUHAL_CUDA_TIMESTAMPS");
  const std::string_view mode = env ? env : "";
  if (!mode.empty() && mode != "0" && mode != "1")
    log()->warn("{}: TPUHAL_CUDA_TIMESTAMPS={} is neither 0 nor 1; taken as 1", props_.uri, mode);
  if (mode == "0") {
    log()->info("{}: no timestamps (TPUHAL_CUDA_TIMESTAMPS=0)", props_.uri);
  } else {
    std::string why;
    try {
      ScopedContext scope(api_, ctx_);
      clock_ = Clock::load(api_, &why);
    } catch (const Error& e) {
      why = e.what();
    }
    if (!clock_) log()->warn("{}: no timestamps: the clock kernels did not load: {}", props_.uri, why);
  }
  props_.caps.timestamps = clock_ != nullptr;
  load_kernels();
  for (std::uint32_t i = 0; i < kComputeQueues; ++i) slots_.push_back({Engine::Compute, i});
  for (std::uint32_t i = 0; i < kCopyQueues; ++i) slots_.push_back({Engine::Copy, kComputeQueues + i});
  log()->info("{}: {} ({}), {} of memory, CUDA driver {}", props_.uri, props_.board, props_.bus, format_bytes(total),
              props_.firmware_version);
}

CudaDevice::~CudaDevice() {
  // Released streams still running: give them a moment, then leave them
  // (and the memory their work may touch) rather than free it under them.
  std::vector<std::function<void()>> frees;
  Keep drop;
  for (int i = 0; i < 1000; ++i) {
    {
      std::lock_guard lock(queues_mu_);
      reap_locked(frees, drop);
      if (retired_.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (auto& f : frees) f();
  drop.clear();  // timeline words: freed while the context is still retained
  std::lock_guard lock(queues_mu_);
  if (!retired_.empty()) {
    log()->error("{}: {} released stream(s) never went idle; their memory and the context are left allocated", uri(),
                 retired_.size());
    // What those streams may still touch stays, reachable, for the life of
    // the process.
    static std::mutex abandoned_mu;
    static auto* abandoned = new std::vector<std::shared_ptr<void>>;
    std::lock_guard a(abandoned_mu);
    abandoned->push_back(std::shared_ptr<void>(heap_.release(), [](void*) {}));
    abandoned->push_back(std::shared_ptr<void>(clock_.release(), [](void*) {}));
    abandoned->push_back(std::shared_ptr<void>(kernels_.release(), [](void*) {}));
    abandoned->push_back(std::shared_ptr<void>(blas_.release(), [](void*) {}));
    abandoned->push_back(std::make_shared<std::vector<Retired>>(std::move(retired_)));
    return;
  }
  heap_.reset();
  try {
    ScopedContext scope(api_, ctx_);
    clock_.reset();
    blas_.reset();
    kernels_.reset();
  } catch (const Error& e) {
    log()->error("{}: unloading the clock kernels: {}", uri(), e.what());
    (void)clock_.release();  // no context to unload them in: left with it
    (void)kernels_.release();
    (void)blas_.release();
  }
  api_.cuDevicePrimaryCtxRelease(dev_);
}

// The tensor-op kernels (ops.h): without them the device works, with no
// caps.tensor; TPUHAL_CUDA_TENSOR=0 leaves them out on purpose.
void CudaDevice::load_kernels() {
  const char* env = std::getenv("TPUHAL_CUDA_TENSOR");
  if (env && std::string_view(env) == "0") {
    tensor_why_ = "TPUHAL_CUDA_TENSOR=0";
  } else {
    try {
      ScopedContext scope(api_, ctx_);
      kernels_ = Kernels::load(api_, &tensor_why_);
    } catch (const Error& e) {
      tensor_why_ = e.what();
    }
  }
  if (!kernels_) {
    log()->info("{}: no tensor ops: {}", props_.uri, tensor_why_);
    return;
  }
  props_.caps.tensor = true;
  props_.dtypes = {DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32};
  set_peaks();
  std::string why;
  try {
    ScopedContext scope(api_, ctx_);
    blas_ = Blas::load(&why);
  } catch (const Error& e) {
    why = e.what();
  }
  if (blas_)
    log()->info("{}: float matrix products on {}", props_.uri, blas_->describe());
  else
    log()->info("{}: float matrix products on the shim's own kernels: {}", props_.uri, why);
}

// The dense peaks at the GPU's highest clock, from its multiprocessors and
// what one does per clock in each precision: Ampere (8.0) and Hopper (9.x)
// tensor cores, f32 on the CUDA cores. Other GPUs report no peaks.
void CudaDevice::set_peaks() {
  auto attribute = [&](CUdevice_attribute a) {
    int v = 0;
    return api_.cuDeviceGetAttribute(&v, a, dev_) == CUDA_SUCCESS ? v : 0;
  };
  const int major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  const int minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  const double sms = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  const double ghz = attribute(CU_DEVICE_ATTRIBUTE_CLOCK_RATE) / 1e6;  // kHz
  double f16 = 0, f32 = 0;                                             // per multiprocessor per clock
  if (major == 9) {
    f16 = 4096;
    f32 = 256;
  } else if (major == 8 && minor == 0) {
    f16 = 2048;
    f32 = 128;
  }
  props_.tensor_cores = static_cast<std::uint32_t>(sms) * 4;
  props_.peak_fp16_tflops = sms * ghz * f16 / 1e3;
  props_.peak_int8_tops = 2 * props_.peak_fp16_tflops;
  props_.peak_fp32_tflops = sms * ghz * f32 / 1e3;
}

std::string CudaDevice::refuse_op(const driver::OpDesc& op) const {
  if (!kernels_) return tensor_why_;
  return cuda::refuse_op(op);
}

void CudaDevice::reap_locked(std::vector<std::function<void()>>& frees, Keep& drop) {
  try {
    ScopedContext scope(api_, ctx_);
    for (auto it = retired_.begin(); it != retired_.end();) {
      if (api_.cuStreamQuery(it->stream) == CUDA_ERROR_NOT_READY) {
        ++it;
        continue;
      }
      api_.cuStreamDestroy(it->stream);
      drop.push_back(std::move(it->word));
      for (auto& k : it->keep) drop.push_back(std::move(k));
      it = retired_.erase(it);
    }
  } catch (const Error& e) {
    log()->error("{}: releasing streams: {}", uri(), e.what());
  }
  if (retired_.empty()) {
    for (auto& f : deferred_) frees.push_back(std::move(f));
    deferred_.clear();
  }
}

void CudaDevice::release_queue(std::uint32_t index, CUstream stream, std::shared_ptr<TimelineWord> word, Keep keep) {
  std::vector<std::function<void()>> frees;
  Keep drop;  // timeline words no stream reads any more: they go after the lock
  {
    std::lock_guard lock(queues_mu_);
    for (auto& s : slots_)
      if (s.index == index) {
        s.claimed = false;
        s.owner = nullptr;
      }
    retired_.push_back({stream, std::move(word), std::move(keep)});
    reap_locked(frees, drop);
    if (!retired_.empty())
      log()->warn(
          "{}: a released queue's stream is still running; memory freed from now on is given back once "
          "it is idle",
          uri());
  }
  for (auto& f : frees) f();
}

void CudaDevice::dispose(std::function<void()> free) {
  std::vector<std::function<void()>> frees;
  Keep drop;
  {
    std::lock_guard lock(queues_mu_);
    if (!retired_.empty()) reap_locked(frees, drop);
    if (!retired_.empty()) {
      deferred_.push_back(std::move(free));
      free = nullptr;
    }
  }
  for (auto& f : frees) f();
  if (free) free();
}

MemoryStats CudaDevice::memory_stats() const {
  MemoryStats m;
  const auto s = heap_->stats();
  m.heaps.push_back({"device", Memory::Device, s.total, s.used, s.free, s.largest_free, s.allocations, s.peak_used});
  m.device_total = s.total;
  m.device_used = s.used;
  std::lock_guard lock(stats_mu_);
  m.host_pinned_bytes = pinned_bytes_;
  m.host_pinned_allocations = pinned_allocations_;
  m.imported_bytes = imported_bytes_;
  return m;
}

DeviceStatus CudaDevice::status() const {
  DeviceStatus d;
  d.uptime_ns = base::monotonic_ns() - opened_ns_;
  std::lock_guard lock(queues_mu_);
  for (const auto& s : slots_) {
    if (s.owner) {
      d.queues.push_back(s.owner->status());
    } else {
      QueueStatus q;
      q.engine = s.engine;
      q.index = s.index;
      d.queues.push_back(q);
    }
  }
  return d;
}

std::shared_ptr<driver::QueueBackend> CudaDevice::create_queue(Engine engine, const QueueOptions& options) {
  const std::uint32_t entries = options.ring_entries ? options.ring_entries : kDefaultRingEntries;
  if (entries < kMinRingEntries || entries > kMaxRingEntries || (entries & (entries - 1)))
    throw Error(Status::InvalidArgument, uri() + ": ring_entries " + std::to_string(entries) +
                                             " must be a power of two from " + std::to_string(kMinRingEntries) +
                                             " to " + std::to_string(kMaxRingEntries));
  if (engine == Engine::Video) throw Error(Status::Unsupported, uri() + ": the board has no video queues");
  Slot* slot = nullptr;
  std::uint32_t total = 0;
  {
    std::lock_guard lock(queues_mu_);
    for (auto& s : slots_) {
      if (s.engine != engine) continue;
      ++total;
      if (!slot && !s.claimed) slot = &s;
    }
    if (!slot)
      throw Error(Status::ResourceExhausted,
                  uri() + ": all " + std::to_string(total) + " " + to_string(engine) + " queues are in use");
    slot->claimed = true;
  }
  try {
    auto q = std::make_shared<CudaQueue>(shared_from_this(), engine, slot->index, entries);
    std::lock_guard lock(queues_mu_);
    slot->owner = q.get();
    return q;
  } catch (...) {
    std::lock_guard lock(queues_mu_);
    slot->claimed = false;
    throw;
  }
}

// ---- The provider --------------------------------------------------------------

namespace {

class CudaProvider final : public driver::Provider {
 public:
  std::string_view scheme() const override { return "cuda"; }

  std::vector<DeviceInfo> enumerate() override {
    std::vector<DeviceInfo> out;
    const Api* api = load(nullptr);
    if (!api) return out;
    int count = 0;
    if (api->cuDeviceGetCount(&count) != CUDA_SUCCESS) return out;
    for (int i = 0; i < count; ++i) {
      CUdevice d = 0;
      char name[256] = {};
      std::size_t total = 0;
      if (api->cuDeviceGet(&d, i) != CUDA_SUCCESS || api->cuDeviceGetName(name, sizeof name - 1, d) != CUDA_SUCCESS ||
          api->cuDeviceTotalMem(&total, d) != CUDA_SUCCESS)
        continue;
      out.push_back({"cuda:" + std::to_string(i), "cuda", name, total});
    }
    return out;
  }

  std::shared_ptr<driver::DeviceBackend> open(std::string_view uri) override {
    const std::string_view rest = uri.substr(uri.find(':') + 1);
    int ordinal = -1;
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), ordinal);
    if (rest.empty() || ec != std::errc() || end != rest.data() + rest.size() || ordinal < 0)
      throw Error(Status::InvalidArgument,
                  "'" + std::string(uri) + "' does not name a CUDA device; CUDA URIs are cuda:N (N from 0)");
    std::string why;
    const Api* api = load(&why);
    if (!api) throw Error(Status::Unavailable, std::string(uri) + ": " + why);
    int count = 0;
    check(*api, api->cuDeviceGetCount(&count), std::string(uri) + ": cuDeviceGetCount");
    if (ordinal >= count)
      throw Error(Status::NotFound, std::string(uri) + ": no such CUDA device (" + std::to_string(count) +
                                        " found: cuda:0" + (count > 1 ? " to cuda:" + std::to_string(count - 1) : "") +
                                        ")");
    return std::make_shared<CudaDevice>(*api, std::string(uri), ordinal);
  }

  std::string unavailable_reason() const override {
    std::string why;
    return load(&why) ? std::string() : why;
  }
};

}  // namespace

std::shared_ptr<driver::Provider> make_cuda_provider() { return std::make_shared<CudaProvider>(); }

}  // namespace tpuhal::cuda
