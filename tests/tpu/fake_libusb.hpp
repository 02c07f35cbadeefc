// libusb-1.0 without a USB bus, for testing the code above it
// (drivers/tpu/transports/usb/libusb_link.cpp): a program that links
// fake_libusb.cpp instead of libusb sees one device, whose board, kernel and
// event thread the test drives from here.
//
// The kernel behaves as libusb's Linux back end does, with the test
// deciding when:
// - A submitted transfer finishes ("lands") when the board has something
//   for it: the next bytes or failure the test queued on its pipe, in
//   submission order per pipe. Bulk OUT transfers land as they are
//   submitted while the board takes them (take_out).
// - Finished transfers are reaped in the order they finished, on the
//   thread in libusb_handle_events_timeout_completed, which calls their
//   callbacks there, outside the fake's lock. hold_reaping(true) keeps
//   finished transfers unreaped (and those behind them), as when the event
//   thread has not run yet.
// - libusb_handle_events_timeout_completed returns once it has reaped what
//   was ready or libusb_interrupt_event_handler was called, never on its
//   timeout: the event thread leaves libusb only when the test made
//   something happen.
// - libusb_cancel_transfer of a transfer not yet reaped makes it come back
//   LIBUSB_TRANSFER_CANCELLED at the next event handling, with the bytes it
//   had received: libusb keeps what an URB got before its discard. It
//   returns LIBUSB_ERROR_NOT_FOUND where the kernel had already finished the
//   transfer (reported cancelled all the same) or it was reaped (its
//   callback running, say).
//
// Not thread-safe against reset(): call it with no link open.
#pragma once

#include <libusb.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tpuhal::test::fake_libusb {

enum class Pipe { bulk_in, bulk_out, interrupt_in };

// The one device on the bus, at "BUS-PORT" ("1-1"). Its configuration has
// an interface 0 with an interrupt IN endpoint only (a HID one, say), then
// the board's interface 1: bulk IN 0x81, bulk OUT 0x02, interrupt IN 0x83.
struct Device {
  std::uint8_t bus = 1, port = 1, address = 5;
  std::uint16_t vendor = 0x1d6b, product = 0x0104;
  std::uint16_t out_packet = 512;  // bulk OUT wMaxPacketSize
  std::uint16_t irq_packet = 64;   // interrupt IN wMaxPacketSize
  bool interrupt_endpoint = true;  // false: the interface has no interrupt IN
  int open_error = 0;              // what libusb_open returns
  int claim_error = 0;             // what libusb_claim_interface returns
  // Bytes libusb_dev_mem_alloc has to give before it returns null.
  std::size_t device_memory = SIZE_MAX;
};

// A fresh bus with `device` plugged in: nothing queued, held or counted,
// and what an earlier test leaked forgotten.
void reset(const Device& device = {});

// ---- The board ----

// Bytes the board sends on an IN pipe: they fill the next transfer (the
// rest, if longer, the ones after). Empty: a zero-length packet.
void send(Pipe pipe, std::string_view bytes);
// The next transfer on an IN pipe finishes with `status` and no bytes.
void fail(Pipe pipe, libusb_transfer_status status);
// Whether the board takes bulk OUT transfers (true after reset): while it
// does not, they stay in flight.
void take_out(bool take);
// The board detaches: transfers waiting for it finish
// LIBUSB_TRANSFER_NO_DEVICE, and later submissions and control requests
// fail with LIBUSB_ERROR_NO_DEVICE.
void unplug();
// The data libusb_control_transfer returns to a device-to-host request.
void control_answer(std::string_view bytes);

// ---- The kernel and the event thread ----

// While held, finished transfers stay in the kernel, unreaped, until
// released or cancelled.
void hold_reaping(bool hold);

// Runs in libusb_submit_transfer for the n-th submission (from 1) on
// `pipe`, on the submitting thread and outside the fake's lock, before the
// transfer is taken; what it returns (0 or a libusb_error) is the
// submission's result. It may call anything here, waits included.
using SubmitHook = std::function<int(Pipe pipe, int n)>;
void on_submit(SubmitHook hook);

// ---- What happened ----

int submitted(Pipe pipe);        // transfers taken by libusb_submit_transfer
int in_flight(Pipe pipe);        // submitted and not yet reaped
int last_length(Pipe pipe);      // the length of the last transfer submitted
std::vector<std::string> out();  // each bulk OUT transfer the board took, in order
struct Control {
  std::uint8_t request_type, request;
  std::uint16_t index;
};
std::vector<Control> controls();  // every control request, in order
// Device-memory buffers handed out and not freed.
int device_memory_buffers();

// Waits of at most 10 s, false on timeout: until `n` transfers on `pipe`
// were submitted, reaped (their callback called) or handled (their
// callback returned).
bool wait_submitted(Pipe pipe, int n);
// Until a thread waits in libusb_handle_events_timeout_completed (the
// link's event thread, once it has started).
bool wait_event_thread();
bool wait_reaped(Pipe pipe, int n);
bool wait_handled(Pipe pipe, int n);

// Calls real libusb refuses or crashes on (a transfer freed in flight, a
// handle closed with transfers in flight, a buffer freed the wrong way), and
// what is still held (contexts, handles, claims, transfers, device memory,
// descriptors, device lists): both empty once every link is closed.
std::vector<std::string> misuse();
std::vector<std::string> leaks();

}  // namespace tpuhal::test::fake_libusb
