#include <libusb.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "tpuhal/base/env.h"
#include "tpuhal/fw/image.h"
#include "tpuhal/fw/regs.h"
#include "tpuhal/fw/usb.h"
#include "tpuhal/fw/version.h"
#include "tpuhal/tpu/device.h"
#include "tpuhal/tpu/usb_provider.h"

namespace tpuhal::tpu {
namespace {

using namespace std::chrono_literals;

// The simulator's USB gadget (tools/tpuhal-usb-gadget) enumerates with
// pid.codes' test IDs; a board vendor's own IDs go here.
const KnownUsbBoard kBuiltinBoards[] = {
    {fw::kUsbSimVendor, fw::kUsbSimProduct, fw::kUsbSimLoaderProduct, "tpuhal-usb-gadget (simulated board)"},
};

struct Found {
  std::string location;
  std::uint16_t vendor, product;
  const KnownUsbBoard* board;
  bool loader;
};

// Lists the known boards present, by walking libusb's device list.
std::vector<Found> scan(const std::vector<KnownUsbBoard>& known) {
  libusb_context* ctx = nullptr;
  if (libusb_init(&ctx) != 0) return {};  // no usbfs here: no USB boards
  libusb_device** list = nullptr;
  const ssize_t n = libusb_get_device_list(ctx, &list);
  std::vector<Found> out;
  for (ssize_t i = 0; i < n; ++i) {
    libusb_device_descriptor dd{};
    if (libusb_get_device_descriptor(list[i], &dd) != 0) continue;
    for (const KnownUsbBoard& b : known) {
      const bool app = dd.idVendor == b.vendor && dd.idProduct == b.product;
      const bool loader = dd.idVendor == b.vendor && b.loader_product && dd.idProduct == b.loader_product;
      if (!app && !loader) continue;
      std::uint8_t ports[8];
      const int np = libusb_get_port_numbers(list[i], ports, 8);
      std::string loc = std::to_string(libusb_get_bus_number(list[i])) + "-";
      for (int p = 0; p < np; ++p) loc += (p ? "." : "") + std::to_string(ports[p]);
      if (np <= 0) loc += "0";
      out.push_back({loc, dd.idVendor, dd.idProduct, &b, loader});
      break;
    }
  }
  if (n >= 0) libusb_free_device_list(list, 1);
  libusb_exit(ctx);
  return out;
}

class UsbProvider final : public driver::Provider {
 public:
  std::string_view scheme() const override { return "usb"; }

  std::vector<DeviceInfo> enumerate() override {
    const auto known = known_usb_boards();
    std::vector<DeviceInfo> out;
    for (const Found& f : scan(known))
      out.push_back({"usb:" + f.location, "tpu-usb", f.board->name + (f.loader ? " (loader: firmware needed)" : ""), 0});
    return out;
  }

  std::shared_ptr<driver::DeviceBackend> open(std::string_view uri) override {
    const std::string location = location_of(uri);
    try {
      return open_device(make_usb_transport(open_libusb_link(location)), std::string(uri), "tpu-usb");
    } catch (const Error& e) {
      std::string what = e.what();
      const std::string prefix = "usb " + location;
      if (what.rfind(prefix, 0) == 0) what = what.substr(prefix.size());
      throw Error(e.status(), std::string(uri) + (what.rfind(":", 0) == 0 || what.rfind(" (", 0) == 0 ? "" : ": ") + what);
    }
  }

  void upload_firmware(std::string_view uri, std::span<const std::byte> image,
                       std::chrono::milliseconds timeout) override {
    upload_usb_firmware(location_of(uri), image, timeout);
  }

 private:
  static std::string location_of(std::string_view uri) {
    std::string location(uri.substr(uri.find(':') + 1));
    if (location.empty() || location.find('-') == std::string::npos)
      throw Error(Status::InvalidArgument,
                  "device URI '" + std::string(uri) + "' names no USB port; use usb:BUS-PORT (e.g. usb:1-1)");
    return location;
  }
};

// The board's answer to an upload: the next fw-status (or error) on bulk IN.
fw::UsbMessage await_status(UsbLink& link, std::vector<std::byte>& buf, const std::string& who) {
  std::size_t used = 0;
  buf.resize(2 * (sizeof(fw::UsbHeader) + fw::kUsbMaxData));
  for (;;) {
    if (used >= sizeof(fw::UsbHeader)) {
      auto len = fw::usb_message_bytes({buf.data(), used}, fw::UsbDirection::kToHost);
      if (!len) throw Error(Status::DeviceLost, who + ": " + fw::describe_usb_problem(len.problem()));
      if (used >= *len) {
        auto m = fw::decode_usb_message({buf.data(), *len}, fw::UsbDirection::kToHost, fw::kBar0Size);
        if (!m) throw Error(Status::DeviceLost, who + ": " + fw::describe_usb_problem(m.problem()));
        if (m->type == fw::UsbType::kFwStatus || m->type == fw::UsbType::kError) return *m;
        std::memmove(buf.data(), buf.data() + *len, used - *len);
        used -= *len;
        continue;
      }
    }
    const std::size_t n = link.bulk_in({buf.data() + used, buf.size() - used});
    if (n == 0) throw Error(Status::DeviceLost, who + ": the board went away during the upload");
    used += n;
  }
}

}  // namespace

std::vector<KnownUsbBoard> known_usb_boards() {
  std::vector<KnownUsbBoard> out(std::begin(kBuiltinBoards), std::end(kBuiltinBoards));
  for (const std::string& item : base::env_list("TPUHAL_USB_IDS")) {
    unsigned v = 0, p = 0, l = 0;
    int used = 0, more = 0;
    const bool pair = std::sscanf(item.c_str(), "%4x:%4x%n", &v, &p, &used) == 2;
    const bool ok = pair && (used == static_cast<int>(item.size()) ||
                             (std::sscanf(item.c_str() + used, "/%4x%n", &l, &more) == 1 &&
                              used + more == static_cast<int>(item.size()) && l != 0));
    if (!ok)
      throw Error(Status::InvalidArgument, "TPUHAL_USB_IDS: '" + item +
                                               "' is not VENDOR:PRODUCT[/LOADER_PRODUCT] in hex (e.g. 1209:0001/0002)");
    out.push_back({static_cast<std::uint16_t>(v), static_cast<std::uint16_t>(p), static_cast<std::uint16_t>(l),
                   "board under bring-up (TPUHAL_USB_IDS)"});
  }
  return out;
}

std::shared_ptr<driver::Provider> make_usb_provider() { return std::make_shared<UsbProvider>(); }

void upload_usb_firmware(const std::string& location, std::span<const std::byte> image,
                         std::chrono::milliseconds timeout) {
  const std::string who = "usb:" + location;
  auto decoded = fw::decode_image(image);
  if (!decoded) throw Error(Status::InvalidArgument, who + ": " + fw::describe_image_problem(decoded.problem()));
  std::vector<std::byte> buf;
  {
    auto link = open_libusb_link(location);
    std::byte raw[sizeof(fw::UsbIdentity)];
    auto id = fw::decode_usb_identity({raw, link->control_in(fw::kUsbGetIdentity, raw)});
    if (!id) throw Error(Status::DeviceLost, who + ": the board's identity is malformed: " + fw::describe_usb_problem(id.problem()));
    if (id->mode != static_cast<std::uint32_t>(fw::UsbMode::kLoader))
      throw Error(Status::FailedPrecondition, who + ": the board already runs its firmware (application mode); "
                                                    "unplug it or reset it into its loader to upload");
    auto fits = fw::check_image_for(std::move(decoded), id->board_id, fw::kInterfaceVersion);
    if (!fits) throw Error(Status::InvalidArgument, who + ": " + fw::describe_image_problem(fits.problem()));
    link->control_out(fw::kUsbResetLink);
    for (const auto& transfer : fw::usb_upload_transfers(image, id->max_data, fits->crc32c, 1))
      if (!link->bulk_out(transfer)) throw Error(Status::DeviceLost, who + ": the board went away during the upload");
    // A loader that takes the image but never answers must not hold the
    // caller: once `timeout` has passed the link is shut down, which ends
    // the wait.
    std::mutex mu;
    std::condition_variable cv;
    bool answered = false, timed_out = false;
    std::thread watchdog([&] {
      std::unique_lock lock(mu);
      if (cv.wait_for(lock, timeout, [&] { return answered; })) return;
      timed_out = true;
      link->shutdown();
    });
    std::optional<fw::UsbMessage> verdict;
    std::exception_ptr failed;
    try {
      verdict = await_status(*link, buf, who);
    } catch (...) {
      failed = std::current_exception();
    }
    {
      std::lock_guard lock(mu);
      answered = true;
    }
    cv.notify_all();
    watchdog.join();
    if (!verdict && timed_out)
      throw Error(Status::Timeout, who + ": the loader did not answer the upload within " +
                                       std::to_string(timeout.count()) + " ms");
    if (failed) std::rethrow_exception(failed);
    if (verdict->type == fw::UsbType::kError)
      throw Error(Status::DeviceFault, who + ": the loader refused a " +
                                           fw::to_string(static_cast<fw::UsbType>(verdict->arg[1])) + " message (" +
                                           fw::to_string(static_cast<fw::CmdStatus>(verdict->arg[0])) + ")");
    const auto status = static_cast<fw::CmdStatus>(verdict->arg[0] & 0xFFFFFFFF);
    if (status != fw::CmdStatus::kOk)
      throw Error(Status::DeviceFault,
                  who + ": the loader refused the image: " +
                      fw::describe_image_problem({status, static_cast<std::uint16_t>(verdict->arg[0] >> 32), verdict->arg[1], 0}));
  }
  // The board detaches and comes back with its application identity: done
  // once it answers as the application.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto known = known_usb_boards();
  while (std::chrono::steady_clock::now() < deadline) {
    for (const Found& f : scan(known)) {
      if (f.location != location || f.loader) continue;
      try {
        auto link = open_libusb_link(location);
        std::byte raw[sizeof(fw::UsbIdentity)];
        auto id = fw::decode_usb_identity({raw, link->control_in(fw::kUsbGetIdentity, raw)});
        if (id && id->mode == static_cast<std::uint32_t>(fw::UsbMode::kApplication)) return;
      } catch (const Error&) {
        // still enumerating
      }
    }
    std::this_thread::sleep_for(50ms);
  }
  throw Error(Status::Timeout, who + ": the board took the firmware but did not come back in application mode within " +
                                   std::to_string(timeout.count()) + " ms");
}

}  // namespace tpuhal::tpu
