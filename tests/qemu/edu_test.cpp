// Drives QEMU's "edu" PCI device through the PCI bus layer the TPU transport
// uses (tpuhal/bus/pci_device.h), inside a guest booted by tests/qemu/run.sh.
//
//   edu_test vfio     discovery with libpci, BAR0 through VFIO, the identity,
//                     liveness and factorial registers, MSI through an
//                     eventfd, a DMA round trip through the IOMMU
//   edu_test sysfs    the same registers through the sysfs resource0 file,
//                     INTx through UIO (uio_pci_generic), DMA refused
//   edu_test exit N   writes N to the isa-debug-exit port (QEMU then exits
//                     with 2N+1): how the guest reports its verdict
//
// Prints one line per check ("ok ..." / "FAIL ...") and exits 0 only if
// every check passed. Every wait is bounded.
#include <linux/capability.h>
#include <sys/io.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>

#include "tpuhal/base/hex.h"
#include "tpuhal/error.hpp"
#include "tpuhal/bus/pci_device.h"

using namespace tpuhal;
using namespace tpuhal::bus;
using namespace std::chrono_literals;

namespace {

// QEMU hw/misc/edu.c register map.
constexpr std::uint32_t kIdent = 0x00, kLiveness = 0x04, kFactorial = 0x08, kStatus = 0x20;
constexpr std::uint32_t kIrqStatus = 0x24, kIrqRaise = 0x60, kIrqAck = 0x64;
constexpr std::uint32_t kDmaSrc = 0x80, kDmaDst = 0x88, kDmaCount = 0x90, kDmaCmd = 0x98;
constexpr std::uint32_t kStatusComputing = 0x01, kStatusIrqOnFactorial = 0x80;
constexpr std::uint32_t kDmaStart = 0x01, kDmaToRam = 0x02, kDmaIrq = 0x04;
constexpr std::uint32_t kFactIrq = 0x001, kDmaIrqValue = 0x100;
constexpr std::uint64_t kEduBuffer = 0x40000;
constexpr PciId kEdu{0x1234, 0x11e8};

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
}

// Polls until (reg & mask) == 0, for at most `limit`.
bool wait_clear(const PciDevice& d, std::uint32_t reg, std::uint32_t mask, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (d.read32(0, reg) & mask) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(100us);
  }
  return true;
}

std::unique_ptr<PciDevice> discover_and_open(Access access) {
  const PciId ids[] = {kEdu};
  const auto found = discover(ids);
  check(found.size() == 1, "libpci finds one edu device (1234:11e8): " + std::to_string(found.size()));
  if (found.empty()) return nullptr;
  const PciInfo& info = found[0];
  std::printf("     %s\n", info.summary().c_str());
  check(info.class_code >> 8 == 0x00ff, "class " + hex(info.class_code) + " is 00ff (unclassified)");
  check(info.bar(0) && info.bar(0)->size == (1u << 20), "BAR0 is 1 MiB");
  OpenOptions opts;
  opts.access = access;
  opts.min_bar_sizes = {{0, 1u << 20}};
  opts.bars = {0};
  // A board needing more than edu has is refused with the sizes named.
  try {
    OpenOptions big = opts;
    big.min_bar_sizes = {{0, 2u << 20}};
    PciDevice::open(info.bdf, big);
    check(false, "a 2 MiB BAR0 requirement is refused");
  } catch (const Error& e) {
    check(
        e.status() == Status::Unsupported && std::string_view(e.what()).find("BAR0 is 1 MiB") != std::string_view::npos,
        std::string("a 2 MiB BAR0 requirement is refused: ") + e.what());
  }
  auto dev = PciDevice::open(info.bdf, opts);
  check(dev->access() == access, std::string("opened through ") + to_string(dev->access()));
  return dev;
}

void registers(const PciDevice& d) {
  const std::uint32_t id = d.read32(0, kIdent);
  check(id == 0x010000ed, "identity register reads " + hex(id) + " (0x010000ed)");
  for (std::uint32_t v : {0x12345678u, 0u, 0xa5a5a5a5u}) {
    d.write32(0, kLiveness, v);
    const std::uint32_t r = d.read32(0, kLiveness);
    check(r == ~v, "liveness: wrote " + hex(v) + ", read " + hex(r));
  }
  d.write32(0, kStatus, 0);
  d.write32(0, kFactorial, 10);
  const bool done = wait_clear(d, kStatus, kStatusComputing, 2000ms);
  const std::uint32_t f = d.read32(0, kFactorial);
  check(done && f == 3628800,
        "factorial(10) = " + std::to_string(f) + " (busy bit cleared: " + (done ? "yes" : "no") + ")");
}

// Waits for one interrupt and checks edu's interrupt status, then acks.
void expect_interrupt(PciDevice& d, std::uint32_t value, const std::string& what) {
  const std::uint64_t n = d.wait_interrupt(0, 3000ms);
  const std::uint32_t st = d.read32(0, kIrqStatus);
  check(n >= 1 && (st & value) == value,
        what + ": " + d.interrupt_kind() + " delivered " + std::to_string(n) + ", status " + hex(st));
  d.write32(0, kIrqAck, st);
  check(d.read32(0, kIrqStatus) == 0, what + ": acknowledged, status 0");
  d.rearm_intx();
}

void interrupts(PciDevice& d, const std::string& expected_kind) {
  const std::uint32_t n = d.enable_interrupts(1);
  check(n == 1 && d.interrupt_kind() == expected_kind,
        "interrupts enabled: " + std::to_string(n) + " " + d.interrupt_kind() + " (" + expected_kind + ")");
  check(d.wait_interrupt(0, 100ms) == 0, "no interrupt before one is raised");
  d.write32(0, kStatus, kStatusIrqOnFactorial);
  d.write32(0, kFactorial, 5);
  expect_interrupt(d, kFactIrq, "interrupt after factorial");
  check(d.read32(0, kFactorial) == 120, "factorial(5) = 120");
  d.write32(0, kStatus, 0);
  d.write32(0, kIrqRaise, 0x1234);
  expect_interrupt(d, 0x1234, "interrupt raised through 0x60");
  d.write32(0, kIrqRaise, 0x40);
  expect_interrupt(d, 0x40, "a second raised interrupt (line re-armed)");
}

struct Page {
  std::byte* p =
      static_cast<std::byte*>(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ~Page() { ::munmap(p, 4096); }
};

// Sets or clears CAP_IPC_LOCK in this process's effective set (it stays
// permitted, so it can come back).
bool set_ipc_lock(bool on) {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (::syscall(SYS_capget, &header, data) != 0) return false;
  auto& word = data[CAP_IPC_LOCK / 32].effective;
  const std::uint32_t bit = 1u << (CAP_IPC_LOCK % 32);
  word = on ? (word | bit) : (word & ~bit);
  return ::syscall(SYS_capset, &header, data) == 0;
}

// Without CAP_IPC_LOCK and with RLIMIT_MEMLOCK at one page, mapping two
// pages is refused with a message naming the limit.
void memlock_limit(PciDevice& d) {
  Page a, b;
  rlimit old{};
  ::getrlimit(RLIMIT_MEMLOCK, &old);
  rlimit low = old;
  low.rlim_cur = 4096;
  const bool setup = set_ipc_lock(false) && ::setrlimit(RLIMIT_MEMLOCK, &low) == 0;
  check(setup, "dropped CAP_IPC_LOCK and set RLIMIT_MEMLOCK to 4 KiB");
  bool refused = false;
  std::string msg;
  try {
    d.map_dma(0x200000, a.p, 4096, false);
    d.map_dma(0x201000, b.p, 4096, false);
  } catch (const Error& e) {
    refused = e.status() == Status::OutOfMemory;
    msg = e.what();
  }
  check(refused && msg.find("memlock limit (RLIMIT_MEMLOCK) is 4 KiB") != std::string::npos,
        "a mapping past the memlock limit is refused: " + msg);
  d.unmap_dma(0x200000, 4096);
  d.unmap_dma(0x201000, 4096);
  ::setrlimit(RLIMIT_MEMLOCK, &old);
  set_ipc_lock(true);
  check(d.dma_mapped_bytes() == 0, "nothing stays mapped after the refusal");
}

void dma(PciDevice& d) {
  constexpr std::uint32_t kBytes = 2048;                             // edu (QEMU 7.2) mishandles a full 4096
  constexpr std::uint64_t kSrcIova = 0x100000, kDstIova = 0x101000;  // inside edu's 28-bit DMA mask
  Page src, dst;
  for (std::uint32_t i = 0; i < 4096; ++i) {
    src.p[i] = static_cast<std::byte>((i * 7 + 3) & 0xff);
    dst.p[i] = std::byte{0xee};
  }
  d.map_dma(kSrcIova, src.p, 4096, false);
  d.map_dma(kDstIova, dst.p, 4096, true);
  check(d.dma_mapped_bytes() == 8192, "VFIO_IOMMU_MAP_DMA mapped two pages: " + std::to_string(d.dma_mapped_bytes()));
  try {
    d.map_dma(kSrcIova, src.p, 4096, false);
    check(false, "an overlapping mapping is refused");
  } catch (const Error& e) {
    check(e.status() == Status::InvalidArgument, std::string("an overlapping mapping is refused: ") + e.what());
  }

  // RAM -> edu buffer, completion by interrupt.
  d.write64(0, kDmaSrc, kSrcIova);
  d.write64(0, kDmaDst, kEduBuffer);
  d.write64(0, kDmaCount, kBytes);
  d.write32(0, kDmaCmd, kDmaStart | kDmaIrq);
  expect_interrupt(d, kDmaIrqValue, "DMA to the device completes with an interrupt");
  check(wait_clear(d, kDmaCmd, kDmaStart, 2000ms), "DMA to the device: command bit cleared");
  // edu buffer -> RAM.
  d.write64(0, kDmaSrc, kEduBuffer);
  d.write64(0, kDmaDst, kDstIova);
  d.write64(0, kDmaCount, kBytes);
  d.write32(0, kDmaCmd, kDmaStart | kDmaToRam | kDmaIrq);
  expect_interrupt(d, kDmaIrqValue, "DMA to host memory completes with an interrupt");
  check(wait_clear(d, kDmaCmd, kDmaStart, 2000ms), "DMA to host memory: command bit cleared");
  check(std::memcmp(src.p, dst.p, kBytes) == 0,
        "DMA round trip: " + std::to_string(kBytes) + " bytes came back intact");
  bool untouched = true;
  for (std::uint32_t i = kBytes; i < 4096; ++i) untouched = untouched && dst.p[i] == std::byte{0xee};
  check(untouched, "DMA wrote nothing past the count");
  d.unmap_dma(kSrcIova, 4096);
  d.unmap_dma(kDstIova, 4096);
  check(d.dma_mapped_bytes() == 0, "VFIO_IOMMU_UNMAP_DMA released both pages");
}

int run_vfio() {
  auto d = discover_and_open(Access::Vfio);
  if (!d) return 1;
  registers(*d);
  interrupts(*d, "msi");
  memlock_limit(*d);
  dma(*d);
  return failures ? 1 : 0;
}

int run_sysfs() {
  auto d = discover_and_open(Access::Sysfs);
  if (!d) return 1;
  check(d->info().driver == "uio_pci_generic", "bound to " + d->info().driver);
  check(!d->info().iommu_group, "no IOMMU group");
  registers(*d);
  Page page;
  try {
    d->map_dma(0x100000, page.p, 4096, true);
    check(false, "DMA without VFIO is refused");
  } catch (const Error& e) {
    check(e.status() == Status::Unsupported, std::string("DMA without VFIO is refused: ") + e.what());
  }
  try {
    OpenOptions vfio;
    vfio.access = Access::Vfio;
    PciDevice::open(d->info().bdf, vfio);
    check(false, "VFIO without an IOMMU is refused");
  } catch (const Error& e) {
    check(e.status() == Status::FailedPrecondition, std::string("VFIO without vfio-pci is refused: ") + e.what());
  }
  interrupts(*d, "intx (uio)");
  return failures ? 1 : 0;
}

int report(int code) {
  // isa-debug-exit at 0xf4: QEMU exits with (code << 1) | 1.
  if (::ioperm(0xf4, 1, 1) != 0) {
    std::perror("ioperm(0xf4)");
    return 1;
  }
  ::outb(static_cast<unsigned char>(code), 0xf4);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string_view mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "vfio") return run_vfio();
    if (mode == "sysfs") return run_sysfs();
    if (mode == "exit" && argc > 2) return report(std::atoi(argv[2]));
  } catch (const Error& e) {
    std::printf("FAIL %s error: %s\n", to_string(e.status()), e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: edu_test vfio|sysfs|exit N\n");
  return 2;
}
