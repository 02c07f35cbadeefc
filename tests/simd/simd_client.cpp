// A client process for the simulator daemon's tests: opens a simd: device,
// leaves a secret in its host and device memory, prints where, and holds
// everything until its standard input closes (or it is killed).
//
//   simd_client URI SECRET_BYTE
// prints "ready HOST_IOVA DEVICE_ADDRESS RESIDENT_BYTES" once set up.
//
//   simd_client --stats SOCKET
// prints the daemon's statistics as this process sees them: "vfs N" then
// "vf BOARD VF PID UID" per VF listed.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <string>

#include "tpuhal/tpu/simd_provider.h"
#include "tpuhal/tpuhal.hpp"

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--stats") {
    try {
      const auto stats = tpuhal::tpu::simd_stats(argv[2]);
      std::printf("vfs %zu\n", stats.vfs.size());
      for (auto& v : stats.vfs) std::printf("vf %u %u %d %u\n", v.board, v.vf, v.pid, v.uid);
      return 0;
    } catch (const tpuhal::Error& e) {
      std::fprintf(stderr, "simd_client: %s\n", e.what());
      return 1;
    }
  }
  if (argc != 3) {
    std::fprintf(stderr, "usage: simd_client URI SECRET_BYTE\n");
    return 2;
  }
  try {
    const auto secret = static_cast<unsigned char>(std::strtoul(argv[2], nullptr, 0));
    tpuhal::Device dev = tpuhal::open(argv[1]);
    constexpr std::uint64_t kBytes = 1 << 20;
    tpuhal::Buffer host = dev.allocate(kBytes, tpuhal::Memory::HostPinned);
    tpuhal::Buffer device = dev.allocate(kBytes, tpuhal::Memory::Device);
    std::memset(host.map().data(), secret, kBytes);
    dev.queue().copy(host, device).submit().wait();
    std::printf("ready %llu %llu\n", static_cast<unsigned long long>(host.device_address()),
                static_cast<unsigned long long>(device.device_address()));
    std::fflush(stdout);
    char c;
    while (::read(0, &c, 1) > 0) {
    }
    return 0;
  } catch (const tpuhal::Error& e) {
    std::fprintf(stderr, "simd_client: %s\n", e.what());
    return 1;
  }
}
