// tpuhal stress --processes N: N copies of this program, each started with
// the hidden --child flag, run the same workload on their own handles of the
// device and print their summaries (one JSON object) to this one.
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "stress.h"
#include "tpuhal/tpuhal.hpp"

extern char** environ;

namespace tpuhal::cli::stress {
namespace {

struct Child {
  pid_t pid = -1;
  int fd = -1;
  std::string output;
  int status = 0;
  bool exited = false;
};

// Starts process `index`: this program again, with the hidden --child flag,
// its standard output (one JSON object) into a pipe.
Child spawn_child(const Config& cfg, unsigned index) {
  int fds[2];
  if (::pipe(fds) != 0) throw Error(Status::Internal, std::string("stress: pipe: ") + std::strerror(errno));
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%g", cfg.seconds);
  std::vector<std::string> args = {"tpuhal",      "stress",
                                   "--device",    cfg.device,
                                   "--seconds",   seconds,
                                   "--threads",   std::to_string(cfg.threads),
                                   "--seed",      std::to_string(cfg.seed),
                                   "--processes", std::to_string(cfg.processes),
                                   "--child",     std::to_string(index)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addclose(&fa, fds[1]);
  Child c;
  const int rc = posix_spawn(&c.pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    throw Error(Status::Internal,
                std::string("stress: starting process ") + std::to_string(index) + ": " + std::strerror(rc));
  }
  c.fd = fds[0];
  return c;
}

}  // namespace

bool run_children(const Config& cfg, std::vector<Outcome>& outcomes) {
  std::vector<Child> children;
  for (unsigned i = 0; i < cfg.processes; ++i) children.push_back(spawn_child(cfg, i));
  // Each process bounds its own run; this bounds a process that does not.
  const auto limit =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(cfg.seconds + 600));
  bool ok = true;
  for (;;) {
    std::vector<pollfd> fds;
    for (auto& c : children)
      if (c.fd >= 0) fds.push_back({c.fd, POLLIN, 0});
    if (fds.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(limit - Clock::now()).count();
    if (left <= 0) break;
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(left, 1000))) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (auto& c : children) {
      const auto ready = std::find_if(fds.begin(), fds.end(), [&](const pollfd& p) { return p.fd == c.fd; });
      if (c.fd < 0 || ready == fds.end() || !ready->revents) continue;
      char buf[4096];
      const ssize_t n = ::read(c.fd, buf, sizeof buf);
      if (n > 0) {
        c.output.append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(c.fd);
        c.fd = -1;
      }
    }
  }
  for (std::size_t i = 0; i < children.size(); ++i) {
    auto& c = children[i];
    if (c.fd >= 0) {
      std::fprintf(stderr, "tpuhal stress: ERROR process %zu did not finish in time (seed %llu); stopping it\n", i,
                   static_cast<unsigned long long>(cfg.seed));
      ::kill(c.pid, SIGKILL);
      ::close(c.fd);
      ok = false;
    }
    ::waitpid(c.pid, &c.status, 0);
    const bool clean = WIFEXITED(c.status) && (WEXITSTATUS(c.status) == 0 || WEXITSTATUS(c.status) == 1);
    auto j = nlohmann::json::parse(c.output, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      std::fprintf(stderr, "tpuhal stress: ERROR process %zu %s without a summary (seed %llu)\n", i,
                   WIFSIGNALED(c.status) ? ("was killed by signal " + std::to_string(WTERMSIG(c.status))).c_str()
                                         : ("exited with status " + std::to_string(WEXITSTATUS(c.status))).c_str(),
                   static_cast<unsigned long long>(cfg.seed));
      ok = false;
      continue;
    }
    if (!clean) ok = false;
    Outcome o;
    o.counts = Counts::from_json(j);
    o.uri = j.value("device", "");
    o.board = j.value("board", "");
    o.seconds = j.value("seconds", 0.0);
    o.queue_claims = j.value("queue_claims", 0ull);
    o.releases = j.value("queues_released_with_work_pending", 0ull);
    o.memory_ok = j.value("memory_ok", false);
    o.memory = j.value("memory", "");
    outcomes.push_back(o);
  }
  return ok;
}
}  // namespace tpuhal::cli::stress
