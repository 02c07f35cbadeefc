// tpuhal stress (cmd_stress.cpp): what its parts share. The operations a
// worker draws and their counts, the configuration of a run, and what one
// process's run (stress_run.cpp) or several processes (stress_processes.cpp)
// found.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tpuhal::cli::stress {

using Clock = std::chrono::steady_clock;

// ---- Operations ---------------------------------------------------------------

enum class Kind : std::uint8_t {
  Fill,       // fill a range of a buffer with a 1-, 2- or 4-byte pattern
  Upload,     // host bytes -> a buffer, through a pinned or host-visible staging buffer
  Download,   // a buffer -> staging, wait, compare with the model
  Copy,       // buffer -> buffer on the device (the same buffer: overlapping, memmove)
  Tensor,     // add, mul, max or relu on small f32 tensors, checked on the host
  HostWait,   // wait on the host for the last fence of any queue
  CrossWait,  // queue A waits on the device for queue B's fence; A done implies B done
  Drop,       // an empty submission whose fence is dropped at once
  Free,       // free a buffer with work on it in flight, allocate a new one (and fill it)
  Abandon,    // record a batch and destroy it unsubmitted
  Release,    // claim a queue, submit, release it with the work pending
  Recycle,    // take a queue out of the shared pool with work on it; a new one is claimed
  Map,        // check (or write) a mappable buffer through its host mapping
  kCount,
};
constexpr std::size_t kKinds = static_cast<std::size_t>(Kind::kCount);
constexpr std::array<const char*, kKinds> kKindName = {"fill",      "upload",     "download", "copy", "tensor-op",
                                                       "host-wait", "cross-wait", "drop",     "free", "abandon",
                                                       "release",   "recycle",    "map"};
// Relative frequencies.
constexpr std::array<unsigned, kKinds> kWeight = {10, 10, 10, 14, 6, 5, 6, 6, 5, 3, 2, 2, 6};

inline const char* name_of(Kind k) { return kKindName[static_cast<std::size_t>(k)]; }

struct Counts {
  std::array<std::uint64_t, kKinds> ops{};
  std::uint64_t bytes_verified = 0;
  std::uint64_t submitted = 0;  // submissions made
  std::uint64_t completed = 0;  // seen complete
  std::uint64_t failed = 0;     // completed with an error
  std::uint64_t lost = 0;       // neither, when the run ended
  std::uint64_t errors = 0;     // problems reported
  std::uint64_t skipped = 0;    // operations not possible at that moment (no free queue)

  void add(const Counts& o) {
    for (std::size_t i = 0; i < kKinds; ++i) ops[i] += o.ops[i];
    bytes_verified += o.bytes_verified;
    submitted += o.submitted;
    completed += o.completed;
    failed += o.failed;
    lost += o.lost;
    errors += o.errors;
    skipped += o.skipped;
  }
  std::uint64_t operations() const {
    std::uint64_t n = 0;
    for (auto v : ops) n += v;
    return n;
  }
  nlohmann::json to_json() const {
    nlohmann::json by_kind = nlohmann::json::object();
    for (std::size_t i = 0; i < kKinds; ++i) by_kind[kKindName[i]] = ops[i];
    return {{"operations", by_kind},  {"bytes_verified", bytes_verified},
            {"submitted", submitted}, {"completed", completed},
            {"failed", failed},       {"lost", lost},
            {"errors", errors},       {"skipped", skipped}};
  }
  static Counts from_json(const nlohmann::json& j) {
    Counts c;
    for (std::size_t i = 0; i < kKinds; ++i) c.ops[i] = j.at("operations").value(kKindName[i], 0ull);
    c.bytes_verified = j.at("bytes_verified");
    c.submitted = j.at("submitted");
    c.completed = j.at("completed");
    c.failed = j.at("failed");
    c.lost = j.at("lost");
    c.errors = j.at("errors");
    c.skipped = j.at("skipped");
    return c;
  }
};

// ---- A run ---------------------------------------------------------------------

struct Config {
  std::string device;
  double seconds = 60;
  unsigned threads = 4;
  unsigned processes = 1;
  std::uint64_t seed = 0;
  bool json = false;
  int child = -1;  // >= 0: this is process `child` of a multi-process run
};

struct Outcome {
  Counts counts;
  std::string uri, board;
  double seconds = 0;
  std::uint64_t queue_claims = 0, releases = 0;
  bool memory_ok = true;
  std::string memory;  // what the memory check found
};

// One process's share: opens the device, runs the workers until the
// deadline, checks their completions and the device's memory.
Outcome run_process(const Config& cfg, unsigned process);  // stress_run.cpp

// Runs the processes, collects their summaries. Returns false on a problem
// with a process itself (it died, hung or printed no summary).
bool run_children(const Config& cfg, std::vector<Outcome>& outcomes);  // stress_processes.cpp

}  // namespace tpuhal::cli::stress
