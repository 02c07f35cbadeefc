// What the areas of the Python module share: the objects behind the Python
// classes, enum conversions, GIL helpers and the keep-alive handles that tie
// Python-owned memory to tpuhal's lifetimes.
//
// Each area of the module is one .cpp with one bind_*() function, called in
// order from module.cpp. A new area (tensor ops, programs, video) adds a file
// and a line there.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tpuhal/tpuhal.hpp"

namespace tpuhal::python {

namespace py = pybind11;

// ---- Areas -----------------------------------------------------------------------

void bind_errors(py::module_& m);      // errors.cpp: Status, Error and its subclasses
void bind_types(py::module_& m);       // types.cpp: enums and plain data (types.hpp)
void bind_device(py::module_& m);      // device.cpp: devices(), open(), Device
void bind_buffer(py::module_& m);      // buffer.cpp: Buffer, upload/download, map()
void bind_queue(py::module_& m);       // queue.cpp: Queue, Batch, Fence
void bind_dlpack(py::module_& m);      // dlpack.cpp: __dlpack__, from_dlpack()
void bind_ops(py::module_& m);         // ops.cpp: Tensor, Op, the tpuhal.ops builders, Program
void bind_bench(py::module_& m);       // bench.cpp: C++ loops for bench/python_overhead.py
void bind_video(py::module_& m);       // video.cpp: Codec, PixelFormat, VideoDecoder, Frame, Demuxer
void bind_trace(py::module_& m);       // trace.cpp: tpuhal.trace
void bind_validation(py::module_& m);  // validation.cpp: tpuhal.validation, Python call sites
void bind_runtime(py::module_& m);     // runtime.cpp: compile(), load_model(), Model, Instance

// ---- Errors ----------------------------------------------------------------------

// Throws tpuhal::Error(status, message); the module's translator raises the
// matching tpuhal.<Status> exception.
[[noreturn]] void fail(Status status, const std::string& message);

// ---- The interpreter and the GIL -------------------------------------------------

// False once the interpreter is finalizing (or gone): Python objects must not
// be touched then, and references still held are leaked, as CPython allows.
bool python_alive() noexcept;

// While the validation layer is on: this thread's Python frames (innermost
// first), kept while it runs without the GIL, so that a report or an
// allocation there names the Python line without taking the GIL back
// (validation.cpp). Free when validation is off.
class PythonFramesKept {
 public:
  PythonFramesKept();
  ~PythonFramesKept();
  PythonFramesKept(const PythonFramesKept&) = delete;
  PythonFramesKept& operator=(const PythonFramesKept&) = delete;

 private:
  bool kept_ = false;
};

// CLOCK_MONOTONIC in nanoseconds: what the benchmarks time with.
inline std::uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// The name of a Python object's type, for error messages.
inline std::string type_name(const py::handle& h) { return py::str(h.get_type().attr("__name__")); }

// Runs `f` with the GIL released if this thread holds it; as is otherwise.
template <class F>
decltype(auto) without_gil(F&& f) {
  if (python_alive() && PyGILState_Check()) {
    PythonFramesKept frames;
    py::gil_scoped_release release;
    return std::forward<F>(f)();
  }
  return std::forward<F>(f)();
}

// A keep-alive handle: holds something until the last copy goes. Stored
// beside tpuhal objects (buffers, submissions, DLPack exports) so that
// memory they use outlives them.
using Keep = std::shared_ptr<const void>;

// Holds a reference to `obj`; the last copy releases it with the GIL taken,
// from whatever thread drops it.
Keep keep_object(py::object obj);
// Runs `release` once, with the GIL taken, when the last copy goes (not at
// all once the interpreter is finalizing).
Keep keep_until(std::function<void()> release);

// ---- Enums (types.cpp) -----------------------------------------------------------

// Accept the Python enum members (tpuhal.Memory.HostPinned, which are also
// their string values) or strings: "host_pinned", "HostPinned",
// "host-pinned". Unknown names raise InvalidArgument listing the known ones.
Memory to_memory(py::handle h);
Engine to_engine(py::handle h);
WaitPolicy::Mode to_wait_mode(py::handle h);
py::object from_memory(Memory m);
py::object from_engine(Engine e);
py::object from_wait_mode(WaitPolicy::Mode m);
py::object from_status(Status s);
// Tensor element types: a tpuhal.DType or its string ('f32', 'bf16', ...), or
// a NumPy dtype (numpy.float32, 'float16', ...; no NumPy type is bf16).
DType to_dtype(py::handle h);
py::object from_dtype(DType d);
Codec to_codec(py::handle h);
PixelFormat to_pixel_format(py::handle h);
py::object from_codec(Codec c);
py::object from_pixel_format(PixelFormat f);
// Seconds (int or float) or a datetime.timedelta; InvalidArgument if
// negative. `what` names the argument in messages.
std::chrono::nanoseconds to_duration(py::handle h, const char* what);

// ---- Objects behind the Python classes -------------------------------------------

class Transfers;  // transfer.hpp

// tpuhal.Device: a handle that close() drops. Buffers and queues made from
// it hold their own handles and stay valid.
struct PyDevice {
  explicit PyDevice(Device d);
  ~PyDevice();
  PyDevice(const PyDevice&) = delete;
  PyDevice& operator=(const PyDevice&) = delete;

  // The handle; FailedPrecondition once closed.
  const Device& get() const;
  // The device's transfer context (claims nothing until a transfer needs it).
  std::shared_ptr<Transfers> transfers() const;
  void close();
  bool closed() const { return !device; }

  std::string uri;
  Device device;
  mutable std::shared_ptr<Transfers> transfers_;
};

// How upload()/from_dlpack() last described a buffer's bytes, so that
// download(), map() and __dlpack__ give them back the same way. Plain C++
// (no Python objects): a BufferState may die on any thread.
struct Layout {
  std::string dtype;  // NumPy's dtype.str: "<f4", "|b1", "<c16"
  char kind = 'u';    // NumPy's dtype.kind: b i u f c
  std::uint32_t itemsize = 1;
  std::vector<std::int64_t> shape;
};

// tpuhal.Buffer. Shared by the Python object and every host view of it
// (map() arrays, DLPack exports), so that those keep it alive.
struct PyBuffer {
  PyBuffer(Buffer b, Keep owner_of_memory = {}, std::optional<Layout> layout = std::nullopt);

  // The handle, checked: FailedPrecondition naming the buffer once freed.
  const Buffer& get(const char* use) const;
  std::string describe() const;  // "4096-byte device buffer at 0x10000000 on sim:0"

  Buffer buffer;
  // Imported memory: the Python object (or DLPack tensor) that owns it.
  Keep owner;
  std::optional<Layout> layout;
  // Host views alive (map() arrays, DLPack exports) and host copies in
  // progress: free() refuses while any is, since it would pull the memory
  // from under them.
  std::atomic<int> host_views{0};
};
using BufferRef = std::shared_ptr<PyBuffer>;

// Counts one host view of a buffer while it lives.
class HostView {
 public:
  explicit HostView(BufferRef b) : buffer_(std::move(b)) { buffer_->host_views.fetch_add(1); }
  ~HostView() { buffer_->host_views.fetch_sub(1); }
  HostView(const HostView&) = delete;
  HostView& operator=(const HostView&) = delete;
  const BufferRef& buffer() const { return buffer_; }

 private:
  BufferRef buffer_;
};

// tpuhal.Queue. Also keeps the owners of imported memory that submitted work
// uses until that work completes (tpuhal keeps the buffers; Python memory
// needs its Python owner kept too).
struct PyQueue {
  explicit PyQueue(Queue q);
  ~PyQueue();  // waits for submitted work with the GIL released
  PyQueue(const PyQueue&) = delete;
  PyQueue& operator=(const PyQueue&) = delete;

  // Notes that `keep` must live until timeline value `value` is reached.
  void retain(std::uint64_t value, std::vector<Keep>&& keep);
  // Drops what completed work no longer needs.
  void reclaim();

  Queue queue;
  std::mutex mu;
  std::deque<std::pair<std::uint64_t, std::vector<Keep>>> retained;
  std::atomic<bool> has_retained{false};
};
using QueueRef = std::shared_ptr<PyQueue>;

// tpuhal.Batch: commands recorded for one queue, and the owners of imported
// memory they use (handed to the queue at submit()). Or the batch that
// Device.record() gives its body: no queue, valid only while the body runs.
struct PyBatch {
  explicit PyBatch(QueueRef q);
  explicit PyBatch(Batch& program_batch);
  PyBatch(const PyBatch&) = delete;
  PyBatch& operator=(const PyBatch&) = delete;
  // FailedPrecondition while another thread is in submit() on it (recording
  // holds the GIL; submitting does not), or once a program's body returned.
  Batch& recording(const char* use);
  std::size_t size() const { return batch ? batch->size() : 0; }

  QueueRef queue;              // null for a program's batch
  std::optional<Batch> owned;  // a queue's batch
  Batch* batch = nullptr;      // &*owned, or Device.record()'s while its body runs
  std::vector<Keep> keep;
  bool submitting = false;
};

// tpuhal.Fence: a fence and the queue state it belongs to.
struct PyFence {
  PyFence() = default;
  PyFence(QueueRef q, Fence f) : queue(std::move(q)), fence(std::move(f)) {}
  QueueRef queue;  // null for an empty fence
  Fence fence;
};

// tpuhal.Tensor: a view of a Buffer; keeps the Python buffer object's state
// (and the owner of memory it imported, or the frame it belongs to) as well
// as the C++ buffer. Made by ops.cpp and by Frame.luma() etc. in video.cpp.
struct PyTensor {
  Tensor tensor;
  BufferRef buffer;
};

// Buffer arguments: the handle and, for imported memory, its owner.
const Buffer& buffer_arg(const BufferRef& b, const char* use);

}  // namespace tpuhal::python
