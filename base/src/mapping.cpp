#include "tpuhal/base/mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <system_error>
#include <utility>

#include "tpuhal/base/units.h"

namespace tpuhal::base {

std::size_t page_size() noexcept {
  static const std::size_t size = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

Mapping::~Mapping() {
  if (data_) {
    if (locked_) ::munlock(data_, size_);
    ::munmap(data_, size_);
  }
}

Mapping::Mapping(Mapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      locked_(std::exchange(other.locked_, false)),
      fd_(std::move(other.fd_)) {}

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    Mapping old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    locked_ = std::exchange(other.locked_, false);
    fd_ = std::move(other.fd_);
  }
  return *this;
}

Mapping Mapping::anonymous(std::size_t bytes, Options options) {
  const std::size_t size = align_up(bytes == 0 ? 1 : bytes, page_size());
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
  if (options.noreserve) flags |= MAP_NORESERVE;
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED)
    throw std::system_error(errno, std::generic_category(), "mmap of " + format_bytes(size) + " of host memory");
  Mapping m;
  m.data_ = static_cast<std::byte*>(p);
  m.size_ = size;
  // Advice first, so that populating faults huge pages where it can. Both
  // are best effort: the memory works either way.
  if (options.huge_pages) ::madvise(p, size, MADV_HUGEPAGE);
  if (options.populate && ::madvise(p, size, MADV_POPULATE_WRITE) != 0) {
    const int err = errno;
    if (err != EINVAL) {
      // Not enough memory (or a signal): fail here, cleanly, rather than
      // later at a random first touch.
      throw std::system_error(err, std::generic_category(), "populating " + format_bytes(size) + " of host memory");
    }
    // Kernels before 5.14 lack MADV_POPULATE_WRITE: touch every page.
    const std::size_t page = page_size();
    for (std::size_t off = 0; off < size; off += page) static_cast<volatile std::byte*>(p)[off] = std::byte{0};
  }
  if (options.lock) m.locked_ = ::mlock(p, size) == 0;
  return m;
}

Mapping Mapping::memfd(const std::string& name, std::size_t bytes, Options options) {
  const std::size_t size = align_up(bytes == 0 ? 1 : bytes, page_size());
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) throw std::system_error(errno, std::generic_category(), "memfd_create " + name);
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0)
    throw std::system_error(errno, std::generic_category(), "sizing memfd " + name + " to " + format_bytes(size));
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    throw std::system_error(errno, std::generic_category(), "sealing memfd " + name);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd.get(), 0);
  if (p == MAP_FAILED)
    throw std::system_error(errno, std::generic_category(), "mmap of memfd " + name + " (" + format_bytes(size) + ")");
  Mapping m;
  m.data_ = static_cast<std::byte*>(p);
  m.size_ = size;
  m.fd_ = std::move(fd);
  if (options.huge_pages) ::madvise(p, size, MADV_HUGEPAGE);
  if (options.populate && ::madvise(p, size, MADV_POPULATE_WRITE) != 0) {
    const int err = errno;
    if (err != EINVAL)
      throw std::system_error(err, std::generic_category(), "populating " + format_bytes(size) + " of memfd " + name);
    const std::size_t page = page_size();
    for (std::size_t off = 0; off < size; off += page) static_cast<volatile std::byte*>(p)[off] = std::byte{0};
  }
  if (options.lock) m.locked_ = ::mlock(p, size) == 0;
  return m;
}

Mapping Mapping::memfd(const std::string& name, std::size_t bytes) { return memfd(name, bytes, Options{}); }

}  // namespace tpuhal::base
