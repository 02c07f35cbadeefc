// The tensor engine's team follows the CPU its threads get (CpuShare,
// simulator/src/tensor/cpu_share.h): the policy on given waits, and the
// kernel's count it reads, on two threads made to share one CPU.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "cpu_share.h"

namespace tpuhal::sim::tensor {
namespace {

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

TEST(CpuShare, GivenNoSensingOrOneThreadThenTheTeamNeverChanges) {
  CpuShare off(4, false);
  EXPECT_EQ(off.team(kMs), 4u);
  EXPECT_FALSE(off.sample_due(kMs + 10 * CpuShare::kWindowNs));
  CpuShare one(1, true);
  EXPECT_EQ(one.team(kMs), 1u);
  EXPECT_FALSE(one.sample_due(kMs + 10 * CpuShare::kWindowNs));
}

// Two threads that spin on the same CPU: each waits while the other runs,
// and the kernel's count of it grows.
TEST(CpuShare, GivenTwoBusyThreadsOnOneCpuThenEachCountsTimeWaited) {
  if (!CpuShare::available()) GTEST_SKIP() << "this kernel keeps no /proc/thread-self/schedstat";
  cpu_set_t mine;
  ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof mine, &mine), 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &mine)) ++cpu;
  ASSERT_LT(cpu, CPU_SETSIZE);
  std::atomic<int> grown{0};
  auto spin = [&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (pthread_setaffinity_np(pthread_self(), sizeof one, &one) != 0) return;
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

}  // namespace
}  // namespace tpuhal::sim::tensor
