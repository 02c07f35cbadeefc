// The skeleton's queue: one hardware queue of one engine. The skeleton's
// board has none, so SkeletonDevice::create_queue never makes one; this is
// the shape a port fills in. A real queue writes each submission into its
// ring, rings the doorbell, and learns completion from the timeline value
// the board writes back (drivers/tpu/src/queue.cpp).
#include "device_impl.h"

namespace tpuhal::skeleton {

SkeletonQueue::SkeletonQueue(std::shared_ptr<SkeletonDevice> device, Engine engine, std::uint32_t index)
    : device_(std::move(device)), engine_(engine), index_(index) {}

// A port hands the hardware queue back to its device here, so the next
// create_queue can claim it. The HAL releases a queue only once its work is
// complete, or after abort().
SkeletonQueue::~SkeletonQueue() = default;

std::string SkeletonQueue::name() const {
  return device_->uri() + " " + to_string(engine_) + " queue " + std::to_string(index_);
}

// Contract: submits `commands` (possibly none: a fence-only submission) as
// one unit and returns its timeline value, one more than the previous
// submission's. Waits up to `max_wait` for ring space while the queue makes
// progress, then throws QueueFull. Thread-safe.
std::uint64_t SkeletonQueue::submit(std::span<const driver::Command>, std::chrono::nanoseconds) {
  unsupported(name(), "cannot run work (it has no board)",
              "turns each command (driver::cmd::Copy, Fill, WaitFence, ...) into the board's work, "
              "publishes it and rings the doorbell in SkeletonQueue::submit (src/queue.cpp)");
}

// Contract: cheap (no system call): the HAL spins on it. Nothing was ever
// submitted, so nothing completed; the timeline fails only by abort().
driver::Timeline SkeletonQueue::timeline() const {
  return {.completed = 0, .failed = aborted_.load(std::memory_order_acquire)};
}

// The timeline value of the last submission: none.
std::uint64_t SkeletonQueue::submitted() const { return 0; }

// Contract: moves whenever the queue makes forward progress. It never does.
std::uint64_t SkeletonQueue::progress() const { return 0; }

// Contract: the error describing the failure; only called once
// timeline().failed, which here means abort() was called.
Error SkeletonQueue::failure() const { return Error(Status::FailedPrecondition, name() + ": the queue was aborted"); }

// Contract: sleeps until timeline().completed >= value, the queue fails, or
// `max` passes; may return early. Thread-safe. Nothing will ever complete
// here, so it returns at once; a port sleeps on the board's interrupt.
void SkeletonQueue::block(std::uint64_t, std::chrono::nanoseconds) {}

// Contract: stops the hardware queue, discarding work not yet complete, and
// returns once the board no longer touches memory that work referred to.
// The timeline then reads failed. There is no work to discard.
void SkeletonQueue::abort() { aborted_.store(true, std::memory_order_release); }

// The board time at which `value` was reached, where caps.timestamps; the
// skeleton's board keeps no time.
std::optional<std::uint64_t> SkeletonQueue::timestamp_ns(std::uint64_t) const { return std::nullopt; }

QueueStatus SkeletonQueue::status() const {
  QueueStatus s;
  s.engine = engine_;
  s.index = index_;
  s.in_use = true;
  s.failed = aborted_.load(std::memory_order_acquire);
  return s;
}

// Contract: why the queue seems stuck, for a timeout message ("blocked in
// wait_value at ring position 17"); empty if nothing to add. A port reads
// the queue's state from the board.
std::string SkeletonQueue::diagnose() const { return {}; }

}  // namespace tpuhal::skeleton
