// Queues, batches and fences: tpuhal.Queue, tpuhal.Batch, tpuhal.Fence and
// Device.queue(). Waits and submissions release the GIL.
#include <pybind11/stl.h>

#include <algorithm>

#include "common.hpp"

namespace tpuhal::python {

// ---- PyQueue -------------------------------------------------------------------

PyQueue::PyQueue(Queue q) : queue(std::move(q)) {}

PyQueue::~PyQueue() {
  // Releasing the last handle waits for the queue's submitted work (work that
  // makes no progress for the wait timeout is aborted): never with the GIL,
  // which that work's progress (a Python thread writing a word it waits for)
  // may need. Only then may the memory that work uses go.
  without_gil([&] { queue = Queue(); });
  std::lock_guard lock(mu);
  retained.clear();
}

void PyQueue::retain(std::uint64_t value, std::vector<Keep>&& keep) {
  std::lock_guard lock(mu);
  // Submissions from several threads may arrive out of order; keep the list
  // sorted so that reclaim() stops at the first unfinished one.
  auto pos = retained.end();
  while (pos != retained.begin() && std::prev(pos)->first > value) --pos;
  retained.emplace(pos, value, std::move(keep));
  has_retained.store(true, std::memory_order_release);
}

void PyQueue::reclaim() {
  if (!has_retained.load(std::memory_order_acquire)) return;
  const std::uint64_t completed = queue.completed_value();
  std::vector<std::vector<Keep>> done;
  {
    std::lock_guard lock(mu);
    while (!retained.empty() && retained.front().first <= completed) {
      done.push_back(std::move(retained.front().second));
      retained.pop_front();
    }
    has_retained.store(!retained.empty(), std::memory_order_release);
  }
  // `done` goes here, outside the lock: releasing an owner takes the GIL.
}

// ---- PyBatch -------------------------------------------------------------------

PyBatch::PyBatch(QueueRef q) : queue(std::move(q)), owned(queue->queue.batch()), batch(&*owned) {}

PyBatch::PyBatch(Batch& program_batch) : batch(&program_batch) {}

Batch& PyBatch::recording(const char* use) {
  if (submitting)
    fail(Status::FailedPrecondition,
         std::string(use) + ": another thread is submitting this batch; record on one thread at a time");
  if (!batch)
    fail(Status::FailedPrecondition, std::string(use) +
                                         ": this batch belonged to a Device.record() body that has returned; record "
                                         "into the batch only inside the body");
  return *batch;
}

namespace {

void keep_owner(PyBatch& b, const BufferRef& buf) {
  if (buf && buf->owner) b.keep.push_back(buf->owner);
}

std::uint32_t pattern_of(std::int64_t value, std::uint32_t width) {
  if (value < 0 || value > 0xFFFFFFFFll)
    fail(Status::InvalidArgument,
         "fill: pattern " + std::to_string(value) + " does not fit in " + std::to_string(width) + " byte(s)");
  return static_cast<std::uint32_t>(value);
}

PyBatch& copy(PyBatch& b, const BufferRef& src, const BufferRef& dst, std::uint64_t src_offset,
              std::uint64_t dst_offset, std::optional<std::uint64_t> size) {
  Batch& batch = b.recording("copy");
  const Buffer& s = buffer_arg(src, "copy");
  const Buffer& d = buffer_arg(dst, "copy");
  if (!size && src_offset == 0 && dst_offset == 0) {
    batch.copy(s, d);
  } else {
    const std::uint64_t n = size ? *size : s.size() - std::min(src_offset, s.size());
    batch.copy(s, src_offset, d, dst_offset, n);
  }
  keep_owner(b, src);
  keep_owner(b, dst);
  return b;
}

PyBatch& fill(PyBatch& b, const BufferRef& dst, std::int64_t value, std::uint64_t offset,
              std::optional<std::uint64_t> size, std::uint32_t width) {
  Batch& batch = b.recording("fill");
  const Buffer& d = buffer_arg(dst, "fill");
  const std::uint64_t total = d.size();
  if (!size && offset > total)
    fail(Status::OutOfRange, "fill at offset " + std::to_string(offset) + " is past the end of the " + dst->describe());
  batch.fill(d, offset, size ? *size : total - offset, pattern_of(value, width), width);
  keep_owner(b, dst);
  return b;
}

PyBatch& wait_fence(PyBatch& b, const PyFence& f) {
  b.recording("wait").wait(f.fence);
  return b;
}

PyBatch& wait_value(PyBatch& b, const BufferRef& buf, std::uint64_t offset, std::uint64_t value) {
  b.recording("wait_value").wait_value(buffer_arg(buf, "wait_value"), offset, value);
  keep_owner(b, buf);
  return b;
}

PyBatch& write_value(PyBatch& b, const BufferRef& buf, std::uint64_t offset, std::uint64_t value) {
  b.recording("write_value").write_value(buffer_arg(buf, "write_value"), offset, value);
  keep_owner(b, buf);
  return b;
}

PyBatch& timestamp(PyBatch& b, const BufferRef& buf, std::uint64_t offset) {
  b.recording("timestamp").timestamp(buffer_arg(buf, "timestamp"), offset);
  keep_owner(b, buf);
  return b;
}

PyBatch& wait_until(PyBatch& b, std::uint64_t board_ns) {
  b.recording("wait_until").wait_until(board_ns);
  return b;
}

PyFence submit(PyBatch& b, const py::object& max_wait) {
  Batch& batch = b.recording("submit");
  if (!b.queue)
    fail(Status::FailedPrecondition,
         "submit: this batch records a program (Device.record()); the program is submitted with "
         "queue.run(program).submit()");
  std::optional<std::chrono::nanoseconds> limit;
  if (!max_wait.is_none()) limit = to_duration(max_wait, "max_wait");
  Fence f;
  {
    b.submitting = true;
    struct Done {
      bool& flag;
      ~Done() { flag = false; }
    } done{b.submitting};
    PythonFramesKept frames;  // reports made meanwhile name the Python line
    py::gil_scoped_release release;
    f = limit ? batch.submit(*limit) : batch.submit();
  }
  if (!b.keep.empty()) b.queue->retain(f.value(), std::move(b.keep));
  b.keep.clear();
  b.queue->reclaim();
  return PyFence(b.queue, std::move(f));
}

std::unique_ptr<PyBatch> new_batch(const QueueRef& q) { return std::make_unique<PyBatch>(q); }

void wait(const PyFence& f, const py::object& timeout) {
  if (!f.queue) return;
  std::optional<std::chrono::nanoseconds> limit;
  if (!timeout.is_none()) limit = to_duration(timeout, "timeout");
  {
    PythonFramesKept frames;  // reports made meanwhile name the Python line
    py::gil_scoped_release release;
    if (limit)
      f.fence.wait(*limit);
    else
      f.fence.wait();
  }
  f.queue->reclaim();
}

std::string queue_name(const PyQueue& q) {
  return q.queue.device().uri() + " " + to_string(q.queue.engine()) + " queue " + std::to_string(q.queue.index());
}

// Docstrings shared by Queue's shortcuts and Batch's methods.
constexpr const char* kCopyDoc =
    "Copies all of src into dst (sizes must match), or `size` bytes from src_offset to dst_offset "
    "(without size: the rest of src). Any memory kinds; overlapping ranges copy as memmove.";
constexpr const char* kFillDoc =
    "Fills `size` bytes at `offset` (default: all of dst from offset) with `value`, `width` bytes wide "
    "(1, 2 or 4), little-endian; offset and size must be multiples of width.";
constexpr const char* kWaitDoc = "Waits, on the device, for another queue's fence (same device).";
constexpr const char* kWaitValueDoc =
    "Waits, on the device, until the 64-bit word at `offset` in `buffer` is >= `value` (unsigned); the host "
    "(through Buffer.map()) or another queue writes it. offset % 8 == 0 (caps.wait_value).";
constexpr const char* kWriteValueDoc =
    "Writes a 64-bit value at `offset` (offset % 8 == 0) when the work gets there (caps.wait_value).";
constexpr const char* kTimestampDoc = "Writes the board time (ns) at `offset` (offset % 8 == 0; caps.timestamps).";

}  // namespace

void bind_queue(py::module_& m) {
  auto fence = py::reinterpret_borrow<py::class_<PyFence>>(m.attr("Fence"));
  fence.def(py::init<>(), "An empty fence: complete already; waiting on it returns at once.")
      .def_property_readonly(
          "value", [](const PyFence& f) { return f.fence.value(); }, "Timeline value on its queue.")
      .def_property_readonly(
          "queue",
          [](const PyFence& f) -> std::optional<QueueRef> {
            if (!f.queue) return std::nullopt;
            return f.queue;
          },
          "The Queue it belongs to (None for an empty fence).")
      .def_property_readonly(
          "empty", [](const PyFence& f) { return f.fence.empty(); }, "True for Fence().")
      .def(
          "is_complete",
          [](const PyFence& f) {
            const bool done = f.fence.is_complete();
            if (done && f.queue) f.queue->reclaim();
            return done;
          },
          "True once reached. Raises the queue's error (tpuhal.DeviceFault naming the failed command) if "
          "the queue failed before reaching it.")
      .def("wait", &wait, py::arg("timeout") = py::none(),
           "Waits (without the GIL) until reached. Raises tpuhal.Timeout once the queue has made no "
           "progress for `timeout` seconds (a float, or a datetime.timedelta; default: the device's "
           "wait_policy.timeout), or the queue's error if it fails first.")
      .def_property_readonly(
          "timestamp_ns", [](const PyFence& f) { return f.fence.timestamp_ns(); },
          "Board time (ns since reset) at which the value was reached, while the board keeps it (its last "
          "128 per queue); None before completion or without caps.timestamps.")
      .def("__repr__", [](const PyFence& f) {
        if (!f.queue) return std::string("<tpuhal.Fence (empty)>");
        return "<tpuhal.Fence " + queue_name(*f.queue) + " value " + std::to_string(f.fence.value()) + ">";
      });

  auto batch = py::reinterpret_borrow<py::class_<PyBatch>>(m.attr("Batch"));
  constexpr auto chain = py::return_value_policy::reference;  // the same Batch object, for chaining
  batch
      .def("copy", &copy, py::arg("src"), py::arg("dst"), py::kw_only(), py::arg("src_offset") = 0,
           py::arg("dst_offset") = 0, py::arg("size") = py::none(), chain, kCopyDoc)
      .def("fill", &fill, py::arg("dst"), py::arg("value"), py::kw_only(), py::arg("offset") = 0,
           py::arg("size") = py::none(), py::arg("width") = 1, chain, kFillDoc)
      .def("wait", &wait_fence, py::arg("fence"), chain, kWaitDoc)
      .def("wait_value", &wait_value, py::arg("buffer"), py::arg("offset"), py::arg("value"), chain, kWaitValueDoc)
      .def("write_value", &write_value, py::arg("buffer"), py::arg("offset"), py::arg("value"), chain, kWriteValueDoc)
      .def("timestamp", &timestamp, py::arg("buffer"), py::arg("offset"), chain, kTimestampDoc)
      .def("wait_until", &wait_until, py::arg("board_ns"), chain,
           "The batch's next command starts no earlier than board time `board_ns` (ns since the board's "
           "reset, as Fence.timestamp_ns and Device.board_time_ns() give it; caps.wait_time, at most 2**62). "
           "A board on the host's clock waits for it; a modelled clock moves up to it (docs/timing.md).")
      .def("submit", &submit, py::arg("max_wait") = py::none(),
           "Submits what was recorded and empties the batch; returns its Fence. If the queue's ring is full, "
           "waits (without the GIL) for room while the queue makes progress, up to the device's wait "
           "timeout or `max_wait` seconds (0: do not wait), then raises tpuhal.QueueFull. If it raises, the "
           "batch keeps what was recorded.")
      .def(
          "__len__", [](const PyBatch& b) { return b.size(); }, "Commands recorded.")
      .def_property_readonly(
          "queue",
          [](const PyBatch& b) -> std::optional<QueueRef> {
            if (!b.queue) return std::nullopt;
            return b.queue;
          },
          "The Queue it records for (None for the batch of a Device.record() body).")
      .def("__repr__", [](const PyBatch& b) {
        const std::string target = b.queue ? queue_name(*b.queue) : std::string("a program");
        return "<tpuhal.Batch for " + target + ", " + std::to_string(b.size()) + " commands>";
      });

  auto queue = py::reinterpret_borrow<py::class_<PyQueue, QueueRef>>(m.attr("Queue"));
  queue
      .def_property_readonly(
          "engine", [](const PyQueue& q) { return from_engine(q.queue.engine()); }, "Its tpuhal.Engine.")
      .def_property_readonly(
          "index", [](const PyQueue& q) { return q.queue.index(); }, "Hardware queue number on the board.")
      .def_property_readonly(
          "device", [](const PyQueue& q) { return std::make_shared<PyDevice>(q.queue.device()); },
          "A new Device handle for its device.")
      .def_property_readonly(
          "completed_value", [](const PyQueue& q) { return q.queue.completed_value(); },
          "Timeline value reached so far.")
      .def_property_readonly(
          "last_fence",
          [](const QueueRef& q) {
            Fence f = q->queue.last_fence();
            return f.empty() ? PyFence() : PyFence(q, std::move(f));
          },
          "The fence of the most recent submission (an empty fence if none).")
      .def("batch", &new_batch, "A new, empty Batch for this queue.")
      .def(
          "copy",
          [](const QueueRef& q, const BufferRef& src, const BufferRef& dst, std::uint64_t src_offset,
             std::uint64_t dst_offset, std::optional<std::uint64_t> size) {
            auto b = new_batch(q);
            copy(*b, src, dst, src_offset, dst_offset, size);
            return b;
          },
          py::arg("src"), py::arg("dst"), py::kw_only(), py::arg("src_offset") = 0, py::arg("dst_offset") = 0,
          py::arg("size") = py::none(), (std::string("A new Batch starting with a copy. ") + kCopyDoc).c_str())
      .def(
          "fill",
          [](const QueueRef& q, const BufferRef& dst, std::int64_t value, std::uint64_t offset,
             std::optional<std::uint64_t> size, std::uint32_t width) {
            auto b = new_batch(q);
            fill(*b, dst, value, offset, size, width);
            return b;
          },
          py::arg("dst"), py::arg("value"), py::kw_only(), py::arg("offset") = 0, py::arg("size") = py::none(),
          py::arg("width") = 1, (std::string("A new Batch starting with a fill. ") + kFillDoc).c_str())
      .def(
          "wait",
          [](const QueueRef& q, const PyFence& f) {
            auto b = new_batch(q);
            wait_fence(*b, f);
            return b;
          },
          py::arg("fence"), (std::string("A new Batch starting with a wait. ") + kWaitDoc).c_str())
      .def(
          "wait_value",
          [](const QueueRef& q, const BufferRef& buf, std::uint64_t offset, std::uint64_t value) {
            auto b = new_batch(q);
            wait_value(*b, buf, offset, value);
            return b;
          },
          py::arg("buffer"), py::arg("offset"), py::arg("value"),
          (std::string("A new Batch starting with wait_value. ") + kWaitValueDoc).c_str())
      .def(
          "write_value",
          [](const QueueRef& q, const BufferRef& buf, std::uint64_t offset, std::uint64_t value) {
            auto b = new_batch(q);
            write_value(*b, buf, offset, value);
            return b;
          },
          py::arg("buffer"), py::arg("offset"), py::arg("value"),
          (std::string("A new Batch starting with write_value. ") + kWriteValueDoc).c_str())
      .def(
          "submit",
          [](const QueueRef& q, const py::object& max_wait) {
            if (!max_wait.is_none()) {
              PyBatch empty(q);
              return submit(empty, max_wait);
            }
            Fence f;
            {
              PythonFramesKept frames;  // reports made meanwhile name the Python line
              py::gil_scoped_release release;
              f = q->queue.submit();
            }
            q->reclaim();
            return PyFence(q, std::move(f));
          },
          py::arg("max_wait") = py::none(),
          "An empty submission; its fence is reached when everything submitted before it is.")
      .def("__repr__", [](const PyQueue& q) { return "<tpuhal.Queue " + queue_name(q) + ">"; });

  auto dev = py::reinterpret_borrow<py::class_<PyDevice, std::shared_ptr<PyDevice>>>(m.attr("Device"));
  dev.def(
      "queue",
      [](const PyDevice& d, py::handle engine, std::uint32_t ring_entries) {
        Device device = d.get();
        const Engine e = to_engine(engine);
        QueueOptions o;
        o.ring_entries = ring_entries;
        Queue q = without_gil([&] { return device.queue(e, o); });
        return std::make_shared<PyQueue>(std::move(q));
      },
      py::arg("engine") = "compute", py::kw_only(), py::arg("ring_entries") = 0,
      "Claims a hardware queue of `engine` ('compute', 'copy' or 'video', or a tpuhal.Engine); work on "
      "one queue runs in order. `ring_entries`: ring size, a power of two (0: the driver's default). Raises "
      "tpuhal.ResourceExhausted if all of that engine's queues are claimed. The hardware queue is released "
      "when the Queue and its fences and batches are gone, after its submitted work completes.");
}

}  // namespace tpuhal::python
