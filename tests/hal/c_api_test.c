/* The C ABI, exercised from C: the core path and the error path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tpuhal/tpuhal.h"

static int failures = 0;

#define CHECK(cond)                                                                                                  \
  do {                                                                                                               \
    if (!(cond)) {                                                                                                   \
      fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, tpuhal_last_error()); \
      ++failures;                                                                                                    \
    }                                                                                                                \
  } while (0)

int main(void) {
  size_t count = 0;
  tpuhal_device_info_t infos[8];
  CHECK(tpuhal_enumerate(infos, 8, &count) == TPUHAL_OK);
  CHECK(count >= 1);
  CHECK(count == 0 || strncmp(infos[0].uri, "sim:", 4) == 0);
  CHECK(tpuhal_enumerate(NULL, 0, &count) == TPUHAL_OK);

  /* Tracing: bad paths are refused with the system's reason; the work
   * below is traced into a file that is checked at the end. */
  char trace_path[256];
  snprintf(trace_path, sizeof trace_path, "%s/tpuhal_c_api_%d.json", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
           (int)getpid());
  CHECK(tpuhal_trace_start(NULL) == TPUHAL_INVALID_ARGUMENT);
  CHECK(tpuhal_trace_start("/nonexistent-directory/trace.json") == TPUHAL_NOT_FOUND);
  CHECK(strstr(tpuhal_last_error(), "/nonexistent-directory/trace.json") != NULL);
  CHECK(tpuhal_trace_start(trace_path) == TPUHAL_OK);
  CHECK(tpuhal_trace_start(trace_path) == TPUHAL_FAILED_PRECONDITION);

  tpuhal_device_t dev = NULL;
  CHECK(tpuhal_open("sim:tiny", &dev) == TPUHAL_OK);
  if (!dev) return 1;
  uint64_t total = 0, used = 0;
  CHECK(tpuhal_device_memory(dev, &total, &used) == TPUHAL_OK);
  CHECK(total > 0);

  const uint64_t n = 65536;
  tpuhal_buffer_t src = NULL, dst = NULL, mid = NULL;
  CHECK(tpuhal_buffer_allocate(dev, n, TPUHAL_MEMORY_HOST_PINNED, &src) == TPUHAL_OK);
  CHECK(tpuhal_buffer_allocate(dev, n, TPUHAL_MEMORY_HOST_PINNED, &dst) == TPUHAL_OK);
  CHECK(tpuhal_buffer_allocate(dev, n, TPUHAL_MEMORY_DEVICE, &mid) == TPUHAL_OK);
  CHECK(tpuhal_buffer_size(mid) == n);
  unsigned char *s = NULL, *d = NULL;
  CHECK(tpuhal_buffer_map(src, (void**)&s) == TPUHAL_OK);
  CHECK(tpuhal_buffer_map(dst, (void**)&d) == TPUHAL_OK);
  for (uint64_t i = 0; i < n; ++i) s[i] = (unsigned char)(i * 13);
  memset(d, 0, n);

  /* Device memory is not host-mappable on this board: a clear error. */
  void* p = NULL;
  CHECK(tpuhal_buffer_map(mid, &p) == TPUHAL_UNSUPPORTED);
  CHECK(strstr(tpuhal_last_error(), "not host-mappable") != NULL);

  tpuhal_queue_t q = NULL;
  CHECK(tpuhal_queue_create(dev, TPUHAL_ENGINE_COMPUTE, &q) == TPUHAL_OK);
  tpuhal_batch_t b = NULL;
  CHECK(tpuhal_batch_create(q, &b) == TPUHAL_OK);
  CHECK(tpuhal_batch_copy(b, src, 0, mid, 0, n) == TPUHAL_OK);
  CHECK(tpuhal_batch_fill(b, mid, 0, 4, 0xAB, 1) == TPUHAL_OK);
  CHECK(tpuhal_batch_copy(b, mid, 0, dst, 0, n) == TPUHAL_OK);
  tpuhal_fence_t f = NULL;
  CHECK(tpuhal_batch_submit(b, &f) == TPUHAL_OK);
  CHECK(tpuhal_fence_wait(f, 5000000000ull) == TPUHAL_OK);
  int done = 0;
  CHECK(tpuhal_fence_is_complete(f, &done) == TPUHAL_OK && done == 1);
  CHECK(tpuhal_fence_value(f) == 1);
  for (uint64_t i = 0; i < n; ++i) {
    unsigned char want = i < 4 ? 0xAB : (unsigned char)(i * 13);
    if (d[i] != want) {
      CHECK(d[i] == want);
      break;
    }
  }

  /* Bad input: the status names the problem, the message the values. */
  CHECK(tpuhal_batch_copy(b, src, 0, mid, n - 10, 100) == TPUHAL_OUT_OF_RANGE);
  CHECK(strstr(tpuhal_last_error(), "copy of 100 bytes at offset 65526") != NULL);
  CHECK(tpuhal_open("nosuchbus:0", &dev) == TPUHAL_NOT_FOUND);
  CHECK(tpuhal_open(NULL, &dev) == TPUHAL_INVALID_ARGUMENT);
  CHECK(tpuhal_buffer_allocate(dev, 0, TPUHAL_MEMORY_DEVICE, &mid) == TPUHAL_INVALID_ARGUMENT);
  CHECK(tpuhal_buffer_allocate(dev, 16, (tpuhal_memory_t)42, &mid) == TPUHAL_INVALID_ARGUMENT);
  CHECK(strcmp(tpuhal_status_string(TPUHAL_QUEUE_FULL), "queue full") == 0);

  /* Work after the errors still runs. */
  tpuhal_fence_t f2 = NULL;
  CHECK(tpuhal_batch_copy(b, src, 0, dst, 0, n) == TPUHAL_OK);
  CHECK(tpuhal_batch_submit(b, &f2) == TPUHAL_OK);
  CHECK(tpuhal_fence_wait(f2, 0) == TPUHAL_OK);
  CHECK(memcmp(s, d, n) == 0);

  /* The trace holds the submissions and the copies on the board's clock. */
  uint64_t events = 0, dropped = 1;
  CHECK(tpuhal_trace_stop(&events, &dropped) == TPUHAL_OK);
  CHECK(events > 0 && dropped == 0);
  CHECK(tpuhal_trace_stop(NULL, NULL) == TPUHAL_OK); /* none on: harmless */
  FILE* tf = fopen(trace_path, "r");
  CHECK(tf != NULL);
  if (tf) {
    static char text[1 << 20];
    const size_t len = fread(text, 1, sizeof text - 1, tf);
    text[len] = 0;
    fclose(tf);
    CHECK(strstr(text, "\"traceEvents\":[") != NULL);
    CHECK(strstr(text, "{\"ph\":\"X\",\"name\":\"submit\"") != NULL);
    CHECK(strstr(text, "\"name\":\"copy\",\"cat\":\"device\"") != NULL);
    CHECK(strstr(text, "\"bytes\":65536") != NULL);
    CHECK(len > 3 && strcmp(text + len - 4, "}}}\n") == 0);
    remove(trace_path);
  }

  tpuhal_fence_release(f2);
  tpuhal_fence_release(f);
  tpuhal_batch_release(b);
  tpuhal_queue_release(q);
  tpuhal_buffer_release(mid);
  tpuhal_buffer_release(dst);
  tpuhal_buffer_release(src);
  tpuhal_device_release(dev);
  if (failures)
    fprintf(stderr, "%d check(s) failed\n", failures);
  else
    printf("C API: all checks passed\n");
  return failures ? 1 : 0;
}
