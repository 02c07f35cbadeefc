// The trace clock (hal/src/trace_clock.hpp): the TSC mapped onto
// CLOCK_MONOTONIC agrees with clock_gettime() and never steps back, through
// refits made while other threads read it.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "../../hal/src/trace_clock.hpp"
#include "tpuhal/base/wait.h"

namespace tpuhal::detail::tracing {
namespace {

// Readings of `c` bracketed by clock_gettime(): how far outside the bracket
// the worst one fell, in ns (0 when every reading lay inside).
std::uint64_t worst_outside(const TraceClock& c, int n) {
  std::uint64_t worst = 0;
  for (int i = 0; i < n; ++i) {
    const std::uint64_t a = base::monotonic_ns();
    const std::uint64_t t = c.now();
    const std::uint64_t b = base::monotonic_ns();
    if (t < a) worst = std::max(worst, a - t);
    if (t > b) worst = std::max(worst, t - b);
  }
  return worst;
}

TEST(TraceClock, WithoutTheCounterItIsClockGettime) {
  TraceClock c(false);
  EXPECT_FALSE(c.uses_tsc());
  c.resync();
  EXPECT_EQ(worst_outside(c, 10000), 0u);
}

TEST(TraceClock, TheCounterAgreesWithClockGettime) {
  TraceClock c(true);
  if (!c.uses_tsc()) GTEST_SKIP() << "no time-stamp counter this clock would use on this machine";
  // Fresh from its 200 µs calibration, then after refits 2 ms apart, as the
  // trace writer makes them.
  EXPECT_LT(worst_outside(c, 10000), 2000u);
  for (int round = 0; round < 20; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    c.resync();
  }
  EXPECT_LT(worst_outside(c, 10000), 500u);
  // Long after a refit it drifts only by the rate's error.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_LT(worst_outside(c, 10000), 2000u);
  c.resync(true);
  EXPECT_LT(worst_outside(c, 10000), 500u);
}

TEST(TraceClock, NeverStepsBackWhileRefitted) {
  for (bool tsc : {false, true}) {
    TraceClock c(tsc);
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> backwards{0}, reads{0};
    std::vector<std::thread> readers;
    for (int r = 0; r < 2; ++r)
      readers.emplace_back([&] {
        std::uint64_t last = 0, n = 0, back = 0;
        while (!stop.load(std::memory_order_relaxed)) {
          const std::uint64_t t = c.now();
          // Rounding at a refit may give one nanosecond back (push() in
          // trace.cpp clamps it); more would be a step.
          if (t + 1 < last) ++back;
          last = std::max(last, t);
          ++n;
        }
        backwards += back;
        reads += n;
      });
    for (int i = 0; i < 200; ++i) {
      c.resync();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    stop = true;
    for (auto& t : readers) t.join();
    EXPECT_EQ(backwards.load(), 0u) << "tsc=" << tsc;
    EXPECT_GT(reads.load(), 1000u);
  }
}

}  // namespace
}  // namespace tpuhal::detail::tracing
