#include "tpuhal/fw/version.h"

namespace tpuhal::fw {

Result<Version> negotiate(Version board, Version driver_min, Version driver_max) {
  Problem p{CmdStatus::kBadArgument, Problem::kFieldVersion, board.packed(), driver_max.packed()};
  if (board.major != driver_max.major || driver_min.major != driver_max.major) return p;
  if (board.minor < driver_min.minor) return p;
  Version agreed{board.major, board.minor < driver_max.minor ? board.minor : driver_max.minor};
  return agreed;
}

Result<Version> accept_driver_version(Version board, std::uint32_t requested_packed) {
  const Version requested = Version::unpack(requested_packed);
  if (requested.major != board.major || requested.minor > board.minor)
    return Problem{CmdStatus::kBadArgument, Problem::kFieldVersion, requested_packed, board.packed()};
  return requested;
}

}  // namespace tpuhal::fw
