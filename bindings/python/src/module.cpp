// tpuhal._tpuhal: the compiled half of the `tpuhal` Python package (the
// package's __init__.py re-exports it and adds Pythonic sugar).
//
// The classes are declared first, so that every signature names them
// whichever area defines its methods; then each area (one .cpp each) binds
// its part. A new area (tensor ops, programs, video decoding) declares its
// classes here and adds its bind_*() call below.
#include "common.hpp"

namespace tpuhal::python {
namespace {

void declare_classes(py::module_& m) {
  py::class_<PyDevice, std::shared_ptr<PyDevice>>(
      m, "Device",
      "An open device (tpuhal.open()). A context manager: leaving the `with` block closes this handle. "
      "Buffers and queues made from it hold their own handles and stay valid while referenced.");
  py::class_<PyBuffer, BufferRef>(
      m, "Buffer",
      "Memory on or for a device (Device.alloc(), Device.upload(), tpuhal.from_dlpack()). Freed when the "
      "last reference goes and no queued work uses it any more, or by free().");
  py::class_<PyQueue, QueueRef>(
      m, "Queue",
      "An in-order stream of work on one hardware queue (Device.queue()). Safe to use from several threads.");
  py::class_<PyBatch>(
      m, "Batch",
      "Commands recorded for one queue and submitted as a unit (Queue.batch(), or a Queue shortcut such as "
      "Queue.copy()). Each method records one command, checks its arguments at once and returns the batch, "
      "so calls chain: q.batch().copy(a, b).fill(b, 0).submit(). Nothing reaches the device before submit().");
  py::class_<PyFence>(
      m, "Fence",
      "The point on a queue's timeline that a submission reaches when it and everything submitted before "
      "it on that queue have completed (Batch.submit()).");
}

}  // namespace
}  // namespace tpuhal::python

PYBIND11_MODULE(_tpuhal, m) {
  using namespace tpuhal::python;
  m.doc() = "tpuhal's compiled bindings; import the `tpuhal` package instead.";
  declare_classes(m);
  bind_errors(m);
  bind_types(m);
  bind_device(m);
  bind_buffer(m);
  bind_queue(m);
  bind_dlpack(m);
  bind_ops(m);
  bind_video(m);
  bind_validation(m);
  bind_trace(m);
  bind_runtime(m);
  bind_bench(m);

  // Classes present themselves as tpuhal.X, where users find them.
  for (auto item : m.attr("__dict__").cast<py::dict>()) {
    py::handle value = item.second;
    if (PyType_Check(value.ptr()) && py::str(value.attr("__module__")).cast<std::string>() == "tpuhal._tpuhal")
      value.attr("__module__") = "tpuhal";
  }
  m.attr("__version__") = tpuhal::version();
}
