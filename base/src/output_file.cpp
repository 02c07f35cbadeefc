#include "tpuhal/base/output_file.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <utility>

namespace tpuhal::base {
namespace {

[[noreturn]] void fail(int err, const std::string& what) {
  throw std::system_error(err, std::generic_category(), what);
}

// 12 characters of [A-Za-z0-9] from the kernel's generator: 71 bits, not
// guessable from the pid or the time as mktemp()'s names partly are.
std::string random_suffix() {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char bytes[12];
  std::size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(errno, "getrandom");
    got += static_cast<std::size_t>(n);
  }
  std::string s;
  for (unsigned char b : bytes) s += kAlphabet[b % (sizeof kAlphabet - 1)];
  return s;
}

}  // namespace

OutputFile::OutputFile(std::string path, mode_t mode) : path_(std::move(path)) {
  if (path_.empty() || path_.back() == '/') fail(EISDIR, "cannot create " + (path_.empty() ? "''" : path_));
  const auto slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? std::string() : path_.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? path_ : path_.substr(slash + 1);
  // A dot name, so that readers of the directory that take *.json or
  // *.yaml (CDI runtimes) pass it by; an existing name is never reused.
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string temp = dir + "." + name + "." + random_suffix();
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0) {
      fd_ = fd;
      temp_ = std::move(temp);
      return;
    }
    if (errno != EEXIST) fail(errno, "cannot create " + path_);
  }
  fail(EEXIST, "cannot create " + path_);
}

OutputFile::~OutputFile() { discard(); }

OutputFile::OutputFile(OutputFile&& o) noexcept
    : path_(std::move(o.path_)),
      temp_(std::move(o.temp_)),
      fd_(std::exchange(o.fd_, -1)),
      placed_(std::exchange(o.placed_, true)) {}

OutputFile& OutputFile::operator=(OutputFile&& o) noexcept {
  if (this != &o) {
    discard();
    path_ = std::move(o.path_);
    temp_ = std::move(o.temp_);
    fd_ = std::exchange(o.fd_, -1);
    placed_ = std::exchange(o.placed_, true);
  }
  return *this;
}

void OutputFile::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!placed_ && !temp_.empty()) ::unlink(temp_.c_str());
  placed_ = true;
}

void OutputFile::write(std::string_view data) {
  if (fd_ < 0) fail(EBADF, "cannot write " + path_);
  while (!data.empty()) {
    const ssize_t n = ::write(fd_, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(errno, "cannot write " + path_);
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

void OutputFile::commit() {
  if (fd_ < 0) fail(EBADF, "cannot write " + path_);
  // On disk before it has the name: a crash leaves the old file or the
  // whole new one, never an empty one under the name.
  if (::fsync(fd_) != 0) {
    const int err = errno;
    discard();
    fail(err, "cannot write " + path_);
  }
  if (!placed_) {
    if (::rename(temp_.c_str(), path_.c_str()) != 0) {
      const int err = errno;
      discard();
      fail(err, "cannot replace " + path_);
    }
    placed_ = true;
    const auto slash = path_.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path_.substr(0, slash);
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);  // the new name on disk too; a directory that cannot be synced keeps it in memory
      ::close(dfd);
    }
  }
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0 && errno != EINTR) fail(errno, "cannot write " + path_);
}

void OutputFile::publish() {
  if (placed_) return;
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    discard();
    fail(err, "cannot create " + path_);
  }
  placed_ = true;
}

int OutputFile::release() noexcept {
  if (!placed_) return -1;
  return std::exchange(fd_, -1);
}

}  // namespace tpuhal::base
