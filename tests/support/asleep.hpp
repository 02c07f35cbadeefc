// Waiting for another thread to be blocked, for tests whose point is what
// a blocked waiter does: a busy machine may run the waiter late, after the
// event it was to wait for.
#pragma once

#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

namespace tpuhal::test {

// The calling thread's id, for asleep().
inline pid_t this_thread_id() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

// Whether thread `tid` of this process is asleep ('S' in its stat).
inline bool asleep(pid_t tid) {
  std::ifstream stat("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'S';
}

// Waits until thread `tid` sleeps (at most `limit`).
inline void until_asleep(pid_t tid, std::chrono::seconds limit = std::chrono::seconds(10)) {
  for (const auto until = std::chrono::steady_clock::now() + limit;
       !asleep(tid) && std::chrono::steady_clock::now() < until;)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace tpuhal::test
