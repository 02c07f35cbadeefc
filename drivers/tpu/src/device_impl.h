// Internals of the TPU driver.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tpuhal/base/fd.h"
#include "tpuhal/base/mapping.h"
#include "tpuhal/base/wait.h"
#include "tpuhal/fw/command.h"
#include "tpuhal/fw/timing.h"
#include "tpuhal/fw/regs.h"
#include "tpuhal/tpu/device.h"
#include "tpuhal/base/range_allocator.h"

namespace spdlog {
class logger;
}

namespace tpuhal::tpu {

// The HAL's engines and the firmware's (telemetry.cpp).
Engine to_engine(fw::EngineType e);
fw::EngineType to_fw(Engine e);

using base::RangeAllocator;

class TpuQueue;
struct Slot;
struct VideoQueue;  // video.cpp

struct Heap {
  std::string name;
  Memory memory;
  bool is_default;
  RangeAllocator allocator;
};

// Per hardware queue: what the board says it is, and its host-side state.
struct HwQueue {
  fw::EngineType engine = fw::EngineType::kNone;
  bool in_use = false;                  // guarded by TpuDevice::queues_mu_
  fw::QueueStatusPage* page = nullptr;  // in the device's status-page mapping
  std::uint64_t page_iova = 0;
  base::EventCount irq;                 // notified by the interrupt thread
  std::atomic<std::uint32_t> armed{0};  // waiters that need the interrupt
  TpuQueue* owner = nullptr;            // guarded by queues_mu_
};

class TpuDevice final : public driver::DeviceBackend, public std::enable_shared_from_this<TpuDevice> {
 public:
  TpuDevice(std::unique_ptr<Transport> transport, std::string uri, std::string driver_name);
  ~TpuDevice() override;
  void bring_up();

  const Properties& properties() const override { return props_; }
  MemoryStats memory_stats() const override;
  DeviceStatus status() const override;
  Telemetry telemetry() const override;
  std::optional<ModelledTime> model_op(const driver::OpDesc& op) const override;
  std::optional<ModelledTime> model_transfer(std::uint64_t bytes, Memory from, Memory to) const override;
  std::optional<std::uint64_t> board_time_ns() const override;
  std::optional<std::uint64_t> model_decode_ns(Codec codec, FrameType type, std::uint32_t width,
                                               std::uint32_t height) const override;
  std::shared_ptr<driver::BufferBackend> allocate(std::uint64_t size, Memory memory,
                                                  const AllocOptions& options) override;
  std::shared_ptr<driver::BufferBackend> import_host(void* ptr, std::uint64_t size) override;
  std::shared_ptr<driver::QueueBackend> create_queue(Engine engine, const QueueOptions& options) override;
  std::shared_ptr<driver::ProgramBackend> create_program(std::span<const driver::Command> commands) override;
  std::shared_ptr<driver::DecoderBackend> open_decoder(const driver::DecoderConfig& config) override;
  void release_decoder_channel(std::uint32_t number) noexcept;
  void reset() override;

  // Whether the board still works, as last seen (docs/faults.md).
  enum class Health { kOk, kFatal, kLost };
  Health health() const noexcept { return health_.load(std::memory_order_acquire); }
  // Reads STATUS: notes a fatal error, or a board whose registers read all
  // ones, and wakes every waiter. Returns the health.
  Health check_health() noexcept;
  // The error for work on a board that stopped, naming `who`.
  Error health_error(const std::string& who) const;

  // ---- used by buffers and queues ----
  Transport& transport() const noexcept { return *transport_; }
  const std::string& uri() const noexcept { return props_.uri; }
  // The minor of the interface version the board and driver agreed on.
  std::uint16_t interface_minor() const noexcept { return agreed_minor_; }
  std::uint64_t read64(std::uint32_t lo_offset) const;
  std::span<std::byte> aperture() const noexcept { return aperture_; }

  // Device memory: returns {heap index, address}.
  // `not_null`: never at device address 0, which means "none" on the wire
  // (a call's command list).
  std::pair<std::size_t, std::uint64_t> allocate_device(std::uint64_t size, Memory memory, const AllocOptions& options,
                                                        bool not_null = false);
  void free_device(std::size_t heap, std::uint64_t address) noexcept;
  // Host memory mapped for DMA: returns the IOVA. `memory` is the
  // transport's allocation behind ptr, or null for imported memory.
  std::uint64_t map_host(void* ptr, std::uint64_t size, bool imported, const base::Mapping* memory = nullptr);
  void unmap_host(std::uint64_t iova, std::uint64_t size, bool imported) noexcept;

  HwQueue& hw_queue(std::uint32_t q) noexcept { return *hw_queues_[q]; }
  std::uint32_t hw_queue_count() const noexcept { return static_cast<std::uint32_t>(hw_queues_.size()); }
  void release_queue(std::uint32_t q) noexcept;
  void arm_interrupt(std::uint32_t q);
  void disarm_interrupt(std::uint32_t q) noexcept;

  std::shared_ptr<spdlog::logger> log;

 private:
  void start_board();  // identify, negotiate the interface version, enable
  void read_properties();
  void setup_status_pages();
  void start_interrupt_thread();
  void interrupt_loop();
  std::uint32_t ring_entries_for(const QueueOptions& options) const;

  std::unique_ptr<Transport> transport_;
  Properties props_;
  std::span<std::byte> aperture_;
  std::uint32_t caps_ = 0;
  std::uint16_t agreed_minor_ = 0;
  std::uint32_t max_ring_entries_ = 0;

  mutable std::mutex reg64_mu_;

  mutable std::mutex mem_mu_;
  std::vector<Heap> heaps_;
  RangeAllocator iova_;
  std::uint64_t host_pinned_bytes_ = 0, host_pinned_count_ = 0, imported_bytes_ = 0;

  mutable std::mutex queues_mu_;
  std::vector<std::unique_ptr<HwQueue>> hw_queues_;
  base::Mapping status_pages_;
  std::uint64_t status_pages_iova_ = 0;

  // Telemetry: the mailbox, and the host buffer the board writes the block
  // into (made on first use).
  mutable std::mutex telemetry_mu_;
  mutable base::Mapping telemetry_page_;
  mutable std::uint64_t telemetry_iova_ = 0;
  // The mailbox page (telemetry_page_), made on first use; telemetry_mu_ held.
  void map_mailbox_page_locked() const;
  // Runs `cmd` with the page as its buffer: res0, or throws naming `what`.
  std::uint64_t mailbox_locked(fw::MboxCmd cmd, const char* what) const;
  // The board's timing model (MboxCmd::kTimingModel, 1.9), read on first
  // use; null where the board has none.
  const fw::TimingModel* timing_model() const;
  mutable bool timing_read_ = false;               // guarded by telemetry_mu_
  mutable std::optional<fw::TimingModel> timing_;  // written once, under telemetry_mu_

  std::mutex video_mu_;
  std::vector<bool> decoder_channels_;     // open channels; guarded by video_mu_
  std::weak_ptr<VideoQueue> video_queue_;  // shared by the decoders; guarded by video_mu_

  std::atomic<Health> health_{Health::kOk};
  std::atomic<std::uint32_t> fatal_code_{0};
  std::mutex reset_mu_;

  std::mutex irq_mu_;  // serialises INT_MASK read-modify-write
  std::uint32_t irq_mask_ = 0;
  base::UniqueFd irq_stop_;
  std::thread irq_thread_;
};

class TpuQueue final : public driver::QueueBackend {
 public:
  TpuQueue(std::shared_ptr<TpuDevice> device, std::uint32_t index, Engine engine, std::uint32_t entries,
           std::size_t ring_heap, std::uint64_t ring_address);
  ~TpuQueue() override;

  Engine engine() const override { return engine_; }
  std::uint32_t index() const override { return index_; }
  std::uint64_t submit(std::span<const driver::Command> commands, std::chrono::nanoseconds max_wait) override;
  driver::Timeline timeline() const override;
  std::uint64_t submitted() const override { return submitted_.load(std::memory_order_acquire); }
  std::uint64_t progress() const override;
  Error failure() const override;
  void block(std::uint64_t value, std::chrono::nanoseconds max) override;
  void abort() override;
  std::optional<std::uint64_t> timestamp_ns(std::uint64_t value) const override;
  QueueStatus status() const override;
  std::string diagnose() const override;

  std::uint64_t submit_raw(std::span<const fw::CommandDescriptor> descriptors);
  std::uint64_t timeline_address() const noexcept;
  std::string name() const;
  bool same_device(const TpuQueue& other) const noexcept { return other.device_ == device_; }
  // The device was reset: work not complete is discarded (kQueueReset) and
  // the queue stays failed. Caller holds the device's queues_mu_.
  void mark_reset() noexcept;

 private:
  struct Shadow {  // what the host knows about each ring slot, for errors
    std::uint64_t value;
    std::uint32_t index;  // position of the command in its submission
    std::uint32_t count;  // commands in the submission
    const char* op;       // a tensor op's kind, or null
  };
  // Reserves `n` ring slots, waiting up to max_wait for the board to free
  // them. Caller holds submit_mu_.
  void reserve(std::uint32_t n, std::chrono::nanoseconds max_wait);
  std::uint64_t publish(std::span<Slot> slots);
  std::string describe_state(bool with_shadow) const;
  bool known_failed();          // caller holds submit_mu_
  Error stopped_error() const;  // after a device reset, or on a board that stopped
  std::uint32_t reg(std::uint32_t r) const noexcept { return fw::reg::queue_reg(index_, r); }
  // Resets the queue on the board and returns once the board says it has
  // stopped (or 1 s has passed, or the board is gone).
  void stop_on_board() noexcept;

  std::shared_ptr<TpuDevice> device_;
  const std::uint32_t index_;
  const Engine engine_;
  const std::uint32_t entries_;
  const std::size_t ring_heap_;
  const std::uint64_t ring_address_;
  fw::CommandDescriptor* ring_;  // in the aperture
  fw::QueueStatusPage* page_;
  std::vector<Shadow> shadow_;

  mutable std::mutex submit_mu_;
  std::uint32_t tail_ = 0;         // guarded by submit_mu_
  std::uint32_t cached_head_ = 0;  // guarded by submit_mu_
  std::uint64_t next_value_ = 1;   // guarded by submit_mu_
  std::atomic<std::uint64_t> submitted_{0};
  std::atomic<bool> aborted_{false};
  std::atomic<bool> reset_{false};
  mutable std::atomic<bool> failed_seen_{false};
  std::uint32_t submits_since_check_ = 0;  // guarded by submit_mu_
};

// A program: its command list in host-visible device memory.
class TpuProgram final : public driver::ProgramBackend {
 public:
  TpuProgram(std::shared_ptr<TpuDevice> device, std::size_t heap, std::uint64_t address, std::uint64_t slots,
             std::size_t commands)
      : device_(std::move(device)), heap_(heap), address_(address), slots_(slots), commands_(commands) {}
  ~TpuProgram() override { device_->free_device(heap_, address_); }
  std::size_t size() const override { return commands_; }
  std::uint64_t address() const noexcept { return address_; }
  std::uint64_t slots() const noexcept { return slots_; }

 private:
  std::shared_ptr<TpuDevice> device_;
  std::size_t heap_;
  std::uint64_t address_, slots_;
  std::size_t commands_;
};

}  // namespace tpuhal::tpu
