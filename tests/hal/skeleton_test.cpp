// The skeleton driver, the starting point a porter copies: it registers,
// lists its one board, and either does what each contract asks of a board
// with nothing in it or refuses with Unsupported, naming the device and
// what a port fills in. The conformance suite runs on it too.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "device_impl.h"
#include "support/error_of.hpp"
#include "tpuhal/skeleton/skeleton.h"
#include "tpuhal/tpuhal.hpp"

namespace tpuhal {
namespace {

using namespace std::chrono_literals;
using test::error_of;
using ::testing::HasSubstr;

// Unsupported, naming the device, the skeleton and where a port fills it in.
void expect_unsupported(const Error& e, const std::string& uri, const char* where) {
  EXPECT_EQ(e.status(), Status::Unsupported) << e.what();
  EXPECT_THAT(e.what(), HasSubstr(uri + ":"));
  EXPECT_THAT(e.what(), HasSubstr("the skeleton driver"));
  EXPECT_THAT(e.what(), HasSubstr(where));
}

TEST(Skeleton, RegistersAndListsItsOneBoard) {
  driver::register_provider(skeleton::make_provider());
  int listed = 0;
  for (auto& d : enumerate()) {
    if (d.driver != "skeleton") continue;
    ++listed;
    EXPECT_EQ(d.uri, "skeleton:0");
    EXPECT_EQ(d.memory_bytes, 0u);
  }
  EXPECT_EQ(listed, 1);
  for (auto& [name, why] : unavailable_drivers()) EXPECT_NE(name, "skeleton") << why;
  Device dev = open("skeleton:0");
  EXPECT_EQ(dev.properties().driver, "skeleton");
  Error e = error_of([] { open("skeleton:1"); });
  EXPECT_EQ(e.status(), Status::NotFound);
  EXPECT_THAT(e.what(), HasSubstr("'skeleton:1'"));
  EXPECT_THAT(e.what(), HasSubstr("skeleton:0"));
  expect_unsupported(error_of([] { upload_firmware("skeleton:0", {}, 1s); }), "skeleton:0",
                     "SkeletonProvider::upload_firmware");
}

TEST(Skeleton, DescribesABoardWithNothingInIt) {
  auto dev = skeleton::make_device("skeleton:0");
  const Properties& p = dev->properties();
  EXPECT_EQ(p.uri, "skeleton:0");
  EXPECT_EQ(p.driver, "skeleton");
  EXPECT_FALSE(p.board.empty());
  EXPECT_TRUE(p.heaps.empty());
  EXPECT_TRUE(p.engines.empty());
  EXPECT_EQ(p.memory_bytes, 0u);
  EXPECT_FALSE(p.caps.map_device_memory || p.caps.host_visible_device_memory || p.caps.import_host_memory ||
               p.caps.wait_value || p.caps.timestamps || p.caps.tensor || p.caps.video_decode);
  const MemoryStats m = dev->memory_stats();
  EXPECT_TRUE(m.heaps.empty());
  EXPECT_EQ(m.device_used, 0u);
  EXPECT_EQ(m.host_pinned_allocations, 0u);
  EXPECT_TRUE(dev->status().queues.empty());
}

TEST(Skeleton, EveryDeviceCallItCannotDoIsUnsupported) {
  auto dev = skeleton::make_device("skeleton:0");
  const std::string uri = "skeleton:0";
  for (Memory m : {Memory::Device, Memory::DeviceHostVisible, Memory::HostPinned}) {
    Error e = error_of([&] { dev->allocate(4096, m, {}); });
    expect_unsupported(e, uri, "SkeletonDevice::allocate");
    EXPECT_THAT(e.what(), HasSubstr(to_string(m)));
  }
  for (Engine engine : {Engine::Compute, Engine::Copy, Engine::Video}) {
    Error e = error_of([&] { dev->create_queue(engine, {}); });
    expect_unsupported(e, uri, "SkeletonDevice::create_queue");
    EXPECT_THAT(e.what(), HasSubstr(std::string("no ") + to_string(engine) + " queues"));
  }
  expect_unsupported(error_of([&] { dev->import_host(nullptr, 4096); }), uri, "caps.import_host_memory");
  expect_unsupported(error_of([&] { dev->create_program({}); }), uri, "SkeletonDevice::create_program");
  expect_unsupported(error_of([&] { dev->open_decoder({}); }), uri, "caps.video_decode");
  expect_unsupported(error_of([&] { dev->reset(); }), uri, "SkeletonDevice::reset");
}

// The same refusals through the public API, where the HAL checks first.
TEST(Skeleton, ThePublicApiSeesTheSameRefusals) {
  driver::register_provider(skeleton::make_provider());
  Device dev = open("skeleton:0");
  expect_unsupported(error_of([&] { dev.allocate(4096); }), "skeleton:0", "SkeletonDevice::allocate");
  expect_unsupported(error_of([&] { dev.queue(Engine::Copy); }), "skeleton:0", "SkeletonDevice::create_queue");
  std::vector<std::byte> page(8192);
  EXPECT_EQ(error_of([&] { dev.import_host(page.data(), 4096); }).status(), Status::Unsupported);
  EXPECT_EQ(error_of([&] { dev.reset(); }).status(), Status::Unsupported);
  // A port that keeps no telemetry inherits a refusal that says so.
  EXPECT_FALSE(dev.properties().caps.telemetry);
  const Error t = error_of([&] { (void)dev.telemetry(); });
  EXPECT_EQ(t.status(), Status::Unsupported);
  EXPECT_THAT(t.what(), HasSubstr("skeleton:0: this device reports no telemetry"));
}

// The objects a port fills in, as the skeleton leaves them: each does what
// its contract asks of an object with nothing behind it, or refuses.
TEST(Skeleton, QueueKeepsItsContractAndRefusesWork) {
  auto dev = std::make_shared<skeleton::SkeletonDevice>("skeleton:0");
  skeleton::SkeletonQueue q(dev, Engine::Copy, 3);
  EXPECT_EQ(q.engine(), Engine::Copy);
  EXPECT_EQ(q.index(), 3u);
  expect_unsupported(error_of([&] { q.submit({}, 1ms); }), "skeleton:0 copy queue 3", "SkeletonQueue::submit");
  EXPECT_EQ(q.timeline().completed, 0u);
  EXPECT_FALSE(q.timeline().failed);
  EXPECT_EQ(q.submitted(), 0u);
  EXPECT_EQ(q.progress(), 0u);
  q.block(0, 1s);  // reached already: returns
  EXPECT_FALSE(q.timestamp_ns(0).has_value());
  EXPECT_TRUE(q.diagnose().empty());
  QueueStatus s = q.status();
  EXPECT_EQ(s.engine, Engine::Copy);
  EXPECT_EQ(s.index, 3u);
  EXPECT_TRUE(s.in_use);
  EXPECT_FALSE(s.failed);
  // abort(): the timeline then reads failed, and failure() says why.
  q.abort();
  EXPECT_TRUE(q.timeline().failed);
  EXPECT_TRUE(q.status().failed);
  Error f = q.failure();
  EXPECT_NE(f.status(), Status::Ok);
  EXPECT_THAT(f.what(), HasSubstr("skeleton:0 copy queue 3"));
}

TEST(Skeleton, BufferAndProgramDescribeThemselvesAndRefuseToMap) {
  auto dev = std::make_shared<skeleton::SkeletonDevice>("skeleton:0");
  skeleton::SkeletonBuffer b(dev, 4096, Memory::Device, "dram", 0x10000);
  EXPECT_EQ(b.size(), 4096u);
  EXPECT_EQ(b.memory(), Memory::Device);
  EXPECT_EQ(b.heap(), "dram");
  EXPECT_EQ(b.device_address(), 0x10000u);
  Error e = error_of([&] { b.map(); });
  expect_unsupported(e, "skeleton:0", "SkeletonBuffer::map");
  EXPECT_THAT(e.what(), HasSubstr("HostPinned"));
  skeleton::SkeletonProgram program(dev, 5);
  EXPECT_EQ(program.size(), 5u);
}

}  // namespace
}  // namespace tpuhal
