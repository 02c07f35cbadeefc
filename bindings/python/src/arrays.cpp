#include "arrays.hpp"

#include <cstring>

namespace tpuhal::python {

bool numeric_kind(char kind) { return kind == 'b' || kind == 'i' || kind == 'u' || kind == 'f' || kind == 'c'; }

namespace {

std::string dtype_name(const py::dtype& d) { return py::str(py::handle(d)); }

void check_numeric(const py::dtype& d, const char* use) {
  const char kind = d.kind();
  if (kind == 'O')
    fail(Status::InvalidArgument, std::string(use) +
                                      ": an array of dtype object holds Python objects, not bytes a device can take; "
                                      "convert it first (e.g. array.astype(numpy.float64))");
  if (!numeric_kind(kind))
    fail(Status::InvalidArgument, std::string(use) + ": dtype " + dtype_name(d) +
                                      " is not numeric; a device takes bool, integer, float and complex arrays");
}

}  // namespace

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

py::array device_array(const py::handle& obj, const char* use) {
  py::array a = py::isinstance<py::array>(obj) ? py::reinterpret_borrow<py::array>(obj)
                                               : py::array(py::module_::import("numpy").attr("asarray")(obj));
  check_numeric(a.dtype(), use);
  if (!(a.flags() & py::array::c_style)) {
    std::vector<std::int64_t> shape(a.shape(), a.shape() + a.ndim()), strides(a.strides(), a.strides() + a.ndim());
    fail(Status::InvalidArgument, std::string(use) + ": the array is not C-contiguous (shape " + shape_string(shape) +
                                      ", strides " + shape_string(strides) + " bytes, dtype " + dtype_name(a.dtype()) +
                                      "); pass numpy.ascontiguousarray(array)");
  }
  return a;
}

py::dtype numeric_dtype(const py::handle& dtype, const char* use) {
  py::dtype d = py::dtype::from_args(py::reinterpret_borrow<py::object>(dtype));
  check_numeric(d, use);
  return d;
}

Layout layout_of(const py::array& a) {
  Layout l;
  const py::dtype d = a.dtype();
  l.dtype = py::str(d.attr("str"));
  l.kind = d.kind();
  l.itemsize = static_cast<std::uint32_t>(d.itemsize());
  l.shape.assign(a.shape(), a.shape() + a.ndim());
  return l;
}

py::dtype dtype_of(const Layout& l) { return py::dtype::from_args(py::str(l.dtype)); }

HostMemory::HostMemory(const py::handle& obj, bool writable, const char* use) {
  const int flags = PyBUF_ND | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) {
    // Say why in tpuhal's terms; the Python error says it in the exporter's.
    py::error_already_set why;
    fail(Status::InvalidArgument, std::string(use) + ": cannot use the memory of this " +
                                      std::string(py::str(obj.get_type().attr("__name__"))) + " as " +
                                      (writable ? "writable " : "") + "C-contiguous bytes (" + why.what() + ")");
  }
  held_ = true;
}

HostMemory::~HostMemory() {
  if (held_) PyBuffer_Release(&view_);
}

Keep HostMemory::keep() {
  auto* moved = new Py_buffer(view_);
  held_ = false;
  return keep_until([moved] {
    PyBuffer_Release(moved);
    delete moved;
  });
}

}  // namespace tpuhal::python
