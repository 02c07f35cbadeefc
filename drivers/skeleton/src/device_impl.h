// Internals of the skeleton driver: one class per object of the driver
// interface (hal/include/tpuhal/driver/driver.hpp), declared here and
// defined in the file of its responsibility:
//
//   provider.cpp  SkeletonProvider: the URI scheme, finding boards, opening one
//   device.cpp    SkeletonDevice: properties, memory statistics, status, and
//                 the calls that make buffers, queues and programs
//   queue.cpp     SkeletonQueue: submission, the timeline, waits, abort
//   buffer.cpp    SkeletonBuffer and SkeletonProgram: memory and recorded work
//
// Every call either does what its contract asks of a board with nothing in
// it, or refuses with Status::Unsupported through unsupported(), naming the
// device, the call and what a port fills in there.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "tpuhal/skeleton/skeleton.h"

namespace tpuhal::skeleton {

// Throws Error(Unsupported, "<uri>: the skeleton driver <what>; a port <port>").
// `what` says what is missing and why, `port` what a port writes and where.
[[noreturn]] void unsupported(std::string_view uri, std::string_view what, std::string_view port);

class SkeletonDevice final : public driver::DeviceBackend, public std::enable_shared_from_this<SkeletonDevice> {
 public:
  explicit SkeletonDevice(std::string uri);
  ~SkeletonDevice() override;

  const Properties& properties() const override { return props_; }
  MemoryStats memory_stats() const override;
  DeviceStatus status() const override;
  std::shared_ptr<driver::BufferBackend> allocate(std::uint64_t size, Memory memory,
                                                  const AllocOptions& options) override;
  std::shared_ptr<driver::BufferBackend> import_host(void* ptr, std::uint64_t size) override;
  std::shared_ptr<driver::ProgramBackend> create_program(std::span<const driver::Command> commands) override;
  std::shared_ptr<driver::QueueBackend> create_queue(Engine engine, const QueueOptions& options) override;
  std::shared_ptr<driver::DecoderBackend> open_decoder(const driver::DecoderConfig& config) override;
  void reset() override;

  const std::string& uri() const noexcept { return props_.uri; }

 private:
  Properties props_;
};

class SkeletonQueue final : public driver::QueueBackend {
 public:
  SkeletonQueue(std::shared_ptr<SkeletonDevice> device, Engine engine, std::uint32_t index);
  ~SkeletonQueue() override;

  Engine engine() const override { return engine_; }
  std::uint32_t index() const override { return index_; }
  std::uint64_t submit(std::span<const driver::Command> commands, std::chrono::nanoseconds max_wait) override;
  driver::Timeline timeline() const override;
  std::uint64_t submitted() const override;
  std::uint64_t progress() const override;
  Error failure() const override;
  void block(std::uint64_t value, std::chrono::nanoseconds max) override;
  void abort() override;
  std::optional<std::uint64_t> timestamp_ns(std::uint64_t value) const override;
  QueueStatus status() const override;
  std::string diagnose() const override;

 private:
  std::string name() const;  // "skeleton:0 compute queue 0", for messages

  std::shared_ptr<SkeletonDevice> device_;  // kept open while the queue lives
  Engine engine_;
  std::uint32_t index_;
  std::atomic<bool> aborted_{false};
};

class SkeletonBuffer final : public driver::BufferBackend {
 public:
  SkeletonBuffer(std::shared_ptr<SkeletonDevice> device, std::uint64_t size, Memory memory, std::string heap,
                 std::uint64_t device_address);
  ~SkeletonBuffer() override;

  std::uint64_t size() const override { return size_; }
  Memory memory() const override { return memory_; }
  const std::string& heap() const override { return heap_; }
  std::uint64_t device_address() const override { return address_; }
  std::span<std::byte> map() override;

 private:
  std::shared_ptr<SkeletonDevice> device_;  // its memory is the device's
  std::uint64_t size_;
  Memory memory_;
  std::string heap_;
  std::uint64_t address_;
};

class SkeletonProgram final : public driver::ProgramBackend {
 public:
  SkeletonProgram(std::shared_ptr<SkeletonDevice> device, std::size_t commands);
  ~SkeletonProgram() override;

  std::size_t size() const override { return commands_; }

 private:
  std::shared_ptr<SkeletonDevice> device_;  // the program lives in its memory
  std::size_t commands_;
};

class SkeletonProvider final : public driver::Provider {
 public:
  std::string_view scheme() const override { return "skeleton"; }
  std::vector<DeviceInfo> enumerate() override;
  std::shared_ptr<driver::DeviceBackend> open(std::string_view uri) override;
  std::string unavailable_reason() const override;
  void upload_firmware(std::string_view uri, std::span<const std::byte> image,
                       std::chrono::milliseconds timeout) override;
};

}  // namespace tpuhal::skeleton
