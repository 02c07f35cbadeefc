// TPU driver queues: the ring protocol from the host side.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cinttypes>
#include <cstring>

#include "device_impl.h"
#include "encode.h"
#include "tpuhal/base/hex.h"
#include "tpuhal/base/units.h"
#include "tpuhal/fw/decode.h"

namespace tpuhal::tpu {
namespace {

using namespace std::chrono_literals;

std::uint64_t load_acquire(const std::uint64_t& word) {
  return std::atomic_ref<const std::uint64_t>(word).load(std::memory_order_acquire);
}

}  // namespace

TpuQueue::TpuQueue(std::shared_ptr<TpuDevice> device, std::uint32_t index, Engine engine, std::uint32_t entries,
                   std::size_t ring_heap, std::uint64_t ring_address)
    : device_(std::move(device)),
      index_(index),
      engine_(engine),
      entries_(entries),
      ring_heap_(ring_heap),
      ring_address_(ring_address),
      ring_(reinterpret_cast<fw::CommandDescriptor*>(device_->aperture().data() + ring_address)),
      page_(device_->hw_queue(index).page),
      shadow_(entries) {
  Transport& t = device_->transport();
  // A clean slate: stop whatever ran on this queue before, clear the status
  // page, program the ring and enable it.
  stop_on_board();
  std::memset(static_cast<void*>(page_), 0, sizeof *page_);
  std::memset(static_cast<void*>(ring_), 0, std::size_t{entries} * sizeof(fw::CommandDescriptor));
  t.flush_aperture(ring_address, std::uint64_t{entries} * sizeof(fw::CommandDescriptor));
  const std::uint64_t page_iova = device_->hw_queue(index).page_iova;
  t.write32(reg(fw::reg::queue::kRingBaseLo), static_cast<std::uint32_t>(ring_address));
  t.write32(reg(fw::reg::queue::kRingBaseHi), static_cast<std::uint32_t>(ring_address >> 32));
  t.write32(reg(fw::reg::queue::kRingSize), entries);
  t.write32(reg(fw::reg::queue::kFenceLo), static_cast<std::uint32_t>(page_iova));
  t.write32(reg(fw::reg::queue::kFenceHi), static_cast<std::uint32_t>(page_iova >> 32));
  t.write32(reg(fw::reg::queue::kControl), fw::kQueueControlEnable);
  const std::uint32_t status = t.read32(reg(fw::reg::queue::kStatus));
  if (!(status & fw::kQueueStatusEnabled)) {
    // The hardware queue goes back in create_queue, which claimed it: freed
    // here as well, it could be claimed twice over.
    const auto error = static_cast<fw::CmdStatus>(t.read32(reg(fw::reg::queue::kError)));
    throw Error(Status::DeviceFault, name() + ": the board refused to enable the queue (" + fw::to_string(error) +
                                         ", status " + hex(status) + ")");
  }
}

TpuQueue::~TpuQueue() {
  // Reset stops the board's command processor before it returns, so the ring
  // and everything the HAL retained can go. Releasing the hardware queue
  // before anything else goes keeps Device::status() from seeing this queue
  // half destroyed.
  stop_on_board();
  device_->release_queue(index_);
  device_->free_device(ring_heap_, ring_address_);
}

void TpuQueue::stop_on_board() noexcept {
  // A register write may be posted (PCIe; the simulator daemon's ring), so
  // the write alone does not say the board has stopped: the status read
  // after it does, and the caller frees what the queue's commands used.
  Transport& t = device_->transport();
  t.write32(reg(fw::reg::queue::kControl), fw::kQueueControlReset);
  const std::uint64_t deadline = base::monotonic_ns() + 1'000'000'000ull;
  for (;;) {
    const std::uint32_t status = t.read32(reg(fw::reg::queue::kStatus));
    if (status == 0xFFFFFFFF || !(status & (fw::kQueueStatusEnabled | fw::kQueueStatusBusy))) return;  // or gone
    if (base::monotonic_ns() > deadline) {
      device_->log->error("{}: the board did not stop the queue within 1 s of its reset (status {})", name(),
                          hex(status));
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::string TpuQueue::name() const {
  return device_->uri() + " " + to_string(engine_) + " queue " + std::to_string(index_);
}

driver::Timeline TpuQueue::timeline() const {
  const std::uint64_t v = load_acquire(page_->fence.value);
  const bool failed = (v & fw::kTimelineFailed) != 0 || aborted_.load(std::memory_order_relaxed) ||
                      reset_.load(std::memory_order_relaxed) || device_->health() != TpuDevice::Health::kOk;
  if (failed && !failed_seen_.load(std::memory_order_relaxed)) failed_seen_.store(true, std::memory_order_relaxed);
  return {v & fw::kTimelineValueMask, failed};
}

bool TpuQueue::known_failed() {
  // The status page line is the board's and changes with every completion;
  // reading it on every submission would cost a cache miss each. A failure
  // is noticed by any wait or poll, by a full ring, or here every 64th time.
  if (failed_seen_.load(std::memory_order_relaxed)) return true;
  if (++submits_since_check_ % 64 == 0) return timeline().failed;
  return false;
}

std::uint64_t TpuQueue::progress() const {
  const std::uint32_t p = device_->transport().read32(reg(fw::reg::queue::kProgress));
  if (p == 0xFFFFFFFF) device_->check_health();  // a board that went away reads all ones
  return p;
}

void TpuQueue::mark_reset() noexcept {
  reset_.store(true, std::memory_order_seq_cst);
  device_->hw_queue(index_).irq.notify();
}

Error TpuQueue::stopped_error() const {
  const std::uint64_t done = load_acquire(page_->fence.value) & fw::kTimelineValueMask;
  const std::uint64_t last = submitted();
  std::string work = last > done
                         ? "submission " + std::to_string(done + 1) +
                               (last > done + 1 ? " to " + std::to_string(last) : std::string{}) + " did not complete"
                         : "no submission was pending";
  if (reset_.load(std::memory_order_relaxed))
    return Error(Status::DeviceFault, name() + ": " + fw::to_string(fw::CmdStatus::kQueueReset) +
                                          ": the device was reset (Device::reset); " + work +
                                          (last > done ? " and was discarded" : "") +
                                          "; release this queue and claim a new one");
  if (device_->health() == TpuDevice::Health::kFatal && last > done) {
    // The board halted its queues at a command boundary and published HEAD:
    // the shadow ring says which command of which submission was next.
    Transport& t = device_->transport();
    const std::uint32_t head = t.read32(reg(fw::reg::queue::kHead));
    const std::uint32_t tail = t.read32(reg(fw::reg::queue::kTail));
    const Shadow& sh = shadow_[head & (entries_ - 1)];
    if (head != tail && sh.count && sh.value > done)
      work = "submission " + std::to_string(sh.value) + " stopped before command " + std::to_string(sh.index + 1) +
             " of " + std::to_string(sh.count) + " (ring position " + std::to_string(head) + ")";
  }
  const Error e = device_->health_error(name());
  return Error(e.status(), std::string(e.what()) + " [" + work + "]");
}

std::uint64_t TpuQueue::timeline_address() const noexcept {
  return device_->hw_queue(index_).page_iova + offsetof(fw::QueueStatusPage, fence.value);
}

Error TpuQueue::failure() const {
  if (!(load_acquire(page_->fence.value) & fw::kTimelineFailed) &&
      (reset_.load(std::memory_order_relaxed) || device_->health() != TpuDevice::Health::kOk))
    return stopped_error();
  if (aborted_.load(std::memory_order_relaxed) && !(load_acquire(page_->fence.value) & fw::kTimelineFailed))
    return Error(Status::FailedPrecondition, name() +
                                                 ": the queue was aborted with work pending (it was released while its "
                                                 "work did not finish within the wait timeout)");
  const fw::FenceRecord& rec = page_->fence;  // written before the failed bit was published
  auto failure = fw::decode_failure(rec);
  if (!failure)
    return Error(Status::DeviceLost, name() + ": the board reported a failure with an invalid record (status " +
                                         hex(failure.problem().value) + "); reset the device");
  const fw::Failure& f = *failure;
  std::string where = "command", op;
  // The shadow ring says which of the submission's commands it was, and
  // which op a tensor op was; the slot is intact because the board halted
  // there.
  const Shadow& sh = shadow_[f.sequence & (entries_ - 1)];
  if (sh.value == f.fence && sh.count > 0) {
    where = "command " + std::to_string(sh.index + 1) + " of " + std::to_string(sh.count);
    if (sh.op) op = std::string(sh.op) + ", ";
  }
  const Status status = f.status == fw::CmdStatus::kFirmwareFault ? Status::DeviceLost
                        : f.status == fw::CmdStatus::kOutOfMemory ? Status::ResourceExhausted
                                                                  : Status::DeviceFault;
  std::string waited;
  if (f.status == fw::CmdStatus::kDependencyFailed) {
    // The board names the timeline by address; say whose it is.
    for (std::uint32_t q = 0; q < device_->hw_queue_count(); ++q)
      if (device_->hw_queue(q).page_iova + offsetof(fw::QueueStatusPage, fence.value) == f.value)
        waited = " (the timeline of " + device_->uri() + " " + fw::to_string(device_->hw_queue(q).engine) + " queue " +
                 std::to_string(q) + ", a fence this queue was told to wait for)";
  }
  return Error(status, name() + ": submission " + std::to_string(f.fence) + " failed at " + where + " (" + op +
                           "ring position " + std::to_string(f.sequence) + "): " + fw::to_string(f.status) + ": " +
                           fw::describe(f) + waited);
}

void TpuQueue::block(std::uint64_t value, std::chrono::nanoseconds max) {
  HwQueue& hq = device_->hw_queue(index_);
  device_->arm_interrupt(index_);
  auto ticket = hq.irq.prepare();
  const auto t = timeline();
  if (t.completed >= value || t.failed) {
    hq.irq.cancel();
  } else {
    hq.irq.wait(ticket, max);
  }
  device_->disarm_interrupt(index_);
  // Interrupts may be lost and a board that went away sends none: each
  // bounded sleep ends with a look at the board's STATUS.
  if (timeline().completed < value) device_->check_health();
}

void TpuQueue::reserve(std::uint32_t n, std::chrono::nanoseconds max_wait) {
  if (entries_ - (tail_ - cached_head_) >= n) return;
  Transport& t = device_->transport();
  cached_head_ = t.read32(reg(fw::reg::queue::kHead));
  if (entries_ - (tail_ - cached_head_) >= n) return;
  // Full: wait for the board to retire commands, as long as it keeps moving.
  const auto limit = static_cast<std::uint64_t>(max_wait.count());
  std::uint64_t moved_at = base::monotonic_ns();
  std::uint32_t last_head = cached_head_;
  for (unsigned spins = 0;; ++spins) {
    if (timeline().failed) throw failure();
    cached_head_ = t.read32(reg(fw::reg::queue::kHead));
    if (entries_ - (tail_ - cached_head_) >= n) return;
    const std::uint64_t now = base::monotonic_ns();
    if (cached_head_ != last_head) {
      last_head = cached_head_;
      moved_at = now;
    }
    if (now - moved_at >= limit) {
      std::string why = describe_state(/*with_shadow=*/true);
      throw Error(Status::QueueFull, name() + ": ring full (" + std::to_string(entries_) + " entries, " +
                                         std::to_string(tail_ - cached_head_) + " in flight, " + std::to_string(n) +
                                         " needed) and no command retired for " + std::to_string(limit / 1'000'000) +
                                         " ms" + (why.empty() ? "" : "; " + why));
    }
    if (spins < 1000) {
      base::cpu_relax();
    } else {
      const std::uint64_t left = limit - (now - moved_at);
      block(timeline().completed + 1, std::chrono::nanoseconds(std::min<std::uint64_t>(left, 10'000'000)));
    }
  }
}

std::uint64_t TpuQueue::publish(std::span<Slot> slots) {
  // Caller holds submit_mu_ and reserved the slots. Descriptors and their
  // parameter blocks go into the ring first; the doorbell (TAIL) goes last
  // and publishes them.
  const std::uint64_t value = next_value_++;
  const std::uint32_t mask = entries_ - 1;
  const auto count = static_cast<std::uint32_t>(slots.size());
  std::uint32_t last_descriptor = 0;
  std::uint32_t commands = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    if (slots[i].descriptor) {
      last_descriptor = i;
      commands = slots[i].command + 1;
    }
  }
  for (std::uint32_t i = 0; i < count; ++i) {
    fw::CommandDescriptor& d = slots[i].d;
    if (slots[i].descriptor) {
      d.sequence = tail_ + i;
      d.fence_value = value;
      if (i == last_descriptor) d.flags |= fw::kFlagFence | fw::kFlagInterrupt;
    }
    std::memcpy(static_cast<void*>(&ring_[(tail_ + i) & mask]), &d, sizeof d);
    shadow_[(tail_ + i) & mask] = {value, slots[i].command, commands, slots[i].op};
  }
  Transport& t = device_->transport();
  if (!t.aperture_coherent()) {  // the slots written, in at most two pieces (the ring wraps)
    const std::uint32_t first = tail_ & mask, run = std::min(count, entries_ - first);
    t.flush_aperture(ring_address_ + std::uint64_t{first} * sizeof(fw::CommandDescriptor),
                     std::uint64_t{run} * sizeof(fw::CommandDescriptor));
    if (run < count) t.flush_aperture(ring_address_, std::uint64_t{count - run} * sizeof(fw::CommandDescriptor));
  }
  tail_ += count;
  t.write32(reg(fw::reg::queue::kTail), tail_);
  submitted_.store(value, std::memory_order_release);
  return value;
}

std::uint64_t TpuQueue::submit(std::span<const driver::Command> commands, std::chrono::nanoseconds max_wait) {
  // Encode outside the lock: it only reads the commands. The buffer is kept
  // per thread so that submissions do not allocate.
  thread_local std::vector<Slot> slots;
  slots.clear();
  if (commands.empty()) {
    Slot nop{};
    nop.d.opcode = static_cast<std::uint16_t>(fw::Opcode::kNop);
    nop.descriptor = true;
    slots.push_back(nop);
  } else {
    // Commands are numbered as the caller gave them: a timestamp tracing
    // added counts as part of the command before it.
    std::uint32_t caller = 0;
    for (const auto& c : commands) {
      const auto* stamp = std::get_if<driver::cmd::Timestamp>(&c);
      const bool traced = stamp && stamp->traced;
      encode(c, traced && caller ? caller - 1 : caller, device_->uri(), this, true, device_->interface_minor(), slots);
      if (!traced) ++caller;
    }
  }
  const std::size_t n = slots.size();
  if (n >= entries_)
    throw Error(Status::InvalidArgument,
                name() + ": a batch of " + std::to_string(commands.size()) + " commands (" + std::to_string(n) +
                    " ring slots with their parameters) does not fit the ring (" + std::to_string(entries_) +
                    " entries); split it, record a program, or create the queue with more ring_entries");
  std::lock_guard lock(submit_mu_);
  if (known_failed()) throw failure();
  reserve(static_cast<std::uint32_t>(n), max_wait);
  return publish(slots);
}

std::uint64_t TpuQueue::submit_raw(std::span<const fw::CommandDescriptor> descriptors) {
  if (descriptors.empty() || descriptors.size() >= entries_)
    throw Error(Status::InvalidArgument,
                name() + ": submit_raw takes 1 to " + std::to_string(entries_ - 1) + " descriptors");
  std::vector<Slot> copy;
  for (std::size_t i = 0; i < descriptors.size(); ++i)
    copy.push_back({descriptors[i], true, static_cast<std::uint32_t>(i)});
  std::lock_guard lock(submit_mu_);
  if (timeline().failed) throw failure();
  reserve(static_cast<std::uint32_t>(copy.size()), 1s);
  return publish(copy);
}

void TpuQueue::abort() {
  aborted_.store(true, std::memory_order_seq_cst);
  stop_on_board();
  device_->hw_queue(index_).irq.notify();
}

std::optional<std::uint64_t> TpuQueue::timestamp_ns(std::uint64_t value) const {
  const fw::TimestampSlot& slot = page_->stamps[value % fw::kTimestampSlots];
  const std::uint64_t v1 = load_acquire(slot.value);
  if (v1 != value) return std::nullopt;
  const std::uint64_t ns = load_acquire(slot.ns);  // acquire: the re-read stays after it
  const std::uint64_t v2 = load_acquire(slot.value);
  if (v2 != value) return std::nullopt;
  return ns;
}

QueueStatus TpuQueue::status() const {
  QueueStatus s;
  s.engine = engine_;
  s.index = index_;
  s.in_use = true;
  const auto t = timeline();
  s.failed = t.failed;
  s.completed = t.completed;
  s.submitted = submitted();
  s.busy = !t.failed && s.submitted > s.completed;
  s.busy_ns = device_->read64(reg(fw::reg::queue::kBusyNsLo));
  s.retired = device_->read64(reg(fw::reg::queue::kRetiredLo));
  return s;
}

std::string TpuQueue::diagnose() const {
  // The shadow ring is the submitters'; look only if none holds it.
  std::unique_lock lock(submit_mu_, std::try_to_lock);
  return describe_state(lock.owns_lock());
}

std::string TpuQueue::describe_state(bool with_shadow) const {
  Transport& t = device_->transport();
  const std::uint32_t status = t.read32(reg(fw::reg::queue::kStatus));
  const std::uint32_t head = t.read32(reg(fw::reg::queue::kHead));
  const std::uint32_t tail = t.read32(reg(fw::reg::queue::kTail));
  std::string s = "the board reports the queue ";
  if (status & fw::kQueueStatusFaulted)
    s += "faulted";
  else if (status & fw::kQueueStatusWaiting)
    s += "waiting in a wait command";
  else if (status & fw::kQueueStatusBusy)
    s += "busy";
  else if (!(status & fw::kQueueStatusEnabled))
    s += "disabled";
  else if (head != tail)
    s += "about to start work";
  else
    s += "idle";
  s += " at ring position " + std::to_string(head) + " (tail " + std::to_string(tail) + ")";
  const Shadow& sh = shadow_[head & (entries_ - 1)];
  if (with_shadow && head != tail && sh.count)
    s += ", command " + std::to_string(sh.index + 1) + " of submission " + std::to_string(sh.value);
  return s;
}

// ---- Raw access ------------------------------------------------------------------

namespace {
TpuQueue& as_tpu(driver::QueueBackend& q) {
  auto* t = dynamic_cast<TpuQueue*>(&q);
  if (!t) throw Error(Status::InvalidArgument, "not a TPU driver queue");
  return *t;
}
}  // namespace

std::uint64_t submit_raw(driver::QueueBackend& queue, std::span<const fw::CommandDescriptor> d) {
  return as_tpu(queue).submit_raw(d);
}

std::uint64_t timeline_address(driver::QueueBackend& queue) { return as_tpu(queue).timeline_address(); }

}  // namespace tpuhal::tpu
