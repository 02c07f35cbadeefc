// A file name in gtest's temporary directory that is this process's own,
// removed when the process exits. CI runs the same test at once in its
// sanitizer and ThreadSanitizer trees: under a fixed name both would write
// one file, and each could read the other's half-written trace.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>
#include <set>
#include <string>

namespace tpuhal::test {

inline std::string temp_path(const std::string& name) {
  struct Made {
    std::mutex mu;
    std::set<std::string> paths;
    ~Made() {
      for (const auto& p : paths) std::remove(p.c_str());
    }
  };
  static Made made;
  std::string path = ::testing::TempDir() + "tpuhal_" + std::to_string(::getpid()) + "_" + name;
  std::lock_guard lock(made.mu);
  made.paths.insert(path);
  return path;
}

}  // namespace tpuhal::test
