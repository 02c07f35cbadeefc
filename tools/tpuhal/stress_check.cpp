// tpuhal stress: the checks. The fences each buffer waits on, completions
// counted as they are seen, reads compared with the model, problems reported
// with where they were found, and what every worker checks after the run.
#include <cstring>

#include "cli.h"
#include "stress_worker.h"

namespace tpuhal::cli::stress {

void Shared::report(const std::string& line) {
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

std::string Worker::where() const {
  const std::uint64_t op = op_seen_.load();
  const int phase = phase_.load();
  if (phase == 1) return s_.who(index_) + " checking its buffers and completions after the run";
  return s_.who(index_) + " in operation #" + std::to_string(op) + " (" +
         name_of(static_cast<Kind>(kind_seen_.load())) + ")";
}

void Worker::prune(Tracked& t) {
  std::erase_if(t.fences, [](const Fence& f) { return f.is_complete(); });
}

void Worker::depend(Batch& b, Tracked& t) {
  prune(t);
  for (auto& f : t.fences) b.wait(f);
}

void Worker::touched(Tracked& t, const Fence& f) {
  const std::uint32_t q = f.queue().index();
  for (auto& g : t.fences) {
    if (g.queue().index() == q) {
      g = f;
      return;
    }
  }
  t.fences.push_back(f);
}

void Worker::wrote(Tracked& t, std::uint64_t offset, std::uint64_t size, const Queue& q, Kind kind) {
  t.history.push_back({op_, kind, offset, size, q.engine(), q.index()});
  if (t.history.size() > 6) t.history.pop_front();
}

void Worker::settle(Tracked& t) {
  for (auto& f : t.fences) f.wait();
  t.fences.clear();
}

void Worker::submitted(const Fence& f) {
  pending_.push_back({f, op_, kind_});
  ++c_.submitted;
}

void Worker::sweep() {
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

bool Worker::compare(Tracked& t, std::uint64_t offset, std::span<const std::byte> got, const std::string& how) {
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
    recent +=
        (recent.empty() ? "" : "; ") + std::string("#") + std::to_string(h.op) + " " + name_of(h.kind) + " [" +
        std::to_string(h.offset) + ", " + std::to_string(h.offset + h.size) + ") " +
        (h.queue == Tracked::kHost ? std::string("from the host")
                                   : std::string("on ") + to_string(h.engine) + " queue " + std::to_string(h.queue));
  mismatch(s_.dev.uri() + ": " + describe(t) + " read back " + how + ": " + std::to_string(wrong) + " of " +
           std::to_string(got.size()) + " bytes in [" + std::to_string(offset) + ", " +
           std::to_string(offset + got.size()) + ") differ; the first at offset " + std::to_string(offset + first) +
           ": expected " + hex(static_cast<unsigned>(want[first])) + ", got " + hex(static_cast<unsigned>(got[first])) +
           (recent.empty() ? "" : "; its last writes: " + recent));
  return false;
}

void Worker::mismatch(const std::string& what) {
  ++c_.errors;
  s_.report(s_.who(index_) + ", operation #" + std::to_string(op_) + " (" + name_of(kind_) + "): " + what);
}

void Worker::fail(const Error& e) {
  ++c_.errors;
  std::string where = detail_;
  if (claimed(cur_queue_)) where += (where.empty() ? "" : ", ") + std::string("on ") + queue_name(cur_queue_);
  s_.report(s_.who(index_) + ", operation #" + std::to_string(op_) + " (" + name_of(kind_) +
            (where.empty() ? "" : ": " + where) + "): " + to_string(e.status()) + ": " + e.what());
}

void Worker::finish() {
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

void Worker::report_once(const Pending& p, const Error& e) {
  const std::string q = queue_name(p.fence.queue());
  {
    std::lock_guard lock(s_.print_mu);
    if (!s_.failed_queues.insert(q).second) return;
  }
  ++c_.errors;
  s_.report(s_.who(index_) + ": submission " + std::to_string(p.fence.value()) + " on " + q + " (operation #" +
            std::to_string(p.op) + ", " + name_of(p.kind) + ") " +
            (e.status() == Status::Timeout ? "did not complete" : "failed") + ": " + to_string(e.status()) + ": " +
            e.what());
}

// ---- Device memory ---------------------------------------------------------------

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

}  // namespace tpuhal::cli::stress
