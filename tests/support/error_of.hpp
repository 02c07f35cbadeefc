// The tpuhal::Error a call throws, for tests that check its status and
// message; records a test failure when the call throws nothing.
#pragma once

#include <gtest/gtest.h>

#include "tpuhal/error.hpp"

namespace tpuhal::test {

template <class F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a tpuhal::Error";
  return Error(Status::Ok, "no error was thrown");
}

}  // namespace tpuhal::test
