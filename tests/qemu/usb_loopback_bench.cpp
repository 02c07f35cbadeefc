// The baseline for tpuhal's USB transfer figures: plain libusb bulk
// transfers, with the same number in flight and the same transfer size as
// the usb: link, against the kernel's source/sink gadget function (no user
// space on the board side at all). Prints MB/s for bulk OUT (to the sink)
// and bulk IN (from the source).
//
//   usb_loopback_bench VID:PID [MiB]
#include <libusb.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr int kInFlight = 4;
constexpr int kTransferBytes = 1 << 20;

struct Run {
  libusb_context* ctx;
  long long remaining;  // transfers still to submit
  int active = 0;
  bool failed = false;
};

void LIBUSB_CALL done(libusb_transfer* t) {
  auto* r = static_cast<Run*>(t->user_data);
  --r->active;
  if (t->status != LIBUSB_TRANSFER_COMPLETED) {
    std::fprintf(stderr, "transfer failed: %s\n", libusb_error_name(t->status));
    r->failed = true;
    return;
  }
  if (r->remaining > 0 && !r->failed) {
    --r->remaining;
    ++r->active;
    if (libusb_submit_transfer(t) != 0) {
      --r->active;
      r->failed = true;
    }
  }
}

double measure(libusb_context* ctx, libusb_device_handle* h, unsigned char ep, long long bytes) {
  Run r{ctx, bytes / kTransferBytes};
  std::vector<libusb_transfer*> ts;
  std::vector<std::vector<unsigned char>> bufs(kInFlight, std::vector<unsigned char>(kTransferBytes, 0x5A));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kInFlight && r.remaining > 0; ++i) {
    libusb_transfer* t = libusb_alloc_transfer(0);
    libusb_fill_bulk_transfer(t, h, ep, bufs[i].data(), kTransferBytes, done, &r, 0);
    ts.push_back(t);
    --r.remaining;
    ++r.active;
    if (libusb_submit_transfer(t) != 0) {
      --r.active;
      r.failed = true;
    }
  }
  while (r.active > 0) libusb_handle_events(ctx);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (auto* t : ts) libusb_free_transfer(t);
  return r.failed ? -1 : static_cast<double>(bytes) / s / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  unsigned vid = 0, pid = 0;
  if (argc < 2 || std::sscanf(argv[1], "%x:%x", &vid, &pid) != 2) {
    std::fprintf(stderr, "usage: usb_loopback_bench VID:PID [MiB]\n");
    return 2;
  }
  const long long bytes = (argc > 2 ? std::atoll(argv[2]) : 64) << 20;
  libusb_context* ctx = nullptr;
  if (libusb_init(&ctx) != 0) return 1;
  libusb_device_handle* h =
      libusb_open_device_with_vid_pid(ctx, static_cast<std::uint16_t>(vid), static_cast<std::uint16_t>(pid));
  if (!h) {
    std::fprintf(stderr, "usb_loopback_bench: no %04x:%04x device\n", vid, pid);
    return 1;
  }
  libusb_set_auto_detach_kernel_driver(h, 1);
  if (libusb_claim_interface(h, 0) != 0) {
    std::fprintf(stderr, "usb_loopback_bench: cannot claim interface 0\n");
    return 1;
  }
  // Source/sink: one bulk IN (the source) and one bulk OUT (the sink).
  libusb_config_descriptor* config = nullptr;
  libusb_get_active_config_descriptor(libusb_get_device(h), &config);
  unsigned char in = 0, out = 0;
  const libusb_interface_descriptor& id = config->interface[0].altsetting[0];
  for (int e = 0; e < id.bNumEndpoints; ++e) {
    const auto& ep = id.endpoint[e];
    if ((ep.bmAttributes & LIBUSB_TRANSFER_TYPE_MASK) != LIBUSB_TRANSFER_TYPE_BULK) continue;
    if (ep.bEndpointAddress & LIBUSB_ENDPOINT_IN)
      in = ep.bEndpointAddress;
    else
      out = ep.bEndpointAddress;
  }
  libusb_free_config_descriptor(config);
  const double w = measure(ctx, h, out, bytes), r = measure(ctx, h, in, bytes);
  std::printf("libusb bulk loopback (kernel source/sink, %d x %d KiB in flight): OUT %.1f MB/s, IN %.1f MB/s\n",
              kInFlight, kTransferBytes >> 10, w, r);
  libusb_release_interface(h, 0);
  libusb_close(h);
  libusb_exit(ctx);
  return w > 0 && r > 0 ? 0 : 1;
}
