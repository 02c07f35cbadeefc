// The board's telemetry block (fw/telemetry.h) decoded into the HAL's
// Telemetry: for the TPU driver, and for tools that read a block another
// way (tpuhal-simd's whole-board view, docs/telemetry.md).
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "tpuhal/tpuhal.hpp"

namespace tpuhal::tpu {

// `bytes`: the block as the board wrote it (its size: the bytes written).
// `engines`: the engines to report busy time for, in order; empty: those
// the queue entries name. Throws Error(DeviceFault) naming `who` for a
// block that is malformed or cut short.
Telemetry decode_telemetry(std::span<const std::byte> bytes, std::span<const Engine> engines, const std::string& who);

}  // namespace tpuhal::tpu
