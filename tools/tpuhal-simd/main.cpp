// tpuhal-simd: the simulator daemon. Serves simulated boards to several
// processes over a Unix socket (docs/simd.md).
#include <signal.h>

#include <atomic>
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>

#include "server.h"

namespace {

std::atomic<tpuhal::simd::Server*> g_server{nullptr};

extern "C" void on_signal(int) {
  if (auto* s = g_server.load()) s->stop();
}

constexpr const char* kUsage =
    "Usage: tpuhal-simd --socket PATH [--board PROFILE]... [--vfs N] [--spin-us US]\n\n"
    "Serves simulated boards to other processes over the Unix socket PATH (created\n"
    "with mode 0600: only this user may connect). A process opens board N as the\n"
    "device simd:PATH#N; TPUHAL_SIMD=PATH[,PATH...] makes `tpuhal list` and\n"
    "enumerate() show them. Each process that opens a board gets a virtual function\n"
    "of it: its own registers, queues, IOMMU domain and a 1/vfs share of its\n"
    "DRAM, isolated from every other process. A process that exits or dies frees its VF.\n"
    "SIGTERM or SIGINT stops the daemon; its clients then see their devices lost.\n\n"
    "Options";

}  // namespace

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  tpuhal::simd::ServerOptions options;
  po::options_description desc(kUsage);
  desc.add_options()("help,h", "show this help")(
      "socket", po::value<std::string>(&options.socket_path)->required(), "the Unix socket to serve on")(
      "board", po::value<std::vector<std::string>>(&options.boards),
      "a board to serve: a built-in profile (bm1684x, tiny, edge-soc) or a profile .json; "
      "repeat for several (board N is the Nth; default: one bm1684x)")(
      "vfs", po::value<std::uint32_t>(&options.vfs)->default_value(4),
      "virtual functions per board: how many processes may use a board at once; each gets "
      "1/vfs of its DRAM, aperture and memory regions")(
      "spin-us", po::value<std::uint32_t>(&options.spin_us)->default_value(20),
      "how long a client's register channel is polled after its last access before the daemon "
      "sleeps on it (lower: less CPU, higher: lower latency); on hosts with fewer than 4 cores "
      "it sleeps at once after a register write");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpuhal-simd: %s\n(tpuhal-simd --help lists the options)\n", e.what());
    return 2;
  }
  try {
    tpuhal::simd::Server server(options);
    g_server.store(&server);
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);
    // Tests and scripts wait for this line: the socket accepts from now on.
    std::printf("tpuhal-simd: serving %zu board(s) on %s\n", options.boards.empty() ? std::size_t{1} : options.boards.size(),
                options.socket_path.c_str());
    std::fflush(stdout);
    server.run();
    g_server.store(nullptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpuhal-simd: %s\n", e.what());
    return 1;
  }
  return 0;
}
