#include "tpuhal/base/fd.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace tpuhal::base {

void UniqueFd::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

UniqueFd make_eventfd() {
  int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
  return UniqueFd(fd);
}

void eventfd_signal(int fd) noexcept {
  std::uint64_t one = 1;
  // A full counter (2^64-2) cannot happen with one signal per event; EAGAIN
  // would mean the reader is already due to wake, so it is safe to ignore.
  [[maybe_unused]] auto n = ::write(fd, &one, sizeof one);
}

std::uint64_t eventfd_drain(int fd) noexcept {
  std::uint64_t value = 0;
  if (::read(fd, &value, sizeof value) != sizeof value) return 0;
  return value;
}

}  // namespace tpuhal::base
