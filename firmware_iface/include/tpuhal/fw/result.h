// Result<T>: a value, or a Problem that says exactly what was wrong.
//
// Every decoder in firmware_iface returns one. A Problem names the status
// code, the field at fault and the offending value, so either side can turn
// it into an error message without guessing.
#pragma once

#include <cstdint>
#include <utility>
#include <variant>

#include "tpuhal/fw/status.h"

namespace tpuhal::fw {

struct Problem {
  CmdStatus status = CmdStatus::kOk;
  // Which field was at fault: an index into the descriptor's args (0-5), or
  // one of the Field values below for header fields.
  std::uint16_t field = kNoField;
  std::uint64_t value = 0;   // the offending value (address, size, opcode, ...)
  std::uint64_t detail = 0;  // a second fact: a limit, an access kind, ...

  static constexpr std::uint16_t kNoField = 0xFFFF;
  static constexpr std::uint16_t kFieldOpcode = 0x100;
  static constexpr std::uint16_t kFieldFlags = 0x101;
  static constexpr std::uint16_t kFieldSequence = 0x102;
  static constexpr std::uint16_t kFieldFence = 0x103;
  static constexpr std::uint16_t kFieldVersion = 0x104;
  static constexpr std::uint16_t kFieldLength = 0x105;
  static constexpr std::uint16_t kFieldStatusPage = 0x106;  // the queue's status page address
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}            // NOLINT: implicit by design
  Result(Problem problem) : v_(std::move(problem)) {}  // NOLINT: implicit by design

  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }
  const T& value() const& { return std::get<0>(v_); }
  T& value() & { return std::get<0>(v_); }
  const T& operator*() const& { return value(); }
  const T* operator->() const { return &value(); }
  const Problem& problem() const& { return std::get<1>(v_); }

 private:
  std::variant<T, Problem> v_;
};

}  // namespace tpuhal::fw
