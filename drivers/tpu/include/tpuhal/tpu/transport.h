// Transport: the few primitives through which the TPU driver reaches a board.
//
// Everything else (rings, descriptors, doorbells, fences, interrupts, memory
// management) is the same driver code whether the board is a PCIe card, a
// SoC, or the simulator. A new bus implements this interface and nothing
// else. See docs/porting.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "tpuhal/base/mapping.h"

namespace tpuhal::tpu {

class Transport {
 public:
  virtual ~Transport() = default;

  // "simulated pcie (bm1684x)", "pcie 0000:03:00.0", ...
  virtual std::string bus() const = 0;
  // A simulated board's tensor engine runs on the host's CPU: the
  // instruction-set level it runs at ("avx2"). Empty for real boards.
  virtual std::string tensor_isa() const { return {}; }

  // BAR0 register access (offsets 4-aligned, < fw::kBar0Size). write32 orders
  // every earlier store to the aperture before the register write (on real
  // hardware: a store fence before the posted MMIO write), so a doorbell
  // written after descriptors publishes them.
  virtual std::uint32_t read32(std::uint32_t offset) = 0;
  virtual void write32(std::uint32_t offset, std::uint32_t value) = 0;

  // Host view of device DRAM [0, aperture size) (BAR2), or empty if the bus
  // has none.
  virtual std::span<std::byte> aperture() = 0;
  // Whether stores into aperture() reach the board by themselves (a BAR, or
  // memory shared with the simulator). A bus without a memory window (USB)
  // returns false: its aperture is a host-side copy, the driver calls
  // flush_aperture after writing it, never reads back what the board wrote
  // there, and offers no mapping of device memory to users.
  virtual bool aperture_coherent() const { return true; }
  // Sends the driver's writes to aperture [offset, offset + size) to the
  // board, ordered before every later register write. Nothing to do where
  // the aperture is coherent.
  virtual void flush_aperture(std::uint64_t offset, std::uint64_t size) {
    (void)offset;
    (void)size;
  }

  // Lets the board reach `size` bytes of host memory at `host` through the
  // IOVA `iova` (the driver chooses IOVAs in fw::kHostWindowBase..End).
  // All three are page-aligned. Throws tpuhal::Error on failure.
  virtual void map_dma(std::uint64_t iova, void* host, std::uint64_t size, bool device_writes) = 0;
  // Host memory the board can reach once mapped: the driver allocates its
  // pinned host buffers and status pages here and maps them with
  // map_dma_memory. The default is populated anonymous memory (locked where
  // RLIMIT_MEMLOCK allows); a transport whose board lives in another process
  // returns memory it can share with it. Throws std::system_error or
  // tpuhal::Error on failure.
  virtual base::Mapping allocate_host(std::uint64_t bytes) {
    return base::Mapping::anonymous(bytes, {.populate = true, .lock = true, .huge_pages = bytes >= (2u << 20)});
  }
  // map_dma for [offset, offset + size) of memory from allocate_host.
  virtual void map_dma_memory(std::uint64_t iova, const base::Mapping& memory, std::uint64_t offset, std::uint64_t size,
                              bool device_writes) {
    map_dma(iova, memory.data() + offset, size, device_writes);
  }
  // Whether map_dma can map memory the caller allocated (import_host).
  virtual bool can_map_any_memory() const { return true; }

  // Removes a mapping made by map_dma or map_dma_memory; returns once the
  // board can no longer reach it. Never throws.
  virtual void unmap_dma(std::uint64_t iova, std::uint64_t size) noexcept = 0;

  // Device memory [address, address + size) was just allocated. A
  // simulated board backs it with host pages now, so that the first
  // commands to touch it do not pay the host kernel's page faults inside the
  // board's time (docs/simulator.md); real boards have nothing to do.
  virtual void prefault(std::uint64_t /*address*/, std::uint64_t /*size*/) noexcept {}

  // Interrupt vectors as file descriptors that become readable when the
  // vector fires (eventfds). The driver drains them.
  virtual std::uint32_t interrupt_vectors() const = 0;
  virtual int interrupt_fd(std::uint32_t vector) const = 0;
};

}  // namespace tpuhal::tpu
