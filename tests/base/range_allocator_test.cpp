// RangeAllocator: best-fit allocation with alignment and coalescing, used for
// device memory heaps and the IOVA space.
#include "tpuhal/base/range_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <vector>

namespace tpuhal::base {
namespace {

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * kKiB;

TEST(RangeAllocator, FreshAllocatorIsOneFreeBlock) {
  RangeAllocator a(0x100000, 16 * kMiB, 4096);
  const auto s = a.stats();
  EXPECT_EQ(s.total, 16 * kMiB);
  EXPECT_EQ(s.used, 0u);
  EXPECT_EQ(s.free, 16 * kMiB);
  EXPECT_EQ(s.largest_free, 16 * kMiB);
  EXPECT_EQ(s.allocations, 0u);
  EXPECT_EQ(s.peak_used, 0u);
  EXPECT_EQ(a.base(), 0x100000u);
  EXPECT_EQ(a.size(), 16 * kMiB);
}

TEST(RangeAllocator, SizesRoundUpToTheGranuleAndStartAtTheBase) {
  RangeAllocator a(0x100000, kMiB, 4096);
  auto p = a.allocate(1, 1);
  ASSERT_TRUE(p);
  EXPECT_EQ(*p, 0x100000u);
  EXPECT_EQ(a.block_size(*p), 4096u);
  auto q = a.allocate(4097, 1);
  ASSERT_TRUE(q);
  EXPECT_EQ(*q, 0x101000u);
  EXPECT_EQ(a.block_size(*q), 8192u);
  EXPECT_EQ(a.stats().used, 12288u);
  EXPECT_EQ(a.block_size(0x100800), 0u);  // not a block start
}

TEST(RangeAllocator, ZeroOrOversizedRequestsFail) {
  RangeAllocator a(0, kMiB, 4096);
  EXPECT_EQ(a.allocate(0, 4096), std::nullopt);
  EXPECT_EQ(a.allocate(kMiB + 1, 4096), std::nullopt);
  EXPECT_EQ(a.allocate(UINT64_MAX, 4096), std::nullopt);
  EXPECT_EQ(a.stats().allocations, 0u);
}

TEST(RangeAllocator, AlignmentIsHonoured) {
  RangeAllocator a(0, 64 * kMiB, 4096);
  ASSERT_TRUE(a.allocate(4096, 4096));  // knock the free block off alignment
  for (std::uint64_t align : {8 * kKiB, 64 * kKiB, kMiB, 2 * kMiB, 16 * kMiB}) {
    SCOPED_TRACE(align);
    auto p = a.allocate(12345, align);
    ASSERT_TRUE(p);
    EXPECT_EQ(*p % align, 0u);
    EXPECT_EQ(a.block_size(*p), 16 * kKiB);
  }
  // An alignment below the granule still gives granule alignment.
  auto p = a.allocate(100, 16);
  ASSERT_TRUE(p);
  EXPECT_EQ(*p % 4096, 0u);
}

TEST(RangeAllocator, AlignmentRelativeToZeroWithAnUnalignedBase) {
  // The usable range starts at the first granule boundary above the base.
  RangeAllocator a(0x1234, kMiB, 4096);
  auto p = a.allocate(4096, 4096);
  ASSERT_TRUE(p);
  EXPECT_EQ(*p, 0x2000u);
  auto q = a.allocate(4096, 64 * kKiB);
  ASSERT_TRUE(q);
  EXPECT_EQ(*q, 0x10000u);
  // Nothing is handed out past base + size.
  std::uint64_t end = 0;
  while (auto r = a.allocate(4096, 4096)) end = std::max(end, *r + 4096);
  EXPECT_LE(end, 0x1234u + kMiB);
}

// With a base or size off the granule, the bytes outside the first and last
// granule boundaries can never be handed out; the statistics should not
// count them as free.
TEST(RangeAllocator, StatsOfAnUnalignedRangeCountOnlyUsableBytes) {
  RangeAllocator a(0x1234, kMiB, 4096);  // usable: [0x2000, 0x101000)
  const std::uint64_t usable = 0x101000 - 0x2000;
  auto s = a.stats();
  EXPECT_EQ(s.largest_free, usable);
  EXPECT_EQ(s.free, usable) << "free counts " << s.free - usable << " bytes that cannot be allocated";
  EXPECT_EQ(a.allocate(s.free, 4096).has_value(), true) << "stats().free is not allocatable";
}

TEST(RangeAllocator, AlignmentThatDoesNotFitInAnyBlockFails) {
  RangeAllocator a(4096, 8 * kMiB, 4096);  // [4 KiB, 8 MiB + 4 KiB)
  // The only 8 MiB-aligned address inside is 8 MiB, with just 4 KiB after it.
  EXPECT_EQ(a.allocate(8192, 8 * kMiB), std::nullopt);
  auto p = a.allocate(4096, 8 * kMiB);
  ASSERT_TRUE(p);
  EXPECT_EQ(*p, 8 * kMiB);
}

TEST(RangeAllocator, BestFitPicksTheSmallestHoleThatFits) {
  RangeAllocator a(0, kMiB, 4096);
  // Carve holes of 8, 16 and 12 KiB separated by live blocks.
  auto h8 = a.allocate(8 * kKiB, 1);
  auto s1 = a.allocate(4 * kKiB, 1);
  auto h16 = a.allocate(16 * kKiB, 1);
  auto s2 = a.allocate(4 * kKiB, 1);
  auto h12 = a.allocate(12 * kKiB, 1);
  auto s3 = a.allocate(4 * kKiB, 1);
  ASSERT_TRUE(h8 && s1 && h16 && s2 && h12 && s3);
  ASSERT_TRUE(a.free(*h8));
  ASSERT_TRUE(a.free(*h16));
  ASSERT_TRUE(a.free(*h12));

  // 10 KiB fits 12 and 16 (and the tail); the 12 KiB hole is the best fit.
  auto p = a.allocate(10 * kKiB, 1);
  ASSERT_TRUE(p);
  EXPECT_EQ(*p, *h12);
  // 8 KiB fits the 8 KiB hole exactly.
  auto q = a.allocate(8 * kKiB, 1);
  ASSERT_TRUE(q);
  EXPECT_EQ(*q, *h8);
  // 14 KiB: only the 16 KiB hole (or the big tail) fits.
  auto r = a.allocate(14 * kKiB, 1);
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, *h16);
}

TEST(RangeAllocator, BestFitSkipsASmallerHoleWhoseAlignmentDoesNotFit) {
  RangeAllocator a(0, kMiB, 4096);
  auto pad = a.allocate(4 * kKiB, 1);     // [0, 4K)
  auto hole = a.allocate(12 * kKiB, 1);   // [4K, 16K): 12 KiB, not 16K-aligned
  auto wall = a.allocate(4 * kKiB, 1);    // [16K, 20K)
  auto hole2 = a.allocate(28 * kKiB, 1);  // [20K, 48K)
  auto wall2 = a.allocate(4 * kKiB, 1);   // [48K, 52K)
  ASSERT_TRUE(pad && hole && wall && hole2 && wall2);
  ASSERT_TRUE(a.free(*hole));
  ASSERT_TRUE(a.free(*hole2));
  // 8 KiB at 16 KiB alignment: the 12 KiB hole has no 16K-aligned 8 KiB in it
  // ([4K, 16K)); the 28 KiB hole has one at 32K.
  auto p = a.allocate(8 * kKiB, 16 * kKiB);
  ASSERT_TRUE(p);
  EXPECT_EQ(*p, 32 * kKiB);
  // The split-off pieces of the 28 KiB hole are free blocks again: [40K, 48K)
  // is the exact fit for 8 KiB, and [20K, 32K) one of two for 12 KiB.
  auto after = a.allocate(8 * kKiB, 1);
  ASSERT_TRUE(after);
  EXPECT_EQ(*after, 40 * kKiB);
  auto first = a.allocate(12 * kKiB, 1);
  auto second = a.allocate(12 * kKiB, 1);
  ASSERT_TRUE(first && second);
  EXPECT_EQ(std::min(*first, *second), 4 * kKiB);
  EXPECT_EQ(std::max(*first, *second), 20 * kKiB);
  EXPECT_EQ(a.stats().largest_free, kMiB - 52 * kKiB);  // only the tail is left
}

TEST(RangeAllocator, FreeingInAnyOrderCoalescesBackToOneBlock) {
  constexpr int kBlocks = 32;
  for (int order = 0; order < 4; ++order) {
    SCOPED_TRACE(order);
    RangeAllocator a(0x40000000, 4 * kMiB, 4096);
    std::vector<std::uint64_t> blocks;
    for (int i = 0; i < kBlocks; ++i) {
      auto p = a.allocate(4096 * static_cast<std::uint64_t>(1 + i % 5), 4096);
      ASSERT_TRUE(p);
      blocks.push_back(*p);
    }
    switch (order) {
      case 0: break;                                              // address order
      case 1: std::reverse(blocks.begin(), blocks.end()); break;  // reverse
      case 2: {                                                   // odd ones, then even
        std::stable_partition(blocks.begin(), blocks.end(),
                              [&](std::uint64_t b) { return ((b - 0x40000000) / 4096) % 2; });
        break;
      }
      default: std::shuffle(blocks.begin(), blocks.end(), std::mt19937(42)); break;
    }
    for (auto b : blocks) ASSERT_TRUE(a.free(b)) << std::hex << b;
    const auto s = a.stats();
    EXPECT_EQ(s.used, 0u);
    EXPECT_EQ(s.allocations, 0u);
    EXPECT_EQ(s.largest_free, s.total);
    EXPECT_EQ(s.free, s.total);
    // The whole range can be handed out again in one piece.
    auto all = a.allocate(4 * kMiB, 4096);
    ASSERT_TRUE(all);
    EXPECT_EQ(*all, 0x40000000u);
  }
}

TEST(RangeAllocator, FreeCoalescesWithBothNeighbours) {
  RangeAllocator a(0, 64 * kKiB, 4096);
  auto x = a.allocate(16 * kKiB, 1);
  auto y = a.allocate(16 * kKiB, 1);
  auto z = a.allocate(16 * kKiB, 1);
  auto rest = a.allocate(16 * kKiB, 1);
  ASSERT_TRUE(x && y && z && rest);
  EXPECT_EQ(a.stats().largest_free, 0u);
  ASSERT_TRUE(a.free(*x));
  ASSERT_TRUE(a.free(*z));
  EXPECT_EQ(a.stats().largest_free, 16 * kKiB);
  ASSERT_TRUE(a.free(*y));  // joins x and z
  EXPECT_EQ(a.stats().largest_free, 48 * kKiB);
  auto big = a.allocate(48 * kKiB, 1);
  ASSERT_TRUE(big);
  EXPECT_EQ(*big, *x);
}

TEST(RangeAllocator, StatsTrackUsedAllocationsAndPeak) {
  RangeAllocator a(0, kMiB, 4096);
  auto p = a.allocate(10000, 1);  // 12 KiB
  auto q = a.allocate(4096, 1);
  ASSERT_TRUE(p && q);
  auto s = a.stats();
  EXPECT_EQ(s.used, 16 * kKiB);
  EXPECT_EQ(s.free, kMiB - 16 * kKiB);
  EXPECT_EQ(s.allocations, 2u);
  EXPECT_EQ(s.peak_used, 16 * kKiB);
  EXPECT_EQ(s.largest_free, kMiB - 16 * kKiB);

  ASSERT_TRUE(a.free(*p));
  s = a.stats();
  EXPECT_EQ(s.used, 4 * kKiB);
  EXPECT_EQ(s.allocations, 1u);
  EXPECT_EQ(s.peak_used, 16 * kKiB);  // the peak stays

  auto r = a.allocate(64 * kKiB, 1);
  ASSERT_TRUE(r);
  s = a.stats();
  EXPECT_EQ(s.used, 68 * kKiB);
  EXPECT_EQ(s.peak_used, 68 * kKiB);
}

TEST(RangeAllocator, FreeOfUnknownAddressReturnsFalse) {
  RangeAllocator a(0x10000, kMiB, 4096);
  EXPECT_FALSE(a.free(0x10000));  // nothing allocated yet
  auto p = a.allocate(8192, 1);
  ASSERT_TRUE(p);
  EXPECT_FALSE(a.free(*p + 4096));  // inside a block, not its start
  EXPECT_FALSE(a.free(0));
  EXPECT_TRUE(a.free(*p));
  EXPECT_FALSE(a.free(*p));  // double free
  EXPECT_EQ(a.stats().used, 0u);
  EXPECT_EQ(a.stats().largest_free, kMiB);
}

TEST(RangeAllocator, ExhaustionReturnsNulloptAndFreeingRecovers) {
  RangeAllocator a(0, 64 * kKiB, 4096);
  std::vector<std::uint64_t> blocks;
  while (auto p = a.allocate(4096, 1)) blocks.push_back(*p);
  EXPECT_EQ(blocks.size(), 16u);
  EXPECT_EQ(a.stats().free, 0u);
  EXPECT_EQ(a.stats().largest_free, 0u);
  EXPECT_EQ(a.allocate(1, 1), std::nullopt);
  ASSERT_TRUE(a.free(blocks[7]));
  auto again = a.allocate(4096, 1);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, blocks[7]);
  // Fragmented: 32 KiB free in total, but not in one piece.
  for (std::size_t i = 0; i < blocks.size(); i += 2) ASSERT_TRUE(a.free(blocks[i]));
  EXPECT_EQ(a.stats().free, 32 * kKiB);
  EXPECT_EQ(a.stats().largest_free, 4 * kKiB);
  EXPECT_EQ(a.allocate(8192, 1), std::nullopt);
}

// Random allocate/free traffic against a model of the live blocks: no two live
// blocks overlap, every block lies inside the range with the alignment asked
// for, and the statistics agree with the model.
TEST(RangeAllocator, RandomTrafficNeverOverlaps) {
  constexpr std::uint64_t kBase = 0x7000'0000'0000;
  constexpr std::uint64_t kSize = 256 * kMiB;
  constexpr std::uint64_t kGranule = 256;
  RangeAllocator a(kBase, kSize, kGranule);
  std::mt19937_64 rng(20240611);
  std::map<std::uint64_t, std::uint64_t> live;  // address -> rounded size
  std::uint64_t used = 0, peak = 0, successes = 0;

  for (int step = 0; step < 20000; ++step) {
    const bool do_alloc = live.empty() || rng() % 100 < 55;
    if (do_alloc) {
      const std::uint64_t size = rng() % 4 == 0 ? 1 + rng() % (4 * kMiB) : 1 + rng() % 8192;
      const std::uint64_t align = std::uint64_t{1} << (rng() % 22);  // 1 B .. 2 MiB
      auto p = a.allocate(size, align);
      if (!p) continue;  // full or fragmented: fine, frees follow
      ++successes;
      const std::uint64_t rounded = (size + kGranule - 1) / kGranule * kGranule;
      ASSERT_EQ(a.block_size(*p), rounded);
      ASSERT_EQ(*p % std::max(align, kGranule), 0u) << "align " << align;
      ASSERT_GE(*p, kBase);
      ASSERT_LE(*p + rounded, kBase + kSize);
      // Neighbours in address order must end before / start after it.
      auto next = live.lower_bound(*p);
      if (next != live.end()) {
        ASSERT_LE(*p + rounded, next->first) << "overlaps the next block";
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, *p) << "overlaps the previous block";
      }
      live.emplace(*p, rounded);
      used += rounded;
      peak = std::max(peak, used);
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      ASSERT_TRUE(a.free(it->first));
      used -= it->second;
      live.erase(it);
    }
    if (step % 500 == 0) {
      const auto s = a.stats();
      ASSERT_EQ(s.used, used);
      ASSERT_EQ(s.allocations, live.size());
      ASSERT_EQ(s.peak_used, peak);
      ASSERT_EQ(s.free, kSize - used);
    }
  }
  EXPECT_GT(successes, 5000u);  // the traffic was real
  for (auto& [addr, size] : live) ASSERT_TRUE(a.free(addr));
  const auto s = a.stats();
  EXPECT_EQ(s.used, 0u);
  EXPECT_EQ(s.largest_free, kSize);
}

}  // namespace
}  // namespace tpuhal::base
