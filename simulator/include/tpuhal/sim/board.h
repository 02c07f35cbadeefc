// A simulated accelerator board, modelled at the register and descriptor
// level (docs/simulator.md).
//
// What the host sees is what a PCIe card shows: a BAR0 register window
// (mmio_read32 / mmio_write32), a BAR2 aperture onto device DRAM, an IOMMU
// it programs to let the board reach host memory, and one eventfd per
// interrupt vector. Behind them: DRAM, a DMA engine, one command processor
// thread per enabled hardware queue and a firmware mailbox.
//
// The board trusts nothing the host writes: every descriptor is decoded and
// validated, every address checked against DRAM and the IOMMU. A bad one
// halts its queue with a precise failure record; the board and its other
// queues carry on.
//
// Thread-safety: mmio_* may be called from any thread. iommu() is
// thread-safe. A Board must outlive every pointer into its aperture.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "tpuhal/sim/iommu.h"
#include "tpuhal/sim/profile.h"

namespace tpuhal::sim {

class Board {
 public:
  explicit Board(BoardProfile profile);
  ~Board();
  Board(const Board&) = delete;
  Board& operator=(const Board&) = delete;

  const BoardProfile& profile() const noexcept;

  // BAR0. Accesses that are misaligned, outside fw::kBar0Size or to a queue
  // the board does not have are counted in bad_mmio_accesses(); such reads
  // return 0xFFFFFFFF (as a PCIe read of nothing does) and writes are
  // dropped, as are writes to read-only registers.
  std::uint32_t mmio_read32(std::uint32_t offset) noexcept;
  void mmio_write32(std::uint32_t offset, std::uint32_t value) noexcept;

  // BAR2: the host-visible window onto DRAM [0, profile().aperture_bytes).
  std::span<std::byte> aperture() noexcept;

  // The IOMMU domain through which the board reaches host memory.
  IommuDomain& iommu() noexcept;

  std::uint32_t interrupt_vectors() const noexcept;
  // Readable when the vector fires; the reader drains it.
  int interrupt_fd(std::uint32_t vector) const noexcept;

  std::uint64_t bad_mmio_accesses() const noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpuhal::sim
