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
  std::uint32_t command;     // index of the command it belongs to
  const char* op = nullptr;  // a tensor op's kind ("gather"), for its errors
};

// Appends the slots for `command` (the command-th of its submission). `uri`
// names the device in errors. Programs may not wait on fences
// (`allow_fence_wait` false). A tensor op the agreed interface minor
// (`interface_minor`) does not have is refused (Unsupported) before the
// board could refuse it as a fault.
void encode(const driver::Command& command, std::uint32_t index, const std::string& uri, const TpuQueue* self,
            bool allow_fence_wait, std::uint16_t interface_minor, std::vector<Slot>& out);

// The interface minor (major 1) a tensor op needs: 1 for the kinds of 1.1,
// 3 for elementwise erf, 4 for the hard swish activation, 5 for top_k,
// conv_transpose2d and where.
std::uint16_t required_minor(const driver::OpDesc& op);

// The parameter block for a tensor op (fw/tensor.h), for a board of
// `interface_minor`: its placement flags (kOpGlobal) from 1.18 on, left out
// for an older board, which would refuse them (they change no result).
std::vector<std::byte> encode_op(const driver::OpDesc& op, std::uint16_t interface_minor);

}  // namespace tpuhal::tpu
