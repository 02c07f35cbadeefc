// NumPy arrays as bytes for a device: which arrays can go, their layout, and
// host memory locked for the duration of a transfer.
#pragma once

#include <pybind11/numpy.h>

#include <string>

#include "common.hpp"

namespace tpuhal::python {

// The kinds of dtype a device takes as bytes: bool, signed and unsigned
// integers, floats and complex numbers (any size NumPy has).
bool numeric_kind(char kind);

// `obj` as an ndarray a device can take (numpy.asarray for other objects),
// or InvalidArgument naming why not: a non-numeric dtype (object arrays
// first of all), or memory that is not C-contiguous. `use` starts messages.
py::array device_array(const py::handle& obj, const char* use);

// A numeric dtype from anything numpy.dtype() takes; InvalidArgument if not numeric.
py::dtype numeric_dtype(const py::handle& dtype, const char* use);

Layout layout_of(const py::array& a);
py::dtype dtype_of(const Layout& l);

// "(4, 3)"
std::string shape_string(const std::vector<std::int64_t>& shape);

// A Py_buffer on an object's memory, C-contiguous (and writable if asked):
// while it is held NumPy cannot resize or free the array. Release with the
// GIL held (its destructor does; a Keep made by keep() may go anywhere).
class HostMemory {
 public:
  HostMemory(const py::handle& obj, bool writable, const char* use);
  ~HostMemory();
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  std::byte* data() const { return static_cast<std::byte*>(view_.buf); }
  std::uint64_t size() const { return static_cast<std::uint64_t>(view_.len); }
  // Moves the Py_buffer into a keep-alive handle (released with the GIL
  // taken); this object no longer holds it.
  Keep keep();

 private:
  Py_buffer view_{};
  bool held_ = false;
};

}  // namespace tpuhal::python
