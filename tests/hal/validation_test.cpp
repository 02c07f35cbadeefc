// The validation layer (tpuhal/validation.hpp): each check reports the
// misuse it exists for, names the call site in this file, stays quiet for
// the correct version of the same code, and costs nothing when off.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "tpuhal/driver/driver.hpp"
#include "tpuhal/tpuhal.hpp"

namespace tpuhal {
namespace {

using namespace std::chrono_literals;
using validation::Check;

void store_word(const Buffer& b, std::size_t offset, std::uint64_t v) {
  std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(b.map().data() + offset))
      .store(v, std::memory_order_release);
}

// Collects reports while alive, with validation on.
class Collector {
 public:
  Collector() {
    was_on_ = validation::enabled();
    validation::enable(true);
    validation::set_handler([this](const validation::Report& r) {
      std::lock_guard lock(mu_);
      reports_.push_back(r);
    });
  }
  ~Collector() {
    validation::set_handler({});
    validation::enable(was_on_);
  }
  std::vector<validation::Report> take() {
    std::lock_guard lock(mu_);
    return std::exchange(reports_, {});
  }
  std::size_t count() {
    std::lock_guard lock(mu_);
    return reports_.size();
  }

 private:
  bool was_on_;
  std::mutex mu_;
  std::vector<validation::Report> reports_;
};

std::string site(const validation::Report& r) { return r.call_site.empty() ? "" : r.call_site.front(); }

class Validation : public ::testing::Test {
 protected:
  void SetUp() override {
    dev_ = open("sim:0");
    WaitPolicy p = dev_.wait_policy();
    p.timeout = 10s;
    dev_.set_wait_policy(p);
  }

  // A word the host writes to let a queue past Batch::wait_value.
  struct Gate {
    Buffer word;
    void release() const { store_word(word, 0, 1); }
  };
  Gate gate() {
    Gate g{dev_.allocate(4096, Memory::HostPinned)};
    store_word(g.word, 0, 0);
    return g;
  }

  Device dev_;
};

// ---- buffers in flight -----------------------------------------------------------

TEST_F(Validation, MappingABufferAQueueStillWritesIsReportedWithTheCallSite) {
  Collector c;
  Queue q = dev_.queue();
  Gate g = gate();
  Buffer src = dev_.allocate(4096, Memory::HostPinned);
  Buffer dst = dev_.allocate(4096, Memory::HostPinned);
  Fence f = q.batch().wait_value(g.word, 0, 1).copy(src, dst).submit();

  (void)dst.map();  // the copy into dst has not run: a read now races with it
  auto reports = c.take();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].check, Check::BufferInFlight);
  EXPECT_NE(reports[0].message.find("map() of the 4096-byte host-pinned buffer"), std::string::npos)
      << reports[0].message;
  EXPECT_NE(reports[0].message.find("(copy) still writes bytes [0, 4096)"), std::string::npos) << reports[0].message;
  EXPECT_NE(reports[0].message.find(q.device().uri() + " compute queue"), std::string::npos);
  EXPECT_NE(site(reports[0]).find("validation_test.cpp"), std::string::npos) << site(reports[0]);

  (void)src.map();  // the copy only reads src: mapping it is not flagged
  EXPECT_EQ(c.count(), 0u);
  // A word the queue will write with write_value is there to be polled.
  Buffer words = dev_.allocate(4096, Memory::HostPinned);
  Fence fw = q.batch().write_value(words, 8, 1).timestamp(words, 16).submit();
  (void)words.map();
  EXPECT_EQ(c.count(), 0u);

  g.release();
  f.wait();
  (void)dst.map();  // complete: nothing to report
  EXPECT_EQ(c.count(), 0u);
}

// The hazards below are submitted behind a gate of their own queue, opened
// only once the work they conflict with is done: reported, but never run
// in a real race (which ThreadSanitizer would rightly flag in the board).
TEST_F(Validation, AnotherQueueWritingWhatAnUnfinishedSubmissionWritesIsReported) {
  Collector c;
  Queue a = dev_.queue();
  Queue b = dev_.queue();
  Gate ga = gate(), gb = gate();
  Buffer buf = dev_.allocate(1 << 16);
  Buffer other = dev_.allocate(1 << 16);
  Fence fa = a.batch().wait_value(ga.word, 0, 1).fill(buf, 0, 4096, 0xAB).submit();
  b.batch().wait_value(gb.word, 0, 1).submit();

  // Disjoint bytes, and reads of bytes nobody writes: no hazard.
  b.fill(buf, 4096, 4096, 1).submit();
  b.copy(other, 0, other, 8192, 4096).submit();
  EXPECT_EQ(c.count(), 0u);

  // b overwrites what a's unfinished fill writes, and nothing orders them.
  b.copy(other, 0, buf, 1024, 64).submit();
  auto reports = c.take();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].check, Check::BufferInFlight);
  EXPECT_NE(reports[0].message.find("copy on " + dev_.uri() + " compute queue"), std::string::npos)
      << reports[0].message;
  EXPECT_NE(reports[0].message.find("writes bytes [1024, 1088)"), std::string::npos) << reports[0].message;
  EXPECT_NE(reports[0].message.find("(fill), which writes bytes [0, 4096)"), std::string::npos) << reports[0].message;
  EXPECT_NE(site(reports[0]).find("validation_test.cpp"), std::string::npos) << site(reports[0]);

  // Reading it on b is a hazard too, until b waits for a's fence.
  b.copy(buf, other).submit();
  EXPECT_EQ(c.take().size(), 1u);
  b.batch().wait(fa).copy(buf, other).submit();
  EXPECT_EQ(c.count(), 0u);
  // Once b has waited for fa, later batches on b are ordered after it too.
  b.copy(other, buf).submit();
  EXPECT_EQ(c.count(), 0u);

  ga.release();
  fa.wait();
  gb.release();
  b.submit().wait();
}

TEST_F(Validation, AWaitThroughAThirdQueueOrdersTheTwo) {
  Collector c;
  Queue a = dev_.queue(), b = dev_.queue(), x = dev_.queue(Engine::Copy);
  Gate g = gate();
  Buffer buf = dev_.allocate(4096);
  Buffer out = dev_.allocate(4096);
  Fence fa = a.batch().wait_value(g.word, 0, 1).fill(buf, 0, 4096, 7).submit();
  Fence fx = x.batch().wait(fa).submit();      // x waits for a ...
  b.batch().wait(fx).copy(buf, out).submit();  // ... and b for x
  EXPECT_EQ(c.count(), 0u);
  g.release();
  b.submit().wait();
}

TEST_F(Validation, TheSameQueueAndAWaitOnMemoryAreNotHazards) {
  Collector c;
  Queue a = dev_.queue(), b = dev_.queue();
  Gate g = gate(), g2 = gate();
  Buffer buf = dev_.allocate(4096);
  a.batch().wait_value(g.word, 0, 1).fill(buf, 0, 4096, 1).submit();
  a.fill(buf, 0, 4096, 2).submit();  // same queue: in order
  // b synchronises through a word of its own: beyond what validation
  // follows, so it trusts it (and here the host opens it once a is done).
  b.batch().wait_value(g2.word, 0, 1).fill(buf, 0, 4096, 3).submit();
  EXPECT_EQ(c.count(), 0u);
  g.release();
  a.submit().wait();
  g2.release();
  b.submit().wait();
}

TEST_F(Validation, AnOpAndAProgramAreLookedInto) {
  if (!dev_.properties().caps.tensor) GTEST_SKIP() << "no tensor engine";
  Collector c;
  Queue a = dev_.queue(), b = dev_.queue();
  Gate g = gate(), gb = gate();
  Tensor x(dev_.allocate(64), DType::F32, {4, 4});
  Tensor y(dev_.allocate(64, Memory::DeviceHostVisible), DType::F32, {4, 4});
  Fence fa = a.batch().wait_value(g.word, 0, 1).run(ops::relu(x, y)).submit();
  (void)y.buffer().map();
  auto reports = c.take();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_NE(reports[0].message.find("(activation) still writes bytes [0, 64)"), std::string::npos)
      << reports[0].message;

  Buffer z = dev_.allocate(64);
  Program p = dev_.record([&](Batch& batch) { batch.copy(z, x.buffer()); });
  b.batch().wait_value(gb.word, 0, 1).submit();
  b.run(p).submit();  // the program writes x, which a's relu reads
  reports = c.take();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_NE(reports[0].message.find("(activation), which reads bytes [0, 64)"), std::string::npos)
      << reports[0].message;
  g.release();
  fa.wait();
  gb.release();
  b.submit().wait();
}

// top_k writes its values as well as its indices: mapping either while
// the op may still run is reported.
TEST_F(Validation, EveryOutputOfAnOpIsAWrite) {
  if (!dev_.properties().caps.tensor) GTEST_SKIP() << "no tensor engine";
  Collector c;
  Queue a = dev_.queue();
  Gate g = gate();
  Tensor x(dev_.allocate(64), DType::F32, {16});
  Tensor values(dev_.allocate(64, Memory::DeviceHostVisible), DType::F32, {4});
  Tensor indices(dev_.allocate(64), DType::I32, {4});
  Fence fa = a.batch().wait_value(g.word, 0, 1).run(ops::top_k(x, values, indices, {0, true, false})).submit();
  (void)values.buffer().map();
  auto reports = c.take();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_NE(reports[0].message.find("(top_k) still writes bytes [0, 16)"), std::string::npos) << reports[0].message;
  g.release();
  fa.wait();
}

// ---- values going backwards -------------------------------------------------------

TEST_F(Validation, AWordWrittenLowerThanItsLastValueIsReported) {
  Collector c;
  Queue a = dev_.queue(), b = dev_.queue();
  Buffer words = dev_.allocate(4096, Memory::HostPinned);
  a.batch().write_value(words, 8, 5).submit().wait();
  b.batch().write_value(words, 8, 6).write_value(words, 16, 1).submit().wait();
  EXPECT_EQ(c.count(), 0u);
  b.batch().write_value(words, 8, 3).submit().wait();
  auto reports = c.take();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].check, Check::ValueBackwards);
  EXPECT_NE(reports[0].message.find("write_value of 3"), std::string::npos) << reports[0].message;
  EXPECT_NE(reports[0].message.find("word at offset 8"), std::string::npos) << reports[0].message;
  EXPECT_NE(reports[0].message.find("last given 6"), std::string::npos) << reports[0].message;
  EXPECT_NE(site(reports[0]).find("validation_test.cpp"), std::string::npos) << site(reports[0]);
}

TEST_F(Validation, ALanguageBindingsFramesComeBeforeTheCppCallSite) {
  Collector c;
  std::atomic<int> asked{0};
  auto previous = validation::set_call_site_provider([&] {
    ++asked;
    return std::vector<std::string>{"run_pipeline at app.py:12", "<module> at app.py:30"};
  });
  Queue q = dev_.queue();
  Buffer words = dev_.allocate(4096, Memory::HostPinned);
  EXPECT_EQ(asked.load(), 1) << "a new buffer's allocation site";
  q.batch().write_value(words, 0, 2).submit().wait();
  EXPECT_EQ(asked.load(), 1) << "asked for frames with nothing to report";
  q.batch().write_value(words, 0, 1).submit().wait();
  auto reports = c.take();
  ASSERT_EQ(reports.size(), 1u);
  ASSERT_GE(reports[0].call_site.size(), 3u) << site(reports[0]);
  EXPECT_EQ(reports[0].call_site[0], "run_pipeline at app.py:12");
  EXPECT_EQ(reports[0].call_site[1], "<module> at app.py:30");
  EXPECT_NE(reports[0].call_site[2].find("validation_test.cpp"), std::string::npos) << site(reports[0]);
  EXPECT_EQ(asked.load(), 2);
  // A leak report names the binding's line that allocated the buffer.
  Buffer leaked = dev_.allocate(20480);
  EXPECT_GE(validation::report_leaks(), 1u);
  reports = c.take();
  bool named = false;
  for (const auto& r : reports)
    if (r.check == Check::Leak && r.message.find("20480-byte") != std::string::npos)
      named = r.message.find("20480-byte device buffer at") != std::string::npos &&
              r.message.find("allocated by run_pipeline at app.py:12") != std::string::npos;
  EXPECT_TRUE(named) << (reports.empty() ? std::string("no reports") : reports.back().message);
  leaked = Buffer();
  EXPECT_TRUE(validation::set_call_site_provider(std::move(previous)));  // gives back ours
  // Without a provider, the C++ frames alone.
  q.batch().write_value(words, 0, 0).submit().wait();
  reports = c.take();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_NE(site(reports[0]).find("validation_test.cpp"), std::string::npos) << site(reports[0]);
  EXPECT_EQ(site(reports[0]).find("app.py"), std::string::npos) << site(reports[0]);
}

// A driver whose timeline and memory accounting the test controls: to play
// the driver and firmware faults validation watches for.
struct Faulty {
  static inline std::atomic<std::uint64_t> completed{0};
  static inline std::atomic<std::uint64_t> leaked_bytes{0};

  class Buf : public driver::BufferBackend {
   public:
    explicit Buf(std::uint64_t n) : bytes_(n) {}
    std::uint64_t size() const override { return bytes_.size(); }
    Memory memory() const override { return Memory::HostPinned; }
    const std::string& heap() const override { return heap_; }
    std::uint64_t device_address() const override { return 0x1000; }
    std::span<std::byte> map() override { return bytes_; }

   private:
    std::vector<std::byte> bytes_;
    std::string heap_;
  };
  class Q : public driver::QueueBackend {
   public:
    Engine engine() const override { return Engine::Compute; }
    std::uint32_t index() const override { return 0; }
    std::uint64_t submit(std::span<const driver::Command>, std::chrono::nanoseconds) override { return ++submitted_; }
    driver::Timeline timeline() const override { return {completed.load(), false}; }
    std::uint64_t submitted() const override { return submitted_; }
    std::uint64_t progress() const override { return completed.load(); }
    Error failure() const override { return Error(Status::Internal, "faulty queue"); }
    void block(std::uint64_t, std::chrono::nanoseconds) override { std::this_thread::sleep_for(1ms); }
    void abort() override {}
    QueueStatus status() const override { return {}; }

   private:
    std::atomic<std::uint64_t> submitted_{0};
  };
  class Dev : public driver::DeviceBackend {
   public:
    explicit Dev(std::string uri) {
      props_.uri = std::move(uri);
      props_.driver = "faulty";
      props_.board = "faulty";
    }
    const Properties& properties() const override { return props_; }
    MemoryStats memory_stats() const override {
      MemoryStats m;
      m.device_used = leaked_bytes.load();
      return m;
    }
    DeviceStatus status() const override { return {}; }
    std::shared_ptr<driver::BufferBackend> allocate(std::uint64_t size, Memory, const AllocOptions&) override {
      return std::make_shared<Buf>(size);
    }
    std::shared_ptr<driver::QueueBackend> create_queue(Engine, const QueueOptions&) override {
      return std::make_shared<Q>();
    }

   private:
    Properties props_;
  };
  class Provider : public driver::Provider {
   public:
    std::string_view scheme() const override { return "faulty"; }
    std::vector<DeviceInfo> enumerate() override { return {}; }
    std::shared_ptr<driver::DeviceBackend> open(std::string_view uri) override {
      return std::make_shared<Dev>(std::string(uri));
    }
  };
  static void install() {
    static std::once_flag once;
    std::call_once(once, [] { driver::register_provider(std::make_shared<Provider>()); });
  }
};

TEST(ValidationDriver, ACompletedValueGoingBackIsReportedOnce) {
  Collector c;
  Faulty::install();
  Faulty::completed = 0;
  Device dev = open("faulty:0");
  Queue q = dev.queue();
  Fence f1 = q.submit();
  Fence f2 = q.submit();
  Faulty::completed = 2;
  EXPECT_TRUE(f2.is_complete());
  Faulty::completed = 1;  // the board's counter moves back
  EXPECT_TRUE(f1.is_complete());
  auto reports = c.take();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].check, Check::ValueBackwards);
  EXPECT_NE(reports[0].message.find("faulty:0 compute queue 0: the board's completed value went back from 2 to 1"),
            std::string::npos)
      << reports[0].message;
  Faulty::completed = 0;
  EXPECT_FALSE(f1.is_complete());
  EXPECT_EQ(c.count(), 0u);  // once per queue
  Faulty::completed = 2;
}

TEST(ValidationDriver, MemoryTheDriverStillHoldsWhenTheDeviceClosesIsALeak) {
  Collector c;
  Faulty::install();
  Faulty::leaked_bytes = 0;
  {
    Device dev = open("faulty:clean");
    Buffer b = dev.allocate(4096);
  }
  EXPECT_EQ(c.count(), 0u);
  {
    Device dev = open("faulty:leaky");
    Buffer b = dev.allocate(4096);
    Faulty::leaked_bytes = 8192;  // what the driver will still count at close
  }
  Faulty::leaked_bytes = 0;
  auto reports = c.take();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].check, Check::Leak);
  EXPECT_NE(reports[0].message.find("faulty:leaky closed with memory the driver still holds: 8 KiB"), std::string::npos)
      << reports[0].message;
  // A simulated board gives everything back.
  {
    Device dev = open("sim:tiny");
    Queue q = dev.queue();
    Buffer b = dev.allocate(1 << 20);
    q.fill(b, 0, 1 << 20, 3).submit().wait();
  }
  EXPECT_EQ(c.count(), 0u);
}

// ---- wrong thread -----------------------------------------------------------------

TEST_F(Validation, OneBatchUsedByTwoThreadsAtOnceIsReported) {
  Collector c;
  Buffer buf = dev_.allocate(4096);
  auto from_here = [](const validation::Report& r) { return r.message.rfind("Batch::fill while", 0) == 0; };
  std::vector<validation::Report> reports;
  // One round: a submit that blocks on a full ring, and this thread poking
  // the same batch until the overlap is reported. Should the submitter enter
  // submit() while this thread is inside fill(), the submitter reports it
  // (also right, but its call site is in std::thread's frames) and then
  // holds no claim on the batch, so nothing more can be seen in that round:
  // start another.
  for (int round = 0; round < 20 && std::none_of(reports.begin(), reports.end(), from_here); ++round) {
    Queue q = dev_.queue(Engine::Compute, QueueOptions{16});
    Gate g = gate();
    q.batch().wait_value(g.word, 0, 1).submit();
    for (int i = 0; i < 64; ++i) {
      try {
        q.fill(buf, 0, 8, 1).submit(0ns);
      } catch (const Error& e) {
        ASSERT_EQ(e.status(), Status::QueueFull) << e.what();
        break;
      }
    }
    Batch batch = q.fill(buf, 0, 8, 2);
    std::atomic<bool> submitted{false};
    std::thread submitter([&] {
      batch.submit(10s);
      submitted = true;
    });
    // fill() with an empty handle is refused before it changes the batch.
    const std::size_t before = reports.size();
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (reports.size() == before && std::chrono::steady_clock::now() < until) {
      EXPECT_THROW(batch.fill(Buffer(), 0, 8, 0), Error);
      for (auto& r : c.take()) reports.push_back(std::move(r));
      std::this_thread::sleep_for(1ms);
    }
    g.release();
    submitter.join();
    EXPECT_TRUE(submitted);
    q.submit().wait();
  }
  ASSERT_GE(reports.size(), 1u);
  for (const auto& r : reports) {
    EXPECT_EQ(r.check, Check::WrongThread);
    // The other thread's call, read with its claim: one of Batch's calls,
    // never a name it has since left ("Batch::?").
    EXPECT_THAT(r.message, ::testing::ContainsRegex("another thread is in Batch::(fill|submit) on the same batch"))
        << r.message;
  }
  const auto mine = std::find_if(reports.begin(), reports.end(), from_here);
  ASSERT_NE(mine, reports.end());
  EXPECT_NE(mine->message.find("another thread is in Batch::submit"), std::string::npos) << mine->message;
  EXPECT_NE(site(*mine).find("validation_test.cpp"), std::string::npos) << site(*mine);
}

TEST_F(Validation, BatchesOnSeveralThreadsOfOneQueueAreFine) {
  Collector c;
  Queue q = dev_.queue();
  Buffer buf = dev_.allocate(1 << 16);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) q.fill(buf, 4096 * t, 4096, i & 0xff).submit();
    });
  for (auto& t : threads) t.join();
  q.submit().wait();
  EXPECT_EQ(c.count(), 0u);
}

// ---- leaks --------------------------------------------------------------------------

TEST_F(Validation, LiveBuffersAreListedWithWhereTheyWereAllocated) {
  Collector c;
  Buffer kept = dev_.allocate(12345);
  Buffer freed = dev_.allocate(777);
  freed.free();
  { Buffer dropped = dev_.allocate(999); }
  EXPECT_EQ(validation::report_leaks(), 1u);
  auto reports = c.take();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].check, Check::Leak);
  const auto& m = reports[0].message;
  EXPECT_NE(m.find(dev_.uri() + ": 1 buffer is still allocated"), std::string::npos) << m;
  EXPECT_NE(m.find("12345-byte device buffer"), std::string::npos) << m;
  EXPECT_NE(m.find("allocated by"), std::string::npos) << m;
  EXPECT_NE(m.find("validation_test.cpp"), std::string::npos) << m;
  EXPECT_EQ(m.find("777-byte"), std::string::npos) << m;
  EXPECT_EQ(m.find("999-byte"), std::string::npos) << m;
  kept.free();
  EXPECT_EQ(validation::report_leaks(), 0u);
}

// ---- the switch ------------------------------------------------------------------

TEST_F(Validation, OffMeansNoChecks) {
  if (validation::enabled()) GTEST_SKIP() << "TPUHAL_VALIDATE is set for the whole run";
  const auto before = validation::report_count();
  Queue q = dev_.queue();
  Gate g = gate();
  Buffer dst = dev_.allocate(4096, Memory::HostPinned);
  Fence f = q.batch().wait_value(g.word, 0, 1).fill(dst, 0, 4096, 1).submit();
  (void)dst.map();
  EXPECT_EQ(validation::report_count(), before);
  g.release();
  f.wait();
}

// The environment switches it on for a whole program, and reports at exit
// what was never freed; TPUHAL_VALIDATE=abort stops at the first report.
std::string run_self(const std::string& test, const std::string& env, int* status) {
  const std::string cmd = env + " TPUHAL_LOG=warn /proc/" + std::to_string(getpid()) +
                          "/exe --gtest_filter=ValidationChild." + test + " 2>&1";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  *status = pclose(p);
  return out;
}

TEST(ValidationEnv, LeaksAreReportedAtExit) {
  int status = 0;
  const auto out = run_self("Leak", "TPUHAL_VALIDATE_CHILD=1 TPUHAL_VALIDATE=1 ASAN_OPTIONS=detect_leaks=0", &status);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_NE(out.find("validation: leak: sim:0: 1 buffer is still allocated"), std::string::npos) << out;
  EXPECT_NE(out.find("8192-byte host-pinned buffer"), std::string::npos) << out;
  EXPECT_NE(out.find("allocated by"), std::string::npos) << out;
  EXPECT_NE(out.find("validation_test.cpp"), std::string::npos) << out;
}

TEST(ValidationEnv, AbortModeStopsAtTheFirstReport) {
  int status = 0;
  const auto out = run_self("MapInFlight", "TPUHAL_VALIDATE_CHILD=1 TPUHAL_VALIDATE=abort", &status);
  EXPECT_TRUE(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0)) << out;
  EXPECT_NE(out.find("validation: buffer in flight: map() of the"), std::string::npos) << out;
  EXPECT_NE(out.find("    at "), std::string::npos) << out;
  EXPECT_EQ(out.find("NOT REACHED"), std::string::npos) << out;
}

// Run only as children of the tests above.
class ValidationChild : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::getenv("TPUHAL_VALIDATE_CHILD")) GTEST_SKIP() << "runs as a child of ValidationEnv";
  }
};

TEST_F(ValidationChild, Leak) {
  ASSERT_TRUE(validation::enabled());
  Device dev = open("sim:0");
  static Buffer* leaked = new Buffer(dev.allocate(8192, Memory::HostPinned));
  (void)leaked;
  Buffer freed = dev.allocate(4096);
  freed.free();
}

TEST_F(ValidationChild, MapInFlight) {
  Device dev = open("sim:0");
  Queue q = dev.queue();
  Buffer word = dev.allocate(4096, Memory::HostPinned);
  store_word(word, 0, 0);
  Buffer dst = dev.allocate(4096, Memory::HostPinned);
  q.batch().wait_value(word, 0, 1).fill(dst, 0, 4096, 1).submit();
  (void)dst.map();
  std::printf("NOT REACHED\n");
  store_word(word, 0, 1);
}

}  // namespace
}  // namespace tpuhal
