// PciDevice: the bus layer below the PCIe transport. Finds PCI functions with
// libpci, maps their BARs through VFIO (or, without an IOMMU, through the
// sysfs resourceN files), maps host memory for DMA through the VFIO IOMMU and
// delivers interrupts as eventfds (VFIO MSI/INTx, or UIO for INTx).
//
// The sysfs and /dev roots are parameters (PciRoots) so that discovery and
// every error path run against a fake tree in tests. Errors are
// tpuhal::Error naming the device, the file or call, and the value; see
// docs/pcie.md for what each one asks the user to do.
//
// Thread safety: discover() and describe() are reentrant. A PciDevice's BAR
// accessors, map_dma/unmap_dma and interrupt waits may be used from several
// threads; enable_interrupts must return before other threads use the
// interrupt calls.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tpuhal::bus {

// Where the kernel's files live. Tests point these into a temporary tree.
struct PciRoots {
  std::string sysfs = "/sys";  // holds bus/pci/devices/<bdf>
  std::string dev = "/dev";    // holds vfio/vfio, vfio/<group>, uio<N>
};

struct PciId {
  std::uint16_t vendor = 0;
  std::uint16_t device = 0;
  friend bool operator==(const PciId&, const PciId&) = default;
};

struct BarInfo {
  std::uint32_t index = 0;
  std::uint64_t address = 0;  // bus address as the kernel assigned it
  std::uint64_t size = 0;     // 0: not implemented
  bool io = false;            // an I/O-port BAR (not mappable)
  bool prefetchable = false;
  bool is64 = false;
};

// Everything discovery learns about one function.
struct PciInfo {
  std::string bdf;  // "0000:03:00.0"
  PciId id;
  std::uint32_t class_code = 0;    // base class, subclass, prog-if: 0x120000
  std::vector<BarInfo> bars;       // the six BARs, implemented or not
  int numa_node = -1;              // -1: unknown or none
  std::string link_speed;          // "8.0 GT/s PCIe", empty if not PCIe
  int link_width = 0;              // lanes, 0 if unknown
  std::string driver;              // bound kernel driver, empty if none
  std::optional<int> iommu_group;  // none: no IOMMU (or IOMMU off)

  const BarInfo* bar(std::uint32_t index) const noexcept;
  // One line: "0000:03:00.0 1f1c:1686 class 120000 BAR0 64 KiB, BAR2 256 MiB
  // NUMA 0 link 8.0 GT/s PCIe x4 driver vfio-pci IOMMU group 7".
  std::string summary() const;
};

// Parses "DDDD:BB:DD.F" (or "BB:DD.F", domain 0) into the canonical form;
// nullopt if it is not one.
std::optional<std::string> canonical_bdf(std::string_view text);

// Every function whose ID is in `ids` (all functions if `ids` is empty),
// sorted by BDF. A machine without a PCI bus (no <sysfs>/bus/pci/devices)
// has none: an empty list, not an error. Throws tpuhal::Error
// (Status::Unavailable) if libpci fails to read the tree.
std::vector<PciInfo> discover(std::span<const PciId> ids, const PciRoots& roots = {});

// The one function at `bdf`; throws Status::NotFound if there is none,
// Status::InvalidArgument if `bdf` is not a PCI address.
PciInfo describe(std::string_view bdf, const PciRoots& roots = {});

// How the BARs are reached.
enum class Access : std::uint8_t {
  Auto,   // VFIO when bound to vfio-pci, sysfs when unbound or bound to uio_pci_generic
  Vfio,   // VFIO only (DMA, MSI)
  Sysfs,  // sysfs resourceN only (no DMA; INTx through UIO if bound to uio_pci_generic)
};
const char* to_string(Access access) noexcept;

struct OpenOptions {
  Access access = Access::Auto;
  // Minimum sizes the caller needs, per BAR index; a smaller (or missing)
  // BAR fails the open with Status::Unsupported.
  std::vector<std::pair<std::uint32_t, std::uint64_t>> min_bar_sizes;
  // BARs to map (all memory BARs if empty).
  std::vector<std::uint32_t> bars;
};

// The memlock check behind map_dma, exposed so its message can be tested:
// throws Status::OutOfMemory if pinning `size` more bytes on top of `locked`
// exceeds `limit` (RLIM_INFINITY: no limit). `what` names the device.
void check_memlock(std::string_view what, std::uint64_t locked, std::uint64_t size, std::uint64_t limit);

class PciDevice {
 public:
  // Opens the function at `bdf`. Throws tpuhal::Error: NotFound (no such
  // function), FailedPrecondition (bound to another driver; no IOMMU group
  // when VFIO is asked for; group not viable), PermissionDenied (the VFIO
  // group or resource file), Unsupported (a BAR smaller than asked for, or
  // not mappable), Unavailable (VFIO missing or too old).
  static std::unique_ptr<PciDevice> open(std::string_view bdf, const OpenOptions& options = {},
                                         const PciRoots& roots = {});
  ~PciDevice();
  PciDevice(const PciDevice&) = delete;
  PciDevice& operator=(const PciDevice&) = delete;

  const PciInfo& info() const noexcept { return info_; }
  Access access() const noexcept { return access_; }  // Vfio or Sysfs

  // The host mapping of BAR `index`; empty if the BAR is not mapped.
  std::span<std::byte> bar(std::uint32_t index) const noexcept;
  // 32-bit MMIO on a mapped BAR. Throws Status::OutOfRange for an offset
  // that is unaligned or past the BAR, naming both.
  std::uint32_t read32(std::uint32_t index, std::uint64_t offset) const;
  // Orders every earlier store (a store fence) before the MMIO write.
  void write32(std::uint32_t index, std::uint64_t offset, std::uint32_t value) const;
  void write64(std::uint32_t index, std::uint64_t offset, std::uint64_t value) const;
  std::uint64_t read64(std::uint32_t index, std::uint64_t offset) const;

  // DMA through the VFIO IOMMU: the device reaches [host, host+size) at
  // `iova`. Page-aligned. Throws Status::Unsupported without VFIO,
  // Status::OutOfMemory when RLIMIT_MEMLOCK is too low, Status::InvalidArgument
  // for misalignment or an overlap the IOMMU refuses.
  void map_dma(std::uint64_t iova, void* host, std::uint64_t size, bool device_writes);
  // Never throws; unmapping a range never mapped is ignored.
  void unmap_dma(std::uint64_t iova, std::uint64_t size) noexcept;
  bool dma_available() const noexcept { return access_ == Access::Vfio; }
  std::uint64_t dma_mapped_bytes() const noexcept;

  // Enables up to `wanted` interrupt vectors: MSI-X or MSI (VFIO), else
  // INTx (VFIO, or UIO when bound to uio_pci_generic). Returns how many were
  // enabled. Throws Status::Unsupported if the device has no usable interrupt.
  std::uint32_t enable_interrupts(std::uint32_t wanted);
  std::uint32_t interrupt_vectors() const noexcept;
  // "msi-x", "msi", "intx (vfio)", "intx (uio)" or "none".
  std::string interrupt_kind() const;
  // A descriptor that becomes readable when `vector` fires.
  int interrupt_fd(std::uint32_t vector) const;
  // Waits up to `timeout` for `vector`; returns how many times it fired (0 on
  // timeout), consuming the count. A level-triggered INTx line stays masked
  // after it fires: acknowledge the device, then call rearm_intx().
  std::uint64_t wait_interrupt(std::uint32_t vector, std::chrono::milliseconds timeout);
  // Re-arms a level-triggered INTx line after the device was acknowledged;
  // does nothing for MSI/MSI-X.
  void rearm_intx();

  struct Impl;

 private:
  PciDevice(PciInfo info, std::unique_ptr<Impl> impl, Access access);
  PciInfo info_;
  std::unique_ptr<Impl> impl_;
  Access access_;
};

}  // namespace tpuhal::bus
