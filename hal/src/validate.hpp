// The validation layer's machinery (public side: tpuhal/validation.hpp).
//
// Everything here is reached only behind `validate::on()`, one relaxed load:
// with validation off the HAL does no extra work.
//
// What is tracked, while on:
//   - per buffer (keyed by its driver backend, which is what commands name):
//     where it was allocated, the submissions that use it and have not been
//     seen to complete (queue, timeline value, byte range, read or write),
//     and the last value write_value() gave each word;
//   - per queue: the other queues' timeline values it has waited for
//     (Batch::wait), merged through the queues it waited on;
//   - per device: its live buffers, for the leak report.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "tpuhal/base/callstack.h"
#include "tpuhal/driver/driver.hpp"
#include "tpuhal/validation.hpp"

namespace tpuhal::detail {
class BufferImpl;
class DeviceImpl;
class QueueImpl;
}  // namespace tpuhal::detail

namespace tpuhal::detail::validate {

extern std::atomic<bool> g_on;
inline bool on() noexcept { return g_on.load(std::memory_order_relaxed); }

// Reports a misuse: the call site is the calling thread's stack.
void report(validation::Check check, std::string message);

// A buffer's tracking state (buffer.cpp keeps one per BufferImpl made while on).
struct BufferTrack;
std::shared_ptr<BufferTrack> track_buffer(const BufferImpl& buffer, const driver::BufferBackend* backend);
void untrack_buffer(const std::shared_ptr<BufferTrack>& track);
// "allocated at main() at app.cpp:12" (empty if unknown).
std::string allocation_site(const BufferTrack& track);

// Buffer::map() of a tracked buffer: reports unfinished submissions that write it.
void on_map(const BufferTrack& track);

// Before a batch goes to `queue`: reports hazards with other queues' unfinished
// work and words written backwards. After it went (as timeline `value`):
// records its uses. Programs' commands are looked into through `program_commands`.
void before_submit(const QueueImpl& queue, std::span<const driver::Command> commands);
void after_submit(const std::shared_ptr<QueueImpl>& queue, std::span<const driver::Command> commands,
                  std::uint64_t value);
void forget_queue(const driver::QueueBackend* queue);

// The commands a program was recorded with, kept while on (Device::record).
void record_program(const driver::ProgramBackend* program, std::span<const driver::Command> commands);
void forget_program(const driver::ProgramBackend* program);

// The public calls of a Batch, as the wrong-thread report names them.
enum class BatchCall : std::uint8_t { Copy = 1, Fill, Wait, WaitValue, WriteValue, Timestamp, Run, Submit, WaitUntil };
const char* to_string(BatchCall call) noexcept;

// One Batch used by two threads at once: Guard marks the batch busy for the
// scope of one public call. `claim` holds the thread inside a call and which
// call, in one word, so that a thread turned away reads both from the same
// moment: the name it reports is the call the other thread was in when it
// looked, never one it has since left.
class Guard {
 public:
  // No-op when validation is off or `claim` is null.
  Guard(std::atomic<std::uintptr_t>* claim, BatchCall call);
  ~Guard();
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  std::atomic<std::uintptr_t>* claim_ = nullptr;
};

// The exit-time leak report is armed by the first tracked buffer.
void arm_leak_report();

}  // namespace tpuhal::detail::validate
