// The UsbLink on libusb: a board's interface claimed through usbfs, bulk IN
// kept busy with several transfers in flight, bulk OUT sent as asynchronous
// transfers with a window in flight, interrupt IN read by one transfer
// resubmitted as it is read. One thread runs libusb's event loop.
//
// Bulk transfers use usbfs's own memory where the kernel offers it
// (libusb_dev_mem_alloc): the host controller then reads and writes the
// buffers the transport fills and parses, with no copy through the kernel.
// A received transfer is handed to the reader as it is and resubmitted when
// the reader gives it back, so a slow reader holds the board back instead
// of letting buffers pile up.
#include <libusb.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "tpuhal/base/log.h"
#include "tpuhal/fw/image.h"
#include "tpuhal/fw/usb.h"
#include "tpuhal/fw/version.h"
#include "tpuhal/tpu/device.h"
#include "tpuhal/tpu/usb_provider.h"

namespace tpuhal::tpu {
namespace {

using namespace std::chrono_literals;

constexpr int kBulkIn = 4;       // bulk IN transfers
constexpr int kInFlightOut = 4;  // bulk OUT transfers allowed in flight
// OUT transfers: those in flight, the last byte of one sent apart, and the
// one being filled.
constexpr int kBulkOut = kInFlightOut + 2;
// Bulk transfer size: a whole message (header and largest payload) fits,
// and it is a multiple of every max packet size.
constexpr std::size_t kBulkBytes = fw::kUsbTransferBytes;
constexpr unsigned kControlTimeoutMs = 2000;
// bmRequestType of the board's vendor requests, to its interface.
constexpr std::uint8_t kVendorIn = static_cast<std::uint8_t>(LIBUSB_ENDPOINT_IN) |
                                   static_cast<std::uint8_t>(LIBUSB_REQUEST_TYPE_VENDOR) |
                                   static_cast<std::uint8_t>(LIBUSB_RECIPIENT_INTERFACE);
constexpr std::uint8_t kVendorOut = static_cast<std::uint8_t>(LIBUSB_ENDPOINT_OUT) |
                                    static_cast<std::uint8_t>(LIBUSB_REQUEST_TYPE_VENDOR) |
                                    static_cast<std::uint8_t>(LIBUSB_RECIPIENT_INTERFACE);

std::string usb_error(int rc) { return libusb_strerror(static_cast<libusb_error>(rc)); }

// Why a transfer could not be submitted. usbfs lends every process on the
// machine 16 MiB in all by default, and each open board keeps about 11 MiB
// of transfers.
std::string submit_error(int rc) {
  std::string why = usb_error(rc);
  if (rc == LIBUSB_ERROR_NO_MEM)
    why +=
        " (usbfs's memory for transfers is used up: other usb: boards or USB programs hold it; raise "
        "/sys/module/usbcore/parameters/usbfs_memory_mb, see docs/usb.md)";
  return why;
}

// Transfers allocated and not yet freed, by every link in the process.
std::atomic<std::size_t> g_transfers{0};

// A libusb context per link: its device list is fresh when it is created
// (a context kept across a board's unplug and return would list the board
// that left), and its event thread serves only this link's transfers.
struct Context {
  libusb_context* ctx = nullptr;
  Context() {
    if (const int rc = libusb_init(&ctx); rc != 0)
      throw Error(Status::Unavailable, "libusb: cannot initialise: " + usb_error(rc));
  }
  ~Context() { libusb_exit(ctx); }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
};

// "1-1.4": bus, then the port path.
std::string location_of(libusb_device* d) {
  std::uint8_t ports[8];
  const int n = libusb_get_port_numbers(d, ports, 8);
  std::string s = std::to_string(libusb_get_bus_number(d)) + "-";
  for (int i = 0; i < n; ++i) s += (i ? "." : "") + std::to_string(ports[i]);
  if (n <= 0) s += "0";
  return s;
}

struct DeviceList {
  libusb_device** list = nullptr;
  ssize_t count = 0;
  explicit DeviceList(libusb_context* ctx) {
    count = libusb_get_device_list(ctx, &list);
    if (count < 0)
      throw Error(Status::Unavailable, "libusb: cannot list devices: " + usb_error(static_cast<int>(count)));
  }
  ~DeviceList() { libusb_free_device_list(list, 1); }
  std::span<libusb_device*> devices() const { return {list, static_cast<std::size_t>(count)}; }
};

class LibusbLink final : public UsbLink {
 public:
  explicit LibusbLink(const std::string& location) : location_(location) {
    DeviceList all(context_.ctx);
    libusb_device* found = nullptr;
    for (libusb_device* d : all.devices())
      if (location_of(d) == location) found = d;
    if (!found) throw Error(Status::NotFound, "no USB device at " + location + " (see `tpuhal list` or lsusb -t)");
    libusb_device_descriptor dd{};
    libusb_get_device_descriptor(found, &dd);
    ids_ = dd;
    int rc = libusb_open(found, &handle_);
    if (rc == LIBUSB_ERROR_ACCESS) {
      char node[32];  // usbfs names them with three digits: /dev/bus/usb/001/005
      std::snprintf(node, sizeof node, "/dev/bus/usb/%03u/%03u", libusb_get_bus_number(found),
                    libusb_get_device_address(found));
      throw Error(Status::PermissionDenied, "usb " + location + ": no permission to open " + node +
                                                " (run as root, or add a udev rule granting it; docs/usb.md)");
    }
    if (rc != 0) throw Error(Status::DeviceLost, "usb " + location + ": cannot open: " + usb_error(rc));
    try {
      find_endpoints(found);
      libusb_set_auto_detach_kernel_driver(handle_, 1);
      rc = libusb_claim_interface(handle_, interface_);
      if (rc == LIBUSB_ERROR_BUSY)
        throw Error(Status::ResourceExhausted,
                    "usb " + location + ": the board's interface is claimed by another process");
      if (rc != 0)
        throw Error(Status::DeviceLost, "usb " + location + ": cannot claim its interface: " + usb_error(rc));
      claimed_ = true;
    } catch (...) {
      close();
      throw;
    }
    // Every transfer is made here, before the event thread starts: the
    // thread then sees them whole (libusb's own handover goes through the
    // kernel, which ThreadSanitizer cannot follow).
    std::vector<libusb_transfer*> in;
    try {
      for (int i = 0; i < kBulkIn; ++i) in.push_back(allocate(ep_in_, kBulkBytes, LIBUSB_TRANSFER_TYPE_BULK));
      in.push_back(allocate(ep_irq_, irq_bytes_, LIBUSB_TRANSFER_TYPE_INTERRUPT));
      for (int i = 0; i < kBulkOut; ++i) idle_.push_back(allocate(ep_out_, kBulkBytes, LIBUSB_TRANSFER_TYPE_BULK));
    } catch (...) {
      for (auto& [t, info] : info_) free_transfer(t, info);
      close();
      throw;
    }
    base::logger("tpu")->debug("{}: bulk transfers in {}", bus(),
                               device_memory_ ? "usbfs memory (no copy through the kernel)" : "heap memory");
    events_ = std::thread([this] { run_events(); });
    // The IN transfers wait for the first read: the driver resets the link
    // first (kUsbResetLink), and whatever a previous host left queued on
    // the board's side is dropped then, instead of reaching this one.
    std::lock_guard lock(mu_);
    unstarted_in_ = std::move(in);
  }

  ~LibusbLink() override {
    shutdown();
    {
      std::unique_lock lock(mu_);
      // Every transfer comes back (completed or cancelled) before the
      // handle closes: none is left outstanding.
      cv_.wait(lock, [&] { return in_flight_ == 0; });
      stop_events_ = true;
    }
    libusb_interrupt_event_handler(context_.ctx);
    events_.join();
    for (auto& [t, info] : info_) free_transfer(t, info);
    close();
  }

  std::string bus() const override {
    char ids[16];
    std::snprintf(ids, sizeof ids, "%04x:%04x", ids_.idVendor, ids_.idProduct);
    return "usb " + location_ + " (" + ids + ")";
  }

  std::size_t control_in(std::uint8_t request, std::span<std::byte> out) override {
    const int rc = libusb_control_transfer(handle_, kVendorIn, request, 0, static_cast<std::uint16_t>(interface_),
                                           reinterpret_cast<unsigned char*>(out.data()),
                                           static_cast<std::uint16_t>(out.size()), kControlTimeoutMs);
    if (rc < 0)
      throw Error(Status::DeviceLost,
                  bus() + ": control request " + std::to_string(request) + " failed: " + usb_error(rc));
    return static_cast<std::size_t>(rc);
  }

  void control_out(std::uint8_t request) override {
    const int rc = libusb_control_transfer(handle_, kVendorOut, request, 0, static_cast<std::uint16_t>(interface_),
                                           nullptr, 0, kControlTimeoutMs);
    if (rc < 0)
      throw Error(Status::DeviceLost,
                  bus() + ": control request " + std::to_string(request) + " failed: " + usb_error(rc));
  }

  bool bulk_out(std::span<const std::byte> data) override {
    std::span<std::byte> to = out_buffer(data.size());
    if (to.size() < data.size()) return false;
    std::memcpy(to.data(), data.data(), data.size());
    return send_out(data.size());
  }

  std::span<std::byte> out_buffer(std::size_t bytes) override {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return out_in_flight_ < kInFlightOut || ended_; });
    if (ended_) return {};
    filling_ = take_idle(bytes);
    if (!filling_) return {};
    return {reinterpret_cast<std::byte*>(filling_->buffer), bytes};
  }

  bool send_out(std::size_t n) override {
    std::lock_guard lock(mu_);
    libusb_transfer* t = std::exchange(filling_, nullptr);
    if (!t) return false;
    if (ended_) {
      idle_.push_back(t);
      return false;
    }
    // A transfer whose length is a multiple of the packet size would not end
    // on the board's side (no short packet): its last byte goes apart.
    if (n > 1 && n % max_packet_out_ == 0) {
      libusb_transfer* last = take_idle(1);
      if (!last) {
        idle_.push_back(t);
        return false;
      }
      last->buffer[0] = t->buffer[n - 1];
      if (!submit_out(t, n - 1)) {
        idle_.push_back(last);
        return false;
      }
      return submit_out(last, 1);
    }
    return submit_out(t, n);
  }

  std::size_t bulk_in(std::span<std::byte> out) override {
    std::span<const std::byte> got = peek_in();
    std::lock_guard lock(mu_);
    const std::size_t n = std::min(out.size(), got.size());
    if (n == 0 || bulk_ready_.empty()) return 0;
    std::memcpy(out.data(), got.data(), n);
    bulk_offset_ += n;
    if (bulk_offset_ == static_cast<std::size_t>(bulk_ready_.front()->actual_length)) release_locked(bulk_ready_);
    return n;
  }

  std::span<const std::byte> peek_in() override {
    std::unique_lock lock(mu_);
    start_in_locked();
    cv_.wait(lock, [&] { return !bulk_ready_.empty() || drained_locked(ep_in_); });
    // What came before the board went away is still read: a loader's
    // verdict, say, sent just before it detaches to re-enumerate. After
    // shutdown() nothing is.
    if (bulk_ready_.empty() || closing_) return {};
    // The front transfer stays out of libusb's hands until release_in, so
    // its buffer may be read without the lock.
    libusb_transfer* t = bulk_ready_.front();
    return {reinterpret_cast<const std::byte*>(t->buffer) + bulk_offset_,
            static_cast<std::size_t>(t->actual_length) - bulk_offset_};
  }

  void release_in() override {
    std::lock_guard lock(mu_);
    if (!bulk_ready_.empty()) release_locked(bulk_ready_);
  }

  // One notification per call.
  std::size_t interrupt_in(std::span<std::byte> out) override {
    std::unique_lock lock(mu_);
    start_in_locked();
    cv_.wait(lock, [&] { return !irq_ready_.empty() || drained_locked(ep_irq_); });
    if (irq_ready_.empty() || closing_) return 0;  // as peek_in
    libusb_transfer* t = irq_ready_.front();
    const std::size_t n = std::min(out.size(), static_cast<std::size_t>(t->actual_length));
    std::memcpy(out.data(), t->buffer, n);
    release_locked(irq_ready_);
    return n;
  }

  bool drain_out(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return out_in_flight_ == 0 || ended_; });
  }

  void shutdown() noexcept override {
    std::lock_guard lock(mu_);
    closing_ = true;
    end_locked("");
  }

 private:
  struct TransferInfo {
    std::size_t bytes;   // the buffer's size
    bool device_memory;  // from libusb_dev_mem_alloc, else malloc
  };

  void find_endpoints(libusb_device* d) {
    libusb_config_descriptor* config = nullptr;
    if (const int rc = libusb_get_active_config_descriptor(d, &config); rc != 0)
      throw Error(Status::DeviceLost, "usb " + location_ + ": no active configuration: " + usb_error(rc));
    for (int i = 0; i < config->bNumInterfaces && ep_in_ == 0; ++i) {
      const libusb_interface_descriptor& id = config->interface[i].altsetting[0];
      std::uint8_t in = 0, out = 0, irq = 0;
      int out_packet = 0, irq_packet = 0;
      for (int e = 0; e < id.bNumEndpoints; ++e) {
        const libusb_endpoint_descriptor& ep = id.endpoint[e];
        const int type = ep.bmAttributes & LIBUSB_TRANSFER_TYPE_MASK;
        const bool is_in = ep.bEndpointAddress & LIBUSB_ENDPOINT_IN;
        if (type == LIBUSB_TRANSFER_TYPE_BULK && is_in && !in) in = ep.bEndpointAddress;
        if (type == LIBUSB_TRANSFER_TYPE_BULK && !is_in && !out) {
          out = ep.bEndpointAddress;
          out_packet = ep.wMaxPacketSize & 0x7FF;
        }
        if (type == LIBUSB_TRANSFER_TYPE_INTERRUPT && is_in && !irq) {
          irq = ep.bEndpointAddress;
          irq_packet = ep.wMaxPacketSize & 0x7FF;
        }
      }
      if (in && out && irq) {
        interface_ = id.bInterfaceNumber;
        ep_in_ = in;
        ep_out_ = out;
        ep_irq_ = irq;
        max_packet_out_ = out_packet > 0 ? static_cast<std::size_t>(out_packet) : 512;
        // One packet per interrupt transfer: each notification is a whole
        // packet, so a longer transfer would gather several.
        irq_bytes_ = irq_packet > 0 ? static_cast<std::size_t>(irq_packet) : sizeof(fw::UsbInterrupt);
      }
    }
    libusb_free_config_descriptor(config);
    if (!ep_in_)
      throw Error(Status::NotFound, "usb " + location_ +
                                        ": no interface with a bulk IN, a bulk OUT and an interrupt IN endpoint; "
                                        "is this a tpuhal board?");
  }

  // A transfer on `ep` with a buffer of `bytes`: usbfs memory for bulk
  // transfers where the kernel has it to give, else the heap.
  libusb_transfer* allocate(std::uint8_t ep, std::size_t bytes, std::uint8_t type) {
    libusb_transfer* t = libusb_alloc_transfer(0);
    if (!t) throw Error(Status::OutOfMemory, bus() + ": cannot allocate a USB transfer");
    g_transfers.fetch_add(1);
    TransferInfo info{bytes, false};
    unsigned char* buffer = nullptr;
    if (type == LIBUSB_TRANSFER_TYPE_BULK && device_memory_) {
      buffer = libusb_dev_mem_alloc(handle_, bytes);
      if (buffer)
        info.device_memory = true;
      else
        device_memory_ = false;  // none (left): the heap from now on
    }
    if (!buffer) buffer = static_cast<unsigned char*>(std::malloc(bytes));
    if (!buffer) {
      g_transfers.fetch_sub(1);
      libusb_free_transfer(t);
      throw Error(Status::OutOfMemory, bus() + ": cannot allocate a USB transfer buffer");
    }
    t->dev_handle = handle_;
    t->endpoint = ep;
    t->type = type;
    t->timeout = 0;
    t->buffer = buffer;
    t->length = static_cast<int>(bytes);
    t->callback = &LibusbLink::on_complete;
    t->user_data = this;
    info_[t] = info;
    return t;
  }
  void free_transfer(libusb_transfer* t, const TransferInfo& info) {
    if (info.device_memory)
      libusb_dev_mem_free(handle_, t->buffer, info.bytes);
    else
      std::free(t->buffer);
    t->buffer = nullptr;
    libusb_free_transfer(t);
    g_transfers.fetch_sub(1);
  }

  // An idle OUT transfer for `bytes`, or null, ending the link, if the
  // message is larger than a transfer (mu_ held). kBulkOut of them cover
  // every transfer the window lets be busy at once.
  libusb_transfer* take_idle(std::size_t bytes) {
    auto it = std::find_if(idle_.begin(), idle_.end(), [&](libusb_transfer* t) { return t->endpoint == ep_out_; });
    if (it == idle_.end() || bytes > kBulkBytes) {
      end_locked("no bulk OUT transfer for a message of " + std::to_string(bytes) + " bytes");
      return nullptr;
    }
    libusb_transfer* t = *it;
    idle_.erase(it);
    return t;
  }

  bool submit_out(libusb_transfer* t, std::size_t n) {
    t->length = static_cast<int>(n);
    ++out_in_flight_;
    ++in_flight_;
    if (const int rc = libusb_submit_transfer(t); rc != 0) {
      --out_in_flight_;
      --in_flight_;
      idle_.push_back(t);
      end_locked("a bulk OUT transfer could not be submitted: " + submit_error(rc));
      return false;
    }
    return true;
  }

  // Nothing more will be read from IN endpoint `ep` (mu_ held): the link
  // has ended and each of the endpoint's transfers has come back. A
  // transfer the board answered just before it went away may still be on
  // its way to completed(), behind the failed submission that ended the
  // link: the loader's verdict, when it detaches to re-enumerate at once.
  // After shutdown() nothing is read, so nothing is waited for.
  bool drained_locked(std::uint8_t ep) const {
    return ended_ && (closing_ || (ep == ep_irq_ ? irq_in_flight_ : bulk_in_flight_) == 0);
  }

  // Gives the front received transfer back to libusb (mu_ held).
  void release_locked(std::deque<libusb_transfer*>& ready) {
    libusb_transfer* t = ready.front();
    ready.pop_front();
    if (&ready == &bulk_ready_) bulk_offset_ = 0;
    resubmit_locked(t);
  }

  // Submits an IN transfer for its whole buffer (mu_ held).
  void resubmit_locked(libusb_transfer* t) {
    if (ended_) {
      idle_.push_back(t);
      return;
    }
    t->length = static_cast<int>(info_[t].bytes);
    int& reading = t->endpoint == ep_irq_ ? irq_in_flight_ : bulk_in_flight_;
    ++in_flight_;
    ++reading;
    if (const int rc = libusb_submit_transfer(t); rc != 0) {
      --in_flight_;
      --reading;
      idle_.push_back(t);
      end_locked("an IN transfer could not be submitted: " + submit_error(rc));
    }
  }

  static void LIBUSB_CALL on_complete(libusb_transfer* t) { static_cast<LibusbLink*>(t->user_data)->completed(t); }

  void completed(libusb_transfer* t) {
    const bool is_out = t->endpoint == ep_out_;
    const bool is_irq = t->endpoint == ep_irq_;
    std::unique_lock lock(mu_);
    --in_flight_;
    if (is_out) --out_in_flight_;
    if (!is_out) --(is_irq ? irq_in_flight_ : bulk_in_flight_);
    const bool ok = t->status == LIBUSB_TRANSFER_COMPLETED;
    if (!ok && !ended_) {
      end_locked(t->status == LIBUSB_TRANSFER_NO_DEVICE
                     ? "the board was disconnected"
                     : std::string("a transfer ended with ") + libusb_error_name(t->status));
    }
    // What an IN transfer received is read even if the link has ended
    // since (peek_in), and even if the transfer was cancelled as it ended:
    // the board may have answered it before the end (libusb then reports
    // the cancellation with the bytes). After an IN transfer fails, nothing
    // later on its endpoint is read: bytes after a gap would join a message
    // cut by it.
    bool& gap = is_irq ? irq_gap_ : bulk_gap_;
    const bool keep =
        !is_out && !closing_ && !gap && t->actual_length > 0 && (ok || t->status == LIBUSB_TRANSFER_CANCELLED);
    if (!ok && !is_out) gap = true;
    cv_.notify_all();
    if (keep) {
      (is_irq ? irq_ready_ : bulk_ready_).push_back(t);  // to the reader, then back
      return;
    }
    if (is_out || !ok || closing_ || gap) {
      idle_.push_back(t);
      return;
    }
    resubmit_locked(t);  // nothing came (a zero-length packet)
  }

  // Submits the IN transfers held back until the first read (mu_ held);
  // once the link has ended they go idle instead.
  void start_in_locked() {
    for (libusb_transfer* t : std::exchange(unstarted_in_, {})) resubmit_locked(t);
  }

  // The link is over: wake everyone, cancel what is in flight (mu_ held).
  void end_locked(const std::string& why) {
    if (!why.empty() && !closing_ && !ended_) base::logger("tpu")->error("{}: {}", bus(), why);
    ended_ = true;
    // Received transfers stay where they are until close: a reader may be
    // reading one.
    for (auto& [t, info] : info_) {
      const bool held = std::find(idle_.begin(), idle_.end(), t) != idle_.end() ||
                        std::find(bulk_ready_.begin(), bulk_ready_.end(), t) != bulk_ready_.end() ||
                        std::find(irq_ready_.begin(), irq_ready_.end(), t) != irq_ready_.end() ||
                        std::find(unstarted_in_.begin(), unstarted_in_.end(), t) != unstarted_in_.end() ||
                        t == filling_;
      if (!held) libusb_cancel_transfer(t);
    }
    cv_.notify_all();
  }

  void run_events() {
    for (;;) {
      {
        std::lock_guard lock(mu_);
        if (stop_events_) return;
      }
      timeval tv{0, 100000};
      libusb_handle_events_timeout_completed(context_.ctx, &tv, nullptr);
    }
  }

  void close() noexcept {
    if (!handle_) return;
    if (claimed_) libusb_release_interface(handle_, interface_);
    libusb_close(handle_);
    handle_ = nullptr;
  }

  Context context_;  // destroyed last
  const std::string location_;
  libusb_device_descriptor ids_{};
  libusb_device_handle* handle_ = nullptr;
  bool claimed_ = false;
  int interface_ = 0;
  std::uint8_t ep_in_ = 0, ep_out_ = 0, ep_irq_ = 0;
  std::size_t max_packet_out_ = 512;
  std::size_t irq_bytes_ = sizeof(fw::UsbInterrupt);

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<libusb_transfer*, TransferInfo> info_;  // every transfer allocated; guarded
  std::vector<libusb_transfer*> idle_;             // not submitted; guarded
  libusb_transfer* filling_ = nullptr;             // out_buffer's, until send_out; guarded
  // Received, for the reader, oldest first; bulk_offset_ bytes of the
  // front one were read by bulk_in. Guarded.
  std::deque<libusb_transfer*> bulk_ready_, irq_ready_;
  std::size_t bulk_offset_ = 0;
  bool device_memory_ = true;                                   // usbfs may have some to give; guarded
  int in_flight_ = 0, out_in_flight_ = 0;                       // guarded
  int bulk_in_flight_ = 0, irq_in_flight_ = 0;                  // IN transfers in flight, by endpoint; guarded
  std::vector<libusb_transfer*> unstarted_in_;                  // until the first read; guarded
  bool ended_ = false, closing_ = false, stop_events_ = false;  // guarded
  bool bulk_gap_ = false, irq_gap_ = false;                     // an IN transfer on that endpoint failed; guarded
  std::thread events_;
};

}  // namespace

std::size_t usb_transfers_outstanding() noexcept { return g_transfers.load(); }

std::unique_ptr<UsbLink> open_libusb_link(const std::string& location) {
  return std::make_unique<LibusbLink>(location);
}

}  // namespace tpuhal::tpu
