// Buffers: tpuhal.Buffer, Device.upload(), Device.import_host(), and the host
// side of a buffer: upload(), download(), map().
#include <cinttypes>
#include <cstdio>

#include <pybind11/stl.h>

#include "arrays.hpp"
#include "transfer.hpp"

namespace tpuhal::python {

PyBuffer::PyBuffer(Buffer b, Keep owner_of_memory, std::optional<Layout> l)
    : buffer(std::move(b)), owner(std::move(owner_of_memory)), layout(std::move(l)) {}

std::string PyBuffer::describe() const {
  char addr[32];
  std::snprintf(addr, sizeof addr, "0x%" PRIx64, buffer.device_address());
  return std::to_string(buffer.size()) + "-byte " + to_string(buffer.memory()) + " buffer at " + addr + " on " +
         buffer.device().uri();
}

const Buffer& PyBuffer::get(const char* use) const {
  if (!buffer.valid()) fail(Status::FailedPrecondition, std::string(use) + ": the " + describe() + " was freed");
  return buffer;
}

const Buffer& buffer_arg(const BufferRef& b, const char* use) {
  if (!b) fail(Status::InvalidArgument, std::string(use) + ": a Buffer is needed, not None");
  return b->buffer;  // tpuhal checks it is live as it records
}

namespace {

const Queue* queue_arg(const std::optional<QueueRef>& q) { return q && *q ? &(*q)->queue : nullptr; }

// Checks [offset, offset + n) lies in `b` ("upload of 8192 bytes at offset 0
// exceeds the 4096-byte device buffer at 0x10000000 on sim:0").
void check_range(const PyBuffer& b, std::uint64_t offset, std::uint64_t n, const char* use) {
  const std::uint64_t size = b.buffer.size();
  if (offset > size || n > size - offset)
    fail(Status::OutOfRange, std::string(use) + " of " + std::to_string(n) + " bytes at offset " +
                                 std::to_string(offset) + " exceeds the " + b.describe());
}

std::shared_ptr<Transfers> transfers_of(const Buffer& b) { return Transfers::shared(b.device()); }

void upload_into(const BufferRef& self, const py::handle& array, std::uint64_t offset,
                 const std::optional<QueueRef>& queue) {
  const Buffer& b = self->get("upload");
  py::array a = device_array(array, "upload");
  check_range(*self, offset, static_cast<std::uint64_t>(a.nbytes()), "upload");
  HostMemory host(a, /*writable=*/false, "upload");
  HostView busy(self);  // free() refuses while the bytes move
  auto t = transfers_of(b);
  without_gil([&] { t->write(b, offset, host.data(), host.size(), queue_arg(queue)); });
}

py::array download(const BufferRef& self, const py::object& dtype, const py::object& shape, std::uint64_t offset,
                   const py::object& out, const std::optional<QueueRef>& queue) {
  const Buffer& b = self->get("download");
  py::array result;
  if (!out.is_none()) {
    if (!dtype.is_none() || !shape.is_none())
      fail(Status::InvalidArgument, "download: give dtype and shape, or out=, not both (out= has its own)");
    if (!py::isinstance<py::array>(out))
      fail(Status::InvalidArgument,
           "download: out= must be a numpy.ndarray, not " + std::string(py::str(out.get_type().attr("__name__"))));
    result = device_array(out, "download");
  } else {
    const std::uint64_t size = b.size();
    if (offset > size)
      fail(Status::OutOfRange,
           "download at offset " + std::to_string(offset) + " is past the end of the " + self->describe());
    const auto& l = self->layout;
    py::dtype dt =
        dtype.is_none() ? (l ? dtype_of(*l) : py::dtype::of<std::uint8_t>()) : numeric_dtype(dtype, "download");
    std::vector<py::ssize_t> dims;
    if (!shape.is_none()) {
      if (py::isinstance<py::int_>(shape))
        dims.push_back(shape.cast<py::ssize_t>());
      else
        dims = shape.cast<std::vector<py::ssize_t>>();
    } else if (l && offset == 0 && dt.equal(dtype_of(*l))) {
      dims.assign(l->shape.begin(), l->shape.end());
    } else {
      const auto item = static_cast<std::uint64_t>(dt.itemsize());
      if ((size - offset) % item)
        fail(Status::InvalidArgument, "download: the " + std::to_string(size - offset) + " bytes from offset " +
                                          std::to_string(offset) + " are not a whole number of " +
                                          std::string(py::str(dt)) + " (" + std::to_string(item) +
                                          " bytes each); give a shape");
      dims.push_back(static_cast<py::ssize_t>((size - offset) / item));
    }
    for (auto d : dims)
      if (d < 0) fail(Status::InvalidArgument, "download: shape has a negative dimension (" + std::to_string(d) + ")");
    result = py::array(dt, dims);
  }
  const auto n = static_cast<std::uint64_t>(result.nbytes());
  check_range(*self, offset, n, "download");
  HostMemory host(result, /*writable=*/true, "download");
  HostView busy(self);
  auto t = transfers_of(b);
  without_gil([&] { t->read(b, offset, host.data(), n, queue_arg(queue)); });
  return result;
}

py::array map(const BufferRef& self, const py::object& dtype, const py::object& shape) {
  const Buffer& b = self->get("map");
  const std::span<std::byte> bytes = b.map();  // Unsupported for memory the host cannot reach
  const auto& l = self->layout;
  py::dtype dt = dtype.is_none() ? (l ? dtype_of(*l) : py::dtype::of<std::uint8_t>()) : numeric_dtype(dtype, "map");
  const auto item = static_cast<std::uint64_t>(dt.itemsize());
  std::vector<py::ssize_t> dims;
  if (!shape.is_none()) {
    if (py::isinstance<py::int_>(shape))
      dims.push_back(shape.cast<py::ssize_t>());
    else
      dims = shape.cast<std::vector<py::ssize_t>>();
  } else if (l && dt.equal(dtype_of(*l))) {
    dims.assign(l->shape.begin(), l->shape.end());
  } else {
    if (bytes.size() % item)
      fail(Status::InvalidArgument, "map: the " + self->describe() + " is not a whole number of " +
                                        std::string(py::str(dt)) + " (" + std::to_string(item) +
                                        " bytes each); give a shape");
    dims.push_back(static_cast<py::ssize_t>(bytes.size() / item));
  }
  std::uint64_t n = item;
  for (auto d : dims) {
    if (d < 0) fail(Status::InvalidArgument, "map: shape has a negative dimension (" + std::to_string(d) + ")");
    n *= static_cast<std::uint64_t>(d);
  }
  if (n > bytes.size())
    fail(Status::OutOfRange, "map: a view of " + std::to_string(n) + " bytes exceeds the " + self->describe());
  // The array's base holds a host view of the buffer: the buffer (and its
  // device) live while the array does, and free() refuses until it goes.
  py::capsule token(new HostView(self), [](void* p) { delete static_cast<HostView*>(p); });
  return py::array(dt, dims, {}, bytes.data(), token);
}

}  // namespace

void bind_buffer(py::module_& m) {
  auto cls = py::reinterpret_borrow<py::class_<PyBuffer, BufferRef>>(m.attr("Buffer"));
  cls.def_property_readonly(
         "size", [](const PyBuffer& b) { return b.buffer.size(); }, "Size in bytes.")
      .def_property_readonly(
          "nbytes", [](const PyBuffer& b) { return b.buffer.size(); }, "Size in bytes (as numpy's nbytes).")
      .def(
          "__len__", [](const PyBuffer& b) { return b.buffer.size(); }, "Size in bytes.")
      .def_property_readonly(
          "memory", [](const PyBuffer& b) { return from_memory(b.buffer.memory()); },
          "Where it lives: a tpuhal.Memory (also its string value, e.g. 'device').")
      .def_property_readonly(
          "heap", [](const PyBuffer& b) { return b.buffer.heap(); }, "The heap it came from ('' for host memory).")
      .def_property_readonly(
          "device_address", [](const PyBuffer& b) { return b.buffer.device_address(); },
          "The address the board uses for it (diagnostics).")
      .def_property_readonly(
          "device", [](const PyBuffer& b) { return std::make_shared<PyDevice>(b.buffer.device()); },
          "A new Device handle for the device it belongs to.")
      .def_property_readonly(
          "valid", [](const PyBuffer& b) { return b.buffer.valid(); }, "False once freed.")
      .def_property_readonly(
          "dtype",
          [](const PyBuffer& b) -> py::object {
            if (!b.layout) return py::none();
            return dtype_of(*b.layout);
          },
          "The numpy dtype it was uploaded or imported with (download(), map() and DLPack use it), or "
          "None for a buffer made by alloc().")
      .def_property_readonly(
          "shape",
          [](const PyBuffer& b) -> py::object {
            if (!b.layout) return py::none();
            py::tuple t(b.layout->shape.size());
            for (std::size_t i = 0; i < b.layout->shape.size(); ++i) t[i] = b.layout->shape[i];
            return t;
          },
          "The shape it was uploaded or imported with, or None.")
      .def(
          "free",
          [](PyBuffer& b) {
            if (const int views = b.host_views.load(); views > 0)
              fail(Status::FailedPrecondition,
                   "free: the " + b.describe() + " has " + std::to_string(views) +
                       " host view(s) alive (arrays from map() or numpy.from_dlpack(), or a transfer in "
                       "progress); delete them first, or drop the Buffer and let the last view free it");
            without_gil([&] { b.buffer.free(); });
            b.owner.reset();  // queued work that still uses imported memory keeps its owner itself
          },
          "Releases the buffer now; its memory returns to the device once queued work that uses it "
          "completes. Using it afterwards raises tpuhal.FailedPrecondition. Raises FailedPrecondition "
          "while arrays from map() or DLPack view it. Calling free() twice is harmless. Dropping the last "
          "reference frees it too.")
      .def("upload", &upload_into, py::arg("array"), py::arg("offset") = 0, py::kw_only(),
           py::arg("queue") = py::none(),
           "Copies the bytes of a C-contiguous numeric array (numpy.ndarray or anything numpy.asarray "
           "takes) into this buffer at byte `offset`, and returns once they are there. `queue`: a Queue of "
           "yours to move them on (default: the device's transfer queue). Not ordered with work queued "
           "on other queues. Raises tpuhal.OutOfRange if they do not fit, tpuhal.InvalidArgument for "
           "object, non-numeric or non-contiguous arrays.")
      .def("download", &download, py::arg("dtype") = py::none(), py::arg("shape") = py::none(), py::kw_only(),
           py::arg("offset") = 0, py::arg("out") = py::none(), py::arg("queue") = py::none(),
           "Copies the buffer's bytes (from byte `offset`) into a new numpy array of `dtype` and `shape` "
           "and returns it. Defaults: the dtype and shape the buffer was uploaded or imported with, else "
           "uint8 over the whole buffer; a dtype alone takes as many elements as fit. `out`: fill this "
           "C-contiguous array instead. Raises tpuhal.OutOfRange if the shape does not fit.")
      .def("to_numpy", &download, py::arg("dtype") = py::none(), py::arg("shape") = py::none(), py::kw_only(),
           py::arg("offset") = 0, py::arg("out") = py::none(), py::arg("queue") = py::none(), "The same as download().")
      .def("map", &map, py::arg("dtype") = py::none(), py::arg("shape") = py::none(),
           "A writable numpy array viewing the buffer's memory, without a copy: host-pinned and "
           "device-host-visible memory, and device memory where caps.map_device_memory (else "
           "tpuhal.Unsupported says which memory to use). Defaults as download(). The array keeps the "
           "buffer alive; free() refuses while it exists.")
      .def("__repr__", [](const PyBuffer& b) {
        return "<tpuhal.Buffer " + b.describe() + (b.buffer.valid() ? "" : " (freed)") + ">";
      });

  auto dev = py::reinterpret_borrow<py::class_<PyDevice, std::shared_ptr<PyDevice>>>(m.attr("Device"));
  dev.def(
         "upload",
         [](const PyDevice& d, const py::handle& array, py::handle memory, const std::optional<QueueRef>& queue) {
           Device device = d.get();
           const Memory kind = to_memory(memory);
           py::array a = device_array(array, "upload");
           const auto n = static_cast<std::uint64_t>(a.nbytes());
           HostMemory host(a, /*writable=*/false, "upload");
           auto t = d.transfers();
           Buffer b = without_gil([&] {
             Buffer out = device.allocate(n, kind);
             t->write(out, 0, host.data(), n, queue_arg(queue));
             return out;
           });
           return std::make_shared<PyBuffer>(std::move(b), Keep(), layout_of(a));
         },
         py::arg("array"), py::arg("memory") = "device", py::kw_only(), py::arg("queue") = py::none(),
         "Allocates a buffer of `memory` (default 'device') the size of a C-contiguous numeric array, "
         "copies the array into it and returns it once the bytes are there. The buffer remembers the "
         "array's dtype and shape, so buffer.download() gives the array back. Large arrays reach the "
         "device without a host-side copy where the board can import host memory.")
      .def(
          "import_host",
          [](const PyDevice& d, const py::handle& obj) {
            Device device = d.get();
            HostMemory host(obj, /*writable=*/true, "import_host");
            std::optional<Layout> layout;
            if (py::isinstance<py::array>(obj)) layout = layout_of(py::reinterpret_borrow<py::array>(obj));
            Buffer b = without_gil([&] { return device.import_host(host.data(), host.size()); });
            return std::make_shared<PyBuffer>(std::move(b), host.keep(), std::move(layout));
          },
          py::arg("obj"),
          "Makes the memory of a writable, C-contiguous object (a numpy array, bytearray, mmap, ...) "
          "reachable by the device without a copy (caps.import_host_memory). Its address and size must be "
          "page-aligned (tpuhal.InvalidArgument otherwise). The buffer keeps the object alive (and "
          "unresizable) while it, or work using it, lives; the buffer's memory is 'host_pinned'.");
}

}  // namespace tpuhal::python
