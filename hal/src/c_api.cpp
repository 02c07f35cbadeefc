// The C ABI over the C++ API: handles own C++ handles; errors become status
// codes and a per-thread message.
#include "tpuhal/tpuhal.h"

#include <cstring>
#include <new>
#include <string>

#include "tpuhal/tpuhal.hpp"
#include "tpuhal/trace.hpp"

struct tpuhal_device_s {
  tpuhal::Device device;
};
struct tpuhal_buffer_s {
  tpuhal::Buffer buffer;
};
struct tpuhal_queue_s {
  tpuhal::Queue queue;
};
struct tpuhal_batch_s {
  tpuhal::Batch batch;
};
struct tpuhal_fence_s {
  tpuhal::Fence fence;
};

namespace {

thread_local std::string t_last_error;

tpuhal_status_t fail(tpuhal_status_t status, std::string message) {
  t_last_error = std::move(message);
  return status;
}

// Runs `body`, turning exceptions into a status and this thread's message.
template <class F>
tpuhal_status_t guard(F&& body) noexcept {
  try {
    body();
    return TPUHAL_OK;
  } catch (const tpuhal::Error& e) {
    return fail(static_cast<tpuhal_status_t>(e.status()), e.what());
  } catch (const std::bad_alloc&) {
    return fail(TPUHAL_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return fail(TPUHAL_INTERNAL, e.what());
  } catch (...) {
    return fail(TPUHAL_INTERNAL, "unknown exception");
  }
}

tpuhal_status_t null_arg(const char* fn, const char* what) {
  return fail(TPUHAL_INVALID_ARGUMENT, std::string(fn) + ": " + what + " is NULL");
}

void copy_string(char* dst, std::size_t cap, const std::string& src) {
  const std::size_t n = src.size() < cap - 1 ? src.size() : cap - 1;
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

}  // namespace

// C's tpuhal_status_t and C++'s tpuhal::Status come from one list
// (tpuhal/status.inc); the casts between them rely on equal values, and
// tables indexed by status (Python's) on values 0 .. kStatusCount - 1.
// to_string()'s switch rejects two statuses with one value.
#define TPUHAL_STATUS(name, c_name, value, text, python_also, doc)                    \
  static_assert(static_cast<std::int32_t>(tpuhal::Status::name) == TPUHAL_##c_name,   \
                "tpuhal.h and error.hpp disagree on " #name);                         \
  static_assert(value >= 0 && static_cast<std::size_t>(value) < tpuhal::kStatusCount, \
                #name ": statuses are numbered 0 .. kStatusCount - 1, without gaps");
#include "tpuhal/status.inc"
#undef TPUHAL_STATUS

extern "C" {

const char* tpuhal_last_error(void) { return t_last_error.c_str(); }

const char* tpuhal_status_string(tpuhal_status_t status) {
  return tpuhal::to_string(static_cast<tpuhal::Status>(status));
}

tpuhal_status_t tpuhal_enumerate(tpuhal_device_info_t* out, size_t capacity, size_t* count) {
  if (!count) return null_arg("tpuhal_enumerate", "count");
  if (!out && capacity) return null_arg("tpuhal_enumerate", "out");
  return guard([&] {
    auto all = tpuhal::enumerate();
    *count = all.size();
    for (std::size_t i = 0; i < all.size() && i < capacity; ++i) {
      copy_string(out[i].uri, sizeof out[i].uri, all[i].uri);
      copy_string(out[i].driver, sizeof out[i].driver, all[i].driver);
      copy_string(out[i].board, sizeof out[i].board, all[i].board);
      out[i].memory_bytes = all[i].memory_bytes;
    }
  });
}

tpuhal_status_t tpuhal_open(const char* uri, tpuhal_device_t* device) {
  if (!uri) return null_arg("tpuhal_open", "uri");
  if (!device) return null_arg("tpuhal_open", "device");
  return guard([&] { *device = new tpuhal_device_s{tpuhal::open(uri)}; });
}

void tpuhal_device_release(tpuhal_device_t device) { delete device; }

tpuhal_status_t tpuhal_device_memory(tpuhal_device_t device, uint64_t* total, uint64_t* used) {
  if (!device) return null_arg("tpuhal_device_memory", "device");
  return guard([&] {
    auto s = device->device.memory_stats();
    if (total) *total = s.device_total;
    if (used) *used = s.device_used;
  });
}

tpuhal_status_t tpuhal_buffer_allocate(tpuhal_device_t device, uint64_t size, tpuhal_memory_t memory,
                                       tpuhal_buffer_t* buffer) {
  if (!device) return null_arg("tpuhal_buffer_allocate", "device");
  if (!buffer) return null_arg("tpuhal_buffer_allocate", "buffer");
  if (memory < TPUHAL_MEMORY_DEVICE || memory > TPUHAL_MEMORY_HOST_PINNED)
    return fail(TPUHAL_INVALID_ARGUMENT, "tpuhal_buffer_allocate: memory kind " +
                                             std::to_string(static_cast<int>(memory)) + " is not a tpuhal_memory_t");
  return guard(
      [&] { *buffer = new tpuhal_buffer_s{device->device.allocate(size, static_cast<tpuhal::Memory>(memory))}; });
}

tpuhal_status_t tpuhal_buffer_import(tpuhal_device_t device, void* ptr, uint64_t size, tpuhal_buffer_t* buffer) {
  if (!device) return null_arg("tpuhal_buffer_import", "device");
  if (!buffer) return null_arg("tpuhal_buffer_import", "buffer");
  return guard([&] { *buffer = new tpuhal_buffer_s{device->device.import_host(ptr, size)}; });
}

void tpuhal_buffer_release(tpuhal_buffer_t buffer) { delete buffer; }

tpuhal_status_t tpuhal_buffer_map(tpuhal_buffer_t buffer, void** ptr) {
  if (!buffer) return null_arg("tpuhal_buffer_map", "buffer");
  if (!ptr) return null_arg("tpuhal_buffer_map", "ptr");
  return guard([&] { *ptr = buffer->buffer.map().data(); });
}

uint64_t tpuhal_buffer_size(tpuhal_buffer_t buffer) { return buffer ? buffer->buffer.size() : 0; }

tpuhal_status_t tpuhal_queue_create(tpuhal_device_t device, tpuhal_engine_t engine, tpuhal_queue_t* queue) {
  if (!device) return null_arg("tpuhal_queue_create", "device");
  if (!queue) return null_arg("tpuhal_queue_create", "queue");
  if (engine < TPUHAL_ENGINE_COMPUTE || engine > TPUHAL_ENGINE_VIDEO)
    return fail(TPUHAL_INVALID_ARGUMENT, "tpuhal_queue_create: engine " + std::to_string(static_cast<int>(engine)) +
                                             " is not a tpuhal_engine_t");
  return guard([&] { *queue = new tpuhal_queue_s{device->device.queue(static_cast<tpuhal::Engine>(engine))}; });
}

void tpuhal_queue_release(tpuhal_queue_t queue) { delete queue; }

tpuhal_status_t tpuhal_batch_create(tpuhal_queue_t queue, tpuhal_batch_t* batch) {
  if (!queue) return null_arg("tpuhal_batch_create", "queue");
  if (!batch) return null_arg("tpuhal_batch_create", "batch");
  return guard([&] { *batch = new tpuhal_batch_s{queue->queue.batch()}; });
}

void tpuhal_batch_release(tpuhal_batch_t batch) { delete batch; }

tpuhal_status_t tpuhal_batch_copy(tpuhal_batch_t batch, tpuhal_buffer_t src, uint64_t src_offset, tpuhal_buffer_t dst,
                                  uint64_t dst_offset, uint64_t size) {
  if (!batch) return null_arg("tpuhal_batch_copy", "batch");
  if (!src) return null_arg("tpuhal_batch_copy", "src");
  if (!dst) return null_arg("tpuhal_batch_copy", "dst");
  return guard([&] { batch->batch.copy(src->buffer, src_offset, dst->buffer, dst_offset, size); });
}

tpuhal_status_t tpuhal_batch_fill(tpuhal_batch_t batch, tpuhal_buffer_t dst, uint64_t offset, uint64_t size,
                                  uint32_t pattern, uint32_t pattern_bytes) {
  if (!batch) return null_arg("tpuhal_batch_fill", "batch");
  if (!dst) return null_arg("tpuhal_batch_fill", "dst");
  return guard([&] { batch->batch.fill(dst->buffer, offset, size, pattern, pattern_bytes); });
}

tpuhal_status_t tpuhal_batch_wait(tpuhal_batch_t batch, tpuhal_fence_t fence) {
  if (!batch) return null_arg("tpuhal_batch_wait", "batch");
  if (!fence) return null_arg("tpuhal_batch_wait", "fence");
  return guard([&] { batch->batch.wait(fence->fence); });
}

tpuhal_status_t tpuhal_batch_submit(tpuhal_batch_t batch, tpuhal_fence_t* fence) {
  if (!batch) return null_arg("tpuhal_batch_submit", "batch");
  return guard([&] {
    auto f = batch->batch.submit();
    if (fence) *fence = new tpuhal_fence_s{std::move(f)};
  });
}

tpuhal_status_t tpuhal_fence_wait(tpuhal_fence_t fence, uint64_t timeout_ns) {
  if (!fence) return null_arg("tpuhal_fence_wait", "fence");
  return guard([&] {
    if (timeout_ns == 0)
      fence->fence.wait();
    else
      fence->fence.wait(
          std::chrono::nanoseconds(timeout_ns > INT64_MAX ? INT64_MAX : static_cast<std::int64_t>(timeout_ns)));
  });
}

tpuhal_status_t tpuhal_fence_is_complete(tpuhal_fence_t fence, int* complete) {
  if (!fence) return null_arg("tpuhal_fence_is_complete", "fence");
  if (!complete) return null_arg("tpuhal_fence_is_complete", "complete");
  return guard([&] { *complete = fence->fence.is_complete() ? 1 : 0; });
}

uint64_t tpuhal_fence_value(tpuhal_fence_t fence) { return fence ? fence->fence.value() : 0; }

void tpuhal_fence_release(tpuhal_fence_t fence) { delete fence; }

tpuhal_status_t tpuhal_trace_start(const char* path) {
  if (!path) return null_arg("tpuhal_trace_start", "path");
  return guard([&] { tpuhal::trace::start(path); });
}

tpuhal_status_t tpuhal_trace_stop(uint64_t* events, uint64_t* dropped) {
  return guard([&] {
    const tpuhal::trace::Summary s = tpuhal::trace::stop();
    if (events) *events = s.events;
    if (dropped) *dropped = s.dropped;
    if (!s.error.empty()) throw tpuhal::Error(tpuhal::Status::InvalidArgument, "trace: " + s.error);
  });
}

}  // extern "C"
