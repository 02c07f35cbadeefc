#include "tpuhal/base/wait.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace tpuhal::base {

std::uint64_t monotonic_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

namespace {
// std::atomic<uint32_t> is layout-compatible with uint32_t on Linux targets.
static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));

long futex(const std::atomic<std::uint32_t>& word, int op, std::uint32_t val, const timespec* ts) noexcept {
  return syscall(SYS_futex, reinterpret_cast<const std::uint32_t*>(&word), op | FUTEX_PRIVATE_FLAG, val, ts, nullptr,
                 0);
}
}  // namespace

void futex_wait(const std::atomic<std::uint32_t>& word, std::uint32_t expected,
                std::chrono::nanoseconds timeout) noexcept {
  if (timeout.count() <= 0) return;
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
  futex(word, FUTEX_WAIT, expected, &ts);
}

void futex_wake_all(const std::atomic<std::uint32_t>& word) noexcept { futex(word, FUTEX_WAKE, INT_MAX, nullptr); }

void futex_wake_one(const std::atomic<std::uint32_t>& word) noexcept { futex(word, FUTEX_WAKE, 1, nullptr); }

}  // namespace tpuhal::base
