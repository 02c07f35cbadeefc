// tpuhal-simd: the simulator daemon. Serves simulated boards to several
// processes over a Unix socket (docs/simd.md).
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <boost/program_options.hpp>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>

#include "server.h"
#include "tpuhal/simd/protocol.h"

namespace {

std::atomic<tpuhal::simd::Server*> g_server{nullptr};

extern "C" void on_signal(int) {
  if (auto* s = g_server.load()) s->stop();
}

constexpr const char* kUsage =
    "Usage: tpuhal-simd --socket PATH [--board PROFILE]... [--vfs N] [--spin-us US]\n"
    "                   [--group NAME] [--mode OCTAL] [--trace FILE] [quota options]\n\n"
    "Serves simulated boards to other processes over the Unix socket PATH (created\n"
    "with mode 0600: only this user may connect; --group and --mode open it to\n"
    "others, each user then held to the per-user quotas). A process opens board N as the\n"
    "device simd:PATH#N; TPUHAL_SIMD=PATH[,PATH...] makes `tpuhal list` and\n"
    "enumerate() show them. Each process that opens a board gets a virtual function\n"
    "of it: its own registers, queues, IOMMU domain and a 1/vfs share of its\n"
    "DRAM, isolated from every other process. A process that exits or dies frees its VF.\n"
    "SIGTERM or SIGINT stops the daemon; its clients then see their devices lost.\n"
    "A request past a quota is refused with an error naming the quota and the use;\n"
    "nothing else changes for anyone (docs/simd.md: quotas and the threat model).\n"
    "Quotas are charged to the process and user that send on a connection, as the\n"
    "kernel reports them, wherever the connection was opened.\n\n"
    "Started by systemd's socket activation (a socket unit with\n"
    "ListenSequentialPacket=PATH; LISTEN_FDS=1), it serves the socket it is handed\n"
    "and leaves it in place when it stops: the unit's SocketMode= and SocketGroup=\n"
    "say who may connect, and --socket, --group and --mode are not needed\n"
    "(docs/packages.md).\n\n"
    "Options";

// The listening socket systemd's socket activation passed (sd_listen_fds(3):
// LISTEN_PID is this process, LISTEN_FDS the count, from descriptor 3), or
// -1. The variables are removed so that no child takes them for its own.
int inherited_socket() {
  const char* pid = std::getenv("LISTEN_PID");
  const char* fds = std::getenv("LISTEN_FDS");
  if (!pid || !fds) return -1;
  const bool ours = std::strtol(pid, nullptr, 10) == static_cast<long>(::getpid());
  const long count = std::strtol(fds, nullptr, 10);
  ::unsetenv("LISTEN_PID");
  ::unsetenv("LISTEN_FDS");
  ::unsetenv("LISTEN_FDNAMES");
  if (!ours) return -1;
  if (count != 1)
    throw std::invalid_argument("systemd passed " + std::to_string(count) +
                                " sockets (LISTEN_FDS); the daemon serves exactly one");
  return 3;  // SD_LISTEN_FDS_START
}

}  // namespace

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  tpuhal::simd::ServerOptions options;
  tpuhal::simd::Quotas& q = options.quotas;
  po::options_description desc(kUsage);
  desc.add_options()("help,h", "show this help")("version", "print the daemon's version and protocol, then exit")(
      "resources", "list every resource a client can make the daemon hold, and what bounds it, then exit")(
      "socket", po::value<std::string>(&options.socket_path),
      "the Unix socket to serve on (not needed when systemd hands the daemon its socket)")(
      "board", po::value<std::vector<std::string>>(&options.boards),
      "a board to serve: a built-in profile (bm1684x, tiny, edge-soc) or a profile .json; "
      "repeat for several (board N is the Nth; default: one bm1684x)")(
      "vfs", po::value<std::uint32_t>(&options.vfs)->default_value(4),
      "virtual functions per board: how many processes may use a board at once; each gets "
      "1/vfs of its DRAM, aperture and memory regions")(
      "spin-us", po::value<std::uint32_t>(&options.spin_us)->default_value(20),
      "how long a client's register channel is polled after its last access before the daemon "
      "sleeps on it (lower: less CPU, higher: lower latency); on hosts with fewer than 4 cores "
      "it sleeps at once after a register write")(
      "group", po::value<std::string>(&options.group),
      "give the socket to this group (with --mode 0660: its members may connect)")(
      "mode", po::value<std::string>()->default_value("0600"),
      "the socket's permission bits, in octal (0600, 0660, 0666)")(
      "trace", po::value<std::string>(&options.trace_path),
      "write every client's commands, as the boards run them, to this file: a Chrome trace "
      "with a process per client pid and a track per queue of each VF (docs/tracing.md)")(
      "max-connections-per-process", po::value<std::uint32_t>(&q.connections_per_process)->default_value(16),
      "connections one process may hold (0: no limit)")(
      "max-connections-per-user", po::value<std::uint32_t>(&q.connections_per_user)->default_value(64),
      "connections one user may hold (0: no limit); at the quota, the user's oldest connection that holds "
      "no VF makes way for a new one")(
      "max-vfs-per-process", po::value<std::uint32_t>(&q.vfs_per_process),
      "VFs (and so device memory and queues) one process may hold at once, over all boards (default: every "
      "VF of the daemon but one; 0: no limit)")(
      "max-vfs-per-user", po::value<std::uint32_t>(&q.vfs_per_user),
      "VFs one user may hold at once (default: every VF but one where --mode lets other users in, else no "
      "limit; 0: no limit)")("max-mappings-per-client",
                             po::value<std::uint64_t>(&q.mappings_per_client)->default_value(8192),
                             "host memory mappings for DMA one client (an open device) may hold (0: no limit)")(
      "max-mappings-per-user", po::value<std::uint64_t>(&q.mappings_per_user)->default_value(32768),
      "host memory mappings for DMA one user may hold (0: no limit)")(
      "max-mapped-bytes-per-client", po::value<std::uint64_t>(&q.mapped_bytes_per_client)->default_value(0),
      "bytes of host memory one client may map for DMA (0: a quarter of this host's physical memory)")(
      "max-mapped-bytes-per-user", po::value<std::uint64_t>(&q.mapped_bytes_per_user)->default_value(0),
      "bytes of host memory one user may map for DMA (0: this host's physical memory)")(
      "idle-seconds", po::value<std::uint32_t>(&q.idle_seconds)->default_value(30),
      "close a connection that holds no VF after this many seconds without a request (0: never)")(
      "max-threads", po::value<std::uint32_t>(&q.threads)->default_value(0),
      "threads serving clients, one per connection and one per open device (0: as many as the system gives)")(
      "max-requests-per-second", po::value<std::uint32_t>(&q.requests_per_second)->default_value(2000),
      "requests and new connections one process may make per second, in bursts of up to a second's worth; "
      "past that its requests wait and its new connections are refused (0: no limit)");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    if (vm.count("version")) {
      std::printf("tpuhal-simd %s, simulator daemon protocol %u\n", TPUHAL_VERSION_STRING,
                  static_cast<unsigned>(tpuhal::simd::kVersion));
      return 0;
    }
    if (vm.count("resources")) {
      for (const auto& r : tpuhal::simd::bounded_resources()) std::printf("%-18s %s\n", r.name, r.bound);
      return 0;
    }
    po::notify(vm);
    options.listen_fd = inherited_socket();
    if (options.listen_fd < 0 && options.socket_path.empty())
      throw std::invalid_argument("--socket PATH is required (unless systemd hands the daemon its socket)");
    const std::string mode = vm["mode"].as<std::string>();
    char* end = nullptr;
    const unsigned long bits = std::strtoul(mode.c_str(), &end, 8);
    if (mode.empty() || *end || bits > 0777)
      throw std::invalid_argument("--mode " + mode + " is not a permission mode in octal (0600, 0660, 0666)");
    options.mode = static_cast<std::uint32_t>(bits);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpuhal-simd: %s\n(tpuhal-simd --help lists the options)\n", e.what());
    return 2;
  }
  // Not dumpable: no other process of this user may ptrace the daemon or
  // open its /proc/PID/fd entries, which name every client's memory.
  if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
    std::perror("tpuhal-simd: prctl(PR_SET_DUMPABLE)");
    return 1;
  }
  // Each connection is a descriptor, each attach several: take every one
  // the hard limit allows (the daemon polls, it never select()s).
  if (rlimit nofile{}; ::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &nofile);
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
    std::printf("tpuhal-simd: serving %zu board(s) on %s\n",
                options.boards.empty() ? std::size_t{1} : options.boards.size(), server.socket_path().c_str());
    std::fflush(stdout);
    server.run();
    g_server.store(nullptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpuhal-simd: %s\n", e.what());
    return 1;
  }
  return 0;
}
