// Errors: every failing call throws tpuhal::Error, which carries a Status and
// a message naming what was wrong and with which value, e.g.
//   "copy of 200 bytes at offset 4000 exceeds the destination buffer (4096 bytes)"
//   "sim:0: cannot allocate 13 GiB in heap 'npu': 0 B used, 7.75 GiB free,
//    largest free block 7.75 GiB"
// The C ABI (tpuhal.h) returns the same Status and keeps the message per thread.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "tpuhal/export.hpp"

namespace tpuhal {

enum class Status : std::int32_t {
  Ok = 0,
  InvalidArgument = 1,     // a value the call cannot accept
  OutOfRange = 2,          // an offset or size outside a buffer
  NotFound = 3,            // no such device, profile or driver
  Unsupported = 4,         // the device cannot do this (see Properties::caps)
  OutOfMemory = 5,         // device or pinned host memory exhausted
  ResourceExhausted = 6,   // no free hardware queue of the engine asked for
  QueueFull = 7,           // the queue's ring stayed full for the whole timeout
  Timeout = 8,             // a wait saw no progress for its whole timeout
  DeviceFault = 9,         // the board failed a command (DMA fault, bad descriptor, ...)
  DeviceLost = 10,         // the board stopped responding or went away
  Unavailable = 11,        // a driver or library is not present on this machine
  FailedPrecondition = 12, // the object is not in a state for this call (freed, failed)
  VersionMismatch = 13,    // host and board speak incompatible interface versions
  PermissionDenied = 14,
  Internal = 15,           // a bug in tpuhal; please report it
};

// "ok", "invalid argument", ...
TPUHAL_API const char* to_string(Status status) noexcept;

class TPUHAL_API Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message);
  Status status() const noexcept { return status_; }

 private:
  Status status_;
};

}  // namespace tpuhal
