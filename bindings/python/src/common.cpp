// The interpreter, the GIL and keep-alive handles.
#include "common.hpp"

namespace tpuhal::python {
namespace {

// Runs a release function once, with the GIL taken.
class Releaser {
 public:
  explicit Releaser(std::function<void()> release) : release_(std::move(release)) {}
  ~Releaser() {
    if (!release_ || !python_alive()) return;  // leaked at exit, as CPython allows
    const PyGILState_STATE state = PyGILState_Ensure();
    try {
      release_();
    } catch (...) {
      // A release that fails has nothing left to release; never throw from here.
    }
    PyGILState_Release(state);
  }
  Releaser(const Releaser&) = delete;
  Releaser& operator=(const Releaser&) = delete;

 private:
  std::function<void()> release_;
};

}  // namespace

bool python_alive() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

Keep keep_until(std::function<void()> release) { return std::make_shared<Releaser>(std::move(release)); }

Keep keep_object(py::object obj) {
  PyObject* raw = obj.release().ptr();
  return keep_until([raw] { Py_DECREF(raw); });
}

}  // namespace tpuhal::python
