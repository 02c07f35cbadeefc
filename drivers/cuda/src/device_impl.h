// Internals of the CUDA shim, shared by its files: the device (device.cpp),
// its memory (memory.cpp), programs (program.cpp) and queues (queue.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "api.h"
#include "blas.h"
#include "ops.h"
#include "tpuhal/base/range_allocator.h"
#include "tpuhal/base/wait.h"
#include "tpuhal/cuda/cuda_provider.h"

namespace spdlog {
class logger;
}

namespace tpuhal::cuda {

constexpr std::uint64_t kMinAlignment = 256;
// Streams a device hands out per engine: enough for an application and a
// runtime side by side; CUDA itself has no such limit.
constexpr std::uint32_t kComputeQueues = 8;
constexpr std::uint32_t kCopyQueues = 2;
constexpr std::uint32_t kDefaultRingEntries = 1024;
constexpr std::uint32_t kMinRingEntries = 16;
constexpr std::uint32_t kMaxRingEntries = 1u << 20;
// Fence values whose board time a queue keeps (Fence::timestamp_ns), as a
// TPU board's status page does.
constexpr std::uint32_t kStampSlots = 128;

const std::shared_ptr<spdlog::logger>& log();  // device.cpp

class CudaDevice;
class CudaQueue;

// What a submission's stream may still read once the HAL has let go: the
// timeline words of the queues it waits on (the HAL keeps buffers and
// programs alive until it sees the work complete, but not other queues) and
// the scratch blocks of overlapping copies.
using Keep = std::vector<std::shared_ptr<const void>>;

// The board clock (clock.cpp): the kernels that write the GPU's global timer
// in stream order, loaded once per device. Null where the driver cannot load
// them; the device then has no timestamps.
class Clock {
 public:
  static std::unique_ptr<Clock> load(const Api& api, std::string* why);
  ~Clock();
  Clock(const Clock&) = delete;
  Clock& operator=(const Clock&) = delete;

  // Writes the board time (ns) at `at` when the stream gets there.
  CUresult stamp(CUstream stream, CUdeviceptr at) const;
  // Records `value`'s board time in a stamp slot (TimelineWord::slot).
  CUresult fence_stamp(CUstream stream, CUdeviceptr slot, std::uint64_t value) const;

 private:
  explicit Clock(const Api& api) : api_(api) {}
  const Api& api_;
  CUmodule module_ = nullptr;
  CUfunction stamp_ = nullptr, fence_stamp_ = nullptr;
};

// A queue's timeline: a 64-bit word in pinned host memory that its stream
// writes after each submission and other streams wait on, and beside it the
// stamp slots, {value, board time} of the last kStampSlots fence values.
// Shared by the queue and by every submission that waits on it, so it
// outlives each stream that may read or write it; it holds no reference to
// the device (which outlives it), so no cycle keeps a device open.
class TimelineWord {
 public:
  TimelineWord(const Api& api, CUcontext ctx, const std::string& what);
  ~TimelineWord();
  TimelineWord(const TimelineWord&) = delete;
  TimelineWord& operator=(const TimelineWord&) = delete;

  std::uint64_t read() const { return std::atomic_ref<std::uint64_t>(*host_).load(std::memory_order_acquire); }
  CUdeviceptr address() const { return address_; }

  // The device address of value's stamp slot.
  CUdeviceptr slot(std::uint64_t value) const {
    return address_ + kSlotsAt + (value % kStampSlots) * sizeof(StampSlot);
  }
  // Value's board time while its slot still holds it.
  std::optional<std::uint64_t> stamp(std::uint64_t value) const;

  // The fault record kernels report bad input in (kernels/kernel.h), and
  // the value it names once one is published (0: none).
  CUdeviceptr fault_address() const { return address_ + kFaultAt; }
  std::uint64_t fault_value() const {
    return std::atomic_ref<std::uint64_t>(fault_host()->value).load(std::memory_order_acquire);
  }
  k::FaultRecord fault() const { return *fault_host(); }

 private:
  k::FaultRecord* fault_host() const {
    return reinterpret_cast<k::FaultRecord*>(reinterpret_cast<std::byte*>(host_) + kFaultAt);
  }
  // What the fence-stamp kernel writes (clock.cpp): value, then time.
  struct StampSlot {
    std::uint64_t value;
    std::uint64_t ns;
  };
  static constexpr std::uint64_t kSlotsAt = 64;  // the word has a cache line of its own
  static constexpr std::uint64_t kFaultAt = kSlotsAt + kStampSlots * sizeof(StampSlot);
  static constexpr std::uint64_t kBytes = kFaultAt + sizeof(k::FaultRecord);
  const Api& api_;
  CUcontext ctx_;
  std::uint64_t* host_ = nullptr;
  CUdeviceptr address_ = 0;
};

// ---- Device memory: a reserved range, backed chunk by chunk (memory.cpp) ----

class DeviceHeap {
 public:
  DeviceHeap(const Api& api, CUcontext ctx, int ordinal, std::uint64_t memory);
  ~DeviceHeap();
  DeviceHeap(const DeviceHeap&) = delete;
  DeviceHeap& operator=(const DeviceHeap&) = delete;

  std::uint64_t base() const { return base_; }
  std::uint64_t size() const { return size_; }

  // The address of a new block; throws OutOfMemory saying what is used and
  // free (of the range, or of the GPU's memory when backing it fails).
  std::uint64_t allocate(const std::string& uri, std::uint64_t size, std::uint64_t alignment);
  void free(std::uint64_t address) noexcept;
  base::RangeAllocator::Stats stats() const;

 private:
  struct Chunk {
    CUmemGenericAllocationHandle handle = 0;
    std::uint32_t users = 0;
  };

  // Chunks are backed while any block uses them.
  CUresult back(std::uint64_t index);
  void unback(std::uint64_t index);
  Error out_of_memory(const std::string& uri, std::uint64_t size, const std::string& more) const;

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

// ---- The device (device.cpp) ---------------------------------------------------

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
  std::string refuse_op(const driver::OpDesc& op) const override;

  const Api& api() const { return api_; }
  CUcontext context() const { return ctx_; }
  const std::string& uri() const { return props_.uri; }
  DeviceHeap& heap() { return *heap_; }
  // The board clock; null where the device has no timestamps.
  const Clock* clock() const { return clock_.get(); }
  // The tensor-op kernels (ops.h); null where the device has no caps.tensor.
  const Kernels* kernels() const { return kernels_.get(); }
  // cuBLAS for float matrix products (blas.h); null where it did not load.
  const Blas* blas() const { return blas_.get(); }

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
  void load_kernels();
  void set_peaks();

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
  std::unique_ptr<Clock> clock_;
  std::unique_ptr<Kernels> kernels_;
  std::unique_ptr<Blas> blas_;
  std::string tensor_why_;  // why kernels_ is null

  mutable std::mutex stats_mu_;
  std::uint64_t pinned_bytes_ = 0, pinned_allocations_ = 0, imported_bytes_ = 0;

  mutable std::mutex queues_mu_;
  std::vector<Slot> slots_;
  std::vector<Retired> retired_;
  std::vector<std::function<void()>> deferred_;
};

// ---- Buffers (memory.cpp) ------------------------------------------------------

class CudaBuffer final : public driver::BufferBackend {
 public:
  enum class Kind { Device, Pinned, Imported };
  CudaBuffer(std::shared_ptr<CudaDevice> dev, Kind kind, std::uint64_t size, CUdeviceptr address, void* host)
      : dev_(std::move(dev)), kind_(kind), size_(size), address_(address), host_(host) {}
  ~CudaBuffer() override;

  std::uint64_t size() const override { return size_; }
  Memory memory() const override { return kind_ == Kind::Device ? Memory::Device : Memory::HostPinned; }
  const std::string& heap() const override;
  std::uint64_t device_address() const override { return address_; }
  std::span<std::byte> map() override;

 private:
  std::shared_ptr<CudaDevice> dev_;
  Kind kind_;
  std::uint64_t size_;
  CUdeviceptr address_;
  void* host_;
};

inline CUdeviceptr address_of(const driver::BufferRange& r) { return r.buffer->device_address() + r.offset; }

// ---- Programs (program.cpp) ----------------------------------------------------

class CudaProgram final : public driver::ProgramBackend {
 public:
  // `keep`: what the graph's commands use besides the HAL's buffers (the
  // scratch blocks of overlapping copies), for as long as the graph lives.
  // `faults`: where its kernels report bad input (null: it runs no op that
  // can); a queue that calls it moves a fault from there to its own.
  CudaProgram(std::shared_ptr<CudaDevice> dev, CUgraphExec exec, std::size_t size, Keep keep,
              std::shared_ptr<TimelineWord> faults)
      : dev_(std::move(dev)), exec_(exec), size_(size), keep_(std::move(keep)), faults_(std::move(faults)) {}
  ~CudaProgram() override;
  std::size_t size() const override { return size_; }
  CUgraphExec exec() const { return exec_; }
  const std::shared_ptr<TimelineWord>& faults() const { return faults_; }

 private:
  std::shared_ptr<CudaDevice> dev_;
  CUgraphExec exec_;
  std::size_t size_;
  Keep keep_;
  std::shared_ptr<TimelineWord> faults_;
};

// ---- Queues (queue.cpp) --------------------------------------------------------

class CudaQueue final : public driver::QueueBackend {
 public:
  CudaQueue(std::shared_ptr<CudaDevice> dev, Engine engine, std::uint32_t index, std::uint32_t entries);
  ~CudaQueue() override;

  Engine engine() const override { return engine_; }
  std::uint32_t index() const override { return index_; }

  std::uint64_t submit(std::span<const driver::Command> commands, std::chrono::nanoseconds max_wait) override;

  // A fault a kernel published (kernels/kernel.h) fails its submission:
  // the timeline stops short of it.
  driver::Timeline timeline() const override {
    driver::Timeline t{word_->read(), failed_.load(std::memory_order_acquire)};
    if (const std::uint64_t v = word_->fault_value(); v != 0 && t.completed >= v) {
      t.completed = v - 1;
      t.failed = true;
    }
    return t;
  }
  std::uint64_t submitted() const override { return submitted_.load(std::memory_order_acquire); }
  std::uint64_t progress() const override { return timeline().completed; }
  Error failure() const override;

  void block(std::uint64_t value, std::chrono::nanoseconds max) override;
  void abort() override;
  std::optional<std::uint64_t> timestamp_ns(std::uint64_t value) const override;
  QueueStatus status() const override;
  std::string diagnose() const override;

  const std::shared_ptr<TimelineWord>& word() const { return word_; }

 private:
  std::string name() const { return dev_->uri() + " " + to_string(engine_) + " queue " + std::to_string(index_); }

  void fail(Error e);

  // A sticky CUDA error (a fault in earlier work) shows up only when asked.
  void poll_stream();

  // Drops what completed submissions kept; caller holds submit_mu_.
  void retire();

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
  std::uint64_t ring_at_ = 0;  // entries submitted so far: the next one's ring position, modulo entries_
  std::uint32_t used_ = 0;
  std::deque<Submission> in_flight_;
  std::atomic<std::uint64_t> submitted_{0};

  mutable std::mutex failure_mu_;
  std::atomic<bool> failed_{false};
  Error failure_{Status::Ok, ""};
};

// Queues one command on `stream` (a queue's, or one being captured into a
// program), adding what its stream reads beyond the HAL's buffers (the
// timeline words of the queues it waits on, scratch blocks) to `keep`;
// `what` names the CUDA call.
// A queue's failure made of a published fault record.
Error fault_error(const std::string& queue, const k::FaultRecord& r);

// `fault`: where the command's kernels report bad input (kernels/kernel.h),
// with the command's index filled in.
CUresult enqueue(CudaDevice& dev, CUstream stream, const driver::Command& c, Keep& keep, std::string& what,
                 k::Fault fault);

}  // namespace tpuhal::cuda
