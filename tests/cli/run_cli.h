// Runs the tpuhal CLI (TPUHAL_CLI, the built binary) for the CLI tests.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace tpuhal::test {

struct Output {
  int code = -1;
  std::string out;  // stdout and stderr
};

// `tpuhal ARGS` with `env` (VAR=value ...) before it and the library's log
// quiet; returns its exit status and everything it printed.
inline Output run(const std::string& args, const std::string& env = "") {
  const std::string cmd = env + " TPUHAL_LOG=error " + TPUHAL_CLI + " " + args + " 2>&1";
  Output r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace tpuhal::test
