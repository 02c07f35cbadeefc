// The smallest complete tpuhal program: open a device, move data through it,
// check it, and handle an error.
#include <tpuhal/tpuhal.hpp>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  try {
    tpuhal::Device dev = tpuhal::open(argc > 1 ? argv[1] : "sim:0");
    std::printf("%s: %s\n", dev.uri().c_str(), dev.properties().board.c_str());

    const std::uint64_t n = 1 << 20;
    tpuhal::Buffer in = dev.allocate(n, tpuhal::Memory::HostPinned);
    tpuhal::Buffer out = dev.allocate(n, tpuhal::Memory::HostPinned);
    tpuhal::Buffer dram = dev.allocate(n);  // device memory
    std::memset(in.map().data(), 0x5A, n);

    tpuhal::Queue q = dev.queue(tpuhal::Engine::Compute);
    tpuhal::Fence done = q.copy(in, dram).copy(dram, out).submit();
    done.wait();  // throws tpuhal::Error if the device failed the work

    const bool same = std::memcmp(in.map().data(), out.map().data(), n) == 0;
    std::printf("round trip of %llu bytes: %s\n", static_cast<unsigned long long>(n), same ? "ok" : "MISMATCH");
    return same ? 0 : 1;
  } catch (const tpuhal::Error& e) {
    std::fprintf(stderr, "tpuhal error (%s): %s\n", tpuhal::to_string(e.status()), e.what());
    return 1;
  }
}
