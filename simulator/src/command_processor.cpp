#include <spdlog/spdlog.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <new>
#include <optional>

#include "board_impl.h"
#include "tpuhal/base/log.h"
#include "tpuhal/fw/version.h"

namespace tpuhal::sim {
namespace {
using namespace std::chrono_literals;
constexpr std::uint16_t kFieldFenceAddress = fw::Problem::kFieldStatusPage;
}  // namespace

// ---- QueueThread -----------------------------------------------------------

QueueThread::QueueThread() : thread_([this] { loop(); }) {}

QueueThread::~QueueThread() {
  {
    std::lock_guard lock(mu_);
    exit_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void QueueThread::start(CommandProcessor& cp) {
  {
    std::lock_guard lock(mu_);
    cp_ = &cp;
  }
  wake_.notify_one();
}

void QueueThread::wait_idle() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [this] { return cp_ == nullptr; });
}

void QueueThread::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [this] { return cp_ != nullptr || exit_; });
    if (cp_ == nullptr) return;  // exit_, nothing left to run
    CommandProcessor* cp = cp_;
    lock.unlock();
    cp->run();
    lock.lock();
    cp_ = nullptr;
    idle_.notify_all();
  }
}

// ---- CommandProcessor ------------------------------------------------------

CommandProcessor::CommandProcessor(Board::Impl& board, std::uint32_t index, QueueState& queue, QueueThread& thread,
                                   Config config)
    : board_(board), index_(index), q_(queue), config_(config), ctx_(board.iommu), thread_(thread) {
  hooks_.progress = &q_.progress;
  hooks_.stop = &stop_;
  ctx_.set_abandon(&stop_);
  thread_.start(*this);
}

CommandProcessor::~CommandProcessor() { stop(); }

void CommandProcessor::stop() {
  stop_.store(true, std::memory_order_seq_cst);
  q_.doorbell.notify();
  board_.memory_written.notify();
  // A read of host memory through a port may be waiting for an answer that
  // the caller (a USB board's message thread) would execute after this.
  if (HostPort* port = board_.dma.port()) port->wake_readers();
  thread_.wait_idle();
}

void CommandProcessor::idle_wait(std::uint32_t head) {
  // Spin for the profile's idle window (a busy queue's next doorbell usually
  // arrives within it), then sleep until the doorbell rings.
  auto ready = [&] { return q_.tail->load(std::memory_order_seq_cst) != head || halted(); };
  const auto spin = std::chrono::microseconds(board_.profile.idle_spin_us);
  if (!q_.sleeping) {
    base::spin_then_block(ready, q_.doorbell, spin, 100ms, base::monotonic_ns() + 100'000'000ull);
    return;
  }
  // A shadow doorbell: the host stores TAIL without ringing the register
  // while we poll. Poll, then say we sleep before the last look (the host
  // stores TAIL, then reads `sleeping`, both sequentially consistent: one of
  // the two sees the other) and sleep until it rings the register.
  const std::uint64_t until = base::monotonic_ns() + static_cast<std::uint64_t>(spin.count()) * 1000;
  while (base::monotonic_ns() < until) {
    if (ready()) return;
    base::cpu_relax();
  }
  // Asleep, only the register (or a halt or stop, which ring it too) wakes
  // us, or the net for a lost wake-up (BoardOptions::doorbell_net).
  q_.sleeping->store(1, std::memory_order_seq_cst);
  const auto net = std::chrono::duration_cast<std::chrono::nanoseconds>(q_.doorbell_net);
  base::spin_then_block(ready, q_.doorbell, std::chrono::microseconds(0), net,
                        base::monotonic_ns() + static_cast<std::uint64_t>(net.count()));
  q_.sleeping->store(0, std::memory_order_seq_cst);
}

void CommandProcessor::run() {
  run_loop();
  // What the tensor engine made on this thread for this processor goes with
  // it (the thread itself lives on, asleep until the next enable).
  if (engine_) engine_->release_thread();
}

void CommandProcessor::run_loop() {
  auto log = base::logger("sim");
  const std::uint32_t mask = config_.ring_size - 1;
  auto* ring = reinterpret_cast<const fw::CommandDescriptor*>(board_.dram.data() + config_.ring_base);
  std::uint32_t head = q_.head.load(std::memory_order_relaxed);
  std::uint64_t retired = q_.retired.load(std::memory_order_relaxed);

  // HEAD and the counters are published every kPublishEvery descriptors and
  // at the end of each batch: the host reads HEAD only when its ring looks
  // full, and per-descriptor stores would bounce its cache line.
  constexpr std::uint32_t kPublishEvery = 64;
  auto publish = [&] {
    q_.head.store(head, std::memory_order_release);
    q_.retired.store(retired, std::memory_order_relaxed);
  };

  // The ring as a Source: slot i of the ring, wrapping.
  struct RingSource final : Source {
    const fw::CommandDescriptor* ring;
    std::uint32_t mask;
    fw::Problem slot(std::uint64_t position, fw::CommandDescriptor& out) override {
      std::memcpy(&out, &ring[position & mask], sizeof out);
      return {};
    }
  } ring_source;
  ring_source.ring = ring;
  ring_source.mask = mask;

  while (!halted()) {
    const std::uint32_t tail = q_.tail->load(std::memory_order_acquire);
    if (tail == head) {
      idle_wait(head);
      continue;
    }
    if (tail - head > config_.ring_size) {
      // The driver published more than the ring holds: the ring is corrupt.
      fw::CommandDescriptor none{};
      none.sequence = head;
      fail(none, {fw::CmdStatus::kRingConfig, fw::Problem::kFieldSequence, tail, head});
      return;
    }
    // Work starts no earlier than the board picks it up, on the host's
    // clock: a board never runs what it has not been given. (A virtual
    // clock keeps the model's time alone.)
    if (!board_.virtual_clock) catch_up(board_.host_time_ns());
    q_.status.fetch_or(fw::kQueueStatusBusy, std::memory_order_relaxed);
    const std::uint64_t start = base::monotonic_ns();
    board_.engine_begin(q_.engine, start);
    // The batch's busy time (telemetry) ends before the host can see its
    // last completion, so that a host that saw it reads final counters.
    bool closed = false;
    auto close_batch = [&] {
      if (closed) return;
      closed = true;
      const std::uint64_t end = base::monotonic_ns();
      q_.busy_ns.fetch_add(end - start, std::memory_order_relaxed);
      board_.engine_end(q_.engine, end);
    };
    while (head != tail && !halted()) {
      fw::CommandDescriptor d;
      std::memcpy(&d, &ring[head & mask], sizeof d);
      auto decoded = fw::decode_command(d);
      fw::Problem problem;
      std::uint64_t slots = 1;
      if (!decoded) {
        problem = decoded.problem();
      } else if (d.sequence != head) {
        problem = {fw::CmdStatus::kBadSequence, fw::Problem::kFieldSequence, d.sequence, head};
      } else if (!fw::engine_accepts(q_.engine, decoded->opcode)) {
        problem = {fw::CmdStatus::kUnsupportedOnEngine, fw::Problem::kFieldOpcode, d.opcode,
                   static_cast<std::uint64_t>(q_.engine)};
      } else if ((d.flags & fw::kFlagFence) && d.fence_value <= last_fence_) {
        problem = {fw::CmdStatus::kFenceNotMonotonic, fw::Problem::kFieldFence, d.fence_value, last_fence_};
      } else if ((slots = fw::command_slots(*decoded)) > static_cast<std::uint32_t>(tail - head)) {
        // An inline parameter block that the doorbell did not publish.
        problem = {fw::CmdStatus::kBadArgument, 1, slots, tail - head};
      } else if ((problem = injected(*decoded, head)).status == fw::CmdStatus::kOk) {
        CommandObserver* observer = board_.observer.load(std::memory_order_acquire);
        const std::uint64_t began = observer ? clock() : 0;
        const std::uint64_t host_began = observer ? board_.host_time_ns() : 0;
        problem = execute(*decoded, ring_source, head);
        if (problem.status == fw::CmdStatus::kOk) {
          if (head + slots == tail) {
            // The batch's last command: its counters before its fence.
            q_.retired.store(retired + 1, std::memory_order_relaxed);
            close_batch();
          }
          problem = complete(*decoded);
        }
        if (observer) {
          CommandRecord r;
          r.queue = index_;
          r.opcode = d.opcode;
          r.fence_value = d.fence_value;
          r.start_ns = began;
          r.end_ns = clock();
          r.host_start_ns = host_began;
          r.host_end_ns = board_.host_time_ns();
          r.epoch_ns = board_.reset_time_ns.load(std::memory_order_relaxed);
          r.status = static_cast<std::uint32_t>(problem.status);
          if (const auto* c = std::get_if<fw::CopyArgs>(&decoded->args))
            r.bytes = c->size;
          else if (const auto* f = std::get_if<fw::FillArgs>(&decoded->args))
            r.bytes = f->size;
          else if (const auto* sg = std::get_if<fw::CopySgArgs>(&decoded->args))
            r.bytes = sg->total;
          observer->on_command(r);
        }
      }
      if (problem.status != fw::CmdStatus::kOk) {
        publish();
        // Stopping: whatever the command was doing was cut short (an
        // abandoned read of host memory fails as a DMA fault would).
        if (problem.status == fw::CmdStatus::kQueueReset || stop_.load(std::memory_order_relaxed)) break;
        log->debug("queue {}: {} at ring position {}", index_, fw::describe(problem, d.opcode), head);
        close_batch();
        fail(d, problem);
        return;
      }
      const std::uint32_t before = head;
      head += static_cast<std::uint32_t>(slots);
      ++retired;
      q_.progress.store(q_.progress.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      if (head / kPublishEvery != before / kPublishEvery) publish();
    }
    publish();
    // Wake command processors waiting on fences this batch wrote.
    board_.memory_written.notify();
    close_batch();
    q_.status.fetch_and(~fw::kQueueStatusBusy, std::memory_order_relaxed);
  }
}

fw::Problem CommandProcessor::execute(const fw::Command& cmd, Source& source, std::uint64_t position) {
  struct Visitor {
    CommandProcessor& cp;
    Source& source;
    std::uint64_t position;
    fw::Problem operator()(const fw::NopArgs&) const { return {}; }
    fw::Problem operator()(const fw::CopyArgs& a) const {
      auto p = cp.board_.dma.copy(cp.ctx_, a.src, a.dst, a.size, 0, 1, cp.hooks_);
      if (p.status == fw::CmdStatus::kOk) cp.copied(a.src, a.dst, a.size);
      return p;
    }
    fw::Problem operator()(const fw::CopySgArgs& a) const {
      // Segments are read in small batches; each is validated before use and
      // the sum must match the descriptor's total.
      std::uint64_t total = 0;
      fw::DmaSegment batch[64];
      for (std::uint64_t i = 0; i < a.count;) {
        const std::uint64_t n = a.count - i < 64 ? a.count - i : 64;
        auto p = cp.board_.dma.read(cp.ctx_, a.list + i * sizeof(fw::DmaSegment), batch, n * sizeof(fw::DmaSegment), 0);
        if (p.status != fw::CmdStatus::kOk) return p;
        for (std::uint64_t k = 0; k < n; ++k, ++i) {
          auto seg = fw::decode_segment(batch[k]);
          if (!seg) {
            auto bad = seg.problem();
            bad.detail = i;  // which segment
            return bad;
          }
          total += seg->size;
          if (total > a.total) return {fw::CmdStatus::kBadArgument, 2, a.total, total};
          p = cp.board_.dma.copy(cp.ctx_, seg->src, seg->dst, seg->size, 0, 1, cp.hooks_);
          if (p.status != fw::CmdStatus::kOk) return p;
          cp.copied(seg->src, seg->dst, seg->size);
        }
      }
      if (total != a.total) return {fw::CmdStatus::kBadArgument, 2, a.total, total};
      return {};
    }
    fw::Problem operator()(const fw::FillArgs& a) const {
      auto p = cp.board_.dma.fill(cp.ctx_, a.dst, a.size, a.pattern, a.pattern_bytes, 0, cp.hooks_);
      if (p.status == fw::CmdStatus::kOk) {
        cp.board_.count_dma(0, a.dst, a.size, true);
        if (cp.board_.timing) *cp.charge_ = {fw::fill_time(*cp.board_.timing, a.size), Board::Impl::Unit::kDma};
      }
      return p;
    }
    fw::Problem operator()(const fw::WaitValueArgs& a) const { return cp.wait_value(a); }
    fw::Problem operator()(const fw::WriteValueArgs& a) const {
      auto p = cp.board_.dma.store64(cp.ctx_, a.address, a.value, 0);
      if (p.status == fw::CmdStatus::kOk) {
        if (cp.board_.timing) cp.board_.signalled(a.address, cp.clock() + cp.charge_->time.ns);
        cp.board_.memory_written.notify();
      }
      return p;
    }
    fw::Problem operator()(const fw::TimestampArgs& a) const {
      // Free in the model: the stamp is the time the processor reaches it,
      // so that stamps around an op measure the op alone.
      *cp.charge_ = {};
      return cp.board_.dma.store64(cp.ctx_, a.address, cp.clock(), 0);
    }
    fw::Problem operator()(const fw::TensorOpArgs& a) const {
      auto p = cp.read_block(a, source, position, cp.block_);
      return p.status == fw::CmdStatus::kOk ? cp.tensor_op(cp.block_) : p;
    }
    fw::Problem operator()(const fw::CallArgs& a) const { return cp.call(a); }
    fw::Problem operator()(const fw::VideoOpenArgs& a) const {
      CodecUnit* unit = cp.board_.codec_unit();
      return unit ? unit->open(a, cp.index_, cp.ctx_) : cp.no_video(fw::Opcode::kVideoOpen);
    }
    fw::Problem operator()(const fw::VideoDecodeArgs& a) const {
      CodecUnit* unit = cp.board_.codec_unit();
      return unit ? unit->decode(a, cp.ctx_, cp.clock()) : cp.no_video(fw::Opcode::kVideoDecode);
    }
    fw::Problem operator()(const fw::WaitTimeArgs& a) const { return cp.wait_time(a); }
    fw::Problem operator()(const fw::VideoCloseArgs& a) const {
      CodecUnit* unit = cp.board_.codec_unit();
      return unit ? unit->close(a.channel) : cp.no_video(fw::Opcode::kVideoClose);
    }
  };
  // A command the host cannot find memory for fails, and the board goes
  // on: in the daemon, one client's oversized request must not end every
  // client's boards.
  Charge charge;
  if (board_.timing) charge.time = fw::command_time(*board_.timing);
  Charge* const outer = std::exchange(charge_, &charge);
  try {
    auto p = std::visit(Visitor{*this, source, position}, cmd.args);
    charge_ = outer;
    if (p.status == fw::CmdStatus::kOk && board_.timing) this->charge(charge);
    return p;
  } catch (const std::bad_alloc&) {
    charge_ = outer;
    if ((board_.driver_version.load() & 0xFFFF) < fw::kMinorOutOfMemory)
      return {fw::CmdStatus::kBadArgument, fw::Problem::kNoField, 0, 0};  // 1.7's nearest
    return {fw::CmdStatus::kOutOfMemory, fw::Problem::kNoField, 0, fw::kMemoryHost};
  }
}

fw::Problem CommandProcessor::no_video(fw::Opcode op) const {
  return {fw::CmdStatus::kUnsupportedOnEngine, fw::Problem::kFieldOpcode, static_cast<std::uint64_t>(op),
          static_cast<std::uint64_t>(q_.engine)};
}

fw::Problem CommandProcessor::read_block(const fw::TensorOpArgs& a, Source& source, std::uint64_t position,
                                         std::vector<std::byte>& block) {
  if (a.address != 0) {
    block.resize(a.bytes);
    return board_.dma.read(ctx_, a.address, block.data(), a.bytes, 0);
  }
  // Inline: the slots right after the descriptor.
  const std::uint64_t n = fw::inline_slots(a.bytes);
  block.resize(n * sizeof(fw::CommandDescriptor));
  auto p = source.slots(position + 1, n, reinterpret_cast<fw::CommandDescriptor*>(block.data()));
  block.resize(a.bytes);
  return p;
}

fw::Problem CommandProcessor::tensor_op(std::span<const std::byte> block) {
  tensor::TensorEngine* engine = board_.tensor_engine();
  engine_ = engine;
  if (!engine)
    return {fw::CmdStatus::kUnsupportedOnEngine, fw::Problem::kFieldOpcode,
            static_cast<std::uint64_t>(fw::Opcode::kTensorOp), static_cast<std::uint64_t>(q_.engine)};
  auto op = fw::decode_op(block);
  if (!op) return op.problem();
  if (board_.timing) {
    // Costed before it runs: a command the model cannot cost fails, naming
    // its kind, rather than taking no time.
    auto t = fw::op_time(*board_.timing, *op);
    if (!t) return t.problem();
    *charge_ = {*t, Board::Impl::Unit::kTensor};
  }
  // Resolve every tensor to host memory for the whole op: DRAM, or host
  // memory the IOMMU maps with the access the op needs. Nothing outside
  // the tensors' own bytes is ever touched.
  std::optional<DmaAccess> access(std::in_place, ctx_);
  tensor::View views[fw::kMaxOpTensors];
  // Tensors in the memory of a remote host (HostPort) are read into bounce
  // buffers first; the outputs are written back after the op. An op writes
  // its last tensor and the other outputs its kind names (top_k's values).
  std::vector<std::byte> bounce[fw::kMaxOpTensors];
  const std::uint32_t out = op->num_tensors - 1;
  const std::uint32_t written = fw::op_kind_info(op->kind).written, read = fw::read_mask(*op);
  for (std::uint32_t i = 0; i < op->num_tensors; ++i) {
    const fw::TensorRef& t = op->tensors[i];
    tensor::View& v = views[i];
    v.dtype = static_cast<fw::DType>(t.dtype);
    if (v.dtype == fw::DType::kNone) continue;
    v.rank = t.rank;
    v.esize = fw::dtype_size(v.dtype);
    std::copy(std::begin(t.shape), std::end(t.shape), v.shape);
    std::copy(std::begin(t.strides), std::end(t.strides), v.strides);
    if (op->extent[i] == 0) continue;  // empty: no memory is touched
    const std::uint32_t kind = ((written >> i) & 1 ? kIommuWrite : 0) | ((read >> i) & 1 ? kIommuRead : 0);
    const fw::Problem denied{fw::CmdStatus::kDmaFault, fw::tensor_field(i, fw::TensorAspect::kAddress), t.address,
                             kind & kIommuWrite ? fw::kAccessWrite : fw::kAccessRead};
    if (board_.dma.remote(t.address)) {
      if (!access->permits(t.address, op->extent[i], kind)) return denied;
      bounce[i].resize(op->extent[i]);
      v.data = bounce[i].data();
      continue;
    }
    v.data = board_.dma.resolve(*access, t.address, op->extent[i], kind);
    if (!v.data) return denied;
  }
  if (views[out].data == nullptr) return {};  // an empty output: nothing to compute
  if (!board_.dma.port()) return engine->run(*op, views);
  // With a remote host no view points at host memory, and no access is held
  // while waiting on the link (see DmaEngine::copy_remote). An output is
  // read too where it has gaps between its elements, so that writing its
  // bounce buffer back leaves them as they were; and where the op reads
  // it (a convolution accumulating into it).
  access.reset();
  for (std::uint32_t i = 0; i <= out; ++i) {
    const bool dense_output =
        ((written & ~read) >> i) & 1 && fw::tensor_elements(op->tensors[i]) * views[i].esize == op->extent[i];
    if (bounce[i].empty() || dense_output) continue;
    auto p = board_.dma.read(ctx_, op->tensors[i].address, bounce[i].data(), bounce[i].size(),
                             fw::tensor_field(i, fw::TensorAspect::kAddress));
    if (p.status != fw::CmdStatus::kOk) return p;
  }
  auto p = engine->run(*op, views);
  for (std::uint32_t i = 0; i <= out; ++i) {
    if (!((written >> i) & 1) || op->extent[i] == 0) continue;
    if (bounce[i].empty()) {
      // Written in DRAM after the access that stamped it ended: the write
      // log learns of it now (dram_writes.h).
      board_.dram_writes.wrote(op->tensors[i].address, op->extent[i]);
    } else if (p.status == fw::CmdStatus::kOk) {
      p = board_.dma.write(ctx_, op->tensors[i].address, bounce[i].data(), bounce[i].size(),
                           fw::tensor_field(i, fw::TensorAspect::kAddress));
    }
  }
  return p;
}

fw::Problem CommandProcessor::call(const fw::CallArgs& a) {
  // A program's command list: descriptors with sequence = position in the
  // list, no fences or interrupts of their own, no nested calls.
  struct ListSource final : Source {
    CommandProcessor& cp;
    std::uint64_t address, slots_;
    ListSource(CommandProcessor& c, std::uint64_t addr, std::uint64_t n) : cp(c), address(addr), slots_(n) {}
    fw::Problem slot(std::uint64_t position, fw::CommandDescriptor& out) override {
      return this->slots(position, 1, &out);
    }
    fw::Problem slots(std::uint64_t position, std::uint64_t count, fw::CommandDescriptor* out) override {
      if (position >= slots_ || count > slots_ - position)
        return {fw::CmdStatus::kBadArgument, 1, std::max(position, slots_), slots_};
      auto p = cp.board_.dma.read(cp.ctx_, address + position * sizeof *out, out, count * sizeof *out, 0);
      if (p.status == fw::CmdStatus::kOk || count == 1) return p;
      // Slot by slot: slots in host memory may span two IOMMU windows, and
      // a fault names the slot it is in.
      return Source::slots(position, count, out);
    }
  } list(*this, a.address, a.slots);
  for (std::uint64_t pos = 0; pos < a.slots;) {
    if (halted()) return {fw::CmdStatus::kQueueReset, fw::Problem::kNoField, pos, a.slots};
    fw::CommandDescriptor d;
    auto p = list.slot(pos, d);
    if (p.status != fw::CmdStatus::kOk) return p;
    auto decoded = fw::decode_command(d);
    if (!decoded) return decoded.problem();
    if (d.sequence != pos) return {fw::CmdStatus::kBadSequence, fw::Problem::kFieldSequence, d.sequence, pos};
    if (d.flags != 0) return {fw::CmdStatus::kInvalidFlags, fw::Problem::kFieldFlags, d.flags, 0};
    if (decoded->opcode == fw::Opcode::kCall)
      return {fw::CmdStatus::kUnsupportedOnEngine, fw::Problem::kFieldOpcode, d.opcode,
              static_cast<std::uint64_t>(q_.engine)};
    const std::uint64_t slots = fw::command_slots(*decoded);
    if (slots > a.slots - pos) return {fw::CmdStatus::kBadArgument, 1, pos + slots, a.slots};
    p = execute(*decoded, list, pos);
    if (p.status != fw::CmdStatus::kOk) return p;
    q_.progress.store(q_.progress.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    pos += slots;
  }
  return {};
}

fw::Problem CommandProcessor::wait_value(const fw::WaitValueArgs& a) {
  // Polls the word: spinning first, then sleeping until another command
  // processor writes memory or a back-off timer (for host writes) expires.
  board_.memory_written.notify();  // fences this batch wrote before waiting
  std::uint64_t backoff_ns = 2'000;
  const std::uint64_t spin_until = base::monotonic_ns() + 20'000;
  bool waiting = false;
  fw::Problem result;
  for (;;) {
    std::uint64_t v = 0;
    auto p = board_.dma.load64(ctx_, a.address, v, 0);
    if (p.status != fw::CmdStatus::kOk) {
      result = p;
      break;
    }
    if (a.mode == fw::WaitMode::kTimeline) {
      if ((v & fw::kTimelineValueMask) >= a.value) break;
      if (v & fw::kTimelineFailed) {
        result = {fw::CmdStatus::kDependencyFailed, 0, a.address, v & fw::kTimelineValueMask};
        break;
      }
    } else if (v >= a.value) {
      break;
    }
    if (halted()) {
      result = {fw::CmdStatus::kQueueReset, fw::Problem::kNoField, 0, 0};
      break;
    }
    if (!waiting) {
      waiting = true;
      q_.status.fetch_or(fw::kQueueStatusWaiting, std::memory_order_relaxed);
    }
    if (base::monotonic_ns() < spin_until) {
      base::cpu_relax();
      continue;
    }
    auto ticket = board_.memory_written.prepare();
    // Re-read after announcing ourselves, so a write in between is not missed.
    std::uint64_t again = 0;
    if (board_.dma.load64(ctx_, a.address, again, 0).status == fw::CmdStatus::kOk && again != v) {
      board_.memory_written.cancel();
      continue;
    }
    board_.memory_written.wait(ticket, std::chrono::nanoseconds(backoff_ns));
    backoff_ns = backoff_ns * 2 > 1'000'000 ? 1'000'000 : backoff_ns * 2;
  }
  if (waiting) q_.status.fetch_and(~fw::kQueueStatusWaiting, std::memory_order_relaxed);
  if (board_.timing && result.status == fw::CmdStatus::kOk) {
    // The wait ends no earlier than the modelled write it waited for; a
    // write from the host (not one of the board's) ends it at the host's
    // time, if the queue had to wait for it.
    if (const auto at = board_.signal_time(a.address))
      q_.model_ns.store(std::max(q_.model_ns.load(std::memory_order_relaxed), *at), std::memory_order_relaxed);
    else if (waiting && !board_.virtual_clock)
      catch_up(board_.host_time_ns());
  }
  return result;
}

void CommandProcessor::copied(std::uint64_t src, std::uint64_t dst, std::uint64_t bytes) {
  board_.count_dma(src, dst, bytes, false);
  if (!board_.timing) return;
  // A scatter-gather list's segments add up, each at its ends' bandwidth.
  const auto t = fw::copy_time(*board_.timing, bytes, fw::dma_direction(src, dst));
  if (charge_->unit == Board::Impl::Unit::kDma) {
    charge_->time.memory_ns += t.memory_ns;
    charge_->time.ns += t.memory_ns;
  } else {
    *charge_ = {t, Board::Impl::Unit::kDma};
  }
}

void CommandProcessor::charge(const Charge& c) {
  std::uint64_t start = q_.model_ns.load(std::memory_order_relaxed);
  if (c.unit != Board::Impl::Unit::kNone) {
    // The unit is the queues': the command starts when both are free.
    auto& unit = board_.unit_free[static_cast<std::uint32_t>(c.unit)];
    std::uint64_t free = unit.load(std::memory_order_relaxed);
    std::uint64_t begin;
    do {
      begin = std::max(start, free);
    } while (!unit.compare_exchange_weak(free, begin + c.time.ns, std::memory_order_acq_rel));
    start = begin;
  }
  const std::uint64_t end = start + c.time.ns;
  q_.model_ns.store(end, std::memory_order_relaxed);
  // Pacing: the host's clock reaches the command's modelled end first.
  while (board_.pace && !halted()) {
    const std::uint64_t host = board_.host_time_ns();
    if (host >= end) break;
    std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<std::uint64_t>(end - host, 10'000'000)));
  }
}

fw::Problem CommandProcessor::wait_time(const fw::WaitTimeArgs& a) {
  *charge_ = {};  // free: the next command starts at the time named
  if (board_.timing) {
    catch_up(a.ns);
    return {};
  }
  // The host's clock: wait for it, as long as the queue runs.
  bool waiting = false;
  for (;;) {
    const std::uint64_t now = board_.board_time_ns();
    if (now >= a.ns) break;
    if (halted()) return {fw::CmdStatus::kQueueReset, fw::Problem::kNoField, 0, 0};
    if (!waiting) {
      waiting = true;
      q_.status.fetch_or(fw::kQueueStatusWaiting, std::memory_order_relaxed);
    }
    std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<std::uint64_t>(a.ns - now, 10'000'000)));
  }
  if (waiting) q_.status.fetch_and(~fw::kQueueStatusWaiting, std::memory_order_relaxed);
  return {};
}

void CommandProcessor::catch_up(std::uint64_t at) noexcept {
  if (!board_.timing) return;
  if (q_.model_ns.load(std::memory_order_relaxed) < at) q_.model_ns.store(at, std::memory_order_relaxed);
}

fw::Problem CommandProcessor::injected(const fw::Command& cmd, std::uint32_t head) {
  const auto kind = board_.fault_for(index_, cmd);
  if (!kind) return {};
  base::logger("sim")->debug("queue {}: injected {} strikes {}", index_, to_string(*kind), fw::to_string(cmd.opcode));
  // kQueueReset below means "stopping": the loop halts without a failure record.
  const fw::Problem stopping{fw::CmdStatus::kQueueReset, fw::Problem::kNoField, 0, 0};
  switch (*kind) {
    case FaultKind::kDmaError: {
      // The transfer's first address fails on the bus.
      std::uint64_t address = 0;
      std::uint16_t field = 0;
      if (auto* c = std::get_if<fw::CopyArgs>(&cmd.args))
        address = c->src;
      else if (auto* sg = std::get_if<fw::CopySgArgs>(&cmd.args))
        address = sg->list;
      else if (auto* f = std::get_if<fw::FillArgs>(&cmd.args))
        address = f->dst;
      else if (auto* v = std::get_if<fw::VideoDecodeArgs>(&cmd.args)) {
        address = v->packet;
        field = 1;  // the packet
      }
      return {fw::CmdStatus::kDmaFault, field, address, fw::kAccessBusError};
    }
    case FaultKind::kHang:
      // Never completes and never moves PROGRESS; only a reset (or a crash)
      // ends it.
      while (!halted()) {
        auto ticket = q_.doorbell.prepare();
        if (halted()) {
          q_.doorbell.cancel();
          break;
        }
        q_.doorbell.wait(ticket, 100ms);
      }
      return stopping;
    // The firmware halts at this command's boundary: HEAD says where, and
    // must be visible before the fatal interrupt sends the driver to read it.
    case FaultKind::kFirmwareCrash:
      q_.head.store(head, std::memory_order_release);
      board_.crash(fw::CmdStatus::kFirmwareFault);
      return stopping;
    case FaultKind::kDeviceLost:
      q_.head.store(head, std::memory_order_release);
      board_.lose();
      return stopping;
    default: return {};
  }
}

bool CommandProcessor::store_status(std::size_t offset, std::uint64_t value) {
  return board_.dma.store64(ctx_, config_.status_page + offset, value, kFieldFenceAddress).status == fw::CmdStatus::kOk;
}

fw::Problem CommandProcessor::complete(const fw::Command& cmd) {
  if (!(cmd.flags & fw::kFlagFence)) return {};
  const std::uint64_t now = clock();
  if (board_.timing) board_.signalled(config_.status_page + offsetof(fw::QueueStatusPage, fence.value), now);
  if (board_.dma.port()) {
    // A remote host: the same stores, in the same order, as messages.
    const std::size_t slot =
        offsetof(fw::QueueStatusPage, stamps) + cmd.fence_value % fw::kTimestampSlots * sizeof(fw::TimestampSlot);
    if (!store_status(slot + offsetof(fw::TimestampSlot, value), 0) ||
        !store_status(slot + offsetof(fw::TimestampSlot, ns), now) ||
        !store_status(slot + offsetof(fw::TimestampSlot, value), cmd.fence_value) ||
        !store_status(offsetof(fw::QueueStatusPage, fence.timestamp_ns), now) ||
        !store_status(offsetof(fw::QueueStatusPage, fence.value), cmd.fence_value))
      return {fw::CmdStatus::kDmaFault, kFieldFenceAddress, config_.status_page, fw::kAccessWrite};
  } else {
    DmaAccess access(ctx_);
    std::byte* page = board_.dma.resolve(access, config_.status_page, sizeof(fw::QueueStatusPage), kIommuWrite);
    if (!page) return {fw::CmdStatus::kDmaFault, kFieldFenceAddress, config_.status_page, fw::kAccessWrite};
    auto* sp = reinterpret_cast<fw::QueueStatusPage*>(page);
    auto& slot = sp->stamps[cmd.fence_value % fw::kTimestampSlots];
    std::atomic_ref<std::uint64_t>(slot.value).store(0, std::memory_order_relaxed);
    std::atomic_ref<std::uint64_t>(slot.ns).store(now, std::memory_order_release);
    std::atomic_ref<std::uint64_t>(slot.value).store(cmd.fence_value, std::memory_order_release);
    std::atomic_ref<std::uint64_t>(sp->fence.timestamp_ns).store(now, std::memory_order_relaxed);
    std::atomic_ref<std::uint64_t>(sp->fence.value).store(cmd.fence_value, std::memory_order_seq_cst);
  }
  last_fence_ = cmd.fence_value;
  // A waiter already asleep is woken now; one about to sleep re-reads the
  // word after announcing itself, and the batch-end notify() covers the rest.
  if (board_.memory_written.has_waiters()) board_.memory_written.notify();
  if (cmd.flags & fw::kFlagInterrupt) board_.raise_if_unmasked(1u << index_);
  return {};
}

void CommandProcessor::fail(const fw::CommandDescriptor& d, const fw::Problem& p) {
  // Record the failure in the status page, then publish it by setting the
  // failed bit in the timeline, then interrupt. If the status page itself is
  // unreachable, the queue's ERROR register is all the driver gets.
  q_.error.store(static_cast<std::uint32_t>(p.status), std::memory_order_relaxed);
  q_.failures.fetch_add(1, std::memory_order_relaxed);
  if (static_cast<std::uint32_t>(p.status) < fw::kTelemetryFaultKinds)
    board_.failed_by_status[static_cast<std::uint32_t>(p.status)].fetch_add(1, std::memory_order_relaxed);
  bool recorded = false;
  if (board_.dma.port()) {
    fw::FenceRecord rec{};
    rec.error_fence = d.fence_value;
    rec.error_status = static_cast<std::uint32_t>(p.status);
    rec.error_opcode = d.opcode;
    rec.error_field = p.field;
    rec.error_sequence = d.sequence;
    rec.error_value = p.value;
    rec.error_detail = p.detail;
    // The error fields, then the timestamp, then the timeline value that
    // publishes them.
    const auto* bytes = reinterpret_cast<const std::byte*>(&rec);
    const std::size_t first = offsetof(fw::FenceRecord, error_fence);
    recorded = board_.dma
                       .write(ctx_, config_.status_page + offsetof(fw::QueueStatusPage, fence) + first, bytes + first,
                              offsetof(fw::FenceRecord, reserved1) - first, 0)
                       .status == fw::CmdStatus::kOk &&
               store_status(offsetof(fw::QueueStatusPage, fence.timestamp_ns), clock()) &&
               store_status(offsetof(fw::QueueStatusPage, fence.value), last_fence_ | fw::kTimelineFailed);
  } else {
    DmaAccess access(ctx_);
    std::byte* page = board_.dma.resolve(access, config_.status_page, sizeof(fw::QueueStatusPage), kIommuWrite);
    if (page) {
      auto* rec = &reinterpret_cast<fw::QueueStatusPage*>(page)->fence;
      rec->error_fence = d.fence_value;
      rec->error_status = static_cast<std::uint32_t>(p.status);
      rec->error_opcode = d.opcode;
      rec->error_field = p.field;
      rec->error_sequence = d.sequence;
      rec->error_value = p.value;
      rec->error_detail = p.detail;
      std::atomic_ref<std::uint64_t>(rec->timestamp_ns).store(clock(), std::memory_order_relaxed);
      std::atomic_ref<std::uint64_t>(rec->value).store(last_fence_ | fw::kTimelineFailed, std::memory_order_seq_cst);
      recorded = true;
    }
  }
  q_.status.fetch_or(fw::kQueueStatusFaulted, std::memory_order_seq_cst);
  q_.status.fetch_and(~fw::kQueueStatusBusy, std::memory_order_relaxed);
  if (recorded) board_.memory_written.notify();
  board_.raise(1u << index_);
}

}  // namespace tpuhal::sim
