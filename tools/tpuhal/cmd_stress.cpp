// tpuhal stress: a soak test. Worker threads (and, with --processes, copies
// of this program) drive one device with random copies, fills, tensor ops,
// host and cross-queue waits, dropped fences, buffer frees and queue
// releases with work in flight. Every byte the device writes is checked
// against a host-side model, every submission must complete, and device
// memory must return to where it started.
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "cli.h"

extern char** environ;

namespace tpuhal::cli {
namespace {

using Clock = std::chrono::steady_clock;

// ---- Operations ---------------------------------------------------------------

enum class Kind : std::uint8_t {
  Fill,       // fill a range of a buffer with a 1-, 2- or 4-byte pattern
  Upload,     // host bytes -> a buffer, through a pinned or host-visible staging buffer
  Download,   // a buffer -> staging, wait, compare with the model
  Copy,       // buffer -> buffer on the device (the same buffer: overlapping, memmove)
  Tensor,     // add, mul, max or relu on small f32 tensors, checked on the host
  HostWait,   // wait on the host for the last fence of any queue
  CrossWait,  // queue A waits on the device for queue B's fence; A done implies B done
  Drop,       // an empty submission whose fence is dropped at once
  Free,       // free a buffer with work on it in flight, allocate a new one (and fill it)
  Abandon,    // record a batch and destroy it unsubmitted
  Release,    // claim a queue, submit, release it with the work pending
  Recycle,    // take a queue out of the shared pool with work on it; a new one is claimed
  Map,        // check (or write) a mappable buffer through its host mapping
  kCount,
};
constexpr std::size_t kKinds = static_cast<std::size_t>(Kind::kCount);
constexpr std::array<const char*, kKinds> kKindName = {
    "fill", "upload", "download", "copy", "tensor-op", "host-wait", "cross-wait",
    "drop",  "free",   "abandon",  "release", "recycle", "map"};
// Relative frequencies.
constexpr std::array<unsigned, kKinds> kWeight = {10, 10, 10, 14, 6, 5, 6, 6, 5, 3, 2, 2, 6};

const char* name_of(Kind k) { return kKindName[static_cast<std::size_t>(k)]; }

struct Counts {
  std::array<std::uint64_t, kKinds> ops{};
  std::uint64_t bytes_verified = 0;
  std::uint64_t submitted = 0;  // submissions made
  std::uint64_t completed = 0;  // seen complete
  std::uint64_t failed = 0;     // completed with an error
  std::uint64_t lost = 0;       // neither, when the run ended
  std::uint64_t errors = 0;     // problems reported
  std::uint64_t skipped = 0;    // operations not possible at that moment (no free queue)

  void add(const Counts& o) {
    for (std::size_t i = 0; i < kKinds; ++i) ops[i] += o.ops[i];
    bytes_verified += o.bytes_verified;
    submitted += o.submitted;
    completed += o.completed;
    failed += o.failed;
    lost += o.lost;
    errors += o.errors;
    skipped += o.skipped;
  }
  std::uint64_t operations() const {
    std::uint64_t n = 0;
    for (auto v : ops) n += v;
    return n;
  }
  nlohmann::json to_json() const {
    nlohmann::json by_kind = nlohmann::json::object();
    for (std::size_t i = 0; i < kKinds; ++i) by_kind[kKindName[i]] = ops[i];
    return {{"operations", by_kind}, {"bytes_verified", bytes_verified}, {"submitted", submitted},
            {"completed", completed}, {"failed", failed},     {"lost", lost},
            {"errors", errors},       {"skipped", skipped}};
  }
  static Counts from_json(const nlohmann::json& j) {
    Counts c;
    for (std::size_t i = 0; i < kKinds; ++i) c.ops[i] = j.at("operations").value(kKindName[i], 0ull);
    c.bytes_verified = j.at("bytes_verified");
    c.submitted = j.at("submitted");
    c.completed = j.at("completed");
    c.failed = j.at("failed");
    c.lost = j.at("lost");
    c.errors = j.at("errors");
    c.skipped = j.at("skipped");
    return c;
  }
};

struct Config {
  std::string device;
  double seconds = 60;
  unsigned threads = 4;
  unsigned processes = 1;
  std::uint64_t seed = 0;
  bool json = false;
  int child = -1;  // >= 0: this is process `child` of a multi-process run
};

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::string queue_name(const Queue& q) {
  return q.device().uri() + " " + to_string(q.engine()) + " queue " + std::to_string(q.index());
}

// Queue has no empty() of its own: an empty handle throws.
bool claimed(const Queue& q) {
  try {
    (void)q.index();
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// ---- The shared pool of queues ----------------------------------------------------

// Every worker submits to any of these, so queues see submissions from
// several threads at once. Slots are claimed lazily: a slot emptied by a
// recycle is claimed again when its hardware queue is free again.
class Pool {
 public:
  Pool(Device dev, std::vector<Engine> engines) : dev_(std::move(dev)) {
    for (auto e : engines) slots_.push_back({e, Queue()});
  }

  // A queue of a random slot (of a compute slot when `compute`), claiming one
  // for an empty slot; nullopt when none can be had now.
  std::optional<Queue> pick(std::mt19937_64& rng, bool compute = false) {
    std::lock_guard lock(mu_);
    const std::size_t n = slots_.size();
    const std::size_t start = std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
    for (std::size_t i = 0; i < n; ++i) {
      auto& [engine, q] = slots_[(start + i) % n];
      if (compute && engine != Engine::Compute) continue;
      if (!claim(engine, q)) continue;
      return q;
    }
    return std::nullopt;
  }

  // Empties a random slot and returns its queue (the caller drops it, outside
  // the pool's lock: the last handle of a queue waits for its work).
  Queue take(std::mt19937_64& rng) {
    std::lock_guard lock(mu_);
    auto& slot = slots_[std::uniform_int_distribution<std::size_t>(0, slots_.size() - 1)(rng)];
    return std::exchange(slot.second, Queue());
  }

  // The queues of every slot, for the end of the run.
  std::vector<Queue> drain() {
    std::lock_guard lock(mu_);
    std::vector<Queue> out;
    for (auto& s : slots_) out.push_back(std::exchange(s.second, Queue()));
    return out;
  }

  std::uint64_t claims() const { return claims_.load(std::memory_order_relaxed); }

 private:
  bool claim(Engine engine, Queue& q) {
    if (!claimed(q)) {
      try {
        q = dev_.queue(engine);
        claims_.fetch_add(1, std::memory_order_relaxed);
      } catch (const Error& e) {
        if (e.status() == Status::ResourceExhausted) return false;  // its last handles are still around
        throw;
      }
    }
    return true;
  }

  Device dev_;
  std::mutex mu_;
  std::vector<std::pair<Engine, Queue>> slots_;
  std::atomic<std::uint64_t> claims_{0};
};

// ---- One process's run ---------------------------------------------------------------

struct Shared {
  Config cfg;
  unsigned process = 0;
  Device dev;
  Clock::time_point deadline;
  std::unique_ptr<Pool> pool;
  std::atomic<bool> stop{false};    // something failed: the workers stop early
  std::atomic<bool> failed{false};  // and skip the final read-back
  std::atomic<std::uint64_t> releases{0};  // queues released with work pending
  std::mutex print_mu;
  unsigned printed = 0;
  std::set<std::string> failed_queues;  // reported once each (print_mu)

  // Buffer size limits per memory kind; what the device offers.
  std::uint64_t max_device = 0, max_host_visible = 0, max_pinned = 0;
  bool host_visible = false, tensor = false, map_device = false;

  std::string who(unsigned thread) const {
    std::string s;
    if (cfg.child >= 0) s = "process " + std::to_string(process) + " ";
    return s + "thread " + std::to_string(thread);
  }

  // Prints one problem (the first 20 of a process; later ones are counted).
  void report(const std::string& line) {
    failed.store(true);
    stop.store(true);
    std::lock_guard lock(print_mu);
    if (printed++ < 20) {
      std::fprintf(stderr, "tpuhal stress: ERROR %s (seed %llu)\n", line.c_str(),
                   static_cast<unsigned long long>(cfg.seed));
    } else if (printed == 21) {
      std::fprintf(stderr, "tpuhal stress: more errors follow; counting them only\n");
    }
    std::fflush(stderr);
  }
};

// A buffer a worker owns, with the bytes it must hold and the fences of the
// work that touches it and may not have completed (at most one per queue:
// a queue runs its work in order).
struct Tracked {
  Buffer buf;
  std::vector<std::byte> model;
  std::vector<Fence> fences;
  unsigned id = 0;  // which allocation this is, for messages
  struct Touch {
    std::uint64_t op;
    Kind kind;
    std::uint64_t offset, size;
    Engine engine;
    std::uint32_t queue;  // kHost: written through the host mapping
  };
  static constexpr std::uint32_t kHost = ~0u;
  std::deque<Touch> history;  // the last writes to it

  std::uint64_t size() const { return model.size(); }
};

struct Pending {
  Fence fence;
  std::uint64_t op;
  Kind kind;
};

class Worker {
 public:
  Worker(Shared& s, unsigned index)
      : s_(s),
        index_(index),
        rng_(mix(s.cfg.seed ^ mix((std::uint64_t{s.process} << 32) | (index + 1)))) {}

  void run() {
    try {
      setup();
      loop();
    } catch (const Error& e) {
      fail(e);
    } catch (const std::exception& e) {
      s_.report(s_.who(index_) + ", operation #" + std::to_string(op_) + " (" + name_of(kind_) + ", " +
                detail_ + "): " + e.what());
      ++c_.errors;
    }
    phase_.store(1);
    finish();
    phase_.store(2);
  }

  const Counts& counts() const { return c_; }
  // For the watchdog, from another thread.
  std::string where() const {
    const std::uint64_t op = op_seen_.load();
    const int phase = phase_.load();
    if (phase == 1) return s_.who(index_) + " checking its buffers and completions after the run";
    return s_.who(index_) + " in operation #" + std::to_string(op) + " (" +
           name_of(static_cast<Kind>(kind_seen_.load())) + ")";
  }
  bool done() const { return phase_.load() == 2; }

 private:
  // -- randomness --
  std::uint64_t uniform(std::uint64_t lo, std::uint64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng_);
  }
  bool coin(unsigned percent) { return uniform(0, 99) < percent; }
  // 1..max, spread evenly over powers of two.
  std::uint64_t pick_size(std::uint64_t max) {
    if (max <= 1) return 1;
    const unsigned top = 63 - static_cast<unsigned>(__builtin_clzll(max));
    const std::uint64_t lo = std::uint64_t{1} << uniform(0, top);
    return uniform(lo, std::min(max, 2 * lo - 1));
  }
  void random_bytes(std::span<std::byte> out) {
    std::size_t i = 0;
    for (; i + 8 <= out.size(); i += 8) {
      const std::uint64_t x = rng_();
      std::memcpy(out.data() + i, &x, 8);
    }
    if (i < out.size()) {
      const std::uint64_t x = rng_();
      std::memcpy(out.data() + i, &x, out.size() - i);
    }
  }
  Kind pick_kind() {
    unsigned total = 0;
    for (std::size_t i = 0; i < kKinds; ++i) total += allowed(static_cast<Kind>(i)) ? kWeight[i] : 0;
    unsigned r = static_cast<unsigned>(uniform(0, total - 1));
    for (std::size_t i = 0; i < kKinds; ++i) {
      if (!allowed(static_cast<Kind>(i))) continue;
      if (r < kWeight[i]) return static_cast<Kind>(i);
      r -= kWeight[i];
    }
    return Kind::Fill;
  }
  bool allowed(Kind k) const { return k != Kind::Tensor || s_.tensor; }

  // -- buffers --
  Memory pick_memory() {
    const unsigned r = static_cast<unsigned>(uniform(0, 9));
    if (r < 2) return Memory::HostPinned;
    if (r < 5 && s_.host_visible) return Memory::DeviceHostVisible;
    return Memory::Device;
  }
  std::uint64_t max_for(Memory m) const {
    return m == Memory::Device ? s_.max_device : m == Memory::DeviceHostVisible ? s_.max_host_visible : s_.max_pinned;
  }
  bool mappable(const Tracked& t) const {
    return t.buf.memory() != Memory::Device || s_.map_device;
  }
  std::string describe(const Tracked& t) const {
    return "buffer " + std::to_string(t.id) + " (" + std::to_string(t.size()) + "-byte " +
           to_string(t.buf.memory()) + " buffer at " + hex(t.buf.device_address()) + ")";
  }

  // A new buffer of random kind and size, filled with a pattern.
  void allocate(Tracked& t) {
    const Memory m = pick_memory();
    const std::uint64_t size = pick_size(max_for(m));
    t.buf = s_.dev.allocate(size, m);
    t.model.assign(size, std::byte{0});
    t.fences.clear();
    t.history.clear();
    t.id = next_id_++;
    // Its contents must be known: wait for a queue (slots emptied by a
    // recycle are claimed again once the last handles of their queue go).
    const auto pattern = static_cast<std::uint32_t>(uniform(0, 255));
    const std::uint64_t skipped = c_.skipped;
    for (int tries = 0; !fill(t, 0, size, pattern, 1, Kind::Free); ++tries) {
      if (tries == 1000)
        throw Error(Status::ResourceExhausted, s_.dev.uri() + ": no queue of the pool could be claimed for 1 s");
      sweep();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    c_.skipped = skipped;
  }

  // -- fences --
  std::optional<Queue> pool_queue(bool compute = false) {
    auto q = s_.pool->pick(rng_, compute);
    if (q) cur_queue_ = *q;
    return q;
  }
  // Drops the fences of `t` that completed (a failed one throws its error).
  static void prune(Tracked& t) {
    std::erase_if(t.fences, [](const Fence& f) { return f.is_complete(); });
  }
  // The batch waits, on the device, for the work on `t` on other queues.
  void depend(Batch& b, Tracked& t) {
    prune(t);
    for (auto& f : t.fences) b.wait(f);
  }
  void touched(Tracked& t, const Fence& f) {
    const std::uint32_t q = f.queue().index();
    for (auto& g : t.fences) {
      if (g.queue().index() == q) {
        g = f;
        return;
      }
    }
    t.fences.push_back(f);
  }
  void wrote(Tracked& t, std::uint64_t offset, std::uint64_t size, const Queue& q) { wrote(t, offset, size, q, kind_); }
  void wrote(Tracked& t, std::uint64_t offset, std::uint64_t size, const Queue& q, Kind kind) {
    t.history.push_back({op_, kind, offset, size, q.engine(), q.index()});
    if (t.history.size() > 6) t.history.pop_front();
  }
  // Waits on the host for every access to `t` to complete.
  void settle(Tracked& t) {
    for (auto& f : t.fences) f.wait();
    t.fences.clear();
  }
  void submitted(const Fence& f) {
    pending_.push_back({f, op_, kind_});
    ++c_.submitted;
  }
  // Counts the completions seen and lets go of fences that completed (the
  // queues they hold can then be released); throws the error of a failed
  // submission.
  void sweep() {
    for (auto& t : own_) prune(t);
    prune(pinned_);
    prune(visible_);
    while (!pending_.empty()) {
      Pending& p = pending_.front();
      if (!p.fence.is_complete()) break;
      ++c_.completed;
      pending_.pop_front();
    }
    if (pending_.size() > 512) {  // bounds what a queue may hold for this thread
      pending_.front().fence.wait();
      sweep();
    }
  }

  // -- checking --
  // Compares `got` with t.model[offset, offset + size); reports a mismatch.
  bool compare(Tracked& t, std::uint64_t offset, std::span<const std::byte> got, const std::string& how) {
    const std::byte* want = t.model.data() + offset;
    c_.bytes_verified += got.size();
    if (std::memcmp(want, got.data(), got.size()) == 0) return true;
    std::uint64_t first = got.size(), wrong = 0;
    for (std::uint64_t i = 0; i < got.size(); ++i) {
      if (got[i] != want[i]) {
        if (first == got.size()) first = i;
        ++wrong;
      }
    }
    std::string recent;
    for (auto& h : t.history)
      recent += (recent.empty() ? "" : "; ") + std::string("#") + std::to_string(h.op) + " " + name_of(h.kind) +
                " [" + std::to_string(h.offset) + ", " + std::to_string(h.offset + h.size) + ") " +
                (h.queue == Tracked::kHost ? std::string("from the host")
                                           : std::string("on ") + to_string(h.engine) + " queue " +
                                                 std::to_string(h.queue));
    mismatch(s_.dev.uri() + ": " + describe(t) + " read back " + how + ": " + std::to_string(wrong) + " of " +
             std::to_string(got.size()) + " bytes in [" + std::to_string(offset) + ", " +
             std::to_string(offset + got.size()) + ") differ; the first at offset " +
             std::to_string(offset + first) + ": expected " +
             hex(static_cast<unsigned>(want[first])) + ", got " + hex(static_cast<unsigned>(got[first])) +
             (recent.empty() ? "" : "; its last writes: " + recent));
    return false;
  }
  void mismatch(const std::string& what) {
    ++c_.errors;
    s_.report(s_.who(index_) + ", operation #" + std::to_string(op_) + " (" + name_of(kind_) + "): " + what);
  }
  void fail(const Error& e) {
    ++c_.errors;
    std::string where = detail_;
    if (claimed(cur_queue_)) where += (where.empty() ? "" : ", ") + std::string("on ") + queue_name(cur_queue_);
    s_.report(s_.who(index_) + ", operation #" + std::to_string(op_) + " (" + name_of(kind_) +
              (where.empty() ? "" : ": " + where) + "): " + to_string(e.status()) + ": " + e.what());
  }
  // -- the run --
  void setup() {
    kind_ = Kind::Free;
    detail_ = "allocating the thread's buffers";
    for (auto& t : own_) allocate(t);
    pinned_.buf = s_.dev.allocate(std::max({s_.max_device, s_.max_host_visible, s_.max_pinned}), Memory::HostPinned);
    pinned_.model.resize(pinned_.buf.size());
    if (s_.host_visible) {
      visible_.buf = s_.dev.allocate(s_.max_host_visible, Memory::DeviceHostVisible);
      visible_.model.resize(visible_.buf.size());
    }
    if (s_.dev.properties().caps.wait_value) {
      marker_ = s_.dev.allocate(8, Memory::HostPinned);
      std::memset(marker_.map().data(), 0, 8);
    }
  }

  void loop() {
    while (!s_.stop.load(std::memory_order_relaxed)) {
      if (Clock::now() >= s_.deadline) break;
      ++op_;
      kind_ = pick_kind();
      op_seen_.store(op_, std::memory_order_relaxed);
      kind_seen_.store(static_cast<int>(kind_), std::memory_order_relaxed);
      cur_queue_ = Queue();
      detail_.clear();
      const std::uint64_t skipped = c_.skipped;
      switch (kind_) {
        case Kind::Fill: op_fill(); break;
        case Kind::Upload: op_upload(); break;
        case Kind::Download: op_download(); break;
        case Kind::Copy: op_copy(); break;
        case Kind::Tensor: op_tensor(); break;
        case Kind::HostWait: op_host_wait(); break;
        case Kind::CrossWait: op_cross_wait(); break;
        case Kind::Drop: op_drop(); break;
        case Kind::Free: op_free(); break;
        case Kind::Abandon: op_abandon(); break;
        case Kind::Release: op_release(); break;
        case Kind::Recycle: op_recycle(); break;
        case Kind::Map: op_map(); break;
        case Kind::kCount: break;
      }
      if (c_.skipped == skipped) ++c_.ops[static_cast<std::size_t>(kind_)];
      if (op_ % 4 == 0) sweep();
    }
  }

  Tracked& any_buffer() { return own_[uniform(0, own_.size() - 1)]; }

  // Returns false when no queue could be had.
  bool fill(Tracked& t, std::uint64_t offset, std::uint64_t size, std::uint32_t pattern, std::uint32_t width,
            Kind as) {
    auto q = pool_queue();
    if (!q) {
      skip();
      return false;
    }
    detail_ = "fill " + std::to_string(size) + " bytes at offset " + std::to_string(offset) + " of " + describe(t) +
              " with " + hex(pattern) + " x" + std::to_string(width);
    Batch b = q->batch();
    depend(b, t);
    b.fill(t.buf, offset, size, pattern, width);
    const Fence f = b.submit();
    submitted(f);
    touched(t, f);
    for (std::uint64_t i = 0; i < size; ++i)
      t.model[offset + i] = static_cast<std::byte>(pattern >> (8 * (i % width)));
    wrote(t, offset, size, *q, as);
    return true;
  }

  void op_fill() {
    Tracked& t = any_buffer();
    std::uint32_t width = std::array<std::uint32_t, 3>{1, 2, 4}[uniform(0, 2)];
    if (t.size() < width) width = 1;
    const std::uint64_t units = t.size() / width;
    const std::uint64_t n = pick_size(units);
    const std::uint64_t at = uniform(0, units - n);
    const std::uint32_t pattern =
        static_cast<std::uint32_t>(width == 4 ? rng_() : rng_() & ((1u << (8 * width)) - 1));
    fill(t, at * width, n * width, pattern, width, Kind::Fill);
  }

  // A staging buffer of at least `size` bytes whose earlier work is done.
  Tracked& staging(std::uint64_t size) {
    Tracked& s = s_.host_visible && size <= visible_.size() && coin(30) ? visible_ : pinned_;
    settle(s);
    return s;
  }

  void op_upload() {
    Tracked& t = any_buffer();
    const std::uint64_t n = pick_size(t.size());
    const std::uint64_t at = uniform(0, t.size() - n);
    detail_ = "upload " + std::to_string(n) + " bytes to offset " + std::to_string(at) + " of " + describe(t);
    Tracked& st = staging(n);
    const std::uint64_t from = uniform(0, st.size() - n);
    auto q = pool_queue();
    if (!q) return skip();
    detail_ = "upload " + std::to_string(n) + " bytes from offset " + std::to_string(from) + " of the " +
              to_string(st.buf.memory()) + " staging buffer to offset " + std::to_string(at) + " of " + describe(t);
    auto host = st.buf.map().subspan(from, n);
    random_bytes(host);
    Batch b = q->batch();
    depend(b, t);
    b.copy(st.buf, from, t.buf, at, n);
    const Fence f = b.submit();
    submitted(f);
    touched(t, f);
    touched(st, f);
    std::memcpy(t.model.data() + at, host.data(), n);
    wrote(t, at, n, *q);
  }

  // Reads t[at, at + n) back through a staging buffer and compares it.
  bool download(Tracked& t, std::uint64_t at, std::uint64_t n) {
    detail_ = "read back " + std::to_string(n) + " bytes at offset " + std::to_string(at) + " of " + describe(t);
    Tracked& st = staging(n);
    auto q = pool_queue();
    if (!q) {
      skip();
      return true;
    }
    detail_ = "read back " + std::to_string(n) + " bytes at offset " + std::to_string(at) + " of " + describe(t) +
              " into the " + to_string(st.buf.memory()) + " staging buffer";
    Batch b = q->batch();
    depend(b, t);
    b.copy(t.buf, at, st.buf, 0, n);
    const Fence f = b.submit();
    submitted(f);
    touched(t, f);
    f.wait();
    return compare(t, at, st.buf.map().subspan(0, n), "on " + queue_name(*q));
  }

  void op_download() {
    Tracked& t = any_buffer();
    if (coin(25)) {
      download(t, 0, t.size());
      return;
    }
    const std::uint64_t n = pick_size(t.size());
    download(t, uniform(0, t.size() - n), n);
  }

  void op_copy() {
    Tracked& src = any_buffer();
    Tracked& dst = coin(15) ? src : any_buffer();
    const std::uint64_t n = pick_size(std::min(src.size(), dst.size()));
    const std::uint64_t from = uniform(0, src.size() - n), to = uniform(0, dst.size() - n);
    auto q = pool_queue();
    if (!q) return skip();
    detail_ = "copy " + std::to_string(n) + " bytes from offset " + std::to_string(from) + " of " + describe(src) +
              " to offset " + std::to_string(to) + " of " + describe(dst);
    Batch b = q->batch();
    depend(b, src);
    if (&dst != &src) depend(b, dst);
    b.copy(src.buf, from, dst.buf, to, n);
    const Fence f = b.submit();
    submitted(f);
    touched(src, f);
    if (&dst != &src) touched(dst, f);
    std::memmove(dst.model.data() + to, src.model.data() + from, n);
    wrote(dst, to, n, *q);
  }

  // y = a op b (b broadcast along rows or not) or relu(a), on fresh buffers
  // that are freed as soon as the work is submitted: the queue keeps them
  // until it is done.
  void op_tensor() {
    auto q = pool_queue(/*compute=*/true);
    if (!q) return skip();
    const std::int64_t rows = static_cast<std::int64_t>(uniform(1, 16));
    const std::int64_t cols = static_cast<std::int64_t>(uniform(1, 64));
    const auto n = static_cast<std::uint64_t>(rows * cols);
    const unsigned which = static_cast<unsigned>(uniform(0, 3));  // add, mul, max, relu
    const char* names[] = {"add", "mul", "max", "relu"};
    const bool unary = which == 3;
    const bool broadcast = !unary && coin(50);
    const std::uint64_t nb = unary ? 0 : broadcast ? static_cast<std::uint64_t>(cols) : n;
    const std::uint64_t off_a = 4 * uniform(0, 16), off_b = 4 * uniform(0, 16), off_y = 4 * uniform(0, 16);
    detail_ = std::string(names[which]) + " of f32[" + std::to_string(rows) + ", " + std::to_string(cols) + "]" +
              (broadcast ? " and f32[" + std::to_string(cols) + "]" : "");

    // Small multiples of 1/16, never zero: sums, products and maxima are exact.
    auto value = [&] {
      const auto k = static_cast<std::int32_t>(uniform(1, 2000)) - 1001;
      return static_cast<float>(k >= 0 ? k + 1 : k) / 16.0f;
    };
    std::vector<float> a(n), bv(nb), want(n);
    for (auto& v : a) v = value();
    for (auto& v : bv) v = value();
    for (std::uint64_t i = 0; i < n; ++i) {
      const float x = a[i];
      const float y = unary ? 0.0f : bv[broadcast ? i % static_cast<std::uint64_t>(cols) : i];
      want[i] = which == 0 ? x + y : which == 1 ? x * y : which == 2 ? std::max(x, y) : std::max(x, 0.0f);
    }

    Buffer in = s_.dev.allocate((n + nb) * 4, Memory::HostPinned);
    Buffer out = s_.dev.allocate(n * 4, Memory::HostPinned);
    Buffer ba = s_.dev.allocate(off_a + n * 4);
    Buffer bb = unary ? Buffer() : s_.dev.allocate(off_b + nb * 4);
    Buffer by = s_.dev.allocate(off_y + n * 4);
    std::memcpy(in.map().data(), a.data(), n * 4);
    if (nb) std::memcpy(in.map().data() + n * 4, bv.data(), nb * 4);
    std::memset(out.map().data(), 0xFF, n * 4);
    Fence f;
    {
      const tpuhal::Tensor ta(ba, DType::F32, {rows, cols}, off_a);
      const tpuhal::Tensor ty(by, DType::F32, {rows, cols}, off_y);
      std::optional<tpuhal::Tensor> tb;
      if (!unary)
        tb.emplace(bb, DType::F32, broadcast ? std::vector<std::int64_t>{cols} : std::vector<std::int64_t>{rows, cols},
                   off_b);
      const Op op = which == 0   ? ops::add(ta, *tb, ty)
                    : which == 1 ? ops::mul(ta, *tb, ty)
                    : which == 2 ? ops::max(ta, *tb, ty)
                                 : ops::relu(ta, ty);
      Batch b = q->batch();
      b.copy(in, 0, ba, off_a, n * 4);
      if (nb) b.copy(in, n * 4, bb, off_b, nb * 4);
      b.run(op).copy(by, off_y, out, 0, n * 4);
      f = b.submit();
      submitted(f);
    }
    // Freed with the work in flight.
    in.free();
    ba.free();
    bb.free();
    by.free();
    f.wait();
    const auto got = out.map();
    c_.bytes_verified += n * 4;
    for (std::uint64_t i = 0; i < n; ++i) {
      float g;
      std::memcpy(&g, got.data() + i * 4, 4);
      if (g != want[i]) {
        mismatch(s_.dev.uri() + ": " + detail_ + " on " + queue_name(*q) + ": element " + std::to_string(i) +
                 " (byte offset " + std::to_string(i * 4) + " of y) is " + std::to_string(g) + ", expected " +
                 std::to_string(want[i]) + " (a " + std::to_string(a[i]) + ")");
        return;
      }
    }
  }

  void op_host_wait() {
    auto q = pool_queue();
    if (!q) return skip();
    const Fence f = q->last_fence();
    detail_ = "host wait for fence " + std::to_string(f.value());
    f.wait();
    if (!f.is_complete() || q->completed_value() < f.value())
      mismatch(queue_name(*q) + ": fence " + std::to_string(f.value()) + " waited for but the queue reports " +
               std::to_string(q->completed_value()));
  }

  void op_cross_wait() {
    auto qa = pool_queue();
    auto qb = s_.pool->pick(rng_);
    if (!qa || !qb) return skip();
    if (qa->index() == qb->index()) return;  // the same queue: in order anyway
    Fence fb = qb->last_fence();
    if (fb.empty()) {
      fb = qb->submit();
      submitted(fb);
    }
    Tracked& t = any_buffer();
    const std::uint64_t n = pick_size(std::min<std::uint64_t>(t.size(), 4096));
    const std::uint64_t at = uniform(0, t.size() - n);
    const auto pattern = static_cast<std::uint32_t>(uniform(0, 255));
    detail_ = "wait on the device for " + queue_name(*qb) + " fence " + std::to_string(fb.value()) +
              ", then fill " + std::to_string(n) + " bytes at offset " + std::to_string(at) + " of " + describe(t);
    Batch b = qa->batch();
    b.wait(fb);
    depend(b, t);
    b.fill(t.buf, at, n, pattern, 1);
    const Fence fa = b.submit();
    submitted(fa);
    touched(t, fa);
    std::memset(t.model.data() + at, static_cast<int>(pattern), n);
    wrote(t, at, n, *qa);
    fa.wait();
    if (!fb.is_complete())
      mismatch(queue_name(*qa) + " reached fence " + std::to_string(fa.value()) + ", which waits for " +
               queue_name(*qb) + " fence " + std::to_string(fb.value()) + ", but that fence is not complete (" +
               std::to_string(qb->completed_value()) + " reached)");
  }

  void op_drop() {
    auto q = pool_queue();
    if (!q) return skip();
    detail_ = "empty submission, fence dropped";
    // Only the bookkeeping keeps it: nothing waits for this fence.
    submitted(q->submit());
  }

  // Frees a buffer right after submitting work that reads and writes it,
  // then allocates its successor, which may reuse the memory: the old work
  // must finish with the old memory first.
  void op_free() {
    const std::size_t i = uniform(0, own_.size() - 1), j = (i + 1 + uniform(0, own_.size() - 2)) % own_.size();
    Tracked& t = own_[i];
    Tracked& other = own_[j];
    auto q = pool_queue();
    if (!q) return skip();
    const std::uint64_t n = pick_size(std::min(t.size(), other.size()));
    const std::uint64_t from = uniform(0, t.size() - n), to = uniform(0, other.size() - n);
    detail_ = "copy " + std::to_string(n) + " bytes from offset " + std::to_string(from) + " of " + describe(t) +
              " to offset " + std::to_string(to) + " of " + describe(other) + ", fill the first, free it";
    Batch b = q->batch();
    depend(b, t);
    depend(b, other);
    b.copy(t.buf, from, other.buf, to, n).fill(t.buf, 0, t.size(), 0xEE);
    const Fence f = b.submit();
    submitted(f);
    touched(other, f);
    std::memcpy(other.model.data() + to, t.model.data() + from, n);
    wrote(other, to, n, *q);
    t.buf.free();
    allocate(t);
  }

  void op_abandon() {
    Tracked& t = any_buffer();
    auto q = pool_queue();
    if (!q) return skip();
    detail_ = "record a fill and a copy into " + describe(t) + " and drop the batch unsubmitted";
    Batch b = q->batch();
    b.fill(t.buf, 0, t.size(), 0xAB).copy(pinned_.buf, 0, t.buf, 0, std::min(t.size(), pinned_.size()));
    // Destroyed here: nothing reaches the device; the model stays as it was.
  }

  // Claims a queue of its own, submits work to it, and releases it with the
  // work still pending: releasing waits for that work, which is then read
  // back and checked.
  void op_release() {
    static constexpr Engine kEngines[] = {Engine::Compute, Engine::Copy, Engine::Video};
    Queue q;
    const std::size_t first = uniform(0, 2);
    for (std::size_t i = 0; i < 3 && !claimed(q); ++i) {
      try {
        q = s_.dev.queue(kEngines[(first + i) % 3]);
      } catch (const Error& e) {
        if (e.status() != Status::ResourceExhausted && e.status() != Status::Unsupported) throw;
      }
    }
    if (!claimed(q)) return skip();
    cur_queue_ = q;
    struct Range {
      Tracked* t;
      std::uint64_t at, n;
    };
    std::vector<Range> written;
    const unsigned batches = static_cast<unsigned>(uniform(1, 3));
    detail_ = std::to_string(batches) + " batches on a queue released with them pending";
    for (unsigned k = 0; k < batches; ++k) {
      Tracked& t = any_buffer();
      Batch b = q.batch();
      depend(b, t);
      const std::uint64_t n = pick_size(t.size());
      const std::uint64_t at = uniform(0, t.size() - n);
      if (coin(50)) {
        const auto pattern = static_cast<std::uint32_t>(uniform(0, 255));
        b.fill(t.buf, at, n, pattern, 1);
        std::memset(t.model.data() + at, static_cast<int>(pattern), n);
      } else {
        Tracked& src = any_buffer();
        const std::uint64_t m = std::min(n, src.size());
        const std::uint64_t from = uniform(0, src.size() - m);
        if (&src != &t) depend(b, src);
        b.copy(src.buf, from, t.buf, at, m);
        std::memmove(t.model.data() + at, src.model.data() + from, m);
        // Later writes to the source must wait for this read; the queue
        // is gone by then, so its release is the wait.
      }
      // The last batch says that it ran: a failure of work on a released
      // queue has no one to report to.
      if (k + 1 == batches && marker_.valid()) b.write_value(marker_, 0, op_);
      (void)b.submit();  // fence dropped
      ++c_.submitted;
      wrote(t, at, n, q);
      written.push_back({&t, at, n});
    }
    const std::string name = queue_name(q);
    q = Queue();  // released with its work pending: this waits for it
    cur_queue_ = Queue();
    s_.releases.fetch_add(1, std::memory_order_relaxed);
    if (marker_.valid()) {
      std::uint64_t seen;
      std::memcpy(&seen, marker_.map().data(), 8);
      if (seen != op_) {
        c_.failed += batches;
        mismatch(name + ": released with " + std::to_string(batches) +
                 " batch(es) pending, but the last one did not run before the release returned (its marker "
                 "reads " + std::to_string(seen) + "): the queue failed or was aborted, and the release said nothing");
        return;
      }
    }
    // Its work is done: read back what it wrote (a read-back skipped for
    // want of a queue does not make the release a skipped operation).
    const std::uint64_t skipped = c_.skipped;
    bool ok = true;
    for (auto& r : written) ok = download(*r.t, r.at, std::min(r.n, r.t->size() - r.at)) && ok;
    c_.skipped = skipped;
    if (ok) c_.completed += batches;
  }

  // Takes a queue out of the pool right after giving it work and drops this
  // thread's handle; whoever holds the last one releases it, and the slot
  // claims a new queue once the hardware queue is free.
  void op_recycle() {
    Queue q = s_.pool->take(rng_);
    if (!claimed(q)) return skip();
    cur_queue_ = q;
    Tracked& t = any_buffer();
    const std::uint64_t n = pick_size(t.size());
    const std::uint64_t at = uniform(0, t.size() - n);
    const auto pattern = static_cast<std::uint32_t>(uniform(0, 255));
    detail_ = "fill " + std::to_string(n) + " bytes at offset " + std::to_string(at) + " of " + describe(t) +
              ", then take the queue out of the pool";
    Batch b = q.batch();
    depend(b, t);
    b.fill(t.buf, at, n, pattern, 1);
    const Fence f = b.submit();
    submitted(f);
    touched(t, f);
    std::memset(t.model.data() + at, static_cast<int>(pattern), n);
    wrote(t, at, n, q);
    cur_queue_ = Queue();
  }

  void op_map() {
    Tracked* t = nullptr;
    for (std::size_t tries = 0; tries < own_.size() && !t; ++tries) {
      Tracked& c = any_buffer();
      if (mappable(c)) t = &c;
    }
    if (!t) return skip();
    detail_ = "check " + describe(*t) + " through its host mapping";
    settle(*t);
    auto view = t->buf.map();
    if (!compare(*t, 0, view, "through its host mapping")) return;
    if (coin(50)) {  // and write part of it from the host
      const std::uint64_t n = pick_size(t->size());
      const std::uint64_t at = uniform(0, t->size() - n);
      random_bytes(view.subspan(at, n));
      std::memcpy(t->model.data() + at, view.data() + at, n);
      t->history.push_back({op_, kind_, at, n, Engine::Compute, Tracked::kHost});
      if (t->history.size() > 6) t->history.pop_front();
    }
  }

  void skip() { ++c_.skipped; }

  // After the run: every buffer read back whole, every submission seen
  // complete (bounded by the wait timeout), everything released.
  void finish() {
    const bool check = !s_.failed.load();
    kind_ = Kind::Download;
    if (check) {
      try {
        for (auto& t : own_) {
          ++op_;
          detail_ = "final read-back of " + describe(t);
          if (!download(t, 0, t.size())) break;
        }
      } catch (const Error& e) {
        fail(e);
      }
    }
    std::set<std::uint32_t> stuck;  // queues a wait timed out on
    for (auto& p : pending_) {
      const std::uint32_t qi = p.fence.queue().index();
      if (stuck.count(qi)) {
        ++c_.lost;
        continue;
      }
      try {
        p.fence.wait();
        ++c_.completed;
      } catch (const Error& e) {
        const bool timeout = e.status() == Status::Timeout;
        ++(timeout ? c_.lost : c_.failed);
        if (timeout) stuck.insert(qi);
        report_once(p, e);
      }
    }
    pending_.clear();
    for (auto& t : own_) t.fences.clear();
    pinned_.fences.clear();
    visible_.fences.clear();
    cur_queue_ = Queue();
    own_ = {};
    pinned_ = Tracked();
    visible_ = Tracked();
    marker_ = Buffer();
  }

  // A submission that failed or never completed: reported once per queue.
  void report_once(const Pending& p, const Error& e) {
    const std::string q = queue_name(p.fence.queue());
    {
      std::lock_guard lock(s_.print_mu);
      if (!s_.failed_queues.insert(q).second) return;
    }
    ++c_.errors;
    s_.report(s_.who(index_) + ": submission " + std::to_string(p.fence.value()) + " on " + q + " (operation #" +
              std::to_string(p.op) + ", " + name_of(p.kind) + ") " +
              (e.status() == Status::Timeout ? "did not complete" : "failed") + ": " + to_string(e.status()) +
              ": " + e.what());
  }

  Shared& s_;
  const unsigned index_;
  std::mt19937_64 rng_;
  Counts c_;
  std::uint64_t op_ = 0;
  Kind kind_ = Kind::Fill;
  std::string detail_;
  Queue cur_queue_;
  unsigned next_id_ = 0;
  std::array<Tracked, 4> own_;
  Tracked pinned_, visible_;  // staging buffers
  Buffer marker_;             // where a released queue's last batch writes its operation number
  std::deque<Pending> pending_;
  std::atomic<std::uint64_t> op_seen_{0};
  std::atomic<int> kind_seen_{0};
  std::atomic<int> phase_{0};  // 0 running, 1 finishing, 2 done
};

struct Outcome {
  Counts counts;
  std::string uri, board;
  double seconds = 0;
  std::uint64_t queue_claims = 0, releases = 0;
  bool memory_ok = true;
  std::string memory;  // what the memory check found
};

nlohmann::json outcome_json(const Outcome& o) {
  auto j = o.counts.to_json();
  j["device"] = o.uri;
  j["board"] = o.board;
  j["seconds"] = o.seconds;
  j["queue_claims"] = o.queue_claims;
  j["queues_released_with_work_pending"] = o.releases;
  j["memory_ok"] = o.memory_ok;
  j["memory"] = o.memory;
  return j;
}

std::string heap_text(const MemoryStats& m) {
  std::string s;
  for (auto& h : m.heaps)
    s += (s.empty() ? "" : ", ") + std::string("heap '") + h.name + "' " + bytes(h.used) + " in " +
         std::to_string(h.allocations) + " allocation(s)";
  return s + ", pinned host " + bytes(m.host_pinned_bytes) + " in " + std::to_string(m.host_pinned_allocations) +
         " allocation(s)";
}

bool same_memory(const MemoryStats& a, const MemoryStats& b) {
  if (a.device_used != b.device_used || a.host_pinned_bytes != b.host_pinned_bytes ||
      a.host_pinned_allocations != b.host_pinned_allocations || a.imported_bytes != b.imported_bytes ||
      a.heaps.size() != b.heaps.size())
    return false;
  for (std::size_t i = 0; i < a.heaps.size(); ++i)
    if (a.heaps[i].used != b.heaps[i].used || a.heaps[i].allocations != b.heaps[i].allocations) return false;
  return true;
}

// The pool's slots: every hardware queue but one, so that a worker can
// claim one of its own (Kind::Release).
std::vector<Engine> pool_slots(const Properties& p) {
  std::vector<Engine> slots;
  std::size_t most = 0, total = 0;
  for (auto& e : p.engines) {
    total += e.queues;
    if (e.queues > most) most = e.queues;
  }
  bool spared = total < 2;
  for (auto& e : p.engines) {
    std::uint32_t n = e.queues;
    if (!spared && n == most && n > 1) {
      --n;
      spared = true;
    }
    for (std::uint32_t i = 0; i < n; ++i) slots.push_back(e.engine);
  }
  return slots;
}

std::uint64_t clamp_size(std::uint64_t v, std::uint64_t lo, std::uint64_t hi) {
  return std::max(lo, std::min(hi, v));
}

// One process's share: opens the device, runs the workers until the
// deadline, checks their completions and the device's memory.
Outcome run_process(const Config& cfg, unsigned process) {
  Shared s;
  s.cfg = cfg;
  s.process = process;
  s.dev = open(cfg.device);
  const Properties& p = s.dev.properties();
  Outcome out;
  out.uri = s.dev.uri();
  out.board = p.board;
  const MemoryStats before = s.dev.memory_stats();

  // Sizes: each worker holds about six buffers; keep all of them, in every
  // process, within a sixteenth of each heap.
  const std::uint64_t share = std::uint64_t{cfg.threads} * cfg.processes * 16;
  for (auto& h : p.heaps) {
    if (h.memory == Memory::Device && h.is_default) s.max_device = clamp_size(h.size / share, 4096, 1 << 20);
    if (h.memory == Memory::DeviceHostVisible && h.is_default)
      s.max_host_visible = clamp_size(h.size / share, 4096, 256 << 10);
  }
  if (!s.max_device) s.max_device = 64 << 10;
  s.max_pinned = 1 << 20;
  s.host_visible = p.caps.host_visible_device_memory && s.max_host_visible > 0;
  s.tensor = p.caps.tensor && std::find(p.dtypes.begin(), p.dtypes.end(), DType::F32) != p.dtypes.end();
  s.map_device = p.caps.map_device_memory;
  s.pool = std::make_unique<Pool>(s.dev, pool_slots(p));

  const auto start = Clock::now();
  s.deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(cfg.seconds));
  std::vector<std::unique_ptr<Worker>> workers;
  for (unsigned t = 0; t < cfg.threads; ++t) workers.push_back(std::make_unique<Worker>(s, t));
  std::mutex done_mu;
  std::condition_variable done_cv;
  unsigned done = 0;
  std::vector<std::thread> threads;
  for (auto& w : workers) {
    threads.emplace_back([&, wp = w.get()] {
      wp->run();
      std::lock_guard lock(done_mu);
      ++done;
      done_cv.notify_all();
    });
  }
  // Bounded: every wait a worker makes ends within the wait timeout; a run
  // that does not end well after that is reported as hung, with where each
  // worker is.
  const auto timeout = s.dev.wait_policy().timeout;
  const auto limit = s.deadline + 6 * timeout + std::chrono::seconds(30);
  {
    std::unique_lock lock(done_mu);
    if (!done_cv.wait_until(lock, limit, [&] { return done == workers.size(); })) {
      std::string stuck;
      for (auto& w : workers)
        if (!w->done()) stuck += "\n  " + w->where();
      std::fprintf(stderr,
                   "tpuhal stress: ERROR %s: the run did not end %.0f s after its deadline (seed %llu); still "
                   "running:%s\n",
                   s.dev.uri().c_str(), std::chrono::duration<double>(limit - s.deadline).count(),
                   static_cast<unsigned long long>(cfg.seed), stuck.c_str());
      std::fflush(stderr);
      std::_Exit(1);  // the stuck threads cannot be joined
    }
  }
  for (auto& t : threads) t.join();
  for (auto& w : workers) out.counts.add(w->counts());
  out.queue_claims = s.pool->claims();
  out.releases = s.releases.load();
  s.pool->drain();  // the last queue handles go here
  s.pool.reset();
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();

  const MemoryStats after = s.dev.memory_stats();
  out.memory_ok = same_memory(before, after);
  if (out.memory_ok) {
    out.memory = "back to where it started: " + heap_text(after);
  } else {
    out.memory = "did not return to where it started: before " + heap_text(before) + "; after " + heap_text(after);
    ++out.counts.errors;
    s.report(s.dev.uri() + ": device memory " + out.memory);
  }
  return out;
}

// ---- Several processes ------------------------------------------------------------------

struct Child {
  pid_t pid = -1;
  int fd = -1;
  std::string output;
  int status = 0;
  bool exited = false;
};

// Starts process `index`: this program again, with the hidden --child flag,
// its standard output (one JSON object) into a pipe.
Child spawn_child(const Config& cfg, unsigned index) {
  int fds[2];
  if (::pipe(fds) != 0) throw Error(Status::Internal, std::string("stress: pipe: ") + std::strerror(errno));
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%g", cfg.seconds);
  std::vector<std::string> args = {"tpuhal",    "stress",         "--device", cfg.device,
                                   "--seconds", seconds,          "--threads", std::to_string(cfg.threads),
                                   "--seed",    std::to_string(cfg.seed), "--processes", std::to_string(cfg.processes),
                                   "--child",   std::to_string(index)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addclose(&fa, fds[1]);
  Child c;
  const int rc = posix_spawn(&c.pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    throw Error(Status::Internal, std::string("stress: starting process ") + std::to_string(index) + ": " +
                                      std::strerror(rc));
  }
  c.fd = fds[0];
  return c;
}

// Runs the processes, collects their summaries. Returns false on a problem
// with a process itself (it died, hung or printed no summary).
bool run_children(const Config& cfg, std::vector<Outcome>& outcomes) {
  std::vector<Child> children;
  for (unsigned i = 0; i < cfg.processes; ++i) children.push_back(spawn_child(cfg, i));
  // Each process bounds its own run; this bounds a process that does not.
  const auto limit = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(cfg.seconds + 600));
  bool ok = true;
  for (;;) {
    std::vector<pollfd> fds;
    for (auto& c : children)
      if (c.fd >= 0) fds.push_back({c.fd, POLLIN, 0});
    if (fds.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(limit - Clock::now()).count();
    if (left <= 0) break;
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(left, 1000))) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (auto& c : children) {
      const auto ready = std::find_if(fds.begin(), fds.end(), [&](const pollfd& p) { return p.fd == c.fd; });
      if (c.fd < 0 || ready == fds.end() || !ready->revents) continue;
      char buf[4096];
      const ssize_t n = ::read(c.fd, buf, sizeof buf);
      if (n > 0) {
        c.output.append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(c.fd);
        c.fd = -1;
      }
    }
  }
  for (std::size_t i = 0; i < children.size(); ++i) {
    auto& c = children[i];
    if (c.fd >= 0) {
      std::fprintf(stderr, "tpuhal stress: ERROR process %zu did not finish in time (seed %llu); stopping it\n", i,
                   static_cast<unsigned long long>(cfg.seed));
      ::kill(c.pid, SIGKILL);
      ::close(c.fd);
      ok = false;
    }
    ::waitpid(c.pid, &c.status, 0);
    const bool clean = WIFEXITED(c.status) && (WEXITSTATUS(c.status) == 0 || WEXITSTATUS(c.status) == 1);
    auto j = nlohmann::json::parse(c.output, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      std::fprintf(stderr, "tpuhal stress: ERROR process %zu %s without a summary (seed %llu)\n", i,
                   WIFSIGNALED(c.status) ? ("was killed by signal " + std::to_string(WTERMSIG(c.status))).c_str()
                                         : ("exited with status " + std::to_string(WEXITSTATUS(c.status))).c_str(),
                   static_cast<unsigned long long>(cfg.seed));
      ok = false;
      continue;
    }
    if (!clean) ok = false;
    Outcome o;
    o.counts = Counts::from_json(j);
    o.uri = j.value("device", "");
    o.board = j.value("board", "");
    o.seconds = j.value("seconds", 0.0);
    o.queue_claims = j.value("queue_claims", 0ull);
    o.releases = j.value("queues_released_with_work_pending", 0ull);
    o.memory_ok = j.value("memory_ok", false);
    o.memory = j.value("memory", "");
    outcomes.push_back(o);
  }
  return ok;
}

double rate(double n, double seconds) { return seconds > 0 ? n / seconds : 0; }

}  // namespace

int cmd_stress(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("device,d", po::value<std::string>()->default_value("sim:0"), "device URI")(
      "seconds", po::value<double>()->default_value(60), "how long to run (then every check still runs)")(
      "threads", po::value<unsigned>()->default_value(4), "worker threads per process")(
      "processes", po::value<unsigned>()->default_value(1), "processes, each with its own handle on the device")(
      "seed", po::value<std::uint64_t>(), "random seed (default: a new one, printed)")(
      "json", "print the summary as one JSON object");
  po::options_description hidden;
  hidden.add_options()("child", po::value<int>(), "");
  po::variables_map vm;
  int rc = 0;
  if (!parse(args, opts, hidden, {}, vm,
             "Usage: tpuhal stress [--device URI] [--seconds N] [--threads N] [--processes N] [--seed N] [--json]\n\n"
             "A soak test. Each worker thread draws random operations from a seeded generator until\n"
             "the time is up: fills, host->device and device->host copies (through pinned and\n"
             "host-visible staging buffers), device->device copies (overlapping ones included),\n"
             "add/mul/max/relu on small f32 tensors checked on the host, host waits on any queue's\n"
             "fence, device waits on another queue's fence (cross-queue), empty submissions whose\n"
             "fences are dropped, buffers freed while work on them is in flight, batches recorded and\n"
             "dropped unsubmitted, queues released with work pending, and queues taken out of the\n"
             "shared pool with work on them. The threads share a pool of the device's queues, so\n"
             "queues see submissions from several threads. Work that touches a buffer waits on the\n"
             "device for earlier work on it from other queues.\n\n"
             "Every byte the device writes is checked against a host-side model (by reading it back,\n"
             "or through the buffer's host mapping), at random during the run and for every buffer at\n"
             "the end; every submission must complete; after the run, device memory must be where it\n"
             "started. With --processes N, N copies of this program run the same workload, each with\n"
             "its own handle on the device and its own share of the seed, and report to this one.\n\n"
             "A problem is printed as it is found, with the seed, process, thread, operation and\n"
             "offset; the run then stops and the exit status is 1. Each run's time is bounded: waits\n"
             "end within the wait timeout (TPUHAL_TIMEOUT), and a run that still does not end is\n"
             "reported with where each thread is. The same --seed, --threads and --processes replay\n"
             "the same random choices; the timing, and so the interleaving, differs.",
             &rc))
    return rc;
  Config cfg;
  cfg.device = vm["device"].as<std::string>();
  cfg.seconds = vm["seconds"].as<double>();
  cfg.threads = vm["threads"].as<unsigned>();
  cfg.processes = vm["processes"].as<unsigned>();
  cfg.json = vm.count("json") != 0;
  if (vm.count("child")) cfg.child = vm["child"].as<int>();
  if (!(cfg.seconds > 0) || cfg.seconds > 7 * 24 * 3600) {
    std::fprintf(stderr, "tpuhal stress: --seconds must be above 0 (and at most a week), got %g\n", cfg.seconds);
    return 2;
  }
  if (cfg.threads < 1 || cfg.threads > 256 || cfg.processes < 1 || cfg.processes > 64) {
    std::fprintf(stderr, "tpuhal stress: --threads must be 1 to 256 and --processes 1 to 64 (got %u and %u)\n",
                 cfg.threads, cfg.processes);
    return 2;
  }
  cfg.seed = vm.count("seed") ? vm["seed"].as<std::uint64_t>()
                              : (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();

  if (cfg.child >= 0) {  // one process of a multi-process run: the summary goes to the parent
    const Outcome o = run_process(cfg, static_cast<unsigned>(cfg.child));
    std::printf("%s\n", outcome_json(o).dump().c_str());
    const auto& c = o.counts;
    return c.errors || c.failed || c.lost || !o.memory_ok ? 1 : 0;
  }

  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%g", cfg.seconds);
  std::fprintf(cfg.json ? stderr : stdout,
               "tpuhal stress: %s, %u thread(s) x %u process(es), %s s, seed %llu\n"
               "  replay: tpuhal stress --device %s --seconds %s --threads %u --processes %u --seed %llu\n",
               cfg.device.c_str(), cfg.threads, cfg.processes, seconds, static_cast<unsigned long long>(cfg.seed),
               cfg.device.c_str(), seconds, cfg.threads, cfg.processes, static_cast<unsigned long long>(cfg.seed));
  std::fflush(cfg.json ? stderr : stdout);

  std::vector<Outcome> outcomes;
  bool processes_ok = true;
  const auto start = Clock::now();
  if (cfg.processes == 1) {
    outcomes.push_back(run_process(cfg, 0));
  } else {
    processes_ok = run_children(cfg, outcomes);
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();

  Counts total;
  std::uint64_t claims = 0, releases = 0;
  bool memory_ok = true;
  for (auto& o : outcomes) {
    total.add(o.counts);
    claims += o.queue_claims;
    releases += o.releases;
    memory_ok = memory_ok && o.memory_ok;
  }
  if (!processes_ok) ++total.errors;
  const bool passed = processes_ok && memory_ok && !total.errors && !total.failed && !total.lost &&
                      outcomes.size() == cfg.processes && total.completed == total.submitted;
  const std::string uri = outcomes.empty() ? cfg.device : outcomes.front().uri;

  if (cfg.json) {
    auto j = total.to_json();
    j["device"] = uri;
    j["board"] = outcomes.empty() ? "" : outcomes.front().board;
    j["seed"] = cfg.seed;
    j["seconds"] = elapsed;
    j["threads"] = cfg.threads;
    j["processes"] = cfg.processes;
    j["queue_claims"] = claims;
    j["queues_released_with_work_pending"] = releases;
    j["memory_ok"] = memory_ok;
    j["passed"] = passed;
    auto per = nlohmann::json::array();
    for (auto& o : outcomes) per.push_back(outcome_json(o));
    j["per_process"] = per;
    std::printf("%s\n", j.dump(2).c_str());
    return passed ? 0 : 1;
  }

  std::printf("%s: %s\n", uri.c_str(), outcomes.empty() ? "" : outcomes.front().board.c_str());
  std::printf("  %-12s %12s %10s\n", "operation", "count", "per second");
  for (std::size_t i = 0; i < kKinds; ++i)
    std::printf("  %-12s %12llu %10.0f\n", kKindName[i], static_cast<unsigned long long>(total.ops[i]),
                rate(static_cast<double>(total.ops[i]), elapsed));
  std::printf("  skipped %llu (no queue free at that moment)\n", static_cast<unsigned long long>(total.skipped));
  std::printf("  bytes verified: %s (%s/s)\n", bytes(total.bytes_verified).c_str(),
              bytes(static_cast<std::uint64_t>(rate(static_cast<double>(total.bytes_verified), elapsed))).c_str());
  std::printf("  submissions: %llu; completed %llu, failed %llu, lost %llu\n",
              static_cast<unsigned long long>(total.submitted), static_cast<unsigned long long>(total.completed),
              static_cast<unsigned long long>(total.failed), static_cast<unsigned long long>(total.lost));
  std::printf("  queues: %llu claimed for the shared pool, %llu released with work pending\n",
              static_cast<unsigned long long>(claims), static_cast<unsigned long long>(releases));
  for (std::size_t i = 0; i < outcomes.size(); ++i)
    std::printf("  device memory%s: %s\n", cfg.processes > 1 ? (" (process " + std::to_string(i) + ")").c_str() : "",
                outcomes[i].memory.c_str());
  std::printf("%s: %llu operations in %.1f s (%.0f/s), %s verified, %llu/%llu completions, %llu errors (seed %llu)\n",
              passed ? "PASSED" : "FAILED", static_cast<unsigned long long>(total.operations()), elapsed,
              rate(static_cast<double>(total.operations()), elapsed), bytes(total.bytes_verified).c_str(),
              static_cast<unsigned long long>(total.completed), static_cast<unsigned long long>(total.submitted),
              static_cast<unsigned long long>(total.errors),
              static_cast<unsigned long long>(cfg.seed));
  return passed ? 0 : 1;
}

}  // namespace tpuhal::cli
