/* The same from C: status codes, and the message of the last failure. */
#include <stdio.h>
#include <string.h>
#include <tpuhal/tpuhal.h>

#define TRY(call)                                                                            \
  do {                                                                                       \
    tpuhal_status_t s_ = (call);                                                             \
    if (s_ != TPUHAL_OK) {                                                                   \
      fprintf(stderr, "%s: %s: %s\n", #call, tpuhal_status_string(s_), tpuhal_last_error()); \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

int main(int argc, char** argv) {
  tpuhal_device_t dev;
  TRY(tpuhal_open(argc > 1 ? argv[1] : "sim:0", &dev));
  const uint64_t n = 1 << 20;
  tpuhal_buffer_t in, out, dram;
  TRY(tpuhal_buffer_allocate(dev, n, TPUHAL_MEMORY_HOST_PINNED, &in));
  TRY(tpuhal_buffer_allocate(dev, n, TPUHAL_MEMORY_HOST_PINNED, &out));
  TRY(tpuhal_buffer_allocate(dev, n, TPUHAL_MEMORY_DEVICE, &dram));
  void *pin, *pout;
  TRY(tpuhal_buffer_map(in, &pin));
  TRY(tpuhal_buffer_map(out, &pout));
  memset(pin, 0x5A, n);

  tpuhal_queue_t q;
  tpuhal_batch_t batch;
  tpuhal_fence_t done;
  TRY(tpuhal_queue_create(dev, TPUHAL_ENGINE_COMPUTE, &q));
  TRY(tpuhal_batch_create(q, &batch));
  TRY(tpuhal_batch_copy(batch, in, 0, dram, 0, n));
  TRY(tpuhal_batch_copy(batch, dram, 0, out, 0, n));
  TRY(tpuhal_batch_submit(batch, &done));
  TRY(tpuhal_fence_wait(done, 0));
  int same = memcmp(pin, pout, n) == 0;
  printf("round trip of %llu bytes: %s\n", (unsigned long long)n, same ? "ok" : "MISMATCH");

  tpuhal_fence_release(done);
  tpuhal_batch_release(batch);
  tpuhal_queue_release(q);
  tpuhal_buffer_release(dram);
  tpuhal_buffer_release(out);
  tpuhal_buffer_release(in);
  tpuhal_device_release(dev);
  return same ? 0 : 1;
}
