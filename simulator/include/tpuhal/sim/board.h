// A simulated accelerator board, modelled at the register and descriptor
// level (docs/simulator.md).
//
// What the host sees is what a PCIe card shows: a BAR0 register window
// (mmio_read32 / mmio_write32), a BAR2 aperture onto device DRAM, an IOMMU
// it programs to let the board reach host memory, and one eventfd per
// interrupt vector. Behind them: DRAM, a DMA engine, one command processor
// thread per hardware queue (started by its first enable) and a firmware
// mailbox.
//
// The board trusts nothing the host writes: every descriptor is decoded and
// validated, every address checked against DRAM and the IOMMU. A bad one
// halts its queue with a precise failure record; the board and its other
// queues carry on.
//
// Thread-safety: mmio_* may be called from any thread. iommu() is
// thread-safe. A Board must outlive every pointer into its aperture.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "tpuhal/sim/iommu.h"
#include "tpuhal/sim/profile.h"

namespace tpuhal::sim {

// Faults the board suffers on demand (docs/faults.md): tests inject them with
// Board::inject, users with TPUHAL_SIM_FAULTS. A board reset clears them all.
enum class FaultKind : std::uint8_t {
  kDmaError,       // the next copy or fill of `queue` fails on the bus (kDmaFault)
  kHang,           // the next command of `queue` never completes
  kFirmwareCrash,  // the firmware stops: every queue halts, STATUS shows kStatusFatal
  kEccError,       // board reads of DRAM [address, address + size) fail with kEccError
  kInterruptLost,  // `count` interrupts of `queue` are not delivered (0: every one)
  kDeviceLost,     // the board stops answering: registers read all ones, nothing runs
};
const char* to_string(FaultKind kind) noexcept;

struct Fault {
  FaultKind kind = FaultKind::kDmaError;
  std::uint32_t queue = 0;           // the hardware queue it applies to (or counts on)
  std::uint64_t after_commands = 0;  // commands `queue` starts before it strikes; a
                                     // crash or loss with 0 strikes at once
  std::uint64_t address = 0;         // kEccError: first poisoned DRAM byte
  std::uint64_t size = 0;            // kEccError: poisoned bytes
  std::uint64_t count = 0;           // kInterruptLost: interrupts dropped (0: all)
};

// Parses a comma-separated list such as
// "dma-error:queue=1:after=2,ecc:address=0x1000000:size=4096,irq-lost:queue=0"
// (kinds: dma-error, hang, crash, ecc, irq-lost, lost). Throws ProfileError
// naming the item at fault.
std::vector<Fault> parse_faults(std::string_view spec);

// How a board whose host is on the far side of a cable (USB) reaches host
// memory: by asking. With BoardOptions::host_port set, the board's IOMMU
// windows carry no host pointers (the host's mappings arrive as messages and
// only say what may be reached), and every DMA access of host memory becomes
// a read or a write through the port. Without it, host memory is in this
// process and reached through the IOMMU's pointers.
class HostPort {
 public:
  virtual ~HostPort() = default;
  // Fills `out` with host memory [iova, iova + size); false if the host
  // refused (the range is not mapped for reading there), the link is gone,
  // or `abandon` is set (see wake_readers). May be called from several
  // threads at once.
  virtual bool read(std::uint64_t iova, void* out, std::uint64_t size, const std::atomic<bool>* abandon = nullptr) = 0;
  // Has every read look at its `abandon` flag again: a command processor
  // being stopped sets its flag, then calls this, so that a reset never
  // waits for an answer that must come through the very thread resetting
  // it. An abandoned read's answer, when it comes, is dropped.
  virtual void wake_readers() {}
  // Writes host memory [iova, iova + size), in order with every earlier
  // write and interrupt of this port; an aligned 4- or 8-byte write lands
  // whole (the host stores it atomically). Posted: false only if the link is
  // gone.
  virtual bool write(std::uint64_t iova, const void* in, std::uint64_t size) = 0;
};

struct BoardOptions {
  // Back DRAM with a memfd (size-sealed; see dram_fd()) instead of private
  // anonymous memory, so that another process can map the aperture: the
  // simulator daemon passes it to its clients. Sparse either way.
  bool shared_dram = false;

  // Shadow doorbells: where each hardware queue's TAIL register lives, and
  // a word its command processor sets to 1 while it sleeps, when they live
  // outside the board (the daemon puts them in memory shared with its
  // client, which stores TAIL there directly and rings the register only
  // when the processor sleeps; as NVMe's shadow doorbells). A TAIL register
  // write then only wakes the queue's processor: the value is the shadow
  // word's. Empty, or one per hardware queue; they must outlive the board.
  struct ShadowDoorbell {
    std::atomic<std::uint32_t>* tail = nullptr;
    std::atomic<std::uint32_t>* sleeping = nullptr;
  };
  std::vector<ShadowDoorbell> doorbells;

  // How long a processor asleep on a shadow doorbell waits for the register
  // before it looks at the shadow anyway: a net for a lost wake-up, long so
  // that a host that stores the shadow without ringing is seen to be wrong.
  std::chrono::milliseconds doorbell_net{1000};

  // Host memory through messages (see HostPort); must outlive the board.
  // Such a board offers no video decoding yet: the codec unit's channel
  // page is a shared-memory protocol (docs/usb.md).
  HostPort* host_port = nullptr;
};

// One command a queue ran, for a board-side trace (tpuhal-simd --trace).
struct CommandRecord {
  std::uint32_t queue = 0;
  std::uint16_t opcode = 0;       // fw::Opcode
  std::uint64_t fence_value = 0;  // the timeline value of its submission
  std::uint64_t start_ns = 0;     // board time (ns since the board's reset): modelled, with a timing model
  std::uint64_t end_ns = 0;
  std::uint64_t host_start_ns = 0;  // host time since the board's reset the simulator spent on it
  std::uint64_t host_end_ns = 0;
  std::uint64_t epoch_ns = 0;  // the board's reset on CLOCK_MONOTONIC: host time = board time + epoch
  std::uint64_t bytes = 0;     // what a copy or fill moved
  std::uint32_t status = 0;    // fw::CmdStatus: 0 when it succeeded
};
class CommandObserver {
 public:
  virtual ~CommandObserver() = default;
  // Called on the queue's thread after each command; must not block long.
  virtual void on_command(const CommandRecord& record) noexcept = 0;
};

class Board {
 public:
  explicit Board(BoardProfile profile, BoardOptions options = {});
  ~Board();
  Board(const Board&) = delete;
  Board& operator=(const Board&) = delete;

  const BoardProfile& profile() const noexcept;

  // The instruction-set level the tensor engine's kernels run at on this
  // host ("avx2", ...; docs/ops.md), or empty for a board without one.
  std::string tensor_isa() const;
  // The same for a board of `profile` made now (TPUHAL_MAX_ISA is read when
  // a board is made; a bad value throws ProfileError).
  static std::string tensor_isa_of(const BoardProfile& profile);
  // Why a board of this process decodes no video though its profile has
  // decode channels (FFmpeg, loaded at run time, is not installed: "libavutil.so.57
  // could not be loaded (...); install FFmpeg's ..."), or empty if boards
  // decode. The first call that finds it missing logs a warning saying so.
  static std::string video_unavailable();

  // BAR0. Accesses that are misaligned, outside fw::kBar0Size or to a queue
  // the board does not have are counted in bad_mmio_accesses(); such reads
  // return 0xFFFFFFFF (as a PCIe read of nothing does) and writes are
  // dropped, as are writes to read-only registers.
  std::uint32_t mmio_read32(std::uint32_t offset) noexcept;
  void mmio_write32(std::uint32_t offset, std::uint32_t value) noexcept;

  // BAR2: the host-visible window onto DRAM [0, profile().aperture_bytes).
  std::span<std::byte> aperture() noexcept;

  // The memfd behind DRAM when BoardOptions::shared_dram, else -1. Its
  // first profile().aperture_bytes are the aperture.
  int dram_fd() const noexcept;
  // Bytes of DRAM backed by memory now (pages the board or host touched).
  std::uint64_t dram_resident_bytes() const noexcept;
  // The same for DRAM [address, address + size), say one memory region.
  std::uint64_t dram_resident_bytes(std::uint64_t address, std::uint64_t size) const noexcept;
  // The telemetry block (fw/telemetry.h), every entry included, as the
  // board would write it for MboxCmd::kTelemetry: for the process that
  // hosts the board (tpuhal-simd), which needs no mailbox to read it.
  std::vector<std::byte> telemetry();
  // Queues the driver has enabled (QUEUE_CONTROL.ENABLE) and not reset.
  std::uint32_t queues_enabled() const noexcept;
  // Backs DRAM [address, address + size) with host pages now, contents
  // unchanged (MADV_POPULATE_WRITE), where size is at most
  // prefault_limit(); larger ranges, and kernels without the advice, fault
  // on first use as before.
  void prefault(std::uint64_t address, std::uint64_t size) noexcept;
  // TPUHAL_SIM_PREFAULT_MAX (bytes, read once; 0 turns prefaulting off),
  // else 256 MiB: populating takes the host kernel about 1.8 s per GiB
  // whether or not the memory is then used (filling sim:0's 7.75 GiB heap
  // in chunks of 992 MiB took 14 s and as much host memory).
  static std::uint64_t prefault_limit() noexcept;

  // The IOMMU domain through which the board reaches host memory.
  IommuDomain& iommu() noexcept;

  std::uint32_t interrupt_vectors() const noexcept;
  // Readable when the vector fires; the reader drains it.
  int interrupt_fd(std::uint32_t vector) const noexcept;

  std::uint64_t bad_mmio_accesses() const noexcept;

  // Arms a fault (see Fault). Throws std::out_of_range for a queue the board
  // does not have or an ECC range outside DRAM.
  void inject(const Fault& fault);
  // Disarms every fault not yet struck and un-poisons DRAM; a board that
  // crashed or was lost stays so until a board reset (CONTROL.RESET).
  void clear_faults() noexcept;

  // Every queue reports each command it runs to `observer` (nullptr:
  // none), which must outlive the board or be replaced first.
  void set_command_observer(CommandObserver* observer) noexcept;
  // Board time now (ns since the board's reset), on the clock of its
  // timestamps.
  std::uint64_t time_ns() const noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpuhal::sim
