// The libusb link (drivers/tpu/transports/usb/libusb_link.cpp) on a fake
// libusb (fake_libusb.hpp): the orders in which a real bus may complete,
// cancel and refuse transfers, each made to happen on purpose. The link
// meets a real board only in the QEMU guest (tests/qemu/), where a race
// shows up once in many runs; here each one is a test of its own.
//
// Every test ends with the link closed and checks that it left nothing
// behind: no transfer allocated (usb_transfers_outstanding) or in flight,
// no handle, claim, context or buffer held, and no call real libusb would
// refuse.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "support/error_of.hpp"
#include "tpu/fake_libusb.hpp"
#include "tpuhal/fw/usb.h"
#include "tpuhal/tpu/usb_provider.h"

namespace tpuhal {
namespace {

using namespace std::chrono_literals;
using test::error_of;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
namespace fake = test::fake_libusb;
using fake::Pipe;

std::string read(tpu::UsbLink& link, std::size_t max = 4096) {
  std::vector<std::byte> buf(max);
  const std::size_t n = link.bulk_in(buf);
  return {reinterpret_cast<const char*>(buf.data()), n};
}

std::string peek(tpu::UsbLink& link) {
  const std::span<const std::byte> got = link.peek_in();
  return {reinterpret_cast<const char*>(got.data()), got.size()};
}

std::string notification(tpu::UsbLink& link) {
  std::vector<std::byte> buf(256);
  const std::size_t n = link.interrupt_in(buf);
  return {reinterpret_cast<const char*>(buf.data()), n};
}

bool write(tpu::UsbLink& link, std::string_view s) { return link.bulk_out(std::as_bytes(std::span(s))); }

class LibusbLink : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::reset();
    transfers_before_ = tpu::usb_transfers_outstanding();
  }

  void TearDown() override {
    link.reset();
    EXPECT_EQ(tpu::usb_transfers_outstanding(), transfers_before_);
    EXPECT_THAT(fake::leaks(), IsEmpty());
    EXPECT_THAT(fake::misuse(), IsEmpty());
  }

  void open() { link = tpu::open_libusb_link("1-1"); }

  std::unique_ptr<tpu::UsbLink> link;

 private:
  std::size_t transfers_before_ = 0;
};

// ---- A board that answers and detaches at once (a firmware loader) ----

// The first IN transfer is answered and reaped; the board detaches before
// the next is submitted, so the submission that ends the link comes while
// the answer's callback waits for the link's lock.
TEST_F(LibusbLink, AnswerReceivedJustBeforeTheBoardDetachesIsStillRead) {
  open();
  ASSERT_TRUE(fake::wait_event_thread());  // not waiting for the link's lock
  fake::send(Pipe::bulk_in, "verdict: ok");
  bool reaped_first = false;
  fake::on_submit([&](Pipe pipe, int n) {
    if (pipe != Pipe::bulk_in || n != 2) return 0;
    reaped_first = fake::wait_reaped(Pipe::bulk_in, 1);
    fake::unplug();
    return static_cast<int>(LIBUSB_ERROR_NO_DEVICE);
  });
  EXPECT_EQ(read(*link), "verdict: ok");
  ASSERT_TRUE(reaped_first);
  EXPECT_EQ(read(*link), "");
  EXPECT_FALSE(write(*link, "more"));
}

// The answer is in the kernel, not yet reaped, when a submission fails:
// the link's cancellation brings it back LIBUSB_TRANSFER_CANCELLED with its
// bytes. What came after it is not read (it could follow a cut).
TEST_F(LibusbLink, AnswerInTheKernelWhenTheLinkEndsComesBackCancelledAndIsRead) {
  open();
  fake::hold_reaping(true);
  fake::send(Pipe::bulk_in, "verdict: ok");
  fake::send(Pipe::bulk_in, "after");
  fake::on_submit(
      [](Pipe pipe, int n) { return pipe == Pipe::bulk_in && n == 3 ? static_cast<int>(LIBUSB_ERROR_NO_DEVICE) : 0; });
  EXPECT_EQ(read(*link), "verdict: ok");
  EXPECT_EQ(read(*link), "");
  EXPECT_EQ(fake::submitted(Pipe::bulk_in), 2);
}

// The same, on a link that has been reading for a while and ends on a
// failed send: the cancelled transfer's bytes are read after the end, by a
// reader that comes only once every IN transfer is back.
TEST_F(LibusbLink, BytesOfATransferCancelledAsTheLinkEndsAreReadAfterTheEnd) {
  open();
  fake::send(Pipe::bulk_in, "first");
  ASSERT_EQ(read(*link), "first");
  fake::hold_reaping(true);
  fake::send(Pipe::bulk_in, "second");
  fake::send(Pipe::bulk_in, "third");
  fake::on_submit([](Pipe pipe, int) {
    if (pipe != Pipe::bulk_out) return 0;
    fake::unplug();
    return static_cast<int>(LIBUSB_ERROR_NO_DEVICE);
  });
  EXPECT_FALSE(write(*link, "request"));
  // "first", then the four IN transfers in flight, cancelled.
  ASSERT_TRUE(fake::wait_handled(Pipe::bulk_in, 5));
  EXPECT_EQ(read(*link), "second");
  EXPECT_EQ(read(*link), "");
}

// ---- Ending ----

TEST_F(LibusbLink, AfterShutdownNothingIsReadEvenWhatHadArrived) {
  open();
  fake::send(Pipe::bulk_in, "first");
  ASSERT_EQ(read(*link), "first");
  fake::send(Pipe::bulk_in, "second");
  fake::send(Pipe::interrupt_in, "notification");
  ASSERT_TRUE(fake::wait_handled(Pipe::bulk_in, 2));
  ASSERT_TRUE(fake::wait_handled(Pipe::interrupt_in, 1));
  link->shutdown();
  EXPECT_EQ(peek(*link), "");
  EXPECT_EQ(read(*link), "");
  EXPECT_EQ(notification(*link), "");
  EXPECT_FALSE(write(*link, "x"));
}

// Readers blocked on both IN pipes return; closing then waits for the
// cancelled transfers (TearDown finds none left).
TEST_F(LibusbLink, ShutdownWakesBlockedReadersAndCloseReturnsWithTransfersInFlight) {
  open();
  auto bulk = std::async(std::launch::async, [&] { return read(*link); });
  auto irq = std::async(std::launch::async, [&] { return notification(*link); });
  ASSERT_TRUE(fake::wait_submitted(Pipe::bulk_in, 4));
  ASSERT_TRUE(fake::wait_submitted(Pipe::interrupt_in, 1));
  link->shutdown();
  ASSERT_EQ(bulk.wait_for(10s), std::future_status::ready);
  ASSERT_EQ(irq.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(bulk.get(), "");
  EXPECT_EQ(irq.get(), "");
  link.reset();
  EXPECT_EQ(fake::in_flight(Pipe::bulk_in) + fake::in_flight(Pipe::interrupt_in), 0);
}

TEST_F(LibusbLink, ClosingWithTransfersInFlightCancelsThemAndFreesEverything) {
  open();
  fake::take_out(false);
  ASSERT_TRUE(write(*link, "never taken"));
  fake::send(Pipe::bulk_in, "read");
  ASSERT_EQ(read(*link), "read");
  fake::send(Pipe::bulk_in, "left unread");
  ASSERT_TRUE(fake::wait_handled(Pipe::bulk_in, 2));
  ASSERT_EQ(fake::in_flight(Pipe::bulk_out), 1);
  link.reset();
  EXPECT_EQ(fake::in_flight(Pipe::bulk_out), 0);
  EXPECT_EQ(fake::in_flight(Pipe::bulk_in), 0);
  EXPECT_EQ(fake::device_memory_buffers(), 0);
}

// After an IN transfer fails, bytes later on its endpoint could join a
// message the failure cut: the link ends and reads what came before only.
TEST_F(LibusbLink, AFailedInTransferEndsTheLinkAndNothingAfterItIsRead) {
  open();
  fake::send(Pipe::bulk_in, "first");
  ASSERT_EQ(read(*link), "first");
  fake::send(Pipe::bulk_in, "before");
  fake::fail(Pipe::bulk_in, LIBUSB_TRANSFER_ERROR);
  fake::send(Pipe::bulk_in, "after");
  EXPECT_EQ(read(*link), "before");
  EXPECT_EQ(read(*link), "");
  EXPECT_FALSE(write(*link, "x"));
}

TEST_F(LibusbLink, ABoardUnpluggedWhileAReaderWaitsEndsTheRead) {
  open();
  auto bulk = std::async(std::launch::async, [&] { return read(*link); });
  ASSERT_TRUE(fake::wait_submitted(Pipe::bulk_in, 4));
  ASSERT_TRUE(fake::wait_submitted(Pipe::interrupt_in, 1));
  fake::unplug();
  ASSERT_EQ(bulk.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(bulk.get(), "");
  EXPECT_EQ(notification(*link), "");
  EXPECT_FALSE(write(*link, "x"));
  EXPECT_EQ(error_of([&] { link->control_out(1); }).status(), Status::DeviceLost);
}

// ---- Reading ----

TEST_F(LibusbLink, ABulkReadTakesWhatFitsAndTheRestFollowsInOrder) {
  open();
  fake::send(Pipe::bulk_in, "hello world");
  fake::send(Pipe::bulk_in, "next");
  EXPECT_EQ(read(*link, 5), "hello");
  EXPECT_EQ(read(*link, 5), " worl");
  EXPECT_EQ(peek(*link), "d");
  EXPECT_EQ(peek(*link), "d");
  link->release_in();
  EXPECT_EQ(read(*link), "next");
}

// IN transfers are held back until the first read, then kept busy: one
// read and given back goes straight back to the board.
TEST_F(LibusbLink, InTransfersStartAtTheFirstReadAndStayBusy) {
  open();
  fake::send(Pipe::bulk_in, "queued before");
  EXPECT_EQ(fake::submitted(Pipe::bulk_in), 0);
  EXPECT_EQ(read(*link), "queued before");
  EXPECT_EQ(fake::in_flight(Pipe::bulk_in), 4);
  EXPECT_EQ(fake::in_flight(Pipe::interrupt_in), 1);
}

// A zero-length packet is no message: its transfer is resubmitted, not
// handed to the reader.
TEST_F(LibusbLink, AZeroLengthPacketIsNotReadAndItsTransferGoesBackToTheBoard) {
  open();
  fake::send(Pipe::bulk_in, "");
  fake::send(Pipe::bulk_in, "data");
  EXPECT_EQ(read(*link), "data");
  EXPECT_EQ(fake::in_flight(Pipe::bulk_in), 4);
  EXPECT_EQ(fake::submitted(Pipe::bulk_in), 6);
}

// The interrupt transfer is one packet long, so each read is one
// notification.
TEST_F(LibusbLink, EachInterruptReadIsOneNotificationFromATransferOfOnePacket) {
  open();
  fake::send(Pipe::interrupt_in, "first notification");
  fake::send(Pipe::interrupt_in, "second");
  EXPECT_EQ(notification(*link), "first notification");
  EXPECT_EQ(notification(*link), "second");
  EXPECT_EQ(fake::last_length(Pipe::interrupt_in), 64);
}

// ---- Writing ----

// A transfer whose length is a multiple of the packet size ends with no
// short packet, so the board would wait for more: its last byte goes in a
// transfer of its own.
TEST_F(LibusbLink, SendsArriveInOrderAndOneEndingOnAPacketBoundarySendsItsLastByteApart) {
  open();
  const std::string packet(512, 'p'), two(1024, 't'), short_one(100, 's');
  ASSERT_TRUE(write(*link, "abc"));
  ASSERT_TRUE(write(*link, packet));
  ASSERT_TRUE(write(*link, short_one));
  ASSERT_TRUE(write(*link, two));
  ASSERT_TRUE(link->drain_out(10s));
  EXPECT_THAT(fake::out(), ElementsAre("abc", packet.substr(0, 511), "p", short_one, two.substr(0, 1023), "t"));
}

TEST_F(LibusbLink, DrainOutWaitsUntilTheBoardHasTakenEverySend) {
  open();
  fake::take_out(false);
  ASSERT_TRUE(write(*link, "one"));
  ASSERT_TRUE(write(*link, "two"));
  EXPECT_FALSE(link->drain_out(0ms));
  fake::take_out(true);
  EXPECT_TRUE(link->drain_out(10s));
  EXPECT_THAT(fake::out(), ElementsAre("one", "two"));
}

// ---- Control requests ----

// The board's interface is the one with all three endpoints, here the
// second: it is claimed, and its requests are addressed to it.
TEST_F(LibusbLink, ControlRequestsGoToTheBoardsInterfaceAndFailWithDeviceLostOnceItIsGone) {
  open();
  fake::control_answer("identity");
  std::vector<std::byte> buf(64);
  ASSERT_EQ(link->control_in(7, buf), 8u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(buf.data()), 8), "identity");
  link->control_out(9);
  const std::vector<fake::Control> sent = fake::controls();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].request_type, 0xC1);  // device to host, vendor, to an interface
  EXPECT_EQ(sent[0].request, 7);
  EXPECT_EQ(sent[1].request_type, 0x41);  // host to device
  EXPECT_EQ(sent[1].request, 9);
  EXPECT_EQ(sent[0].index, 1);
  EXPECT_EQ(sent[1].index, 1);
  fake::unplug();
  const Error e = error_of([&] { link->control_in(7, buf); });
  EXPECT_EQ(e.status(), Status::DeviceLost);
  EXPECT_THAT(e.what(), HasSubstr("usb 1-1 (1d6b:0104)"));
}

// ---- Opening ----

TEST_F(LibusbLink, OpeningWhereThereIsNoDeviceIsNotFound) {
  const Error e = error_of([] { tpu::open_libusb_link("1-2"); });
  EXPECT_EQ(e.status(), Status::NotFound);
  EXPECT_THAT(e.what(), HasSubstr("1-2"));
}

TEST_F(LibusbLink, ADeviceWithoutTheThreeEndpointsIsNotFoundAndLeftClosed) {
  fake::reset({.interrupt_endpoint = false});
  const Error e = error_of([] { tpu::open_libusb_link("1-1"); });
  EXPECT_EQ(e.status(), Status::NotFound);
  EXPECT_THAT(e.what(), HasSubstr("interrupt IN"));
}

TEST_F(LibusbLink, AnInterfaceClaimedElsewhereIsResourceExhaustedAndLeftClosed) {
  fake::reset({.claim_error = LIBUSB_ERROR_BUSY});
  EXPECT_EQ(error_of([] { tpu::open_libusb_link("1-1"); }).status(), Status::ResourceExhausted);
}

TEST_F(LibusbLink, NoPermissionToOpenIsPermissionDeniedSayingWhatToDo) {
  fake::reset({.open_error = LIBUSB_ERROR_ACCESS});
  const Error e = error_of([] { tpu::open_libusb_link("1-1"); });
  EXPECT_EQ(e.status(), Status::PermissionDenied);
  EXPECT_THAT(e.what(), HasSubstr("/dev/bus/usb/001/005"));  // the node usbfs made for it
  EXPECT_THAT(e.what(), HasSubstr("udev rule"));
}

// usbfs lends little memory: once it has none left, the rest of the
// buffers come from the heap, and each kind is freed its own way (the fake
// gives usbfs memory from new[], which ASan tells from malloc's).
TEST_F(LibusbLink, WhenUsbfsMemoryRunsOutTheRestOfTheBuffersComeFromTheHeap) {
  fake::reset({.device_memory = 3 * fw::kUsbTransferBytes});
  open();
  EXPECT_EQ(fake::device_memory_buffers(), 3);
  fake::send(Pipe::bulk_in, "in");
  EXPECT_EQ(read(*link), "in");
  ASSERT_TRUE(write(*link, "out"));
  ASSERT_TRUE(link->drain_out(10s));
  EXPECT_THAT(fake::out(), ElementsAre("out"));
}

}  // namespace
}  // namespace tpuhal
