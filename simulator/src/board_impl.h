// Internals of the simulated board: register state, command processors.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "dma_engine.h"
#include "tensor/engine.h"
#include "video/codec_unit.h"
#include "tpuhal/base/fd.h"
#include "tpuhal/base/ffmpeg.h"
#include "tpuhal/base/mapping.h"
#include "tpuhal/base/wait.h"
#include "tpuhal/fw/command.h"
#include "tpuhal/fw/regs.h"
#include "tpuhal/fw/telemetry.h"
#include "tpuhal/fw/timing.h"
#include "tpuhal/sim/board.h"
#include "tpuhal/sim/power.h"

namespace tpuhal::sim {

class CommandProcessor;
class QueueThread;

// One hardware queue's registers. Written by mmio from any host thread and
// by its command processor.
struct QueueState {
  fw::EngineType engine = fw::EngineType::kNone;

  // Written by the host: the doorbell. Kept on its own cache line so the
  // command processor's writes below do not bounce it.
  alignas(64) std::atomic<std::uint32_t> tail_word{0};
  std::atomic<std::uint32_t>* tail = &tail_word;   // or a shadow doorbell (BoardOptions)
  std::atomic<std::uint32_t>* sleeping = nullptr;  // shadow doorbells: 1 while the processor sleeps
  std::chrono::milliseconds doorbell_net{0};       // shadow doorbells: BoardOptions::doorbell_net
  base::EventCount doorbell;                       // notified on every TAIL register write

  // Written by the command processor.
  alignas(64) std::atomic<std::uint32_t> head{0};
  std::atomic<std::uint32_t> status{0};
  std::atomic<std::uint32_t> error{0};
  std::atomic<std::uint32_t> progress{0};
  std::atomic<std::uint64_t> busy_ns{0};
  std::atomic<std::uint64_t> retired{0};
  // The queue's modelled clock (board ns): where its next command may start.
  // Kept across queue resets, so that its track never goes back; zeroed by
  // a board reset. Written by its command processor.
  std::atomic<std::uint64_t> model_ns{0};
  std::atomic<std::uint64_t> failures{0};  // commands that failed (telemetry)

  // Injected kInterruptLost: interrupts still to drop (kAllLost: every one).
  std::atomic<std::uint64_t> irq_lost{0};
  static constexpr std::uint64_t kAllLost = ~0ull;

  // Configuration, written by the host while the queue is disabled.
  alignas(64) std::atomic<std::uint32_t> control{0};
  std::atomic<std::uint32_t> ring_size{0};
  std::atomic<std::uint32_t> ring_base_lo{0}, ring_base_hi{0};
  std::atomic<std::uint32_t> fence_lo{0}, fence_hi{0};
  std::unique_ptr<CommandProcessor> cp;  // guarded by Board::Impl::control_mu
  // The thread cp runs on: started by the queue's first enable, asleep
  // between a reset and the next enable. Guarded by Board::Impl::control_mu.
  std::unique_ptr<QueueThread> thread;
};

struct Board::Impl {
  Impl(BoardProfile p, BoardOptions options);
  ~Impl();

  std::uint32_t read(std::uint32_t offset) noexcept;
  void write(std::uint32_t offset, std::uint32_t value) noexcept;

  // Interrupts: latch `bits` in INT_STATUS and signal the vectors unmasked.
  void raise(std::uint32_t bits) noexcept;
  // Signals `bits` whose vectors are unmasked, without latching the rest:
  // for completions, where the driver re-checks its fence after unmasking.
  void raise_if_unmasked(std::uint32_t bits) noexcept;
  void signal_vectors(std::uint32_t bits) noexcept;

  std::atomic<CommandObserver*> observer{nullptr};  // Board::set_command_observer

  // ns since the board's reset on the host's clock: also the board's "now"
  // (the TIME registers, the uptime), which the host's clock estimates read.
  // With a timing model, command stamps keep the model's time instead
  // (CommandProcessor::clock()); a board modelled slower than the host
  // stamps ahead of its "now" (docs/timing.md).
  std::uint64_t host_time_ns() const noexcept {
    return base::monotonic_ns() - reset_time_ns.load(std::memory_order_relaxed);
  }
  // The board's "now": the host's time since reset, or on a virtual clock
  // the furthest point the modelled clocks reached (every queue's and
  // unit's).
  std::uint64_t board_time_ns() const noexcept { return virtual_clock ? model_frontier_ns() : host_time_ns(); }
  std::uint64_t model_frontier_ns() const noexcept;

  // The timing model (docs/timing.md): the profile's, unless
  // TPUHAL_SIM_CLOCK=host; null: the board keeps the host's time.
  const fw::TimingModel* timing = nullptr;
  bool pace = false;  // TPUHAL_SIM_PACE=1: a command completes no earlier than its modelled end
  // TPUHAL_SIM_CLOCK=virtual: the modelled clocks never move up to the
  // host's time; the board's time is the model's alone.
  bool virtual_clock = false;
  // The units queues share: a command on one starts when the unit is free.
  // The codec unit's decoders share kVideo (CodecUnit::Clock).
  enum class Unit : std::uint32_t { kNone = 0, kTensor = 1, kDma = 2, kVideo = 3 };
  std::array<std::atomic<std::uint64_t>, 4> unit_free{};  // by Unit: modelled time it is next free
  // When (modelled) each address a command processor signalled (fences,
  // kWriteValue) was last written, so that a queue waiting on it starts no
  // earlier. Bounded: cleared when it grows past kMaxSignals.
  std::mutex signal_mu;
  std::unordered_map<std::uint64_t, std::uint64_t> signals;  // guarded by signal_mu
  static constexpr std::size_t kMaxSignals = 4096;
  void signalled(std::uint64_t address, std::uint64_t model_ns);
  std::optional<std::uint64_t> signal_time(std::uint64_t address);
  // A board reset: every modelled clock back to 0.
  void reset_model() noexcept;

  void write_queue_reg(std::uint32_t q, std::uint32_t r, std::uint32_t value);
  std::uint32_t read_queue_reg(std::uint32_t q, std::uint32_t r) const noexcept;
  void enable_queue(std::uint32_t q);
  void reset_queue(std::uint32_t q);
  void reset_board();
  void run_mailbox(std::uint32_t cmd);

  // Injected faults (docs/faults.md).
  void inject(const Fault& fault);
  void clear_faults() noexcept;
  // Called by queue q's command processor before each command: the fault
  // that strikes it, if one does (kDmaError only strikes copies, fills and
  // video decodes' packet reads).
  std::optional<FaultKind> fault_for(std::uint32_t q, const fw::Command& cmd);
  // The firmware stops: every command processor halts at its next command
  // boundary, STATUS shows kStatusFatal, FATAL_CODE says why, the device
  // vector fires.
  void crash(fw::CmdStatus code) noexcept;
  // The board goes away: registers read all ones, writes are dropped (but a
  // board reset, which retrains the link), nothing runs, nothing interrupts.
  void lose() noexcept;
  void halt_queues() noexcept;
  // Drops the bits of queues whose interrupts an injected fault loses.
  std::uint32_t drop_lost_interrupts(std::uint32_t bits) noexcept;

  BoardProfile profile;
  base::Mapping dram;
  IommuDomain iommu;
  // When the board's engines wrote DRAM past the aperture (dram_writes.h):
  // the tensor engine's kept weights are compared only after such a write.
  DramWrites dram_writes;
  DmaEngine dma;
  std::vector<base::UniqueFd> vectors;
  std::vector<std::unique_ptr<QueueState>> queues;

  std::mutex control_mu;  // serialises enable/reset of queues and the board
  std::atomic<std::uint32_t> control{0};
  std::atomic<std::uint32_t> status{0};
  std::atomic<std::uint32_t> driver_version{0};
  std::atomic<std::uint32_t> fatal_code{0};
  std::atomic<std::uint32_t> scratch{0};
  std::atomic<std::uint32_t> time_hi_latch{0};
  std::atomic<std::uint64_t> reset_time_ns{0};
  std::atomic<std::uint32_t> int_status{0};
  std::atomic<std::uint32_t> int_mask{0};
  std::atomic<std::uint64_t> bad_mmio{0};

  std::mutex fault_mu;
  std::vector<Fault> pending_faults;              // guarded by fault_mu
  std::atomic<std::uint32_t> fault_queues{0};     // bit q: a fault counts on queue q
  std::atomic<std::uint32_t> irq_lost_queues{0};  // bit q: queue q loses interrupts
  std::atomic<bool> halted{false};                // crashed or lost: nothing runs
  std::atomic<bool> lost{false};

  std::mutex mbox_mu;
  std::uint32_t mbox_status = 0;
  std::uint32_t mbox_seq = 0;
  std::array<std::uint32_t, 4> mbox_args{};
  std::array<std::uint32_t, 4> mbox_results{};

  std::array<char, fw::reg::kBoardNameBytes> board_name{};

  // Notified whenever a command processor writes memory that another one may
  // be waiting on (fences, kWriteValue).
  base::EventCount memory_written;

  // The tensor engine, made on first use (oneDNN and its threads cost
  // nothing for boards that never compute). Null if the board has none.
  tensor::TensorEngine* tensor_engine();
  tensor::Isa tensor_isa = tensor::Isa::kGeneric;  // read from TPUHAL_MAX_ISA when the board is made
  std::once_flag tensor_once;
  std::unique_ptr<tensor::TensorEngine> tensor;

  // The video codec unit, made on first use; null if the board has none.
  CodecUnit* codec_unit();
  // The decoders' library (FFmpeg, loaded at run time), or null: the profile
  // has no decode channels, or FFmpeg is not installed and the board then
  // offers no decoder (a warning says why).
  const base::ffmpeg::Api* av = nullptr;
  // Decode channels offered to the driver: none without the library, or to
  // a host on the far side of a cable (the channel page is shared memory).
  std::uint32_t video_channels() const noexcept { return av && !dma.port() ? profile.decode_channels : 0; }
  std::once_flag codec_once;
  std::unique_ptr<CodecUnit> codec;
  std::atomic<CodecUnit*> codec_ptr{nullptr};  // for the doorbell register

  // Telemetry (fw/telemetry.h, docs/simulator.md): counters since the board
  // was made, which resets do not clear.
  const std::uint64_t power_on_ns;
  struct EngineBusy {
    std::mutex mu;
    std::uint32_t active = 0;  // queues of the engine running a batch
    std::uint64_t since = 0;   // when the first of them began
    std::uint64_t busy = 0;    // closed busy intervals
  };
  std::array<EngineBusy, 4> engine_busy;  // by fw::EngineType
  void engine_begin(fw::EngineType e, std::uint64_t now) noexcept;
  void engine_end(fw::EngineType e, std::uint64_t now) noexcept;
  std::uint64_t engine_busy_ns(fw::EngineType e, std::uint64_t now) noexcept;
  std::array<std::atomic<std::uint64_t>, 4> dma_bytes{};  // by fw::DmaDirection
  // A copy or fill command moved `bytes` from src to dst (fills: src 0).
  void count_dma(std::uint64_t src, std::uint64_t dst, std::uint64_t bytes, bool fill) noexcept;
  std::array<std::atomic<std::uint64_t>, fw::kTelemetryFaultKinds> failed_by_status{};  // commands, by CmdStatus
  std::atomic<std::uint64_t> firmware_crashes{0};
  std::atomic<std::uint64_t> resets{0};
  // The power and thermal model, advanced whenever the block is written
  // (under mbox_mu).
  PowerModel thermal;
  // MboxCmd::kTelemetry; mbox_mu held.
  fw::Problem write_telemetry(std::uint64_t addr, std::uint64_t capacity, std::uint64_t& written, std::uint64_t& total);
  // The block as the board writes it, with as many entries as `capacity`
  // bytes (at least the header) hold; callers hold mbox_mu.
  std::vector<std::byte> telemetry_block(std::uint64_t capacity);
  std::uint64_t telemetry_total_bytes() const noexcept;
};

// The thread a queue's command processors run on, one after another: each
// enable hands it a new CommandProcessor, each reset stops that one and
// waits until the thread has let go of it. In between it sleeps, so that an
// enable/reset cycle costs two wake-ups rather than a thread's creation and
// exit, which map, unmap and fault in memory (several times the cost of a
// short ring under AddressSanitizer). Destroying it ends the thread.
class QueueThread {
 public:
  QueueThread();
  ~QueueThread();  // nothing may be running
  QueueThread(const QueueThread&) = delete;
  QueueThread& operator=(const QueueThread&) = delete;

  // Calls cp.run() on the thread. Nothing may be running.
  void start(CommandProcessor& cp);
  // Returns once the run() last started has returned (at once if it has):
  // everything it did happens before.
  void wait_idle();

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable wake_;    // the thread: a processor to run, or exit
  std::condition_variable idle_;    // wait_idle(): the processor returned
  CommandProcessor* cp_ = nullptr;  // guarded by mu_: running or about to
  bool exit_ = false;               // guarded by mu_
  std::thread thread_;              // last: starts once the rest is built
};

// Consumes one queue's ring, from an enable to the reset that ends it, on
// the queue's thread (docs/simulator.md).
class CommandProcessor {
 public:
  struct Config {
    std::uint64_t ring_base;
    std::uint32_t ring_size;
    std::uint64_t status_page;
  };
  // Starts consuming the ring on `thread`, which must be idle.
  CommandProcessor(Board::Impl& board, std::uint32_t index, QueueState& queue, QueueThread& thread, Config config);
  ~CommandProcessor();  // stops it

  // Asks it to stop at the next command boundary (or transfer chunk) and
  // waits until it has: afterwards it touches neither memory nor registers.
  void stop();

 private:
  friend class QueueThread;
  void run();
  void run_loop();
  void idle_wait(std::uint32_t head);
  // Where descriptors come from: the ring, or a program's command list.
  // slot(i, out) reads the 64 bytes at position i; false if unreadable.
  struct Source {
    virtual ~Source() = default;
    virtual fw::Problem slot(std::uint64_t position, fw::CommandDescriptor& out) = 0;
    // `count` slots from `position` on, into out[0..count); a source whose
    // slots lie one after another in memory reads them at once.
    virtual fw::Problem slots(std::uint64_t position, std::uint64_t count, fw::CommandDescriptor* out) {
      for (std::uint64_t i = 0; i < count; ++i)
        if (auto p = slot(position + i, out[i]); p.status != fw::CmdStatus::kOk) return p;
      return {};
    }
  };
  // Executes one validated descriptor at `position` of `source` (whose
  // following slots hold an inline parameter block); kOk or the failure.
  fw::Problem execute(const fw::Command& cmd, Source& source, std::uint64_t position);
  fw::Problem tensor_op(std::span<const std::byte> block);
  fw::Problem no_video(fw::Opcode op) const;
  fw::Problem call(const fw::CallArgs& args);
  fw::Problem read_block(const fw::TensorOpArgs& args, Source& source, std::uint64_t position,
                         std::vector<std::byte>& block);
  fw::Problem wait_value(const fw::WaitValueArgs& args);
  // What an injected fault does to `cmd` at ring position `head` (kOk: none
  // struck).
  fw::Problem injected(const fw::Command& cmd, std::uint32_t head);
  bool halted() const noexcept {
    return stop_.load(std::memory_order_relaxed) || board_.halted.load(std::memory_order_relaxed);
  }
  fw::Problem complete(const fw::Command& cmd);
  // The modelled clock (docs/timing.md): the time the queue's next command
  // may start (with no model, the host's board time).
  std::uint64_t clock() const noexcept {
    return board_.timing ? q_.model_ns.load(std::memory_order_relaxed) : board_.board_time_ns();
  }
  // What the executing command costs; execute() charges it once the
  // command succeeded.
  struct Charge {
    fw::CommandTime time;
    Board::Impl::Unit unit = Board::Impl::Unit::kNone;
  };
  // Advances the queue's clock by a command's cost on its unit; with
  // pacing, returns no earlier than the host reaches its end.
  void charge(const Charge& c);
  // kWaitTime: the queue's next command starts no earlier than a.ns.
  fw::Problem wait_time(const fw::WaitTimeArgs& a);
  // Work the host submitted at host time `at` starts no earlier.
  void catch_up(std::uint64_t at) noexcept;
  // A copy of `bytes` succeeded: counted, and charged at its ends' bandwidth.
  void copied(std::uint64_t src, std::uint64_t dst, std::uint64_t bytes);
  // A 64-bit store into the queue's status page (host memory); false on a fault.
  bool store_status(std::size_t offset, std::uint64_t value);
  void fail(const fw::CommandDescriptor& d, const fw::Problem& p);

  Board::Impl& board_;
  const std::uint32_t index_;
  QueueState& q_;
  const Config config_;
  DmaContext ctx_;
  DmaEngine::Hooks hooks_;
  std::atomic<bool> stop_{false};
  std::uint64_t last_fence_ = 0;
  tensor::TensorEngine* engine_ = nullptr;  // set once this processor has used it
  Charge* charge_ = nullptr;                // the innermost command execute() runs
  QueueThread& thread_;
  std::vector<std::byte> block_;  // the tensor op being run's parameter block (ops do not nest)
};

}  // namespace tpuhal::sim
