// When the board's own engines last wrote each part of DRAM. Internal to the
// simulator.
//
// The tensor engine keeps what it derives from weights (reordered, packed,
// widened) from run to run, and may use a kept copy only while the weights'
// bytes are the same. Comparing them costs a read of both copies every run:
// ResNet-50's 100 MB of f32 weights, 5 of its 30 ms. Most of DRAM, though,
// only the board writes: the host reaches DRAM through the aperture
// ([0, aperture bytes), all of a SoC's), and everything past it changes
// only through the board's DMA, tensor and video engines. Each of those
// obtains its pointer from DmaEngine::resolve, which stamps the 64 KiB
// chunks it hands out for writing with a clock tick as it hands them out
// and again as the access ends (after the bytes are written); so a kept
// copy of bytes past the aperture, compared equal at some tick, still
// holds while no chunk under them is stamped later. Bytes the host can
// reach (the aperture, host memory through the IOMMU) are compared every
// time, as before.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

namespace tpuhal::sim {

class DramWrites {
 public:
  // DRAM at `dram`, of `dram_bytes`, of which the first `host_bytes` the
  // host can write without the board (the aperture).
  DramWrites(const std::byte* dram, std::uint64_t dram_bytes, std::uint64_t host_bytes)
      : dram_(dram),
        begin_(host_bytes < dram_bytes ? host_bytes : dram_bytes),
        end_(dram_bytes),
        stamps_(
            static_cast<std::uint64_t*>(std::calloc(chunk(end_ - begin_ + kChunk - 1) + 1, sizeof(std::uint64_t)))) {
    if (!stamps_) throw std::bad_alloc();
  }

  static constexpr std::uint64_t kChunk = std::uint64_t{64} << 10;

  // The board writes DRAM [address, address + size): called as a write
  // begins and again once its bytes are in place.
  void wrote(std::uint64_t address, std::uint64_t size) noexcept {
    if (size == 0 || address >= end_ || address + size <= begin_) return;
    const std::uint64_t from = address < begin_ ? 0 : chunk(address - begin_);
    const std::uint64_t to = chunk((address + size < end_ ? address + size : end_) - 1 - begin_);
    const std::uint64_t t = clock_.fetch_add(1, std::memory_order_acq_rel) + 1;
    for (std::uint64_t c = from; c <= to; ++c) {
      std::atomic_ref<std::uint64_t> stamp(stamps_[c]);
      std::uint64_t old = stamp.load(std::memory_order_relaxed);
      while (old < t && !stamp.compare_exchange_weak(old, t, std::memory_order_release)) {
      }
    }
  }

  // The clock now. Read it before comparing bytes: a write stamped later
  // may not be in what was compared.
  std::uint64_t now() const noexcept { return clock_.load(std::memory_order_acquire); }

  // Whether the `size` bytes at `p` lie past the aperture and no write was
  // stamped on them after `since`.
  bool unchanged_since(const void* p, std::uint64_t size, std::uint64_t since) const noexcept {
    const auto at = reinterpret_cast<std::uintptr_t>(p), base = reinterpret_cast<std::uintptr_t>(dram_);
    if (size == 0 || at < base + begin_ || at - base >= end_ || size > end_ - (at - base)) return false;
    const std::uint64_t offset = at - base - begin_;
    for (std::uint64_t c = chunk(offset), last = chunk(offset + size - 1); c <= last; ++c)
      if (std::atomic_ref<std::uint64_t>(stamps_[c]).load(std::memory_order_acquire) > since) return false;
    return true;
  }

 private:
  static constexpr std::uint64_t chunk(std::uint64_t offset) noexcept { return offset / kChunk; }

  const std::byte* dram_;
  std::uint64_t begin_, end_;  // the DRAM only the board writes
  std::atomic<std::uint64_t> clock_{0};
  // Per chunk of [begin_, end_), read and written as std::atomic_ref. From
  // calloc, which for a block this large takes fresh pages that the kernel
  // zeroes only as they are first touched (the sanitizers' allocator
  // always; glibc's while it maps blocks of this size). A board of 12 GiB
  // has 192 Ki chunks: zeroing their 1.5 MB at every open was a sixth of
  // the page faults of sim:0's op tests in one process under
  // AddressSanitizer (237 thousand; 197 without). (One more than the
  // chunks, so that a board with no DRAM past the aperture still has a
  // pointer.)
  struct Free {
    void operator()(std::uint64_t* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<std::uint64_t[], Free> stamps_;
};

// A copy of some weights' bytes, kept beside what was derived from them,
// and the tick at which `source` last equalled the bytes it came from.
struct KeptSource {
  std::vector<std::byte> source;
  std::uint64_t verified = 0;

  // Copies the `size` bytes at `src`.
  void keep(const DramWrites* log, const std::byte* src, std::size_t size) {
    verified = log ? log->now() : 0;
    source.assign(src, src + size);
  }
  // Whether the `size` bytes at `src` still are `source`: without reading
  // them where `log` knows no write touched them since they were compared,
  // else byte for byte.
  bool holds(const DramWrites* log, const std::byte* src, std::size_t size) {
    if (source.size() != size) return false;
    if (log && log->unchanged_since(src, size, verified)) return true;
    const std::uint64_t at = log ? log->now() : 0;
    if (std::memcmp(source.data(), src, size) != 0) return false;
    verified = at;
    return true;
  }
};

}  // namespace tpuhal::sim
