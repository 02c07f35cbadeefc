// The board's IOMMU: mapping rules, translation through DmaAccess, and unmap
// racing with DMA (run this under ASan and TSan).
#include "tpuhal/sim/iommu.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "tpuhal/base/mapping.h"
#include "tpuhal/base/wait.h"
#include "tpuhal/fw/command.h"

namespace tpuhal::sim {
namespace {

constexpr std::uint64_t kWin = fw::kHostWindowBase;
constexpr std::uint32_t kRW = kIommuRead | kIommuWrite;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

class SimIommu : public ::testing::Test {
 protected:
  // 16 pages of page-aligned host memory.
  base::Mapping host_ = base::Mapping::anonymous(16 * kIommuPage, {});
  std::byte* page(int i) { return host_.data() + i * kIommuPage; }
  IommuDomain domain_;
};

TEST_F(SimIommu, MapRejectsUnalignedOrEmptyRanges) {
  struct Case {
    std::uint64_t iova;
    void* host;
    std::uint64_t size;
  };
  const Case cases[] = {
      {kWin, page(0), 0},
      {kWin, page(0), 100},
      {kWin + 8, page(0), kIommuPage},
      {kWin, page(0) + 64, kIommuPage},
  };
  for (const auto& c : cases) {
    const std::string why = domain_.map(c.iova, c.host, c.size, kRW);
    EXPECT_TRUE(contains(why, "must be non-zero multiples of 4096")) << why;
  }
  EXPECT_EQ(domain_.mapping_count(), 0u);
  EXPECT_EQ(domain_.mapped_bytes(), 0u);
}

TEST_F(SimIommu, MapRejectsRangesOutsideTheHostWindow) {
  const std::uint64_t cases[][2] = {
      {0, kIommuPage},                                    // device DRAM addresses
      {kWin - kIommuPage, kIommuPage},                    // just below the window
      {fw::kHostWindowEnd, kIommuPage},                   // at the end
      {fw::kHostWindowEnd - kIommuPage, 2 * kIommuPage},  // straddles the end
      {UINT64_MAX - kIommuPage + 1, kIommuPage},          // near 2^64
  };
  for (const auto& c : cases) {
    const std::string why = domain_.map(c[0], page(0), c[1], kRW);
    EXPECT_TRUE(contains(why, "outside the host window")) << c[0] << ": " << why;
  }
  // The last page of the window is fine.
  EXPECT_EQ(domain_.map(fw::kHostWindowEnd - kIommuPage, page(0), kIommuPage, kRW), "");
}

TEST_F(SimIommu, MapRejectsBadAccessFlags) {
  for (std::uint32_t access : {0u, 4u, kRW | 8u}) {
    const std::string why = domain_.map(kWin, page(0), kIommuPage, access);
    EXPECT_TRUE(contains(why, "access flags " + std::to_string(access))) << why;
  }
  EXPECT_EQ(domain_.mapping_count(), 0u);
}

TEST_F(SimIommu, MapRejectsOverlapsAndAcceptsNeighbours) {
  ASSERT_EQ(domain_.map(kWin + 4 * kIommuPage, page(4), 4 * kIommuPage, kRW), "");
  // Overlapping the start, the end, strictly inside, and covering it all.
  const std::uint64_t overlaps[][2] = {
      {kWin + 2 * kIommuPage, 3 * kIommuPage},
      {kWin + 7 * kIommuPage, 2 * kIommuPage},
      {kWin + 5 * kIommuPage, kIommuPage},
      {kWin, 12 * kIommuPage},
  };
  for (const auto& o : overlaps) {
    const std::string why = domain_.map(o[0], page(0), o[1], kRW);
    EXPECT_TRUE(contains(why, "overlaps the mapping at 0x1000000004000")) << why;
  }
  // Touching on either side is not overlapping.
  EXPECT_EQ(domain_.map(kWin, page(0), 4 * kIommuPage, kIommuRead), "");
  EXPECT_EQ(domain_.map(kWin + 8 * kIommuPage, page(8), 8 * kIommuPage, kIommuWrite), "");
  EXPECT_EQ(domain_.mapping_count(), 3u);
  EXPECT_EQ(domain_.mapped_bytes(), 16 * kIommuPage);
}

TEST_F(SimIommu, TranslateInsideAMapping) {
  ASSERT_EQ(domain_.map(kWin + 0x10000, page(2), 4 * kIommuPage, kRW), "");
  DmaContext ctx(domain_);
  DmaAccess access(ctx);
  EXPECT_EQ(access.translate(kWin + 0x10000, 1, kIommuRead), page(2));
  EXPECT_EQ(access.translate(kWin + 0x10000 + 100, 8, kIommuWrite), page(2) + 100);
  EXPECT_EQ(access.translate(kWin + 0x10000, 4 * kIommuPage, kRW), page(2));
  // Same answers a second time (from the context's cache).
  EXPECT_EQ(access.translate(kWin + 0x10000 + 100, 8, kIommuWrite), page(2) + 100);
  EXPECT_EQ(access.translate(kWin + 0x13FF8, 8, kIommuRead), page(2) + 0x3FF8);
}

TEST_F(SimIommu, TranslateRefusesRangesNotFullyInsideOneMapping) {
  ASSERT_EQ(domain_.map(kWin + 0x10000, page(2), 2 * kIommuPage, kRW), "");
  ASSERT_EQ(domain_.map(kWin + 0x12000, page(4), 2 * kIommuPage, kRW), "");
  DmaContext ctx(domain_);
  DmaAccess access(ctx);
  // Warm the cache with the first mapping, then ask past its end.
  ASSERT_NE(access.translate(kWin + 0x10000, 8, kIommuRead), nullptr);
  EXPECT_EQ(access.translate(kWin + 0x11FF8, 16, kIommuRead), nullptr);  // straddles two mappings
  EXPECT_EQ(access.translate(kWin + 0x13FF8, 16, kIommuRead), nullptr);  // straddles the end
  EXPECT_EQ(access.translate(kWin + 0xF000, 8, kIommuRead), nullptr);    // before any mapping
  EXPECT_EQ(access.translate(kWin + 0x14000, 8, kIommuRead), nullptr);   // just past the end
  EXPECT_EQ(access.translate(kWin + 0x10000, 0, kIommuRead), nullptr);   // empty
  EXPECT_EQ(access.translate(UINT64_MAX - 4, 8, kIommuRead), nullptr);   // wraps
}

TEST_F(SimIommu, TranslateEnforcesAccessFlags) {
  ASSERT_EQ(domain_.map(kWin, page(0), kIommuPage, kIommuRead), "");
  ASSERT_EQ(domain_.map(kWin + kIommuPage, page(1), kIommuPage, kIommuWrite), "");
  DmaContext ctx(domain_);
  for (int pass = 0; pass < 2; ++pass) {  // second pass: cached translations
    SCOPED_TRACE(pass);
    DmaAccess access(ctx);
    EXPECT_EQ(access.translate(kWin, 8, kIommuRead), page(0));
    EXPECT_EQ(access.translate(kWin, 8, kIommuWrite), nullptr);
    EXPECT_EQ(access.translate(kWin, 8, kRW), nullptr);
    EXPECT_EQ(access.translate(kWin + kIommuPage, 8, kIommuWrite), page(1));
    EXPECT_EQ(access.translate(kWin + kIommuPage, 8, kIommuRead), nullptr);
  }
}

TEST_F(SimIommu, UnmapNeedsTheExactStartAndSize) {
  ASSERT_EQ(domain_.map(kWin + 0x4000, page(4), 4 * kIommuPage, kRW), "");
  std::string why = domain_.unmap(kWin + 0x5000, 3 * kIommuPage);
  EXPECT_TRUE(contains(why, "no mapping starts at IOVA 0x1000000005000")) << why;
  why = domain_.unmap(kWin + 0x4000, kIommuPage);
  EXPECT_TRUE(contains(why, "is 16384 bytes, not 4096")) << why;
  EXPECT_EQ(domain_.mapping_count(), 1u);
  EXPECT_EQ(domain_.mapped_bytes(), 4 * kIommuPage);

  EXPECT_EQ(domain_.unmap(kWin + 0x4000, 4 * kIommuPage), "");
  EXPECT_EQ(domain_.mapping_count(), 0u);
  EXPECT_EQ(domain_.mapped_bytes(), 0u);
  why = domain_.unmap(kWin + 0x4000, 4 * kIommuPage);  // twice
  EXPECT_TRUE(contains(why, "no mapping starts at")) << why;
}

TEST_F(SimIommu, UnmappedRangeNoLongerTranslatesEvenWhenCached) {
  ASSERT_EQ(domain_.map(kWin, page(0), kIommuPage, kRW), "");
  DmaContext ctx(domain_);
  {
    DmaAccess access(ctx);
    ASSERT_EQ(access.translate(kWin, 8, kIommuRead), page(0));
  }
  ASSERT_EQ(domain_.unmap(kWin, kIommuPage), "");
  {
    DmaAccess access(ctx);
    EXPECT_EQ(access.translate(kWin, 8, kIommuRead), nullptr);
  }
  // Mapped again elsewhere: the new translation, not the cached old one.
  ASSERT_EQ(domain_.map(kWin, page(3), kIommuPage, kIommuRead), "");
  DmaAccess access(ctx);
  EXPECT_EQ(access.translate(kWin, 8, kIommuRead), page(3));
}

TEST_F(SimIommu, UnmapAllClearsEverything) {
  ASSERT_EQ(domain_.map(kWin, page(0), kIommuPage, kRW), "");
  ASSERT_EQ(domain_.map(kWin + 0x10000, page(1), 2 * kIommuPage, kRW), "");
  EXPECT_EQ(domain_.mapping_count(), 2u);
  EXPECT_EQ(domain_.mapped_bytes(), 3 * kIommuPage);
  domain_.unmap_all();
  EXPECT_EQ(domain_.mapping_count(), 0u);
  EXPECT_EQ(domain_.mapped_bytes(), 0u);
  DmaContext ctx(domain_);
  DmaAccess access(ctx);
  EXPECT_EQ(access.translate(kWin, 8, kIommuRead), nullptr);
}

// A DMA thread translates and reads a mapped heap buffer in a loop while the
// host thread unmaps it, frees it and maps a fresh one at the same IOVA. The
// grace period must keep every read inside a live buffer: ASan reports a
// heap-use-after-free otherwise, and TSan a race with free().
TEST(SimIommuStress, UnmapWaitsForAccessesInFlight) {
  constexpr std::uint64_t kIova = kWin + 0x100000;
  constexpr int kRounds = 300;
  IommuDomain domain;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> bad_contents{0};

  std::thread dma([&] {
    DmaContext ctx(domain);
    while (!stop.load(std::memory_order_relaxed)) {
      DmaAccess access(ctx);
      auto* p = access.translate(kIova + 64, 64, kIommuRead);
      if (!p) continue;
      // A transfer in progress: read, dawdle, read again. Every byte carries
      // the round's marker, so both reads must agree.
      unsigned char first[64], second[64];
      std::memcpy(first, p, sizeof first);
      for (int i = 0; i < 100; ++i) base::cpu_relax();
      std::memcpy(second, p, sizeof second);
      bool same = std::memcmp(first, second, sizeof first) == 0;
      for (unsigned char c : first) same = same && c == first[0];
      if (!same) bad_contents.fetch_add(1, std::memory_order_relaxed);
      hits.fetch_add(1, std::memory_order_relaxed);
    }
  });

  for (int round = 0; round < kRounds; ++round) {
    void* buf = std::aligned_alloc(kIommuPage, kIommuPage);
    ASSERT_NE(buf, nullptr);
    std::memset(buf, round & 0xFF, kIommuPage);
    ASSERT_EQ(domain.map(kIova, buf, kIommuPage, kIommuRead), "");
    // Give the DMA thread a chance to use this mapping.
    const std::uint64_t deadline = base::monotonic_ns() + 2'000'000;
    const std::uint64_t before = hits.load();
    while (hits.load() == before && base::monotonic_ns() < deadline) std::this_thread::yield();
    ASSERT_EQ(domain.unmap(kIova, kIommuPage), "");
    std::memset(buf, 0xEE, kIommuPage);  // a late reader would see mixed bytes
    std::free(buf);
  }
  stop.store(true);
  dma.join();
  EXPECT_EQ(bad_contents.load(), 0u);
  EXPECT_GT(hits.load(), 0u);  // the race was exercised
  EXPECT_EQ(domain.mapping_count(), 0u);
}

}  // namespace
}  // namespace tpuhal::sim
