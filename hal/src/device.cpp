#include <spdlog/spdlog.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include "impl.hpp"
#include "tpuhal/base/log.h"
#include "tpuhal/base/units.h"

namespace tpuhal {
namespace detail {
namespace {

std::optional<std::chrono::nanoseconds> parse_duration(std::string_view s) {
  std::size_t i = 0;
  std::uint64_t n = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    if (n > UINT64_MAX / 10 - 10) return std::nullopt;
    n = n * 10 + static_cast<std::uint64_t>(s[i++] - '0');
  }
  if (i == 0) return std::nullopt;
  const auto unit = s.substr(i);
  std::uint64_t scale;
  if (unit == "ns")
    scale = 1;
  else if (unit == "us")
    scale = 1'000;
  else if (unit == "ms")
    scale = 1'000'000;
  else if (unit == "s")
    scale = 1'000'000'000;
  else
    return std::nullopt;
  if (n > INT64_MAX / scale) return std::nullopt;
  return std::chrono::nanoseconds(static_cast<std::int64_t>(n * scale));
}

WaitPolicy default_policy() {
  WaitPolicy p;
  auto log = base::logger("hal");
  if (const char* env = std::getenv("TPUHAL_WAIT")) {
    std::string_view s = env;
    const auto colon = s.find(':');
    const auto mode = s.substr(0, colon);
    if (mode == "hybrid")
      p.mode = WaitPolicy::Mode::Hybrid;
    else if (mode == "spin")
      p.mode = WaitPolicy::Mode::Spin;
    else if (mode == "block")
      p.mode = WaitPolicy::Mode::Block;
    else
      log->warn("TPUHAL_WAIT='{}': mode must be hybrid, spin or block; using hybrid", env);
    if (colon != std::string_view::npos) {
      if (auto d = parse_duration(s.substr(colon + 1)))
        p.spin = *d;
      else
        log->warn("TPUHAL_WAIT='{}': spin time must look like 20us; using 20us", env);
    }
  }
  if (const char* env = std::getenv("TPUHAL_TIMEOUT")) {
    if (auto d = parse_duration(env); d && d->count() > 0)
      p.timeout = *d;
    else
      log->warn("TPUHAL_TIMEOUT='{}' must look like 10s or 500ms; using 10s", env);
  }
  return p;
}

}  // namespace

DeviceImpl::DeviceImpl(std::string uri, std::shared_ptr<driver::DeviceBackend> backend)
    : uri_(std::move(uri)), backend_(std::move(backend)) {
  static const WaitPolicy from_env = default_policy();
  policy_ = from_env;
  timeout_ns_.store(policy_.timeout.count(), std::memory_order_relaxed);
}

DeviceImpl::~DeviceImpl() {
  // Every buffer, queue and program of the device is gone: what the driver
  // still holds, it leaked.
  if (!validate::on()) return;
  try {
    const auto stats = backend_->memory_stats();
    if (stats.device_used != 0 || stats.host_pinned_allocations != 0)
      validate::report(validation::Check::Leak,
                       uri_ + " closed with memory the driver still holds: " + base::format_bytes(stats.device_used) +
                           " of device memory and " + std::to_string(stats.host_pinned_allocations) +
                           " host-pinned allocation(s), though every buffer was released");
  } catch (const std::exception& e) {
    base::logger("hal")->warn("{}: could not read memory use at close: {}", uri_, e.what());
  }
}

WaitPolicy DeviceImpl::wait_policy() const {
  std::lock_guard lock(mu_);
  return policy_;
}

void DeviceImpl::set_wait_policy(const WaitPolicy& policy) {
  if (policy.spin.count() < 0 || policy.timeout.count() <= 0)
    throw Error(Status::InvalidArgument, "wait policy: spin must be >= 0 and timeout > 0 (got spin " +
                                             std::to_string(policy.spin.count()) + " ns, timeout " +
                                             std::to_string(policy.timeout.count()) + " ns)");
  std::lock_guard lock(mu_);
  policy_ = policy;
  timeout_ns_.store(policy_.timeout.count(), std::memory_order_relaxed);
}

BufferImpl::BufferImpl(std::shared_ptr<DeviceImpl> device, std::shared_ptr<driver::BufferBackend> backend)
    : device_(std::move(device)),
      backend_(std::move(backend)),
      size_(backend_->size()),
      memory_(backend_->memory()),
      heap_(backend_->heap()),
      device_address_(backend_->device_address()) {
  if (validate::on()) track_ = validate::track_buffer(*this, backend_.get());
}

BufferImpl::~BufferImpl() { validate::untrack_buffer(track_); }

std::shared_ptr<driver::BufferBackend> BufferImpl::acquire(const char* use) const {
  std::lock_guard lock(mu_);
  if (!backend_) throw Error(Status::FailedPrecondition, std::string(use) + ": the " + describe() + " was freed");
  return backend_;
}

void BufferImpl::free() {
  std::shared_ptr<driver::BufferBackend> last;
  {
    std::lock_guard lock(mu_);
    last = std::move(backend_);
  }
  validate::untrack_buffer(track_);  // freed: no longer a leak
  // `last` drops here, outside the lock: if no queued work holds the backend,
  // its memory returns to the device now.
}

bool BufferImpl::freed() const {
  std::lock_guard lock(mu_);
  return !backend_;
}

std::string BufferImpl::describe() const {
  char addr[32];
  std::snprintf(addr, sizeof addr, "0x%" PRIx64, device_address_);
  return std::to_string(size_) + "-byte " + to_string(memory_) + " buffer at " + addr;
}

}  // namespace detail

// ---- Device ------------------------------------------------------------------

namespace {
detail::DeviceImpl& checked(const std::shared_ptr<detail::DeviceImpl>& impl) {
  if (!impl) throw Error(Status::FailedPrecondition, "empty Device handle (use tpuhal::open)");
  return *impl;
}
}  // namespace

const std::string& Device::uri() const { return checked(impl_).uri(); }
const Properties& Device::properties() const { return checked(impl_).backend().properties(); }
MemoryStats Device::memory_stats() const { return checked(impl_).backend().memory_stats(); }
DeviceStatus Device::status() const { return checked(impl_).backend().status(); }
Telemetry Device::telemetry() const { return checked(impl_).backend().telemetry(); }
std::optional<ModelledTime> Device::modelled(const Op& op) const {
  auto& dev = checked(impl_);
  OpAccess::check(op);
  if (OpAccess::device(op) != impl_)
    throw Error(Status::InvalidArgument, "modelled: the op was built for another device than " + dev.uri());
  return dev.backend().model_op(*OpAccess::desc(op));
}
std::optional<ModelledTime> Device::modelled_copy(std::uint64_t bytes, Memory from, Memory to) const {
  return checked(impl_).backend().model_transfer(bytes, from, to);
}
std::optional<std::uint64_t> Device::board_time_ns() const {
  const auto& backend = checked(impl_).backend();
  return backend.properties().caps.wait_time ? backend.board_time_ns() : std::nullopt;
}

std::optional<std::uint64_t> Device::modelled_decode_ns(Codec codec, FrameType type, std::uint32_t width,
                                                        std::uint32_t height) const {
  return checked(impl_).backend().model_decode_ns(codec, type, width, height);
}
WaitPolicy Device::wait_policy() const { return checked(impl_).wait_policy(); }
void Device::set_wait_policy(const WaitPolicy& policy) { checked(impl_).set_wait_policy(policy); }
void Device::reset() {
  auto& dev = checked(impl_);
  detail::tracing::Slice traced("reset");
  detail::tracing::device_instant(impl_, "reset");
  dev.backend().reset();
}

Buffer Device::allocate(std::uint64_t size, Memory memory, const AllocOptions& options) {
  auto& dev = checked(impl_);
  if (size == 0) throw Error(Status::InvalidArgument, dev.uri() + ": cannot allocate a buffer of 0 bytes");
  if (options.alignment & (options.alignment - 1))
    throw Error(Status::InvalidArgument,
                dev.uri() + ": alignment " + std::to_string(options.alignment) + " is not a power of two");
  detail::tracing::Slice traced("allocate", {{"bytes", size}, {"memory", to_string(memory)}}, options.heap, "heap");
  auto backend = dev.backend().allocate(size, memory, options);
  return Buffer(std::make_shared<detail::BufferImpl>(impl_, std::move(backend)));
}

Buffer Device::import_host(void* ptr, std::uint64_t size) {
  auto& dev = checked(impl_);
  if (!ptr || size == 0)
    throw Error(Status::InvalidArgument, dev.uri() + ": import_host needs memory (got " +
                                             std::string(ptr ? "" : "a null pointer, ") + std::to_string(size) +
                                             " bytes)");
  detail::tracing::Slice traced("import_host", {{"bytes", size}});
  auto backend = dev.backend().import_host(ptr, size);
  return Buffer(std::make_shared<detail::BufferImpl>(impl_, std::move(backend)));
}

Program Device::record(const std::function<void(Batch&)>& body) {
  auto& dev = checked(impl_);
  if (!body) throw Error(Status::InvalidArgument, dev.uri() + ": record needs a function that records commands");
  detail::tracing::Slice traced("record", {}, {}, "message", detail::tracing::Slice::Kind::Nesting);
  Batch batch(impl_);
  body(batch);
  auto& s = *batch.state_;
  if (s.commands.empty())
    throw Error(Status::InvalidArgument, dev.uri() + ": record: the program recorded no commands");
  auto program = std::make_shared<detail::ProgramImpl>();
  program->device = impl_;
  program->backend = dev.backend().create_program(s.commands);
  if (detail::validate::on()) detail::validate::record_program(program->backend.get(), s.commands);
  program->retained = std::move(s.retained);
  return Program(std::move(program));
}

Queue Device::queue(Engine engine, const QueueOptions& options) {
  auto& dev = checked(impl_);
  auto backend = dev.backend().create_queue(engine, options);
  return Queue(std::make_shared<detail::QueueImpl>(impl_, std::move(backend)));
}

// ---- Buffer ------------------------------------------------------------------

namespace {
detail::BufferImpl& checked(const std::shared_ptr<detail::BufferImpl>& impl) {
  if (!impl) throw Error(Status::FailedPrecondition, "empty Buffer handle (use Device::allocate)");
  return *impl;
}
}  // namespace

std::uint64_t Buffer::size() const { return checked(impl_).size(); }
Memory Buffer::memory() const { return checked(impl_).memory(); }
const std::string& Buffer::heap() const { return checked(impl_).heap(); }
std::uint64_t Buffer::device_address() const { return checked(impl_).device_address(); }
Device Buffer::device() const { return Device(checked(impl_).device()); }
std::span<std::byte> Buffer::map() const {
  auto& b = checked(impl_);
  auto backend = b.acquire("map");
  if (detail::validate::on() && b.track()) detail::validate::on_map(*b.track());
  detail::tracing::Slice traced("map", {{"bytes", b.size()}, {"memory", to_string(b.memory())}});
  return backend->map();
}
void Buffer::free() {
  if (!impl_) return;
  detail::tracing::Slice traced("free", {{"bytes", impl_->size()}, {"memory", to_string(impl_->memory())}});
  impl_->free();
}
bool Buffer::valid() const noexcept { return impl_ && !impl_->freed(); }

}  // namespace tpuhal
