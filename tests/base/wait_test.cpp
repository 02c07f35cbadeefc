// EventCount and spin_then_block: the futex-based sleeping waits.
#include "tpuhal/base/wait.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace tpuhal::base {
namespace {

using namespace std::chrono_literals;

constexpr std::uint64_t kSecond = 1'000'000'000ull;

TEST(BaseWait, MonotonicClockNeverGoesBackwards) {
  std::uint64_t last = monotonic_ns();
  for (int i = 0; i < 1000; ++i) {
    const std::uint64_t now = monotonic_ns();
    ASSERT_GE(now, last);
    last = now;
  }
}

TEST(BaseEventCount, WaitWithoutNotifyReturnsAfterTimeout) {
  EventCount ec;
  EXPECT_FALSE(ec.has_waiters());
  auto ticket = ec.prepare();
  EXPECT_TRUE(ec.has_waiters());
  ec.wait(ticket, 10ms);  // nobody notifies: must come back on its own
  EXPECT_FALSE(ec.has_waiters());
}

TEST(BaseEventCount, CancelDropsTheWaiter) {
  EventCount ec;
  (void)ec.prepare();
  EXPECT_TRUE(ec.has_waiters());
  ec.cancel();
  EXPECT_FALSE(ec.has_waiters());
}

TEST(BaseEventCount, NotifyBetweenPrepareAndWaitIsNotLost) {
  EventCount ec;
  auto ticket = ec.prepare();
  ec.notify();  // the epoch moves past the ticket
  const std::uint64_t deadline = monotonic_ns() + 5 * kSecond;
  ec.wait(ticket, 10s);
  // Had the notification been lost, wait() would have slept for 10 s.
  EXPECT_LT(monotonic_ns(), deadline);
  EXPECT_FALSE(ec.has_waiters());
}

TEST(BaseEventCount, NotifyWithoutWaitersDoesNotWakeALaterTicket) {
  EventCount ec;
  ec.notify();  // nobody waits: nothing to wake
  auto ticket = ec.prepare();
  // A ticket taken after the notify must sleep; a short timeout brings it back.
  ec.wait(ticket, 5ms);
  EXPECT_FALSE(ec.has_waiters());
}

// A notifier and a waiter hand a counter back and forth. Every wait sleeps
// with a long timeout that a notify() always cuts short; a lost wake-up shows
// as a wait that ran to its deadline.
TEST(BaseEventCount, PingPongAcrossThreadsNeverLosesAWakeUp) {
  constexpr std::uint32_t kRounds = 5000;
  constexpr auto kWaitTimeout = 30s;   // long: a thread descheduled for seconds is no lost wake-up
  std::atomic<std::uint32_t> turn{0};  // even: ping's turn, odd: pong's turn
  EventCount ec;
  std::atomic<std::uint32_t> timeouts{0};

  auto wait_for = [&](std::uint32_t value) {
    for (;;) {
      if (turn.load(std::memory_order_acquire) == value) return;
      auto ticket = ec.prepare();
      if (turn.load(std::memory_order_acquire) == value) {
        ec.cancel();
        return;
      }
      const std::uint64_t deadline =
          monotonic_ns() +
          static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(kWaitTimeout).count());
      ec.wait(ticket, kWaitTimeout);
      if (monotonic_ns() >= deadline) {
        timeouts.fetch_add(1);
        return;  // give up; the test fails below
      }
    }
  };

  std::thread pong([&] {
    for (std::uint32_t i = 0; i < kRounds; ++i) {
      wait_for(2 * i + 1);
      turn.store(2 * i + 2, std::memory_order_release);
      ec.notify();
      if (timeouts.load() != 0) return;
    }
  });
  for (std::uint32_t i = 0; i < kRounds; ++i) {
    turn.store(2 * i + 1, std::memory_order_release);
    ec.notify();
    wait_for(2 * i + 2);
    if (timeouts.load() != 0) break;
  }
  pong.join();
  EXPECT_EQ(timeouts.load(), 0u);
  EXPECT_EQ(turn.load(), 2 * kRounds);
  EXPECT_FALSE(ec.has_waiters());
}

TEST(BaseSpinThenBlock, ReturnsTrueImmediatelyWhenAlreadyReady) {
  EventCount ec;
  int calls = 0;
  EXPECT_TRUE(spin_then_block(
      [&] {
        ++calls;
        return true;
      },
      ec, 1ms, 1ms, monotonic_ns() + kSecond));
  EXPECT_EQ(calls, 1);
}

TEST(BaseSpinThenBlock, ReturnsFalseAtTheDeadline) {
  EventCount ec;
  const std::uint64_t deadline = monotonic_ns() + 20'000'000;  // 20 ms
  EXPECT_FALSE(spin_then_block([] { return false; }, ec, 1ms, 5ms, deadline));
  EXPECT_GE(monotonic_ns(), deadline);
  EXPECT_FALSE(ec.has_waiters());
}

TEST(BaseSpinThenBlock, WakesWhenAnotherThreadMakesThePredicateTrue) {
  constexpr int kRounds = 200;
  EventCount ec;
  std::atomic<int> value{0};
  std::atomic<int> failures{0};
  std::thread waiter([&] {
    for (int i = 1; i <= kRounds; ++i) {
      // A zero spin forces the sleeping path and the slice is longer than
      // the deadline, so a lost notification shows as a wait that ran to its
      // deadline.
      const std::uint64_t deadline = monotonic_ns() + 30 * kSecond;
      const bool ok =
          spin_then_block([&] { return value.load(std::memory_order_acquire) >= i; }, ec, 0ns, 60s, deadline);
      if (!ok || monotonic_ns() >= deadline) failures.fetch_add(1);
    }
  });
  for (int i = 1; i <= kRounds; ++i) {
    if (i % 16 == 0) std::this_thread::sleep_for(100us);  // let the waiter fall asleep
    value.store(i, std::memory_order_release);
    ec.notify();
  }
  waiter.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(BaseFutex, WaitReturnsAtOnceWhenTheValueDiffers) {
  std::atomic<std::uint32_t> word{7};
  const std::uint64_t deadline = monotonic_ns() + 5 * kSecond;
  futex_wait(word, 6, 10s);  // expected value is stale: no sleep
  EXPECT_LT(monotonic_ns(), deadline);
  futex_wait(word, 7, 0ns);  // zero timeout: no sleep either
  EXPECT_LT(monotonic_ns(), deadline);
}

TEST(BaseFutex, WakeAllReleasesASleeper) {
  std::atomic<std::uint32_t> word{0};
  std::atomic<bool> done{false};
  std::thread sleeper([&] {
    while (word.load() == 0) futex_wait(word, 0, 5s);
    done.store(true);
  });
  word.store(1);
  futex_wake_all(word);
  sleeper.join();  // returns within the 5 s wait even if the wake were lost
  EXPECT_TRUE(done.load());
}

}  // namespace
}  // namespace tpuhal::base
