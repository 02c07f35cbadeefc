// Watching a board without opening it, as nvidia-smi and DCGM watch a GPU
// that other processes use (docs/telemetry.md, docs/operations.md).
//
// Opening a board makes this process one of its users: a board shared
// through the simulator daemon (simd:) gives each opener a VF of its own,
// which would show the monitor its own idle VF and take a share from the
// workloads. observe() asks whoever shares the board instead (the daemon)
// for the whole board's telemetry and the processes using it, and takes
// nothing: no VF, no queue, no memory.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tpuhal/export.hpp"
#include "tpuhal/types.hpp"

namespace tpuhal {

// Device memory a process holds in one heap (memory region) of the board.
struct HeapUsage {
  std::string heap;
  std::uint64_t bytes = 0;
};

// One process using a board. The counters are its own share's (a daemon
// VF's), counted since it attached.
struct ProcessUsage {
  std::int32_t pid = 0;
  std::uint32_t uid = 0;
  std::string name;                // its command name (/proc/PID/comm)
  std::uint32_t vf = 0;            // the share of the board it holds
  std::uint32_t queues = 0;        // hardware queues it has enabled
  std::uint64_t memory_bytes = 0;  // device memory resident for it
  std::vector<HeapUsage> heaps;
  std::uint64_t dma_mappings = 0;      // host buffers the board may reach
  std::uint64_t dma_mapped_bytes = 0;  // their size
  std::uint64_t attached_ns = 0;       // how long it has held its share
  std::vector<EngineTelemetry> engines;
  std::uint64_t h2d_bytes = 0, d2h_bytes = 0, d2d_bytes = 0, h2h_bytes = 0;
  std::uint64_t commands = 0;  // retired, all its queues
  std::uint64_t failures = 0;  // failed, all its queues
  std::uint64_t frames = 0;    // decoded, all its channels
  std::uint64_t decode_errors = 0;
};

// A board seen from outside.
struct BoardView {
  std::string uri;
  std::string board;                    // the model
  std::string driver;                   // "tpu-simd", ...
  std::uint64_t memory_bytes = 0;       // the whole board's
  std::uint64_t memory_used_bytes = 0;  // resident for its processes
  // The whole board's: counters of every process since the sharer started
  // (those that have left included, so that each only grows), sensors of
  // the whole board.
  Telemetry telemetry;
  std::vector<ProcessUsage> processes;  // those this caller may see
};

// True when `uri` names a board that observe() can watch.
TPUHAL_API bool observable(std::string_view uri);
// Throws Unsupported for a board whose driver cannot be watched from
// outside (open it and use Device::telemetry()), and the sharer's errors
// (DeviceLost when the daemon cannot be reached, NotFound for a board it
// does not serve).
TPUHAL_API BoardView observe(std::string_view uri);

}  // namespace tpuhal
