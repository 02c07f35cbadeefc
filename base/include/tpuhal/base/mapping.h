// RAII memory mappings: anonymous host memory for DMA buffers and memfd-backed
// regions for simulated device DRAM (shareable with another process later).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tpuhal/base/fd.h"

namespace tpuhal::base {

class Mapping {
 public:
  struct Options {
    bool populate = false;    // fault every page in now (MAP_POPULATE)
    bool lock = false;        // try mlock(); failure is reported by locked()
    bool noreserve = false;   // sparse: no swap reservation, pages on first touch
    bool huge_pages = false;  // ask for transparent huge pages (fewer faults, TLB misses)
  };

  Mapping() = default;
  ~Mapping();
  Mapping(Mapping&& other) noexcept;
  Mapping& operator=(Mapping&& other) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  // Private anonymous memory, page-aligned, zero-filled. Throws
  // std::system_error naming the size on failure.
  static Mapping anonymous(std::size_t bytes, Options options);
  // A shared mapping of a new memfd of `bytes` (sparse until touched, unless
  // options.populate). The file's size is sealed (F_SEAL_SHRINK, F_SEAL_GROW,
  // F_SEAL_SEAL), so another process it is passed to can map it without
  // fearing SIGBUS from a truncation.
  static Mapping memfd(const std::string& name, std::size_t bytes, Options options);
  static Mapping memfd(const std::string& name, std::size_t bytes);

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  bool locked() const noexcept { return locked_; }
  // The memfd behind a memfd() mapping, or -1.
  int fd() const noexcept { return fd_.get(); }
  explicit operator bool() const noexcept { return data_ != nullptr; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  bool locked_ = false;
  UniqueFd fd_;
};

std::size_t page_size() noexcept;
inline std::uint64_t align_up(std::uint64_t v, std::uint64_t a) noexcept { return (v + a - 1) / a * a; }

}  // namespace tpuhal::base
