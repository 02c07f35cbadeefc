// The skeleton driver registers, lists nothing, says why, and refuses every
// call with a clear Unsupported: the starting point a porter copies.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tpuhal/skeleton/skeleton.h"
#include "tpuhal/tpuhal.hpp"

namespace tpuhal {
namespace {

using ::testing::HasSubstr;

TEST(Skeleton, RegistersListsNothingAndSaysWhy) {
  driver::register_provider(skeleton::make_provider());
  for (auto& d : enumerate()) EXPECT_NE(d.driver, "skeleton");
  bool listed = false;
  for (auto& [name, why] : unavailable_drivers()) {
    if (name == "skeleton") {
      listed = true;
      EXPECT_THAT(why, HasSubstr("template for new drivers"));
    }
  }
  EXPECT_TRUE(listed);
  try {
    open("skeleton:0");
    FAIL() << "opened";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::Unavailable);
    EXPECT_THAT(e.what(), HasSubstr("skeleton:0"));
  }
}

TEST(Skeleton, EveryCallFailsWithUnsupported) {
  auto dev = skeleton::make_device("skeleton:0");
  EXPECT_EQ(dev->properties().driver, "skeleton");
  auto expect_unsupported = [](auto&& f, const char* what) {
    try {
      f();
      ADD_FAILURE() << what << " did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::Unsupported) << what;
      EXPECT_THAT(e.what(), HasSubstr("skeleton")) << what;
    }
  };
  expect_unsupported([&] { dev->allocate(4096, Memory::Device, {}); }, "allocate");
  expect_unsupported([&] { dev->allocate(4096, Memory::HostPinned, {}); }, "allocate pinned");
  expect_unsupported([&] { dev->create_queue(Engine::Compute, {}); }, "create_queue");
  expect_unsupported([&] { dev->import_host(nullptr, 4096); }, "import_host");
}

}  // namespace
}  // namespace tpuhal
