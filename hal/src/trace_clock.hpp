// The trace's clock: CLOCK_MONOTONIC nanoseconds, read through the CPU's
// time-stamp counter where the kernel itself keeps time with it.
//
// A traced HAL call reads the clock twice, and clock_gettime() costs about
// 33 ns here against 13 ns for RDTSC, so the clock is a fifth of what a
// traced submit adds. The counter is mapped onto CLOCK_MONOTONIC by a line
// (ns = ns0 + (tsc - tsc0) * mult / 2^32) that resync() refits to pairs of
// readings: its slope is the rate measured since the first pair, bent by at
// most 0.1 % so that it closes the remaining error over the next few
// milliseconds. The line is continuous at every refit, so a thread never
// sees the clock step back by more than rounding (push() clamps that), and
// its error against clock_gettime() is tens of nanoseconds once a trace has
// run for a few rounds (trace_clock_test measures it).
//
// Where the kernel does not use the TSC (its clocksource is not "tsc": a
// VM without an invariant TSC, or not x86-64), now() is clock_gettime().
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

namespace tpuhal::detail::tracing {

class TraceClock {
 public:
  // The process's clock: the TSC where the kernel trusts it (and
  // TPUHAL_TRACE_CLOCK is not "monotonic").
  static TraceClock& instance();

  explicit TraceClock(bool use_tsc);
  TraceClock(const TraceClock&) = delete;
  TraceClock& operator=(const TraceClock&) = delete;

  std::uint64_t now() const noexcept;
  bool uses_tsc() const noexcept { return tsc_; }
  // Refits the line to a fresh pair of readings (the writer, each round).
  // `restart`: jump to the pair at once (a new trace has nothing to keep
  // continuous with).
  void resync(bool restart = false) noexcept;

 private:
  struct Line {
    std::uint64_t tsc0, ns0, mult;
  };
  Line load() const noexcept;
  static std::uint64_t at(const Line& l, std::uint64_t tsc) noexcept;

  bool tsc_ = false;
  // The line, under a sequence lock (odd while resync() writes it).
  mutable std::atomic<std::uint32_t> seq_{0};
  std::atomic<std::uint64_t> tsc0_{0}, ns0_{0}, mult_{0};
  std::mutex mu_;                                 // resync()
  std::uint64_t anchor_tsc_ = 0, anchor_ns_ = 0;  // the first pair (mu_)
};

}  // namespace tpuhal::detail::tracing
