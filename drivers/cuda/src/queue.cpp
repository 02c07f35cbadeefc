// Queues of the CUDA shim: a stream and a 64-bit timeline word in pinned host
// memory that the stream itself writes after each submission
// (cuStreamWriteValue64), just after the board time of that value goes to
// the word's stamp slots (clock.cpp); a wait for another queue's fence is
// cuStreamWaitValue64 on that queue's word, so the host never blocks for it.
// The host reads the word to see completion. The "ring" bounds submissions
// in flight the way a board's ring does.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>
#include <type_traits>
#include <variant>

#include "device_impl.h"

namespace tpuhal::cuda {

// ---- The timeline word ---------------------------------------------------------

TimelineWord::TimelineWord(const Api& api, CUcontext ctx, const std::string& what) : api_(api), ctx_(ctx) {
  ScopedContext scope(api_, ctx_);
  void* host = nullptr;
  constexpr std::uint64_t bytes = kBytes;
  check(api_, api_.cuMemHostAlloc(&host, bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP),
        what + ": the timeline word");
  host_ = static_cast<std::uint64_t*>(host);
  std::fill_n(host_, bytes / 8, 0);
  if (CUresult r = api_.cuMemHostGetDevicePointer(&address_, host, 0); r != CUDA_SUCCESS) {
    api_.cuMemFreeHost(host);
    check(api_, r, what + ": the timeline word's device address");
  }
}

TimelineWord::~TimelineWord() {
  try {
    ScopedContext scope(api_, ctx_);
    api_.cuMemFreeHost(host_);
  } catch (const Error& e) {
    log()->error("freeing a timeline word: {}", e.what());
  }
}

std::optional<std::uint64_t> TimelineWord::stamp(std::uint64_t value) const {
  // The slot as the fence-stamp kernel writes it (clock.cpp): value word
  // 0, time, value word. Whoever reads `value` before and after the time
  // has the time written for it; a slot being rewritten for a later value
  // reads otherwise.
  auto* slot = reinterpret_cast<StampSlot*>(reinterpret_cast<std::byte*>(host_) + kSlotsAt) + value % kStampSlots;
  auto load = [](std::uint64_t& w) { return std::atomic_ref<std::uint64_t>(w).load(std::memory_order_acquire); };
  if (load(slot->value) != value) return std::nullopt;
  const std::uint64_t ns = load(slot->ns);
  if (load(slot->value) != value) return std::nullopt;
  return ns;
}

// ---- Commands ------------------------------------------------------------------

namespace {

// What a fault record says, as a queue failure: "cuda:0 compute queue 0:
// submission 3 failed at command 1 of 1 (gather, ring position 4): gather:
// tensor 1 holds the index 5, outside [-5, 5) (the length of the indexed
// axis)".
Error fault_error_impl(const std::string& queue, const k::FaultRecord& r) {
  const char* op = r.kind < driver::kOpKindCount ? driver::to_string(static_cast<driver::OpKind>(r.kind)) : "op";
  std::string where = "command " + std::to_string(r.command + 1) + " of " + std::to_string(r.commands);
  if (r.call) where += " of the program called by command " + std::to_string(r.call);
  std::string what;
  switch (r.code) {
    case k::kFaultIndexOutOfRange:
      what = std::string(op) + ": tensor " + std::to_string(r.tensor) + " holds the index " + std::to_string(r.a) +
             ", outside [-" + std::to_string(r.b) + ", " + std::to_string(r.b) + ") (the length of the indexed axis)";
      break;
    default: what = std::string(op) + ": fault code " + std::to_string(r.code);
  }
  return Error(Status::DeviceFault, queue + ": submission " + std::to_string(r.value) + " failed at " + where + " (" +
                                        op + ", ring position " + std::to_string(r.ring) + "): " + what);
}

// A block of `bytes` of the device heap that `keep` holds until the stream
// is past it; 0 when the heap has none.
std::function<std::uint64_t(std::uint64_t)> scratch_of(CudaDevice& dev, Keep& keep) {
  return [&dev, &keep](std::uint64_t bytes) -> std::uint64_t {
    std::uint64_t at = 0;
    try {
      at = dev.heap().allocate(dev.uri(), bytes, kMinAlignment);
    } catch (const Error&) {
      return 0;
    }
    keep.push_back(std::shared_ptr<const void>(reinterpret_cast<const void*>(at), [heap = &dev.heap()](const void* p) {
      heap->free(reinterpret_cast<std::uint64_t>(p));
    }));
    return at;
  };
}

// An overlapping copy taking more pieces than this goes through a scratch
// block instead (see copy_as_memmove).
constexpr std::uint64_t kMaxCopyPieces = 16;

// Copies `size` bytes from `src` to `dst` as memmove does. cuMemcpyAsync
// leaves overlapping ranges undefined, and on an H100 it garbles them at every
// distance from 1 byte to 1 MiB. So an overlapping copy goes in pieces no
// longer than the distance between the ranges, in the order memmove takes
// (from the end when moving up), or, where that would take more than
// kMaxCopyPieces, through a scratch block of the device heap that `keep`
// holds until the stream is past it. Without memory for the scratch block it
// goes in pieces however many: slower, never wrong.
CUresult copy_as_memmove(CudaDevice& dev, CUstream stream, CUdeviceptr dst, CUdeviceptr src, std::uint64_t size,
                         Keep& keep) {
  const Api& api = dev.api();
  const std::uint64_t distance = dst > src ? dst - src : src - dst;
  if (distance == 0 || distance >= size) return api.cuMemcpyAsync(dst, src, size, stream);
  if ((size + distance - 1) / distance > kMaxCopyPieces) {
    std::optional<CUdeviceptr> scratch;
    try {
      scratch = dev.heap().allocate(dev.uri(), size, kMinAlignment);
    } catch (const Error&) {
    }
    if (scratch) {
      keep.push_back(std::shared_ptr<const void>(
          reinterpret_cast<const void*>(*scratch),
          [heap = &dev.heap()](const void* p) { heap->free(reinterpret_cast<std::uint64_t>(p)); }));
      if (CUresult r = api.cuMemcpyAsync(*scratch, src, size, stream); r != CUDA_SUCCESS) return r;
      return api.cuMemcpyAsync(dst, *scratch, size, stream);
    }
  }
  if (dst > src) {
    for (std::uint64_t at = size; at > 0;) {
      const std::uint64_t n = std::min(distance, at);
      at -= n;
      if (CUresult r = api.cuMemcpyAsync(dst + at, src + at, n, stream); r != CUDA_SUCCESS) return r;
    }
  } else {
    for (std::uint64_t at = 0; at < size; at += distance) {
      const std::uint64_t n = std::min(distance, size - at);
      if (CUresult r = api.cuMemcpyAsync(dst + at, src + at, n, stream); r != CUDA_SUCCESS) return r;
    }
  }
  return CUDA_SUCCESS;
}

}  // namespace

Error fault_error(const std::string& queue, const k::FaultRecord& r) { return fault_error_impl(queue, r); }

CUresult enqueue(CudaDevice& dev, CUstream stream, const driver::Command& c, Keep& keep, std::string& what,
                 k::Fault fault) {
  const Api& api = dev.api();
  const std::string& uri = dev.uri();
  return std::visit(
      [&](const auto& cmd) -> CUresult {
        using T = std::decay_t<decltype(cmd)>;
        if constexpr (std::is_same_v<T, driver::cmd::Copy>) {
          what = "cuMemcpyAsync";
          return copy_as_memmove(dev, stream, address_of(cmd.dst), address_of(cmd.src), cmd.size, keep);
        } else if constexpr (std::is_same_v<T, driver::cmd::Fill>) {
          const CUdeviceptr dst = address_of(cmd.dst);
          switch (cmd.pattern_bytes) {
            case 1:
              what = "cuMemsetD8Async";
              return api.cuMemsetD8Async(dst, static_cast<unsigned char>(cmd.pattern), cmd.size, stream);
            case 2:
              what = "cuMemsetD16Async";
              return api.cuMemsetD16Async(dst, static_cast<unsigned short>(cmd.pattern), cmd.size / 2, stream);
            default: what = "cuMemsetD32Async"; return api.cuMemsetD32Async(dst, cmd.pattern, cmd.size / 4, stream);
          }
        } else if constexpr (std::is_same_v<T, driver::cmd::WaitFence>) {
          what = "cuStreamWaitValue64 (another queue's fence)";
          auto* other = static_cast<CudaQueue*>(cmd.queue);
          keep.push_back(other->word());
          return api.cuStreamWaitValue64(stream, other->word()->address(), cmd.value, CU_STREAM_WAIT_VALUE_GEQ);
        } else if constexpr (std::is_same_v<T, driver::cmd::WaitValue>) {
          what = "cuStreamWaitValue64";
          return api.cuStreamWaitValue64(stream, address_of(cmd.location), cmd.value, CU_STREAM_WAIT_VALUE_GEQ);
        } else if constexpr (std::is_same_v<T, driver::cmd::WriteValue>) {
          what = "cuStreamWriteValue64";
          return api.cuStreamWriteValue64(stream, address_of(cmd.location), cmd.value, CU_STREAM_WRITE_VALUE_DEFAULT);
        } else if constexpr (std::is_same_v<T, driver::cmd::Call>) {
          what = "cuGraphLaunch";
          auto* p = static_cast<CudaProgram*>(cmd.program);
          if (CUresult r = api.cuGraphLaunch(p->exec(), stream); r != CUDA_SUCCESS || !p->faults()) return r;
          what = "cuLaunchKernel (forward_fault)";
          keep.push_back(p->faults());
          return dev.kernels()->launch(stream, "forward_fault",
                                       k::ForwardFaultParams{1, p->faults()->fault_address(), fault});
        } else if constexpr (std::is_same_v<T, driver::cmd::WaitTime>) {
          throw Error(Status::Unsupported, uri + ": no timed waits on this device (caps.wait_time is false)");
        } else if constexpr (std::is_same_v<T, driver::cmd::Timestamp>) {
          if (!dev.clock())
            throw Error(Status::Unsupported, uri + ": timestamps are not supported (caps.timestamps is false)");
          what = "cuLaunchKernel (tpuhal_stamp)";
          return dev.clock()->stamp(stream, address_of(cmd.location));
        } else {
          static_assert(std::is_same_v<T, driver::cmd::Run>);
          if (!dev.kernels())
            throw Error(Status::Unsupported, uri + ": no tensor ops on this device (caps.tensor is false)");
          if (std::string why = refuse_op(*cmd.op); !why.empty())
            throw Error(Status::Unsupported, uri + ": cannot run " + why);
          if ((cmd.op->kind == driver::OpKind::MatMul || cmd.op->kind == driver::OpKind::MatMulInteger) && dev.blas()) {
            CUresult r = CUDA_SUCCESS;
            what = "cuBLAS (" + cmd.op->name + ")";
            if (run_matmul_on_blas(*dev.blas(), *dev.kernels(), stream, *cmd.op, scratch_of(dev, keep), &r, &what))
              return r;
          }
          what = "cuLaunchKernel (" + cmd.op->name + ")";
          fault.kind = static_cast<std::uint32_t>(cmd.op->kind);
          return run_op(*dev.kernels(), stream, *cmd.op, fault);
        }
      },
      c);
}

// ---- Queues --------------------------------------------------------------------

CudaQueue::CudaQueue(std::shared_ptr<CudaDevice> dev, Engine engine, std::uint32_t index, std::uint32_t entries)
    : dev_(std::move(dev)), api_(dev_->api()), engine_(engine), index_(index), entries_(entries) {
  word_ = std::make_shared<TimelineWord>(api_, dev_->context(), name());
  ScopedContext scope(api_, dev_->context());
  check(api_, api_.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), name() + ": cuStreamCreate");
}

CudaQueue::~CudaQueue() {
  Keep keep;
  for (auto& f : in_flight_)
    for (auto& k : f.keep) keep.push_back(std::move(k));
  dev_->release_queue(index_, stream_, std::move(word_), std::move(keep));
}

void CudaQueue::block(std::uint64_t value, std::chrono::nanoseconds max) {
  // CUDA's blocking waits (an event's cuEventSynchronize) take no timeout,
  // and a wait here must end; so this sleeps in short steps and asks the
  // stream for errors between them. A step is a thirty-second of the time
  // waited so far (10 us to 1 ms): a wait ends within a few per cent of
  // the work it waits for (steps doubling to 1 ms overshot a 2.5 ms copy
  // by 0.4 ms on an H100).
  const std::uint64_t start = base::monotonic_ns();
  const std::uint64_t deadline = start + static_cast<std::uint64_t>(max.count());
  for (;;) {
    const auto t = timeline();
    if (t.completed >= value || t.failed) return;
    poll_stream();
    const std::uint64_t now = base::monotonic_ns();
    if (now >= deadline) return;
    const std::uint64_t step = std::clamp<std::uint64_t>((now - start) / 32, 10'000, 1'000'000);
    std::this_thread::sleep_for(std::chrono::nanoseconds(std::min(step, deadline - now)));
  }
}

void CudaQueue::abort() {
  // A stream cannot be stopped: what it has queued runs to its end. The
  // timeline reads failed from now; memory stays allocated until the
  // stream is idle (see CudaDevice::release_queue).
  std::lock_guard lock(submit_mu_);
  if (timeline().completed < submitted())
    fail(Error(Status::FailedPrecondition, name() + ": aborted with work unfinished"));
}

std::optional<std::uint64_t> CudaQueue::timestamp_ns(std::uint64_t value) const {
  if (!dev_->clock() || value == 0 || value > timeline().completed) return std::nullopt;
  return word_->stamp(value);
}

QueueStatus CudaQueue::status() const {
  QueueStatus s;
  s.engine = engine_;
  s.index = index_;
  s.in_use = true;
  const auto t = timeline();
  s.submitted = submitted();
  s.completed = t.completed;
  s.failed = t.failed;
  s.busy = s.completed < s.submitted && !t.failed;
  return s;
}

std::string CudaQueue::diagnose() const {
  const auto t = timeline();
  if (t.completed >= submitted()) return {};
  return "the stream is at timeline value " + std::to_string(t.completed) + " of " + std::to_string(submitted()) +
         " submitted";
}

Error CudaQueue::failure() const {
  {
    std::lock_guard lock(failure_mu_);
    if (failed_.load(std::memory_order_relaxed)) return failure_;
  }
  if (word_->fault_value() == 0)
    return Error(Status::Internal, name() + ": failure() asked of a queue that has not failed");
  return fault_error(name(), word_->fault());
}

void CudaQueue::fail(Error e) {
  std::lock_guard lock(failure_mu_);
  if (failed_.load(std::memory_order_relaxed)) return;
  failure_ = std::move(e);
  failed_.store(true, std::memory_order_release);
}

void CudaQueue::poll_stream() {
  try {
    ScopedContext scope(api_, dev_->context());
    const CUresult r = api_.cuStreamQuery(stream_);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY)
      fail(Error(status_of(r), name() + ": the stream failed: " + describe(api_, r)));
  } catch (const Error& e) {
    fail(e);
  }
}

void CudaQueue::retire() {
  const std::uint64_t done = timeline().completed;
  while (!in_flight_.empty() && in_flight_.front().value <= done) {
    used_ -= in_flight_.front().entries;
    in_flight_.pop_front();
  }
}

void CudaQueue::reserve(std::uint32_t n, std::chrono::nanoseconds max_wait) {
  // Full: wait for the stream to pass submissions, as long as it moves.
  const auto limit = static_cast<std::uint64_t>(max_wait.count());
  std::uint64_t moved_at = base::monotonic_ns(), last = timeline().completed;
  for (;;) {
    retire();
    if (entries_ - used_ >= n) return;
    if (timeline().failed) throw failure();
    const std::uint64_t now = base::monotonic_ns(), done = timeline().completed;
    if (done != last) {
      last = done;
      moved_at = now;
    }
    if (now - moved_at >= limit)
      throw Error(Status::QueueFull, name() + ": ring full (" + std::to_string(entries_) + " entries, " +
                                         std::to_string(used_) + " in flight, " + std::to_string(n) +
                                         " needed) and no submission completed for " +
                                         std::to_string(limit / 1'000'000) + " ms");
    block(done + 1, std::chrono::nanoseconds(std::min<std::uint64_t>(limit - (now - moved_at), 10'000'000)));
  }
}

std::uint64_t CudaQueue::submit(std::span<const driver::Command> commands, std::chrono::nanoseconds max_wait) {
  // One ring entry per command and one for the timeline write (and its
  // stamp).
  const std::size_t n = commands.size() + 1;
  if (n >= entries_)
    throw Error(Status::InvalidArgument, name() + ": a batch of " + std::to_string(commands.size()) +
                                             " commands does not fit the ring (" + std::to_string(entries_) +
                                             " entries); split it, record a program, or create the queue with "
                                             "more ring_entries");
  std::lock_guard lock(submit_mu_);
  if (timeline().failed) throw failure();
  reserve(static_cast<std::uint32_t>(n), max_wait);
  Submission s{next_value_++, static_cast<std::uint32_t>(n), {}};
  {
    ScopedContext scope(api_, dev_->context());
    std::string what;
    k::Fault fault{word_->fault_address(), s.value, ring_at_ % entries_, 0,
                   static_cast<std::uint32_t>(commands.size())};
    for (std::size_t i = 0; i < commands.size(); ++i) {
      fault.command = static_cast<std::uint32_t>(i);
      if (CUresult r = enqueue(*dev_, stream_, commands[i], s.keep, what, fault); r != CUDA_SUCCESS) {
        // Earlier commands of the batch are queued already; the timeline
        // will not reach this value, and waits report why.
        fail(Error(status_of(r), name() + ": command " + std::to_string(i) + " of submission " +
                                     std::to_string(s.value) + ": " + what + ": " + describe(api_, r)));
        break;
      }
    }
    // The board time the value is reached at, then the value.
    if (!timeline().failed && dev_->clock()) {
      if (CUresult r = dev_->clock()->fence_stamp(stream_, word_->slot(s.value), s.value); r != CUDA_SUCCESS)
        fail(Error(status_of(r), name() + ": stamping timeline value " + std::to_string(s.value) +
                                     ": cuLaunchKernel (tpuhal_fence_stamp): " + describe(api_, r)));
    }
    if (!timeline().failed) {
      if (CUresult r = api_.cuStreamWriteValue64(stream_, word_->address(), s.value, CU_STREAM_WRITE_VALUE_DEFAULT);
          r != CUDA_SUCCESS)
        fail(Error(status_of(r),
                   name() + ": writing timeline value " + std::to_string(s.value) + ": " + describe(api_, r)));
    }
  }
  used_ += s.entries;
  ring_at_ += s.entries;
  const std::uint64_t value = s.value;
  in_flight_.push_back(std::move(s));
  submitted_.store(value, std::memory_order_release);
  return value;
}

}  // namespace tpuhal::cuda
