#include "cpu_share.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace tpuhal::sim::tensor {

namespace {

// The calling thread's schedstat file, kept open: a pread at offset 0
// reads the counts afresh.
struct WaitFile {
  int fd = -2;  // -2: not opened yet; -1: not available
  std::uint64_t last_wait = 0, last_at = 0;
  ~WaitFile() {
    if (fd >= 0) ::close(fd);
  }
};
thread_local WaitFile t_wait;

// Longer than this since a thread's last read, its next one starts afresh.
constexpr std::uint64_t kStaleNs = 8 * CpuShare::kWindowNs;

}  // namespace

CpuShare::CpuShare(unsigned threads, bool sense)
    : max_(std::max(1u, threads)), sense_(sense && threads > 1), team_(max_) {}

unsigned CpuShare::team(std::uint64_t now_ns) {
  if (!sense_) return max_;
  if (team_ < max_ && now_ns >= hold_until_) {
    team_ = max_;  // the hold is over: try the whole team again
    window_start_ = now_ns;
  }
  if (window_start_ == 0) window_start_ = now_ns;
  return team_;
}

bool CpuShare::sample_due(std::uint64_t now_ns) const {
  return sense_ && team_ > 1 && now_ns - window_start_ >= kWindowNs;
}

bool CpuShare::overdue(std::uint64_t now_ns) const {
  return sense_ && team_ > 1 && now_ns - window_start_ >= 2 * kWindowNs;
}

void CpuShare::sampled(double waited, unsigned threads, std::uint64_t now_ns) {
  window_start_ = now_ns;
  last_waited_ = waited;
  if (waited > kShrinkAbove && ++strikes_ < kStrikes) return;  // a moment's wait is not cores taken
  if (waited > kShrinkAbove) {
    strikes_ = 0;
    const auto share = static_cast<unsigned>(std::lround(static_cast<double>(threads) * (1.0 - waited)));
    team_ = std::max(1u, std::min(share, threads - 1));
    hold_ns_ = episode_ ? std::min(2 * hold_ns_, kMaxHoldNs) : kFirstHoldNs;
    hold_until_ = now_ns + hold_ns_;
    episode_ = true;
    ++shrinks_;
  } else {
    strikes_ = 0;
    if (waited < kCleanBelow && team_ == max_) episode_ = false;
  }
}

std::uint64_t CpuShare::thread_wait_ns() noexcept {
  if (t_wait.fd == -2) t_wait.fd = ::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (t_wait.fd < 0) return UINT64_MAX;
  char buf[96];
  const ssize_t n = ::pread(t_wait.fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return UINT64_MAX;
  buf[n] = 0;
  // "<on cpu ns> <waiting on a run queue ns> <timeslices>"
  unsigned long long on = 0, waiting = 0;
  if (std::sscanf(buf, "%llu %llu", &on, &waiting) != 2) return UINT64_MAX;
  return waiting;
}

double CpuShare::thread_waited_since_last(std::uint64_t now_ns) noexcept {
  const std::uint64_t w = thread_wait_ns();
  if (w == UINT64_MAX) return -1;
  const bool fresh =
      t_wait.last_at != 0 && now_ns > t_wait.last_at && now_ns - t_wait.last_at <= kStaleNs && w >= t_wait.last_wait;
  const double share =
      fresh ? static_cast<double>(w - t_wait.last_wait) / static_cast<double>(now_ns - t_wait.last_at) : -1;
  t_wait.last_wait = w;
  t_wait.last_at = now_ns;
  return share < 0 ? -1 : std::min(share, 1.0);
}

bool CpuShare::available() noexcept { return thread_wait_ns() != UINT64_MAX; }

}  // namespace tpuhal::sim::tensor
