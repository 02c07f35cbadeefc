// The usb: driver on a real USB stack: run inside the QEMU guest of
// usb_run.sh, where tpuhal-usb-gadget presents a simulated board through
// configfs + FunctionFS on dummy_hcd, and the driver reaches it through
// libusb and the host controller stack. The conformance suite runs on the
// same device from the script; these are the USB-only behaviours: the
// firmware upload and pulling the cable (unbinding the gadget).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "support/error_of.hpp"
#include "support/firmware_image.hpp"
#include "tpuhal/fw/image.h"
#include "tpuhal/fw/usb.h"
#include "tpuhal/fw/version.h"
#include "tpuhal/tpuhal.hpp"
#include "tpuhal/tpu/usb_provider.h"

namespace tpuhal {
namespace {

using namespace std::chrono_literals;
using test::error_of;
using ::testing::HasSubstr;

constexpr char kUdcFile[] = "/sys/kernel/config/usb_gadget/tpuhal/UDC";

// How long a step may take before the test calls it hung: the emulated
// machine (TCG) beside a busy host runs a sanitizer build several times
// slower than a quiet one, so this bounds a hang, not a speed.
constexpr auto kHung = 120s;

// The first usb: device listed, waiting up to kHung for it (and for the
// mode asked for) to appear.
DeviceInfo usb_board(bool loader) {
  const auto deadline = std::chrono::steady_clock::now() + kHung;
  do {
    for (const DeviceInfo& d : enumerate())
      if (d.uri.rfind("usb:", 0) == 0 && (d.board.find("(loader") != std::string::npos) == loader) return d;
    std::this_thread::sleep_for(100ms);
  } while (std::chrono::steady_clock::now() < deadline);
  ADD_FAILURE() << "no usb: board in " << (loader ? "loader" : "application") << " mode appeared";
  return {};
}

std::vector<std::byte> image_for(std::uint32_t board_id) { return test::firmware_image(board_id, 100000); }

TEST(UsbGuest, TheLoaderTakesOnlyAGoodImageAndTheBoardComesBackAsTheApplication) {
  const DeviceInfo loader = usb_board(true);
  ASSERT_FALSE(loader.uri.empty());
  std::printf("found %s: %s\n", loader.uri.c_str(), loader.board.c_str());
  const std::string location = loader.uri.substr(4);
  EXPECT_THAT(error_of([&] { open(loader.uri); }).what(), HasSubstr("loader mode"));

  // The board ID the loader reports.
  std::uint32_t board_id = 0;
  {
    auto link = tpu::open_libusb_link(location);
    fw::UsbIdentity id{};
    ASSERT_EQ(link->control_in(fw::kUsbGetIdentity, {reinterpret_cast<std::byte*>(&id), sizeof id}), sizeof id);
    EXPECT_EQ(id.mode, static_cast<std::uint32_t>(fw::UsbMode::kLoader));
    board_id = id.board_id;
  }
  auto bad = image_for(board_id);
  bad[bad.size() - 1] ^= std::byte{1};  // the checksum no longer matches
  Error e = error_of([&] { tpu::upload_usb_firmware(location, bad); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("checksum"));
  e = error_of([&] { tpu::upload_usb_firmware(location, image_for(0x12345678)); });
  EXPECT_EQ(e.status(), Status::InvalidArgument) << e.what();

  const auto start = std::chrono::steady_clock::now();
  upload_firmware(loader.uri, image_for(board_id), kHung);  // the public call, through the usb provider
  std::printf("firmware uploaded and the board re-enumerated in %.0f ms\n",
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  const DeviceInfo app = usb_board(false);
  EXPECT_EQ(app.uri, loader.uri);
  Device dev = open(app.uri);
  EXPECT_THAT(dev.properties().bus, HasSubstr("usb " + location));
}

// Not a test on its own: usb_run.sh runs it in the background and kills it
// mid-copy, so that the board has messages queued for a driver that is
// gone, then checks that the next driver opens the board.
TEST(UsbGuest, DISABLED_CopiesToTheHostUntilKilled) {
  const DeviceInfo info = usb_board(false);
  ASSERT_FALSE(info.uri.empty());
  Device dev = open(info.uri);
  const std::uint64_t n = 8ull << 20;
  Buffer host = dev.allocate(n, Memory::HostPinned), dram = dev.allocate(n);
  Queue q = dev.queue(Engine::Copy);
  for (bool said = false;; said = true) {
    Batch b = q.copy(dram, host);
    for (int i = 0; i < 7; ++i) b.copy(dram, host);
    Fence f = b.submit();
    if (!said) std::printf("copying to the host\n");
    std::fflush(stdout);
    f.wait(kHung);
  }
}

TEST(UsbGuest, UnbindingTheGadgetMidTransferEndsEveryCallWithDeviceLostAndTheBoardComesBack) {
  const DeviceInfo info = usb_board(false);
  ASSERT_FALSE(info.uri.empty());
  std::string udc;
  std::getline(std::ifstream(kUdcFile), udc);
  ASSERT_FALSE(udc.empty()) << "the gadget is not bound";
  {
    Device dev = open(info.uri);
    const std::uint64_t n = 8ull << 20;
    Buffer host = dev.allocate(n, Memory::HostPinned), dram = dev.allocate(n);
    Queue q = dev.queue(Engine::Copy);
    Batch b = q.copy(host, dram);
    for (int i = 0; i < 20; ++i) b.copy(dram, host).copy(host, dram);
    Fence f = b.submit();
    std::this_thread::sleep_for(300ms);
    const auto pulled = std::chrono::steady_clock::now();
    std::ofstream(kUdcFile) << "\n";
    const Error e = error_of([&] { f.wait(kHung); });
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - pulled).count();
    EXPECT_EQ(e.status(), Status::DeviceLost) << e.what();
    EXPECT_THAT(e.what(), HasSubstr(info.uri.substr(4))) << "the error names the board";
    // DeviceLost, not Timeout: the driver saw the cable go. How soon is a
    // figure (docs/usb.md: within 1 s), printed rather than asserted,
    // since a busy host slows the emulated machine by any factor.
    std::printf("device-lost %.0f ms after the gadget was unbound (target: 1000 ms)\n", ms);
    EXPECT_EQ(error_of([&] { q.copy(host, dram).submit().wait(kHung); }).status(), Status::DeviceLost);
  }
  // Closed: every transfer came back and was freed.
  EXPECT_EQ(tpu::usb_transfers_outstanding(), 0u);
  // Plugged in again.
  std::ofstream(kUdcFile) << udc << "\n";
  const DeviceInfo again = usb_board(false);
  ASSERT_FALSE(again.uri.empty());
  Device dev = open(again.uri);
  Buffer a = dev.allocate(1 << 20, Memory::HostPinned), d = dev.allocate(1 << 20);
  dev.queue(Engine::Copy).copy(a, d).copy(d, a).submit().wait(kHung);
  EXPECT_GT(tpu::usb_transfers_outstanding(), 0u);  // the counter counts
}

}  // namespace
}  // namespace tpuhal
