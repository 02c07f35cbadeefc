// Devices: tpuhal.devices(), tpuhal.open() and tpuhal.Device.
#include <pybind11/stl.h>

#include "common.hpp"
#include "transfer.hpp"

namespace tpuhal::python {

PyDevice::PyDevice(Device d) : uri(d.uri()), device(std::move(d)) {}

PyDevice::~PyDevice() { close(); }

const Device& PyDevice::get() const {
  if (!device)
    fail(Status::FailedPrecondition, uri +
                                         " is closed (Device.close() or the end of its with block); "
                                         "open it again with tpuhal.open('" +
                                         uri + "')");
  return device;
}

std::shared_ptr<Transfers> PyDevice::transfers() const {
  if (!transfers_) transfers_ = Transfers::shared(get());
  return transfers_;
}

void PyDevice::close() {
  // Dropping the last handles may release the transfer queue, which waits
  // for its work: not with the GIL held.
  Device d = std::move(device);
  device = Device();
  auto t = std::move(transfers_);
  without_gil([&] {
    t.reset();
    d = Device();
  });
}

namespace {

std::shared_ptr<PyDevice> open_device(const std::string& uri) {
  Device d = without_gil([&] { return open(uri); });
  return std::make_shared<PyDevice>(std::move(d));
}

}  // namespace

void bind_device(py::module_& m) {
  m.def(
      "devices", [] { return without_gil([] { return enumerate(); }); },
      "Every device every installed driver can see, in driver order: a list of DeviceInfo "
      "(uri, driver, board, memory_bytes). Drivers that cannot run here list nothing; "
      "unavailable_drivers() says why.");
  m.def(
      "unavailable_drivers", [] { return without_gil([] { return unavailable_drivers(); }); },
      "Drivers that found nothing because something is missing, as (driver, reason) pairs.");
  m.def(
      "protocol_versions", [] { return protocol_versions(); },
      "What each driver speaks to its boards, with the version, as (URI scheme, protocol) pairs: "
      "('sim', 'firmware interface 1.16'), ('simd', 'simulator daemon protocol 5, firmware interface "
      "1.16'). A board or daemon of another version is refused with tpuhal.VersionMismatch.");
  m.def("open", &open_device, py::arg("uri"),
        "Opens a device by URI: 'sim:0' (the first simulated board), 'sim:tiny' (a board of the "
        "built-in profile 'tiny'), 'sim:/path/board.json'. Returns a Device, usable as a context "
        "manager. Opening a URI already open returns another handle to the same device. Raises "
        "tpuhal.NotFound naming the devices there are.");

  auto cls = py::reinterpret_borrow<py::class_<PyDevice, std::shared_ptr<PyDevice>>>(m.attr("Device"));
  cls.def_property_readonly(
         "uri", [](const PyDevice& d) { return d.uri; }, "The URI it was opened with, e.g. 'sim:0'.")
      .def_property_readonly("closed", &PyDevice::closed, "True once close() was called.")
      .def_property_readonly(
          "properties", [](const PyDevice& d) { return d.get().properties(); },
          "What the device is and can do (tpuhal.Properties): board, bus, memory and heaps, engines, caps.")
      .def(
          "memory_stats", [](const PyDevice& d) { return d.get().memory_stats(); },
          "Memory use now (tpuhal.MemoryStats): per heap total, used, free, largest free block, "
          "allocations and peak; pinned and imported host memory.")
      .def(
          "status", [](const PyDevice& d) { return d.get().status(); },
          "Board uptime and, per hardware queue, whether it is claimed, busy or failed (tpuhal.DeviceStatus).")
      .def(
          "telemetry", [](const PyDevice& d) { return d.get().telemetry(); },
          "The board's counters and sensors (tpuhal.Telemetry); takes no queue and waits for no work. "
          "tpuhal.Unsupported where caps.telemetry is false.")
      .def(
          "reset",
          [](const PyDevice& d) {
            Device dev = d.get();
            without_gil([&] { dev.reset(); });
          },
          "Resets the board after a fault (DeviceFault, DeviceLost, Timeout) and brings it back. Queues "
          "claimed before stay failed: drop them and claim new ones. Buffers survive; their contents may "
          "not. tpuhal.DeviceLost if the board does not come back.")
      .def(
          "alloc",
          [](const PyDevice& d, std::uint64_t size, py::handle memory, std::optional<std::string> heap,
             std::uint64_t alignment) {
            Device dev = d.get();
            const Memory kind = to_memory(memory);
            AllocOptions o;
            o.alignment = alignment;
            if (heap) o.heap = *heap;
            Buffer b = without_gil([&] { return dev.allocate(size, kind, o); });
            return std::make_shared<PyBuffer>(std::move(b));
          },
          py::arg("size"), py::arg("memory") = "device", py::kw_only(), py::arg("heap") = py::none(),
          py::arg("alignment") = 0,
          "Allocates `size` bytes (> 0) of `memory`: 'device' (default), 'device_host_visible' or "
          "'host_pinned' (or a tpuhal.Memory). `heap` picks a heap by name (Properties.heaps), "
          "`alignment` a power of two (0: the device's min_alignment). Raises tpuhal.OutOfMemory saying "
          "what is used and free, and the largest block that would fit.")
      .def_property(
          "wait_policy", [](const PyDevice& d) { return d.get().wait_policy(); },
          [](const PyDevice& d, const WaitPolicy& p) {
            Device dev = d.get();
            dev.set_wait_policy(p);
          },
          "How waits on this device wait (tpuhal.WaitPolicy). Assign a new WaitPolicy to change it; "
          "it applies to every handle of the device.")
      .def("close", &PyDevice::close,
           "Drops this handle (and, with the last handle, the queue and staging buffers that upload and "
           "download use). Buffers and queues made from it stay valid while referenced. Calling it twice "
           "is harmless.")
      .def("__enter__", [](const std::shared_ptr<PyDevice>& d) { return d; })
      .def(
          "__exit__", [](PyDevice& d, const py::args&) { d.close(); }, "Closes the device.")
      .def("__eq__",
           [](const PyDevice& a, const py::object& b) {
             return py::isinstance<PyDevice>(b) && a.uri == b.cast<const PyDevice&>().uri;
           })
      .def("__hash__", [](const PyDevice& d) { return py::hash(py::str(d.uri)); })
      .def("__repr__", [](const PyDevice& d) {
        if (d.closed()) return "<tpuhal.Device " + d.uri + " (closed)>";
        return "<tpuhal.Device " + d.uri + ": " + d.device.properties().board + ">";
      });
}

}  // namespace tpuhal::python
