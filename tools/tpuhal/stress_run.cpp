// tpuhal stress: one process's run. The shared pool of queues, the buffer
// limits drawn from the device's heaps, the worker threads and the watchdog
// that bounds them, and the device's memory before and after.
#include <algorithm>
#include <condition_variable>
#include <thread>

#include "stress_worker.h"

namespace tpuhal::cli::stress {

Pool::Pool(Device dev, std::vector<Engine> engines) : dev_(std::move(dev)) {
  for (auto e : engines) slots_.push_back({e, Queue()});
}

std::optional<Queue> Pool::pick(std::mt19937_64& rng, bool compute) {
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

Queue Pool::take(std::mt19937_64& rng) {
  std::lock_guard lock(mu_);
  auto& slot = slots_[std::uniform_int_distribution<std::size_t>(0, slots_.size() - 1)(rng)];
  return std::exchange(slot.second, Queue());
}

std::vector<Queue> Pool::drain() {
  std::lock_guard lock(mu_);
  std::vector<Queue> out;
  for (auto& s : slots_) out.push_back(std::exchange(s.second, Queue()));
  return out;
}

bool Pool::claim(Engine engine, Queue& q) {
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

namespace {

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

std::uint64_t clamp_size(std::uint64_t v, std::uint64_t lo, std::uint64_t hi) { return std::max(lo, std::min(hi, v)); }

}  // namespace

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
}  // namespace tpuhal::cli::stress
