/* The same from C. */
#include <stdio.h>
#include <tpuhal/tpuhal.h>

int main(void) {
  size_t count = 0;
  if (tpuhal_enumerate(NULL, 0, &count) != TPUHAL_OK || count == 0) return 1;
  tpuhal_device_t dev;
  if (tpuhal_open("sim:0", &dev) != TPUHAL_OK) return 1;
  uint64_t total = 0;
  tpuhal_device_memory(dev, &total, NULL);
  printf("consumer_c: %zu device(s), sim:0 has %llu bytes\n", count, (unsigned long long)total);
  tpuhal_device_release(dev);
  return total ? 0 : 1;
}
