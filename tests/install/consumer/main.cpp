// Opens the first device, moves a buffer through it, checks it.
#include <tpuhal/tpuhal.hpp>

#include <cstdio>
#include <cstring>

int main() {
  auto devices = tpuhal::enumerate();
  if (devices.empty()) return 1;
  tpuhal::Device dev = tpuhal::open(devices.front().uri);
  tpuhal::Buffer a = dev.allocate(1 << 16, tpuhal::Memory::HostPinned);
  tpuhal::Buffer b = dev.allocate(1 << 16, tpuhal::Memory::HostPinned);
  tpuhal::Buffer d = dev.allocate(1 << 16);
  std::memset(a.map().data(), 0x42, a.size());
  dev.queue().copy(a, d).copy(d, b).submit().wait();
  const bool ok = std::memcmp(a.map().data(), b.map().data(), a.size()) == 0;
  std::printf("consumer: tpuhal %s, %s: %s\n", tpuhal::version(), dev.uri().c_str(), ok ? "ok" : "MISMATCH");
  try {
    dev.allocate(0);
  } catch (const tpuhal::Error& e) {
    std::printf("consumer: error as expected: %s\n", tpuhal::to_string(e.status()));
    return ok ? 0 : 1;
  }
  return 1;
}
