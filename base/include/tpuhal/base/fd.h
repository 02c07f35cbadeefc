// File descriptors: an owning wrapper and eventfd helpers.
#pragma once

#include <cstdint>
#include <utility>

namespace tpuhal::base {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }
  void reset(int fd = -1) noexcept;
  explicit operator bool() const noexcept { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// A non-blocking, close-on-exec eventfd. Throws std::system_error on failure.
UniqueFd make_eventfd();
// Adds 1 to the eventfd's counter (wakes pollers).
void eventfd_signal(int fd) noexcept;
// Reads and clears the counter; returns it (0 if it was clear).
std::uint64_t eventfd_drain(int fd) noexcept;

}  // namespace tpuhal::base
