// The libusb-1.0 entry points libusb_link.cpp calls, on a scripted bus
// (fake_libusb.hpp). One lock guards the whole bus; callbacks run without
// it, on the event thread, as libusb runs them.
#include "tpu/fake_libusb.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <utility>

// libusb's opaque types.
struct libusb_context {
  bool interrupted = false;  // libusb_interrupt_event_handler was called; guarded
};
struct libusb_device {};
struct libusb_device_handle {
  bool claimed = false;  // guarded
};

namespace tpuhal::test::fake_libusb {
namespace {

constexpr std::uint8_t kBulkIn = 0x81, kBulkOut = 0x02, kInterruptIn = 0x83;
constexpr int kBoardInterface = 1;
constexpr auto kWaitBound = std::chrono::seconds(10);

int slot(Pipe p) { return static_cast<int>(p); }

bool pipe_of(std::uint8_t endpoint, Pipe& p) {
  switch (endpoint) {
    case kBulkIn: p = Pipe::bulk_in; return true;
    case kBulkOut: p = Pipe::bulk_out; return true;
    case kInterruptIn: p = Pipe::interrupt_in; return true;
    default: return false;
  }
}

// A transfer between libusb_submit_transfer and its reaping.
struct Flight {
  libusb_transfer* t = nullptr;
  libusb_device_handle* handle = nullptr;
  Pipe pipe = Pipe::bulk_in;
  int length = 0;
  bool done = false;        // finished in the kernel
  bool held = false;        // finished while reaping was held
  bool cancelling = false;  // libusb_cancel_transfer was called
  std::uint64_t done_order = 0;
  libusb_transfer_status status = LIBUSB_TRANSFER_COMPLETED;
  std::string bytes;  // IN: received; OUT: to send
  int actual = 0;
};

// What the board does next on an IN pipe.
struct BoardEvent {
  std::string bytes;
  libusb_transfer_status status;
};

// A config descriptor and the descriptors it points to, in one allocation:
// a HID-like interface 0 with an interrupt IN endpoint only, then the
// board's interface 1.
struct ConfigStorage {
  libusb_config_descriptor config{};  // first: its address is the storage's
  libusb_interface interfaces[2]{};
  libusb_interface_descriptor altsettings[2]{};
  libusb_endpoint_descriptor other_endpoint{};
  libusb_endpoint_descriptor endpoints[3]{};
};

struct Bus {
  std::mutex mu;
  std::condition_variable cv;
  // Everything below is guarded by mu.
  Device device;
  libusb_device the_device;
  bool plugged = true, hold = false, taking_out = true;
  std::deque<BoardEvent> board[3];
  std::list<Flight> flight;  // submission order
  std::uint64_t finished = 0;
  int event_waiters = 0;  // threads waiting in libusb_handle_events_timeout_completed
  SubmitHook hook;
  int attempts[3]{}, submitted[3]{}, reaped[3]{}, handled[3]{}, last_length[3]{};
  std::vector<std::string> out;
  std::string control_answer;
  std::vector<Control> controls;
  std::set<libusb_context*> contexts;
  std::set<libusb_device_handle*> handles;
  std::set<libusb_transfer*> transfers;
  std::map<unsigned char*, std::size_t> device_memory;
  std::size_t device_memory_left = 0;
  std::set<libusb_config_descriptor*> configs;
  std::set<libusb_device**> device_lists;
  std::vector<std::string> misuse;
};

Bus& bus() {
  static Bus b;
  return b;
}

void finish_locked(Bus& b, Flight& f, libusb_transfer_status status) {
  f.done = true;
  f.status = status;
  f.held = b.hold;
  f.done_order = ++b.finished;
  if (f.pipe == Pipe::bulk_out)
    f.actual = status == LIBUSB_TRANSFER_COMPLETED ? f.length : 0;
  else
    f.actual = static_cast<int>(f.bytes.size());
  b.cv.notify_all();
}

// Lands every waiting transfer the board has something for.
void land_locked(Bus& b) {
  for (Flight& f : b.flight) {
    if (f.done) continue;
    if (!b.plugged) {
      finish_locked(b, f, LIBUSB_TRANSFER_NO_DEVICE);
    } else if (f.pipe == Pipe::bulk_out) {
      if (!b.taking_out) continue;
      b.out.push_back(f.bytes);
      finish_locked(b, f, LIBUSB_TRANSFER_COMPLETED);
    } else {
      std::deque<BoardEvent>& q = b.board[slot(f.pipe)];
      if (q.empty()) continue;
      BoardEvent& e = q.front();
      if (e.status != LIBUSB_TRANSFER_COMPLETED) {
        finish_locked(b, f, e.status);
        q.pop_front();
        continue;
      }
      const std::size_t n = std::min(e.bytes.size(), static_cast<std::size_t>(f.length));
      f.bytes = e.bytes.substr(0, n);
      e.bytes.erase(0, n);
      if (e.bytes.empty()) q.pop_front();
      finish_locked(b, f, LIBUSB_TRANSFER_COMPLETED);
    }
  }
}

// The transfer to reap next: the first to have finished, unless it is held.
std::list<Flight>::iterator next_to_reap_locked(Bus& b) {
  auto first = b.flight.end();
  for (auto it = b.flight.begin(); it != b.flight.end(); ++it)
    if (it->done && (first == b.flight.end() || it->done_order < first->done_order)) first = it;
  if (first != b.flight.end() && first->held && !first->cancelling) return b.flight.end();
  return first;
}

template <class Pred>
bool wait_for(Pred pred) {
  Bus& b = bus();
  std::unique_lock lock(b.mu);
  return b.cv.wait_for(lock, kWaitBound, pred);
}

void set_endpoint(libusb_endpoint_descriptor& e, std::uint8_t address, std::uint8_t type, std::uint16_t packet) {
  e.bLength = LIBUSB_DT_ENDPOINT_SIZE;
  e.bDescriptorType = LIBUSB_DT_ENDPOINT;
  e.bEndpointAddress = address;
  e.bmAttributes = type;
  e.wMaxPacketSize = packet;
  e.bInterval = type == LIBUSB_TRANSFER_TYPE_INTERRUPT ? 1 : 0;
}

void set_interface(ConfigStorage& s, int i, std::uint8_t klass, libusb_endpoint_descriptor* endpoints, int count) {
  libusb_interface_descriptor& a = s.altsettings[i];
  a.bLength = LIBUSB_DT_INTERFACE_SIZE;
  a.bDescriptorType = LIBUSB_DT_INTERFACE;
  a.bInterfaceNumber = static_cast<std::uint8_t>(i);
  a.bNumEndpoints = static_cast<std::uint8_t>(count);
  a.bInterfaceClass = klass;
  a.endpoint = endpoints;
  s.interfaces[i].altsetting = &a;
  s.interfaces[i].num_altsetting = 1;
}

ConfigStorage* new_config(const Device& d) {
  auto* s = new ConfigStorage;
  set_endpoint(s->other_endpoint, 0x84, LIBUSB_TRANSFER_TYPE_INTERRUPT, 8);
  set_interface(*s, 0, LIBUSB_CLASS_HID, &s->other_endpoint, 1);
  set_endpoint(s->endpoints[0], kBulkIn, LIBUSB_TRANSFER_TYPE_BULK, 512);
  set_endpoint(s->endpoints[1], kBulkOut, LIBUSB_TRANSFER_TYPE_BULK, d.out_packet);
  set_endpoint(s->endpoints[2], kInterruptIn, LIBUSB_TRANSFER_TYPE_INTERRUPT, d.irq_packet);
  set_interface(*s, 1, LIBUSB_CLASS_VENDOR_SPEC, s->endpoints, d.interrupt_endpoint ? 3 : 2);
  s->config.bLength = LIBUSB_DT_CONFIG_SIZE;
  s->config.bDescriptorType = LIBUSB_DT_CONFIG;
  s->config.bNumInterfaces = 2;
  s->config.bConfigurationValue = 1;
  s->config.interface = s->interfaces;
  return s;
}

}  // namespace

void reset(const Device& device) {
  Bus& b = bus();
  std::lock_guard lock(b.mu);
  b.device = device;
  b.plugged = true;
  b.hold = false;
  b.taking_out = true;
  for (auto& q : b.board) q.clear();
  b.flight.clear();
  b.finished = 0;
  b.hook = nullptr;
  for (int i = 0; i < 3; ++i) b.attempts[i] = b.submitted[i] = b.reaped[i] = b.handled[i] = b.last_length[i] = 0;
  b.out.clear();
  b.control_answer.clear();
  b.controls.clear();
  b.device_memory_left = device.device_memory;
  b.misuse.clear();
  // What an earlier test left is its own failure (and LeakSanitizer's).
  b.contexts.clear();
  b.handles.clear();
  b.transfers.clear();
  b.device_memory.clear();
  b.configs.clear();
  b.device_lists.clear();
}

void send(Pipe pipe, std::string_view bytes) {
  Bus& b = bus();
  std::lock_guard lock(b.mu);
  b.board[slot(pipe)].push_back({std::string(bytes), LIBUSB_TRANSFER_COMPLETED});
  land_locked(b);
}

void fail(Pipe pipe, libusb_transfer_status status) {
  Bus& b = bus();
  std::lock_guard lock(b.mu);
  b.board[slot(pipe)].push_back({{}, status});
  land_locked(b);
}

void take_out(bool take) {
  Bus& b = bus();
  std::lock_guard lock(b.mu);
  b.taking_out = take;
  land_locked(b);
}

void unplug() {
  Bus& b = bus();
  std::lock_guard lock(b.mu);
  b.plugged = false;
  land_locked(b);
}

void control_answer(std::string_view bytes) {
  Bus& b = bus();
  std::lock_guard lock(b.mu);
  b.control_answer = bytes;
}

void hold_reaping(bool hold) {
  Bus& b = bus();
  std::lock_guard lock(b.mu);
  b.hold = hold;
  if (!hold)
    for (Flight& f : b.flight) f.held = false;
  b.cv.notify_all();
}

void on_submit(SubmitHook hook) {
  Bus& b = bus();
  std::lock_guard lock(b.mu);
  b.hook = std::move(hook);
}

int submitted(Pipe pipe) {
  Bus& b = bus();
  std::lock_guard lock(b.mu);
  return b.submitted[slot(pipe)];
}

int in_flight(Pipe pipe) {
  Bus& b = bus();
  std::lock_guard lock(b.mu);
  return static_cast<int>(
      std::count_if(b.flight.begin(), b.flight.end(), [&](const Flight& f) { return f.pipe == pipe; }));
}

int last_length(Pipe pipe) {
  Bus& b = bus();
  std::lock_guard lock(b.mu);
  return b.last_length[slot(pipe)];
}

std::vector<std::string> out() {
  Bus& b = bus();
  std::lock_guard lock(b.mu);
  return b.out;
}

std::vector<Control> controls() {
  Bus& b = bus();
  std::lock_guard lock(b.mu);
  return b.controls;
}

int device_memory_buffers() {
  Bus& b = bus();
  std::lock_guard lock(b.mu);
  return static_cast<int>(b.device_memory.size());
}

bool wait_submitted(Pipe pipe, int n) {
  return wait_for([&] { return bus().submitted[slot(pipe)] >= n; });
}

bool wait_event_thread() {
  return wait_for([&] { return bus().event_waiters > 0; });
}

bool wait_reaped(Pipe pipe, int n) {
  return wait_for([&] { return bus().reaped[slot(pipe)] >= n; });
}

bool wait_handled(Pipe pipe, int n) {
  return wait_for([&] { return bus().handled[slot(pipe)] >= n; });
}

std::vector<std::string> misuse() {
  Bus& b = bus();
  std::lock_guard lock(b.mu);
  return b.misuse;
}

std::vector<std::string> leaks() {
  Bus& b = bus();
  std::lock_guard lock(b.mu);
  std::vector<std::string> held;
  auto note = [&](std::size_t n, const char* what) {
    if (n) held.push_back(std::to_string(n) + " " + what);
  };
  note(b.contexts.size(), "contexts");
  note(b.handles.size(), "device handles");
  note(static_cast<std::size_t>(
           std::count_if(b.handles.begin(), b.handles.end(), [](libusb_device_handle* h) { return h->claimed; })),
       "claimed interfaces");
  note(b.transfers.size(), "transfers");
  note(b.flight.size(), "transfers in flight");
  note(b.device_memory.size(), "device-memory buffers");
  note(b.configs.size(), "config descriptors");
  note(b.device_lists.size(), "device lists");
  return held;
}

}  // namespace tpuhal::test::fake_libusb

// ---- libusb's entry points ----

namespace fl = tpuhal::test::fake_libusb;

int LIBUSB_CALL libusb_init(libusb_context** ctx) {
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  if (!ctx) {
    b.misuse.push_back("libusb_init of the default context");
    return LIBUSB_ERROR_INVALID_PARAM;
  }
  *ctx = new libusb_context;
  b.contexts.insert(*ctx);
  return 0;
}

void LIBUSB_CALL libusb_exit(libusb_context* ctx) {
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  if (!b.contexts.erase(ctx)) {
    b.misuse.push_back("libusb_exit of a context libusb_init did not make");
    return;
  }
  if (!b.flight.empty()) b.misuse.push_back("libusb_exit with transfers in flight");
  delete ctx;
}

const char* LIBUSB_CALL libusb_error_name(int code) {
  switch (code) {
    case LIBUSB_SUCCESS: return "LIBUSB_SUCCESS / LIBUSB_TRANSFER_COMPLETED";
    case LIBUSB_TRANSFER_ERROR: return "LIBUSB_TRANSFER_ERROR";
    case LIBUSB_TRANSFER_TIMED_OUT: return "LIBUSB_TRANSFER_TIMED_OUT";
    case LIBUSB_TRANSFER_CANCELLED: return "LIBUSB_TRANSFER_CANCELLED";
    case LIBUSB_TRANSFER_STALL: return "LIBUSB_TRANSFER_STALL";
    case LIBUSB_TRANSFER_NO_DEVICE: return "LIBUSB_TRANSFER_NO_DEVICE";
    case LIBUSB_TRANSFER_OVERFLOW: return "LIBUSB_TRANSFER_OVERFLOW";
    case LIBUSB_ERROR_IO: return "LIBUSB_ERROR_IO";
    case LIBUSB_ERROR_INVALID_PARAM: return "LIBUSB_ERROR_INVALID_PARAM";
    case LIBUSB_ERROR_ACCESS: return "LIBUSB_ERROR_ACCESS";
    case LIBUSB_ERROR_NO_DEVICE: return "LIBUSB_ERROR_NO_DEVICE";
    case LIBUSB_ERROR_NOT_FOUND: return "LIBUSB_ERROR_NOT_FOUND";
    case LIBUSB_ERROR_BUSY: return "LIBUSB_ERROR_BUSY";
    case LIBUSB_ERROR_TIMEOUT: return "LIBUSB_ERROR_TIMEOUT";
    case LIBUSB_ERROR_OVERFLOW: return "LIBUSB_ERROR_OVERFLOW";
    case LIBUSB_ERROR_PIPE: return "LIBUSB_ERROR_PIPE";
    case LIBUSB_ERROR_INTERRUPTED: return "LIBUSB_ERROR_INTERRUPTED";
    case LIBUSB_ERROR_NO_MEM: return "LIBUSB_ERROR_NO_MEM";
    case LIBUSB_ERROR_NOT_SUPPORTED: return "LIBUSB_ERROR_NOT_SUPPORTED";
    case LIBUSB_ERROR_OTHER: return "LIBUSB_ERROR_OTHER";
    default: return "**UNKNOWN**";
  }
}

const char* LIBUSB_CALL libusb_strerror(int code) {
  switch (code) {
    case LIBUSB_SUCCESS: return "Success";
    case LIBUSB_ERROR_IO: return "Input/Output Error";
    case LIBUSB_ERROR_INVALID_PARAM: return "Invalid parameter";
    case LIBUSB_ERROR_ACCESS: return "Access denied (insufficient permissions)";
    case LIBUSB_ERROR_NO_DEVICE: return "No such device (it may have been disconnected)";
    case LIBUSB_ERROR_NOT_FOUND: return "Entity not found";
    case LIBUSB_ERROR_BUSY: return "Resource busy";
    case LIBUSB_ERROR_TIMEOUT: return "Operation timed out";
    case LIBUSB_ERROR_OVERFLOW: return "Overflow";
    case LIBUSB_ERROR_PIPE: return "Pipe error";
    case LIBUSB_ERROR_INTERRUPTED: return "System call interrupted (perhaps due to signal)";
    case LIBUSB_ERROR_NO_MEM: return "Insufficient memory";
    case LIBUSB_ERROR_NOT_SUPPORTED: return "Operation not supported or unimplemented on this platform";
    case LIBUSB_ERROR_OTHER: return "Other error";
    default: return "**UNKNOWN**";
  }
}

ssize_t LIBUSB_CALL libusb_get_device_list(libusb_context*, libusb_device*** list) {
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  auto** l = new libusb_device* [2] {};
  ssize_t n = 0;
  if (b.plugged) l[n++] = &b.the_device;
  b.device_lists.insert(l);
  *list = l;
  return n;
}

void LIBUSB_CALL libusb_free_device_list(libusb_device** list, int) {
  if (!list) return;
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  if (!b.device_lists.erase(list)) {
    b.misuse.push_back("libusb_free_device_list of a list libusb_get_device_list did not make");
    return;
  }
  delete[] list;
}

int LIBUSB_CALL libusb_get_port_numbers(libusb_device*, std::uint8_t* ports, int len) {
  if (len < 1) return LIBUSB_ERROR_OVERFLOW;
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  ports[0] = b.device.port;
  return 1;
}

std::uint8_t LIBUSB_CALL libusb_get_bus_number(libusb_device*) {
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  return b.device.bus;
}

std::uint8_t LIBUSB_CALL libusb_get_device_address(libusb_device*) {
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  return b.device.address;
}

int LIBUSB_CALL libusb_get_device_descriptor(libusb_device*, libusb_device_descriptor* d) {
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  *d = {};
  d->bLength = LIBUSB_DT_DEVICE_SIZE;
  d->bDescriptorType = LIBUSB_DT_DEVICE;
  d->bcdUSB = 0x0200;
  d->bMaxPacketSize0 = 64;
  d->idVendor = b.device.vendor;
  d->idProduct = b.device.product;
  d->bNumConfigurations = 1;
  return 0;
}

int LIBUSB_CALL libusb_open(libusb_device* dev, libusb_device_handle** handle) {
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  if (dev != &b.the_device) b.misuse.push_back("libusb_open of a device not on the bus");
  if (b.device.open_error) return b.device.open_error;
  if (!b.plugged) return LIBUSB_ERROR_NO_DEVICE;
  *handle = new libusb_device_handle;
  b.handles.insert(*handle);
  return 0;
}

void LIBUSB_CALL libusb_close(libusb_device_handle* h) {
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  if (!b.handles.erase(h)) {
    b.misuse.push_back("libusb_close of a handle libusb_open did not give");
    return;
  }
  if (std::any_of(b.flight.begin(), b.flight.end(), [&](const fl::Flight& f) { return f.handle == h; }))
    b.misuse.push_back("libusb_close with transfers in flight");
  delete h;
}

int LIBUSB_CALL libusb_get_active_config_descriptor(libusb_device*, libusb_config_descriptor** config) {
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  if (!b.plugged) return LIBUSB_ERROR_NO_DEVICE;
  *config = &fl::new_config(b.device)->config;
  b.configs.insert(*config);
  return 0;
}

void LIBUSB_CALL libusb_free_config_descriptor(libusb_config_descriptor* config) {
  if (!config) return;
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  if (!b.configs.erase(config)) {
    b.misuse.push_back("libusb_free_config_descriptor of a descriptor it did not give");
    return;
  }
  delete reinterpret_cast<fl::ConfigStorage*>(config);
}

int LIBUSB_CALL libusb_set_auto_detach_kernel_driver(libusb_device_handle*, int) { return 0; }

int LIBUSB_CALL libusb_claim_interface(libusb_device_handle* h, int number) {
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  if (!b.handles.count(h)) {
    b.misuse.push_back("libusb_claim_interface on a closed handle");
    return LIBUSB_ERROR_INVALID_PARAM;
  }
  if (b.device.claim_error) return b.device.claim_error;
  if (!b.plugged) return LIBUSB_ERROR_NO_DEVICE;
  if (number != fl::kBoardInterface) return LIBUSB_ERROR_NOT_FOUND;
  h->claimed = true;
  return 0;
}

int LIBUSB_CALL libusb_release_interface(libusb_device_handle* h, int number) {
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  if (!b.handles.count(h) || !h->claimed || number != fl::kBoardInterface) {
    b.misuse.push_back("libusb_release_interface of an interface not claimed");
    return LIBUSB_ERROR_NOT_FOUND;
  }
  h->claimed = false;
  return b.plugged ? 0 : LIBUSB_ERROR_NO_DEVICE;
}

int LIBUSB_CALL libusb_control_transfer(libusb_device_handle*, std::uint8_t request_type, std::uint8_t request,
                                        std::uint16_t, std::uint16_t index, unsigned char* data, std::uint16_t length,
                                        unsigned int) {
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  b.controls.push_back({request_type, request, index});
  if (!b.plugged) return LIBUSB_ERROR_NO_DEVICE;
  if (!(request_type & LIBUSB_ENDPOINT_IN)) return 0;
  const std::size_t n = std::min<std::size_t>(length, b.control_answer.size());
  if (n) std::memcpy(data, b.control_answer.data(), n);
  return static_cast<int>(n);
}

libusb_transfer* LIBUSB_CALL libusb_alloc_transfer(int iso_packets) {
  auto* t = static_cast<libusb_transfer*>(std::calloc(
      1, sizeof(libusb_transfer) + static_cast<std::size_t>(iso_packets) * sizeof(libusb_iso_packet_descriptor)));
  if (!t) return nullptr;
  t->num_iso_packets = iso_packets;
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  b.transfers.insert(t);
  return t;
}

void LIBUSB_CALL libusb_free_transfer(libusb_transfer* t) {
  if (!t) return;
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  if (std::any_of(b.flight.begin(), b.flight.end(), [&](const fl::Flight& f) { return f.t == t; })) {
    b.misuse.push_back("libusb_free_transfer of a transfer in flight");
    return;  // kept: the event thread still owns it
  }
  if (!b.transfers.erase(t)) {
    b.misuse.push_back("libusb_free_transfer of a transfer libusb_alloc_transfer did not give");
    return;
  }
  if (t->flags & LIBUSB_TRANSFER_FREE_BUFFER) std::free(t->buffer);
  std::free(t);
}

unsigned char* LIBUSB_CALL libusb_dev_mem_alloc(libusb_device_handle*, std::size_t length) {
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  if (length > b.device_memory_left) return nullptr;
  b.device_memory_left -= length;
  // new[], so that ASan reports a buffer given to free() instead.
  auto* p = new unsigned char[length];
  b.device_memory[p] = length;
  return p;
}

int LIBUSB_CALL libusb_dev_mem_free(libusb_device_handle*, unsigned char* buffer, std::size_t length) {
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  const auto it = b.device_memory.find(buffer);
  if (it == b.device_memory.end() || it->second != length) {
    b.misuse.push_back("libusb_dev_mem_free of memory libusb_dev_mem_alloc did not give, or of another length");
    return LIBUSB_ERROR_INVALID_PARAM;
  }
  b.device_memory_left += length;
  b.device_memory.erase(it);
  delete[] buffer;
  return 0;
}

int LIBUSB_CALL libusb_submit_transfer(libusb_transfer* t) {
  fl::Bus& b = fl::bus();
  fl::Pipe pipe{};
  int n = 0;
  fl::SubmitHook hook;
  {
    std::lock_guard lock(b.mu);
    if (!b.transfers.count(t) || !fl::pipe_of(t->endpoint, pipe) || !t->callback || !b.handles.count(t->dev_handle) ||
        t->length < 0 || (t->length > 0 && !t->buffer)) {
      b.misuse.push_back("libusb_submit_transfer of a transfer not filled in");
      return LIBUSB_ERROR_INVALID_PARAM;
    }
    n = ++b.attempts[fl::slot(pipe)];
    hook = b.hook;
  }
  if (hook)
    if (const int rc = hook(pipe, n); rc != 0) return rc;
  std::lock_guard lock(b.mu);
  if (std::any_of(b.flight.begin(), b.flight.end(), [&](const fl::Flight& f) { return f.t == t; })) {
    b.misuse.push_back("libusb_submit_transfer of a transfer in flight");
    return LIBUSB_ERROR_BUSY;
  }
  if (!b.plugged) return LIBUSB_ERROR_NO_DEVICE;
  fl::Flight f;
  f.t = t;
  f.handle = t->dev_handle;
  f.pipe = pipe;
  f.length = t->length;
  if (pipe == fl::Pipe::bulk_out)
    f.bytes.assign(reinterpret_cast<const char*>(t->buffer), static_cast<std::size_t>(t->length));
  b.flight.push_back(std::move(f));
  ++b.submitted[fl::slot(pipe)];
  b.last_length[fl::slot(pipe)] = t->length;
  fl::land_locked(b);
  b.cv.notify_all();
  return 0;
}

int LIBUSB_CALL libusb_cancel_transfer(libusb_transfer* t) {
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  const auto it = std::find_if(b.flight.begin(), b.flight.end(), [&](const fl::Flight& f) { return f.t == t; });
  if (it == b.flight.end() || it->cancelling) return LIBUSB_ERROR_NOT_FOUND;
  it->cancelling = true;
  b.cv.notify_all();
  // An URB the kernel had finished is not found to discard, yet libusb
  // still reports the transfer cancelled, with its bytes.
  if (it->done) return LIBUSB_ERROR_NOT_FOUND;
  fl::finish_locked(b, *it, LIBUSB_TRANSFER_CANCELLED);
  return 0;
}

// Waits for a transfer to reap or an interrupt, not for `tv`: the event
// thread leaves libusb only when a test made something happen. Then reaps
// finished transfers one at a time, in the order they finished, and calls
// each one's callback without the lock, as libusb does: one not yet reaped
// can still be cancelled while another's callback runs.
int LIBUSB_CALL libusb_handle_events_timeout_completed(libusb_context* ctx, timeval*, int* completed) {
  fl::Bus& b = fl::bus();
  std::unique_lock lock(b.mu);
  if (!b.contexts.count(ctx)) {
    b.misuse.push_back("libusb_handle_events_timeout_completed on a context libusb_init did not make");
    return LIBUSB_ERROR_INVALID_PARAM;
  }
  if (completed && *completed) return 0;
  ++b.event_waiters;
  b.cv.notify_all();
  b.cv.wait(lock, [&] { return ctx->interrupted || fl::next_to_reap_locked(b) != b.flight.end(); });
  --b.event_waiters;
  if (ctx->interrupted) {
    ctx->interrupted = false;
    return 0;
  }
  for (auto it = fl::next_to_reap_locked(b); it != b.flight.end(); it = fl::next_to_reap_locked(b)) {
    libusb_transfer* t = it->t;
    const fl::Pipe pipe = it->pipe;
    t->status = it->cancelling ? LIBUSB_TRANSFER_CANCELLED : it->status;
    t->actual_length = it->actual;
    if (pipe != fl::Pipe::bulk_out && !it->bytes.empty()) std::memcpy(t->buffer, it->bytes.data(), it->bytes.size());
    ++b.reaped[fl::slot(pipe)];
    b.flight.erase(it);
    b.cv.notify_all();
    lock.unlock();
    t->callback(t);
    lock.lock();
    ++b.handled[fl::slot(pipe)];
    b.cv.notify_all();
  }
  return 0;
}

void LIBUSB_CALL libusb_interrupt_event_handler(libusb_context* ctx) {
  fl::Bus& b = fl::bus();
  std::lock_guard lock(b.mu);
  ctx->interrupted = true;
  b.cv.notify_all();
}
