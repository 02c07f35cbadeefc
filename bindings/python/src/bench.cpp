// C++ loops over the same calls bench/python_overhead.py makes from Python,
// run in this process on the caller's queue and buffers, so that the two are
// measured side by side. Internal (underscore names); not part of the API.
#include <pybind11/stl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "common.hpp"

namespace tpuhal::python {
namespace {

// Microseconds per iteration of `body`, one entry per iteration.
template <class F>
std::vector<double> time_each(int iterations, F&& body) {
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(std::max(iterations, 0)));
  py::gil_scoped_release release;
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = now_ns();
    body();
    us.push_back(static_cast<double>(now_ns() - t0) / 1000.0);
  }
  return us;
}

}  // namespace

void bind_bench(py::module_& m) {
  m.def(
      "_bench_submit_wait",
      [](const QueueRef& q, int iterations) {
        Queue queue = q->queue;
        return time_each(iterations, [&] { queue.submit().wait(); });
      },
      py::arg("queue"), py::arg("iterations"),
      "Internal: microseconds of each of `iterations` C++ q.submit().wait() round trips.");
  m.def(
      "_bench_fill_wait",
      [](const QueueRef& q, const BufferRef& b, std::uint64_t size, int iterations) {
        Queue queue = q->queue;
        Buffer buf = b->get("_bench_fill_wait");
        return time_each(iterations, [&] { queue.fill(buf, 0, size, 0xAB).submit().wait(); });
      },
      py::arg("queue"), py::arg("buffer"), py::arg("size"), py::arg("iterations"),
      "Internal: microseconds of each of `iterations` C++ q.fill(buffer, 0, size, 0xAB).submit().wait().");
  m.def(
      "_bench_copy_wait",
      [](const QueueRef& q, const BufferRef& src, const BufferRef& dst, int iterations) {
        Queue queue = q->queue;
        Buffer s = src->get("_bench_copy_wait"), d = dst->get("_bench_copy_wait");
        return time_each(iterations, [&] { queue.copy(s, d).submit().wait(); });
      },
      py::arg("queue"), py::arg("src"), py::arg("dst"), py::arg("iterations"),
      "Internal: microseconds of each of `iterations` C++ q.copy(src, dst).submit().wait().");
  m.def(
      "_bench_transfers",
      [](const QueueRef& q, std::uint64_t size, int iterations) {
        Queue queue = q->queue;
        Device dev = queue.device();
        // Memory as a C++ program has its data: ordinary, page-aligned heap memory.
        const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
        std::unique_ptr<std::byte, decltype(&std::free)> host(
            static_cast<std::byte*>(std::aligned_alloc(page, (size + page - 1) / page * page)), &std::free);
        if (!host) fail(Status::OutOfMemory, "_bench_transfers: cannot allocate " + std::to_string(size) + " bytes");
        std::memset(host.get(), 0x5A, size);
        py::dict out;
        std::vector<double> up, down, up_pinned, down_pinned;
        {
          py::gil_scoped_release release;
          Buffer dram = dev.allocate(size);
          Buffer pinned = dev.allocate(size, Memory::HostPinned);
          auto timed = [&](std::vector<double>& into, auto&& body) {
            for (int i = 0; i < iterations; ++i) {
              const auto t0 = now_ns();
              body();
              into.push_back(static_cast<double>(now_ns() - t0) * 1e-9);
            }
          };
          // The caller's memory imported for the board to reach in place.
          timed(up, [&] { queue.copy(dev.import_host(host.get(), size), dram).submit().wait(); });
          timed(down, [&] { queue.copy(dram, dev.import_host(host.get(), size)).submit().wait(); });
          // Pinned memory already holding the data: DMA only, no host copy.
          timed(up_pinned, [&] { queue.copy(pinned, dram).submit().wait(); });
          timed(down_pinned, [&] { queue.copy(dram, pinned).submit().wait(); });
        }
        out["upload"] = up;
        out["download"] = down;
        out["upload_pinned"] = up_pinned;
        out["download_pinned"] = down_pinned;
        return out;
      },
      py::arg("queue"), py::arg("size"), py::arg("iterations"),
      "Internal: seconds of each of `iterations` C++ transfers of `size` bytes between page-aligned heap "
      "memory (imported with Device::import_host) and device memory, and between pinned and device memory "
      "(DMA only), on `queue`: a dict of lists keyed upload, download, upload_pinned, download_pinned.");
}

}  // namespace tpuhal::python
