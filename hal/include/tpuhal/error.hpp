// Errors: every failing call throws tpuhal::Error, which carries a Status and
// a message naming what was wrong and with which value, e.g.
//   "copy of 200 bytes at offset 4000 exceeds the destination buffer (4096 bytes)"
//   "sim:0: cannot allocate 13 GiB in heap 'npu': 0 B used, 7.75 GiB free,
//    largest free block 7.75 GiB"
// The C ABI (tpuhal.h) returns the same Status and keeps the message per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "tpuhal/export.hpp"

namespace tpuhal {

// Why a call failed: the list, with what each status means, is
// tpuhal/status.inc (shared with the C ABI and Python).
enum class Status : std::int32_t {
#define TPUHAL_STATUS(name, c_name, value, text, python_also, doc) name = value,
#include "tpuhal/status.inc"
#undef TPUHAL_STATUS
};

// How many statuses there are: values run from 0 to kStatusCount - 1.
inline constexpr std::size_t kStatusCount = 0
#define TPUHAL_STATUS(name, c_name, value, text, python_also, doc) +1
#include "tpuhal/status.inc"
#undef TPUHAL_STATUS
    ;

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
