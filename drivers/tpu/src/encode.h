// Turning the HAL's commands into firmware descriptors (and, for tensor
// ops, their parameter blocks). Shared by queues and programs.
#pragma once

#include <cstdint>
#include <vector>

#include "tpuhal/driver/driver.hpp"
#include "tpuhal/fw/command.h"

namespace tpuhal::tpu {

class TpuQueue;

// One ring (or command list) slot: a descriptor, or 64 bytes of the inline
// parameter block that follows one.
struct Slot {
  fw::CommandDescriptor d;
  bool descriptor;
  std::uint32_t command;  // index of the command it belongs to
};

// Appends the slots for `command` (the command-th of its submission). `uri`
// names the device in errors. Programs may not wait on fences
// (`allow_fence_wait` false).
void encode(const driver::Command& command, std::uint32_t index, const std::string& uri, const TpuQueue* self,
            bool allow_fence_wait, std::vector<Slot>& out);

// The parameter block for a tensor op (fw/tensor.h).
std::vector<std::byte> encode_op(const driver::OpDesc& op);

}  // namespace tpuhal::tpu
