// The validation layer (validate.hpp, tpuhal/validation.hpp).
#include "validate.hpp"

#include <dlfcn.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <unordered_map>
#include <variant>
#include <vector>

#include "impl.hpp"
#include "tpuhal/base/log.h"
#include "tpuhal/base/units.h"
#include "tpuhal/driver/op_desc.hpp"

namespace tpuhal {
namespace detail::validate {
namespace {

enum class Mode { Off, Log, Abort };

Mode mode_from_env() {
  const char* env = std::getenv("TPUHAL_VALIDATE");
  if (!env || !*env || std::string_view(env) == "0") return Mode::Off;
  if (std::string_view(env) == "abort") return Mode::Abort;
  return Mode::Log;
}

const Mode g_env_mode = mode_from_env();
std::atomic<std::uint64_t> g_reports{0};

// ---- reports -------------------------------------------------------------------

std::string module_path(const void* pc) {
  Dl_info info{};
  if (!dladdr(pc, &info) || !info.dli_fname) return {};
  std::error_code ec;
  auto p = std::filesystem::canonical(info.dli_fname, ec);
  return ec ? std::string(info.dli_fname) : p.string();
}

// A demangled function's qualified name, without the return type that a
// function template's name starts with ("void std::_Construct<...>(...)",
// "decltype(auto) std::__do_visit<...>(...)", "void (*ns::f<int>())(int)").
// It ends at the parameter list or at an operator's name.
std::string_view qualified_name(std::string_view fn) {
  constexpr std::string_view kAnonymous = "(anonymous namespace)";
  std::size_t start = 0;
  int angle = 0, paren = 0, brace = 0;  // nesting: template arguments, parentheses, {lambda(...)#1}
  for (std::size_t i = 0; i < fn.size(); ++i) {
    if (fn.substr(i, kAnonymous.size()) == kAnonymous) {
      i += kAnonymous.size() - 1;
      continue;
    }
    const char c = fn[i];
    const bool top = angle == 0 && paren == 0 && brace == 0;
    if (top && fn.substr(i, 8) == "operator" && i > 0 && fn[i - 1] == ':') break;  // ns::operator<<, operator bool
    if (c == '{' || c == '}') {
      brace += c == '{' ? 1 : (brace > 0 ? -1 : 0);
      continue;
    }
    if (brace > 0) continue;
    if (c == '(') {
      if (angle == 0 && paren == 0) {
        if (i + 1 < fn.size() && fn[i + 1] == '*') {  // a function pointer's declarator: the name follows
          start = ++i + 1;
          continue;
        }
        std::string_view head = fn.substr(0, i);
        while (!head.empty() && head.back() == ' ') head.remove_suffix(1);
        if (!(head.size() >= 8 && head.substr(head.size() - 8) == "decltype")) break;  // the parameter list
      }
      ++paren;
      continue;
    }
    if (c == ')') {
      paren -= paren > 0 ? 1 : 0;
      continue;
    }
    if (paren > 0) continue;
    if (c == '<') ++angle;
    if (c == '>' && angle > 0) --angle;
    if (c == ' ' && angle == 0) start = i + 1;
  }
  return fn.substr(start);
}

// The library's own frames: its namespaces by name, and, when it is a shared
// library, anything in it (its internal functions have no exported names).
bool internal_frame(std::string_view fn, const void* pc) {
  fn = qualified_name(fn);
  static const std::string self = [] {
    auto here = module_path(reinterpret_cast<const void*>(&internal_frame));
    std::error_code ec;
    auto exe = std::filesystem::canonical("/proc/self/exe", ec);
    return !ec && exe.string() == here ? std::string() : here;
  }();
  static constexpr std::string_view kInternal[] = {
      "tpuhal::detail::",  "tpuhal::validation::",
      "tpuhal::base::",    "tpuhal::Batch::",
      "tpuhal::Buffer::",  "tpuhal::Queue::",
      "tpuhal::Device::",  "tpuhal::Fence::",
      "tpuhal::Program::", "tpuhal_",
      "boost::",           "std::",
  };
  for (auto prefix : kInternal)
    if (fn.substr(0, prefix.size()) == prefix) return true;
  // Helpers in the library's anonymous namespaces, when not inlined (the
  // caller's code may use the same namespace: tell them apart by file).
  constexpr std::string_view kAnonymous = "tpuhal::(anonymous namespace)::";
  if (fn.substr(0, kAnonymous.size()) == kAnonymous) {
    const std::string file = base::CallStack::source_file(pc);
    for (std::string_view dir : {"/hal/src/", "/drivers/", "/base/src/"})
      if (file.find(dir) != std::string::npos) return true;
  }
  return !self.empty() && module_path(pc) == self;
}

std::mutex& handler_mu() {
  static std::mutex* mu = new std::mutex;  // outlives static destruction: reports at exit
  return *mu;
}
validation::Handler& handler() {
  static auto* h = new validation::Handler;
  return *h;
}
validation::CallSiteProvider& call_site_provider() {
  static auto* p = new validation::CallSiteProvider;
  return *p;
}

// ---- what commands touch -------------------------------------------------------

struct Access {
  const driver::BufferBackend* buffer;
  std::uint64_t begin, end;
  bool write;
  const char* op;
};
struct Waits {
  const driver::QueueBackend* queue;
  std::uint64_t value;
};
struct WaitsOnMemory {};
struct WordWrite {
  const driver::BufferBackend* buffer;
  std::uint64_t offset, value;
};
using Item = std::variant<Access, Waits, WaitsOnMemory, WordWrite>;

}  // namespace

struct Use {
  std::weak_ptr<driver::QueueBackend> queue;
  std::string queue_name;
  std::uint64_t value;
  std::uint64_t begin, end;
  bool write;
  bool word;  // write_value, timestamp
  const char* op;
};

struct BufferTrack {
  std::string description;  // "4096-byte device buffer at 0x10000"
  std::string device;       // its device's URI
  base::CallStack allocated_at;
  std::string allocated_in_binding;  // the call-site provider's innermost frame (a Python line)
  std::mutex mu;
  std::vector<Use> uses;                                   // not yet seen to complete
  std::unordered_map<std::uint64_t, std::uint64_t> words;  // offset -> last write_value()
};

namespace {

using Clock = std::unordered_map<const driver::QueueBackend*, std::uint64_t>;

struct Tracker {
  std::mutex mu;
  std::unordered_map<const driver::BufferBackend*, std::shared_ptr<BufferTrack>> buffers;
  std::unordered_map<const driver::QueueBackend*, Clock> clocks;  // what each queue waited for
  std::unordered_map<const driver::ProgramBackend*, std::vector<driver::Command>> programs;
};

Tracker& tracker() {
  static auto* t = new Tracker;  // outlives static destruction: the leak report runs at exit
  return *t;
}

std::uint64_t extent_bytes(const driver::TensorArg& t) {
  std::uint64_t last = 0;
  for (std::uint32_t i = 0; i < t.rank; ++i) {
    if (t.shape[i] == 0) return 0;
    last += (t.shape[i] - 1) * t.strides[i];
  }
  return (last + 1) * size_of(t.dtype);
}

void expand(std::span<const driver::Command> commands, std::vector<Item>& out, int depth) {
  for (const auto& c : commands) {
    std::visit(
        [&](const auto& cmd) {
          using T = std::decay_t<decltype(cmd)>;
          if constexpr (std::is_same_v<T, driver::cmd::Copy>) {
            out.push_back(Access{cmd.src.buffer, cmd.src.offset, cmd.src.offset + cmd.size, false, "copy"});
            out.push_back(Access{cmd.dst.buffer, cmd.dst.offset, cmd.dst.offset + cmd.size, true, "copy"});
          } else if constexpr (std::is_same_v<T, driver::cmd::Fill>) {
            out.push_back(Access{cmd.dst.buffer, cmd.dst.offset, cmd.dst.offset + cmd.size, true, "fill"});
          } else if constexpr (std::is_same_v<T, driver::cmd::WaitFence>) {
            out.push_back(Waits{cmd.queue, cmd.value});
          } else if constexpr (std::is_same_v<T, driver::cmd::WaitValue>) {
            out.push_back(WaitsOnMemory{});
            out.push_back(
                Access{cmd.location.buffer, cmd.location.offset, cmd.location.offset + 8, false, "wait_value"});
          } else if constexpr (std::is_same_v<T, driver::cmd::WriteValue>) {
            out.push_back(WordWrite{cmd.location.buffer, cmd.location.offset, cmd.value});
            out.push_back(
                Access{cmd.location.buffer, cmd.location.offset, cmd.location.offset + 8, true, "write_value"});
          } else if constexpr (std::is_same_v<T, driver::cmd::Timestamp>) {
            out.push_back(Access{cmd.location.buffer, cmd.location.offset, cmd.location.offset + 8, true, "timestamp"});
          } else if constexpr (std::is_same_v<T, driver::cmd::Run>) {
            const auto& tensors = cmd.op->tensors;
            const std::uint32_t written = driver::op_kind_info(cmd.op->kind).written;
            for (std::size_t i = 0; i < tensors.size(); ++i) {
              const auto& t = tensors[i];
              if (!t.present()) continue;
              const bool output = (written >> i) & 1;
              out.push_back(Access{t.buffer, t.offset, t.offset + extent_bytes(t), output, cmd.op->name.c_str()});
            }
          } else if constexpr (std::is_same_v<T, driver::cmd::Call>) {
            if (depth > 0) return;
            std::vector<driver::Command> body;
            {
              auto& tr = tracker();
              std::lock_guard lock(tr.mu);
              if (auto it = tr.programs.find(cmd.program); it != tr.programs.end()) body = it->second;
            }
            expand(body, out, depth + 1);
          }
        },
        c);
  }
}

std::shared_ptr<BufferTrack> find(const driver::BufferBackend* b) {
  auto& tr = tracker();
  std::lock_guard lock(tr.mu);
  auto it = tr.buffers.find(b);
  return it == tr.buffers.end() ? nullptr : it->second;
}

// Drops the uses whose submission completed, or whose queue failed or went
// (either way nothing on the board touches the buffer for them any more).
// Called with track.mu held.
void prune(BufferTrack& track) {
  std::erase_if(track.uses, [](const Use& u) {
    auto q = u.queue.lock();
    if (!q) return true;
    const auto t = q->timeline();
    return t.completed >= u.value || t.failed;
  });
}

std::string range(std::uint64_t begin, std::uint64_t end) {
  return "bytes [" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

void merge(Clock& into, const Clock& from) {
  for (auto [q, v] : from) into[q] = std::max(into[q], v);
}

// The clock a batch reaches by its waits: the queue's own, plus each queue it
// waits for and what that queue had waited for. Merging the other queue's
// latest clock may credit waits it recorded after the value waited for;
// that can hide a hazard but never invents one.
void apply_wait(Clock& clock, const Waits& w) {
  clock[w.queue] = std::max(clock[w.queue], w.value);
  auto& tr = tracker();
  std::lock_guard lock(tr.mu);
  if (auto it = tr.clocks.find(w.queue); it != tr.clocks.end()) merge(clock, it->second);
}

Clock clock_of(const driver::QueueBackend* q) {
  auto& tr = tracker();
  std::lock_guard lock(tr.mu);
  auto it = tr.clocks.find(q);
  return it == tr.clocks.end() ? Clock{} : it->second;
}

// A word per thread whose address names the thread; aligned so that its low
// bits are free for the call a Guard's claim also holds.
constexpr std::uintptr_t kCallBits = 15;
std::uintptr_t thread_token() {
  alignas(kCallBits + 1) static thread_local char token;
  return reinterpret_cast<std::uintptr_t>(&token);
}

}  // namespace

std::atomic<bool> g_on{g_env_mode != Mode::Off};

void report(validation::Check check, std::string message) {
  g_reports.fetch_add(1, std::memory_order_relaxed);
  tracing::instant("validation", {{"check", validation::to_string(check)}}, message);
  // A leak is reported at exit (or on request): where that happens says
  // nothing; the message names where each buffer was allocated.
  validation::Report r{check, std::move(message), {}};
  validation::Handler h;
  validation::CallSiteProvider provider;
  {
    std::lock_guard lock(handler_mu());
    h = handler();
    provider = call_site_provider();
  }
  if (check != validation::Check::Leak) {
    r.call_site = provider ? provider() : std::vector<std::string>{};
    for (auto& frame : base::CallStack::capture().describe(4, internal_frame)) r.call_site.push_back(std::move(frame));
  }
  if (h) {
    h(r);
    return;
  }
  std::string text = std::string("validation: ") + validation::to_string(check) + ": " + r.message;
  for (std::size_t i = 0; i < r.call_site.size(); ++i)
    text += (i == 0 ? "\n    at " : "\n    called from ") + r.call_site[i];
  base::logger("validate")->error("{}", text);
  if (g_env_mode == Mode::Abort) {
    std::fflush(nullptr);
    std::abort();
  }
}

std::shared_ptr<BufferTrack> track_buffer(const BufferImpl& buffer, const driver::BufferBackend* backend) {
  auto t = std::make_shared<BufferTrack>();
  t->description = buffer.describe();
  t->device = buffer.device()->uri();
  t->allocated_at = base::CallStack::capture();
  validation::CallSiteProvider provider;
  {
    std::lock_guard lock(handler_mu());
    provider = call_site_provider();
  }
  if (provider)
    if (auto frames = provider(); !frames.empty()) t->allocated_in_binding = std::move(frames.front());
  {
    auto& tr = tracker();
    std::lock_guard lock(tr.mu);
    tr.buffers[backend] = t;
  }
  arm_leak_report();
  return t;
}

void untrack_buffer(const std::shared_ptr<BufferTrack>& track) {
  if (!track) return;
  auto& tr = tracker();
  std::lock_guard lock(tr.mu);
  std::erase_if(tr.buffers, [&](const auto& kv) { return kv.second == track; });
}

std::string allocation_site(const BufferTrack& track) {
  if (!track.allocated_in_binding.empty()) return "allocated by " + track.allocated_in_binding;
  const auto frames = track.allocated_at.describe(1, internal_frame);
  return frames.empty() ? std::string() : "allocated by " + frames.front();
}

void on_map(const BufferTrack& ctrack) {
  auto& track = const_cast<BufferTrack&>(ctrack);
  std::string msg;
  {
    std::lock_guard lock(track.mu);
    prune(track);
    for (const auto& u : track.uses) {
      // A word a queue writes with write_value or timestamp is there for
      // the host to poll while the queue runs: not a hazard.
      if (!u.write || u.word) continue;
      msg = "map() of the " + track.description + " on " + track.device + " while " + u.queue_name + "'s submission " +
            std::to_string(u.value) + " (" + u.op + ") still writes " + range(u.begin, u.end) +
            " of it; wait for that submission's fence before the host "
            "reads the memory";
      break;
    }
  }
  if (!msg.empty()) report(validation::Check::BufferInFlight, std::move(msg));
}

void before_submit(const QueueImpl& queue, std::span<const driver::Command> commands) {
  std::vector<Item> items;
  expand(commands, items, 0);
  if (items.empty()) return;
  const auto* self = queue.backend_ptr().get();
  Clock clock = clock_of(self);
  bool synced_by_memory = false;
  std::vector<std::pair<validation::Check, std::string>> found;
  for (const auto& item : items) {
    if (const auto* w = std::get_if<Waits>(&item)) {
      apply_wait(clock, *w);
    } else if (std::holds_alternative<WaitsOnMemory>(item)) {
      // The batch waits on a word someone else writes: whatever it
      // synchronises with is beyond what can be followed. Trust it.
      synced_by_memory = true;
    } else if (const auto* ww = std::get_if<WordWrite>(&item)) {
      auto track = find(ww->buffer);
      if (!track) continue;
      std::lock_guard lock(track->mu);
      auto [it, fresh] = track->words.try_emplace(ww->offset, ww->value);
      if (!fresh && ww->value < it->second)
        found.emplace_back(validation::Check::ValueBackwards,
                           "write_value of " + std::to_string(ww->value) + " on " + queue.name() +
                               " to the word at offset " + std::to_string(ww->offset) + " of the " +
                               track->description + ", which was last given " + std::to_string(it->second) +
                               ": a timeline word must not go backwards (waits for the values "
                               "between would already have passed)");
      it->second = ww->value;
    } else if (const auto* a = std::get_if<Access>(&item)) {
      if (synced_by_memory || a->begin == a->end) continue;
      auto track = find(a->buffer);
      if (!track) continue;
      std::lock_guard lock(track->mu);
      prune(*track);
      for (const auto& u : track->uses) {
        auto q = u.queue.lock();
        if (!q || q.get() == self) continue;  // the same queue runs in order
        if (!(u.write || a->write) || u.end <= a->begin || a->end <= u.begin) continue;
        if (auto it = clock.find(q.get()); it != clock.end() && it->second >= u.value) continue;
        found.emplace_back(validation::Check::BufferInFlight,
                           std::string(a->op) + " on " + queue.name() + (a->write ? " writes " : " reads ") +
                               range(a->begin, a->end) + " of the " + track->description + " while " + u.queue_name +
                               "'s submission " + std::to_string(u.value) + " (" + u.op + "), which " +
                               (u.write ? "writes " : "reads ") + range(u.begin, u.end) +
                               ", has not completed, and nothing orders the two: record batch.wait(fence) on "
                               "that submission's fence first, or wait for it on the host");
        break;
      }
    }
  }
  for (auto& [check, msg] : found) report(check, std::move(msg));
}

void after_submit(const std::shared_ptr<QueueImpl>& queue, std::span<const driver::Command> commands,
                  std::uint64_t value) {
  std::vector<Item> items;
  expand(commands, items, 0);
  if (items.empty()) return;
  const auto& backend = queue->backend_ptr();
  const std::string name = queue->name();
  Clock clock = clock_of(backend.get());
  bool waited = false;
  for (const auto& item : items) {
    if (const auto* w = std::get_if<Waits>(&item)) {
      apply_wait(clock, *w);
      waited = true;
    } else if (const auto* a = std::get_if<Access>(&item)) {
      if (a->begin == a->end) continue;
      auto track = find(a->buffer);
      if (!track) continue;
      std::lock_guard lock(track->mu);
      prune(*track);
      // A newer use of the same bytes on the same queue outlasts the older one.
      std::erase_if(track->uses, [&](const Use& u) {
        return u.queue.lock() == backend && u.begin == a->begin && u.end == a->end && u.write == a->write;
      });
      constexpr std::size_t kMaxUses = 256;
      if (track->uses.size() >= kMaxUses) track->uses.erase(track->uses.begin());
      const bool word = std::string_view(a->op) == "write_value" || std::string_view(a->op) == "timestamp";
      track->uses.push_back(Use{backend, name, value, a->begin, a->end, a->write, word, a->op});
    }
  }
  if (waited) {
    auto& tr = tracker();
    std::lock_guard lock(tr.mu);
    merge(tr.clocks[backend.get()], clock);
  }
}

void forget_queue(const driver::QueueBackend* queue) {
  auto& tr = tracker();
  std::lock_guard lock(tr.mu);
  tr.clocks.erase(queue);
  for (auto& [q, clock] : tr.clocks) clock.erase(queue);
}

void record_program(const driver::ProgramBackend* program, std::span<const driver::Command> commands) {
  auto& tr = tracker();
  std::lock_guard lock(tr.mu);
  tr.programs[program].assign(commands.begin(), commands.end());
}

void forget_program(const driver::ProgramBackend* program) {
  auto& tr = tracker();
  std::lock_guard lock(tr.mu);
  tr.programs.erase(program);
}

const char* to_string(BatchCall call) noexcept {
  switch (call) {
    case BatchCall::Copy: return "copy";
    case BatchCall::Fill: return "fill";
    case BatchCall::Wait: return "wait";
    case BatchCall::WaitValue: return "wait_value";
    case BatchCall::WriteValue: return "write_value";
    case BatchCall::Timestamp: return "timestamp";
    case BatchCall::Run: return "run";
    case BatchCall::Submit: return "submit";
    case BatchCall::WaitUntil: return "wait_until";
  }
  return nullptr;
}

static_assert(static_cast<std::uintptr_t>(BatchCall::WaitUntil) <= kCallBits, "a claim holds the call in its low bits");

Guard::Guard(std::atomic<std::uintptr_t>* claim, BatchCall call) {
  if (!claim || !on()) return;
  const std::uintptr_t me = thread_token();
  std::uintptr_t seen = 0;
  if (claim->compare_exchange_strong(seen, me | static_cast<std::uintptr_t>(call), std::memory_order_acq_rel)) {
    claim_ = claim;
    return;
  }
  if ((seen & ~kCallBits) == me) return;  // a call inside a call on the same thread
  const char* other = to_string(static_cast<BatchCall>(seen & kCallBits));
  report(validation::Check::WrongThread,
         std::string("Batch::") + to_string(call) + " while another thread is in " +
             (other ? std::string("Batch::") + other : std::string("a call of the same batch")) +
             " on the same batch: a Batch belongs to one thread at a time (record a batch per "
             "thread; several threads may submit to one queue)");
}

Guard::~Guard() {
  if (claim_) claim_->store(0, std::memory_order_release);
}

void arm_leak_report() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::atexit([] {
      if (on()) validation::report_leaks();
    });
  });
}

}  // namespace detail::validate

namespace validation {

const char* to_string(Check check) noexcept {
  switch (check) {
    case Check::BufferInFlight: return "buffer in flight";
    case Check::ValueBackwards: return "value backwards";
    case Check::WrongThread: return "wrong thread";
    case Check::Leak: return "leak";
  }
  return "?";
}

bool enabled() noexcept { return detail::validate::on(); }

void enable(bool on) noexcept { detail::validate::g_on.store(on, std::memory_order_relaxed); }

Handler set_handler(Handler h) {
  std::lock_guard lock(detail::validate::handler_mu());
  return std::exchange(detail::validate::handler(), std::move(h));
}

CallSiteProvider set_call_site_provider(CallSiteProvider provider) {
  std::lock_guard lock(detail::validate::handler_mu());
  return std::exchange(detail::validate::call_site_provider(), std::move(provider));
}

std::uint64_t report_count() noexcept { return detail::validate::g_reports.load(std::memory_order_relaxed); }

std::size_t report_leaks() {
  using detail::validate::BufferTrack;
  std::map<std::string, std::vector<std::shared_ptr<BufferTrack>>> by_device;
  {
    auto& tr = detail::validate::tracker();
    std::lock_guard lock(tr.mu);
    for (const auto& [backend, track] : tr.buffers) by_device[track->device].push_back(track);
  }
  std::size_t total = 0;
  for (auto& [device, tracks] : by_device) {
    std::string list;
    for (const auto& t : tracks) {
      list += "\n      " + t->description;
      if (auto site = detail::validate::allocation_site(*t); !site.empty()) list += ", " + site;
    }
    total += tracks.size();
    detail::validate::report(Check::Leak, device + ": " + std::to_string(tracks.size()) +
                                              (tracks.size() == 1 ? " buffer is" : " buffers are") +
                                              " still allocated (never freed):" + list);
  }
  return total;
}

}  // namespace validation
}  // namespace tpuhal
