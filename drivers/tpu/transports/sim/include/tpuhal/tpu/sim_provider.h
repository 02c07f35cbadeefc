// The "sim" provider: simulated boards in this process, driven by the real
// TPU driver through an in-process Transport.
//
//   sim:N            the Nth board listed in TPUHAL_SIM_BOARDS (a comma-
//                    separated list of profiles; default "bm1684x")
//   sim:PROFILE      a board of a built-in profile or one found in
//                    TPUHAL_PROFILE_PATH ("sim:tiny")
//   sim:/path.json   a board of the profile in that file
//
// With usb_sim, the only code that sees both the driver and the simulator.
#pragma once

#include <memory>
#include <string_view>

#include "tpuhal/driver/driver.hpp"
#include "tpuhal/tpu/transport.h"

namespace tpuhal::sim {
class Board;
}

namespace tpuhal::tpu {

std::shared_ptr<driver::Provider> make_sim_provider();

// A Transport onto a board in this process. Tests use it to reach the board
// (for fault injection and inspection) while the driver drives it.
std::unique_ptr<Transport> make_sim_transport(std::shared_ptr<sim::Board> board);

// The board behind a device opened through the sim provider, or null.
std::shared_ptr<sim::Board> sim_board_of(std::string_view uri);

}  // namespace tpuhal::tpu
