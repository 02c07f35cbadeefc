// Internal objects behind the public handles.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tpuhal/driver/driver.hpp"
#include "tpuhal/tpuhal.hpp"
#include "tracing.hpp"
#include "validate.hpp"

namespace tpuhal::detail {

class DeviceImpl {
 public:
  DeviceImpl(std::string uri, std::shared_ptr<driver::DeviceBackend> backend);
  ~DeviceImpl();

  const std::string& uri() const noexcept { return uri_; }
  driver::DeviceBackend& backend() const noexcept { return *backend_; }
  WaitPolicy wait_policy() const;
  void set_wait_policy(const WaitPolicy& policy);
  // The policy's timeout without taking the lock (submission's fast path).
  std::chrono::nanoseconds default_timeout() const noexcept {
    return std::chrono::nanoseconds(timeout_ns_.load(std::memory_order_relaxed));
  }

 private:
  std::string uri_;
  std::shared_ptr<driver::DeviceBackend> backend_;
  mutable std::mutex mu_;
  WaitPolicy policy_;
  std::atomic<std::int64_t> timeout_ns_{0};
};

class BufferImpl {
 public:
  BufferImpl(std::shared_ptr<DeviceImpl> device, std::shared_ptr<driver::BufferBackend> backend);
  ~BufferImpl();

  // The live backend, or FailedPrecondition if the buffer was freed.
  std::shared_ptr<driver::BufferBackend> acquire(const char* use) const;
  void free();
  bool freed() const;

  const std::shared_ptr<DeviceImpl>& device() const noexcept { return device_; }
  std::uint64_t size() const noexcept { return size_; }
  Memory memory() const noexcept { return memory_; }
  const std::string& heap() const noexcept { return heap_; }
  std::uint64_t device_address() const noexcept { return device_address_; }
  std::string describe() const;  // "4096-byte device buffer at 0x10000000"
  // Validation state, when the buffer was made with validation on.
  const std::shared_ptr<validate::BufferTrack>& track() const noexcept { return track_; }

 private:
  std::shared_ptr<DeviceImpl> device_;
  mutable std::mutex mu_;
  std::shared_ptr<driver::BufferBackend> backend_;
  std::shared_ptr<validate::BufferTrack> track_;
  const std::uint64_t size_;
  const Memory memory_;
  const std::string heap_;
  const std::uint64_t device_address_;
};

class QueueImpl {
 public:
  QueueImpl(std::shared_ptr<DeviceImpl> device, std::shared_ptr<driver::QueueBackend> backend);
  ~QueueImpl();

  const std::shared_ptr<DeviceImpl>& device() const noexcept { return device_; }
  driver::QueueBackend& backend() const noexcept { return *backend_; }
  const std::shared_ptr<driver::QueueBackend>& backend_ptr() const noexcept { return backend_; }
  std::string name() const;  // "sim:0 compute queue 2"

  // Submits and keeps `retained` alive until the submission completes.
  std::uint64_t submit(std::span<const driver::Command> commands, std::vector<std::shared_ptr<const void>>&& retained,
                       std::chrono::nanoseconds max_wait);
  std::uint64_t last_submitted() const { return backend_->submitted(); }
  // True once `value` is reached; throws the failure if the queue failed first.
  bool reached(std::uint64_t value);
  void wait(std::uint64_t value, const WaitPolicy& policy);

  // Tracing (trace.cpp): this queue's state in the current trace session.
  std::mutex tracing_mu;
  std::shared_ptr<tracing::QueueTrace> tracing;
  std::uint64_t tracing_gen = 0;

 private:
  void reclaim(std::uint64_t completed);
  [[noreturn]] void throw_timeout(std::uint64_t value, std::chrono::nanoseconds timeout) const;

  std::shared_ptr<DeviceImpl> device_;
  std::shared_ptr<driver::QueueBackend> backend_;
  // Validation: the highest completed value seen, to catch it going back.
  std::atomic<std::uint64_t> max_completed_{0};
  std::atomic<bool> backwards_reported_{false};
  std::atomic<std::uint64_t> trace_seen_{0};  // the highest value reported to tracing
  std::mutex retained_mu_;
  std::atomic<bool> has_retained_{false};
  std::deque<std::pair<std::uint64_t, std::vector<std::shared_ptr<const void>>>> retained_;
};

// A batch records for a queue, or (queue == nullptr) for a program of
// `device` (Device::record).
struct BatchState {
  std::shared_ptr<DeviceImpl> device;
  std::shared_ptr<QueueImpl> queue;
  std::vector<driver::Command> commands;
  std::vector<std::shared_ptr<const void>> retained;
  // Validation: the thread inside a call on this batch, and which call
  // (validate::Guard).
  std::atomic<std::uintptr_t> claim{0};
};

struct ProgramImpl {
  ~ProgramImpl() {
    if (validate::on() && backend) validate::forget_program(backend.get());
  }
  std::shared_ptr<DeviceImpl> device;
  std::shared_ptr<driver::ProgramBackend> backend;
  std::vector<std::shared_ptr<const void>> retained;  // what the program refers to
};

}  // namespace tpuhal::detail

namespace tpuhal {
// Reaches into Op for the HAL's own code.
struct OpAccess {
  static Op make(std::shared_ptr<driver::OpDesc> desc, std::shared_ptr<const void> keep,
                 std::shared_ptr<detail::DeviceImpl> device) {
    Op op;
    op.desc_ = std::move(desc);
    op.keep_ = std::move(keep);
    op.device_ = std::move(device);
    return op;
  }
  static const Op& check(const Op& op) {
    if (!op.desc_) throw Error(Status::InvalidArgument, "run: empty Op (build one with tpuhal::ops)");
    return op;
  }
  static const std::shared_ptr<const driver::OpDesc>& desc(const Op& op) { return op.desc_; }
  static const std::shared_ptr<const void>& keep(const Op& op) { return op.keep_; }
  static const std::shared_ptr<detail::DeviceImpl>& device(const Op& op) { return op.device_; }
};
}  // namespace tpuhal

namespace tpuhal::detail {

// Process-wide registry of providers and open devices (registry.cpp).
std::shared_ptr<DeviceImpl> open_device(std::string_view uri);

// The providers compiled into this library (drivers/builtin_providers.cpp).
std::vector<std::shared_ptr<driver::Provider>> builtin_providers();

}  // namespace tpuhal::detail
