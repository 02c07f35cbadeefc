// Output files that another user of the directory cannot redirect.
//
// A program that writes FILE where others may write too (/tmp, a shared
// scratch or spec directory) must never open a name someone else could
// have planted: with fs.protected_symlinks=0 (or protected_hardlinks=0) a
// symbolic or hard link at FILE, or at a predictable FILE.tmp, pointing at
// a victim's file makes the program overwrite that file with its own
// rights. OutputFile opens no existing name. It creates a new file beside
// FILE (same directory, so that rename() works) under an unpredictable
// name, with O_CREAT | O_EXCL | O_NOFOLLOW and the usual mode (0666 less
// the umask, as fopen() creates files), and rename()s it over FILE, which
// replaces whatever entry was there (a link is replaced, never followed).
//
// Two ways to put the file in place:
// - commit(): after everything is written. Readers see the old file or the
//   whole new one, never part of it (a CDI spec, a merged trace).
// - publish(): at once, then keep writing through fd(). For a file written
//   over a program's life that a crash must leave readable where the user
//   looks for it (TPUHAL_TRACE, tpuhal-simd --trace).
// Either way the file written is the one this process created.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

namespace tpuhal::base {

class OutputFile {
 public:
  // Creates the new file beside `path`. Throws std::system_error whose
  // what() reads "cannot create PATH: REASON" (the errno of the failure:
  // ENOENT for a missing directory, EACCES for one not writable, ...).
  explicit OutputFile(std::string path, mode_t mode = 0666);
  // Removes the new file if it was never put in place.
  ~OutputFile();
  OutputFile(OutputFile&& o) noexcept;
  OutputFile& operator=(OutputFile&& o) noexcept;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  const std::string& path() const noexcept { return path_; }
  // Where the file is until it is put in place ("DIR/.NAME.XXXXXXXXXXXX").
  const std::string& temp_path() const noexcept { return temp_; }
  int fd() const noexcept { return fd_; }

  // Writes all of `data`. Throws std::system_error ("cannot write PATH: ...").
  void write(std::string_view data);
  // Writes the file to disk (fsync), renames it over `path` and syncs the
  // directory, then closes it. Throws std::system_error ("cannot write
  // PATH: ..." or "cannot replace PATH: ...") and removes the new file.
  void commit();
  // Renames the file over `path` now; later writes through fd() land in
  // it. Throws std::system_error ("cannot create PATH: ...") and removes
  // the new file.
  void publish();
  // Hands over the descriptor (to fdopen() it, say); only after publish().
  int release() noexcept;

 private:
  void discard() noexcept;

  std::string path_, temp_;
  int fd_ = -1;
  bool placed_ = false;  // renamed over path_: nothing to remove
};

}  // namespace tpuhal::base
