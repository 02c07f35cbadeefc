// Tracing (tpuhal/trace.hpp, docs/tracing.md): starting and stopping, bad
// files, the caller's own slices, many threads at once, events accounted
// for when the writer falls behind, and long batches. What a known
// workload looks like on every device kind is in the conformance suite.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <set>
#include <thread>
#include <vector>

#include "support/error_of.hpp"
#include "support/trace_check.hpp"
#include "tpuhal/trace.hpp"
#include "tpuhal/tpuhal.hpp"
#include "support/temp_path.hpp"

namespace tpuhal {
namespace {

using test::error_of;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::string temp(const std::string& name) { return test::temp_path(name); }

TEST(Trace, AFileThatCannotBeCreatedIsRefusedWithTheSystemsReason) {
  Error e = error_of([] { trace::start("/nonexistent-directory/trace.json"); });
  EXPECT_EQ(e.status(), Status::NotFound);
  EXPECT_THAT(e.what(), HasSubstr("cannot create /nonexistent-directory/trace.json: No such file or directory"));
  EXPECT_FALSE(trace::active());
  EXPECT_EQ(error_of([] { trace::start(""); }).status(), Status::InvalidArgument);
  // Tracing still starts afterwards.
  trace::start(temp("after_refusal.json"));
  EXPECT_TRUE(trace::active());
  EXPECT_EQ(trace::stop().path, temp("after_refusal.json"));
}

TEST(Trace, OneTraceAtATimeAndStoppingTwiceIsHarmless) {
  trace::start(temp("one.json"));
  Error e = error_of([] { trace::start(temp("two.json")); });
  EXPECT_EQ(e.status(), Status::FailedPrecondition);
  EXPECT_THAT(e.what(), HasSubstr("already being written to " + temp("one.json")));
  EXPECT_EQ(trace::stop().path, temp("one.json"));
  const trace::Summary none = trace::stop();
  EXPECT_EQ(none.path, "");
  EXPECT_EQ(none.events, 0u);
  EXPECT_FALSE(trace::active());
}

TEST(Trace, PercentPBecomesTheProcessId) {
  trace::start(temp("pid-%p.json"));
  const trace::Summary s = trace::stop();
  EXPECT_EQ(s.path, temp("pid-" + std::to_string(::getpid()) + ".json"));
  EXPECT_TRUE(std::filesystem::exists(s.path));
}

TEST(Trace, ScopesAndMarksAreTheCallersOwnOnItsThread) {
  const std::string path = temp("scopes.json");
  trace::start(path);
  {
    trace::Scope outer("preprocess");
    trace::mark("image ready");
    trace::Scope inner("resize \"quoted\"");
  }
  trace::stop();
  const auto t = test::read_trace(path);
  EXPECT_THAT(test::check_trace(t), IsEmpty());
  const auto outer = test::events_named(t, "B", "preprocess");
  const auto inner = test::events_named(t, "B", "resize \"quoted\"");
  const auto mark = test::events_named(t, "i", "image ready");
  ASSERT_EQ(outer.size(), 1u);
  ASSERT_EQ(inner.size(), 1u);
  ASSERT_EQ(mark.size(), 1u);
  EXPECT_EQ(outer[0]["tid"], inner[0]["tid"]);
  EXPECT_EQ(outer[0]["pid"], ::getpid());
  EXPECT_LE(outer[0]["ts"].get<double>(), mark[0]["ts"].get<double>());
}

// Off, nothing is recorded: a scope made while off stays silent even if a
// trace starts before it ends.
TEST(Trace, NothingIsRecordedWhileOff) {
  const std::string path = temp("off.json");
  {
    trace::Scope before("before");
    trace::start(path);
  }
  trace::mark("during");
  trace::stop();
  trace::mark("after");
  const auto t = test::read_trace(path);
  EXPECT_THAT(test::check_trace(t), IsEmpty());
  EXPECT_TRUE(test::events_named(t, "B", "before").empty());
  EXPECT_TRUE(test::events_named(t, "E", "").empty());
  EXPECT_EQ(test::events_named(t, "i", "during").size(), 1u);
  EXPECT_TRUE(test::events_named(t, "i", "after").empty());
}

// Many threads at once: every event is written or counted as dropped, never
// lost and never blocking (the writer drains each thread's buffer). Each
// thread marks more than its buffer holds, so that one outrunning the
// writer drops; not many more, as reading the trace back is most of the
// test's time (70 s for 50,000 a thread under the sanitizers and load).
TEST(Trace, EveryEventIsWrittenOrCountedAsDropped) {
  const std::string path = temp("threads.json");
  trace::start(path);
  constexpr int kThreads = 4;
  constexpr int kEach = static_cast<int>(trace::kThreadBufferEvents + trace::kThreadBufferEvents / 4);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([] {
      for (int k = 0; k < kEach; ++k) trace::mark("tick");
    });
  for (auto& th : threads) th.join();
  const trace::Summary s = trace::stop();
  const auto t = test::read_trace(path);
  EXPECT_THAT(test::check_trace(t), IsEmpty());
  const auto ticks = test::events_named(t, "i", "tick");
  EXPECT_EQ(ticks.size() + s.dropped, std::uint64_t{kThreads} * kEach);
  EXPECT_EQ(t["otherData"]["dropped_events"], s.dropped);
  EXPECT_EQ(t["otherData"]["events"], s.events);
  std::set<std::int64_t> tids;
  for (const auto& e : ticks) tids.insert(e["tid"].get<std::int64_t>());
  EXPECT_EQ(tids.size(), std::size_t{kThreads});
}

// Threads submitting on their own queues while the writer drains: the
// trace obeys the format and holds every submission on its own track. The
// queues are all claimed before any thread starts and held until all are
// done: a queue released early is claimed again by the next thread, whose
// work then shares its track (a thread that ran all its submissions before
// the next one started did just that on a loaded machine).
TEST(Trace, ThreadsSubmittingAtOnceEachGetTheirTrack) {
  const std::string path = temp("submitters.json");
  Device dev = open("sim:0");
  trace::start(path);
  constexpr int kThreads = 3, kEach = 200;
  std::vector<Queue> queues;
  for (int i = 0; i < kThreads; ++i) queues.push_back(dev.queue(Engine::Compute));
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      Queue& q = queues[static_cast<std::size_t>(i)];
      Buffer a = dev.allocate(4096, Memory::HostPinned), b = dev.allocate(4096);
      for (int k = 0; k < kEach; ++k) q.copy(a, b).fill(b, 0, 64, k & 0xff).submit().wait();
    });
  for (auto& th : threads) th.join();
  const trace::Summary s = trace::stop();
  const auto t = test::read_trace(path);
  EXPECT_THAT(test::check_trace(t), IsEmpty());
  EXPECT_EQ(s.dropped, 0u);
  EXPECT_EQ(test::events_named(t, "X", "submission").size(), std::size_t{kThreads} * kEach);
  EXPECT_EQ(test::events_named(t, "X", "fill").size(), std::size_t{kThreads} * kEach);
  std::set<std::int64_t> tracks;
  for (const auto& e : test::events_named(t, "X", "copy")) tracks.insert(e["tid"].get<std::int64_t>());
  EXPECT_EQ(tracks.size(), std::size_t{kThreads});
}

// A batch longer than kStampedCommands gets one slice for the whole
// submission: the trace does not lengthen it by a command per command.
TEST(Trace, ALongBatchIsOneSlice) {
  const std::string path = temp("long.json");
  Device dev = open("sim:0");
  Queue q = dev.queue();
  Buffer b = dev.allocate(4096);
  trace::start(path);
  Batch batch = q.batch();
  const std::size_t n = trace::kStampedCommands + 1;
  for (std::size_t i = 0; i < n; ++i) batch.fill(b, 0, 64, static_cast<std::uint32_t>(i));
  batch.submit().wait();
  q.fill(b, 0, 64, 1).submit().wait();
  trace::stop();
  const auto t = test::read_trace(path);
  EXPECT_THAT(test::check_trace(t), IsEmpty());
  const auto subs = test::events_named(t, "X", "submission");
  ASSERT_EQ(subs.size(), 2u);
  EXPECT_EQ(subs[0]["args"]["commands"], n);
  EXPECT_EQ(test::events_named(t, "X", "fill").size(), 1u);  // only the short batch's
}

// A queue released while the trace is on has its work drained into the
// trace first; a trace stopped with queues alive closes cleanly and the
// queues go on working untraced.
TEST(Trace, QueuesComeAndGoAroundATrace) {
  const std::string path = temp("lifetimes.json");
  Device dev = open("sim:0");
  Buffer b = dev.allocate(4096);
  Queue kept = dev.queue();
  trace::start(path);
  {
    Queue brief = dev.queue();
    brief.fill(b, 0, 64, 7).submit();  // not waited: the release waits
  }
  kept.fill(b, 0, 64, 8).submit().wait();
  trace::stop();
  kept.fill(b, 0, 64, 9).submit().wait();
  const auto t = test::read_trace(path);
  EXPECT_THAT(test::check_trace(t), IsEmpty());
  EXPECT_EQ(test::events_named(t, "X", "fill").size(), 2u);
  // And a second trace in the same process sees the kept queue again.
  trace::start(path);
  kept.fill(b, 0, 64, 10).submit().wait();
  trace::stop();
  const auto t2 = test::read_trace(path);
  EXPECT_THAT(test::check_trace(t2), IsEmpty());
  EXPECT_EQ(test::events_named(t2, "X", "fill").size(), 1u);
}

}  // namespace
}  // namespace tpuhal
