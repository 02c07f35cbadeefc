// Files a model names (ONNX external data) opened inside the model's
// directory and nowhere else: no absolute path, no "..", and no symbolic
// link in any component. A directory prepared by someone else may hold a
// link to a file only the user compiling it can read; following it would
// copy that file into the compiled model. Links are refused even where they
// point inside the directory: the rule is simplest to state and to check,
// and exporters never write them.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <utility>

namespace tpuhal::rt::detail {

// An open file descriptor, closed by its owner. (The runtime is built on
// the public API alone, so not base::UniqueFd.)
class UniqueFd {
 public:
  UniqueFd() noexcept = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
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
  ~UniqueFd() { reset(); }
  int get() const noexcept { return fd_; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// How open_beneath resolves a path.
enum class Resolve : std::uint8_t {
  Auto,  // openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) where the kernel
         // has it (Linux 5.6 on; not every container lets it through), else Walk
  Walk,  // each component in turn, opened from the directory before it
         // with O_NOFOLLOW (directories O_PATH | O_DIRECTORY)
};

// Opens `rel` for reading, relative to the directory open at `dir`, without
// following a symbolic link in any component and without leaving `dir`.
// O_NONBLOCK, so that a FIFO does not block: the caller checks the type
// (fstat). Returns the descriptor, or -errno: ELOOP where a component is a
// symbolic link, EXDEV for an absolute path or a ".." component, ENOENT,
// ENOTDIR, EACCES and the like from the open.
int open_beneath(int dir, const std::filesystem::path& rel, Resolve how = Resolve::Auto);

}  // namespace tpuhal::rt::detail
