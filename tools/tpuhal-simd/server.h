// The simulator daemon: simulated boards served over a Unix socket
// (docs/simd.md). Each client that attaches to a board gets a virtual
// function of it: a sim::Board of its own built from the board's profile,
// with its share of the board's DRAM, its own registers, queues, IOMMU
// domain and interrupts.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "board_trace.h"
#include "tpuhal/base/fd.h"
#include "tpuhal/fw/telemetry.h"
#include "tpuhal/sim/profile.h"
#include "tpuhal/simd/protocol.h"

namespace tpuhal::simd {

// What one client, process or user may hold (docs/simd.md); 0: no limit.
// A request past a quota is refused with an error naming the quota, its
// value and the current use; nothing else changes for anyone. Everything
// is charged to the process and user that last sent on the connection, as
// the kernel reports them (SCM_CREDENTIALS), not to the one that happened
// to connect. Per-user defaults are a multiple of the per-process (or
// per-client) ones, so that no one process of a user locks out its others.
struct Quotas {
  static constexpr std::uint32_t kDefault = ~0u;  // resolved by the Server (below)
  std::uint32_t connections_per_process = 16;
  // At the quota, the user's oldest connection that holds no VF is closed
  // to admit the new one: idle connections count against their owner but
  // cannot keep its other processes out.
  std::uint32_t connections_per_user = 64;
  // kDefault: every VF of the daemon but one, so that no one process (and,
  // on a socket open to other users, no one user) holds them all.
  std::uint32_t vfs_per_process = kDefault;
  std::uint32_t vfs_per_user = kDefault;
  // Host memory mapped for DMA, per client (one connection's VF) and per
  // user: mappings, and bytes (0 for bytes: a quarter of this host's
  // physical memory per client, all of it per user).
  std::uint64_t mappings_per_client = 8192;
  std::uint64_t mappings_per_user = 32768;
  std::uint64_t mapped_bytes_per_client = 0;
  std::uint64_t mapped_bytes_per_user = 0;
  // Seconds a connection that has not attached may stay silent.
  std::uint32_t idle_seconds = 30;
  // Threads serving clients (one per connection, one per attached VF).
  std::uint32_t threads = 0;
  // Requests and new connections one process may make per second, over
  // all its connections, in bursts of up to a second's worth; past that
  // its requests wait (and its new connections are refused), so that a
  // process flooding the daemon takes a bounded share of its time.
  std::uint32_t requests_per_second = 2000;
};

// Every resource a client can make the daemon hold, and what bounds it:
// the options (or profile fields, or limits) that set its quotas.
// docs/simd.md's threat model lists the same names; `tpuhal-simd
// --resources` prints this table.
struct BoundedResource {
  const char* name;
  const char* bound;
};
std::span<const BoundedResource> bounded_resources() noexcept;

struct ServerOptions {
  std::string socket_path;
  std::vector<std::string> boards;  // profile names or paths
  std::uint32_t vfs = 4;            // VFs per board: each gets 1/vfs of its DRAM
  std::uint32_t spin_us = 20;       // how long a register channel spins before sleeping
  std::string group;                // the socket's group ("": the daemon's own)
  std::uint32_t mode = 0600;        // the socket's permission bits
  std::string trace_path;           // --trace: every client's commands as a Chrome trace ("": none)
  Quotas quotas;
  // A listening socket to serve instead of binding socket_path, as systemd's
  // socket activation hands one over (LISTEN_FDS); the Server owns it. Its
  // path and mode are read from it (socket_path, when set, must match);
  // group is not used.
  int listen_fd = -1;
};

// The profile of one VF of `board` when it is divided into `vfs`: DRAM,
// aperture and every memory region divided by `vfs` (in 64 KiB units).
// Throws sim::ProfileError when a share would be too small to use.
sim::BoardProfile vf_profile(const sim::BoardProfile& board, std::uint32_t vfs);

// A telemetry block (fw/telemetry.h) taken apart.
struct TelemetryBlock {
  fw::TelemetryHeader header{};
  std::vector<fw::TelemetryQueue> queues;
  std::vector<fw::TelemetryChannel> channels;
};

class Server {
 public:
  // Loads the profiles, creates the socket (options.mode, owner-only by
  // default; options.group). Throws std::runtime_error saying what failed.
  explicit Server(ServerOptions options);
  ~Server();

  // Serves until stop() (or a signal the caller turns into stop()).
  void run();
  // Serves one connection on the calling thread until its peer hangs up
  // (or stop()), as run() serves each connection it accepts, quotas and
  // all: for the fuzz target, which hands it one end of a socketpair.
  void serve_socket(base::UniqueFd sock);
  // Thread- and async-signal-safe.
  void stop() noexcept;
  // The socket served (an inherited one's path, read from it).
  const std::string& socket_path() const noexcept { return options_.socket_path; }

 private:
  struct BoardSlot;
  struct Client;
  void adopt_socket();          // options_.listen_fd
  void bind_socket(gid_t gid);  // options_.socket_path, mode and group
  void serve(Client& client);
  void handle(Client& client, Message& m);
  void attach(Client& client, const Message& m);
  void map_dma(Client& client, Message& m);
  void unmap_dma(Client& client, const Message& m);
  void detach(Client& client) noexcept;
  void reply_boards(Client& client);
  void reply_stats(Client& client, const Message& m);
  void reply_telemetry(Client& client, const Message& m);
  std::vector<std::byte> whole_board_telemetry(BoardSlot& slot, std::uint32_t board);
  void reap_finished();
  void accept_one();
  // Answers a connection the daemon will not serve with an error, then
  // keeps it open a while, draining what the client sends, so that the
  // client reads the answer (a socket closed with a request unread would
  // give the client ECONNRESET before it).
  void refuse(base::UniqueFd sock, ErrorStatus status, const std::string& message);
  void drain_refused();
  struct Refused {
    base::UniqueFd sock;
    std::chrono::steady_clock::time_point until;
  };
  std::vector<Refused> refused_;  // run()'s thread only
  // A thread of the daemon's, counted against Quotas::threads; throws
  // std::system_error when none can be started.
  std::thread start_thread(std::function<void()> fn);
  // Takes one of the process's requests (Quotas::requests_per_second): 0 at
  // once when it has one left, else how long until it has.
  std::chrono::nanoseconds take_request(std::int32_t pid);
  // Waits until the client's process may make a request; false when the
  // daemon stops meanwhile.
  bool throttle(const Client& client);
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point refilled{};  // the epoch: a new bucket is full
  };
  // What a process and a user hold; guarded by mu_.
  struct Usage {
    std::uint32_t connections = 0, vfs = 0;
    std::uint32_t evicted = 0;  // connections being closed to admit others (still in `connections`)
    std::uint64_t mappings = 0, mapped_bytes = 0;
  };
  // The user's oldest connection that holds no VF and is not already being
  // closed, or null; mu_ held.
  Client* idle_connection_of(std::uint32_t uid);
  // Charges the connection, and all it holds, to the process and user that
  // sent on it: "" or why they may not have it (the connection then
  // closes). Called by the client's thread.
  std::string rehome(Client& client, std::int32_t pid, std::uint32_t uid);

  ServerOptions options_;
  // Before the boards and clients: it outlives every VF that reports to it.
  std::unique_ptr<BoardTrace> trace_;
  std::uint64_t max_mappings_ = 0;  // the daemon's own, below vm.max_map_count
  base::UniqueFd listen_;
  base::UniqueFd stop_;
  base::UniqueFd spare_;  // closed to accept (and refuse) a connection when out of descriptors
  int fd_limit_ = 0;      // RLIMIT_NOFILE's soft limit when the daemon started
  std::vector<std::unique_ptr<BoardSlot>> boards_;
  std::mutex mu_;  // guards clients_, the VF slots of boards_ and the usage below
  std::list<std::unique_ptr<Client>> clients_;
  std::map<std::uint32_t, Usage> users_;     // by uid
  std::map<std::int32_t, Usage> processes_;  // by pid
  std::map<std::int32_t, Bucket> buckets_;   // by pid, while not full
  std::uint64_t mappings_ = 0;               // every client's
  std::atomic<std::uint32_t> threads_{0};
  std::atomic<std::uint64_t> protocol_errors_{0};
};

}  // namespace tpuhal::simd
