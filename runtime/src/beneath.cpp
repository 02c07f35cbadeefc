#include "beneath.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include <cerrno>
#include <vector>

#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#endif

namespace tpuhal::rt::detail {
namespace {

constexpr int kFileFlags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;

int walk(int dir, const std::vector<std::filesystem::path>& parts) {
  UniqueFd held;  // the directory reached so far, once past `dir`
  int at = dir;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const char* name = parts[i].c_str();
    const bool last = i + 1 == parts.size();
    const int fd = ::openat(at, name, last ? kFileFlags : O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      // O_DIRECTORY | O_NOFOLLOW says ENOTDIR for a link to a directory.
      struct stat st;
      if (err == ENOTDIR && ::fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) err = ELOOP;
      return -err;
    }
    if (last) return fd;
    held = UniqueFd(fd);
    at = fd;
  }
  return -ENOENT;  // no component: not reached (callers pass a file name)
}

}  // namespace

int open_beneath(int dir, const std::filesystem::path& rel, Resolve how) {
  if (rel.empty()) return -ENOENT;
  if (rel.has_root_name() || rel.has_root_directory()) return -EXDEV;
  std::vector<std::filesystem::path> parts;
  for (const auto& part : rel) {
    if (part == "..") return -EXDEV;
    if (part.empty() || part == ".") continue;
    parts.push_back(part);
  }
  if (parts.empty()) return -ENOENT;
#if defined(SYS_openat2) && defined(RESOLVE_BENEATH)
  if (how == Resolve::Auto) {
    open_how h{};
    h.flags = static_cast<std::uint64_t>(kFileFlags);
    h.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    const long fd = ::syscall(SYS_openat2, dir, rel.c_str(), &h, sizeof h);
    if (fd >= 0) return static_cast<int>(fd);
    // Not there (an older kernel, or a seccomp filter that refuses what it
    // does not know): the walk does the same in steps.
    if (errno != ENOSYS && errno != EPERM && errno != EINVAL && errno != E2BIG) return -errno;
  }
#else
  (void)how;
#endif
  return walk(dir, parts);
}

}  // namespace tpuhal::rt::detail
