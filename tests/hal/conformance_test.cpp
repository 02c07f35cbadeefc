// The conformance suite: what every device must do, whatever its driver.
// Porting a board means making this green on it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

#include "device_param.hpp"
#include "support/error_of.hpp"
#include "support/asleep.hpp"
#include "support/trace_check.hpp"
#include "tpuhal/skeleton/skeleton.h"
#include "tpuhal/tpuhal.hpp"
#include "tpuhal/trace.hpp"
#include "support/temp_path.hpp"

namespace tpuhal {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

using test::error_of;

void fill_pattern(std::span<std::byte> s, std::uint32_t seed) {
  std::uint32_t x = seed | 1;
  for (auto& b : s) {
    x = x * 1664525u + 1013904223u;
    b = std::byte(x >> 24);
  }
}

std::uint64_t& word(const Buffer& b, std::size_t index) {
  return reinterpret_cast<std::uint64_t*>(b.map().data())[index];
}

void store_word(const Buffer& b, std::size_t index, std::uint64_t v) {
  std::atomic_ref<std::uint64_t>(word(b, index)).store(v, std::memory_order_release);
}

std::uint64_t load_word(const Buffer& b, std::size_t index) {
  return std::atomic_ref<std::uint64_t>(word(b, index)).load(std::memory_order_acquire);
}

// What a test needs of a device beyond opening it.
enum Needs : unsigned {
  kMemory = 1,  // device memory: a heap (properties().heaps) to allocate from
  kQueues = 2,  // an engine with hardware queues (properties().engines)
};

// Skips the test, saying why, on a device whose properties say it lacks what
// the test needs, once lacking() has checked that the device refuses it.
#define SKIP_IF_LACKING(needs)                                                     \
  do {                                                                             \
    if (const std::string why = lacking(needs); !why.empty()) GTEST_SKIP() << why; \
  } while (0)

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dev_ = open(GetParam());
    WaitPolicy p = dev_.wait_policy();
    p.timeout = 10s;  // every wait in these tests ends
    dev_.set_wait_policy(p);
  }

  Buffer host(std::uint64_t n) { return dev_.allocate(n, Memory::HostPinned); }

  // A queue no one holds: compute if one is free, else copy. Boards may have
  // a single queue per engine (a SoC), which a test may be holding.
  Queue free_queue() {
    for (Engine e : {Engine::Compute, Engine::Copy}) {
      try {
        return dev_.queue(e);
      } catch (const Error& err) {
        if (err.status() != Status::ResourceExhausted && err.status() != Status::Unsupported) throw;
      }
    }
    throw Error(Status::ResourceExhausted, GetParam() + ": every compute and copy queue is held");
  }

  // Empty if the device has what `needs` names; else why not. A device may
  // have no device memory or no queues at all (the skeleton driver's board):
  // its properties then list no heaps or no queues, and it must refuse every
  // device allocation or every queue up front with Unsupported, naming itself.
  std::string lacking(unsigned needs) {
    const Properties& p = dev_.properties();
    std::string why;
    if ((needs & kMemory) && p.heaps.empty()) {
      for (Memory m : {Memory::Device, Memory::DeviceHostVisible}) {
        Error e = error_of([&] { dev_.allocate(4096, m); });
        EXPECT_EQ(e.status(), Status::Unsupported) << to_string(m) << ": " << e.what();
        EXPECT_THAT(e.what(), HasSubstr(GetParam() + ":")) << to_string(m);
      }
      why = "no device memory: the device's properties list no heaps";
    }
    bool queues = false;
    for (auto& e : p.engines) queues = queues || e.queues > 0;
    if ((needs & kQueues) && !queues) {
      for (Engine engine : {Engine::Compute, Engine::Copy, Engine::Video}) {
        Error e = error_of([&] { dev_.queue(engine); });
        EXPECT_EQ(e.status(), Status::Unsupported) << to_string(engine) << ": " << e.what();
        EXPECT_THAT(e.what(), HasSubstr(GetParam() + ":")) << to_string(engine);
      }
      why += std::string(why.empty() ? "" : "; ") + "no queues: the device's properties list no engine with queues";
    }
    return why;
  }

  // A queue blocked on the device until release() writes the gate word: the
  // deterministic way to hold work back for ordering and lifetime tests.
  struct Gate {
    Buffer word;
    void release() { store_word(word, 0, 1); }
  };
  Gate gate(Batch& batch) {
    Gate g{host(4096)};
    store_word(g.word, 0, 0);
    batch.wait_value(g.word, 0, 1);
    return g;
  }

  Device dev_;
};

// ---- Properties and enumeration ------------------------------------------------

TEST_P(Conformance, PropertiesDescribeTheDevice) {
  const Properties& p = dev_.properties();
  EXPECT_EQ(p.uri, GetParam());
  EXPECT_FALSE(p.driver.empty());
  EXPECT_FALSE(p.board.empty());
  EXPECT_LE(p.host_visible_bytes, p.memory_bytes);
  // A device with no engine (the skeleton driver's board) refuses queues.
  if (p.engines.empty()) {
    EXPECT_FALSE(lacking(kQueues).empty());
  }
  if (p.heaps.empty()) {
    // A device with no device memory counts no bytes and refuses allocations.
    EXPECT_EQ(p.memory_bytes, 0u);
    EXPECT_FALSE(lacking(kMemory).empty());
    return;
  }
  EXPECT_GT(p.memory_bytes, 0u);
  int defaults = 0;
  Memory default_memory = Memory::HostPinned;
  std::uint64_t total = 0;
  for (auto& h : p.heaps) {
    EXPECT_FALSE(h.name.empty());
    EXPECT_GT(h.size, 0u);
    total += h.size;
    if (h.is_default) {
      ++defaults;
      default_memory = h.memory;
    }
  }
  EXPECT_EQ(defaults, 1);
  if (p.caps.map_device_memory) {
    // Unified memory (a SoC): the default heap may be host-visible too.
    EXPECT_TRUE(default_memory == Memory::Device || default_memory == Memory::DeviceHostVisible);
  } else {
    EXPECT_EQ(default_memory, Memory::Device);
  }
  EXPECT_LE(total, p.memory_bytes);
  ASSERT_FALSE(p.engines.empty());
  EXPECT_GT(p.min_alignment, 0u);
  EXPECT_EQ(p.min_alignment & (p.min_alignment - 1), 0u);
}

TEST_P(Conformance, OpeningTheSameUriAgainSharesTheDevice) {
  Device again = open(GetParam());
  EXPECT_EQ(&again.properties(), &dev_.properties());
  SKIP_IF_LACKING(kMemory);
  const auto before = again.memory_stats().device_used;
  Buffer b = dev_.allocate(1 << 20);
  EXPECT_GE(again.memory_stats().device_used, before + (1 << 20));
}

TEST_P(Conformance, MemoryStatsFollowAllocationsAndFrees) {
  SKIP_IF_LACKING(kMemory);
  const auto before = dev_.memory_stats();
  Buffer a = dev_.allocate(3 << 20);
  Buffer h = host(1 << 20);
  auto during = dev_.memory_stats();
  EXPECT_GE(during.device_used, before.device_used + (3 << 20));
  EXPECT_GE(during.host_pinned_bytes, before.host_pinned_bytes + (1 << 20));
  EXPECT_EQ(during.host_pinned_allocations, before.host_pinned_allocations + 1);
  for (auto& heap : during.heaps) {
    EXPECT_EQ(heap.used + heap.free, heap.total) << heap.name;
    EXPECT_LE(heap.largest_free, heap.free) << heap.name;
    EXPECT_GE(heap.peak_used, heap.used) << heap.name;
  }
  a.free();
  h.free();
  auto after = dev_.memory_stats();
  EXPECT_EQ(after.device_used, before.device_used);
  EXPECT_EQ(after.host_pinned_bytes, before.host_pinned_bytes);
}

TEST_P(Conformance, AllocationsAreAlignedAndHonourExplicitAlignment) {
  SKIP_IF_LACKING(kMemory);
  const auto align = dev_.properties().min_alignment;
  for (int i = 0; i < 8; ++i) {
    Buffer b = dev_.allocate(1 + i * 100);
    EXPECT_EQ(b.device_address() % align, 0u);
  }
  AllocOptions o;
  o.alignment = 1 << 16;
  Buffer big = dev_.allocate(100, Memory::Device, o);
  EXPECT_EQ(big.device_address() % (1 << 16), 0u);
}

TEST_P(Conformance, NamedHeapsServeAllocations) {
  SKIP_IF_LACKING(kMemory);
  for (auto& h : dev_.properties().heaps) {
    AllocOptions o;
    o.heap = h.name;
    Buffer b = dev_.allocate(4096, h.memory, o);
    EXPECT_EQ(b.heap(), h.name);
    EXPECT_GE(b.device_address(), h.base);
    EXPECT_LE(b.device_address() + 4096, h.base + h.size);
  }
  AllocOptions bad;
  bad.heap = "no-such-heap";
  Error e = error_of([&] { dev_.allocate(4096, Memory::Device, bad); });
  EXPECT_EQ(e.status(), Status::NotFound);
  EXPECT_THAT(e.what(), HasSubstr("no-such-heap"));
}

// ---- Data movement ---------------------------------------------------------------

TEST_P(Conformance, CopiesRoundTripThroughEveryMemoryKind) {
  SKIP_IF_LACKING(kMemory | kQueues);
  Queue q = dev_.queue();
  const bool visible = dev_.properties().caps.host_visible_device_memory;
  for (std::uint64_t n : {1ull, 7ull, 4095ull, 4096ull, (1ull << 20) + 3}) {
    Buffer src = host(n), dst = host(n);
    Buffer dev = dev_.allocate(n), dev2 = dev_.allocate(n);
    Buffer vis = visible ? dev_.allocate(n, Memory::DeviceHostVisible) : dev_.allocate(n);
    fill_pattern(src.map(), static_cast<std::uint32_t>(n));
    std::memset(dst.map().data(), 0, n);
    q.copy(src, dev).copy(dev, dev2).copy(dev2, vis).copy(vis, dst).submit().wait();
    ASSERT_EQ(std::memcmp(src.map().data(), dst.map().data(), n), 0) << n << " bytes";
  }
}

// A program recorded before any queue is claimed (its command list maybe
// the first thing in its heap) runs like any other.
TEST_P(Conformance, AProgramRecordedBeforeAnyQueueIsClaimedRuns) {
  SKIP_IF_LACKING(kMemory | kQueues);
  Buffer h = host(4096);
  Buffer d = dev_.allocate(4096);
  Program p;
  try {
    p = dev_.record([&](Batch& b) { b.fill(d, 0, 4096, 0x5A).copy(d, h); });
  } catch (const Error& e) {
    if (e.status() != Status::Unsupported) throw;
    GTEST_SKIP() << "no programs: " << e.what();
  }
  std::memset(h.map().data(), 0, 4096);
  free_queue().run(p).submit().wait();
  const auto m = h.map();
  EXPECT_TRUE(std::all_of(m.begin(), m.end(), [](std::byte b) { return b == std::byte{0x5A}; }));
}

TEST_P(Conformance, CopyMovesExactlyTheRangeAsked) {
  SKIP_IF_LACKING(kMemory | kQueues);
  const std::uint64_t n = 64 * 1024;
  Buffer src = host(n), dst = host(n);
  Buffer dev = dev_.allocate(n);
  fill_pattern(src.map(), 1);
  std::memset(dst.map().data(), 0xEE, n);
  Queue q = dev_.queue();
  q.fill(dev, 0, n, 0x11).copy(src, 100, dev, 5000, 3000).copy(dev, 0, dst, 0, n).submit().wait();
  const auto d = dst.map();
  const auto s = src.map();
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::byte want = (i >= 5000 && i < 8000) ? s[i - 5000 + 100] : std::byte{0x11};
    ASSERT_EQ(d[i], want) << "offset " << i;
  }
}

TEST_P(Conformance, OverlappingCopyInOneBufferBehavesLikeMemmove) {
  SKIP_IF_LACKING(kMemory | kQueues);
  const std::uint64_t n = 1 << 20;
  Buffer src = host(n), out = host(n);
  Buffer dev = dev_.allocate(n);
  fill_pattern(src.map(), 2);
  Queue q = dev_.queue();
  // Forward overlap, then backward overlap.
  q.copy(src, dev).copy(dev, 0, dev, 4096, n - 4096).copy(dev, out).submit().wait();
  std::vector<std::byte> expect(src.map().begin(), src.map().end());
  std::memmove(expect.data() + 4096, expect.data(), n - 4096);
  ASSERT_EQ(std::memcmp(out.map().data(), expect.data(), n), 0);
  q.copy(dev, 8192, dev, 0, n - 8192).copy(dev, out).submit().wait();
  std::memmove(expect.data(), expect.data() + 8192, n - 8192);
  ASSERT_EQ(std::memcmp(out.map().data(), expect.data(), n), 0);
}

TEST_P(Conformance, FillWritesEachPatternWidthLittleEndian) {
  SKIP_IF_LACKING(kMemory | kQueues);
  const std::uint64_t n = 4096;
  Buffer dev = dev_.allocate(n);
  Buffer out = host(n);
  Queue q = dev_.queue();
  struct Case {
    std::uint32_t pattern, width;
  };
  for (Case c : {Case{0xAB, 1}, Case{0xBEEF, 2}, Case{0xC0FFEE11, 4}}) {
    q.fill(dev, 0, n, 0).fill(dev, 8, 64, c.pattern, c.width).copy(dev, out).submit().wait();
    const auto o = out.map();
    for (std::uint64_t i = 0; i < n; ++i) {
      std::byte want{0};
      if (i >= 8 && i < 72) want = std::byte((c.pattern >> (8 * ((i - 8) % c.width))) & 0xFF);
      ASSERT_EQ(o[i], want) << "width " << c.width << " offset " << i;
    }
  }
}

TEST_P(Conformance, HostVisibleDeviceMemoryIsCoherentWithDma) {
  if (!dev_.properties().caps.host_visible_device_memory) GTEST_SKIP() << "no host-visible memory";
  const std::uint64_t n = 8192;
  Buffer vis = dev_.allocate(n, Memory::DeviceHostVisible);
  Buffer out = host(n);
  fill_pattern(vis.map(), 3);                   // host writes through the window...
  dev_.queue().copy(vis, out).submit().wait();  // ...the board reads them
  ASSERT_EQ(std::memcmp(vis.map().data(), out.map().data(), n), 0);
}

TEST_P(Conformance, MapOfDeviceMemoryFollowsTheCapability) {
  SKIP_IF_LACKING(kMemory);
  Buffer d = dev_.allocate(4096);
  if (dev_.properties().caps.map_device_memory) {
    EXPECT_EQ(d.map().size(), 4096u);
  } else {
    // The message names the memory that can be mapped on this device.
    Error e = error_of([&] { d.map(); });
    EXPECT_EQ(e.status(), Status::Unsupported);
    EXPECT_THAT(e.what(),
                HasSubstr(dev_.properties().caps.host_visible_device_memory ? "DeviceHostVisible" : "HostPinned"));
  }
  EXPECT_EQ(host(4096).map().size(), 4096u);
}

TEST_P(Conformance, ImportedHostMemoryIsReachedWithoutACopy) {
  const std::size_t n = 3 * 4096;
  void* mem = std::aligned_alloc(4096, n);
  ASSERT_NE(mem, nullptr);
  if (!dev_.properties().caps.import_host_memory) {
    // What the capabilities leave false is refused up front, saying so.
    Error e = error_of([&] { dev_.import_host(mem, n); });
    std::free(mem);
    EXPECT_EQ(e.status(), Status::Unsupported) << e.what();
    EXPECT_THAT(e.what(), HasSubstr(GetParam() + ":"));
    GTEST_SKIP() << "no import";
  }
  std::memset(mem, 0, n);
  {
    Buffer imported = dev_.import_host(mem, n);
    EXPECT_EQ(imported.memory(), Memory::HostPinned);
    EXPECT_EQ(imported.map().data(), static_cast<std::byte*>(mem));
    Buffer dev = dev_.allocate(n);
    dev_.queue().fill(dev, 0, n, 0x5A).copy(dev, imported).submit().wait();
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(static_cast<unsigned char*>(mem)[i], 0x5A);
  }
  std::free(mem);
}

TEST_P(Conformance, ImportRefusesUnalignedMemory) {
  if (!dev_.properties().caps.import_host_memory) GTEST_SKIP() << "no import";
  std::vector<std::byte> v(3 * 4096);
  auto* p = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(v.data()) | 4095) + 2);
  Error e = error_of([&] { dev_.import_host(p, 4096); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("page-aligned"));
}

// ---- Queues, fences, ordering ---------------------------------------------------

TEST_P(Conformance, FenceValuesIncreaseByOnePerSubmission) {
  SKIP_IF_LACKING(kQueues);
  Queue q = dev_.queue();
  Fence a = q.submit(), b = q.submit(), c = q.batch().submit();
  EXPECT_EQ(b.value(), a.value() + 1);
  EXPECT_EQ(c.value(), b.value() + 1);
  c.wait();
  EXPECT_TRUE(a.is_complete());
  EXPECT_TRUE(b.is_complete());
  EXPECT_GE(q.completed_value(), c.value());
  EXPECT_EQ(q.last_fence().value(), c.value());
}

TEST_P(Conformance, AnEmptyFenceIsAlreadyComplete) {
  Fence f;
  EXPECT_TRUE(f.is_complete());
  f.wait();
  f.wait(1ms);
}

TEST_P(Conformance, AQueueWaitsOnAnotherQueuesFenceOnTheDevice) {
  SKIP_IF_LACKING(kMemory | kQueues);
  Queue a = dev_.queue();
  Queue b = free_queue();  // another compute queue, or a copy queue where there is one compute queue
  const std::uint64_t n = 1 << 16;
  Buffer src = host(n), mid = dev_.allocate(n), dst = host(n);
  fill_pattern(src.map(), 4);
  std::memset(dst.map().data(), 0, n);
  Batch first = a.batch();
  Gate g = gate(first);
  Fence produced = first.copy(src, mid).submit();
  Fence consumed = b.wait(produced).copy(mid, dst).submit();
  // Neither can finish while the gate holds the producer.
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(produced.is_complete());
  EXPECT_FALSE(consumed.is_complete());
  g.release();
  consumed.wait();
  EXPECT_TRUE(produced.is_complete());
  ASSERT_EQ(std::memcmp(src.map().data(), dst.map().data(), n), 0);
}

TEST_P(Conformance, WaitValueHoldsTheQueueUntilTheHostWrites) {
  if (!dev_.properties().caps.wait_value) GTEST_SKIP() << "no wait_value";
  Queue q = dev_.queue();
  Buffer words = host(4096);
  store_word(words, 0, 0);
  store_word(words, 1, 0);
  Fence f = q.batch().wait_value(words, 0, 5).write_value(words, 8, 0x1234).submit();
  store_word(words, 0, 4);  // not enough
  std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(f.is_complete());
  EXPECT_EQ(load_word(words, 1), 0u);
  store_word(words, 0, 5);
  f.wait();
  EXPECT_EQ(load_word(words, 1), 0x1234u);
}

TEST_P(Conformance, TimestampsFollowTheOrderOfWork) {
  if (!dev_.properties().caps.timestamps) GTEST_SKIP() << "no timestamps";
  Queue q = dev_.queue();
  Buffer stamps = host(4096);
  Buffer big = dev_.allocate(1 << 20), big2 = dev_.allocate(1 << 20);
  Fence f1 = q.batch().timestamp(stamps, 0).copy(big, big2).timestamp(stamps, 8).submit();
  Fence f2 = q.submit();
  f2.wait();
  EXPECT_LE(load_word(stamps, 0), load_word(stamps, 1));
  auto t1 = f1.timestamp_ns(), t2 = f2.timestamp_ns();
  ASSERT_TRUE(t1.has_value());
  ASSERT_TRUE(t2.has_value());
  EXPECT_LE(*t1, *t2);
  EXPECT_GE(*t1, load_word(stamps, 1));
}

TEST_P(Conformance, QueuesOfAnEngineRunOutAndComeBack) {
  std::uint32_t count = 0;
  for (auto& e : dev_.properties().engines)
    if (e.engine == Engine::Copy) count = e.queues;
  if (count == 0) GTEST_SKIP() << "no copy queues";
  std::vector<Queue> held;
  for (std::uint32_t i = 0; i < count; ++i) held.push_back(dev_.queue(Engine::Copy));
  Error e = error_of([&] { dev_.queue(Engine::Copy); });
  EXPECT_EQ(e.status(), Status::ResourceExhausted);
  EXPECT_THAT(e.what(), HasSubstr("copy queues are in use"));
  held.pop_back();
  Queue again = dev_.queue(Engine::Copy);
  again.submit().wait();
}

// ---- Bad input: a precise error, and the device carries on ---------------------

class ConformanceErrors : public Conformance {
 protected:
  // Proves the device still works: a copy through it arrives intact.
  // On a free queue: the test may hold the board's only compute queue.
  void expect_device_intact() {
    const std::uint64_t n = 8192;
    Buffer a = host(n), b = host(n), d = dev_.allocate(n);
    fill_pattern(a.map(), 9);
    free_queue().copy(a, d).copy(d, b).submit().wait();
    EXPECT_EQ(std::memcmp(a.map().data(), b.map().data(), n), 0);
  }
};

TEST_P(ConformanceErrors, CopyOutOfBoundsIsRefused) {
  SKIP_IF_LACKING(kMemory | kQueues);
  Buffer src = host(4096), dst = dev_.allocate(4096);
  Queue q = dev_.queue();
  Error e = error_of([&] { q.copy(src, 0, dst, 4000, 200); });
  EXPECT_EQ(e.status(), Status::OutOfRange);
  EXPECT_STREQ(e.what(), "copy of 200 bytes at offset 4000 exceeds the destination buffer (4096 bytes)");
  e = error_of([&] { q.copy(src, UINT64_MAX - 10, dst, 0, 100); });
  EXPECT_EQ(e.status(), Status::OutOfRange);
  EXPECT_THAT(e.what(), HasSubstr("source buffer"));
  e = error_of([&] { q.copy(src, host(100)); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("4096 bytes but the destination is 100"));
  expect_device_intact();
}

TEST_P(ConformanceErrors, UseOfAFreedBufferIsRefused) {
  SKIP_IF_LACKING(kMemory | kQueues);
  Buffer src = host(4096), dst = dev_.allocate(4096);
  Buffer alias = dst;  // a second handle to the same buffer
  dst.free();
  EXPECT_FALSE(alias.valid());
  Error e = error_of([&] { dev_.queue().copy(src, alias); });
  EXPECT_EQ(e.status(), Status::FailedPrecondition);
  EXPECT_THAT(e.what(), HasSubstr("was freed"));
  e = error_of([&] { alias.map(); });
  EXPECT_EQ(e.status(), Status::FailedPrecondition);
  dst.free();  // twice is harmless
  expect_device_intact();
}

TEST_P(ConformanceErrors, ABufferOfAnotherDeviceIsRefused) {
  SKIP_IF_LACKING(kMemory | kQueues);
  Device other = open(GetParam() == "sim:tiny" ? "sim:0" : "sim:tiny");
  Buffer mine = dev_.allocate(4096);
  Buffer theirs = other.allocate(4096);
  Error e = error_of([&] { dev_.queue().copy(mine, theirs); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("belongs to " + other.uri()));
  expect_device_intact();
}

TEST_P(ConformanceErrors, BadFillAndWordArgumentsAreRefused) {
  SKIP_IF_LACKING(kMemory | kQueues);
  Buffer d = dev_.allocate(4096);
  Buffer h = host(4096);
  Queue q = dev_.queue();
  EXPECT_EQ(error_of([&] { q.fill(d, 0, 16, 1, 3); }).status(), Status::InvalidArgument);
  EXPECT_EQ(error_of([&] { q.fill(d, 0, 16, 0x1FF, 1); }).status(), Status::InvalidArgument);
  EXPECT_EQ(error_of([&] { q.fill(d, 2, 16, 1, 4); }).status(), Status::InvalidArgument);
  EXPECT_EQ(error_of([&] { q.fill(d, 4090, 16, 1, 1); }).status(), Status::OutOfRange);
  Error e = error_of([&] { q.batch().wait_value(h, 4, 1); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("offset 4 is not a multiple of 8"));
  EXPECT_EQ(error_of([&] { q.batch().write_value(h, 4096, 1); }).status(), Status::OutOfRange);
  EXPECT_EQ(error_of([&] { dev_.allocate(0); }).status(), Status::InvalidArgument);
  AllocOptions odd;
  odd.alignment = 3000;
  EXPECT_EQ(error_of([&] { dev_.allocate(64, Memory::Device, odd); }).status(), Status::InvalidArgument);
  expect_device_intact();
}

TEST_P(ConformanceErrors, AWaitWithoutProgressTimesOutAndTheWorkStillCompletes) {
  SKIP_IF_LACKING(kMemory | kQueues);
  Queue q = dev_.queue();
  Batch b = q.batch();
  Gate g = gate(b);
  Fence f = b.submit();
  Error e = error_of([&] { f.wait(50ms); });
  EXPECT_EQ(e.status(), Status::Timeout);
  EXPECT_THAT(e.what(), HasSubstr("timeline value " + std::to_string(f.value()) + " not reached"));
  EXPECT_THAT(e.what(), HasSubstr("no progress for 50 ms"));
  EXPECT_FALSE(f.is_complete());
  g.release();
  f.wait();
  expect_device_intact();
}

TEST_P(ConformanceErrors, AFullRingIsReportedAsQueueFull) {
  SKIP_IF_LACKING(kMemory | kQueues);
  QueueOptions small;
  small.ring_entries = 16;
  Queue q = dev_.queue(Engine::Compute, small);
  Batch first = q.batch();
  Gate g = gate(first);
  std::vector<Fence> fences{first.submit()};
  Error full(Status::Ok, "");
  for (int i = 0; i < 64; ++i) {
    try {
      fences.push_back(q.batch().submit(20ms));
    } catch (const Error& e) {
      full = e;
      break;
    }
  }
  EXPECT_EQ(full.status(), Status::QueueFull);
  EXPECT_THAT(full.what(), HasSubstr("ring full (16 entries"));
  EXPECT_EQ(error_of([&] { q.batch().submit(0ms); }).status(), Status::QueueFull);
  g.release();
  for (auto& f : fences) f.wait();
  q.submit().wait();  // the queue itself carries on
  expect_device_intact();
}

TEST_P(ConformanceErrors, ABatchLargerThanTheRingIsRefused) {
  SKIP_IF_LACKING(kMemory | kQueues);
  QueueOptions small;
  small.ring_entries = 16;
  Queue q = dev_.queue(Engine::Compute, small);
  Buffer h = host(4096);
  Batch b = q.batch();
  for (int i = 0; i < 20; ++i) b.write_value(h, 0, i);
  Error e = error_of([&] { b.submit(); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("does not fit the ring (16 entries)"));
  q.submit().wait();
}

TEST_P(ConformanceErrors, ExhaustedDeviceMemorySaysWhatIsUsedAndFree) {
  SKIP_IF_LACKING(kMemory | kQueues);
  const Properties& p = dev_.properties();
  const HeapInfo* heap = nullptr;
  for (auto& h : p.heaps)
    if (h.is_default) heap = &h;
  ASSERT_NE(heap, nullptr);
  Error e = error_of([&] { dev_.allocate(heap->size + 1); });
  EXPECT_EQ(e.status(), Status::OutOfMemory);
  EXPECT_THAT(e.what(), HasSubstr("heap '" + heap->name + "'"));
  EXPECT_THAT(e.what(), HasSubstr("largest free block"));
  // Fill the heap, then show that freeing makes room again.
  std::vector<Buffer> chunks;
  const std::uint64_t chunk = heap->size / 8;
  for (int i = 0; i < 16; ++i) {
    try {
      chunks.push_back(dev_.allocate(chunk));
    } catch (const Error& err) {
      EXPECT_EQ(err.status(), Status::OutOfMemory);
      break;
    }
  }
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(error_of([&] { dev_.allocate(chunk); }).status(), Status::OutOfMemory);
  chunks.pop_back();
  Buffer again = dev_.allocate(chunk);
  chunks.clear();
  expect_device_intact();
}

TEST_P(ConformanceErrors, UnknownDevicesAndUrisAreNamed) {
  EXPECT_EQ(error_of([] { open("sim:9999"); }).status(), Status::NotFound);
  Error e = error_of([] { open("nosuchbus:0"); });
  EXPECT_EQ(e.status(), Status::NotFound);
  EXPECT_THAT(e.what(), HasSubstr("no driver for 'nosuchbus:0'"));
  EXPECT_EQ(error_of([] { open("sim"); }).status(), Status::InvalidArgument);
  EXPECT_EQ(error_of([] { open("sim:no-such-profile"); }).status(), Status::NotFound);
}

// ---- Lifetimes -------------------------------------------------------------------

TEST_P(Conformance, ABufferFreedWhileInFlightLivesUntilTheWorkCompletes) {
  SKIP_IF_LACKING(kMemory | kQueues);
  const std::uint64_t n = 1 << 20;
  Buffer src = host(n), dst = host(n);
  fill_pattern(src.map(), 5);
  Buffer d = dev_.allocate(n);
  Queue q = dev_.queue();
  q.copy(src, d).submit().wait();
  const auto used_with_d = dev_.memory_stats().device_used;

  Batch b = q.batch();
  Gate g = gate(b);
  Fence f = b.copy(d, dst).submit();
  d.free();  // the queue still needs it
  d = Buffer();
  EXPECT_EQ(dev_.memory_stats().device_used, used_with_d) << "freed too early";
  // New allocations must not reuse its memory while it is in flight.
  std::vector<Buffer> scribble;
  for (int i = 0; i < 4; ++i) scribble.push_back(dev_.allocate(n));
  for (auto& s : scribble) q.fill(s, 0, n, 0xDD).submit();
  g.release();
  f.wait();
  ASSERT_EQ(std::memcmp(src.map().data(), dst.map().data(), n), 0);
  q.submit().wait();  // completion observed: the retained buffer is released
  scribble.clear();
  EXPECT_LT(dev_.memory_stats().device_used, used_with_d);
}

TEST_P(Conformance, ReleasingAQueueLetsItsSubmittedWorkFinish) {
  SKIP_IF_LACKING(kMemory | kQueues);
  const std::uint64_t n = 8 << 20;
  Buffer src = host(n), dst = host(n), d = dev_.allocate(n);
  fill_pattern(src.map(), 6);
  {
    Queue q = dev_.queue();
    q.copy(src, d).copy(d, dst).submit();
  }  // the last handle goes with the work in flight
  ASSERT_EQ(std::memcmp(src.map().data(), dst.map().data(), n), 0);
}

std::string device_name(const ::testing::TestParamInfo<std::string>& p) { return testing::param_name(p.param); }
// Every device, and the skeleton driver's board ("skeleton:0"): a device with
// no memory, no queues and no optional capability, on which the suite checks
// the refusals and skips the rest. A new driver starts from it.
const std::vector<std::string>& devices_and_skeleton() {
  static const std::vector<std::string> uris = [] {
    driver::register_provider(skeleton::make_provider());
    return testing::find_conformance_devices();
  }();
  return uris;
}
// ---- Tracing ----------------------------------------------------------------------

// A known workload (copies, a fill, a wait across queues, an op and a
// program where the device has them) gives exactly the expected events:
// host slices for what the program called, and, where the board keeps
// timestamps, each command on its queue's track with its bytes, shapes and
// operations, joined to its submission by a flow. The trace obeys the
// format (support/trace_check.hpp).
TEST_P(Conformance, ATraceShowsEachCommandOfAKnownWorkload) {
  SKIP_IF_LACKING(kMemory | kQueues);
  const std::string path = test::temp_path("conformance_" + testing::param_name(GetParam()) + ".json");
  const Properties& props = dev_.properties();
  const bool stamps = props.caps.timestamps;
  trace::start(path);
  Queue a = dev_.queue();
  Queue b = free_queue();
  const std::uint64_t n = 1 << 16;
  Buffer src = host(n), mid = dev_.allocate(n), dst = host(n);
  fill_pattern(src.map(), 9);
  Batch first = a.batch();
  std::optional<Gate> g;
  if (props.caps.wait_value) g = gate(first);  // so that b's wait is a wait on the device
  Fence produced = first.copy(src, mid).fill(mid, 0, 4096, 0xab).submit();
  Fence consumed = b.wait(produced).copy(mid, dst).submit();
  // The host's wait is traced only when it has to wait: with a gate, the
  // work is held until the wait has begun.
  std::thread opener;
  const pid_t waiter = test::this_thread_id();
  if (g)
    opener = std::thread([&] {
      test::until_asleep(waiter);  // in consumed.wait(), however late a busy machine runs it
      g->release();
    });
  consumed.wait();
  if (opener.joinable()) opener.join();
  std::uint64_t submits = 2;
  const bool tensor = props.caps.tensor && a.engine() == Engine::Compute;
  if (tensor) {
    Buffer ab = dev_.allocate(8 * 16 * 4), bb = dev_.allocate(16 * 4 * 4), yb = dev_.allocate(8 * 4 * 4);
    Op mm =
        ops::matmul(Tensor(ab, DType::F32, {8, 16}), Tensor(bb, DType::F32, {16, 4}), Tensor(yb, DType::F32, {8, 4}));
    a.run(mm).submit().wait();
    ++submits;
  }
  bool program = false;
  if (a.engine() == Engine::Compute) {
    try {
      Program p = dev_.record([&](Batch& r) { r.copy(mid, 0, mid, n / 2, 1024); });
      a.run(p).submit().wait();
      program = true;
      ++submits;
    } catch (const Error& e) {
      if (e.status() != Status::Unsupported) throw;
    }
  }
  const trace::Summary summary = trace::stop();
  EXPECT_EQ(summary.path, path);
  EXPECT_EQ(summary.dropped, 0u);
  EXPECT_EQ(summary.error, "");
  const auto t = test::read_trace(path);
  ASSERT_FALSE(t.is_discarded()) << path;
  EXPECT_THAT(test::check_trace(t), ::testing::IsEmpty());

  // The host side, on every device.
  EXPECT_EQ(test::events_named(t, "X", "submit").size(), submits);
  if (g) {
    EXPECT_GE(test::events_named(t, "X", "wait").size(), 1u);
  }
  std::vector<std::uint64_t> allocated;
  for (const auto& e : test::events_named(t, "X", "allocate")) allocated.push_back(e["args"]["bytes"]);
  EXPECT_THAT(allocated, ::testing::IsSupersetOf({n, n, n}));
  const auto& devices = t["otherData"]["devices"];
  ASSERT_TRUE(devices.contains(GetParam())) << devices.dump();
  EXPECT_EQ(devices[GetParam()]["board_timestamps"], stamps);

  const auto copies = test::events_named(t, "X", "copy");
  if (!stamps) {
    // Only the host side, and the trace says so.
    EXPECT_TRUE(copies.empty());
    EXPECT_THAT(devices[GetParam()].value("note", ""), HasSubstr("no board timestamps"));
    return;
  }
  EXPECT_EQ(devices[GetParam()]["stamped_submissions"], submits);
  EXPECT_EQ(test::events_named(t, "X", "submission").size(), submits);
  EXPECT_EQ(test::events_named(t, "s", "submission").size(), submits);
  EXPECT_EQ(test::events_named(t, "f", "submission").size(), submits);
  EXPECT_LE(devices[GetParam()]["sync_error_ns"].get<std::uint64_t>(), 50'000'000u);
  // Each command on its queue's track, with what it moved. The trace
  // promises no order of events across tracks in the file: each is found
  // by what it did.
  ASSERT_EQ(copies.size(), 2u);
  const bool h2d_first = copies[0]["args"]["direction"] == "h2d";
  const auto& h2d = copies[h2d_first ? 0 : 1];
  const auto& d2h = copies[h2d_first ? 1 : 0];
  EXPECT_EQ(h2d["args"]["bytes"], n);
  EXPECT_EQ(h2d["args"]["direction"], "h2d");
  EXPECT_EQ(h2d["args"]["src"], to_string(Memory::HostPinned));
  EXPECT_EQ(h2d["args"]["dst"], to_string(Memory::Device));
  EXPECT_EQ(d2h["args"]["direction"], "d2h");
  EXPECT_NE(h2d["tid"], d2h["tid"]);  // two queues, two tracks
  const auto fills = test::events_named(t, "X", "fill");
  ASSERT_EQ(fills.size(), 1u);
  EXPECT_EQ(fills[0]["args"]["bytes"], 4096);
  EXPECT_EQ(fills[0]["tid"], h2d["tid"]);
  // It does promise that dependent work keeps its order: b's copy waited
  // for a's submission (its copy, then its fill), whatever the clock
  // estimate did between the two.
  const auto end = [](const nlohmann::json& e) { return e["ts"].get<double>() + e["dur"].get<double>(); };
  EXPECT_GE(d2h["ts"].get<double>() + 1e-3, end(fills[0])) << d2h.dump() << " " << fills[0].dump();
  EXPECT_GE(fills[0]["ts"].get<double>() + 1e-3, end(h2d));
  const auto waits = test::events_named(t, "X", "wait fence");
  if (g) {
    ASSERT_EQ(waits.size(), 1u);
    EXPECT_EQ(waits[0]["tid"], d2h["tid"]);
    EXPECT_EQ(waits[0]["args"]["value"], produced.value());
    EXPECT_EQ(waits[0]["args"]["queue"], std::string(to_string(a.engine())) + " queue " + std::to_string(a.index()));
    EXPECT_GE(end(waits[0]) + 1e-3, end(fills[0]));
  }
  if (tensor) {
    const auto mm = test::events_named(t, "X", "matmul");
    ASSERT_EQ(mm.size(), 1u);
    EXPECT_EQ(mm[0]["args"]["flops"], 2.0 * 8 * 4 * 16);
    EXPECT_EQ(mm[0]["args"]["tensors"], "8x16 f32, 16x4 f32, 8x4 f32");
    EXPECT_TRUE(mm[0]["args"].contains("GFLOP/s"));
  }
  if (program) {
    const auto calls = test::events_named(t, "X", "program");
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0]["args"]["value"], 1);  // commands in the program
  }
  // Tracks are named as `tpuhal info` names queues.
  bool named = false;
  for (const auto& e : test::events_named(t, "M", "thread_name"))
    named = named || (e["tid"] == h2d["tid"] &&
                      e["args"]["name"] == std::string(to_string(a.engine())) + " queue " + std::to_string(a.index()));
  EXPECT_TRUE(named);
}

INSTANTIATE_TEST_SUITE_P(Devices, Conformance, ::testing::ValuesIn(devices_and_skeleton()), device_name);
INSTANTIATE_TEST_SUITE_P(Devices, ConformanceErrors, ::testing::ValuesIn(devices_and_skeleton()), device_name);

// A driver that offers no devices here (no GPU, no driver, no board) is not
// tested here; the run says which and why rather than passing in silence.
TEST(ConformanceCoverage, DriversWithoutDevicesSayWhy) {
  const auto missing = unavailable_drivers();
  std::string untested;
  for (const auto& [driver, why] : missing) {
    EXPECT_FALSE(driver.empty());
    EXPECT_FALSE(why.empty()) << driver << " offers no devices and gives no reason";
    untested += (untested.empty() ? "" : "; ") + driver + ": " + why;
  }
  if (!untested.empty()) GTEST_SKIP() << "not tested on this machine: " << untested;
}

}  // namespace
}  // namespace tpuhal
