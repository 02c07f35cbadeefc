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

// The daemon's statistics (its VFs and their resident DRAM), for tools and
// tests. Throws tpuhal::Error when the daemon cannot be reached.
simd::StatsReply simd_stats(const std::string& socket_path);

// The boards a daemon serves. Throws tpuhal::Error when it cannot be reached.
std::vector<simd::BoardInfo> simd_boards(const std::string& socket_path);

}  // namespace tpuhal::tpu
