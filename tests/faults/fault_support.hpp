// Helpers shared by the fault tests.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "tpuhal/error.hpp"

namespace tpuhal::fault_test {

using Clock = std::chrono::steady_clock;

inline std::chrono::milliseconds since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t);
}

// Runs `f`, expects it to throw Error with `status`; returns the message.
template <class F>
std::string expect_error(F&& f, Status status) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return {};
}

}  // namespace tpuhal::fault_test
