// tpuhal stress: a soak test. Worker threads (and, with --processes, copies
// of this program) drive one device with random copies, fills, tensor ops,
// host and cross-queue waits, dropped fences, buffer frees and queue
// releases with work in flight. Every byte the device writes is checked
// against a host-side model, every submission must complete, and device
// memory must return to where it started.
//
// The command: its options, the run's banner and summary. The workload is in
// stress_ops.cpp, its checks in stress_check.cpp, one process's run in
// stress_run.cpp, several processes in stress_processes.cpp.
#include <chrono>
#include <cstdio>
#include <random>

#include "cli.h"
#include "stress.h"

namespace tpuhal::cli {

using stress::Clock;
using stress::Config;
using stress::Counts;
using stress::kKindName;
using stress::kKinds;
using stress::Outcome;

namespace {

nlohmann::json outcome_json(const Outcome& o) {
  auto j = o.counts.to_json();
  j["device"] = o.uri;
  j["board"] = o.board;
  j["seconds"] = o.seconds;
  j["queue_claims"] = o.queue_claims;
  j["queues_released_with_work_pending"] = o.releases;
  j["memory_ok"] = o.memory_ok;
  j["memory"] = o.memory;
  return j;
}

double rate(double n, double seconds) { return seconds > 0 ? n / seconds : 0; }

}  // namespace

int cmd_stress(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("device,d", po::value<std::string>()->default_value("sim:0"), "device URI")(
      "seconds", po::value<double>()->default_value(60), "how long to run (then every check still runs)")(
      "threads", po::value<unsigned>()->default_value(4), "worker threads per process")(
      "processes", po::value<unsigned>()->default_value(1), "processes, each with its own handle on the device")(
      "seed", po::value<std::uint64_t>(), "random seed (default: a new one, printed)")(
      "json", "print the summary as one JSON object");
  po::options_description hidden;
  hidden.add_options()("child", po::value<int>(), "");
  po::variables_map vm;
  int rc = 0;
  if (!parse(args, opts, hidden, {}, vm,
             "Usage: tpuhal stress [--device URI] [--seconds N] [--threads N] [--processes N] [--seed N] [--json]\n\n"
             "A soak test. Each worker thread draws random operations from a seeded generator until\n"
             "the time is up: fills, host->device and device->host copies (through pinned and\n"
             "host-visible staging buffers), device->device copies (overlapping ones included),\n"
             "add/mul/max/relu on small f32 tensors checked on the host, host waits on any queue's\n"
             "fence, device waits on another queue's fence (cross-queue), empty submissions whose\n"
             "fences are dropped, buffers freed while work on them is in flight, batches recorded and\n"
             "dropped unsubmitted, queues released with work pending, and queues taken out of the\n"
             "shared pool with work on them. The threads share a pool of the device's queues, so\n"
             "queues see submissions from several threads. Work that touches a buffer waits on the\n"
             "device for earlier work on it from other queues.\n\n"
             "Every byte the device writes is checked against a host-side model (by reading it back,\n"
             "or through the buffer's host mapping), at random during the run and for every buffer at\n"
             "the end; every submission must complete; after the run, device memory must be where it\n"
             "started. With --processes N, N copies of this program run the same workload, each with\n"
             "its own handle on the device and its own share of the seed, and report to this one.\n\n"
             "A problem is printed as it is found, with the seed, process, thread, operation and\n"
             "offset; the run then stops and the exit status is 1. Each run's time is bounded: waits\n"
             "end within the wait timeout (TPUHAL_TIMEOUT), and a run that still does not end is\n"
             "reported with where each thread is. The same --seed, --threads and --processes replay\n"
             "the same random choices; the timing, and so the interleaving, differs.",
             &rc))
    return rc;
  Config cfg;
  cfg.device = vm["device"].as<std::string>();
  cfg.seconds = vm["seconds"].as<double>();
  cfg.threads = vm["threads"].as<unsigned>();
  cfg.processes = vm["processes"].as<unsigned>();
  cfg.json = vm.count("json") != 0;
  if (vm.count("child")) cfg.child = vm["child"].as<int>();
  if (!(cfg.seconds > 0) || cfg.seconds > 7 * 24 * 3600) {
    std::fprintf(stderr, "tpuhal stress: --seconds must be above 0 (and at most a week), got %g\n", cfg.seconds);
    return 2;
  }
  if (cfg.threads < 1 || cfg.threads > 256 || cfg.processes < 1 || cfg.processes > 64) {
    std::fprintf(stderr, "tpuhal stress: --threads must be 1 to 256 and --processes 1 to 64 (got %u and %u)\n",
                 cfg.threads, cfg.processes);
    return 2;
  }
  cfg.seed = vm.count("seed") ? vm["seed"].as<std::uint64_t>()
                              : (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();

  if (cfg.child >= 0) {  // one process of a multi-process run: the summary goes to the parent
    const Outcome o = run_process(cfg, static_cast<unsigned>(cfg.child));
    std::printf("%s\n", outcome_json(o).dump().c_str());
    const auto& c = o.counts;
    return c.errors || c.failed || c.lost || !o.memory_ok ? 1 : 0;
  }

  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%g", cfg.seconds);
  std::fprintf(cfg.json ? stderr : stdout,
               "tpuhal stress: %s, %u thread(s) x %u process(es), %s s, seed %llu\n"
               "  replay: tpuhal stress --device %s --seconds %s --threads %u --processes %u --seed %llu\n",
               cfg.device.c_str(), cfg.threads, cfg.processes, seconds, static_cast<unsigned long long>(cfg.seed),
               cfg.device.c_str(), seconds, cfg.threads, cfg.processes, static_cast<unsigned long long>(cfg.seed));
  std::fflush(cfg.json ? stderr : stdout);

  std::vector<Outcome> outcomes;
  bool processes_ok = true;
  const auto start = Clock::now();
  if (cfg.processes == 1) {
    outcomes.push_back(run_process(cfg, 0));
  } else {
    processes_ok = run_children(cfg, outcomes);
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();

  Counts total;
  std::uint64_t claims = 0, releases = 0;
  bool memory_ok = true;
  for (auto& o : outcomes) {
    total.add(o.counts);
    claims += o.queue_claims;
    releases += o.releases;
    memory_ok = memory_ok && o.memory_ok;
  }
  if (!processes_ok) ++total.errors;
  const bool passed = processes_ok && memory_ok && !total.errors && !total.failed && !total.lost &&
                      outcomes.size() == cfg.processes && total.completed == total.submitted;
  const std::string uri = outcomes.empty() ? cfg.device : outcomes.front().uri;

  if (cfg.json) {
    auto j = total.to_json();
    j["device"] = uri;
    j["board"] = outcomes.empty() ? "" : outcomes.front().board;
    j["seed"] = cfg.seed;
    j["seconds"] = elapsed;
    j["threads"] = cfg.threads;
    j["processes"] = cfg.processes;
    j["queue_claims"] = claims;
    j["queues_released_with_work_pending"] = releases;
    j["memory_ok"] = memory_ok;
    j["passed"] = passed;
    auto per = nlohmann::json::array();
    for (auto& o : outcomes) per.push_back(outcome_json(o));
    j["per_process"] = per;
    std::printf("%s\n", j.dump(2).c_str());
    return passed ? 0 : 1;
  }

  std::printf("%s: %s\n", uri.c_str(), outcomes.empty() ? "" : outcomes.front().board.c_str());
  std::printf("  %-12s %12s %10s\n", "operation", "count", "per second");
  for (std::size_t i = 0; i < kKinds; ++i)
    std::printf("  %-12s %12llu %10.0f\n", kKindName[i], static_cast<unsigned long long>(total.ops[i]),
                rate(static_cast<double>(total.ops[i]), elapsed));
  std::printf("  skipped %llu (no queue free at that moment)\n", static_cast<unsigned long long>(total.skipped));
  std::printf("  bytes verified: %s (%s/s)\n", bytes(total.bytes_verified).c_str(),
              bytes(static_cast<std::uint64_t>(rate(static_cast<double>(total.bytes_verified), elapsed))).c_str());
  std::printf("  submissions: %llu; completed %llu, failed %llu, lost %llu\n",
              static_cast<unsigned long long>(total.submitted), static_cast<unsigned long long>(total.completed),
              static_cast<unsigned long long>(total.failed), static_cast<unsigned long long>(total.lost));
  std::printf("  queues: %llu claimed for the shared pool, %llu released with work pending\n",
              static_cast<unsigned long long>(claims), static_cast<unsigned long long>(releases));
  for (std::size_t i = 0; i < outcomes.size(); ++i)
    std::printf("  device memory%s: %s\n", cfg.processes > 1 ? (" (process " + std::to_string(i) + ")").c_str() : "",
                outcomes[i].memory.c_str());
  std::printf("%s: %llu operations in %.1f s (%.0f/s), %s verified, %llu/%llu completions, %llu errors (seed %llu)\n",
              passed ? "PASSED" : "FAILED", static_cast<unsigned long long>(total.operations()), elapsed,
              rate(static_cast<double>(total.operations()), elapsed), bytes(total.bytes_verified).c_str(),
              static_cast<unsigned long long>(total.completed), static_cast<unsigned long long>(total.submitted),
              static_cast<unsigned long long>(total.errors), static_cast<unsigned long long>(cfg.seed));
  return passed ? 0 : 1;
}

}  // namespace tpuhal::cli
