// The board's IOMMU: which host memory the board may reach, and where.
//
// The host maps a range of its memory at an IOVA in the host window
// (fw::kHostWindowBase..kHostWindowEnd); the board's DMA engine can then reach
// exactly those bytes, with the access the mapping allows. Anything else is a
// DMA fault, never an access to random host memory.
//
// Unmapping is safe against DMA in flight: unmap() returns only after every
// DMA context that might still be using the old translation has left its
// access (a grace period, as in RCU). DMA contexts pay two stores and a load
// per access on the fast path and cache recent translations.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace tpuhal::sim {

inline constexpr std::uint32_t kIommuRead = 1;
inline constexpr std::uint32_t kIommuWrite = 2;
inline constexpr std::uint64_t kIommuPage = 4096;

class IommuDomain;
class DramWrites;  // simulator/src/dram_writes.h

// Per-thread (per DMA engine user) translation state. Not thread-safe: one
// context per command processor.
class DmaContext {
 public:
  explicit DmaContext(IommuDomain& domain);
  ~DmaContext();
  DmaContext(const DmaContext&) = delete;
  DmaContext& operator=(const DmaContext&) = delete;

  IommuDomain& domain() const noexcept { return domain_; }

  // The flag that abandons this context's reads of host memory through a
  // HostPort (its command processor is stopping); nullptr: none.
  void set_abandon(const std::atomic<bool>* flag) noexcept { abandon_ = flag; }
  const std::atomic<bool>* abandon() const noexcept { return abandon_; }

 private:
  friend class IommuDomain;
  friend class DmaAccess;
  struct CacheEntry {
    std::uint64_t generation = 0;
    std::uint64_t iova = 0;
    std::uint64_t size = 0;
    std::byte* host = nullptr;
    std::uint32_t access = 0;
  };
  IommuDomain& domain_;
  const std::atomic<bool>* abandon_ = nullptr;
  std::atomic<std::uint64_t> active_generation_{0};  // 0: not inside an access
  CacheEntry cache_[4];
  unsigned next_victim_ = 0;
};

// An access in progress: translations made through it stay valid until it is
// destroyed. Keep it short; unmap() waits for it.
class DmaAccess {
 public:
  explicit DmaAccess(DmaContext& ctx) noexcept;
  ~DmaAccess();
  DmaAccess(const DmaAccess&) = delete;
  DmaAccess& operator=(const DmaAccess&) = delete;

  // Host pointer for [iova, iova + size) if one mapping covers all of it with
  // `access` allowed; nullptr otherwise.
  // A window mapped without a host pointer (a remote host, see
  // sim::HostPort) translates to nullptr; permits() is its check.
  std::byte* translate(std::uint64_t iova, std::uint64_t size, std::uint32_t access);
  // Whether one mapping covers [iova, iova + size) with `access` allowed.
  bool permits(std::uint64_t iova, std::uint64_t size, std::uint32_t access);

  // The board's DRAM [address, address + size) is handed out through this
  // access for writing: `log` stamps it now and again when the access ends,
  // after the writes (the span of every range noted).
  void writes_dram(DramWrites& log, std::uint64_t address, std::uint64_t size) noexcept;

 private:
  // The window covering [iova, iova + size), or nullptr.
  const DmaContext::CacheEntry* find(std::uint64_t iova, std::uint64_t size);

  DmaContext& ctx_;
  std::uint64_t generation_;
  DramWrites* dram_log_ = nullptr;
  std::uint64_t dram_begin_ = 0, dram_end_ = 0;
};

class IommuDomain {
 public:
  IommuDomain() = default;
  IommuDomain(const IommuDomain&) = delete;
  IommuDomain& operator=(const IommuDomain&) = delete;

  // Maps `size` bytes of host memory at `host` to `iova`. iova, host and size
  // must be page-aligned, the range inside the host window, and not overlap an
  // existing mapping. Returns an empty string on success, else why not.
  // `host` is nullptr for a host on the far side of a cable: the window then
  // only records what the host allows (DmaAccess::permits).
  std::string map(std::uint64_t iova, void* host, std::uint64_t size, std::uint32_t access);
  // Removes the mapping that starts at `iova` with exactly `size` bytes and
  // waits for DMA that may use it. Returns an empty string or why not.
  std::string unmap(std::uint64_t iova, std::uint64_t size);
  // Removes every mapping (device reset).
  void unmap_all();

  std::size_t mapping_count() const;
  std::uint64_t mapped_bytes() const;

 private:
  friend class DmaContext;
  friend class DmaAccess;
  struct Window {
    std::uint64_t size;
    std::byte* host;
    std::uint32_t access;
  };
  void wait_for_grace_period(std::uint64_t new_generation);

  mutable std::mutex mu_;
  std::map<std::uint64_t, Window> windows_;  // by iova
  std::vector<DmaContext*> contexts_;
  std::uint64_t mapped_bytes_ = 0;
  std::atomic<std::uint64_t> generation_{1};
};

}  // namespace tpuhal::sim
