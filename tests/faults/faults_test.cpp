// Faults on demand (docs/faults.md): for each kind, inject it into a
// simulated board, check that the waiting caller gets an error naming the
// device, queue and command within a bounded time, that another queue keeps
// working where the fault allows, then reset the device and check that it
// works again and that no memory leaked.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "fault_support.hpp"
#include "support/asleep.hpp"
#include "support/trace_check.hpp"
#include "tpuhal/sim/board.h"
#include "tpuhal/sim/profile.h"
#include "tpuhal/tpu/sim_provider.h"
#include "tpuhal/trace.hpp"
#include "tpuhal/tpuhal.hpp"
#include "support/temp_path.hpp"

namespace tpuhal {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using namespace fault_test;

constexpr const char* kUri = "sim:tiny";
constexpr std::uint64_t kBytes = 64 * 1024;

class Faults : public ::testing::Test {
 protected:
  void SetUp() override {
    dev = open(kUri);
    board = tpu::sim_board_of(kUri);
    ASSERT_NE(board, nullptr);
    WaitPolicy p = dev.wait_policy();
    p.timeout = 500ms;  // a hang is declared after half a second without progress
    dev.set_wait_policy(p);
    baseline = dev.memory_stats();
  }

  // Copies a pattern host -> device -> host on `q` and checks every byte.
  void round_trip(Queue& q, std::uint8_t seed) {
    Buffer in = dev.allocate(kBytes, Memory::HostPinned);
    Buffer out = dev.allocate(kBytes, Memory::HostPinned);
    Buffer dram = dev.allocate(kBytes);
    auto src = in.map();
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = std::byte(static_cast<std::uint8_t>(i * 7 + seed));
    std::memset(out.map().data(), 0, kBytes);
    q.copy(in, dram).copy(dram, out).submit().wait(5s);
    EXPECT_EQ(std::memcmp(in.map().data(), out.map().data(), kBytes), 0);
  }

  // After everything is released: the device holds exactly what it held
  // when the test opened it.
  void expect_no_leaks() {
    const MemoryStats now = dev.memory_stats();
    EXPECT_EQ(now.device_used, baseline.device_used);
    EXPECT_EQ(now.host_pinned_bytes, baseline.host_pinned_bytes);
    EXPECT_EQ(now.host_pinned_allocations, baseline.host_pinned_allocations);
    ASSERT_EQ(now.heaps.size(), baseline.heaps.size());
    for (std::size_t i = 0; i < now.heaps.size(); ++i)
      EXPECT_EQ(now.heaps[i].allocations, baseline.heaps[i].allocations) << now.heaps[i].name;
  }

  // Resets, then checks that new queues of both engines work.
  void reset_and_check() {
    dev.reset();
    Queue compute = dev.queue(Engine::Compute);
    Queue copy = dev.queue(Engine::Copy);
    round_trip(compute, 11);
    round_trip(copy, 13);
  }

  Device dev;
  std::shared_ptr<sim::Board> board;
  MemoryStats baseline;
};

TEST_F(Faults, GivenDmaErrorWhenWaitingThenDeviceFaultNamesCommandAndOtherQueueWorks) {
  {
    Queue q = dev.queue(Engine::Compute);
    Queue other = dev.queue(Engine::Copy);
    Buffer a = dev.allocate(kBytes, Memory::HostPinned);
    Buffer b = dev.allocate(kBytes);
    // The first command passes; the next copy or fill fails on the bus.
    board->inject({.kind = sim::FaultKind::kDmaError, .queue = q.index(), .after_commands = 1});
    Fence ok = q.copy(a, b).submit();
    Fence bad = q.fill(b, 0, 256, 0x5A).copy(b, a).submit();
    ok.wait();
    const std::string msg = expect_error([&] { bad.wait(); }, Status::DeviceFault);
    EXPECT_THAT(msg, HasSubstr(std::string(kUri) + " compute queue " + std::to_string(q.index())));
    EXPECT_THAT(msg, HasSubstr("submission 2 failed at command 1 of 2"));
    EXPECT_THAT(msg, HasSubstr("fill"));
    EXPECT_THAT(msg, HasSubstr("DMA error"));
    // The failed queue refuses more work with the same facts.
    expect_error([&] { q.submit(); }, Status::DeviceFault);
    // Another queue carries on.
    round_trip(other, 1);
  }
  reset_and_check();
  expect_no_leaks();
}

// Telemetry counts the failed command by kind and on its queue, a firmware
// crash and the resets; none of it is cleared by the reset.
TEST_F(Faults, TelemetryCountsFaultsByKindAndResetsClearNothing) {
  const Telemetry t0 = dev.telemetry();
  std::uint32_t qi = 0;
  {
    Queue q = dev.queue(Engine::Compute);
    qi = q.index();
    Buffer a = dev.allocate(kBytes, Memory::HostPinned);
    Buffer b = dev.allocate(kBytes);
    board->inject({.kind = sim::FaultKind::kDmaError, .queue = q.index(), .after_commands = 1});
    q.copy(a, b).submit().wait();
    expect_error([&] { q.fill(b, 0, 256, 1).submit().wait(); }, Status::DeviceFault);
  }
  const Telemetry t1 = dev.telemetry();
  ASSERT_EQ(t1.faults.size(), 1u);
  EXPECT_EQ(t1.faults[0].kind, "DMA fault");
  EXPECT_EQ(t1.faults[0].count, 1u);
  auto queue = [&](const Telemetry& t) {
    for (const auto& q : t.queues)
      if (q.index == qi) return q;
    return QueueTelemetry{};
  };
  EXPECT_EQ(queue(t1).failures - queue(t0).failures, 1u);
  EXPECT_EQ(t1.h2d_bytes - t0.h2d_bytes, kBytes);  // the copy before the fault

  dev.reset();
  board->inject({.kind = sim::FaultKind::kFirmwareCrash});
  expect_error(
      [&] {
        Queue q = dev.queue(Engine::Copy);
        q.submit().wait();
      },
      Status::DeviceLost);
  dev.reset();
  const Telemetry t2 = dev.telemetry();
  EXPECT_EQ(t2.resets - t0.resets, 2u);
  EXPECT_EQ(t2.h2d_bytes, t1.h2d_bytes);
  EXPECT_EQ(queue(t2).failures, queue(t1).failures);
  ASSERT_EQ(t2.faults.size(), 2u);
  EXPECT_EQ(t2.faults[0].kind, "DMA fault");
  EXPECT_EQ(t2.faults[1].kind, "firmware crash");
  EXPECT_EQ(t2.faults[1].count, 1u);
  EXPECT_GT(t2.uptime_ns, t1.uptime_ns);
  EXPECT_LT(t2.time_ns, t2.uptime_ns);  // board time restarts at each reset
  reset_and_check();
  expect_no_leaks();
}

// A fault in a trace: an instant on the failed queue's track with the
// board's finding, the failed submission's flow closed, the reset marked;
// and the error still numbers the caller's commands, not the trace's
// timestamps between them.
TEST_F(Faults, ATraceShowsTheFaultOnItsQueuesTrackAndTheReset) {
  const std::string path = test::temp_path("fault_trace.json");
  trace::start(path);
  {
    Queue q = dev.queue(Engine::Compute);
    Buffer a = dev.allocate(kBytes, Memory::HostPinned);
    Buffer b = dev.allocate(kBytes);
    // The board counts the trace's timestamps as commands: the first
    // submission is timestamp, copy, timestamp. After two commands the next
    // one that moves data fails: the second submission's fill.
    board->inject({.kind = sim::FaultKind::kDmaError, .queue = q.index(), .after_commands = 2});
    Fence ok = q.copy(a, b).submit();
    Fence bad = q.fill(b, 0, 256, 0x5A).copy(b, a).submit();
    ok.wait();
    const std::string msg = expect_error([&] { bad.wait(); }, Status::DeviceFault);
    EXPECT_THAT(msg, HasSubstr("submission 2 failed at command 1 of 2"));
    // The failed queue refuses more work: that submit's slice says it threw.
    expect_error([&] { q.fill(b, 0, 256, 1).submit(); }, Status::DeviceFault);
  }
  dev.reset();
  trace::stop();
  const auto t = tpuhal::test::read_trace(path);
  EXPECT_THAT(tpuhal::test::check_trace(t), ::testing::IsEmpty());
  const auto failed = tpuhal::test::events_named(t, "i", "queue failed");
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_THAT(failed[0]["args"]["message"].get<std::string>(), HasSubstr("DMA error"));
  const auto open_ended = tpuhal::test::events_named(t, "X", "not completed (queue failed)");
  ASSERT_EQ(open_ended.size(), 1u);
  EXPECT_EQ(open_ended[0]["args"]["value"], 2);
  EXPECT_EQ(open_ended[0]["tid"], failed[0]["tid"]);
  EXPECT_EQ(tpuhal::test::events_named(t, "X", "copy").size(), 1u);  // the first submission's
  const auto submits = tpuhal::test::events_named(t, "X", "submit");
  ASSERT_EQ(submits.size(), 3u);
  EXPECT_FALSE(submits[0]["args"].contains("threw"));
  EXPECT_FALSE(submits[1]["args"].contains("threw"));
  EXPECT_EQ(submits[2]["args"]["threw"], 1);
  EXPECT_EQ(tpuhal::test::events_named(t, "i", "reset").size(), 1u);
  EXPECT_EQ(tpuhal::test::events_named(t, "X", "reset").size(), 1u);
  reset_and_check();
  expect_no_leaks();
}

TEST_F(Faults, GivenHangWhenWaitingThenTimeoutNamesCommandAndOtherQueueWorks) {
  {
    Queue q = dev.queue(Engine::Compute);
    Queue other = dev.queue(Engine::Copy);
    Buffer b = dev.allocate(kBytes);
    board->inject({.kind = sim::FaultKind::kHang, .queue = q.index(), .after_commands = 1});
    q.fill(b, 0, 256, 1).submit().wait();
    Fence stuck = q.fill(b, 0, 256, 2).fill(b, 256, 256, 3).submit();
    const auto start = Clock::now();
    const std::string msg = expect_error([&] { stuck.wait(); }, Status::Timeout);
    EXPECT_GE(since(start), 400ms);
    EXPECT_THAT(msg, HasSubstr(std::string(kUri) + " compute queue " + std::to_string(q.index())));
    EXPECT_THAT(msg, HasSubstr("timeline value 2 not reached"));
    EXPECT_THAT(msg, HasSubstr("command 1 of submission 2"));
    round_trip(other, 2);
    // A reset discards the hung work: the waiter now gets "queue reset".
    dev.reset();
    const std::string after = expect_error([&] { stuck.wait(); }, Status::DeviceFault);
    EXPECT_THAT(after, HasSubstr("queue reset"));
    EXPECT_THAT(after, HasSubstr("submission 2 did not complete and was discarded"));
    expect_error([&] { q.submit(); }, Status::DeviceFault);
  }
  reset_and_check();
  expect_no_leaks();
}

TEST_F(Faults, GivenFirmwareCrashWhenWaitingThenDeviceLostOnEveryQueueUntilReset) {
  {
    Queue q = dev.queue(Engine::Compute);
    Queue other = dev.queue(Engine::Copy);
    Buffer b = dev.allocate(kBytes);
    board->inject({.kind = sim::FaultKind::kFirmwareCrash, .queue = q.index(), .after_commands = 1});
    Fence ok = q.fill(b, 0, 256, 1).submit();
    Fence lost = q.fill(b, 0, 256, 2).fill(b, 256, 256, 3).submit();
    ok.wait();
    const std::string msg = expect_error([&] { lost.wait(); }, Status::DeviceLost);
    EXPECT_THAT(msg, HasSubstr(std::string(kUri) + " compute queue " + std::to_string(q.index())));
    EXPECT_THAT(msg, HasSubstr("firmware fault"));
    EXPECT_THAT(msg, HasSubstr("submission 2 stopped before command 1 of 2"));
    // The firmware runs no queue: the other one fails too, as does a new one.
    const std::string o = expect_error([&] { other.copy(b, 0, b, 4096, 256).submit().wait(); }, Status::DeviceLost);
    EXPECT_THAT(o, HasSubstr("copy queue " + std::to_string(other.index())));
    expect_error([&] { dev.queue(Engine::Compute); }, Status::DeviceLost);
  }
  reset_and_check();
  expect_no_leaks();
}

TEST_F(Faults, GivenEccErrorWhenReadingPoisonedMemoryThenDeviceFaultNamesAddress) {
  {
    Queue q = dev.queue(Engine::Compute);
    Queue other = dev.queue(Engine::Copy);
    Buffer host = dev.allocate(kBytes, Memory::HostPinned);
    Buffer bad = dev.allocate(kBytes);
    const std::uint64_t at = bad.device_address() + 4096;
    board->inject({.kind = sim::FaultKind::kEccError, .address = at, .size = 64});
    // Writes do not read: a fill of the poisoned range succeeds.
    q.fill(bad, 0, kBytes, 0x33).submit().wait();
    Fence f = q.copy(bad, host).submit();
    const std::string msg = expect_error([&] { f.wait(); }, Status::DeviceFault);
    char hex[32];
    std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(at));
    EXPECT_THAT(msg, HasSubstr(std::string(kUri) + " compute queue " + std::to_string(q.index())));
    EXPECT_THAT(msg, HasSubstr("submission 2 failed at command 1 of 1"));
    EXPECT_THAT(msg, HasSubstr(std::string("ECC error at device address ") + hex));
    // Memory elsewhere reads fine on another queue.
    round_trip(other, 3);
  }
  reset_and_check();
  // A reset scrubs the poison: the same range reads again.
  {
    Queue q = dev.queue(Engine::Compute);
    Buffer host = dev.allocate(kBytes, Memory::HostPinned);
    Buffer dram = dev.allocate(kBytes);
    q.fill(dram, 0, kBytes, 0x44).copy(dram, host).submit().wait();
    EXPECT_EQ(host.map()[4096], std::byte{0x44});
  }
  expect_no_leaks();
}

// Waits in Block mode for a submission that completes while the waiter
// sleeps: the board waits for a host word that another thread writes at
// least 20 ms later, once the waiter is asleep in the wait (a busy machine
// may run the waiter late); returns how long the wait took.
std::chrono::milliseconds blocked_wait(Device& dev, Queue& q) {
  Buffer word = dev.allocate(4096, Memory::HostPinned);
  auto* w = reinterpret_cast<std::uint64_t*>(word.map().data());
  std::atomic_ref<std::uint64_t>(*w).store(0);
  Fence f = q.batch().wait_value(word, 0, 1).submit();
  WaitPolicy block = dev.wait_policy();
  block.mode = WaitPolicy::Mode::Block;
  block.timeout = 5s;
  const pid_t waiter = test::this_thread_id();
  std::thread writer([w, waiter] {
    std::this_thread::sleep_for(20ms);
    test::until_asleep(waiter);
    std::atomic_ref<std::uint64_t>(*w).store(1);
  });
  const auto start = Clock::now();
  f.wait(block);
  const auto took = since(start);
  writer.join();
  return took;
}

// The shortest of up to 20 blocked waits, stopping at the first inside
// 90 ms: with interrupts delivered, one of them wakes well inside the
// first 100 ms slice even on a busy machine (which may delay any one
// wake-up, or several in a row); with interrupts lost, none can.
std::chrono::milliseconds shortest_blocked_wait(Device& dev, Queue& q) {
  auto best = blocked_wait(dev, q);
  for (int i = 0; i < 19 && best >= 90ms; ++i) best = std::min(best, blocked_wait(dev, q));
  return best;
}

TEST_F(Faults, GivenInterruptLostWhenBlockingThenCompletionIsNoticedWithinOneSlice) {
  {
    Queue q = dev.queue(Engine::Compute);
    // Interrupts delivered: the waiter wakes as the word is written.
    EXPECT_LT(shortest_blocked_wait(dev, q), 90ms);
    board->inject({.kind = sim::FaultKind::kInterruptLost, .queue = q.index()});
    // Every interrupt of the queue is lost: the waiter notices completion at
    // the end of its bounded sleep (100 ms slices), never sooner, and not
    // never (the wait's own timeout, 5 s, would throw).
    const auto took = blocked_wait(dev, q);
    EXPECT_GE(took, 90ms);
    round_trip(q, 4);
  }
  reset_and_check();
  {
    Queue q = dev.queue(Engine::Compute);
    EXPECT_LT(shortest_blocked_wait(dev, q), 90ms);  // the reset restored interrupts
  }
  expect_no_leaks();
}

TEST_F(Faults, GivenDeviceLostWhenWaitingThenDeviceLostWithinBoundedTime) {
  {
    Queue q = dev.queue(Engine::Compute);
    Queue other = dev.queue(Engine::Copy);
    Buffer b = dev.allocate(kBytes);
    board->inject({.kind = sim::FaultKind::kDeviceLost, .queue = q.index(), .after_commands = 1});
    Fence ok = q.fill(b, 0, 256, 1).submit();
    Fence lost = q.fill(b, 0, 256, 2).submit();
    ok.wait();
    for (auto mode : {WaitPolicy::Mode::Block, WaitPolicy::Mode::Spin, WaitPolicy::Mode::Hybrid}) {
      WaitPolicy p = dev.wait_policy();
      p.mode = mode;
      p.timeout = 5s;
      const std::string msg = expect_error([&] { lost.wait(p); }, Status::DeviceLost);
      EXPECT_THAT(msg, HasSubstr(std::string(kUri) + " compute queue " + std::to_string(q.index())));
      EXPECT_THAT(msg, HasSubstr("does not answer"));
      EXPECT_THAT(msg, HasSubstr("submission 2 did not complete"));
    }
    // Nothing on the board answers: the other queue fails too.
    expect_error([&] { other.fill(b, 0, 256, 3).submit().wait(); }, Status::DeviceLost);
  }
  reset_and_check();
  expect_no_leaks();
}

TEST_F(Faults, GivenPendingFaultWhenResetThenItIsCleared) {
  board->inject({.kind = sim::FaultKind::kHang, .queue = 0, .after_commands = 0});
  dev.reset();
  reset_and_check();
  expect_no_leaks();
}

TEST(FaultSpec, ParsesEveryKindAndRejectsNonsense) {
  auto f = sim::parse_faults(
      "dma-error:queue=1:after=2,ecc:address=0x1000:size=64,irq-lost:queue=0:count=3,"
      "hang,crash:after=5,lost");
  ASSERT_EQ(f.size(), 6u);
  EXPECT_EQ(f[0].kind, sim::FaultKind::kDmaError);
  EXPECT_EQ(f[0].queue, 1u);
  EXPECT_EQ(f[0].after_commands, 2u);
  EXPECT_EQ(f[1].kind, sim::FaultKind::kEccError);
  EXPECT_EQ(f[1].address, 0x1000u);
  EXPECT_EQ(f[1].size, 64u);
  EXPECT_EQ(f[2].count, 3u);
  EXPECT_EQ(f[3].kind, sim::FaultKind::kHang);
  EXPECT_EQ(f[4].kind, sim::FaultKind::kFirmwareCrash);
  EXPECT_EQ(f[5].kind, sim::FaultKind::kDeviceLost);
  EXPECT_THROW(sim::parse_faults("melt"), sim::ProfileError);
  EXPECT_THROW(sim::parse_faults("hang:queue=x"), sim::ProfileError);
  EXPECT_THROW(sim::parse_faults("hang:speed=1"), sim::ProfileError);
  EXPECT_THROW(sim::parse_faults("ecc:address=0"), sim::ProfileError);
}

TEST(FaultSpec, GivenEnvironmentFaultWhenBoardOpensThenItStrikes) {
  ASSERT_EQ(::setenv("TPUHAL_SIM_FAULTS", "dma-error:queue=0", 1), 0);
  Device dev = open(kUri);
  ::unsetenv("TPUHAL_SIM_FAULTS");
  Queue q = dev.queue(Engine::Compute);
  ASSERT_EQ(q.index(), 0u);
  Buffer b = dev.allocate(kBytes);
  const std::string msg = expect_error([&] { q.fill(b, 0, 64, 1).submit().wait(5s); }, Status::DeviceFault);
  EXPECT_THAT(msg, HasSubstr("DMA error"));
}

TEST(FaultSpec, GivenBadEnvironmentWhenBoardOpensThenInvalidArgument) {
  ASSERT_EQ(::setenv("TPUHAL_SIM_FAULTS", "hang:queue=oops", 1), 0);
  const std::string msg = expect_error([] { open(kUri); }, Status::InvalidArgument);
  ::unsetenv("TPUHAL_SIM_FAULTS");
  EXPECT_THAT(msg, HasSubstr("TPUHAL_SIM_FAULTS"));
}

}  // namespace
}  // namespace tpuhal
