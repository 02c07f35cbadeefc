// The board's DMA engine: moves bytes between DRAM and host memory reached
// through the IOMMU. Internal to the simulator.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "dram_writes.h"
#include "tpuhal/fw/decode.h"
#include "tpuhal/sim/board.h"
#include "tpuhal/sim/iommu.h"

namespace tpuhal::sim {

class DmaEngine {
 public:
  // `port`: host memory is reached through messages (BoardOptions::host_port)
  // instead of the IOMMU's pointers; nullptr for host memory in this process.
  // `writes`: where DRAM handed out for writing is stamped (dram_writes.h).
  DmaEngine(std::byte* dram, std::uint64_t dram_size, IommuDomain& iommu, DramWrites& writes, HostPort* port = nullptr)
      : dram_(dram), dram_size_(dram_size), iommu_(iommu), writes_(writes), port_(port) {}

  IommuDomain& iommu() const noexcept { return iommu_; }
  HostPort* port() const noexcept { return port_; }
  // Whether `addr` is host memory reached through the port: resolve() gives
  // no pointer for it; read(), write() and the transfers below reach it.
  bool remote(std::uint64_t addr) const noexcept { return port_ && fw::is_host_address(addr); }

  // Host pointer for [addr, addr + size) inside one of DRAM or one IOMMU
  // mapping, valid while `access` lives; nullptr if not decoded or not mapped.
  // DRAM resolved for writing is stamped in the write log as the pointer is
  // handed out and when `access` ends: write through it only meanwhile.
  std::byte* resolve(DmaAccess& access, std::uint64_t addr, std::uint64_t size, std::uint32_t kind) const noexcept;

  // Transfers are split into chunks; after each, `progress` is incremented
  // and `stop` checked (a queue reset aborts between chunks).
  struct Hooks {
    std::atomic<std::uint32_t>* progress = nullptr;
    const std::atomic<bool>* stop = nullptr;
  };
  // Large enough that a big transfer uses the same (non-temporal) copy path a
  // single memcpy of it would; small enough to bound reset latency.
  static constexpr std::uint64_t kChunk = 64ull << 20;
  // Through a HostPort (a USB board), a transfer moves in pieces asked for
  // all at once, so that the link's round trip is paid once per piece.
  static constexpr std::uint64_t kRemoteChunk = 16ull << 20;

  // Each returns a Problem whose status is kOk on success. `src_field` and
  // `dst_field` name the descriptor fields in a fault report.
  fw::Problem copy(DmaContext& ctx, std::uint64_t src, std::uint64_t dst, std::uint64_t size, std::uint16_t src_field,
                   std::uint16_t dst_field, const Hooks& hooks) const;
  fw::Problem fill(DmaContext& ctx, std::uint64_t dst, std::uint64_t size, std::uint32_t pattern, std::uint32_t width,
                   std::uint16_t dst_field, const Hooks& hooks) const;
  fw::Problem read(DmaContext& ctx, std::uint64_t src, void* out, std::uint64_t size, std::uint16_t field) const;
  // Writes `size` bytes to DRAM or host memory (posted to a remote host).
  fw::Problem write(DmaContext& ctx, std::uint64_t dst, const void* in, std::uint64_t size, std::uint16_t field) const;
  fw::Problem load64(DmaContext& ctx, std::uint64_t addr, std::uint64_t& out, std::uint16_t field) const;
  fw::Problem store64(DmaContext& ctx, std::uint64_t addr, std::uint64_t value, std::uint16_t field) const;

  // Injected ECC errors: a read of DRAM that touches a poisoned range fails
  // with kEccError naming the first poisoned address (copies, scatter-gather
  // lists, command lists and parameter blocks, 64-bit loads).
  void poison(std::uint64_t addr, std::uint64_t size);
  void clear_poison() noexcept;

 private:
  // The first poisoned byte of DRAM [addr, addr + size), if any.
  std::optional<std::uint64_t> poisoned(std::uint64_t addr, std::uint64_t size) const;
  fw::Problem check_read(std::uint64_t addr, std::uint64_t size, std::uint16_t field) const;
  // One piece of a transfer where either side is remote host memory.
  fw::Problem copy_remote(DmaContext& ctx, std::uint64_t src, std::uint64_t dst, std::uint64_t size,
                          std::uint16_t src_field, std::uint16_t dst_field) const;

  std::byte* dram_;
  std::uint64_t dram_size_;
  IommuDomain& iommu_;
  DramWrites& writes_;
  HostPort* port_;
  mutable std::mutex poison_mu_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> poison_;  // [begin, end); guarded
  std::atomic<bool> any_poison_{false};
};

}  // namespace tpuhal::sim
