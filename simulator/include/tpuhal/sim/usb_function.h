// The board side of a USB cable: a simulated board behind the USB firmware
// interface (fw/usb.h, docs/usb.md).
//
// UsbFunction owns a Board whose host memory is reached through messages
// (BoardOptions::host_port) and serves the function's endpoints: it executes
// the host's bulk OUT messages in order (register and device-memory
// accesses, DMA mappings, answers to the board's reads of host memory),
// sends the board's messages on bulk IN (register values, memory data, the
// board's reads and writes of host memory, errors) and turns the board's
// interrupts into interrupt IN notifications that name the last bulk message
// sent before them.
//
// The endpoints are an interface so that the same function runs behind
// Linux's USB gadget framework (FunctionFS: tools/tpuhal-usb-gadget) and
// behind an in-process cable for tests (the usb-sim: devices).
//
// Thread-safety: identity() and reset_link() may be called from any thread
// (they are EP0's requests). The function runs three threads of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "tpuhal/fw/usb.h"
#include "tpuhal/sim/board.h"
#include "tpuhal/sim/profile.h"

namespace tpuhal::sim {

// The function's bulk and interrupt endpoints.
class FunctionEndpoints {
 public:
  virtual ~FunctionEndpoints() = default;
  // Bulk OUT: blocks until some bytes arrive; 0 once the host is gone (the
  // cable was pulled, the gadget unbound) or the endpoints were shut down.
  virtual std::size_t read_out(std::span<std::byte> out) = 0;
  // Bulk IN and interrupt IN: all of `data`, or false once the host is gone.
  virtual bool write_in(std::span<const std::byte> data) = 0;
  virtual bool write_irq(std::span<const std::byte> data) = 0;
  // Bulk IN of `head` then `body` as one transfer; both may be reused once
  // this returns. The default joins them and calls write_in; an
  // endpoint that gathers (FunctionFS's vectored writes) sends them where
  // they lie.
  virtual bool write_in_gather(std::span<const std::byte> head, std::span<const std::byte> body);

  // Bulk OUT without a copy: the bytes received next, where they arrived,
  // valid until release_out(); empty once the host is gone. The default
  // stages them through read_out; an endpoint with buffers of its own (the
  // FunctionFS front end's requests) hands those over instead.
  virtual std::span<const std::byte> peek_out();
  virtual void release_out();

  // Waits until every bulk IN transfer written so far has been taken by the
  // host; false once the host is gone. An endpoint whose writes return only
  // when the host has the bytes (the default) has nothing to wait for; one
  // that queues them (the FunctionFS front end's AIO) waits for its queue.
  virtual bool flush_in() { return true; }

 private:
  std::vector<std::byte> out_stage_, in_stage_;
  std::size_t out_staged_ = 0;
};

struct UsbFunctionOptions {
  // The largest payload per message this side takes and sends.
  std::uint32_t max_data = fw::kUsbMaxData;
  // What the identity reports; the board's own registers say the rest.
  std::uint32_t firmware_version = 0x010000;
  // Loader mode: the board has no firmware yet. It takes only an upload
  // (fw-begin, fw-data, fw-commit), checks the image as the host did
  // (fw::decode_image, check_image_for its board ID and the interface it
  // implements) and answers fw-status; an accepted image is handed to
  // on_firmware, from the function's thread, once the host has taken the
  // answer (FunctionEndpoints::flush_in) or is gone: the front end may then
  // detach at once and re-enumerate as the application device.
  bool loader = false;
  std::function<void(std::vector<std::byte> image)> on_firmware;
};

class UsbFunction {
 public:
  // Creates the board (throws ProfileError, std::system_error) and starts
  // serving `endpoints`, which must outlive the function.
  UsbFunction(BoardProfile profile, FunctionEndpoints& endpoints, UsbFunctionOptions options = {});
  // Stops serving: the endpoints must already return 0 from read_out (shut
  // down or disconnected), or this waits until they do.
  ~UsbFunction();
  UsbFunction(const UsbFunction&) = delete;
  UsbFunction& operator=(const UsbFunction&) = delete;

  // EP0 kUsbGetIdentity.
  fw::UsbIdentity identity() const noexcept;
  // EP0 kUsbResetLink: drops a partially received message.
  void reset_link() noexcept;

  Board& board() noexcept;

  // Counters for tests and tools.
  struct Stats {
    std::uint64_t host_messages = 0;  // executed
    std::uint64_t refused = 0;        // answered with kError
    std::uint64_t host_reads = 0;     // kHostRead sent
    std::uint64_t host_writes = 0;    // kHostWrite sent
    std::uint64_t interrupts = 0;     // notifications sent
  };
  Stats stats() const noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpuhal::sim
