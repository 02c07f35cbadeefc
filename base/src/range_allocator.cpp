#include "tpuhal/base/range_allocator.h"

#include "tpuhal/base/mapping.h"

namespace tpuhal::base {

RangeAllocator::RangeAllocator(std::uint64_t base, std::uint64_t size, std::uint64_t granule)
    : base_(base), size_(size), granule_(granule) {
  const std::uint64_t start = align_up(base, granule);
  const std::uint64_t end = (base + size) & ~(granule - 1);
  if (end > start) {
    usable_ = end - start;
    insert_free(start, usable_);
  }
}

void RangeAllocator::insert_free(std::uint64_t address, std::uint64_t size) {
  free_by_addr_.emplace(address, size);
  free_by_size_.emplace(size, address);
}

void RangeAllocator::erase_free(std::map<std::uint64_t, std::uint64_t>::iterator it) {
  auto [lo, hi] = free_by_size_.equal_range(it->second);
  for (auto s = lo; s != hi; ++s) {
    if (s->second == it->first) {
      free_by_size_.erase(s);
      break;
    }
  }
  free_by_addr_.erase(it);
}

std::optional<std::uint64_t> RangeAllocator::allocate(std::uint64_t size, std::uint64_t alignment) {
  if (size == 0 || size > size_) return std::nullopt;
  if (alignment < granule_) alignment = granule_;
  const std::uint64_t want = align_up(size, granule_);
  // Best fit: the smallest free block that holds the aligned request.
  for (auto s = free_by_size_.lower_bound(want); s != free_by_size_.end(); ++s) {
    const std::uint64_t block = s->second, block_size = s->first;
    const std::uint64_t start = align_up(block, alignment);
    if (start < block || start - block > block_size || block_size - (start - block) < want) continue;
    auto it = free_by_addr_.find(block);
    erase_free(it);
    if (start > block) insert_free(block, start - block);
    const std::uint64_t end = start + want, block_end = block + block_size;
    if (block_end > end) insert_free(end, block_end - end);
    used_.emplace(start, want);
    used_bytes_ += want;
    if (used_bytes_ > peak_used_) peak_used_ = used_bytes_;
    return start;
  }
  return std::nullopt;
}

bool RangeAllocator::free(std::uint64_t address) {
  auto u = used_.find(address);
  if (u == used_.end()) return false;
  std::uint64_t start = address, size = u->second;
  used_bytes_ -= size;
  used_.erase(u);
  // Coalesce with the free neighbours on either side.
  auto next = free_by_addr_.lower_bound(start);
  if (next != free_by_addr_.end() && next->first == start + size) {
    size += next->second;
    auto after = std::next(next);
    erase_free(next);
    next = after;
  }
  if (next != free_by_addr_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      erase_free(prev);
    }
  }
  insert_free(start, size);
  return true;
}

std::uint64_t RangeAllocator::block_size(std::uint64_t address) const {
  auto u = used_.find(address);
  return u == used_.end() ? 0 : u->second;
}

RangeAllocator::Stats RangeAllocator::stats() const {
  Stats s;
  s.total = usable_;
  s.used = used_bytes_;
  s.free = usable_ - used_bytes_;
  s.largest_free = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  s.allocations = used_.size();
  s.peak_used = peak_used_;
  return s;
}

}  // namespace tpuhal::base
