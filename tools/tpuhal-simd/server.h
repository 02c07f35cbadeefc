// The simulator daemon: simulated boards served over a Unix socket
// (docs/simd.md). Each client that attaches to a board gets a virtual
// function of it: a sim::Board of its own built from the board's profile,
// with its share of the board's DRAM, its own registers, queues, IOMMU
// domain and interrupts.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tpuhal/base/fd.h"
#include "tpuhal/sim/profile.h"
#include "tpuhal/simd/protocol.h"

namespace tpuhal::simd {

struct ServerOptions {
  std::string socket_path;
  std::vector<std::string> boards;  // profile names or paths
  std::uint32_t vfs = 4;            // VFs per board: each gets 1/vfs of its DRAM
  std::uint32_t spin_us = 20;       // how long a register channel spins before sleeping
};

// The profile of one VF of `board` when it is divided into `vfs`: DRAM,
// aperture and every memory region divided by `vfs` (in 64 KiB units).
// Throws sim::ProfileError when a share would be too small to use.
sim::BoardProfile vf_profile(const sim::BoardProfile& board, std::uint32_t vfs);

class Server {
 public:
  // Loads the profiles, creates the socket (mode 0600). Throws
  // std::runtime_error saying what failed.
  explicit Server(ServerOptions options);
  ~Server();

  // Serves until stop() (or a signal the caller turns into stop()).
  void run();
  // Thread- and async-signal-safe.
  void stop() noexcept;

 private:
  struct BoardSlot;
  struct Client;
  void serve(Client& client);
  void handle(Client& client, Message& m);
  void attach(Client& client, const Message& m);
  void map_dma(Client& client, Message& m);
  void unmap_dma(Client& client, const Message& m);
  void detach(Client& client) noexcept;
  void reply_boards(Client& client);
  void reply_stats(Client& client);
  void reap_finished();

  ServerOptions options_;
  base::UniqueFd listen_;
  base::UniqueFd stop_;
  std::vector<std::unique_ptr<BoardSlot>> boards_;
  std::mutex mu_;  // guards clients_ and the VF slots of boards_
  std::list<std::unique_ptr<Client>> clients_;
  std::atomic<std::uint64_t> protocol_errors_{0};
};

}  // namespace tpuhal::simd
