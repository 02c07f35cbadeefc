#include "trace_clock.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "tpuhal/base/wait.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace tpuhal::detail::tracing {
namespace {

__extension__ typedef unsigned __int128 u128;
__extension__ typedef __int128 i128;

constexpr std::uint64_t kCalibrateNs = 200'000;  // the first rate's span
constexpr std::uint64_t kHorizonNs = 4'000'000;  // a refit closes its error over this
constexpr std::uint64_t kJumpNs = 1'000'000;     // an error beyond this is a jump, not drift

std::uint64_t tsc() noexcept {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return 0;
#endif
}

struct Pair {
  std::uint64_t tsc = 0, ns = 0;
};

// The counter and the clock read as close together as a few tries allow.
Pair read_pair() noexcept {
  Pair best;
  std::uint64_t width = UINT64_MAX;
  for (int i = 0; i < 7; ++i) {
#if defined(__x86_64__)
    _mm_lfence();
#endif
    const std::uint64_t a = tsc();
    const std::uint64_t ns = base::monotonic_ns();
    const std::uint64_t b = tsc();
    if (b >= a && b - a < width) {
      width = b - a;
      best = {a + (b - a) / 2, ns};
    }
  }
  return best;
}

// ns per tick as a 32.32 fixed-point number; 0 when implausible (a counter
// below 100 MHz or above 20 GHz).
std::uint64_t rate(const Pair& a, const Pair& b) noexcept {
  if (b.tsc <= a.tsc || b.ns <= a.ns) return 0;
  const u128 r = (u128{b.ns - a.ns} << 32) / (b.tsc - a.tsc);
  if (r < (u128{1} << 32) / 20 || r > (u128{10} << 32)) return 0;
  return static_cast<std::uint64_t>(r);
}

bool kernel_keeps_time_with_tsc() {
#if defined(__x86_64__)
  if (const char* e = std::getenv("TPUHAL_TRACE_CLOCK"); e && std::strcmp(e, "monotonic") == 0) return false;
  std::ifstream f("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string s;
  return static_cast<bool>(f >> s) && s == "tsc";
#else
  return false;
#endif
}

}  // namespace

TraceClock& TraceClock::instance() {
  static TraceClock clock(kernel_keeps_time_with_tsc());
  return clock;
}

TraceClock::TraceClock(bool use_tsc) {
  if (!use_tsc) return;
  const Pair a = read_pair();
  while (base::monotonic_ns() < a.ns + kCalibrateNs) {
  }
  const Pair b = read_pair();
  const std::uint64_t r = rate(a, b);
  if (r == 0) return;  // the counter does not keep time: clock_gettime() it is
  anchor_tsc_ = a.tsc;
  anchor_ns_ = a.ns;
  tsc0_.store(b.tsc, std::memory_order_relaxed);
  ns0_.store(b.ns, std::memory_order_relaxed);
  mult_.store(r, std::memory_order_relaxed);
  tsc_ = true;
}

// A sequence lock without fences (ThreadSanitizer has none): every access
// is sequentially consistent, plain loads on x86-64.
TraceClock::Line TraceClock::load() const noexcept {
  for (;;) {
    const std::uint32_t s1 = seq_.load();
    const Line l{tsc0_.load(), ns0_.load(), mult_.load()};
    if (!(s1 & 1) && seq_.load() == s1) return l;
  }
}

std::uint64_t TraceClock::at(const Line& l, std::uint64_t t) noexcept {
  // The counter may read a little behind tsc0 on another CPU.
  if (t >= l.tsc0) return l.ns0 + static_cast<std::uint64_t>((u128{t - l.tsc0} * l.mult) >> 32);
  return l.ns0 - static_cast<std::uint64_t>((u128{l.tsc0 - t} * l.mult) >> 32);
}

std::uint64_t TraceClock::now() const noexcept {
  if (!tsc_) return base::monotonic_ns();
  const Line l = load();
  return at(l, tsc());
}

void TraceClock::resync(bool restart) noexcept {
  if (!tsc_) return;
  std::lock_guard lock(mu_);
  const Pair p = read_pair();
  const std::uint64_t r = rate(Pair{anchor_tsc_, anchor_ns_}, p);
  if (r == 0) return;
  Line next{p.tsc, p.ns, r};
  if (!restart) {
    // Continue the line from where it is at p, and bend it (by at most
    // 0.1 %) to meet the clock kHorizonNs from now.
    const std::uint64_t here = at(load(), p.tsc);
    const auto err = static_cast<std::int64_t>(p.ns - here);
    if (err < static_cast<std::int64_t>(kJumpNs) && err > -static_cast<std::int64_t>(kJumpNs)) {
      const auto limit = static_cast<std::int64_t>(r / 1000);
      const auto bend =
          std::clamp<std::int64_t>(static_cast<std::int64_t>(i128{err} * i128{r} / kHorizonNs), -limit, limit);
      next = {p.tsc, here, static_cast<std::uint64_t>(static_cast<std::int64_t>(r) + bend)};
    }
  }
  const std::uint32_t s = seq_.load();
  seq_.store(s + 1);
  tsc0_.store(next.tsc0);
  ns0_.store(next.ns0);
  mult_.store(next.mult);
  seq_.store(s + 2);
}

}  // namespace tpuhal::detail::tracing
