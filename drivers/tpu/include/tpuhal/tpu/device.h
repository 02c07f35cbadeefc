// The TPU board driver: the driver interface implemented over a Transport.
//
// TpuDevice::open() runs the bring-up sequence (identify, negotiate the
// interface version, read the board's memory map and queues), builds heaps
// from the board's memory regions and starts the interrupt thread. Queues
// write descriptors into rings in device memory, ring doorbells, and complete
// through the fence values and interrupts the board writes back
// (firmware_iface/include/tpuhal/fw/command.h describes the protocol).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "tpuhal/driver/driver.hpp"
#include "tpuhal/fw/command.h"
#include "tpuhal/tpu/transport.h"

namespace tpuhal::tpu {

class TpuDevice;

// Opens the board behind `transport` as device `uri`; `driver_name` goes in
// the device's properties ("tpu-sim", "tpu-pcie").
std::shared_ptr<driver::DeviceBackend> open_device(std::unique_ptr<Transport> transport, std::string uri,
                                                   std::string driver_name);

// "firmware interface MAJOR.MINOR": the interface this driver encodes for
// (fw::kInterfaceVersion), what a TPU transport's Provider::protocol() says.
std::string interface_protocol();

// Raw ring access for conformance tests and board bring-up tools: submits
// hand-built descriptors (sequence numbers are filled in) to the queue
// behind `queue`, bypassing the HAL's checks. The last descriptor gets
// kFlagFence | kFlagInterrupt and the submission's timeline value. Returns
// that value.
std::uint64_t submit_raw(driver::QueueBackend& queue, std::span<const fw::CommandDescriptor> descriptors);

// Device address of a queue's timeline word (for hand-built kWaitValue).
std::uint64_t timeline_address(driver::QueueBackend& queue);

}  // namespace tpuhal::tpu
