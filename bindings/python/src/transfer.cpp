#include "transfer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

namespace tpuhal::python {
namespace {

std::uint64_t page_size() {
  static const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

std::uintptr_t align_up(std::uintptr_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
std::uintptr_t align_down(std::uintptr_t v, std::uint64_t a) { return v / a * a; }

// The contexts Device objects share, by URI. A URI names one open device at
// a time, and a context keeps its device open.
struct Registry {
  std::mutex mu;
  std::map<std::string, std::weak_ptr<Transfers>, std::less<>> by_uri;
};
Registry& registry() {
  static auto* r = new Registry;  // never destroyed: contexts may outlive static destruction
  return *r;
}

// The page-aligned interior of [p, p + n) if it is worth importing.
struct Interior {
  std::uint64_t head = 0;  // bytes before it
  std::uint64_t size = 0;  // 0: none
  std::uint64_t tail = 0;  // bytes after it
};
Interior interior(const void* p, std::uint64_t n) {
  const auto page = page_size();
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  const auto lo = align_up(begin, page);
  const auto hi = align_down(begin + n, page);
  if (hi <= lo || hi - lo < Transfers::kImportMin) return {};
  return {lo - begin, hi - lo, begin + n - hi};
}

}  // namespace

// Pinned staging buffers taken from the pool for one transfer. They go back
// only when the transfer succeeded: after a failure the board may still be
// using them (their memory then returns once that work completes).
class Transfers::Staging {
 public:
  explicit Staging(Transfers& t) : t_(t) {}
  ~Staging() = default;
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  const Buffer& operator[](std::size_t i) {
    while (buffers_.size() <= i) buffers_.push_back(t_.take_staging());
    return buffers_[i];
  }
  std::byte* data(std::size_t i) { return (*this)[i].map().data(); }
  void done() {
    for (auto& b : buffers_) t_.give_back(std::move(b));
    buffers_.clear();
  }

 private:
  Transfers& t_;
  std::vector<Buffer> buffers_;
};

std::shared_ptr<Transfers> Transfers::shared(const Device& device) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  auto& slot = r.by_uri[device.uri()];
  auto t = slot.lock();
  if (!t) {
    t = std::make_shared<Transfers>(device);
    slot = t;
  }
  return t;
}

Transfers::Transfers(Device device) : device_(std::move(device)) {}

Transfers::~Transfers() {
  // The queue's release waits for its work; staging buffers go after it.
  queue_.reset();
  staging_.clear();
}

bool Transfers::direct(const Buffer& b) const {
  return b.memory() == Memory::HostPinned || device_.properties().caps.map_device_memory;
}

Queue Transfers::queue_for(const Queue* user) {
  if (user) return *user;
  std::lock_guard lock(mu_);
  if (!queue_) queue_ = claim_queue();
  return *queue_;
}

Queue Transfers::claim_queue() {
  for (auto& e : device_.properties().engines) {
    if (e.engine != Engine::Copy || e.queues == 0) continue;
    try {
      return device_.queue(Engine::Copy);
    } catch (const Error& err) {
      if (err.status() != Status::ResourceExhausted) throw;
    }
  }
  try {
    return device_.queue(Engine::Compute);
  } catch (const Error& err) {
    if (err.status() != Status::ResourceExhausted) throw;
    throw Error(Status::ResourceExhausted, device_.uri() +
                                               ": upload and download need a queue and every copy and compute queue is "
                                               "claimed; pass queue= to use one of yours (" +
                                               err.what() + ")");
  }
}

void Transfers::forget_queue() {
  std::lock_guard lock(mu_);
  queue_.reset();
}

Buffer Transfers::take_staging() {
  {
    std::lock_guard lock(mu_);
    if (!staging_.empty()) {
      Buffer b = std::move(staging_.back());
      staging_.pop_back();
      return b;
    }
  }
  return device_.allocate(kChunk, Memory::HostPinned);
}

void Transfers::give_back(Buffer b) {
  constexpr std::size_t kKeep = 4;
  std::lock_guard lock(mu_);
  if (staging_.size() < kKeep) staging_.push_back(std::move(b));
}

void Transfers::write(const Buffer& dst, std::uint64_t offset, const std::byte* src, std::uint64_t n,
                      const Queue* user) {
  if (n == 0) return;
  if (direct(dst)) {
    std::memcpy(dst.map().data() + offset, src, n);
    return;
  }
  Queue q = queue_for(user);
  try {
    Staging staging(*this);
    if (const Interior in = interior(src, n); in.size != 0 && device_.properties().caps.import_host_memory) {
      // The board reads the caller's memory in place. import_host maps it for
      // the board to read and write; this batch only reads it.
      Buffer imported = device_.import_host(const_cast<std::byte*>(src + in.head), in.size);
      Batch b = q.batch();
      const auto page = page_size();
      if (in.head) {
        std::memcpy(staging.data(0), src, in.head);
        b.copy(staging[0], 0, dst, offset, in.head);
      }
      b.copy(imported, 0, dst, offset + in.head, in.size);
      if (in.tail) {
        std::memcpy(staging.data(0) + page, src + in.head + in.size, in.tail);
        b.copy(staging[0], page, dst, offset + in.head + in.size, in.tail);
      }
      b.submit().wait();
      staging.done();
      return;
    }
    // Staged, two chunks in flight: fill one while the board drains the other.
    Fence in_flight[2];
    std::size_t i = 0;
    for (std::uint64_t done = 0; done < n; done += kChunk, ++i) {
      const std::size_t slot = i % 2;
      const std::uint64_t len = std::min(kChunk, n - done);
      in_flight[slot].wait();
      std::memcpy(staging.data(slot), src + done, len);
      in_flight[slot] = q.copy(staging[slot], 0, dst, offset + done, len).submit();
    }
    in_flight[0].wait();
    in_flight[1].wait();
    staging.done();
  } catch (const Error& e) {
    if (!user && e.status() == Status::DeviceFault) forget_queue();  // a failed queue stays failed
    throw;
  }
}

void Transfers::read(const Buffer& src, std::uint64_t offset, std::byte* dst, std::uint64_t n, const Queue* user) {
  if (n == 0) return;
  if (direct(src)) {
    std::memcpy(dst, src.map().data() + offset, n);
    return;
  }
  Queue q = queue_for(user);
  try {
    Staging staging(*this);
    if (const Interior in = interior(dst, n); in.size != 0 && device_.properties().caps.import_host_memory) {
      // The board writes the caller's memory in place.
      Buffer imported = device_.import_host(dst + in.head, in.size);
      Batch b = q.batch();
      const auto page = page_size();
      if (in.head) b.copy(src, offset, staging[0], 0, in.head);
      b.copy(src, offset + in.head, imported, 0, in.size);
      if (in.tail) b.copy(src, offset + in.head + in.size, staging[0], page, in.tail);
      b.submit().wait();
      if (in.head) std::memcpy(dst, staging.data(0), in.head);
      if (in.tail) std::memcpy(dst + in.head + in.size, staging.data(0) + page, in.tail);
      staging.done();
      return;
    }
    // Staged, two chunks in flight: copy one out while the board fills the other.
    const std::uint64_t chunks = (n + kChunk - 1) / kChunk;
    Fence in_flight[2];
    auto start = [&](std::uint64_t c) {
      const std::uint64_t at = c * kChunk;
      in_flight[c % 2] = q.copy(src, offset + at, staging[c % 2], 0, std::min(kChunk, n - at)).submit();
    };
    start(0);
    if (chunks > 1) start(1);
    for (std::uint64_t c = 0; c < chunks; ++c) {
      const std::uint64_t at = c * kChunk;
      in_flight[c % 2].wait();
      std::memcpy(dst + at, staging.data(c % 2), std::min(kChunk, n - at));
      if (c + 2 < chunks) start(c + 2);
    }
    staging.done();
  } catch (const Error& e) {
    if (!user && e.status() == Status::DeviceFault) forget_queue();
    throw;
  }
}

}  // namespace tpuhal::python
