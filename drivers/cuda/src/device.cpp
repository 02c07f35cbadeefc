// The driver interface on the CUDA driver API.
//
// Device: the GPU's primary context. Device memory: one heap, a virtual
// address range as large as the GPU's memory reserved once, carved by the
// same best-fit allocator the TPU driver uses and backed chunk by chunk with
// physical memory (cuMemCreate/cuMemMap), so heaps have a base and a size and
// out-of-memory errors say what is used and free, as on every board. Host
// memory: cuMemHostAlloc, or the caller's pages registered.
//
// Queue: a stream and a 64-bit timeline word in pinned host memory that the
// stream itself writes after each submission (cuStreamWriteValue64); a wait
// for another queue's fence is cuStreamWaitValue64 on that queue's word, so
// the host never blocks for it. The host reads the word to see completion.
// The "ring" bounds submissions in flight the way a board's ring does.
//
// Program: the commands captured from a stream into a CUDA graph, replayed
// with cuGraphLaunch.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <deque>
#include <functional>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <variant>

#include "api.h"
#include "tpuhal/base/log.h"
#include "tpuhal/base/mapping.h"
#include "tpuhal/base/range_allocator.h"
#include "tpuhal/base/units.h"
#include "tpuhal/base/wait.h"
#include "tpuhal/cuda/cuda_provider.h"

namespace tpuhal::cuda {
namespace {

using base::format_bytes;

constexpr std::uint64_t kMinAlignment = 256;
// Streams a device hands out per engine: enough for an application and a
// runtime side by side; CUDA itself has no such limit.
constexpr std::uint32_t kComputeQueues = 8;
constexpr std::uint32_t kCopyQueues = 2;
constexpr std::uint32_t kDefaultRingEntries = 1024;
constexpr std::uint32_t kMinRingEntries = 16;
constexpr std::uint32_t kMaxRingEntries = 1u << 20;

const std::shared_ptr<spdlog::logger>& log() {
  static const auto l = base::logger("cuda");
  return l;
}

class CudaDevice;
class CudaQueue;

// What a submission's stream may still read once the HAL has let go: the
// timeline words of the queues it waits on (the HAL keeps buffers and
// programs alive until it sees the work complete, but not other queues) and
// the scratch blocks of overlapping copies.
using Keep = std::vector<std::shared_ptr<const void>>;

// A queue's timeline: a 64-bit word in pinned host memory that its stream
// writes after each submission and other streams wait on. Shared by the
// queue and by every submission that waits on it, so it outlives each
// stream that may read it; it holds no reference to the device (which
// outlives it), so no cycle keeps a device open.
class TimelineWord {
 public:
  TimelineWord(const Api& api, CUcontext ctx, const std::string& what) : api_(api), ctx_(ctx) {
    ScopedContext scope(api_, ctx_);
    void* host = nullptr;
    check(api_, api_.cuMemHostAlloc(&host, 64, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP),
          what + ": the timeline word");
    host_ = static_cast<std::uint64_t*>(host);
    *host_ = 0;
    if (CUresult r = api_.cuMemHostGetDevicePointer(&address_, host, 0); r != CUDA_SUCCESS) {
      api_.cuMemFreeHost(host);
      check(api_, r, what + ": the timeline word's device address");
    }
  }
  ~TimelineWord() {
    try {
      ScopedContext scope(api_, ctx_);
      api_.cuMemFreeHost(host_);
    } catch (const Error& e) {
      log()->error("freeing a timeline word: {}", e.what());
    }
  }
  TimelineWord(const TimelineWord&) = delete;
  TimelineWord& operator=(const TimelineWord&) = delete;

  std::uint64_t read() const { return std::atomic_ref<std::uint64_t>(*host_).load(std::memory_order_acquire); }
  CUdeviceptr address() const { return address_; }

 private:
  const Api& api_;
  CUcontext ctx_;
  std::uint64_t* host_ = nullptr;
  CUdeviceptr address_ = 0;
};

// ---- Device memory: a reserved range, backed chunk by chunk ------------------

class DeviceHeap {
 public:
  DeviceHeap(const Api& api, CUcontext ctx, int ordinal, std::uint64_t memory) : api_(api), ctx_(ctx) {
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = ordinal;
    access_.location = prop_.location;
    access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ScopedContext scope(api_, ctx_);
    std::size_t g = 0;
    check(api_, api_.cuMemGetAllocationGranularity(&g, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity");
    chunk_ = std::max<std::uint64_t>(g, 4096);
    // Whole chunks, no more than the GPU has: heaps add up to at most
    // memory_bytes (an H100's 85017493504 bytes are not a multiple of 2 MiB).
    size_ = std::max(memory / chunk_, std::uint64_t{1}) * chunk_;
    check(api_, api_.cuMemAddressReserve(&base_, size_, chunk_, 0, 0), "cuMemAddressReserve");
    alloc_.emplace(base_, size_, kMinAlignment);
  }
  ~DeviceHeap() {
    ScopedContext scope(api_, ctx_);
    for (auto& [index, c] : chunks_) {
      api_.cuMemUnmap(base_ + index * chunk_, chunk_);
      api_.cuMemRelease(c.handle);
    }
    api_.cuMemAddressFree(base_, size_);
  }
  DeviceHeap(const DeviceHeap&) = delete;
  DeviceHeap& operator=(const DeviceHeap&) = delete;

  std::uint64_t base() const { return base_; }
  std::uint64_t size() const { return size_; }

  // The address of a new block; throws OutOfMemory saying what is used and
  // free (of the range, or of the GPU's memory when backing it fails).
  std::uint64_t allocate(const std::string& uri, std::uint64_t size, std::uint64_t alignment) {
    std::lock_guard lock(mu_);
    auto address = alloc_->allocate(size, alignment);
    if (!address) throw out_of_memory(uri, size, "");
    const std::uint64_t end = *address + alloc_->block_size(*address);
    const std::uint64_t first = (*address - base_) / chunk_, last = (end - 1 - base_) / chunk_;
    ScopedContext scope(api_, ctx_);
    for (std::uint64_t i = first; i <= last; ++i) {
      if (CUresult r = back(i); r != CUDA_SUCCESS) {
        for (std::uint64_t j = first; j < i; ++j) unback(j);
        alloc_->free(*address);
        if (r == CUDA_ERROR_OUT_OF_MEMORY) throw out_of_memory(uri, size, "; the GPU has no memory left to back it");
        check(api_, r, uri + ": backing device memory");
      }
    }
    return *address;
  }

  void free(std::uint64_t address) noexcept {
    std::lock_guard lock(mu_);
    const std::uint64_t size = alloc_->block_size(address);
    if (size == 0 || !alloc_->free(address)) {
      log()->error("free of unknown device address {:#x}", address);
      return;
    }
    const std::uint64_t first = (address - base_) / chunk_, last = (address + size - 1 - base_) / chunk_;
    try {
      ScopedContext scope(api_, ctx_);
      for (std::uint64_t i = first; i <= last; ++i) unback(i);
    } catch (const Error& e) {
      log()->error("freeing device memory: {}", e.what());
    }
  }

  base::RangeAllocator::Stats stats() const {
    std::lock_guard lock(mu_);
    return alloc_->stats();
  }

 private:
  struct Chunk {
    CUmemGenericAllocationHandle handle = 0;
    std::uint32_t users = 0;
  };

  CUresult back(std::uint64_t index) {
    Chunk& c = chunks_[index];
    if (c.users++ > 0) return CUDA_SUCCESS;
    const CUdeviceptr va = base_ + index * chunk_;
    CUresult r = api_.cuMemCreate(&c.handle, chunk_, &prop_, 0);
    if (r == CUDA_SUCCESS) {
      r = api_.cuMemMap(va, chunk_, 0, c.handle, 0);
      if (r == CUDA_SUCCESS) {
        r = api_.cuMemSetAccess(va, chunk_, &access_, 1);
        if (r != CUDA_SUCCESS) api_.cuMemUnmap(va, chunk_);
      }
      if (r != CUDA_SUCCESS) api_.cuMemRelease(c.handle);
    }
    if (r != CUDA_SUCCESS) chunks_.erase(index);
    return r;
  }

  void unback(std::uint64_t index) {
    auto it = chunks_.find(index);
    if (it == chunks_.end() || --it->second.users > 0) return;
    api_.cuMemUnmap(base_ + index * chunk_, chunk_);
    api_.cuMemRelease(it->second.handle);
    chunks_.erase(it);
  }

  Error out_of_memory(const std::string& uri, std::uint64_t size, const std::string& more) const {
    const auto s = alloc_->stats();
    return Error(Status::OutOfMemory, uri + ": cannot allocate " + format_bytes(size) + " (" + std::to_string(size) +
                                          " bytes) in heap 'device': " + format_bytes(s.used) + " used in " +
                                          std::to_string(s.allocations) + " allocation(s), " + format_bytes(s.free) +
                                          " free, largest free block " + format_bytes(s.largest_free) + more);
  }

  const Api& api_;
  CUcontext ctx_;
  CUmemAllocationProp prop_{};
  CUmemAccessDesc access_{};
  std::uint64_t chunk_ = 0;
  CUdeviceptr base_ = 0;
  std::uint64_t size_ = 0;
  mutable std::mutex mu_;
  std::optional<base::RangeAllocator> alloc_;
  std::unordered_map<std::uint64_t, Chunk> chunks_;
};

// ---- The device ----------------------------------------------------------------

class CudaDevice final : public driver::DeviceBackend, public std::enable_shared_from_this<CudaDevice> {
 public:
  CudaDevice(const Api& api, std::string uri, int ordinal);
  ~CudaDevice() override;

  const Properties& properties() const override { return props_; }
  MemoryStats memory_stats() const override;
  DeviceStatus status() const override;
  std::shared_ptr<driver::BufferBackend> allocate(std::uint64_t size, Memory memory,
                                                  const AllocOptions& options) override;
  std::shared_ptr<driver::BufferBackend> import_host(void* ptr, std::uint64_t size) override;
  std::shared_ptr<driver::ProgramBackend> create_program(std::span<const driver::Command> commands) override;
  std::shared_ptr<driver::QueueBackend> create_queue(Engine engine, const QueueOptions& options) override;

  const Api& api() const { return api_; }
  CUcontext context() const { return ctx_; }
  const std::string& uri() const { return props_.uri; }
  DeviceHeap& heap() { return *heap_; }

  // Host memory accounting (buffers call these as they come and go).
  void count_host(std::int64_t bytes, std::int64_t allocations, bool imported) {
    std::lock_guard lock(stats_mu_);
    (imported ? imported_bytes_ : pinned_bytes_) += static_cast<std::uint64_t>(bytes);
    if (!imported) pinned_allocations_ += static_cast<std::uint64_t>(allocations);
  }

  // A queue goes: its slot is free again. Its stream may still be running
  // work (a queue aborted or failed: CUDA cannot stop a stream), so the
  // stream and its timeline word stay until it is idle, and until then
  // memory freed on this device is not given back (dispose()): that work
  // may still touch it.
  void release_queue(std::uint32_t index, CUstream stream, std::shared_ptr<TimelineWord> word, Keep keep);

  // Runs `free` (giving memory back to CUDA) now, or once no released
  // stream is running any more.
  void dispose(std::function<void()> free);

 private:
  // Destroys released streams that are idle; once none is left, hands back
  // the frees that waited for them. Caller holds queues_mu_.
  void reap_locked(std::vector<std::function<void()>>& frees, Keep& drop);

  struct Slot {
    Engine engine;
    std::uint32_t index;
    bool claimed = false;
    CudaQueue* owner = nullptr;  // set once the queue exists
  };
  struct Retired {
    CUstream stream;
    std::shared_ptr<TimelineWord> word;
    Keep keep;
  };

  const Api& api_;
  int ordinal_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  Properties props_;
  std::uint64_t opened_ns_ = base::monotonic_ns();
  std::unique_ptr<DeviceHeap> heap_;

  mutable std::mutex stats_mu_;
  std::uint64_t pinned_bytes_ = 0, pinned_allocations_ = 0, imported_bytes_ = 0;

  mutable std::mutex queues_mu_;
  std::vector<Slot> slots_;
  std::vector<Retired> retired_;
  std::vector<std::function<void()>> deferred_;
};

// ---- Buffers -------------------------------------------------------------------

class CudaBuffer final : public driver::BufferBackend {
 public:
  enum class Kind { Device, Pinned, Imported };
  CudaBuffer(std::shared_ptr<CudaDevice> dev, Kind kind, std::uint64_t size, CUdeviceptr address, void* host)
      : dev_(std::move(dev)), kind_(kind), size_(size), address_(address), host_(host) {}
  ~CudaBuffer() override {
    dev_->dispose([dev = dev_.get(), kind = kind_, address = address_, host = host_, size = size_] {
      if (kind == Kind::Device) {
        dev->heap().free(address);
        return;
      }
      const Api& api = dev->api();
      try {
        ScopedContext scope(api, dev->context());
        const CUresult r = kind == Kind::Pinned ? api.cuMemFreeHost(host) : api.cuMemHostUnregister(host);
        if (r != CUDA_SUCCESS) log()->error("{}: freeing host memory: {}", dev->uri(), describe(api, r));
      } catch (const Error& e) {
        log()->error("{}: freeing host memory: {}", dev->uri(), e.what());
      }
      dev->count_host(-static_cast<std::int64_t>(size), -1, kind == Kind::Imported);
    });
  }

  std::uint64_t size() const override { return size_; }
  Memory memory() const override { return kind_ == Kind::Device ? Memory::Device : Memory::HostPinned; }
  const std::string& heap() const override {
    static const std::string device = "device", host;
    return kind_ == Kind::Device ? device : host;
  }
  std::uint64_t device_address() const override { return address_; }
  std::span<std::byte> map() override {
    if (kind_ == Kind::Device)
      throw Error(Status::Unsupported, dev_->uri() +
                                           ": device memory cannot be mapped on a GPU (caps.map_device_memory is "
                                           "false); copy it to Memory::HostPinned");
    return {static_cast<std::byte*>(host_), size_};
  }

 private:
  std::shared_ptr<CudaDevice> dev_;
  Kind kind_;
  std::uint64_t size_;
  CUdeviceptr address_;
  void* host_;
};

CUdeviceptr address_of(const driver::BufferRange& r) { return r.buffer->device_address() + r.offset; }

// ---- Programs ------------------------------------------------------------------

class CudaProgram final : public driver::ProgramBackend {
 public:
  // `keep`: what the graph's commands use besides the HAL's buffers (the
  // scratch blocks of overlapping copies), for as long as the graph lives.
  CudaProgram(std::shared_ptr<CudaDevice> dev, CUgraphExec exec, std::size_t size, Keep keep)
      : dev_(std::move(dev)), exec_(exec), size_(size), keep_(std::move(keep)) {}
  ~CudaProgram() override {
    dev_->dispose([dev = dev_.get(), exec = exec_, keep = std::move(keep_)] {
      try {
        ScopedContext scope(dev->api(), dev->context());
        dev->api().cuGraphExecDestroy(exec);
      } catch (const Error& e) {
        log()->error("{}: destroying a program: {}", dev->uri(), e.what());
      }
    });
  }
  std::size_t size() const override { return size_; }
  CUgraphExec exec() const { return exec_; }

 private:
  std::shared_ptr<CudaDevice> dev_;
  CUgraphExec exec_;
  std::size_t size_;
  Keep keep_;
};

// ---- Queues --------------------------------------------------------------------

class CudaQueue final : public driver::QueueBackend {
 public:
  CudaQueue(std::shared_ptr<CudaDevice> dev, Engine engine, std::uint32_t index, std::uint32_t entries)
      : dev_(std::move(dev)), api_(dev_->api()), engine_(engine), index_(index), entries_(entries) {
    word_ = std::make_shared<TimelineWord>(api_, dev_->context(), name());
    ScopedContext scope(api_, dev_->context());
    check(api_, api_.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), name() + ": cuStreamCreate");
  }
  ~CudaQueue() override {
    Keep keep;
    for (auto& f : in_flight_)
      for (auto& k : f.keep) keep.push_back(std::move(k));
    dev_->release_queue(index_, stream_, std::move(word_), std::move(keep));
  }

  Engine engine() const override { return engine_; }
  std::uint32_t index() const override { return index_; }

  std::uint64_t submit(std::span<const driver::Command> commands, std::chrono::nanoseconds max_wait) override;

  driver::Timeline timeline() const override {
    return {word_->read(),
            failed_.load(std::memory_order_acquire)};
  }
  std::uint64_t submitted() const override { return submitted_.load(std::memory_order_acquire); }
  std::uint64_t progress() const override { return timeline().completed; }
  Error failure() const override {
    std::lock_guard lock(failure_mu_);
    return failure_;
  }

  void block(std::uint64_t value, std::chrono::nanoseconds max) override {
    // CUDA's blocking waits (an event's cuEventSynchronize) take no timeout,
    // and a wait here must end; so this sleeps in short steps and asks the
    // stream for errors between them. A step is a thirty-second of the time
    // waited so far (10 us to 1 ms): a wait ends within a few per cent of
    // the work it waits for (steps doubling to 1 ms overshot a 2.5 ms copy
    // by 0.4 ms on an H100).
    const std::uint64_t start = base::monotonic_ns();
    const std::uint64_t deadline = start + static_cast<std::uint64_t>(max.count());
    for (;;) {
      const auto t = timeline();
      if (t.completed >= value || t.failed) return;
      poll_stream();
      const std::uint64_t now = base::monotonic_ns();
      if (now >= deadline) return;
      const std::uint64_t step = std::clamp<std::uint64_t>((now - start) / 32, 10'000, 1'000'000);
      std::this_thread::sleep_for(std::chrono::nanoseconds(std::min(step, deadline - now)));
    }
  }

  void abort() override {
    // A stream cannot be stopped: what it has queued runs to its end. The
    // timeline reads failed from now; memory stays allocated until the
    // stream is idle (see CudaDevice::release_queue).
    std::lock_guard lock(submit_mu_);
    if (timeline().completed < submitted())
      fail(Error(Status::FailedPrecondition, name() + ": aborted with work unfinished"));
  }

  QueueStatus status() const override {
    QueueStatus s;
    s.engine = engine_;
    s.index = index_;
    s.in_use = true;
    const auto t = timeline();
    s.submitted = submitted();
    s.completed = t.completed;
    s.failed = t.failed;
    s.busy = s.completed < s.submitted && !t.failed;
    return s;
  }

  std::string diagnose() const override {
    const auto t = timeline();
    if (t.completed >= submitted()) return {};
    return "the stream is at timeline value " + std::to_string(t.completed) + " of " + std::to_string(submitted()) +
           " submitted";
  }

  const std::shared_ptr<TimelineWord>& word() const { return word_; }

 private:
  std::string name() const { return dev_->uri() + " " + to_string(engine_) + " queue " + std::to_string(index_); }

  void fail(Error e) {
    std::lock_guard lock(failure_mu_);
    if (failed_.load(std::memory_order_relaxed)) return;
    failure_ = std::move(e);
    failed_.store(true, std::memory_order_release);
  }

  // A sticky CUDA error (a fault in earlier work) shows up only when asked.
  void poll_stream() {
    try {
      ScopedContext scope(api_, dev_->context());
      const CUresult r = api_.cuStreamQuery(stream_);
      if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY)
        fail(Error(status_of(r), name() + ": the stream failed: " + describe(api_, r)));
    } catch (const Error& e) {
      fail(e);
    }
  }

  // Drops what completed submissions kept; caller holds submit_mu_.
  void retire() {
    const std::uint64_t done = timeline().completed;
    while (!in_flight_.empty() && in_flight_.front().value <= done) {
      used_ -= in_flight_.front().entries;
      in_flight_.pop_front();
    }
  }

  void reserve(std::uint32_t n, std::chrono::nanoseconds max_wait);

  struct Submission {
    std::uint64_t value;
    std::uint32_t entries;
    Keep keep;
  };

  std::shared_ptr<CudaDevice> dev_;
  const Api& api_;
  Engine engine_;
  std::uint32_t index_;
  std::uint32_t entries_;
  CUstream stream_ = nullptr;
  std::shared_ptr<TimelineWord> word_;

  std::mutex submit_mu_;
  std::uint64_t next_value_ = 1;
  std::uint32_t used_ = 0;
  std::deque<Submission> in_flight_;
  std::atomic<std::uint64_t> submitted_{0};

  mutable std::mutex failure_mu_;
  std::atomic<bool> failed_{false};
  Error failure_{Status::Ok, ""};
};

// An overlapping copy taking more pieces than this goes through a scratch
// block instead (see copy_as_memmove).
constexpr std::uint64_t kMaxCopyPieces = 16;

// Copies `size` bytes from `src` to `dst` as memmove does. cuMemcpyAsync
// leaves overlapping ranges undefined, and on an H100 it garbles them at every
// distance from 1 byte to 1 MiB. So an overlapping copy goes in pieces no
// longer than the distance between the ranges, in the order memmove takes
// (from the end when moving up), or, where that would take more than
// kMaxCopyPieces, through a scratch block of the device heap that `keep`
// holds until the stream is past it. Without memory for the scratch block it
// goes in pieces however many: slower, never wrong.
CUresult copy_as_memmove(CudaDevice& dev, CUstream stream, CUdeviceptr dst, CUdeviceptr src, std::uint64_t size,
                         Keep& keep) {
  const Api& api = dev.api();
  const std::uint64_t distance = dst > src ? dst - src : src - dst;
  if (distance == 0 || distance >= size) return api.cuMemcpyAsync(dst, src, size, stream);
  if ((size + distance - 1) / distance > kMaxCopyPieces) {
    std::optional<CUdeviceptr> scratch;
    try {
      scratch = dev.heap().allocate(dev.uri(), size, kMinAlignment);
    } catch (const Error&) {
    }
    if (scratch) {
      keep.push_back(std::shared_ptr<const void>(reinterpret_cast<const void*>(*scratch),
                                                 [heap = &dev.heap()](const void* p) {
                                                   heap->free(reinterpret_cast<std::uint64_t>(p));
                                                 }));
      if (CUresult r = api.cuMemcpyAsync(*scratch, src, size, stream); r != CUDA_SUCCESS) return r;
      return api.cuMemcpyAsync(dst, *scratch, size, stream);
    }
  }
  if (dst > src) {
    for (std::uint64_t at = size; at > 0;) {
      const std::uint64_t n = std::min(distance, at);
      at -= n;
      if (CUresult r = api.cuMemcpyAsync(dst + at, src + at, n, stream); r != CUDA_SUCCESS) return r;
    }
  } else {
    for (std::uint64_t at = 0; at < size; at += distance) {
      const std::uint64_t n = std::min(distance, size - at);
      if (CUresult r = api.cuMemcpyAsync(dst + at, src + at, n, stream); r != CUDA_SUCCESS) return r;
    }
  }
  return CUDA_SUCCESS;
}

// Queues one command on `stream` (a queue's, or one being captured into a
// program), adding what its stream reads beyond the HAL's buffers (the
// timeline words of the queues it waits on, scratch blocks) to `keep`;
// `what` names the CUDA call.
CUresult enqueue(CudaDevice& dev, CUstream stream, const driver::Command& c, Keep& keep, std::string& what) {
  const Api& api = dev.api();
  const std::string& uri = dev.uri();
  return std::visit(
      [&](const auto& cmd) -> CUresult {
        using T = std::decay_t<decltype(cmd)>;
        if constexpr (std::is_same_v<T, driver::cmd::Copy>) {
          what = "cuMemcpyAsync";
          return copy_as_memmove(dev, stream, address_of(cmd.dst), address_of(cmd.src), cmd.size, keep);
        } else if constexpr (std::is_same_v<T, driver::cmd::Fill>) {
          const CUdeviceptr dst = address_of(cmd.dst);
          switch (cmd.pattern_bytes) {
            case 1:
              what = "cuMemsetD8Async";
              return api.cuMemsetD8Async(dst, static_cast<unsigned char>(cmd.pattern), cmd.size, stream);
            case 2:
              what = "cuMemsetD16Async";
              return api.cuMemsetD16Async(dst, static_cast<unsigned short>(cmd.pattern), cmd.size / 2, stream);
            default:
              what = "cuMemsetD32Async";
              return api.cuMemsetD32Async(dst, cmd.pattern, cmd.size / 4, stream);
          }
        } else if constexpr (std::is_same_v<T, driver::cmd::WaitFence>) {
          what = "cuStreamWaitValue64 (another queue's fence)";
          auto* other = static_cast<CudaQueue*>(cmd.queue);
          keep.push_back(other->word());
          return api.cuStreamWaitValue64(stream, other->word()->address(), cmd.value, CU_STREAM_WAIT_VALUE_GEQ);
        } else if constexpr (std::is_same_v<T, driver::cmd::WaitValue>) {
          what = "cuStreamWaitValue64";
          return api.cuStreamWaitValue64(stream, address_of(cmd.location), cmd.value, CU_STREAM_WAIT_VALUE_GEQ);
        } else if constexpr (std::is_same_v<T, driver::cmd::WriteValue>) {
          what = "cuStreamWriteValue64";
          return api.cuStreamWriteValue64(stream, address_of(cmd.location), cmd.value, CU_STREAM_WRITE_VALUE_DEFAULT);
        } else if constexpr (std::is_same_v<T, driver::cmd::Call>) {
          what = "cuGraphLaunch";
          auto* p = static_cast<CudaProgram*>(cmd.program);
          return api.cuGraphLaunch(p->exec(), stream);
        } else if constexpr (std::is_same_v<T, driver::cmd::Timestamp>) {
          throw Error(Status::Unsupported, uri + ": timestamps are not supported (caps.timestamps is false)");
        } else {
          static_assert(std::is_same_v<T, driver::cmd::Run>);
          throw Error(Status::Unsupported, uri + ": no tensor ops on this device (caps.tensor is false)");
        }
      },
      c);
}

void CudaQueue::reserve(std::uint32_t n, std::chrono::nanoseconds max_wait) {
  // Full: wait for the stream to pass submissions, as long as it moves.
  const auto limit = static_cast<std::uint64_t>(max_wait.count());
  std::uint64_t moved_at = base::monotonic_ns(), last = timeline().completed;
  for (;;) {
    retire();
    if (entries_ - used_ >= n) return;
    if (timeline().failed) throw failure();
    const std::uint64_t now = base::monotonic_ns(), done = timeline().completed;
    if (done != last) {
      last = done;
      moved_at = now;
    }
    if (now - moved_at >= limit)
      throw Error(Status::QueueFull, name() + ": ring full (" + std::to_string(entries_) + " entries, " +
                                         std::to_string(used_) + " in flight, " + std::to_string(n) +
                                         " needed) and no submission completed for " +
                                         std::to_string(limit / 1'000'000) + " ms");
    block(done + 1, std::chrono::nanoseconds(std::min<std::uint64_t>(limit - (now - moved_at), 10'000'000)));
  }
}

std::uint64_t CudaQueue::submit(std::span<const driver::Command> commands, std::chrono::nanoseconds max_wait) {
  // One ring entry per command and one for the timeline write.
  const std::size_t n = commands.size() + 1;
  if (n >= entries_)
    throw Error(Status::InvalidArgument, name() + ": a batch of " + std::to_string(commands.size()) +
                                             " commands does not fit the ring (" + std::to_string(entries_) +
                                             " entries); split it, record a program, or create the queue with "
                                             "more ring_entries");
  std::lock_guard lock(submit_mu_);
  if (timeline().failed) throw failure();
  reserve(static_cast<std::uint32_t>(n), max_wait);
  Submission s{next_value_++, static_cast<std::uint32_t>(n), {}};
  {
    ScopedContext scope(api_, dev_->context());
    std::string what;
    for (std::size_t i = 0; i < commands.size(); ++i) {
      if (CUresult r = enqueue(*dev_, stream_, commands[i], s.keep, what); r != CUDA_SUCCESS) {
        // Earlier commands of the batch are queued already; the timeline
        // will not reach this value, and waits report why.
        fail(Error(status_of(r), name() + ": command " + std::to_string(i) + " of submission " +
                                     std::to_string(s.value) + ": " + what + ": " + describe(api_, r)));
        break;
      }
    }
    if (!timeline().failed) {
      if (CUresult r = api_.cuStreamWriteValue64(stream_, word_->address(), s.value, CU_STREAM_WRITE_VALUE_DEFAULT);
          r != CUDA_SUCCESS)
        fail(Error(status_of(r), name() + ": writing timeline value " + std::to_string(s.value) + ": " +
                                     describe(api_, r)));
    }
  }
  used_ += s.entries;
  const std::uint64_t value = s.value;
  in_flight_.push_back(std::move(s));
  submitted_.store(value, std::memory_order_release);
  return value;
}

// ---- The device, continued -----------------------------------------------------

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
  for (std::uint32_t i = 0; i < kComputeQueues; ++i) slots_.push_back({Engine::Compute, i});
  for (std::uint32_t i = 0; i < kCopyQueues; ++i) slots_.push_back({Engine::Copy, kComputeQueues + i});
  log()->info("{}: {} ({}), {} of memory, CUDA driver {}", props_.uri, props_.board, props_.bus,
              format_bytes(total), props_.firmware_version);
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
    log()->error("{}: {} released stream(s) never went idle; their memory and the context are left allocated",
                 uri(), retired_.size());
    // What those streams may still touch stays, reachable, for the life of
    // the process.
    static std::mutex abandoned_mu;
    static auto* abandoned = new std::vector<std::shared_ptr<void>>;
    std::lock_guard a(abandoned_mu);
    abandoned->push_back(std::shared_ptr<void>(heap_.release(), [](void*) {}));
    abandoned->push_back(std::make_shared<std::vector<Retired>>(std::move(retired_)));
    return;
  }
  heap_.reset();
  api_.cuDevicePrimaryCtxRelease(dev_);
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
      log()->warn("{}: a released queue's stream is still running; memory freed from now on is given back once "
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

std::shared_ptr<driver::BufferBackend> CudaDevice::allocate(std::uint64_t size, Memory memory,
                                                            const AllocOptions& options) {
  if (!options.heap.empty() && options.heap != "device")
    throw Error(Status::NotFound, uri() + ": no heap named '" + options.heap + "' (heaps: device)");
  switch (memory) {
    case Memory::Device: {
      const std::uint64_t alignment = options.alignment ? std::max(options.alignment, kMinAlignment) : kMinAlignment;
      const CUdeviceptr address = heap_->allocate(uri(), size, alignment);
      return std::make_shared<CudaBuffer>(shared_from_this(), CudaBuffer::Kind::Device, size, address, nullptr);
    }
    case Memory::DeviceHostVisible:
      throw Error(Status::Unsupported, uri() + ": no host-visible device memory on a GPU "
                                               "(caps.host_visible_device_memory is false); use Memory::HostPinned");
    case Memory::HostPinned: {
      ScopedContext scope(api_, ctx_);
      void* host = nullptr;
      const CUresult r = api_.cuMemHostAlloc(&host, size, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
      if (r == CUDA_ERROR_OUT_OF_MEMORY)
        throw Error(Status::OutOfMemory, uri() + ": cannot allocate " + format_bytes(size) +
                                             " of pinned host memory (cuMemHostAlloc: " + describe(api_, r) + ")");
      check(api_, r, uri() + ": cuMemHostAlloc of " + std::to_string(size) + " bytes");
      CUdeviceptr address = 0;
      if (CUresult g = api_.cuMemHostGetDevicePointer(&address, host, 0); g != CUDA_SUCCESS) {
        api_.cuMemFreeHost(host);
        check(api_, g, uri() + ": cuMemHostGetDevicePointer");
      }
      if (options.alignment && address % options.alignment) {
        api_.cuMemFreeHost(host);
        throw Error(Status::Unsupported, uri() + ": pinned host memory comes page-aligned; alignment " +
                                             std::to_string(options.alignment) + " is not available");
      }
      count_host(static_cast<std::int64_t>(size), 1, false);
      return std::make_shared<CudaBuffer>(shared_from_this(), CudaBuffer::Kind::Pinned, size, address, host);
    }
  }
  throw Error(Status::InvalidArgument, uri() + ": unknown memory kind");
}

std::shared_ptr<driver::BufferBackend> CudaDevice::import_host(void* ptr, std::uint64_t size) {
  const auto page = base::page_size();
  if (reinterpret_cast<std::uintptr_t>(ptr) % page || size % page)
    throw Error(Status::InvalidArgument,
                uri() + ": import_host needs page-aligned memory (" + std::to_string(page) + " bytes); got size " +
                    std::to_string(size));
  ScopedContext scope(api_, ctx_);
  check(api_, api_.cuMemHostRegister(ptr, size, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP),
        uri() + ": cuMemHostRegister of " + std::to_string(size) + " bytes");
  CUdeviceptr address = 0;
  if (CUresult r = api_.cuMemHostGetDevicePointer(&address, ptr, 0); r != CUDA_SUCCESS) {
    api_.cuMemHostUnregister(ptr);
    check(api_, r, uri() + ": cuMemHostGetDevicePointer");
  }
  count_host(static_cast<std::int64_t>(size), 0, true);
  return std::make_shared<CudaBuffer>(shared_from_this(), CudaBuffer::Kind::Imported, size, address, ptr);
}

std::shared_ptr<driver::QueueBackend> CudaDevice::create_queue(Engine engine, const QueueOptions& options) {
  const std::uint32_t entries = options.ring_entries ? options.ring_entries : kDefaultRingEntries;
  if (entries < kMinRingEntries || entries > kMaxRingEntries || (entries & (entries - 1)))
    throw Error(Status::InvalidArgument, uri() + ": ring_entries " + std::to_string(entries) +
                                             " must be a power of two from " + std::to_string(kMinRingEntries) +
                                             " to " + std::to_string(kMaxRingEntries));
  if (engine == Engine::Video)
    throw Error(Status::Unsupported, uri() + ": the board has no video queues");
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

std::shared_ptr<driver::ProgramBackend> CudaDevice::create_program(std::span<const driver::Command> commands) {
  ScopedContext scope(api_, ctx_);
  CUstream s = nullptr;
  check(api_, api_.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), uri() + ": recording a program: cuStreamCreate");
  struct StreamGuard {
    const Api& api;
    CUstream s;
    ~StreamGuard() { api.cuStreamDestroy(s); }
  } guard{api_, s};
  check(api_, api_.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        uri() + ": recording a program: cuStreamBeginCapture");
  // The commands are translated as a queue's are, into the capture; the
  // program holds what they keep (it holds no fence waits).
  Keep keep;
  std::string what;
  CUresult failed = CUDA_SUCCESS;
  std::size_t at = 0;
  for (; at < commands.size(); ++at) {
    if (std::holds_alternative<driver::cmd::WaitFence>(commands[at])) {
      failed = CUDA_ERROR_INVALID_VALUE;
      what = "a wait for a fence (programs cannot hold one)";
      break;
    }
    failed = enqueue(*this, s, commands[at], keep, what);
    if (failed != CUDA_SUCCESS) break;
  }
  CUgraph graph = nullptr;
  const CUresult ended = api_.cuStreamEndCapture(s, &graph);
  if (failed != CUDA_SUCCESS) {
    if (graph) api_.cuGraphDestroy(graph);
    check(api_, failed, uri() + ": recording command " + std::to_string(at) + ": " + what);
  }
  check(api_, ended, uri() + ": recording a program: cuStreamEndCapture");
  CUgraphExec exec = nullptr;
  const CUresult made = api_.cuGraphInstantiateWithFlags(&exec, graph, 0);
  api_.cuGraphDestroy(graph);
  check(api_, made, uri() + ": recording a program: cuGraphInstantiateWithFlags");
  return std::make_shared<CudaProgram>(shared_from_this(), exec, commands.size(), std::move(keep));
}

// ---- The provider --------------------------------------------------------------

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
