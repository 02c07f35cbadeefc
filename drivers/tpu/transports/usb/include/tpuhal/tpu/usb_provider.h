// The "usb" provider: TPU boards on a USB cable, through libusb.
//
//   usb:BUS-PORT        the board at that bus and port path ("usb:1-1",
//                       "usb:3-1.4"), as `tpuhal list` and lsusb -t show it
//
// enumerate() lists the USB devices whose vendor:product ID is a known
// board (known_usb_boards()) or named in TPUHAL_USB_IDS
// ("vvvv:pppp[/llll],...": application product, and the loader's if the
// board has one), for boards under bring-up. A board found in loader mode
// is listed with "(loader: firmware needed)" and refuses to open until its
// firmware is uploaded (tpuhal::upload_firmware, `tpuhal firmware`).
// See docs/usb.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tpuhal/driver/driver.hpp"
#include "tpuhal/tpu/usb_transport.h"

namespace tpuhal::tpu {

struct KnownUsbBoard {
  std::uint16_t vendor = 0;
  std::uint16_t product = 0;         // application firmware
  std::uint16_t loader_product = 0;  // no firmware yet (0: the board has no loader mode)
  std::string name;
};

// The boards this driver recognises, and those TPUHAL_USB_IDS adds. Throws
// Status::InvalidArgument naming a malformed entry.
std::vector<KnownUsbBoard> known_usb_boards();

std::shared_ptr<driver::Provider> make_usb_provider();

// Opens the libusb link to the board at `location` ("1-1"): claims its
// interface and finds its endpoints. Throws tpuhal::Error (NotFound, Busy,
// PermissionDenied with what to do, DeviceLost).
std::unique_ptr<UsbLink> open_libusb_link(const std::string& location);

// libusb transfers allocated by every link in this process and not yet
// freed: 0 once every usb: device is closed (a link's close waits for each
// of its transfers to complete or be cancelled, then frees them).
std::size_t usb_transfers_outstanding() noexcept;

// Uploads a firmware image to the board in loader mode at `location`: checks
// the image first (fw::decode_image, check_image_for the board's ID), sends
// it, waits for the board's verdict, then for it to come back in application
// mode within `timeout`. Throws tpuhal::Error saying what was wrong.
void upload_usb_firmware(const std::string& location, std::span<const std::byte> image,
                         std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace tpuhal::tpu
