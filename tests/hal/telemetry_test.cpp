// Device::telemetry() (docs/telemetry.md) on every device the conformance
// suite runs on: counters that agree exactly with a known workload, busy
// and idle engines, the sensors' model, and reading while work runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "device_param.hpp"
#include "support/error_of.hpp"
#include "tpuhal/tpuhal.hpp"

namespace tpuhal {
namespace {

using test::error_of;
using ::testing::HasSubstr;

const QueueTelemetry& queue_of(const Telemetry& t, std::uint32_t index) {
  for (const auto& q : t.queues)
    if (q.index == index) return q;
  ADD_FAILURE() << "no telemetry for hardware queue " << index;
  static const QueueTelemetry none;
  return none;
}

std::uint64_t busy_of(const Telemetry& t, Engine e) {
  for (const auto& x : t.engines)
    if (x.engine == e) return x.busy_ns;
  return 0;
}

class TelemetryTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dev_ = open(GetParam());
    if (!dev_.properties().caps.telemetry) {
      const Error e = error_of([&] { (void)dev_.telemetry(); });
      EXPECT_EQ(e.status(), Status::Unsupported);
      EXPECT_THAT(e.what(), HasSubstr("reports no telemetry"));
      GTEST_SKIP() << GetParam() << " reports no telemetry (caps.telemetry is false)";
    }
    // The engine the tests load: a copy engine where the board has one.
    for (const auto& e : dev_.properties().engines)
      if (e.engine == Engine::Copy) engine_ = Engine::Copy;
  }
  Device dev_;
  Engine engine_ = Engine::Compute;
};

TEST_P(TelemetryTest, CountersAgreeExactlyWithAKnownWorkload) {
  constexpr std::uint64_t kBytes = 256 * 1024;
  Queue q = dev_.queue(engine_);
  Buffer host = dev_.allocate(kBytes, Memory::HostPinned);
  Buffer a = dev_.allocate(kBytes), b = dev_.allocate(kBytes);
  std::memset(host.map().data(), 0x3C, kBytes);
  const Telemetry t0 = dev_.telemetry();
  // 3 commands: kBytes in, kBytes device to device, kBytes / 2 out; then a
  // fill of 4 KiB on the device (device to device).
  q.copy(host, a).copy(a, b).copy(b, 0, host, 0, kBytes / 2).submit().wait();
  q.fill(b, 0, 4096, 0x11).submit().wait();
  const Telemetry t1 = dev_.telemetry();
  EXPECT_EQ(t1.h2d_bytes - t0.h2d_bytes, kBytes);
  EXPECT_EQ(t1.d2d_bytes - t0.d2d_bytes, kBytes + 4096);
  EXPECT_EQ(t1.d2h_bytes - t0.d2h_bytes, kBytes / 2);
  EXPECT_EQ(t1.h2h_bytes, t0.h2h_bytes);
  // The driver adds no command of its own to these submissions.
  EXPECT_EQ(queue_of(t1, q.index()).commands - queue_of(t0, q.index()).commands, 4u);
  EXPECT_EQ(queue_of(t1, q.index()).failures, queue_of(t0, q.index()).failures);
  EXPECT_GT(queue_of(t1, q.index()).busy_ns, queue_of(t0, q.index()).busy_ns);
  for (const auto& other : t1.queues)
    if (other.index != q.index()) {
      EXPECT_EQ(other.commands, queue_of(t0, other.index).commands) << other.index;
    }
  EXPECT_GT(t1.uptime_ns, t0.uptime_ns);
  EXPECT_GE(t1.time_ns, t0.time_ns);
  EXPECT_EQ(t1.resets, t0.resets);
  EXPECT_TRUE(t1.faults.empty());
  EXPECT_EQ(t1.queues.size(), dev_.status().queues.size());
  EXPECT_EQ(t1.channels.size(), dev_.properties().caps.video_decode ? dev_.properties().decode_channels : 0u);
  EXPECT_EQ(t1.engines.size(), dev_.properties().engines.size());
}

TEST_P(TelemetryTest, AnEngineBusyThroughTheIntervalIsOneAndAnIdleOneZero) {
  // The board reads busy time and uptime from one clock reading, so an
  // engine held busy across the whole interval between two snapshots reads
  // exactly 1, however the host's threads were scheduled. A batch holds the
  // engine: it waits on a host word before its copies and again after them.
  if (!dev_.properties().caps.wait_value) GTEST_SKIP() << GetParam() << " has no wait_value";
  constexpr std::uint64_t kBytes = 1ull << 20;
  constexpr int n = 64;
  Queue q = dev_.queue(engine_);
  Buffer a = dev_.allocate(kBytes), b = dev_.allocate(kBytes);
  Buffer words = dev_.allocate(4096, Memory::HostPinned);
  auto word = [&] { return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(words.map().data())); };
  word().store(0, std::memory_order_release);
  q.fill(a, 0, kBytes, 1).submit().wait();
  const Telemetry before = dev_.telemetry();
  Batch batch = q.batch();
  batch.wait_value(words, 0, 1);
  for (int i = 0; i < n; ++i) batch.copy(i % 2 ? b : a, i % 2 ? a : b);
  Fence done = batch.wait_value(words, 0, 2).submit();

  // The engine is busy once the board has taken the batch: its busy time
  // then grows from one snapshot to the next (no other work can end).
  Telemetry t0 = dev_.telemetry();
  for (Telemetry t = dev_.telemetry(); busy_of(t, engine_) == busy_of(t0, engine_); t = dev_.telemetry()) t0 = t;
  t0 = dev_.telemetry();
  word().store(1, std::memory_order_release);
  // Every copy done, the batch held at its second wait.
  Telemetry t1 = dev_.telemetry();
  while (t1.d2d_bytes - t0.d2d_bytes < n * kBytes) t1 = dev_.telemetry();
  const Utilisation u = utilisation(t0, t1);
  EXPECT_DOUBLE_EQ(engine_ == Engine::Copy ? u.copy : u.compute, 1.0) << u.interval_s << " s";
  for (Engine e : {Engine::Compute, Engine::Copy, Engine::Video})
    if (e != engine_) {
      EXPECT_EQ(busy_of(t1, e), busy_of(t0, e)) << to_string(e);
    }
  EXPECT_EQ(t1.d2d_bytes - t0.d2d_bytes, n * kBytes);
  EXPECT_NEAR(u.d2d_gbps * u.interval_s * 1e9, static_cast<double>(n * kBytes), 1.0);
  EXPECT_FALSE(done.is_complete());
  word().store(2, std::memory_order_release);
  done.wait();

  // The batch's commands, counted once it ends (the board publishes its
  // queues' counts every few commands and at the end of a batch).
  const Telemetry t2 = dev_.telemetry();
  EXPECT_EQ(queue_of(t2, q.index()).commands - queue_of(before, q.index()).commands, std::uint64_t{n + 2});
  const Utilisation whole = utilisation(before, t2);
  EXPECT_NEAR(whole.commands_per_s * whole.interval_s, n + 2, 1e-6 * n);

  // Idle: nothing moves but time.
  const Telemetry t3 = dev_.telemetry();
  const Utilisation idle = utilisation(t2, t3);
  EXPECT_EQ(idle.compute, 0.0);
  EXPECT_EQ(idle.copy, 0.0);
  EXPECT_EQ(idle.video, 0.0);
  EXPECT_EQ(idle.commands_per_s, 0.0);

  // The board's power follows its load (t1 closed an interval at full
  // load, t3 an idle one), and its die its power, between ambient and what
  // the limit would bring.
  EXPECT_GT(t1.power_limit_w, 0.0);
  EXPECT_GT(t1.power_w, t3.power_w);
  EXPECT_LE(t1.power_w, t1.power_limit_w);
  EXPECT_GT(t3.energy_j, t0.energy_j);
  EXPECT_GT(t1.temperature_c, 0.0);
  EXPECT_LT(t1.temperature_c, 150.0);
  EXPECT_GT(t1.clock_mhz, 0u);
}

TEST_P(TelemetryTest, ReadingWhileWorkRunsLosesNothingAndNeverGoesBack) {
  constexpr std::uint64_t kBytes = 64 * 1024;
  constexpr int kRounds = 200;
  Queue q = dev_.queue(engine_);
  Buffer a = dev_.allocate(kBytes), b = dev_.allocate(kBytes);
  const Telemetry t0 = dev_.telemetry();
  std::atomic<bool> stop{false};
  std::atomic<int> reads{0}, backwards{0};
  std::thread reader([&] {
    Telemetry last = dev_.telemetry();
    while (!stop.load()) {
      const Telemetry t = dev_.telemetry();
      if (t.uptime_ns <= last.uptime_ns || t.d2d_bytes < last.d2d_bytes ||
          queue_of(t, q.index()).commands < queue_of(last, q.index()).commands || t.energy_j < last.energy_j)
        ++backwards;
      last = t;
      ++reads;
    }
  });
  for (int i = 0; i < kRounds; ++i) q.copy(a, b).submit().wait();
  // The reader may not have had a core yet: let it read a few times.
  while (reads.load() < 3) std::this_thread::yield();
  stop = true;
  reader.join();
  const Telemetry t1 = dev_.telemetry();
  EXPECT_EQ(backwards.load(), 0);
  EXPECT_EQ(t1.d2d_bytes - t0.d2d_bytes, kRounds * kBytes);
  EXPECT_EQ(queue_of(t1, q.index()).commands - queue_of(t0, q.index()).commands, std::uint64_t{kRounds});
}

TEST_P(TelemetryTest, SnapshotsOutOfOrderAreRefused) {
  const Telemetry t0 = dev_.telemetry();
  const Telemetry t1 = dev_.telemetry();
  const Error e = error_of([&] { (void)utilisation(t1, t0); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("oldest first"));
  EXPECT_EQ(error_of([&] { (void)utilisation(t0, t0); }).status(), Status::InvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Devices, TelemetryTest, ::testing::ValuesIn(testing::conformance_devices()),
                         [](const auto& p) { return testing::param_name(p.param); });

}  // namespace
}  // namespace tpuhal
