// tpuhal-usb-gadget: a simulated board on a real USB bus. Presents
// sim::UsbFunction through Linux's USB gadget framework (configfs and
// FunctionFS), so that the usb: driver reaches it through the host
// controller stack: with dummy_hcd, in the same machine (docs/usb.md).
//
// It creates the gadget in configfs, mounts FunctionFS, writes the
// function's descriptors, binds the gadget to a UDC and serves EP0: the
// vendor requests (identity, link reset) and the ENABLE/DISABLE events
// that start and end a session. Each time the host enables the
// configuration a fresh board starts; a disable (cable pulled, gadget
// unbound) ends it. In loader mode the gadget enumerates with the loader
// product ID and, once the loader accepts an uploaded image, detaches and
// re-enumerates as the application device.
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <linux/usb/ch9.h>
#include <linux/usb/functionfs.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <boost/program_options.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <thread>

#include "tpuhal/base/fd.h"
#include "tpuhal/base/hex.h"
#include "tpuhal/fw/usb.h"
#include "tpuhal/sim/profile.h"
#include "tpuhal/sim/usb_function.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr char kUsage[] =
    "tpuhal-usb-gadget: a simulated board on a real USB bus, through Linux's USB gadget framework\n"
    "(configfs + FunctionFS; needs root and the libcomposite and usb_f_fs modules, and a UDC such as\n"
    "dummy_hcd's). The usb: driver then finds it (tpuhal list).\n\n"
    "usage: tpuhal-usb-gadget [--board PROFILE] [--loader] [--udc NAME]\n\noptions";

int g_stop_fd = -1;
void on_signal(int) {
  const std::uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(g_stop_fd, &one, sizeof one);
}
void on_wake(int) {}  // SIGUSR1: interrupts a blocked endpoint read or write

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream f(p);
  f << text;
  f.close();
  if (!f) throw std::runtime_error("cannot write '" + text + "' to " + p.string() + ": " + std::strerror(errno));
}

// The function's descriptors: one interface, bulk OUT, bulk IN and
// interrupt IN, at full and high speed.
struct __attribute__((packed)) Endpoints {
  usb_interface_descriptor intf;
  usb_endpoint_descriptor_no_audio out, in, irq;
};
struct __attribute__((packed)) Descriptors {
  usb_functionfs_descs_head_v2 header;
  __le32 fs_count, hs_count;
  Endpoints fs, hs;
};
struct __attribute__((packed)) Strings {
  usb_functionfs_strings_head header;
  __le16 code;
  char name[sizeof "tpuhal board"];
};

Endpoints endpoints(std::uint16_t bulk_packet) {
  Endpoints e{};
  e.intf = {sizeof e.intf, USB_DT_INTERFACE, 0, 0, 3, USB_CLASS_VENDOR_SPEC, 0, 0, 1};
  e.out = {sizeof e.out, USB_DT_ENDPOINT, 1 | USB_DIR_OUT, USB_ENDPOINT_XFER_BULK, bulk_packet, 0};
  e.in = {sizeof e.in, USB_DT_ENDPOINT, 2 | USB_DIR_IN, USB_ENDPOINT_XFER_BULK, bulk_packet, 0};
  e.irq = {sizeof e.irq, USB_DT_ENDPOINT, 3 | USB_DIR_IN, USB_ENDPOINT_XFER_INT, sizeof(tpuhal::fw::UsbInterrupt), 4};
  return e;
}

// Every bulk packet size this function offers divides this (64 at full
// speed, 512 at high speed): a transfer of a multiple of it may end without
// a short packet.
constexpr std::size_t kPacketMultiple = 64;

// FunctionFS requests queued on each bulk endpoint, and their size (what
// FunctionFS buffers easily).
constexpr std::size_t kDepth = 16;
constexpr std::size_t kRequestBytes = 256u << 10;

// How long flush_in waits for a host to read what was written.
constexpr std::chrono::seconds kFlushLimit{30};

// The function's endpoint files, for one session. Bulk transfers go
// through Linux AIO (FunctionFS queues each iocb as a USB request), several
// at a time each way, as the kernel's own functions queue requests: one
// blocking read or write at a time would leave the bus idle between them.
// Threads blocked here are woken with SIGUSR1 when the session ends:
// FunctionFS leaves a request issued after a disable waiting for the next
// enable.
class FfsEndpoints final : public tpuhal::sim::FunctionEndpoints {
 public:
  FfsEndpoints(int out, int in, int irq) : out_(out), in_(in), irq_(irq) {
    for (aio_context_t* ctx : {&out_ctx_, &in_ctx_})
      if (::syscall(SYS_io_setup, kDepth, ctx) != 0)
        throw std::system_error(errno, std::generic_category(), "io_setup");
    for (Slot& s : reads_) s.buf.resize(kRequestBytes);
  }
  ~FfsEndpoints() override {
    // Cancels what is still queued and waits for it: no request outlives
    // its buffer.
    ::syscall(SYS_io_destroy, out_ctx_);
    ::syscall(SYS_io_destroy, in_ctx_);
  }

  // Bulk OUT is read into the requests' own buffers, and the function
  // executes the messages that lie whole in one there (peek_out); a
  // message cut between requests is assembled. (Answers to host-reads cut
  // to fit a request were slower: the host then sends four transfers per
  // megabyte, with the same number in flight. docs/usb.md.)
  std::span<const std::byte> peek_out() override {
    if (!reads_started_) {
      reads_started_ = true;
      for (std::size_t i = 0; i < kDepth; ++i)
        if (!submit(out_ctx_, out_, IOCB_CMD_PREAD, reads_[i], i, kRequestBytes)) return {};
    }
    Slot& s = reads_[read_head_];
    if (!s.done && !reap(out_ctx_, reads_, s)) return {};
    if (s.result <= 0) return {};  // the host is gone
    return {s.buf.data() + s.taken, static_cast<std::size_t>(s.result) - s.taken};
  }
  void release_out() override {
    Slot& s = reads_[read_head_];
    s.taken = static_cast<std::size_t>(s.result);
    if (submit(out_ctx_, out_, IOCB_CMD_PREAD, s, read_head_, kRequestBytes)) read_head_ = (read_head_ + 1) % kDepth;
  }
  std::size_t read_out(std::span<std::byte> out) override {
    std::span<const std::byte> got = peek_out();
    const std::size_t n = std::min(out.size(), got.size());
    std::memcpy(out.data(), got.data(), n);
    reads_[read_head_].taken += n;
    if (n == got.size() && n > 0) release_out();
    return n;
  }

  bool write_in(std::span<const std::byte> data) override {
    const std::span<const std::byte> parts[] = {data};
    return write_parts(parts);
  }
  bool write_in_gather(std::span<const std::byte> head, std::span<const std::byte> body) override {
    const std::span<const std::byte> parts[] = {head, body};
    return write_parts(parts);
  }
  bool write_irq(std::span<const std::byte> data) override { return write_all(irq_, data); }

  // Every IN request queued so far has completed: the host has read it.
  // A host that stops reading is given kFlushLimit, as a board's own
  // firmware would not wait on it for ever either: then false.
  bool flush_in() override {
    std::lock_guard lock(write_mu_);
    const auto until = std::chrono::steady_clock::now() + kFlushLimit;
    for (Slot& s : writes_)
      if (s.queued && (!reap(in_ctx_, writes_, s, until) || s.result != static_cast<ssize_t>(s.length))) return false;
    return true;
  }

  // Ends the session: every endpoint call returns (0 or false) from now on.
  void close() {
    closed_.store(true);
    for (;;) {
      {
        std::lock_guard lock(mu_);
        if (inside_.empty()) return;
        for (pthread_t t : inside_) pthread_kill(t, SIGUSR1);
      }
      std::this_thread::sleep_for(1ms);
    }
  }

 private:
  struct Slot {
    std::vector<std::byte> buf;
    iocb cb{};
    bool queued = false, done = false;
    ssize_t result = 0;
    std::size_t length = 0, taken = 0;
  };

  // One bulk IN transfer of `parts`, back to back, in requests of at most
  // kRequestBytes gathered from the parts where they lie (vectored writes;
  // FunctionFS copies a write's bytes when it is submitted, so the slots
  // only track the requests). A transfer of whole packets gets its last
  // byte apart so that the host's transfer ends (a short packet).
  bool write_parts(std::span<const std::span<const std::byte>> parts) {
    std::lock_guard lock(write_mu_);
    std::array<iovec, 4> v{};  // a request gathers from every part at most
    if (parts.size() > v.size()) return false;
    std::size_t left = 0;
    for (const auto& p : parts) left += p.size();
    std::size_t part = 0, offset = 0;
    while (left > 0) {
      std::size_t n = std::min(left, kRequestBytes);
      if (n == left && n % kPacketMultiple == 0 && n > 1) --n;
      std::size_t count = 0;
      for (std::size_t need = n; need > 0;) {
        const std::span<const std::byte> p = parts[part];
        const std::size_t take = std::min(need, p.size() - offset);
        if (take > 0) v[count++] = {const_cast<std::byte*>(p.data() + offset), take};
        need -= take;
        offset += take;
        if (offset == p.size()) {
          ++part;
          offset = 0;
        }
      }
      Slot& s = writes_[write_next_];
      if (s.queued) {  // the slot's last request: it must have gone whole
        if (!reap(in_ctx_, writes_, s) || s.result != static_cast<ssize_t>(s.length)) return false;
      }
      if (!submit(in_ctx_, in_, IOCB_CMD_PWRITEV, s, write_next_, n, v.data(), count)) return false;
      write_next_ = (write_next_ + 1) % kDepth;
      left -= n;
    }
    return true;
  }

  // Queues a request on `fd` for slot `s`: a read into its buffer, or a
  // write gathered from `from` (copied by the kernel before this returns).
  bool submit(aio_context_t ctx, int fd, std::uint16_t op, Slot& s, std::size_t index, std::size_t length,
              const iovec* from = nullptr, std::size_t count = 0) {
    if (closed_.load()) return false;
    s.cb = iocb{};
    s.cb.aio_data = index;
    s.cb.aio_lio_opcode = op;
    s.cb.aio_fildes = static_cast<std::uint32_t>(fd);
    s.cb.aio_buf = reinterpret_cast<std::uint64_t>(from ? static_cast<const void*>(from) : s.buf.data());
    s.cb.aio_nbytes = from ? count : length;
    iocb* list[1] = {&s.cb};
    if (io([&] { return static_cast<ssize_t>(::syscall(SYS_io_submit, ctx, 1, list)); }) != 1) return false;
    s.queued = true;
    s.done = false;
    s.length = length;
    s.taken = 0;
    return true;
  }

  // Collects completions until `want`'s has come (requests on one endpoint
  // complete in the order they were queued); false if the endpoints closed
  // or `until` passed first.
  template <std::size_t N>
  bool reap(aio_context_t ctx, std::array<Slot, N>& slots, Slot& want,
            std::optional<std::chrono::steady_clock::time_point> until = std::nullopt) {
    while (!want.done) {
      io_event ev[N];
      const ssize_t got = io([&] {
        timespec left{};
        if (until) {
          const auto ns = std::max<std::int64_t>(
              0,
              std::chrono::duration_cast<std::chrono::nanoseconds>(*until - std::chrono::steady_clock::now()).count());
          left = {static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
        }
        return static_cast<ssize_t>(
            ::syscall(SYS_io_getevents, ctx, 1, static_cast<long>(N), ev, until ? &left : nullptr));
      });
      if (got <= 0) return false;
      for (ssize_t i = 0; i < got; ++i) {
        Slot& s = slots[ev[i].data];
        s.done = true;
        s.result = static_cast<ssize_t>(ev[i].res);
      }
    }
    want.queued = false;
    return true;
  }

  template <class F>
  ssize_t io(F f) {
    {
      std::lock_guard lock(mu_);
      if (closed_.load()) return -1;
      inside_.insert(pthread_self());
    }
    ssize_t r;
    do {
      r = f();
    } while (r < 0 && errno == EINTR && !closed_.load());
    std::lock_guard lock(mu_);
    inside_.erase(pthread_self());
    return closed_.load() ? -1 : r;
  }
  bool write_all(int fd, std::span<const std::byte> data) {
    while (!data.empty()) {
      const ssize_t r = io([&] { return ::write(fd, data.data(), data.size()); });
      if (r <= 0) return false;
      data = data.subspan(static_cast<std::size_t>(r));
    }
    return true;
  }

  int out_, in_, irq_;
  aio_context_t out_ctx_ = 0, in_ctx_ = 0;
  std::array<Slot, kDepth> reads_;   // the OUT thread's (peek_out, release_out, read_out)
  std::array<Slot, kDepth> writes_;  // guarded by write_mu_ (write_in's thread, and flush_in's)
  std::mutex write_mu_;
  std::size_t read_head_ = 0, write_next_ = 0;
  bool reads_started_ = false;
  std::atomic<bool> closed_{false};
  std::mutex mu_;
  std::set<pthread_t> inside_;  // guarded
};

struct Options {
  std::string board = "tiny";
  bool loader = false;
  std::string udc;
  std::string configfs = "/sys/kernel/config";
  std::string ffs = "/dev/ffs-tpuhal";
  std::string name = "tpuhal";
};

class Gadget {
 public:
  explicit Gadget(Options o) : o_(std::move(o)), profile_(tpuhal::sim::load_profile(o_.board)) {
    loader_ = o_.loader;
    dir_ = fs::path(o_.configfs) / "usb_gadget" / o_.name;
    if (!fs::exists(fs::path(o_.configfs) / "usb_gadget"))
      throw std::runtime_error(o_.configfs + "/usb_gadget does not exist: mount configfs there and load libcomposite");
    if (o_.udc.empty()) {
      for (const auto& e : fs::directory_iterator("/sys/class/udc")) {
        o_.udc = e.path().filename();
        break;
      }
      if (o_.udc.empty()) throw std::runtime_error("no USB device controller in /sys/class/udc (load dummy_hcd?)");
    }
    fs::create_directories(dir_);
    write_file(dir_ / "idVendor", tpuhal::hex(tpuhal::fw::kUsbSimVendor, 4));
    write_file(dir_ / "idProduct", tpuhal::hex(product(), 4));
    write_file(dir_ / "bcdUSB", "0x0200");
    write_file(dir_ / "bcdDevice", "0x0100");
    fs::create_directories(dir_ / "strings/0x409");
    write_file(dir_ / "strings/0x409/manufacturer", "tpuhal");
    write_file(dir_ / "strings/0x409/product", "simulated " + profile_.model);
    write_file(dir_ / "strings/0x409/serialnumber", "sim-" + o_.board);
    fs::create_directories(dir_ / "functions" / ("ffs." + o_.name));
    fs::create_directories(dir_ / "configs/c.1/strings/0x409");
    write_file(dir_ / "configs/c.1/strings/0x409/configuration", "tpuhal");
    write_file(dir_ / "configs/c.1/MaxPower", "100");
    const fs::path link = dir_ / "configs/c.1" / ("ffs." + o_.name);
    if (!fs::exists(fs::symlink_status(link)))
      fs::create_directory_symlink(dir_ / "functions" / ("ffs." + o_.name), link);
    fs::create_directories(o_.ffs);
    if (::mount(o_.name.c_str(), o_.ffs.c_str(), "functionfs", 0, nullptr) != 0 && errno != EBUSY)
      throw std::system_error(errno, std::generic_category(), "mount functionfs on " + o_.ffs);
    mounted_ = true;
    ep0_ = tpuhal::base::UniqueFd(::open((o_.ffs + "/ep0").c_str(), O_RDWR | O_CLOEXEC));
    if (!ep0_) throw std::system_error(errno, std::generic_category(), "open " + o_.ffs + "/ep0");
    Descriptors d{};
    d.header = {FUNCTIONFS_DESCRIPTORS_MAGIC_V2, sizeof d, FUNCTIONFS_HAS_FS_DESC | FUNCTIONFS_HAS_HS_DESC};
    d.fs_count = 4;
    d.hs_count = 4;
    d.fs = endpoints(64);
    d.hs = endpoints(512);
    if (::write(ep0_.get(), &d, sizeof d) != static_cast<ssize_t>(sizeof d))
      throw std::system_error(errno, std::generic_category(), "write FunctionFS descriptors");
    Strings s{};
    s.header = {FUNCTIONFS_STRINGS_MAGIC, sizeof s, 1, 1};
    s.code = 0x0409;
    std::memcpy(s.name, "tpuhal board", sizeof s.name);
    if (::write(ep0_.get(), &s, sizeof s) != static_cast<ssize_t>(sizeof s))
      throw std::system_error(errno, std::generic_category(), "write FunctionFS strings");
    for (auto [fd, name] : {std::pair{&out_, "ep1"}, {&in_, "ep2"}, {&irq_, "ep3"}}) {
      *fd = tpuhal::base::UniqueFd(::open((o_.ffs + "/" + name).c_str(), O_RDWR | O_CLOEXEC));
      if (!*fd) throw std::system_error(errno, std::generic_category(), "open " + o_.ffs + "/" + name);
    }
    bind();
  }

  ~Gadget() {
    end_session();
    try {
      write_file(dir_ / "UDC", "\n");
    } catch (...) {
    }
    out_.reset();
    in_.reset();
    irq_.reset();
    ep0_.reset();
    if (mounted_) ::umount(o_.ffs.c_str());
    std::error_code ec;
    fs::remove(dir_ / "configs/c.1" / ("ffs." + o_.name), ec);
    fs::remove(dir_ / "configs/c.1/strings/0x409", ec);
    fs::remove(dir_ / "configs/c.1", ec);
    fs::remove(dir_ / "functions" / ("ffs." + o_.name), ec);
    fs::remove(dir_ / "strings/0x409", ec);
    fs::remove(dir_, ec);
  }

  void run(int stop_fd) {
    std::printf("tpuhal-usb-gadget: %s board (%s) bound to %s as %04x:%04x\n", o_.board.c_str(),
                loader_ ? "loader" : "application", o_.udc.c_str(), tpuhal::fw::kUsbSimVendor, product());
    std::fflush(stdout);
    for (;;) {
      pollfd p[3] = {{ep0_.get(), POLLIN, 0}, {stop_fd, POLLIN, 0}, {wake_.get(), POLLIN, 0}};
      if (::poll(p, 3, -1) < 0) continue;
      if (p[1].revents) return;
      if (p[2].revents) {
        tpuhal::base::eventfd_drain(wake_.get());
        if (upgrade_.exchange(false)) reenumerate();
      }
      if (!(p[0].revents & POLLIN)) continue;
      usb_functionfs_event events[8];
      const ssize_t n = ::read(ep0_.get(), events, sizeof events);
      if (n <= 0) continue;
      for (ssize_t i = 0; i < n / static_cast<ssize_t>(sizeof events[0]); ++i) handle(events[i]);
    }
  }

 private:
  std::uint16_t product() const { return loader_ ? tpuhal::fw::kUsbSimLoaderProduct : tpuhal::fw::kUsbSimProduct; }

  void bind() { write_file(dir_ / "UDC", o_.udc); }

  void handle(const usb_functionfs_event& e) {
    switch (e.type) {
      case FUNCTIONFS_ENABLE: start_session(); break;
      case FUNCTIONFS_DISABLE:
      case FUNCTIONFS_UNBIND: end_session(); break;
      case FUNCTIONFS_SETUP: setup(e.u.setup); break;
      default: break;
    }
  }

  void start_session() {
    end_session();
    session_ = std::make_unique<FfsEndpoints>(out_.get(), in_.get(), irq_.get());
    tpuhal::sim::UsbFunctionOptions fo;
    fo.loader = loader_;
    fo.on_firmware = [this](std::vector<std::byte>) {
      upgrade_.store(true);
      tpuhal::base::eventfd_signal(wake_.get());
    };
    function_ = std::make_unique<tpuhal::sim::UsbFunction>(profile_, *session_, fo);
    std::printf("tpuhal-usb-gadget: session %u started (%s)\n", ++sessions_, loader_ ? "loader" : "application");
    std::fflush(stdout);
  }

  void end_session() {
    if (!function_) return;
    session_->close();
    function_.reset();
    session_.reset();
    std::printf("tpuhal-usb-gadget: session %u ended\n", sessions_);
    std::fflush(stdout);
  }

  // The loader took an image: detach, come back as the application device.
  // The function calls on_firmware once the host has read its verdict
  // (UsbFunctionOptions::on_firmware), so the detach cannot overtake it.
  void reenumerate() {
    write_file(dir_ / "UDC", "\n");
    end_session();
    loader_ = false;
    write_file(dir_ / "idProduct", tpuhal::hex(product(), 4));
    bind();
    std::printf("tpuhal-usb-gadget: firmware accepted; re-enumerated as %04x:%04x\n", tpuhal::fw::kUsbSimVendor,
                product());
    std::fflush(stdout);
  }

  void setup(const usb_ctrlrequest& r) {
    const bool in = r.bRequestType & USB_DIR_IN;
    const bool vendor = (r.bRequestType & USB_TYPE_MASK) == USB_TYPE_VENDOR;
    if (vendor && in && r.bRequest == tpuhal::fw::kUsbGetIdentity && function_) {
      const tpuhal::fw::UsbIdentity id = function_->identity();
      const std::size_t n = std::min<std::size_t>(r.wLength, sizeof id);
      [[maybe_unused]] auto w = ::write(ep0_.get(), &id, n);
      return;
    }
    if (vendor && !in && r.bRequest == tpuhal::fw::kUsbResetLink && function_) {
      // A new host driver: whatever the last one left in flight is dropped
      // with its session (blocked endpoint I/O is cancelled, which dequeues
      // its requests), and a fresh board answers from message 1.
      start_session();
      [[maybe_unused]] auto rd = ::read(ep0_.get(), nullptr, 0);  // the status stage
      return;
    }
    // Anything else stalls: an I/O in the wrong direction halts EP0.
    if (in) {
      [[maybe_unused]] auto rd = ::read(ep0_.get(), nullptr, 0);
    } else {
      [[maybe_unused]] auto w = ::write(ep0_.get(), nullptr, 0);
    }
  }

  Options o_;
  tpuhal::sim::BoardProfile profile_;
  bool loader_ = false;
  fs::path dir_;
  bool mounted_ = false;
  tpuhal::base::UniqueFd ep0_, out_, in_, irq_;
  tpuhal::base::UniqueFd wake_ = tpuhal::base::make_eventfd();
  std::atomic<bool> upgrade_{false};
  std::unique_ptr<FfsEndpoints> session_;
  std::unique_ptr<tpuhal::sim::UsbFunction> function_;
  unsigned sessions_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  Options o;
  po::options_description desc(kUsage);
  desc.add_options()("help,h", "show this help")(
      "board", po::value<std::string>(&o.board)->default_value("tiny"),
      "the board to present: a built-in profile (bm1684x, tiny, edge-soc) or a profile .json")(
      "loader", po::bool_switch(&o.loader), "start without firmware: enumerate as the loader and wait for an upload")(
      "udc", po::value<std::string>(&o.udc),
      "the USB device controller to bind to (default: the first in /sys/class/udc)")(
      "configfs", po::value<std::string>(&o.configfs)->default_value("/sys/kernel/config"),
      "where configfs is mounted")("ffs", po::value<std::string>(&o.ffs)->default_value("/dev/ffs-tpuhal"),
                                   "where to mount the function's FunctionFS")(
      "name", po::value<std::string>(&o.name)->default_value("tpuhal"),
      "the gadget's and the function's name in configfs");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpuhal-usb-gadget: %s\n(tpuhal-usb-gadget --help lists the options)\n", e.what());
    return 2;
  }
  tpuhal::base::UniqueFd stop = tpuhal::base::make_eventfd();
  g_stop_fd = stop.get();
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  struct sigaction wake {};
  wake.sa_handler = on_wake;  // no SA_RESTART: a blocked endpoint call returns EINTR
  sigemptyset(&wake.sa_mask);
  sigaction(SIGUSR1, &wake, nullptr);
  signal(SIGPIPE, SIG_IGN);
  try {
    Gadget g(o);
    g.run(stop.get());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpuhal-usb-gadget: %s\n", e.what());
    return 1;
  }
  return 0;
}
