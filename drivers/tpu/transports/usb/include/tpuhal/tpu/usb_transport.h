// The USB transport: a board on a USB cable, driven through the firmware
// interface's USB messages (fw/usb.h, docs/usb.md).
//
// A USB board has no BARs. Register accesses become messages on bulk OUT
// (reads wait for the answer on bulk IN), the aperture is a host-side copy
// sent to the board with mem-write messages when the driver flushes it, and
// the board's DMA is reversed: it asks for host memory (host-read) and sends
// its writes (host-write), which this transport checks against the mappings
// the driver made and applies in order. Interrupt IN notifications reach the
// driver's eventfds only after every bulk message they follow is applied.
//
// A link that fails (the cable is pulled, the board resets, a transfer
// errors) makes the board lost: registers read all ones, every interrupt
// vector fires so that waiters look, and the driver reports device-lost.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tpuhal/tpu/transport.h"

namespace tpuhal::tpu {

// The host's end of the cable: the board's interface and its endpoints.
// Implementations: libusb (usb: devices) and an in-process cable to a
// simulated board (usb-sim: devices).
class UsbLink {
 public:
  virtual ~UsbLink() = default;
  // "usb 1-2 (1d6b:0104)", "usb-sim tiny", ...
  virtual std::string bus() const = 0;
  // EP0 vendor request, device to host: fills `out`, returns the bytes
  // received. Throws tpuhal::Error (DeviceLost) when the board is gone.
  virtual std::size_t control_in(std::uint8_t request, std::span<std::byte> out) = 0;
  // EP0 vendor request without data, host to device. Throws as control_in.
  virtual void control_out(std::uint8_t request) = 0;
  // Bulk OUT: all of `data`; false once the board is gone or shut down.
  virtual bool bulk_out(std::span<const std::byte> data) = 0;
  // Bulk IN and interrupt IN: block until something arrives; return the
  // bytes received, or 0 once the board is gone or shutdown() was called.
  virtual std::size_t bulk_in(std::span<std::byte> out) = 0;
  virtual std::size_t interrupt_in(std::span<std::byte> out) = 0;
  // Makes blocked and later transfers return 0 / false (closing).
  virtual void shutdown() noexcept = 0;
  // Waits up to `timeout` until every bulk OUT transfer sent so far has
  // reached the board (or failed); false on timeout. Closing waits so for
  // its last messages before shutdown() cancels what is in flight. Links
  // whose sends are done when they return have nothing to wait for.
  virtual bool drain_out(std::chrono::milliseconds timeout) {
    (void)timeout;
    return true;
  }

  // The bulk pipes without a copy, which a link whose transfers have
  // buffers of their own overrides; the defaults stage through bulk_out
  // and bulk_in. One thread sends and one receives at a time.
  //
  // Bulk OUT: out_buffer waits for room to send `bytes` and returns that
  // much memory to fill (empty once the board is gone); send_out(n) then
  // sends its first n bytes (n <= bytes), as bulk_out would.
  virtual std::span<std::byte> out_buffer(std::size_t bytes);
  virtual bool send_out(std::size_t n);
  // Bulk IN: waits for the next bytes received and returns them (empty once
  // the board is gone or shut down); they stay valid, and are returned
  // again, until release_in() gives them back.
  virtual std::span<const std::byte> peek_in();
  virtual void release_in();

 private:
  std::vector<std::byte> out_stage_, in_stage_;  // the defaults' buffers
  std::size_t in_staged_ = 0;
};

// Checks the board's identity (application mode, a payload limit this side
// takes) and starts the link's threads. Throws tpuhal::Error.
std::unique_ptr<Transport> make_usb_transport(std::unique_ptr<UsbLink> link);

}  // namespace tpuhal::tpu
