// The "simd" provider: boards served by a simulator daemon (tpuhal-simd) in
// another process, driven by the real TPU driver through a Transport over
// shared memory (docs/simd.md).
//
//   simd:/path/to/socket#N   board N of the daemon listening on that socket
//   simd:/path/to/socket     board 0
//
// enumerate() lists the boards of the daemons named in TPUHAL_SIMD, a
// comma-separated list of socket paths. Each opened device is a virtual
// function of its board: its own registers, queues, IOMMU domain and share
// of DRAM, isolated from every other client of the daemon.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tpuhal/driver/driver.hpp"
#include "tpuhal/simd/protocol.h"

namespace tpuhal::tpu {

std::shared_ptr<driver::Provider> make_simd_provider();

// The daemon's statistics: every VF in use that this caller may see (all
// of them for the daemon's owner, else its own user's), the process that
// holds it, what the VF holds and its telemetry. For tools and tests.
// Throws tpuhal::Error when the daemon cannot be reached.
struct SimdStats {
  std::uint32_t boards = 0;
  std::uint64_t protocol_errors = 0;
  // Every user's VFs in use on every board, from the same moment as the
  // first page of `vfs`: for the daemon's owner, vfs.size() when the list
  // fit one page.
  std::uint32_t vfs_in_use = 0;
  std::vector<simd::VfStats> vfs;
};
SimdStats simd_stats(const std::string& socket_path);

// A board's telemetry as the daemon reads it, taking no VF and no queue:
// the whole board (vf = simd::kWholeBoard: every VF's counters since the
// daemon started, sensors of the whole board) or one VF in use (its
// counters since it was attached). Throws tpuhal::Error when the daemon
// cannot be reached or refuses (no such board or VF, another user's VF).
Telemetry simd_telemetry(const std::string& socket_path, std::uint32_t board, std::uint32_t vf = simd::kWholeBoard);

// The boards a daemon serves. Throws tpuhal::Error when it cannot be reached.
std::vector<simd::BoardInfo> simd_boards(const std::string& socket_path);

}  // namespace tpuhal::tpu
