// How many threads the tensor engine should use right now: all of them
// while its threads get the CPU they ask for, fewer while they wait for it.
// Internal to the simulator.
//
// A parallel region is only as fast as its slowest thread. On a machine
// whose cores other processes also want (a shared CI runner, ctest -j, a
// second simulated board), a thread of the engine that loses its core for
// a scheduler slice (milliseconds) holds every other thread at the
// region's barrier: ResNet-50 at batch 1 on two threads ran 4 times slower
// beside one busy process on a 2-core machine, while one thread alone ran
// 1.8 times slower. The kernel counts, per thread, the time it was
// runnable but not running (/proc/thread-self/schedstat, the second
// field): a direct measure of cores taken from the engine, which a
// neighbour at nice 19 hardly moves and a busy one at normal priority
// does.
//
// The policy, on that measure:
//   - each window (kWindowNs of wall time), the engine's threads' mean
//     share of time spent waiting for a CPU, `waited`, is read in one of
//     its own parallel regions (every thread of the team reads its own);
//     where a second window passes without one (every op ran on one
//     thread or in oneDNN's own regions), the thread that runs the ops
//     reads its own when the next op begins;
//   - above kShrinkAbove in kStrikes windows in a row (one is a moment's
//     noise: a kernel thread, a page fault storm), the team shrinks in proportion to the CPU it got
//     (round(team * (1 - waited)), at least 1), and stays so for a hold
//     time (kFirstHoldNs, doubling while the cores stay taken, up to
//     kMaxHoldNs);
//   - when the hold ends, the whole team is tried again for a window: a
//     window below kCleanBelow ends the episode (the next hold starts from
//     kFirstHoldNs again).
// Results never depend on the team: every kernel gives the same bits for
// any thread count (docs/ops.md).
#pragma once

#include <cstdint>

namespace tpuhal::sim::tensor {

class CpuShare {
 public:
  static constexpr std::uint64_t kWindowNs = 20'000'000;
  static constexpr double kShrinkAbove = 0.15;
  static constexpr unsigned kStrikes = 2;
  static constexpr double kCleanBelow = 0.05;
  static constexpr std::uint64_t kFirstHoldNs = 250'000'000;
  static constexpr std::uint64_t kMaxHoldNs = 4'000'000'000;

  // `threads`: the most the engine may use. `sense`: whether to read the
  // threads' waits at all (false: always every thread, as when the kernel
  // keeps no schedstat).
  CpuShare(unsigned threads, bool sense);

  unsigned max_threads() const { return max_; }
  // The team for work starting at `now_ns`: ends a hold that is over.
  unsigned team(std::uint64_t now_ns);
  // Whether the next parallel region of the whole team should read the
  // threads' waits.
  bool sample_due(std::uint64_t now_ns) const;
  // Whether a whole window more has passed with no region sampled: the
  // ops ran on one thread or on oneDNN's threads, whose regions the engine
  // does not enter. The thread that runs the ops then reads its own wait
  // (sampled(), or restart() where it has no reading yet).
  bool overdue(std::uint64_t now_ns) const;
  // Starts the window afresh without a reading.
  void restart(std::uint64_t now_ns) { window_start_ = now_ns; }
  // A region of `threads` threads (the whole team) read them: `waited` is
  // their mean share of wall time spent waiting for a CPU since each last
  // read.
  void sampled(double waited, unsigned threads, std::uint64_t now_ns);

  // How often the team shrank, and the share that made it shrink last
  // (for logs and tests).
  std::uint64_t shrinks() const { return shrinks_; }
  double last_waited() const { return last_waited_; }

  // This thread's time spent runnable but not running, in nanoseconds
  // since it started; UINT64_MAX where the kernel does not say (no
  // /proc/thread-self/schedstat). Cheap: one pread of a file kept open per
  // thread.
  static std::uint64_t thread_wait_ns() noexcept;
  // This thread's share of wall time spent waiting since its last call;
  // negative on its first call, after a long gap, or where the kernel does
  // not say.
  static double thread_waited_since_last(std::uint64_t now_ns) noexcept;
  // Whether this machine's kernel keeps the counts.
  static bool available() noexcept;

 private:
  unsigned max_;
  bool sense_;
  unsigned team_;
  std::uint64_t window_start_ = 0;  // when the current window began (0: not yet)
  std::uint64_t hold_until_ = 0;    // a shrunk team keeps until then
  std::uint64_t hold_ns_ = kFirstHoldNs;
  unsigned strikes_ = 0;  // windows in a row above kShrinkAbove
  bool episode_ = false;  // shrunk since the last clean window of the whole team
  std::uint64_t shrinks_ = 0;
  double last_waited_ = 0;
};

}  // namespace tpuhal::sim::tensor
