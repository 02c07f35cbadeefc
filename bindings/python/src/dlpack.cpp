// DLPack: Buffer.__dlpack__() / __dlpack_device__() export host-visible
// buffers without a copy; tpuhal.from_dlpack() imports host tensors.
//
// Device types: memory the host reaches (HostPinned; DeviceHostVisible;
// Device where caps.map_device_memory) is kDLCPU. Device memory the host
// cannot reach has no DLPack device on boards DLPack has no type for (the
// simulated TPU and its kin), and exporting it raises Unsupported saying
// what to do. A CUDA device (driver "cuda", URI "cuda:N") maps its device
// memory to kDLCUDA N and its pinned host memory to kDLCUDAHost: the table
// is dlpack_device() below.
#include <unistd.h>

#include <bit>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include <pybind11/stl.h>

#include "arrays.hpp"
#include "dlpack.h"

#include "tpuhal/base/hex.h"

namespace tpuhal::python {
namespace {

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";

// DLPack's device for memory of kind `memory` on a device of driver `driver`
// opened as `uri`, or nullopt where no DLPack device can reach it.
std::optional<DLDevice> dlpack_device(const std::string& driver, const std::string& uri, Memory memory,
                                      bool map_device_memory) {
  if (driver == "cuda") {
    if (memory == Memory::HostPinned) return DLDevice{kDLCUDAHost, 0};
    const auto colon = uri.find(':');
    std::int32_t index = 0;
    if (colon != std::string::npos) {
      try {
        index = static_cast<std::int32_t>(std::stol(uri.substr(colon + 1)));
      } catch (const std::exception&) {
        index = 0;
      }
    }
    return DLDevice{kDLCUDA, index};
  }
  if (memory == Memory::HostPinned || memory == Memory::DeviceHostVisible || map_device_memory)
    return DLDevice{kDLCPU, 0};
  return std::nullopt;
}

DLDevice device_of(const PyBuffer& b, const char* use) {
  const Buffer& buf = b.get(use);
  const Properties& p = buf.device().properties();
  if (auto d = dlpack_device(p.driver, p.uri, buf.memory(), p.caps.map_device_memory)) return *d;
  fail(Status::Unsupported,
       std::string(use) + ": the " + b.describe() +
           " is not host-visible (caps.map_device_memory is false) and DLPack has no device type for " + p.driver +
           " device memory; allocate it with memory='device_host_visible' or 'host_pinned' to "
           "share it without a copy, or copy it out with Buffer.download()");
}

DLDataType dl_dtype(const Layout& l, const char* use) {
  if (l.dtype.size() > 1 && l.dtype[0] == (std::endian::native == std::endian::little ? '>' : '<'))
    fail(Status::InvalidArgument, std::string(use) + ": dtype " + l.dtype +
                                      " is not in native byte order, which DLPack requires; upload "
                                      "array.astype(array.dtype.newbyteorder('='))");
  std::uint8_t code = kDLUInt;
  switch (l.kind) {
    case 'b': code = kDLBool; break;
    case 'i': code = kDLInt; break;
    case 'u': code = kDLUInt; break;
    case 'f': code = kDLFloat; break;
    case 'c': code = kDLComplex; break;
    default: fail(Status::Internal, std::string(use) + ": no DLPack type for dtype " + l.dtype);
  }
  return {code, static_cast<std::uint8_t>(l.itemsize * 8), 1};
}

// What a consumer holds: the DLManagedTensor, and a host view of the buffer
// that keeps it (and its device, and memory it imported) alive. The deleter
// may run on any thread, with or without the GIL.
struct Export {
  DLManagedTensor managed{};
  std::vector<std::int64_t> shape;
  std::unique_ptr<HostView> view;
};

void delete_export(DLManagedTensor* m) { delete static_cast<Export*>(m->manager_ctx); }

// A capsule nobody consumed still owns its tensor.
void capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, kUsedCapsuleName)) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (!m)
    PyErr_WriteUnraisable(capsule);
  else if (m->deleter)
    m->deleter(m);
  PyErr_Restore(type, value, traceback);
}

py::object to_dlpack(const BufferRef& self, const py::object& stream) {
  const char* use = "__dlpack__";
  if (!stream.is_none())
    fail(Status::InvalidArgument,
         std::string(use) + ": stream must be None for host memory (kDLCPU), got " + std::string(py::repr(stream)));
  const DLDevice device = device_of(*self, use);
  const std::span<std::byte> bytes = self->buffer.map();
  Layout l = self->layout ? *self->layout : Layout{"|u1", 'u', 1, {static_cast<std::int64_t>(self->buffer.size())}};
  auto ex = std::make_unique<Export>();
  ex->shape = l.shape;
  ex->view = std::make_unique<HostView>(self);
  DLTensor& t = ex->managed.dl_tensor;
  t.data = bytes.data();
  t.device = device;
  t.ndim = static_cast<std::int32_t>(ex->shape.size());
  t.dtype = dl_dtype(l, use);
  t.shape = ex->shape.data();
  t.strides = nullptr;  // compact row-major
  t.byte_offset = 0;
  ex->managed.manager_ctx = ex.get();
  ex->managed.deleter = &delete_export;
  PyObject* capsule = PyCapsule_New(&ex->managed, kCapsuleName, &capsule_destructor);
  if (!capsule) throw py::error_already_set();
  ex.release();  // the capsule owns it now
  return py::reinterpret_steal<py::object>(capsule);
}

py::tuple dlpack_device_of(const BufferRef& self) {
  const DLDevice d = device_of(*self, "__dlpack_device__");
  return py::make_tuple(static_cast<int>(d.device_type), d.device_id);
}

// ---- Import ----------------------------------------------------------------------

bool host_accessible(std::int64_t type) {
  return type == kDLCPU || type == kDLCUDAHost || type == kDLCUDAManaged || type == kDLROCMHost;
}

// NumPy's dtype.str for a DLPack type, or Unsupported.
Layout layout_of_tensor(const DLTensor& t) {
  const DLDataType d = t.dtype;
  if (d.lanes != 1)
    fail(Status::Unsupported, "from_dlpack: vector dtypes (" + std::to_string(d.lanes) + " lanes) are not supported");
  char kind = 0;
  switch (d.code) {
    case kDLBool: kind = 'b'; break;
    case kDLInt: kind = 'i'; break;
    case kDLUInt: kind = 'u'; break;
    case kDLFloat: kind = 'f'; break;
    case kDLComplex: kind = 'c'; break;
    default: break;
  }
  const bool sized = d.bits == 8 || d.bits == 16 || d.bits == 32 || d.bits == 64 || (kind == 'c' && d.bits == 128);
  if (!kind || !sized || (kind == 'b' && d.bits != 8) || (kind == 'f' && d.bits == 8) || (kind == 'c' && d.bits < 64))
    fail(Status::Unsupported, "from_dlpack: DLPack dtype code " + std::to_string(d.code) + " with " +
                                  std::to_string(d.bits) +
                                  " bits has no NumPy equivalent (tpuhal takes bool, "
                                  "integers, float16/32/64 and complex64/128)");
  Layout l;
  l.kind = kind;
  l.itemsize = d.bits / 8;
  l.dtype = std::string(l.itemsize == 1 ? "|" : (std::endian::native == std::endian::little ? "<" : ">")) + kind +
            std::to_string(l.itemsize);
  if (t.ndim < 0) fail(Status::InvalidArgument, "from_dlpack: ndim is " + std::to_string(t.ndim));
  l.shape.assign(t.shape, t.shape + t.ndim);
  for (auto s : l.shape)
    if (s < 0)
      fail(Status::InvalidArgument, "from_dlpack: shape " + shape_string(l.shape) + " has a negative dimension");
  // Strides (in elements) must describe compact row-major memory; dimensions
  // of extent 1 may carry any stride.
  if (t.strides) {
    std::int64_t expect = 1;
    for (std::int32_t i = t.ndim - 1; i >= 0; --i) {
      if (l.shape[i] != 1 && t.strides[i] != expect) {
        std::vector<std::int64_t> strides(t.strides, t.strides + t.ndim);
        fail(Status::InvalidArgument, "from_dlpack: the tensor is not C-contiguous (shape " + shape_string(l.shape) +
                                          ", strides " + shape_string(strides) +
                                          " elements); make it contiguous first");
      }
      expect *= l.shape[i];
    }
  }
  return l;
}

std::shared_ptr<PyBuffer> from_dlpack(const py::object& obj, const py::object& device_arg, std::optional<bool> copy) {
  std::shared_ptr<PyDevice> owned;
  const PyDevice* pd;
  if (py::isinstance<py::str>(device_arg)) {
    owned = std::make_shared<PyDevice>(without_gil([&] { return open(device_arg.cast<std::string>()); }));
    pd = owned.get();
  } else if (py::isinstance<PyDevice>(device_arg)) {
    pd = &device_arg.cast<const PyDevice&>();
  } else {
    throw py::type_error("from_dlpack: device must be a tpuhal.Device or a URI such as 'sim:0', not " +
                         std::string(py::str(device_arg.get_type().attr("__name__"))));
  }
  Device dev = pd->get();

  py::object capsule;
  if (PyCapsule_CheckExact(obj.ptr())) {
    capsule = obj;
  } else {
    if (!py::hasattr(obj, "__dlpack__"))
      fail(Status::InvalidArgument, "from_dlpack: a " + std::string(py::str(obj.get_type().attr("__name__"))) +
                                        " has no __dlpack__ (pass a NumPy array or another DLPack producer)");
    if (py::hasattr(obj, "__dlpack_device__")) {
      py::tuple where = obj.attr("__dlpack_device__")();
      const auto type = where[0].cast<std::int64_t>();
      if (!host_accessible(type))
        fail(Status::Unsupported, "from_dlpack: the tensor is on DLPack device type " + std::to_string(type) +
                                      "; tpuhal imports host memory (kDLCPU): copy it to the host first");
    }
    capsule = obj.attr("__dlpack__")();
  }
  if (PyCapsule_IsValid(capsule.ptr(), kUsedCapsuleName))
    fail(Status::InvalidArgument, "from_dlpack: this DLPack capsule was already consumed");
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kCapsuleName));
  if (!managed) {
    PyErr_Clear();
    fail(Status::InvalidArgument, "from_dlpack: expected a PyCapsule named 'dltensor'");
  }
  // The tensor is ours from here: its producer's deleter runs when the last
  // holder (the buffer, work using it, or this function) lets go.
  if (PyCapsule_SetName(capsule.ptr(), kUsedCapsuleName) != 0) throw py::error_already_set();
  Keep tensor = keep_until([managed] {
    if (managed->deleter) managed->deleter(managed);
  });

  const DLTensor& t = managed->dl_tensor;
  if (!host_accessible(t.device.device_type))
    fail(Status::Unsupported, "from_dlpack: the tensor is on DLPack device type " +
                                  std::to_string(static_cast<int>(t.device.device_type)) +
                                  "; tpuhal imports host memory (kDLCPU): copy it to the host first");
  Layout layout = layout_of_tensor(t);
  std::uint64_t n = layout.itemsize;
  for (auto s : layout.shape) n *= static_cast<std::uint64_t>(s);
  if (n == 0)
    fail(Status::InvalidArgument, "from_dlpack: the tensor is empty (shape " + shape_string(layout.shape) +
                                      "); a buffer holds at least one byte");
  auto* data = static_cast<std::byte*>(t.data) + t.byte_offset;

  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const bool can_import = dev.properties().caps.import_host_memory;
  const bool aligned = reinterpret_cast<std::uintptr_t>(data) % page == 0 && n % page == 0;
  if (copy != true && can_import && aligned) {
    Buffer b = without_gil([&] { return dev.import_host(data, n); });
    return std::make_shared<PyBuffer>(std::move(b), std::move(tensor), std::move(layout));
  }
  if (copy == false) {
    if (!can_import)
      fail(Status::Unsupported, "from_dlpack(copy=False): " + dev.uri() +
                                    " cannot import host memory (caps.import_host_memory is false); "
                                    "allow a copy (copy=None)");
    fail(Status::InvalidArgument, "from_dlpack(copy=False): the tensor's memory at " +
                                      hex(reinterpret_cast<std::uintptr_t>(data)) + " (" + std::to_string(n) +
                                      " bytes) is not whole pages (" + std::to_string(page) + " bytes): " + dev.uri() +
                                      " imports only page-aligned address and size; allow a copy "
                                      "(copy=None) or allocate the array page-aligned");
  }
  Buffer b = without_gil([&] {
    Buffer pinned = dev.allocate(n, Memory::HostPinned);
    std::memcpy(pinned.map().data(), data, n);
    return pinned;
  });
  return std::make_shared<PyBuffer>(std::move(b), Keep(), std::move(layout));
}

}  // namespace

void bind_dlpack(py::module_& m) {
  auto cls = py::reinterpret_borrow<py::class_<PyBuffer, BufferRef>>(m.attr("Buffer"));
  cls.def("__dlpack__", &to_dlpack, py::arg("stream") = py::none(),
          "Exports the buffer as a DLPack capsule without a copy (numpy.from_dlpack(buffer), "
          "torch.from_dlpack(buffer)): host-visible memory as kDLCPU, with the dtype and shape it was "
          "uploaded or imported with (else uint8 bytes). The consumer keeps the buffer and its device "
          "alive; free() refuses while it does. Device memory the host cannot reach raises "
          "tpuhal.Unsupported: allocate 'device_host_visible' or 'host_pinned' memory, or download().")
      .def("__dlpack_device__", &dlpack_device_of,
           "(device_type, device_id) in DLPack's terms: (1, 0), kDLCPU, for host-visible memory.");

  m.def("from_dlpack", &from_dlpack, py::arg("obj"), py::arg("device"), py::kw_only(), py::arg("copy") = py::none(),
        "A Buffer of `device` (a Device or a URI) holding a host DLPack tensor (a NumPy array, or anything "
        "with __dlpack__, or a 'dltensor' capsule), C-contiguous, of a numeric dtype. Where the device can "
        "import host memory and the tensor's address and size are whole pages, the buffer is the tensor's "
        "memory, without a copy, and keeps the tensor alive. Otherwise (copy=None, the default) its bytes "
        "are copied into new host-pinned memory; copy=False raises instead (tpuhal.InvalidArgument, or "
        "Unsupported where the device cannot import), copy=True always copies. The buffer remembers the "
        "tensor's dtype and shape.");
  m.def(
      "_dlpack_device_for",
      [](const std::string& driver, const std::string& uri, py::handle memory, bool map_device_memory) -> py::object {
        auto d = dlpack_device(driver, uri, to_memory(memory), map_device_memory);
        if (!d) return py::none();
        return py::make_tuple(static_cast<int>(d->device_type), d->device_id);
      },
      py::arg("driver"), py::arg("uri"), py::arg("memory"), py::arg("map_device_memory"),
      "Internal: the DLPack (device_type, device_id) for memory of a driver's device, or None (tests the "
      "table for drivers this machine lacks).");
}

}  // namespace tpuhal::python
