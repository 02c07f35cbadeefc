// tpuhal-simd --trace FILE: one board-side trace of every client's
// commands (docs/tracing.md, docs/simd.md). Each command a VF's queue runs
// becomes a slice on the board's clock, moved onto the host's
// CLOCK_MONOTONIC (the clock of the clients' own traces), under a process
// named for the client's pid: the daemon's trace and a client's merge into
// one view.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <list>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tpuhal/sim/board.h"

namespace tpuhal::simd {

class BoardTrace {
 public:
  // Creates `path` as a new file (base::OutputFile: whatever was at the
  // name, a link included, is replaced, never written through); throws
  // std::runtime_error naming it and the reason.
  explicit BoardTrace(std::string path);
  ~BoardTrace();
  BoardTrace(const BoardTrace&) = delete;
  BoardTrace& operator=(const BoardTrace&) = delete;

  // An observer for one client's VF, kept until the trace ends (a command
  // processor may still be calling it while the VF goes away).
  sim::CommandObserver* observe(pid_t pid, std::uint32_t board, std::uint32_t vf, const sim::BoardProfile& profile);
  // Writes what is left and the file's end; later commands are dropped.
  // Idempotent; the destructor calls it.
  void finish();

  // Records held before the writer takes them; more are dropped, counted.
  static constexpr std::size_t kPendingLimit = 1 << 20;

 private:
  struct Observer;
  struct Record {
    sim::CommandRecord cmd;
    const Observer* from;
  };
  void push(const Observer& from, const sim::CommandRecord& r) noexcept;
  void run();
  void write_pending(std::vector<Record>& batch);

  std::string path_;
  std::FILE* file_ = nullptr;
  std::mutex mu_;  // pending_, dropped_, stopping_, observers_
  std::condition_variable wake_;
  std::vector<Record> pending_;
  std::uint64_t dropped_ = 0;
  bool stopping_ = false;
  bool finished_ = false;
  std::list<Observer> observers_;
  std::thread writer_;
  // The writer's.
  std::string out_;
  bool first_ = true;
  std::uint64_t events_ = 0;
  std::set<std::int64_t> named_pids_;
  std::set<std::pair<std::int64_t, std::uint32_t>> named_tracks_;
};

}  // namespace tpuhal::simd
