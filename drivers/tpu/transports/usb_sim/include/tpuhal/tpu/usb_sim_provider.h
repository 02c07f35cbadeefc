// The "usb-sim" provider: simulated boards on an in-process USB cable.
//
//   usb-sim:N          the Nth board listed in TPUHAL_USB_SIM_BOARDS (a comma-
//                      separated list of profiles; default none)
//   usb-sim:PROFILE    a board of that profile ("usb-sim:tiny")
//
// The board runs behind the simulator's USB function (sim::UsbFunction) and
// the driver reaches it through the USB transport, so every register
// access, aperture write, DMA and interrupt travels as the USB firmware
// interface's messages (docs/usb.md) over socket pairs standing in for the
// bulk and interrupt pipes. Only the host controller is missing: the same
// function runs behind Linux's USB gadget framework for that
// (tools/tpuhal-usb-gadget).
#pragma once

#include <memory>
#include <string_view>

#include "tpuhal/driver/driver.hpp"

namespace tpuhal::sim {
class Board;
class UsbFunction;
}  // namespace tpuhal::sim

namespace tpuhal::tpu {

std::shared_ptr<driver::Provider> make_usb_sim_provider();

// The board behind an open usb-sim device, or null.
std::shared_ptr<sim::UsbFunction> usb_sim_function_of(std::string_view uri);
// Pulls the cable of an open usb-sim device: both ends see their transfers
// end, as when a stick is unplugged. False if no such device is open.
bool usb_sim_unplug(std::string_view uri);

}  // namespace tpuhal::tpu
