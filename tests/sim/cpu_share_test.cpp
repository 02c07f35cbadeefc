// The tensor engine's team follows the CPU its threads get (CpuShare,
// simulator/src/tensor/cpu_share.h): the policy on given waits, the
// kernel's count it reads, on two threads made to share one CPU, and the
// engine's pool (WorkerPool) shrinking its team when its ops' thread
// waits, its OpenMP workers spinning only briefly after a region.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "cpu_share.h"
#include "engine.h"
#include "support/scoped_env.hpp"

namespace tpuhal::sim::tensor {
namespace {

using test::ScopedEnv;

constexpr std::uint64_t kMs = 1'000'000;

TEST(CpuShare, GivenThreadsThatHardlyWaitThenTheWholeTeamStays) {
  CpuShare s(2, true);
  std::uint64_t t = 1 * kMs;
  EXPECT_EQ(s.team(t), 2u);
  EXPECT_FALSE(s.sample_due(t + CpuShare::kWindowNs - 1));
  EXPECT_TRUE(s.sample_due(t + CpuShare::kWindowNs));
  // A neighbour at nice 19 costs the engine's threads a few percent.
  for (int i = 0; i < 100; ++i) {
    t += CpuShare::kWindowNs;
    s.sampled(0.04, 2, t);
    EXPECT_EQ(s.team(t), 2u);
  }
  EXPECT_EQ(s.shrinks(), 0u);
}

// Waits above the threshold in kStrikes windows in a row.
void waited(CpuShare& s, double share, unsigned threads, std::uint64_t& t) {
  for (unsigned i = 0; i < CpuShare::kStrikes; ++i) {
    t += CpuShare::kWindowNs;
    s.sampled(share, threads, t);
  }
}

TEST(CpuShare, GivenOneWindowOfWaitingAmongQuietOnesThenTheTeamStays) {
  CpuShare s(2, true);
  std::uint64_t t = 1 * kMs;
  s.team(t);
  for (int i = 0; i < 50; ++i) {
    t += CpuShare::kWindowNs;
    s.sampled(i % 2 ? 0.6 : 0.01, 2, t);  // a kernel thread, a burst of page faults
    EXPECT_EQ(s.team(t), 2u);
  }
  EXPECT_EQ(s.shrinks(), 0u);
}

TEST(CpuShare, GivenCoresTakenThenTheTeamShrinksInProportionForAHold) {
  CpuShare two(2, true);
  std::uint64_t t = 1 * kMs;
  two.team(t);
  waited(two, 0.33, 2, t);  // three busy threads on two cores: each waits a third
  EXPECT_EQ(two.team(t), 1u);
  EXPECT_FALSE(two.sample_due(t + CpuShare::kWindowNs));  // one thread: no region to read it in
  EXPECT_EQ(two.team(t + CpuShare::kFirstHoldNs - 1), 1u);
  EXPECT_EQ(two.team(t + CpuShare::kFirstHoldNs), 2u);  // then the whole team again

  CpuShare many(16, true);
  many.team(t);
  waited(many, 0.30, 16, t);
  EXPECT_EQ(many.team(t), 11u);  // round(16 * 0.7)
  CpuShare slight(16, true);
  slight.team(t);
  waited(slight, 0.16, 16, t);
  EXPECT_EQ(slight.team(t), 13u);  // round(16 * 0.84)
}

TEST(CpuShare, GivenCoresThatStayTakenThenEachHoldDoublesUntilAWindowIsClean) {
  CpuShare s(2, true);
  std::uint64_t t = 1 * kMs;
  s.team(t);
  std::uint64_t hold = CpuShare::kFirstHoldNs;
  for (int episode = 0; episode < 8; ++episode) {
    waited(s, 0.4, 2, t);
    ASSERT_EQ(s.team(t), 1u);
    EXPECT_EQ(s.team(t + hold - 1), 1u) << "episode " << episode;
    t += hold;
    EXPECT_EQ(s.team(t), 2u) << "episode " << episode;
    hold = std::min(2 * hold, CpuShare::kMaxHoldNs);
  }
  // The cores come back: a clean window of the whole team ends the episode.
  t += CpuShare::kWindowNs;
  s.sampled(0.01, 2, t);
  waited(s, 0.4, 2, t);
  EXPECT_EQ(s.team(t + CpuShare::kFirstHoldNs - 1), 1u);
  EXPECT_EQ(s.team(t + CpuShare::kFirstHoldNs), 2u);
}

// Ops that run on one thread, or in oneDNN's regions, enter no region of
// the engine's whole team: a second window without a reading makes the
// thread that runs the ops read its own.
TEST(CpuShare, GivenAWindowPassedWithNoRegionReadingThenTheNextIsOverdue) {
  CpuShare s(2, true);
  std::uint64_t t = 1 * kMs;
  s.team(t);
  EXPECT_TRUE(s.sample_due(t + CpuShare::kWindowNs));
  EXPECT_FALSE(s.overdue(t + 2 * CpuShare::kWindowNs - 1));
  EXPECT_TRUE(s.overdue(t + 2 * CpuShare::kWindowNs));
  t += 2 * CpuShare::kWindowNs;
  s.restart(t);  // a first reading says nothing yet: the window starts again
  EXPECT_FALSE(s.overdue(t + CpuShare::kWindowNs));
  EXPECT_FALSE(s.sample_due(t + CpuShare::kWindowNs - 1));
  t += 2 * CpuShare::kWindowNs;
  s.sampled(0.02, 2, t);
  EXPECT_FALSE(s.overdue(t + 2 * CpuShare::kWindowNs - 1));
  waited(s, 0.5, 2, t);
  EXPECT_EQ(s.team(t), 1u);
  EXPECT_FALSE(s.overdue(t + 10 * CpuShare::kWindowNs));  // one thread: nothing to shrink
  CpuShare off(2, false);
  off.team(t);
  EXPECT_FALSE(off.overdue(t + 10 * CpuShare::kWindowNs));
}

TEST(CpuShare, GivenNoSensingOrOneThreadThenTheTeamNeverChanges) {
  CpuShare off(4, false);
  EXPECT_EQ(off.team(kMs), 4u);
  EXPECT_FALSE(off.sample_due(kMs + 10 * CpuShare::kWindowNs));
  CpuShare one(1, true);
  EXPECT_EQ(one.team(kMs), 1u);
  EXPECT_FALSE(one.sample_due(kMs + 10 * CpuShare::kWindowNs));
}

// The first CPU this thread may run on, or -1.
int first_cpu() {
  cpu_set_t mine;
  if (pthread_getaffinity_np(pthread_self(), sizeof mine, &mine) != 0) return -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &mine)) return cpu;
  return -1;
}

// Keeps the calling thread on `cpu` alone.
bool pin_to(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0;
}

// Two threads that spin on the same CPU: each waits while the other runs,
// and the kernel's count of it grows.
TEST(CpuShare, GivenTwoBusyThreadsOnOneCpuThenEachCountsTimeWaited) {
  if (!CpuShare::available()) GTEST_SKIP() << "this kernel keeps no /proc/thread-self/schedstat";
  const int cpu = first_cpu();
  ASSERT_GE(cpu, 0);
  std::atomic<int> grown{0};
  auto spin = [&] {
    if (!pin_to(cpu)) return;
    const std::uint64_t before = CpuShare::thread_wait_ns();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool mine_grew = false;
    // Both keep spinning until both have seen their count grow, so that
    // neither leaves the other alone on the CPU.
    while (grown.load() < 2 && std::chrono::steady_clock::now() < deadline) {
      if (!mine_grew && CpuShare::thread_wait_ns() > before) {
        mine_grew = true;
        grown.fetch_add(1);
      }
    }
  };
  std::thread a(spin), b(spin);
  a.join();
  b.join();
  EXPECT_EQ(grown.load(), 2);
  // The share since a thread's last read is a fraction of wall time.
  const std::uint64_t now = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
  EXPECT_LT(CpuShare::thread_waited_since_last(now), 0);  // a first read says nothing yet
  const double share = CpuShare::thread_waited_since_last(now + CpuShare::kWindowNs);
  EXPECT_GE(share, 0.0);
  EXPECT_LE(share, 1.0);
}

// A thread that runs only ops too small to share (no region of the whole
// team, as with oneDNN's convolutions) and loses its CPU to a busy
// neighbour half the time: the pool shrinks its team all the same. Before,
// only the engine's own regions read the waits, and an int8 network whose
// convolutions are oneDNN's ran 40 times slower beside two busy processes
// on two cores, its threads meeting at oneDNN's barriers.
TEST(WorkerPool, GivenOpsOutsideTheTeamsRegionsOnAThreadThatWaitsThenTheTeamShrinks) {
  if (!CpuShare::available()) GTEST_SKIP() << "this kernel keeps no /proc/thread-self/schedstat";
  ::unsetenv("TPUHAL_SIM_FIXED_THREADS");
  const int cpu = first_cpu();
  ASSERT_GE(cpu, 0);
  std::uint64_t shrinks = 0;
  std::atomic<bool> done{false};
  std::thread ops([&] {
    WorkerPool pool(2);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    EXPECT_TRUE(pin_to(cpu));
    while (pool.share().shrinks() == 0 && std::chrono::steady_clock::now() < deadline) pool.begin_op(0);
    shrinks = pool.share().shrinks();
    EXPECT_GT(pool.share().last_waited(), CpuShare::kShrinkAbove);
    done.store(true);
  });
  std::thread neighbour([&] {
    EXPECT_TRUE(pin_to(cpu));
    while (!done.load()) {
    }
  });
  ops.join();
  neighbour.join();
  EXPECT_EQ(shrinks, 1u);
}

// LLVM's libomp: the calling thread's blocktime, in ms. Absent (null) from
// GNU libgomp.
extern "C" int kmp_get_blocktime() __attribute__((weak));

// The blocktime a new thread's teams get, after an op has begun on it
// (`op`) or not.
int blocktime_of_a_thread(bool op) {
  int got = -1;
  std::thread t([&] {
    if (op) {
      WorkerPool pool(2);
      pool.begin_op(0);
    }
    got = kmp_get_blocktime();
  });
  t.join();
  return got;
}

// libomp's workers spin 200 ms after a region by default, holding a core
// between the engine's ops: the engine's thread sets WorkerPool::kSpinMs
// for its teams, unless the user said how OpenMP should wait.
TEST(WorkerPool, GivenNoWordFromTheUserThenOpenMpWorkersSpinBrieflyAfterARegion) {
  if (!kmp_get_blocktime) GTEST_SKIP() << "the OpenMP runtime is GNU libgomp, whose spinning has no per-thread setting";
  {
    const ScopedEnv blocktime("KMP_BLOCKTIME", nullptr), policy("OMP_WAIT_POLICY", nullptr);
    EXPECT_EQ(blocktime_of_a_thread(true), WorkerPool::kSpinMs);
  }
  const int runtimes = blocktime_of_a_thread(false);  // the runtime's, from the environment it started in
  ASSERT_NE(runtimes, WorkerPool::kSpinMs) << "the test needs a runtime whose own blocktime is not the engine's";
  {
    const ScopedEnv blocktime("KMP_BLOCKTIME", "0");
    EXPECT_EQ(blocktime_of_a_thread(true), runtimes);
  }
  {
    const ScopedEnv blocktime("KMP_BLOCKTIME", nullptr), policy("OMP_WAIT_POLICY", "passive");
    EXPECT_EQ(blocktime_of_a_thread(true), runtimes);
  }
}

}  // namespace
}  // namespace tpuhal::sim::tensor
