/* tpuhal C ABI: the core API for C and for other languages' FFIs.
 *
 * Every function returns a tpuhal_status_t (0 on success). On failure the
 * message that says what was wrong is kept per thread: tpuhal_last_error()
 * returns it until the next failing call on that thread.
 *
 * Handles are reference-counted: each *_release drops one reference. A
 * buffer released while queued work uses it lives until that work completes.
 * Every function is thread-safe except on one tpuhal_batch_t, which belongs
 * to the thread recording it.
 */
#ifndef TPUHAL_TPUHAL_H
#define TPUHAL_TPUHAL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TPUHAL_C_API __attribute__((visibility("default")))

/* Why a call failed: TPUHAL_OK, TPUHAL_INVALID_ARGUMENT, ... The list, with
 * what each status means, is tpuhal/status.inc, shared with C++'s
 * tpuhal::Status (same values, checked when the library is built). */
typedef enum tpuhal_status {
#define TPUHAL_STATUS(name, c_name, value, text, python_also, doc) TPUHAL_##c_name = value,
#include "tpuhal/status.inc"
#undef TPUHAL_STATUS
  TPUHAL_STATUS_MAX_ENUM = 0x7FFFFFFF /* keeps the enum 32-bit; not a status */
} tpuhal_status_t;

typedef enum tpuhal_memory {
  TPUHAL_MEMORY_DEVICE = 0,
  TPUHAL_MEMORY_DEVICE_HOST_VISIBLE = 1,
  TPUHAL_MEMORY_HOST_PINNED = 2,
  TPUHAL_MEMORY_MAX_ENUM = 0x7FFFFFFF
} tpuhal_memory_t;

typedef enum tpuhal_engine {
  TPUHAL_ENGINE_COMPUTE = 0,
  TPUHAL_ENGINE_COPY = 1,
  TPUHAL_ENGINE_VIDEO = 2,
  TPUHAL_ENGINE_MAX_ENUM = 0x7FFFFFFF
} tpuhal_engine_t;

typedef struct tpuhal_device_s* tpuhal_device_t;
typedef struct tpuhal_buffer_s* tpuhal_buffer_t;
typedef struct tpuhal_queue_s* tpuhal_queue_t;
typedef struct tpuhal_batch_s* tpuhal_batch_t;
typedef struct tpuhal_fence_s* tpuhal_fence_t;

typedef struct tpuhal_device_info {
  char uri[128];
  char driver[32];
  char board[96];
  uint64_t memory_bytes;
} tpuhal_device_info_t;

/* The message of this thread's last failing call ("" if none). */
TPUHAL_C_API const char* tpuhal_last_error(void);
TPUHAL_C_API const char* tpuhal_status_string(tpuhal_status_t status);

/* Fills up to `capacity` entries of `out` and sets *count to the number of
 * devices there are (which may exceed capacity). */
TPUHAL_C_API tpuhal_status_t tpuhal_enumerate(tpuhal_device_info_t* out, size_t capacity, size_t* count);

TPUHAL_C_API tpuhal_status_t tpuhal_open(const char* uri, tpuhal_device_t* device);
TPUHAL_C_API void tpuhal_device_release(tpuhal_device_t device);
/* Device memory in total and in use, over every heap. */
TPUHAL_C_API tpuhal_status_t tpuhal_device_memory(tpuhal_device_t device, uint64_t* total, uint64_t* used);

TPUHAL_C_API tpuhal_status_t tpuhal_buffer_allocate(tpuhal_device_t device, uint64_t size, tpuhal_memory_t memory,
                                                    tpuhal_buffer_t* buffer);
/* Caller memory for zero-copy DMA: page-aligned pointer and size; the memory
 * must outlive the buffer and the work using it. */
TPUHAL_C_API tpuhal_status_t tpuhal_buffer_import(tpuhal_device_t device, void* ptr, uint64_t size,
                                                  tpuhal_buffer_t* buffer);
TPUHAL_C_API void tpuhal_buffer_release(tpuhal_buffer_t buffer);
TPUHAL_C_API tpuhal_status_t tpuhal_buffer_map(tpuhal_buffer_t buffer, void** ptr);
TPUHAL_C_API uint64_t tpuhal_buffer_size(tpuhal_buffer_t buffer);

TPUHAL_C_API tpuhal_status_t tpuhal_queue_create(tpuhal_device_t device, tpuhal_engine_t engine, tpuhal_queue_t* queue);
TPUHAL_C_API void tpuhal_queue_release(tpuhal_queue_t queue);

/* Recording work: create a batch, add commands, submit. Submitting empties
 * the batch, which may be reused; release it when done. */
TPUHAL_C_API tpuhal_status_t tpuhal_batch_create(tpuhal_queue_t queue, tpuhal_batch_t* batch);
TPUHAL_C_API void tpuhal_batch_release(tpuhal_batch_t batch);
TPUHAL_C_API tpuhal_status_t tpuhal_batch_copy(tpuhal_batch_t batch, tpuhal_buffer_t src, uint64_t src_offset,
                                               tpuhal_buffer_t dst, uint64_t dst_offset, uint64_t size);
TPUHAL_C_API tpuhal_status_t tpuhal_batch_fill(tpuhal_batch_t batch, tpuhal_buffer_t dst, uint64_t offset,
                                               uint64_t size, uint32_t pattern, uint32_t pattern_bytes);
TPUHAL_C_API tpuhal_status_t tpuhal_batch_wait(tpuhal_batch_t batch, tpuhal_fence_t fence);
TPUHAL_C_API tpuhal_status_t tpuhal_batch_submit(tpuhal_batch_t batch, tpuhal_fence_t* fence);

/* Waits until the fence is reached; TPUHAL_TIMEOUT once its queue has made
 * no progress for timeout_ns (0: the device's default timeout). */
TPUHAL_C_API tpuhal_status_t tpuhal_fence_wait(tpuhal_fence_t fence, uint64_t timeout_ns);
/* 1 if reached, 0 if not; the queue's error if it failed first. */
TPUHAL_C_API tpuhal_status_t tpuhal_fence_is_complete(tpuhal_fence_t fence, int* complete);
TPUHAL_C_API uint64_t tpuhal_fence_value(tpuhal_fence_t fence);
TPUHAL_C_API void tpuhal_fence_release(tpuhal_fence_t fence);

/* Tracing (tpuhal/trace.hpp, docs/tracing.md): starts writing a Chrome
 * trace to `path` ("%p" becomes the process id); TPUHAL_FAILED_PRECONDITION
 * if one is already on, TPUHAL_NOT_FOUND / TPUHAL_PERMISSION_DENIED /
 * TPUHAL_INVALID_ARGUMENT if the file cannot be created. */
TPUHAL_C_API tpuhal_status_t tpuhal_trace_start(const char* path);
/* Stops the trace and finishes its file; *events and *dropped (either may be
 * NULL) receive the events written and the events lost. TPUHAL_OK with 0
 * events when no trace was on; TPUHAL_INVALID_ARGUMENT if the file could not
 * be written in full (tpuhal_last_error says why). */
TPUHAL_C_API tpuhal_status_t tpuhal_trace_stop(uint64_t* events, uint64_t* dropped);

#ifdef __cplusplus
}
#endif

#endif /* TPUHAL_TPUHAL_H */
