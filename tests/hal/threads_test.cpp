// Threads: many threads and queues submitting at once; every completion
// arrives, and arrives once.
#include <gtest/gtest.h>

#include <atomic>
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "device_param.hpp"
#include "tpuhal/tpuhal.hpp"

namespace tpuhal {
namespace {

using namespace std::chrono_literals;

std::uint64_t load_word(const Buffer& b, std::size_t i) {
  return std::atomic_ref<std::uint64_t>(reinterpret_cast<std::uint64_t*>(b.map().data())[i])
      .load(std::memory_order_acquire);
}

// Several threads, several queues (two threads share each queue), 100k+
// commands. Each command writes its own word once; at the end every word
// holds its value, every queue's timeline stands exactly at the number of
// submissions it took, the fence values each queue handed out are exactly
// 1..N, and the board retired exactly one descriptor per command.
TEST(Threads, EveryCompletionArrivesExactlyOnce) {
  Device dev = open("sim:0");
  constexpr int kThreads = 4;
  constexpr int kQueues = 2;
  constexpr int kPerThread = 26'000;
  std::vector<Queue> queues;
  for (int i = 0; i < kQueues; ++i) queues.push_back(dev.queue());
  std::vector<std::uint64_t> retired_before(kQueues);
  for (auto& qs : dev.status().queues) {
    for (int i = 0; i < kQueues; ++i) {
      if (qs.index == queues[i].index()) retired_before[i] = qs.retired;
    }
  }

  Buffer words = dev.allocate(std::uint64_t{kThreads} * kPerThread * 8, Memory::HostPinned);
  std::memset(words.map().data(), 0, words.size());
  std::vector<std::vector<std::uint64_t>> values(kThreads);
  std::barrier start(kThreads);

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Queue& q = queues[t % kQueues];
      values[t].reserve(kPerThread);
      start.arrive_and_wait();
      Fence last;
      for (int i = 0; i < kPerThread; ++i) {
        const std::uint64_t slot = std::uint64_t(t) * kPerThread + i;
        last = q.batch().write_value(words, slot * 8, slot + 1).submit();
        values[t].push_back(last.value());
        if (i % 997 == 0) last.wait();  // mix waits into the stream
      }
      last.wait();
    });
  }
  for (auto& th : threads) th.join();

  for (std::uint64_t slot = 0; slot < std::uint64_t{kThreads} * kPerThread; ++slot)
    ASSERT_EQ(load_word(words, slot), slot + 1) << "slot " << slot;
  for (int qi = 0; qi < kQueues; ++qi) {
    std::vector<std::uint64_t> all;
    for (int t = qi; t < kThreads; t += kQueues) all.insert(all.end(), values[t].begin(), values[t].end());
    std::sort(all.begin(), all.end());
    ASSERT_EQ(all.size(), std::size_t{kThreads / kQueues} * kPerThread);
    for (std::size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], i + 1) << "queue " << qi;
    EXPECT_EQ(queues[qi].completed_value(), all.size());
  }
  for (auto& qs : dev.status().queues) {
    for (int i = 0; i < kQueues; ++i) {
      if (qs.index == queues[i].index()) {
        EXPECT_EQ(qs.retired - retired_before[i], std::uint64_t{kThreads / kQueues} * kPerThread);
      }
    }
  }
}

// Threads allocating, copying and freeing at once leave the device's memory
// exactly as they found it.
TEST(Threads, ConcurrentAllocationAndCopiesLeaveNoTrace) {
  Device dev = open("sim:tiny");
  Queue shared[2] = {dev.queue(Engine::Compute), dev.queue(Engine::Copy)};
  const auto before = dev.memory_stats();  // queue rings included
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Queue q = shared[t % 2];
      for (int i = 0; i < 200; ++i) {
        const std::uint64_t n = 4096 + 64 * ((i * 7 + t) % 50);
        Buffer h = dev.allocate(n, Memory::HostPinned), back = dev.allocate(n, Memory::HostPinned);
        Buffer d = dev.allocate(n);
        std::memset(h.map().data(), t * 31 + i, n);
        q.copy(h, d).copy(d, back).submit().wait();
        if (std::memcmp(h.map().data(), back.map().data(), n) != 0) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  const auto after = dev.memory_stats();
  EXPECT_EQ(after.device_used, before.device_used);
  EXPECT_EQ(after.host_pinned_bytes, before.host_pinned_bytes);
}

// Several threads waiting on the same fence all wake.
TEST(Threads, ManyWaitersOnOneFenceAllWake) {
  Device dev = open("sim:tiny");
  Queue q = dev.queue();
  Buffer gate = dev.allocate(4096, Memory::HostPinned);
  std::memset(gate.map().data(), 0, 8);
  Fence f = q.batch().wait_value(gate, 0, 1).submit();
  std::atomic<int> woke{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 6; ++i)
    waiters.emplace_back([&] {
      f.wait(10s);
      ++woke;
    });
  std::this_thread::sleep_for(30ms);  // let them block on the interrupt
  EXPECT_EQ(woke.load(), 0);
  std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(gate.map().data())).store(1);
  for (auto& w : waiters) w.join();
  EXPECT_EQ(woke.load(), 6);
}

}  // namespace
}  // namespace tpuhal
