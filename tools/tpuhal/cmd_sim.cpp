// tpuhal sim serve: runs the simulator daemon, tpuhal-simd, installed beside
// this program (docs/simd.md).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "cli.h"

namespace tpuhal::cli {

int cmd_sim(const std::vector<std::string>& args) {
  if (args.empty() || args[0] != "serve") {
    const bool help = !args.empty() && (args[0] == "--help" || args[0] == "-h");
    std::fprintf(help ? stdout : stderr,
                 "Usage: tpuhal sim serve --socket PATH [--board PROFILE]... [--vfs N] [--spin-us US]\n"
                 "                        [--group NAME] [--mode OCTAL] [quota options]\n\n"
                 "serve   run the simulator daemon (tpuhal-simd): simulated boards served to other\n"
                 "        processes as simd:PATH#N devices; `tpuhal sim serve --help` lists its options\n");
    return help ? 0 : 2;
  }
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::filesystem::path daemon = (ec ? std::filesystem::path() : self.parent_path()) / "tpuhal-simd";
  std::vector<std::string> argv = {daemon.string()};
  argv.insert(argv.end(), args.begin() + 1, args.end());
  std::vector<char*> c_argv;
  for (auto& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  ::execv(c_argv[0], c_argv.data());
  std::fprintf(stderr, "tpuhal sim serve: cannot run %s: %s (it is installed beside tpuhal)\n", c_argv[0],
               std::strerror(errno));
  return 1;
}

}  // namespace tpuhal::cli
