// tpuhal stress: one process's workers. The pool of queues they share, the
// buffers each tracks with the bytes they must hold, and the Worker: its
// operations are in stress_ops.cpp, its checks in stress_check.cpp.
#pragma once

#include <array>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "stress.h"
#include "tpuhal/base/hex.h"
#include "tpuhal/tpuhal.hpp"

namespace tpuhal::cli::stress {

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline std::string queue_name(const Queue& q) {
  return q.device().uri() + " " + to_string(q.engine()) + " queue " + std::to_string(q.index());
}

// Queue has no empty() of its own: an empty handle throws.
inline bool claimed(const Queue& q) {
  try {
    (void)q.index();
    return true;
  } catch (const Error&) {
    return false;
  }
}

// ---- The shared pool of queues ----------------------------------------------------

// Every worker submits to any of these, so queues see submissions from
// several threads at once. Slots are claimed lazily: a slot emptied by a
// recycle is claimed again when its hardware queue is free again.
class Pool {
 public:
  Pool(Device dev, std::vector<Engine> engines);

  // A queue of a random slot (of a compute slot when `compute`), claiming one
  // for an empty slot; nullopt when none can be had now.
  std::optional<Queue> pick(std::mt19937_64& rng, bool compute = false);

  // Empties a random slot and returns its queue (the caller drops it, outside
  // the pool's lock: the last handle of a queue waits for its work).
  Queue take(std::mt19937_64& rng);

  // The queues of every slot, for the end of the run.
  std::vector<Queue> drain();

  std::uint64_t claims() const { return claims_.load(std::memory_order_relaxed); }

 private:
  bool claim(Engine engine, Queue& q);

  Device dev_;
  std::mutex mu_;
  std::vector<std::pair<Engine, Queue>> slots_;
  std::atomic<std::uint64_t> claims_{0};
};

// ---- A process's workers ---------------------------------------------------------

struct Shared {
  Config cfg;
  unsigned process = 0;
  Device dev;
  Clock::time_point deadline;
  std::unique_ptr<Pool> pool;
  std::atomic<bool> stop{false};           // something failed: the workers stop early
  std::atomic<bool> failed{false};         // and skip the final read-back
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
  void report(const std::string& line);
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
      : s_(s), index_(index), rng_(mix(s.cfg.seed ^ mix((std::uint64_t{s.process} << 32) | (index + 1)))) {}

  void run();

  const Counts& counts() const { return c_; }
  // For the watchdog, from another thread.
  std::string where() const;
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

  // -- small helpers --
  bool allowed(Kind k) const { return k != Kind::Tensor || s_.tensor; }
  bool mappable(const Tracked& t) const { return t.buf.memory() != Memory::Device || s_.map_device; }
  std::uint64_t max_for(Memory m) const {
    return m == Memory::Device ? s_.max_device : m == Memory::DeviceHostVisible ? s_.max_host_visible : s_.max_pinned;
  }
  Tracked& any_buffer() { return own_[uniform(0, own_.size() - 1)]; }
  void skip() { ++c_.skipped; }

  // -- the workload (stress_ops.cpp) --
  void setup();
  void loop();
  Kind pick_kind();
  Memory pick_memory();
  std::string describe(const Tracked& t) const;
  // A new buffer of random kind and size, filled with a pattern.
  void allocate(Tracked& t);
  std::optional<Queue> pool_queue(bool compute = false);
  // Returns false when no queue could be had.
  bool fill(Tracked& t, std::uint64_t offset, std::uint64_t size, std::uint32_t pattern, std::uint32_t width, Kind as);
  // A staging buffer of at least `size` bytes whose earlier work is done.
  Tracked& staging(std::uint64_t size);
  // Reads t[at, at + n) back through a staging buffer and compares it.
  bool download(Tracked& t, std::uint64_t at, std::uint64_t n);
  void op_fill();
  void op_upload();
  void op_download();
  void op_copy();
  // y = a op b (b broadcast along rows or not) or relu(a), on fresh buffers
  // that are freed as soon as the work is submitted: the queue keeps them
  // until it is done.
  void op_tensor();
  void op_host_wait();
  void op_cross_wait();
  void op_drop();
  // Frees a buffer right after submitting work that reads and writes it,
  // then allocates its successor, which may reuse the memory: the old work
  // must finish with the old memory first.
  void op_free();
  void op_abandon();
  // Claims a queue of its own, submits work to it, and releases it with the
  // work still pending: releasing waits for that work, which is then read
  // back and checked.
  void op_release();
  // Takes a queue out of the pool right after giving it work and drops this
  // thread's handle; whoever holds the last one releases it, and the slot
  // claims a new queue once the hardware queue is free.
  void op_recycle();
  void op_map();

  // -- fences (stress_check.cpp) --
  // Drops the fences of `t` that completed (a failed one throws its error).
  static void prune(Tracked& t);
  // The batch waits, on the device, for the work on `t` on other queues.
  void depend(Batch& b, Tracked& t);
  void touched(Tracked& t, const Fence& f);
  void wrote(Tracked& t, std::uint64_t offset, std::uint64_t size, const Queue& q) { wrote(t, offset, size, q, kind_); }
  void wrote(Tracked& t, std::uint64_t offset, std::uint64_t size, const Queue& q, Kind kind);
  // Waits on the host for every access to `t` to complete.
  void settle(Tracked& t);
  void submitted(const Fence& f);
  // Counts the completions seen and lets go of fences that completed (the
  // queues they hold can then be released); throws the error of a failed
  // submission.
  void sweep();

  // -- checking (stress_check.cpp) --
  // Compares `got` with t.model[offset, offset + size); reports a mismatch.
  bool compare(Tracked& t, std::uint64_t offset, std::span<const std::byte> got, const std::string& how);
  void mismatch(const std::string& what);
  void fail(const Error& e);
  // After the run: every buffer read back whole, every submission seen
  // complete (bounded by the wait timeout), everything released.
  void finish();
  // A submission that failed or never completed: reported once per queue.
  void report_once(const Pending& p, const Error& e);

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

// The device's memory accounting, compared before and after a run
// (stress_check.cpp).
std::string heap_text(const MemoryStats& m);
bool same_memory(const MemoryStats& a, const MemoryStats& b);

}  // namespace tpuhal::cli::stress
