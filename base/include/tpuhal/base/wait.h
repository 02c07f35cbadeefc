// Bounded spinning and blocking waits built on Linux futexes.
//
// Every wait in tpuhal spins for a bounded time and then sleeps; nothing here
// waits without a deadline. EventCount is the sleeping half: a waiter takes a
// ticket, re-checks its condition, then sleeps until the count moves past the
// ticket or the timeout expires. A notifier changes the condition, then calls
// notify(); the call costs one atomic load when nobody sleeps.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace tpuhal::base {

// One iteration of a spin loop: a pause instruction, friendly to the sibling
// hyperthread and to the memory system.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

// Monotonic time in nanoseconds (CLOCK_MONOTONIC through the vDSO).
std::uint64_t monotonic_ns() noexcept;

// Sleep on *word while it still equals `expected`, at most `timeout`.
// Returns on wake-up, timeout, signal or value change; callers re-check.
void futex_wait(const std::atomic<std::uint32_t>& word, std::uint32_t expected,
                std::chrono::nanoseconds timeout) noexcept;
void futex_wake_all(const std::atomic<std::uint32_t>& word) noexcept;
void futex_wake_one(const std::atomic<std::uint32_t>& word) noexcept;

// Eventcount: lets threads sleep until "something changed" without missing a
// wake-up. Usage:
//   for (;;) {
//     if (ready()) break;
//     auto ticket = ec.prepare();
//     if (ready()) { ec.cancel(); break; }
//     ec.wait(ticket, timeout);
//   }
// and on the notifying side: make ready() true, then ec.notify().
class EventCount {
 public:
  using Ticket = std::uint32_t;

  Ticket prepare() noexcept {
    waiters_.fetch_add(1, std::memory_order_seq_cst);
    return epoch_.load(std::memory_order_seq_cst);
  }
  void cancel() noexcept { waiters_.fetch_sub(1, std::memory_order_seq_cst); }
  // Sleeps unless notify() ran since prepare(). Consumes the ticket.
  void wait(Ticket ticket, std::chrono::nanoseconds timeout) noexcept {
    futex_wait(epoch_, ticket, timeout);
    waiters_.fetch_sub(1, std::memory_order_seq_cst);
  }
  void notify() noexcept {
    // Callers made their condition true before this point. A read-modify-
    // write reads the latest waiter count: either it sees a waiter's
    // prepare(), or that prepare() reads this RMW and so happens after the
    // caller's store, and the waiter's re-check sees the condition.
    if (waiters_.fetch_add(0, std::memory_order_seq_cst) != 0) {
      epoch_.fetch_add(1, std::memory_order_seq_cst);
      futex_wake_all(epoch_);
    }
  }
  bool has_waiters() const noexcept { return waiters_.load(std::memory_order_relaxed) != 0; }

 private:
  std::atomic<std::uint32_t> epoch_{0};
  std::atomic<std::uint32_t> waiters_{0};
};

// Waits until pred() is true: spins up to `spin`, then sleeps on `ec` in
// slices of at most `slice` until `deadline_ns` (monotonic_ns() time).
// Returns pred()'s final value. The slices bound the damage of a lost
// notification to one slice.
template <class Pred>
bool spin_then_block(Pred&& pred, EventCount& ec, std::chrono::nanoseconds spin, std::chrono::nanoseconds slice,
                     std::uint64_t deadline_ns) {
  if (pred()) return true;
  const std::uint64_t spin_end = monotonic_ns() + static_cast<std::uint64_t>(spin.count());
  for (unsigned i = 0;; ++i) {
    if (pred()) return true;
    cpu_relax();
    if ((i & 63) == 63 && monotonic_ns() >= spin_end) break;
  }
  for (;;) {
    if (pred()) return true;
    const std::uint64_t now = monotonic_ns();
    if (now >= deadline_ns) return pred();
    auto ticket = ec.prepare();
    if (pred()) {
      ec.cancel();
      return true;
    }
    const auto left = std::chrono::nanoseconds(deadline_ns - now);
    ec.wait(ticket, left < slice ? left : slice);
  }
}

}  // namespace tpuhal::base
