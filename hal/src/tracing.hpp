// The HAL's side of tracing (tpuhal/trace.hpp): the hooks queue.cpp,
// device.cpp, video.cpp and validate.cpp call. Every hook first reads one
// relaxed atomic and returns when no trace is on.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tpuhal/driver/driver.hpp"
#include "tpuhal/trace.hpp"

namespace tpuhal::detail {
class DeviceImpl;
class QueueImpl;
}  // namespace tpuhal::detail

namespace tpuhal::detail::tracing {

extern std::atomic<bool> g_on;
inline bool on() noexcept { return g_on.load(std::memory_order_relaxed); }

// A named number, or a string that outlives the trace session (a literal,
// to_string() of an enum, a queue's trace name).
struct Arg {
  enum class Kind : std::uint8_t { None, U64, F64, Str };
  const char* key = nullptr;
  Kind kind = Kind::None;
  union {
    std::uint64_t u;
    double f;
    const char* s;
  };
  Arg() : u(0) {}
  Arg(const char* k, std::uint64_t v) : key(k), kind(Kind::U64), u(v) {}
  Arg(const char* k, double v) : key(k), kind(Kind::F64), f(v) {}
  Arg(const char* k, const char* v) : key(k), kind(Kind::Str), s(v) {}
};

// A host slice on the calling thread's track, from construction to
// destruction (with end_args, and "threw" if an exception is passing).
// A leaf slice, within which the thread records nothing else, is one event
// written when it ends (ts and dur); a nesting slice is a begin and an end.
class Slice {
 public:
  // Call: a leaf slice whose owner says whether it threw (failed()),
  // sparing two std::uncaught_exceptions() on the hot path.
  enum class Kind : std::uint8_t { Leaf, Nesting, Call };
  // `text`, when not empty, becomes the arg `text_key`.
  Slice(const char* name, std::initializer_list<Arg> args = {}, std::string text = {}, const char* text_key = "message",
        Kind kind = Kind::Leaf);
  ~Slice();
  Slice(const Slice&) = delete;
  Slice& operator=(const Slice&) = delete;
  void end_arg(const Arg& a);
  // A flow starts at the slice's start (leaf slices).
  void flow(std::uint64_t id) noexcept { flow_ = id; }
  void failed() noexcept { failed_ = true; }
  bool on() const noexcept { return on_; }

 private:
  bool on_ = false;
  bool failed_ = false;
  Kind kind_ = Kind::Leaf;
  std::uint8_t nargs_ = 0;
  int exceptions_ = 0;
  const char* name_ = nullptr;
  const char* text_key_ = nullptr;
  std::uint64_t begin_ = 0;
  std::uint64_t flow_ = 0;
  Arg args_[5];
  std::string text_;
};

// An instant on the calling thread's track; `text` becomes the "message" arg.
void instant(const char* name, std::initializer_list<Arg> args = {}, std::string text = {});

// Per-queue state of one trace session (trace.cpp).
struct QueueTrace;

// Submission: begin() decides whether the submission gets board
// timestamps and returns the commands to hand the backend (the caller's
// own when not); submitted() registers the timeline value, draws the flow
// start and ends the slice; a submission that throws cancels in the
// destructor.
class SubmitScope {
 public:
  SubmitScope(QueueImpl& queue, std::span<const driver::Command> commands);
  ~SubmitScope();
  SubmitScope(const SubmitScope&) = delete;
  SubmitScope& operator=(const SubmitScope&) = delete;
  std::span<const driver::Command> commands() const noexcept { return commands_; }
  // Keeps the stamps' memory alive while the submission runs.
  void retain(std::vector<std::shared_ptr<const void>>& retained) const;
  // The backend refused the stamped commands as too many: go without.
  bool drop_stamps();
  void submitted(std::uint64_t value);

 private:
  std::shared_ptr<QueueTrace> q_;
  std::span<const driver::Command> commands_;
  std::vector<driver::Command> stamped_;
  std::uint64_t pending_ = 0;  // the registration's id, 0 if none
  std::uint64_t correlation_ = 0;
  bool done_ = false;
  std::optional<Slice> slice_;
};

// The queue's trace state for this session (created on first use), or null.
std::shared_ptr<QueueTrace> queue_trace(QueueImpl& queue);
const char* queue_trace_name(const QueueTrace& q) noexcept;
// The host saw the queue reach `completed` (QueueImpl::reached).
void observed(QueueImpl& queue, std::uint64_t completed);
// The queue is going away; its work is complete or aborted.
void queue_closing(QueueImpl& queue);

// A device-wide instant (reset) on the device's own track.
void device_instant(const std::shared_ptr<DeviceImpl>& device, const char* name, std::string text = {});
// A decoded frame on the device's video channel track.
void frame(const std::shared_ptr<DeviceImpl>& device, std::uint32_t channel, std::int64_t pts, std::uint64_t index,
           std::uint32_t width, std::uint32_t height);

}  // namespace tpuhal::detail::tracing
