// Queues, batches and fences: argument checking, buffer lifetimes across
// queued work, and the wait policy. The backend only moves the bytes.
#include <spdlog/spdlog.h>

#include <algorithm>

#include <optional>

#include "impl.hpp"
#include "tpuhal/base/log.h"
#include "tpuhal/base/units.h"
#include "tpuhal/base/wait.h"
#include "tpuhal/driver/op_desc.hpp"

namespace tpuhal {
namespace detail {

QueueImpl::QueueImpl(std::shared_ptr<DeviceImpl> device, std::shared_ptr<driver::QueueBackend> backend)
    : device_(std::move(device)), backend_(std::move(backend)) {}

QueueImpl::~QueueImpl() {
  const std::uint64_t last = last_submitted();
  if (last != 0) {
    try {
      wait(last, device_->wait_policy());
    } catch (const Error& e) {
      if (e.status() == Status::Timeout) {
        base::logger("hal")->warn("{}: released with work still pending ({}); aborting it", name(), e.what());
        backend_->abort();
      } else {
        // A failed queue has stopped; nothing is pending on the board. Its
        // last fence was dropped unwaited, so nobody else will hear of it.
        base::logger("hal")->warn("{}: released after its work failed: {}", name(), e.what());
      }
    }
  }
  if (validate::on()) validate::forget_queue(backend_.get());
  tracing::queue_closing(*this);
  // The board no longer touches anything retained: release it all.
  std::lock_guard lock(retained_mu_);
  retained_.clear();
}

std::string QueueImpl::name() const {
  return device_->uri() + " " + to_string(backend_->engine()) + " queue " + std::to_string(backend_->index());
}

std::uint64_t QueueImpl::submit(std::span<const driver::Command> commands,
                                std::vector<std::shared_ptr<const void>>&& retained,
                                std::chrono::nanoseconds max_wait) {
  std::uint64_t value;
  if (tracing::on()) {
    tracing::SubmitScope traced(*this, commands);
    traced.retain(retained);
    try {
      value = backend_->submit(traced.commands(), max_wait);
    } catch (const Error& e) {
      // The board timestamps made the batch too long for the ring: submit
      // it as the caller gave it.
      if (e.status() != Status::InvalidArgument || !traced.drop_stamps()) throw;
      value = backend_->submit(commands, max_wait);
    }
    traced.submitted(value);
  } else {
    value = backend_->submit(commands, max_wait);
  }
  if (!retained.empty()) {
    std::lock_guard lock(retained_mu_);
    // Submissions from several threads may register out of order; keep the
    // list sorted so reclaim() can stop at the first unfinished one.
    auto pos = retained_.end();
    while (pos != retained_.begin() && std::prev(pos)->first > value) --pos;
    retained_.emplace(pos, value, std::move(retained));
    has_retained_.store(true, std::memory_order_release);
  }
  if (has_retained_.load(std::memory_order_acquire)) reclaim(backend_->timeline().completed);
  return value;
}

void QueueImpl::reclaim(std::uint64_t completed) {
  if (!has_retained_.load(std::memory_order_acquire)) return;
  std::vector<std::vector<std::shared_ptr<const void>>> done;
  {
    std::lock_guard lock(retained_mu_);
    while (!retained_.empty() && retained_.front().first <= completed) {
      done.push_back(std::move(retained_.front().second));
      retained_.pop_front();
    }
    has_retained_.store(!retained_.empty(), std::memory_order_release);
  }
  // `done` is destroyed here, outside the lock: freeing device memory may
  // take the driver's locks.
}

bool QueueImpl::reached(std::uint64_t value) {
  if (validate::on()) {
    // A value someone saw before this read began must not be undone by it.
    const std::uint64_t before = max_completed_.load(std::memory_order_acquire);
    const auto t = backend_->timeline();
    if (t.completed < before) {
      if (!backwards_reported_.exchange(true))
        validate::report(validation::Check::ValueBackwards,
                         name() + ": the board's completed value went back from " + std::to_string(before) + " to " +
                             std::to_string(t.completed) + " (a driver or firmware fault)");
    } else {
      std::uint64_t seen = before;
      while (seen < t.completed &&
             !max_completed_.compare_exchange_weak(seen, t.completed, std::memory_order_acq_rel)) {
      }
    }
  }
  const auto t = backend_->timeline();
  if (tracing::on() && t.completed > trace_seen_.load(std::memory_order_relaxed)) {
    trace_seen_.store(t.completed, std::memory_order_relaxed);
    tracing::observed(*this, t.completed);
  }
  if (t.completed >= value) {
    reclaim(t.completed);
    return true;
  }
  if (t.failed) throw backend_->failure();
  return false;
}

void QueueImpl::throw_timeout(std::uint64_t value, std::chrono::nanoseconds timeout) const {
  const auto t = backend_->timeline();
  std::string msg = name() + ": timeline value " + std::to_string(value) + " not reached: no progress for " +
                    std::to_string(timeout.count() / 1'000'000) + " ms (reached " + std::to_string(t.completed) +
                    ", submitted " + std::to_string(last_submitted()) + ")";
  if (auto why = backend_->diagnose(); !why.empty()) msg += "; " + why;
  throw Error(Status::Timeout, msg);
}

void QueueImpl::wait(std::uint64_t value, const WaitPolicy& policy) {
  if (reached(value)) return;
  std::optional<tracing::Slice> traced;
  if (tracing::on())
    if (auto q = tracing::queue_trace(*this))
      traced.emplace("wait", std::initializer_list<tracing::Arg>{tracing::Arg("queue", tracing::queue_trace_name(*q)),
                                                                 tracing::Arg("value", value)});
  if (value > last_submitted())
    throw Error(Status::InvalidArgument, name() + ": timeline value " + std::to_string(value) +
                                             " was never submitted (last " + std::to_string(last_submitted()) + ")");
  const auto timeout_ns = static_cast<std::uint64_t>(policy.timeout.count());
  // progress() may cost a register read across a bus or a process (it need
  // not be cheap, unlike timeline()), so it is first read when the wait
  // looks at stalls, not on every wait: a wait that ends while spinning
  // never reads it. The stall clock starts at that first read.
  std::optional<std::uint64_t> seen_progress;
  std::uint64_t seen_completed = backend_->timeline().completed;
  std::uint64_t progress_at = base::monotonic_ns();
  // Returns the time since the queue last moved, noting any movement.
  auto stalled_for = [&](std::uint64_t now) {
    const auto p = backend_->progress();
    const auto c = backend_->timeline().completed;
    if (!seen_progress || p != *seen_progress || c != seen_completed) {
      seen_progress = p;
      seen_completed = c;
      progress_at = now;
    }
    return now - progress_at;
  };

  if (policy.mode != WaitPolicy::Mode::Block) {
    const bool forever = policy.mode == WaitPolicy::Mode::Spin;
    const std::uint64_t spin_end = progress_at + static_cast<std::uint64_t>(policy.spin.count());
    for (unsigned i = 1;; ++i) {
      if (reached(value)) return;
      base::cpu_relax();
      if ((i & 255) == 0) {
        const std::uint64_t now = base::monotonic_ns();
        if (!forever && now >= spin_end) break;
        if (forever && stalled_for(now) >= timeout_ns) throw_timeout(value, policy.timeout);
      }
    }
  }
  constexpr std::uint64_t kSlice = 100'000'000;  // re-check at least every 100 ms
  for (;;) {
    if (reached(value)) return;
    const std::uint64_t stalled = stalled_for(base::monotonic_ns());
    if (stalled >= timeout_ns) throw_timeout(value, policy.timeout);
    const std::uint64_t left = timeout_ns - stalled;
    backend_->block(value, std::chrono::nanoseconds(std::min(left, kSlice)));
  }
}

}  // namespace detail

// ---- Fence -------------------------------------------------------------------

Queue Fence::queue() const { return Queue(queue_); }

bool Fence::is_complete() const { return !queue_ || queue_->reached(value_); }

void Fence::wait() const {
  if (queue_) queue_->wait(value_, queue_->device()->wait_policy());
}

void Fence::wait(std::chrono::nanoseconds timeout) const {
  if (!queue_) return;
  if (timeout.count() <= 0)
    throw Error(Status::InvalidArgument,
                "Fence::wait: timeout must be positive, got " + std::to_string(timeout.count()) + " ns");
  WaitPolicy policy = queue_->device()->wait_policy();
  policy.timeout = timeout;
  queue_->wait(value_, policy);
}

void Fence::wait(const WaitPolicy& policy) const {
  if (!queue_) return;
  if (policy.timeout.count() <= 0 || policy.spin.count() < 0)
    throw Error(Status::InvalidArgument, "Fence::wait: the policy needs timeout > 0 and spin >= 0");
  queue_->wait(value_, policy);
}

std::optional<std::uint64_t> Fence::timestamp_ns() const {
  if (!queue_ || !is_complete()) return std::nullopt;
  return queue_->backend().timestamp_ns(value_);
}

// ---- Batch -------------------------------------------------------------------

namespace {

detail::BatchState& live(const std::unique_ptr<detail::BatchState>& s) {
  if (!s) throw Error(Status::FailedPrecondition, "this Batch was moved from");
  return *s;
}

// Checks that `buf` is live, on the batch's device, and that [offset, offset
// + size) lies inside it. Returns the backend to record and retain.
std::shared_ptr<driver::BufferBackend> use(detail::BatchState& s, const std::shared_ptr<detail::BufferImpl>& impl,
                                           const char* op, const char* role, std::uint64_t offset, std::uint64_t size) {
  if (!impl) throw Error(Status::InvalidArgument, std::string(op) + ": the " + role + " is an empty Buffer handle");
  auto backend = impl->acquire(op);
  if (impl->device() != s.device)
    throw Error(Status::InvalidArgument, std::string(op) + ": the " + role + " belongs to " + impl->device()->uri() +
                                             " but the queue is on " + s.device->uri());
  const std::uint64_t cap = impl->size();
  if (offset > cap || size > cap - offset)
    throw Error(Status::OutOfRange, std::string(op) + " of " + std::to_string(size) + " bytes at offset " +
                                        std::to_string(offset) + " exceeds the " + role + " buffer (" +
                                        std::to_string(cap) + " bytes)");
  return backend;
}

// Validation: marks the batch busy for one call (a Batch is one thread's).
detail::validate::Guard guard_of(const std::unique_ptr<detail::BatchState>& s, detail::validate::BatchCall call) {
  return detail::validate::Guard(s ? &s->claim : nullptr, call);
}

}  // namespace

// Buffer's impl is private; Batch is a friend of Buffer, so fetch it here.
#define TPUHAL_IMPL_OF(buffer) (buffer).impl_

Batch::Batch(std::shared_ptr<detail::QueueImpl> queue) : state_(std::make_unique<detail::BatchState>()) {
  state_->device = queue->device();
  state_->queue = std::move(queue);
}

Batch::Batch(std::shared_ptr<detail::DeviceImpl> recording_for) : state_(std::make_unique<detail::BatchState>()) {
  state_->device = std::move(recording_for);
}
Batch::~Batch() = default;
Batch::Batch(Batch&&) noexcept = default;
Batch& Batch::operator=(Batch&&) noexcept = default;

std::size_t Batch::size() const noexcept { return state_ ? state_->commands.size() : 0; }
Queue Batch::queue() const {
  auto& s = live(state_);
  if (!s.queue) throw Error(Status::FailedPrecondition, "this batch records a program; it has no queue");
  return Queue(s.queue);
}

Batch& Batch::copy(const Buffer& src, const Buffer& dst) {
  const auto guard = guard_of(state_, detail::validate::BatchCall::Copy);
  live(state_);
  if (!TPUHAL_IMPL_OF(src) || !TPUHAL_IMPL_OF(dst)) throw Error(Status::InvalidArgument, "copy: empty Buffer handle");
  if (src.size() != dst.size())
    throw Error(Status::InvalidArgument, "copy: the source is " + std::to_string(src.size()) +
                                             " bytes but the destination is " + std::to_string(dst.size()) +
                                             "; give offsets and a size to copy part of one");
  return copy(src, 0, dst, 0, src.size());
}

Batch& Batch::copy(const Buffer& src, std::uint64_t src_offset, const Buffer& dst, std::uint64_t dst_offset,
                   std::uint64_t size) {
  const auto guard = guard_of(state_, detail::validate::BatchCall::Copy);
  auto& s = live(state_);
  auto sb = use(s, TPUHAL_IMPL_OF(src), "copy", "source", src_offset, size);
  auto db = use(s, TPUHAL_IMPL_OF(dst), "copy", "destination", dst_offset, size);
  if (size == 0) return *this;  // nothing to move
  s.commands.push_back(driver::cmd::Copy{{sb.get(), src_offset}, {db.get(), dst_offset}, size});
  s.retained.push_back(std::move(sb));
  s.retained.push_back(std::move(db));
  return *this;
}

Batch& Batch::fill(const Buffer& dst, std::uint64_t offset, std::uint64_t size, std::uint32_t pattern,
                   std::uint32_t pattern_bytes) {
  const auto guard = guard_of(state_, detail::validate::BatchCall::Fill);
  auto& s = live(state_);
  if (pattern_bytes != 1 && pattern_bytes != 2 && pattern_bytes != 4)
    throw Error(Status::InvalidArgument, "fill: pattern_bytes must be 1, 2 or 4, got " + std::to_string(pattern_bytes));
  if (pattern_bytes < 4 && (pattern >> (8 * pattern_bytes)) != 0)
    throw Error(Status::InvalidArgument, "fill: pattern " + std::to_string(pattern) + " does not fit in " +
                                             std::to_string(pattern_bytes) + " byte(s)");
  if (offset % pattern_bytes || size % pattern_bytes)
    throw Error(Status::InvalidArgument, "fill: offset " + std::to_string(offset) + " and size " +
                                             std::to_string(size) + " must be multiples of pattern_bytes (" +
                                             std::to_string(pattern_bytes) + ")");
  auto db = use(s, TPUHAL_IMPL_OF(dst), "fill", "destination", offset, size);
  if (size == 0) return *this;
  s.commands.push_back(driver::cmd::Fill{{db.get(), offset}, size, pattern, pattern_bytes});
  s.retained.push_back(std::move(db));
  return *this;
}

Batch& Batch::wait(const Fence& fence) {
  const auto guard = guard_of(state_, detail::validate::BatchCall::Wait);
  auto& s = live(state_);
  if (!s.queue)
    throw Error(Status::InvalidArgument,
                "wait: a program cannot wait on a fence (a fence belongs to one submission); "
                "wait before running the program instead");
  if (fence.empty() || fence.queue_ == s.queue) return *this;  // in order already
  if (fence.queue_->device() != s.device)
    throw Error(Status::InvalidArgument, "wait: the fence is on " + fence.queue_->device()->uri() +
                                             " but the queue is on " + s.device->uri() +
                                             "; wait on the host (Fence::wait) instead");
  if (fence.queue_->reached(fence.value_)) return *this;  // nothing to wait for
  s.commands.push_back(driver::cmd::WaitFence{&fence.queue_->backend(), fence.value_});
  s.retained.push_back(fence.queue_->backend_ptr());
  return *this;
}

namespace {
void check_word(detail::BatchState& s, const char* op, std::uint64_t offset) {
  if (!s.device->backend().properties().caps.wait_value)
    throw Error(Status::Unsupported, std::string(op) + ": " + s.device->uri() +
                                         " cannot wait on or write memory words "
                                         "(caps.wait_value is false)");
  if (offset % 8)
    throw Error(Status::InvalidArgument,
                std::string(op) + ": offset " + std::to_string(offset) + " is not a multiple of 8");
}
}  // namespace

Batch& Batch::wait_value(const Buffer& buf, std::uint64_t offset, std::uint64_t value) {
  const auto guard = guard_of(state_, detail::validate::BatchCall::WaitValue);
  auto& s = live(state_);
  check_word(s, "wait_value", offset);
  auto b = use(s, TPUHAL_IMPL_OF(buf), "wait_value", "word's", offset, 8);
  s.commands.push_back(driver::cmd::WaitValue{{b.get(), offset}, value});
  s.retained.push_back(std::move(b));
  return *this;
}

Batch& Batch::write_value(const Buffer& buf, std::uint64_t offset, std::uint64_t value) {
  const auto guard = guard_of(state_, detail::validate::BatchCall::WriteValue);
  auto& s = live(state_);
  check_word(s, "write_value", offset);
  auto b = use(s, TPUHAL_IMPL_OF(buf), "write_value", "word's", offset, 8);
  s.commands.push_back(driver::cmd::WriteValue{{b.get(), offset}, value});
  s.retained.push_back(std::move(b));
  return *this;
}

Batch& Batch::timestamp(const Buffer& buf, std::uint64_t offset) {
  const auto guard = guard_of(state_, detail::validate::BatchCall::Timestamp);
  auto& s = live(state_);
  if (!s.device->backend().properties().caps.timestamps)
    throw Error(Status::Unsupported, "timestamp: " + s.device->uri() + " has no timestamps (caps.timestamps)");
  if (offset % 8)
    throw Error(Status::InvalidArgument, "timestamp: offset " + std::to_string(offset) + " is not a multiple of 8");
  auto b = use(s, TPUHAL_IMPL_OF(buf), "timestamp", "word's", offset, 8);
  s.commands.push_back(driver::cmd::Timestamp{{b.get(), offset}});
  s.retained.push_back(std::move(b));
  return *this;
}

Batch& Batch::wait_until(std::uint64_t board_ns) {
  const auto guard = guard_of(state_, detail::validate::BatchCall::WaitUntil);
  auto& s = live(state_);
  if (!s.device->backend().properties().caps.wait_time)
    throw Error(Status::Unsupported,
                "wait_until: " + s.device->uri() + " cannot time work on its clock (caps.wait_time)");
  if (board_ns > (1ull << 62))
    throw Error(Status::InvalidArgument, "wait_until: board time " + std::to_string(board_ns) + " ns is past 2^62");
  s.commands.push_back(driver::cmd::WaitTime{board_ns});
  return *this;
}

Batch& Batch::run(const Op& op) {
  const auto guard = guard_of(state_, detail::validate::BatchCall::Run);
  auto& s = live(state_);
  OpAccess::check(op);
  if (OpAccess::device(op) != s.device)
    throw Error(Status::InvalidArgument, "run: " + op.name() + "'s operands are on " + OpAccess::device(op)->uri() +
                                             " but the batch is for " + s.device->uri());
  const std::string why = s.device->backend().refuse_op(*OpAccess::desc(op));
  if (!s.device->backend().properties().caps.tensor)
    throw Error(Status::Unsupported, "run: " + s.device->uri() + " has no tensor engine (caps.tensor is false)" +
                                         (why.empty() ? "" : ": " + why));
  if (!why.empty()) throw Error(Status::Unsupported, "run: " + s.device->uri() + " cannot run " + why);
  if (s.queue && s.queue->backend().engine() != Engine::Compute)
    throw Error(Status::Unsupported, "run: " + op.name() + " needs a compute queue; " + s.queue->name() + " is a " +
                                         to_string(s.queue->backend().engine()) + " queue");
  s.commands.push_back(driver::cmd::Run{OpAccess::desc(op).get()});
  s.retained.push_back(OpAccess::desc(op));
  s.retained.push_back(OpAccess::keep(op));
  return *this;
}

Batch& Batch::run(const Program& program) {
  const auto guard = guard_of(state_, detail::validate::BatchCall::Run);
  auto& s = live(state_);
  if (!program.impl_) throw Error(Status::InvalidArgument, "run: empty Program (make one with Device::record)");
  if (program.impl_->device != s.device)
    throw Error(Status::InvalidArgument, "run: the program was recorded for " + program.impl_->device->uri() +
                                             " but the batch is for " + s.device->uri());
  if (!s.queue)
    throw Error(Status::InvalidArgument, "run: a program cannot run another program; record its commands instead");
  if (s.queue->backend().engine() != Engine::Compute)
    throw Error(Status::Unsupported, "run: programs need a compute queue; " + s.queue->name() + " is a " +
                                         to_string(s.queue->backend().engine()) + " queue");
  s.commands.push_back(driver::cmd::Call{program.impl_->backend.get()});
  s.retained.push_back(program.impl_);
  return *this;
}

Fence Batch::submit() {
  auto& s = live(state_);
  return submit(s.device->default_timeout());
}

Fence Batch::submit(std::chrono::nanoseconds max_wait) {
  const auto guard = guard_of(state_, detail::validate::BatchCall::Submit);
  auto& s = live(state_);
  if (!s.queue)
    throw Error(Status::FailedPrecondition, "submit: this batch records a program; Device::record uploads it");
  if (max_wait.count() < 0) max_wait = std::chrono::nanoseconds(0);
  const bool checking = detail::validate::on();
  if (checking) detail::validate::before_submit(*s.queue, s.commands);
  // Validation looks at the commands after they went; keep their buffers
  // alive until it has (the submission may complete and release them first).
  std::vector<std::shared_ptr<const void>> keep;
  if (checking) keep = s.retained;
  const std::uint64_t value = s.queue->submit(s.commands, std::move(s.retained), max_wait);
  if (checking) detail::validate::after_submit(s.queue, s.commands, value);
  s.commands.clear();
  s.retained.clear();
  return Fence(s.queue, value);
}

#undef TPUHAL_IMPL_OF

// ---- Queue -------------------------------------------------------------------

namespace {
detail::QueueImpl& checked(const std::shared_ptr<detail::QueueImpl>& impl) {
  if (!impl) throw Error(Status::FailedPrecondition, "empty Queue handle (use Device::queue)");
  return *impl;
}
}  // namespace

Engine Queue::engine() const { return checked(impl_).backend().engine(); }
std::uint32_t Queue::index() const { return checked(impl_).backend().index(); }
Device Queue::device() const { return Device(checked(impl_).device()); }
Batch Queue::batch() const {
  checked(impl_);
  return Batch(impl_);
}
Batch Queue::copy(const Buffer& src, const Buffer& dst) const {
  auto b = batch();
  b.copy(src, dst);
  return b;
}
Batch Queue::copy(const Buffer& src, std::uint64_t src_offset, const Buffer& dst, std::uint64_t dst_offset,
                  std::uint64_t size) const {
  auto b = batch();
  b.copy(src, src_offset, dst, dst_offset, size);
  return b;
}
Batch Queue::fill(const Buffer& dst, std::uint64_t offset, std::uint64_t size, std::uint32_t pattern,
                  std::uint32_t pattern_bytes) const {
  auto b = batch();
  b.fill(dst, offset, size, pattern, pattern_bytes);
  return b;
}
Batch Queue::wait(const Fence& fence) const {
  auto b = batch();
  b.wait(fence);
  return b;
}
Batch Queue::run(const Op& op) const {
  auto b = batch();
  b.run(op);
  return b;
}
Batch Queue::run(const Program& program) const {
  auto b = batch();
  b.run(program);
  return b;
}

// ---- Program ---------------------------------------------------------------------

std::size_t Program::size() const {
  if (!impl_) throw Error(Status::FailedPrecondition, "empty Program handle (use Device::record)");
  return impl_->backend->size();
}

Device Program::device() const {
  if (!impl_) throw Error(Status::FailedPrecondition, "empty Program handle (use Device::record)");
  return Device(impl_->device);
}
Fence Queue::submit() const {
  auto& q = checked(impl_);
  const std::uint64_t value = q.submit({}, {}, q.device()->default_timeout());
  return Fence(impl_, value);
}
Fence Queue::last_fence() const {
  const auto v = checked(impl_).last_submitted();
  return v ? Fence(impl_, v) : Fence();
}
std::uint64_t Queue::completed_value() const { return checked(impl_).backend().timeline().completed; }

}  // namespace tpuhal
