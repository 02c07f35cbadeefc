// The machine's own limits, measured the same way every time.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "tpuhal/base/mapping.h"
#include "tpuhal/base/wait.h"
#include "results.h"

namespace tpuhal::bench {

struct MemcpyFloor::Buffers {
  base::Mapping a, b;
};

MemcpyFloor::MemcpyFloor(std::uint64_t max_bytes) : buffers_(std::make_unique<Buffers>()) {
  const bool huge = max_bytes >= (2u << 20);
  buffers_->a = base::Mapping::anonymous(max_bytes, {.populate = true, .huge_pages = huge});
  buffers_->b = base::Mapping::anonymous(max_bytes, {.populate = true, .huge_pages = huge});
  std::memset(buffers_->a.data(), 0x5a, max_bytes);
  std::memcpy(buffers_->b.data(), buffers_->a.data(), max_bytes);
}

MemcpyFloor::~MemcpyFloor() = default;

double MemcpyFloor::gbps(std::uint64_t bytes, int reps) {
  std::byte* src = buffers_->a.data();
  std::byte* dst = buffers_->b.data();
  std::memcpy(dst, src, bytes);  // warm, as the device's first round is
  const auto t0 = base::monotonic_ns();
  for (int i = 0; i < reps; ++i) {
    std::memcpy(dst, src, bytes);
    std::atomic_signal_fence(std::memory_order_seq_cst);  // keep every copy
  }
  const double s = static_cast<double>(base::monotonic_ns() - t0) * 1e-9;
  return static_cast<double>(bytes) * reps / s / 1e9;
}

double atomic_pingpong_ns(int iterations) {
  alignas(64) std::atomic<std::uint64_t> ping{0};
  alignas(64) std::atomic<std::uint64_t> pong{0};
  std::thread peer([&] {
    for (std::uint64_t i = 1; i <= static_cast<std::uint64_t>(iterations); ++i) {
      while (ping.load(std::memory_order_acquire) != i) base::cpu_relax();
      pong.store(i, std::memory_order_release);
    }
  });
  std::vector<double> samples;
  samples.reserve(iterations);
  for (std::uint64_t i = 1; i <= static_cast<std::uint64_t>(iterations); ++i) {
    const auto t0 = base::monotonic_ns();
    ping.store(i, std::memory_order_release);
    while (pong.load(std::memory_order_acquire) != i) base::cpu_relax();
    samples.push_back(static_cast<double>(base::monotonic_ns() - t0));
  }
  peer.join();
  return median(std::move(samples));
}

double eventfd_pingpong_ns(int iterations) {
  const int a = ::eventfd(0, EFD_CLOEXEC), b = ::eventfd(0, EFD_CLOEXEC);
  std::thread peer([&] {
    std::uint64_t v;
    for (int i = 0; i < iterations; ++i) {
      if (::read(a, &v, sizeof v) != sizeof v) break;
      v = 1;
      if (::write(b, &v, sizeof v) != sizeof v) break;
    }
  });
  std::vector<double> samples;
  samples.reserve(iterations);
  for (int i = 0; i < iterations; ++i) {
    std::uint64_t v = 1;
    const auto t0 = base::monotonic_ns();
    if (::write(a, &v, sizeof v) != sizeof v) break;
    if (::read(b, &v, sizeof v) != sizeof v) break;
    samples.push_back(static_cast<double>(base::monotonic_ns() - t0));
  }
  peer.join();
  ::close(a);
  ::close(b);
  return median(std::move(samples));
}

double spsc_rate_mps(std::uint64_t messages) {
  constexpr std::uint32_t kSlots = 4096;
  struct alignas(64) Slot {
    std::uint64_t payload[8];
  };
  std::vector<Slot> ring(kSlots);
  alignas(64) std::atomic<std::uint64_t> head{0};  // consumer
  alignas(64) std::atomic<std::uint64_t> tail{0};  // producer
  std::thread consumer([&] {
    std::uint64_t h = 0, sum = 0;
    while (h < messages) {
      const std::uint64_t t = tail.load(std::memory_order_acquire);
      if (t == h) {
        base::cpu_relax();
        continue;
      }
      for (; h != t; ++h) sum += ring[h % kSlots].payload[0];
      head.store(h, std::memory_order_release);
    }
    if (sum == 42) std::abort();  // keep the reads
  });
  const auto t0 = base::monotonic_ns();
  std::uint64_t cached_head = 0;
  for (std::uint64_t t = 0; t < messages; ++t) {
    while (t - cached_head >= kSlots) cached_head = head.load(std::memory_order_acquire);
    Slot s{};
    s.payload[0] = t;
    std::memcpy(&ring[t % kSlots], &s, sizeof s);
    tail.store(t + 1, std::memory_order_release);
  }
  consumer.join();
  const double sec = static_cast<double>(base::monotonic_ns() - t0) * 1e-9;
  return static_cast<double>(messages) / sec / 1e6;
}

}  // namespace tpuhal::bench
