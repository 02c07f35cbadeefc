// A best-fit allocator over an address range, with alignment and
// coalescing. Used for device memory heaps and for the IOVA space.
// Not thread-safe; callers lock.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace tpuhal::base {

class RangeAllocator {
 public:
  struct Stats {
    std::uint64_t total = 0;  // allocatable bytes: the granule-aligned span
    std::uint64_t used = 0;
    std::uint64_t free = 0;
    std::uint64_t largest_free = 0;
    std::uint64_t allocations = 0;
    std::uint64_t peak_used = 0;
  };

  // `granule` (a power of two) is the smallest unit handed out; every size is
  // rounded up to it and every address is a multiple of it (relative to 0).
  RangeAllocator(std::uint64_t base, std::uint64_t size, std::uint64_t granule);

  // The address of a new block of at least `size` bytes aligned to
  // `alignment` (a power of two), or nullopt if no free block fits.
  std::optional<std::uint64_t> allocate(std::uint64_t size, std::uint64_t alignment);
  // Frees the block starting at `address`; false if there is none.
  bool free(std::uint64_t address);
  // Size of the block at `address` (rounded), or 0.
  std::uint64_t block_size(std::uint64_t address) const;

  Stats stats() const;
  std::uint64_t base() const noexcept { return base_; }
  std::uint64_t size() const noexcept { return size_; }

 private:
  void insert_free(std::uint64_t address, std::uint64_t size);
  void erase_free(std::map<std::uint64_t, std::uint64_t>::iterator it);

  std::uint64_t base_, size_, granule_;
  std::uint64_t usable_ = 0;  // the granule-aligned part of [base, base + size)
  std::map<std::uint64_t, std::uint64_t> free_by_addr_;
  std::multimap<std::uint64_t, std::uint64_t> free_by_size_;
  std::map<std::uint64_t, std::uint64_t> used_;  // address -> size
  std::uint64_t used_bytes_ = 0;
  std::uint64_t peak_used_ = 0;
};

}  // namespace tpuhal::base
