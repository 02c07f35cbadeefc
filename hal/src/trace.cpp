// Tracing (tpuhal/trace.hpp, docs/tracing.md): per-thread event buffers, a
// background writer that drains them into a Chrome trace, and the device
// side: board timestamps around each command, read back once the
// submission completes and placed on the host clock.
//
// Ordering. Events of one track are written in time order: a host event's
// time is read while its thread's buffer is locked, and each writer round
// first reads the clock (the cut), then takes every buffer, merges the
// events up to the cut by time and keeps later ones for the next round.
// Any event timed before the cut was in its buffer when the writer took
// it. The exception is a leaf slice (the HAL's calls: one 'X' event, its
// start read when the call began and the event pushed when it ends): it
// may come a round late, but its thread recorded nothing meanwhile, so
// its track stays in order. Device tracks are written by whoever drains
// the queue, under the queue's lock, in timeline order.
//
// The board's clock. Each stamped submission bounds the offset between the
// board's clock and the host's (board - host): its first stamp was taken
// after the host began submitting (offset <= first - submit) and its last
// before the host first saw the submission complete (offset >= last -
// seen). The device keeps the intersection of every submission's bounds;
// each submission is placed with the middle of the bounds known when it is
// drained, which satisfies its own, so its commands lie inside its host
// interval. The final width / 2 is the trace's error bound for the device.
#include <pthread.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include "impl.hpp"
#include "op_cost.hpp"
#include "tpuhal/base/log.h"
#include "tpuhal/base/output_file.h"
#include "tpuhal/base/wait.h"
#include "tpuhal/driver/op_desc.hpp"
#include "tracing.hpp"

namespace tpuhal::detail::tracing {

std::atomic<bool> g_on{false};

namespace {

constexpr std::uint64_t kSlots = 4096;  // board timestamps per queue (32 KiB)
constexpr std::uint32_t kVideoTrack = 10000;
constexpr auto kRound = std::chrono::milliseconds(2);
constexpr std::uint64_t kCounterEveryNs = 10'000'000;

std::uint64_t now() noexcept { return base::monotonic_ns(); }

struct Event {
  char ph = 'i';
  bool on_device = false;  // pid/tid name a device track, not the thread's
  std::uint8_t nargs = 0;
  const char* name = nullptr;
  std::string dyn_name;  // when name is null
  std::uint64_t ts = 0;
  std::uint64_t dur = 0;  // 'X'
  std::uint64_t id = 0;   // flow id ('s'; on an 'X', a flow starting at its start)
  std::int64_t pid = 0;
  std::uint32_t tid = 0;
  Arg args[5];
  std::string text;  // the arg text_key, when not empty
  const char* text_key = "message";
};

struct ThreadBuf {
  std::mutex mu;
  std::vector<Event> events;  // the thread's, under mu
  std::uint64_t dropped = 0;  // under mu
  std::vector<Event> taken;   // the writer's
  std::int64_t pid = 0;
  std::uint32_t tid = 0;
  std::string name;
  bool named = false;  // the writer wrote its thread_name
};

struct DeviceTrace {
  std::weak_ptr<DeviceImpl> device;
  std::string uri;
  std::int64_t pid = 0;
  bool timestamps = false;
  bool modelled = false;  // the board's clock is a timing model's (caps.modelled_time)
  std::atomic<std::uint64_t> stamped{0}, unstamped{0};
  std::mutex mu;  // the clock bounds
  std::int64_t lo = INT64_MIN, hi = INT64_MAX;
  std::uint64_t resyncs = 0;
  // The writer's.
  bool described = false;
  std::map<std::string, std::uint64_t> heap_used;
  std::vector<std::uint32_t> channels_named;
  // Per queue track (tid): where its last slice ended and its last depth
  // sample. A track outlives the queue: a queue opened later with the same
  // engine and index writes on it, and must not go back in time.
  struct Track {
    std::uint64_t end = 0, counter = 0;
  };
  std::map<std::uint32_t, Track> tracks;
};

struct CmdInfo {
  const char* name = "";
  std::string op;  // a tensor op's name (the slice's name)
  std::uint64_t bytes = 0;
  const char* src = nullptr;
  const char* dst = nullptr;
  const char* direction = nullptr;
  std::string detail;  // shapes, or the queue waited on
  double flops = 0;
  double peak = 0;
  std::uint64_t value = 0;
  const driver::QueueBackend* waits_on = nullptr;  // a wait fence's queue (of the same device)
};

struct Pending {
  std::uint64_t id = 0;
  std::uint64_t value = 0;  // 0 until the backend returned it
  bool cancelled = false;
  bool per_command = true;
  std::uint64_t slot = 0;  // first stamp (counts up; the ring index is % kSlots)
  std::uint32_t stamps = 0;
  std::uint64_t host_submit = 0;
  std::uint64_t correlation = 0;
  std::uint32_t commands = 0;
  std::vector<CmdInfo> cmds;
  // Filled when drained: the board's stamps and when the host saw it done.
  std::vector<std::uint64_t> st;
  std::uint64_t seen_at = 0;
  std::int64_t off = 0;  // board - host, with which it is placed (Session::round)
};

}  // namespace

struct QueueTrace {
  std::shared_ptr<DeviceTrace> dev;
  std::string name;   // "sim:0 compute queue 2"
  std::string track;  // "compute queue 2"
  std::uint32_t tid = 0;
  // The queue's backend, to find the queue by (never dereferenced); null
  // once the queue closed, as another may then take its address.
  std::atomic<const driver::QueueBackend*> key{nullptr};
  std::atomic<std::uint64_t> seen_max{0};
  std::mutex mu;
  std::shared_ptr<driver::QueueBackend> backend;  // until the queue closes
  std::shared_ptr<driver::BufferBackend> stamps;
  std::byte* base = nullptr;
  std::uint64_t head = 0, tail = 0;
  std::uint64_t next_id = 1;
  std::deque<Pending> pending;
  std::deque<std::pair<std::uint64_t, std::uint64_t>> seen;  // (completed, host ns)
  // The writer's: the last value written, and where recent submissions
  // ended on the host clock (value, end), for the waits of other queues.
  std::uint64_t emitted = 0;
  std::deque<std::pair<std::uint64_t, std::uint64_t>> ends;
  std::uint64_t last_depth = UINT64_MAX;
  std::uint64_t last_counter = 0;
  bool failure_reported = false;
  bool named = false;  // the writer's
};

namespace {

// What a drain took from a queue under the queue's lock, for the writer to
// write without it: the queue's lock is the submitters', and the writer
// (running at the lowest priority) must never hold it for long.
struct Drained {
  std::shared_ptr<QueueTrace> q;
  std::vector<Pending> done;  // completed, in timeline order, stamps read
  std::vector<Pending> open;  // will never complete (failed) or not in this trace
  bool failed = false;
  std::string failure;  // set the first time the failure is seen
  std::uint64_t polled = 0;
  std::optional<std::uint64_t> depth;  // a new queue depth to record
  std::size_t next = 0;                // the writer's: the first of `done` not yet written
};

// ---- JSON ---------------------------------------------------------------------

void escape(std::string& out, std::string_view s) {
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        else
          out += c;
    }
  }
}

void quoted(std::string& out, std::string_view s) {
  out += '"';
  escape(out, s);
  out += '"';
}

// Microseconds with nanosecond digits, as the format's "ts" wants.
void micros(std::string& out, std::uint64_t ns) {
  fmt::format_to(std::back_inserter(out), "{}.{:03}", ns / 1000, ns % 1000);
}

void arg_value(std::string& out, const Arg& a) {
  switch (a.kind) {
    case Arg::Kind::U64: fmt::format_to(std::back_inserter(out), "{}", a.u); break;
    case Arg::Kind::F64: fmt::format_to(std::back_inserter(out), "{:.6g}", a.f); break;
    case Arg::Kind::Str: quoted(out, a.s ? a.s : ""); break;
    case Arg::Kind::None: out += "null"; break;
  }
}

// ---- the session ----------------------------------------------------------------

std::uint32_t gettid_now() { return static_cast<std::uint32_t>(::syscall(SYS_gettid)); }

struct Session {
  std::string path;
  std::FILE* file = nullptr;
  std::int64_t pid = 0;
  std::uint64_t gen = 0;

  std::mutex mu;  // the registries
  std::vector<std::shared_ptr<ThreadBuf>> threads;
  std::vector<std::shared_ptr<DeviceTrace>> devices;
  std::vector<std::shared_ptr<QueueTrace>> queues;

  std::mutex out_mu;  // the file and what was written
  std::string out;
  bool first = true;
  std::uint64_t events = 0, dropped = 0;
  std::string error;

  std::mutex wake_mu;
  std::condition_variable wake;
  bool stopping = false;
  bool kicked = false;
  std::thread writer;
  std::vector<std::vector<Event>> held;  // the writer's: runs of events after the last cut
  std::mutex closed_mu;
  std::vector<Drained> closed;  // what queues that went away left, for the writer
  std::uint64_t last_counters = 0;

  // Appends one event's JSON; out_mu held.
  void begin_event() {
    out += first ? "\n" : ",\n";
    first = false;
    ++events;
  }
  void write(const Event& e) {
    begin_event();
    out += "{\"ph\":\"";
    out += e.ph;
    out += "\",\"name\":";
    quoted(out, e.name ? std::string_view(e.name) : std::string_view(e.dyn_name));
    out += ",\"cat\":\"";
    out += e.on_device ? "device" : "hal";
    out += "\",\"ts\":";
    micros(out, e.ts);
    fmt::format_to(std::back_inserter(out), ",\"pid\":{},\"tid\":{}", e.pid, e.tid);
    if (e.ph == 'i') out += ",\"s\":\"t\"";
    if (e.ph == 's') fmt::format_to(std::back_inserter(out), ",\"id\":{}", e.id);
    if (e.ph == 'X') {
      out += ",\"dur\":";
      micros(out, e.dur);
    }
    if (e.nargs || !e.text.empty()) {
      out += ",\"args\":{";
      bool comma = false;
      for (std::uint8_t i = 0; i < e.nargs; ++i) {
        if (comma) out += ',';
        comma = true;
        quoted(out, e.args[i].key);
        out += ':';
        arg_value(out, e.args[i]);
      }
      if (!e.text.empty()) {
        if (comma) out += ',';
        quoted(out, e.text_key);
        out += ':';
        quoted(out, e.text);
      }
      out += '}';
    }
    out += '}';
    if (e.ph == 'X' && e.id) {
      begin_event();
      out += "{\"ph\":\"s\",\"name\":\"submission\",\"cat\":\"flow\",\"ts\":";
      micros(out, e.ts);
      fmt::format_to(std::back_inserter(out), ",\"pid\":{},\"tid\":{},\"id\":{}}}", e.pid, e.tid, e.id);
    }
  }
  void metadata(const char* what, std::int64_t p, std::uint32_t t, std::string_view value) {
    begin_event();
    out += fmt::format("{{\"ph\":\"M\",\"name\":\"{}\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":", what, p, t);
    quoted(out, value);
    out += "}}";
  }
  void sort_index(const char* what, std::int64_t p, std::uint32_t t, std::int64_t index) {
    begin_event();
    out += fmt::format("{{\"ph\":\"M\",\"name\":\"{}\",\"pid\":{},\"tid\":{},\"args\":{{\"sort_index\":{}}}}}", what, p,
                       t, index);
  }
  // Writes what was formatted; out_mu held. A failed write stops writing.
  void flush() {
    if (out.empty()) return;
    if (file && error.empty()) {
      if (std::fwrite(out.data(), 1, out.size(), file) != out.size() || std::fflush(file) != 0) {
        error = path + ": " + std::strerror(errno);
        base::logger("trace")->error("trace: cannot write {}; tracing goes on without writing", error);
      }
    }
    out.clear();
  }

  void run();
  void round(bool final);
  void emit_in_order(const std::vector<std::shared_ptr<QueueTrace>>& qs, std::vector<Drained>& drained);
  void take_host_events(bool final);
  void sample_counters(std::uint64_t t);
};

std::mutex g_mu;  // g_session
std::shared_ptr<Session> g_session;
std::atomic<std::uint64_t> g_gen{0};
// Correlation (and flow) ids: the pid in the high bits, so that traces of
// several processes merge without clashes (and stay below 2^53, exact in
// the JSON readers' doubles).
std::atomic<std::uint64_t> g_correlation{0};

std::shared_ptr<Session> session() {
  std::lock_guard lock(g_mu);
  return g_session;
}

// The calling thread's buffer in the current session (null when off).
ThreadBuf* thread_buf() {
  struct Tls {
    std::shared_ptr<ThreadBuf> buf;
    std::uint64_t gen = 0;
  };
  thread_local Tls tls;
  const std::uint64_t gen = g_gen.load(std::memory_order_acquire);
  if (tls.gen == gen && tls.buf) return tls.buf.get();
  auto s = session();
  if (!s || s->gen != gen) return nullptr;
  auto b = std::make_shared<ThreadBuf>();
  b->pid = s->pid;
  b->tid = gettid_now();
  char name[32] = {};
  if (pthread_getname_np(pthread_self(), name, sizeof name) == 0) b->name = name;
  if (b->name.empty()) b->name = "thread " + std::to_string(b->tid);
  {
    std::lock_guard lock(s->mu);
    s->threads.push_back(b);
  }
  tls.buf = std::move(b);
  tls.gen = gen;
  return tls.buf.get();
}

// Records an event on the calling thread's buffer: `fill` writes it in
// place (no event is built and moved), then its time is read.
template <class Fill>
void push_with(Fill&& fill) {
  ThreadBuf* b = thread_buf();
  if (!b) return;
  bool half = false;
  {
    std::lock_guard lock(b->mu);
    if (b->events.size() >= trace::kThreadBufferEvents) {
      ++b->dropped;
      return;
    }
    if (b->events.capacity() == 0) b->events.reserve(256);
    Event& e = b->events.emplace_back();
    fill(e);
    // Read under the lock: see the ordering note above. A leaf slice ('X')
    // keeps its start; nothing else was recorded on its thread since.
    if (e.ph == 'X')
      e.dur = now() - e.ts;
    else
      e.ts = now();
    if (!e.on_device) {
      e.pid = b->pid;
      e.tid = b->tid;
    }
    half = b->events.size() == trace::kThreadBufferEvents / 2;
  }
  if (half)
    if (auto s = session()) {
      {
        std::lock_guard lock(s->wake_mu);
        s->kicked = true;
      }
      s->wake.notify_one();
    }
}

void push(Event&& e) {
  push_with([&](Event& slot) { slot = std::move(e); });
}

Event make(char ph, const char* name, std::initializer_list<Arg> args, std::string text) {
  Event e;
  e.ph = ph;
  e.name = name;
  for (const Arg& a : args)
    if (e.nargs < std::size(e.args)) e.args[e.nargs++] = a;
  e.text = std::move(text);
  return e;
}

std::shared_ptr<DeviceTrace> device_trace(Session& s, const std::shared_ptr<DeviceImpl>& device) {
  std::lock_guard lock(s.mu);
  for (auto& d : s.devices)
    if (!d->device.owner_before(device) && !device.owner_before(d->device)) return d;
  auto d = std::make_shared<DeviceTrace>();
  d->device = device;
  d->uri = device->uri();
  // Its own process in the trace; distinct across processes merged into one
  // trace (Linux pids are below 2^22).
  d->pid = s.pid + (static_cast<std::int64_t>(s.devices.size()) + 1) * (std::int64_t{1} << 22);
  d->timestamps = device->backend().properties().caps.timestamps;
  d->modelled = device->backend().properties().caps.modelled_time;
  s.devices.push_back(d);
  return d;
}

// ---- device slices ---------------------------------------------------------------

std::string shape_text(const driver::TensorArg& t) {
  std::string s;
  for (std::uint32_t i = 0; i < t.rank; ++i) s += (i ? "x" : "") + std::to_string(t.shape[i]);
  if (t.rank == 0) s = "scalar";
  return s + " " + to_string(t.dtype);
}

CmdInfo describe(const driver::Command& c, const Properties& props) {
  CmdInfo info;
  std::visit(
      [&](const auto& cmd) {
        using T = std::decay_t<decltype(cmd)>;
        if constexpr (std::is_same_v<T, driver::cmd::Copy>) {
          info.name = "copy";
          info.bytes = cmd.size;
          const Memory s = cmd.src.buffer->memory(), d = cmd.dst.buffer->memory();
          info.src = to_string(s);
          info.dst = to_string(d);
          static const char* const kDir[2][2] = {{"h2h", "h2d"}, {"d2h", "d2d"}};
          info.direction = kDir[s != Memory::HostPinned][d != Memory::HostPinned];
        } else if constexpr (std::is_same_v<T, driver::cmd::Fill>) {
          info.name = "fill";
          info.bytes = cmd.size;
          info.dst = to_string(cmd.dst.buffer->memory());
        } else if constexpr (std::is_same_v<T, driver::cmd::WaitFence>) {
          info.name = "wait fence";
          info.value = cmd.value;
          info.waits_on = cmd.queue;
          info.detail = std::string(to_string(cmd.queue->engine())) + " queue " + std::to_string(cmd.queue->index());
        } else if constexpr (std::is_same_v<T, driver::cmd::WaitValue>) {
          info.name = "wait value";
          info.value = cmd.value;
        } else if constexpr (std::is_same_v<T, driver::cmd::WriteValue>) {
          info.name = "write value";
          info.value = cmd.value;
        } else if constexpr (std::is_same_v<T, driver::cmd::Timestamp>) {
          info.name = "timestamp";
        } else if constexpr (std::is_same_v<T, driver::cmd::Run>) {
          const driver::OpDesc& op = *cmd.op;
          info.name = "op";
          info.op = op.name;
          for (std::size_t i = 0; i < op.tensors.size(); ++i)
            if (op.tensors[i].present()) {
              if (!info.detail.empty()) info.detail += ", ";
              info.detail += shape_text(op.tensors[i]);
            }
          const OpCost cost = op_cost(op);
          info.flops = cost.flops;
          info.bytes = static_cast<std::uint64_t>(cost.bytes);
          info.peak = cost.peak_rate(props);
        } else if constexpr (std::is_same_v<T, driver::cmd::Call>) {
          info.name = "program";
          info.value = cmd.program->size();
        } else if constexpr (std::is_same_v<T, driver::cmd::WaitTime>) {
          info.name = "wait until";
          info.value = cmd.ns;
        }
      },
      c);
  return info;
}

// One device slice; out_mu held.
void device_slice(Session& s, const QueueTrace& q, const char* name, std::string_view dyn, std::uint64_t ts,
                  std::uint64_t dur, const std::string& args) {
  s.begin_event();
  s.out += "{\"ph\":\"X\",\"name\":";
  quoted(s.out, name ? std::string_view(name) : dyn);
  s.out += ",\"cat\":\"device\",\"ts\":";
  micros(s.out, ts);
  s.out += ",\"dur\":";
  micros(s.out, dur);
  s.out += fmt::format(",\"pid\":{},\"tid\":{},\"args\":{{{}}}}}", q.dev->pid, q.tid, args);
}

void flow_end(Session& s, const QueueTrace& q, std::uint64_t ts, std::uint64_t id) {
  s.begin_event();
  s.out += "{\"ph\":\"f\",\"bp\":\"e\",\"name\":\"submission\",\"cat\":\"flow\",\"ts\":";
  micros(s.out, ts);
  s.out += fmt::format(",\"pid\":{},\"tid\":{},\"id\":{}}}", q.dev->pid, q.tid, id);
}

void queue_instant(Session& s, const QueueTrace& q, const char* name, std::uint64_t ts, std::string_view message) {
  s.begin_event();
  s.out += fmt::format("{{\"ph\":\"i\",\"s\":\"t\",\"name\":\"{}\",\"cat\":\"device\",\"ts\":", name);
  micros(s.out, ts);
  s.out += fmt::format(",\"pid\":{},\"tid\":{},\"args\":{{\"message\":", q.dev->pid, q.tid);
  quoted(s.out, message);
  s.out += "}}";
}

void name_queue(Session& s, QueueTrace& q) {
  if (q.named) return;
  q.named = true;
  s.metadata("thread_name", q.dev->pid, q.tid, q.track);
  s.sort_index("thread_sort_index", q.dev->pid, q.tid, q.tid);
}

// The open queue whose backend is `key` (a wait fence's queue), or null.
std::shared_ptr<QueueTrace> find_queue(const std::vector<std::shared_ptr<QueueTrace>>& qs,
                                       const driver::QueueBackend* key) {
  if (!key) return nullptr;
  for (const auto& q : qs)
    if (q->key.load(std::memory_order_relaxed) == key) return q;
  return nullptr;
}

// Narrows the device's clock bounds with a completed stamped submission
// (its own bounds, see the note at the top) and returns the middle of the
// bounds then, which satisfies the submission's own; the writer's.
std::int64_t fold_bounds(QueueTrace& q, const Pending& p) {
  const auto hi = static_cast<std::int64_t>(p.st.front() - p.host_submit);
  const auto lo = static_cast<std::int64_t>(p.st.back() - p.seen_at);
  std::lock_guard lock(q.dev->mu);
  q.dev->hi = std::min(q.dev->hi, hi);
  if (q.dev->modelled) {
    // A modelled board's work ends when its model says, which may be after
    // the host saw it (docs/timing.md): only "it started after it was
    // submitted" bounds its clock. Its TIME is the host's since reset, so
    // the bound closes on the true offset from above.
    q.dev->lo = q.dev->hi;
    return q.dev->hi;
  }
  q.dev->lo = std::max(q.dev->lo, lo);
  if (q.dev->lo > q.dev->hi) {  // the clocks moved apart: start again from this one
    q.dev->lo = lo;
    q.dev->hi = std::max(lo, hi);
    ++q.dev->resyncs;
  }
  return q.dev->lo / 2 + q.dev->hi / 2;
}

// Where the submission that brought `q` to `value` ended on the host clock,
// if it was written; 0 if not known. Only that very submission: a queue
// also runs work the trace does not stamp (a decoder's commands, say), and
// a later stamped submission ends after the value was reached.
std::uint64_t end_of(const QueueTrace& q, std::uint64_t value) {
  if (q.emitted < value) return 0;
  const auto it =
      std::lower_bound(q.ends.begin(), q.ends.end(), value, [](const auto& e, std::uint64_t v) { return e.first < v; });
  return it == q.ends.end() || it->first != value ? 0 : it->second;
}

// Writes a completed stamped submission at its offset (p.off); out_mu
// held, on the writer's thread (or stop()'s once it has joined).
// `waited(c)` is where the submission a wait fence command waits for ended
// (0 if unknown): the wait ends no earlier, and what follows it starts no
// earlier, so that dependent work keeps its order across tracks whatever
// the clock estimate did between the two submissions.
template <class Waited>
void emit_completed(Session& s, QueueTrace& q, const Pending& p, Waited&& waited) {
  const std::vector<std::uint64_t>& st = p.st;
  const std::uint64_t seen_at = p.seen_at;
  const std::uint64_t first = st.front(), last = st.back();
  const std::int64_t off = p.off;
  auto host = [&](std::uint64_t b) { return static_cast<std::uint64_t>(static_cast<std::int64_t>(b) - off); };
  DeviceTrace::Track& track = q.dev->tracks[q.tid];
  const std::uint64_t start = std::max(host(first), track.end);
  std::uint64_t end = std::max(host(last), start);
  // Each command's place first: a wait may push what follows, and the end.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> at;
  if (p.per_command) {
    at.reserve(p.cmds.size());
    std::uint64_t t = start;
    for (std::size_t i = 0; i < p.cmds.size(); ++i) {
      const std::uint64_t a = std::max(host(st[i]), t);
      std::uint64_t b = std::max(host(st[i + 1]), a);
      if (p.cmds[i].waits_on) b = std::max(b, waited(p.cmds[i]));
      at.emplace_back(a, b);
      t = b;
    }
    if (!at.empty()) end = std::max(end, at.back().second);
    for (auto& [a, b] : at) {
      a = std::min(a, end);
      b = std::min(b, end);
    }
  }
  name_queue(s, q);
  device_slice(s, q, "submission", {}, start, end - start,
               fmt::format("\"value\":{},\"commands\":{},\"correlation\":{},\"seen_ts\":{}.{:03}{}", p.value,
                           p.commands, p.correlation, seen_at / 1000, seen_at % 1000,
                           q.dev->modelled ? ",\"board_clock\":\"modelled\"" : ""));
  flow_end(s, q, start, p.correlation);
  for (std::size_t i = 0; i < at.size(); ++i) {
    const CmdInfo& c = p.cmds[i];
    const auto [a, b] = at[i];
    const std::uint64_t dur = b - a;
    std::string args;
    if (c.bytes) {
      args += fmt::format("\"bytes\":{}", c.bytes);
      if (dur) args += fmt::format(",\"GB/s\":{:.3f}", static_cast<double>(c.bytes) / static_cast<double>(dur));
    }
    auto add = [&](std::string_view key, std::string_view v) {
      if (!args.empty()) args += ',';
      quoted(args, key);
      args += ':';
      quoted(args, v);
    };
    if (c.src) add("src", c.src);
    if (c.dst) add("dst", c.dst);
    if (c.direction) add("direction", c.direction);
    if (!c.detail.empty()) add(c.op.empty() ? "queue" : "tensors", c.detail);
    if (c.value) args += fmt::format("{}\"value\":{}", args.empty() ? "" : ",", c.value);
    if (!c.op.empty()) {
      args += fmt::format(",\"flops\":{:.0f}", c.flops);
      const double rate = dur ? c.flops / (static_cast<double>(dur) * 1e-9) : 0.0;
      args += fmt::format(",\"GFLOP/s\":{:.3f}", rate * 1e-9);
      if (c.peak > 0) args += fmt::format(",\"of_peak\":{:.4f}", rate / c.peak);
    }
    device_slice(s, q, c.op.empty() ? c.name : nullptr, c.op, a, dur, args);
  }
  track.end = end;
  q.emitted = std::max(q.emitted, p.value);
  if (q.ends.size() >= kSlots) q.ends.pop_front();
  q.ends.emplace_back(p.value, end);
}

// The host saw the queue reach `completed` at `t`; q.mu held. Kept only
// while stamped work is in flight, which is what the times bound.
void note_seen(QueueTrace& q, std::uint64_t completed, std::uint64_t t) {
  if (q.pending.empty() || completed == 0) return;
  if (!q.seen.empty() && q.seen.back().first >= completed) return;
  if (q.seen.size() >= 2 * kSlots) q.seen.pop_front();
  q.seen.emplace_back(completed, t);
}

// The first time the host saw the queue reach `value`; q.mu held.
std::uint64_t seen_time(QueueTrace& q, std::uint64_t value, std::uint64_t fallback) {
  while (!q.seen.empty() && q.seen.front().first < value) q.seen.pop_front();
  return q.seen.empty() ? fallback : q.seen.front().second;
}

// Takes what completed on `q` (stamps read), a failure, a new depth and,
// with `final`, what will never complete; q.mu held. Short: no formatting.
Drained extract_locked(const std::shared_ptr<QueueTrace>& qp, bool final) {
  QueueTrace& q = *qp;
  Drained d;
  d.q = qp;
  d.polled = now();
  if (!q.backend) return d;
  const driver::Timeline t = q.backend->timeline();
  note_seen(q, t.completed, d.polled);
  d.failed = t.failed;
  std::deque<Pending> keep;
  for (auto& p : q.pending) {
    if (p.cancelled) continue;
    if (p.value && p.value <= t.completed) {
      p.st.resize(p.stamps);
      for (std::uint32_t i = 0; i < p.stamps; ++i) std::memcpy(&p.st[i], q.base + ((p.slot + i) % kSlots) * 8, 8);
      d.done.push_back(std::move(p));
    } else if (p.value && (t.failed || final)) {
      d.open.push_back(std::move(p));
    } else {
      keep.push_back(std::move(p));
    }
  }
  std::sort(d.done.begin(), d.done.end(), [](const Pending& a, const Pending& b) { return a.value < b.value; });
  for (auto& p : d.done) p.seen_at = seen_time(q, p.value, d.polled);
  q.pending = std::move(keep);
  q.tail = q.pending.empty() ? q.head : q.pending.front().slot;
  if (t.failed && !q.failure_reported) {
    q.failure_reported = true;
    try {
      d.failure = q.backend->failure().what();
    } catch (...) {
      d.failure = "the queue failed";
    }
  }
  if (d.polled - q.last_counter >= kCounterEveryNs || final) {
    q.last_counter = d.polled;
    const std::uint64_t depth = t.failed ? 0 : q.backend->submitted() - t.completed;
    if (depth != q.last_depth) {
      q.last_depth = depth;
      d.depth = depth;
    }
  }
  return d;
}

// Writes what extract_locked took, its completed submissions already
// written (emit_round); out_mu held, on the writer's thread (or stop()'s
// once it has joined).
void emit(Session& s, const Drained& d) {
  QueueTrace& q = *d.q;
  DeviceTrace::Track& track = q.dev->tracks[q.tid];
  if (!d.failure.empty()) {
    name_queue(s, q);
    queue_instant(s, q, "queue failed", std::max(d.polled, track.end), d.failure);
  }
  // Work that will never complete (failed) or not in this trace: a
  // zero-length slice closes each flow.
  for (const Pending& p : d.open) {
    name_queue(s, q);
    const std::uint64_t at = std::max(d.polled, track.end);
    device_slice(s, q, d.failed ? "not completed (queue failed)" : "not completed at trace end", {}, at, 0,
                 fmt::format("\"value\":{},\"correlation\":{}", p.value, p.correlation));
    flow_end(s, q, at, p.correlation);
    track.end = at;
  }
  if (d.depth) {
    s.begin_event();
    fmt::format_to(std::back_inserter(s.out),
                   "{{\"ph\":\"C\",\"name\":\"{} depth\",\"cat\":\"device\",\"ts\":", q.track);
    track.counter = std::max(track.counter, d.polled);
    micros(s.out, track.counter);
    fmt::format_to(std::back_inserter(s.out), ",\"pid\":{},\"tid\":0,\"args\":{{\"submissions\":{}}}}}", q.dev->pid,
                   *d.depth);
  }
}

void describe_device(Session& s, DeviceTrace& d) {
  if (d.described) return;
  d.described = true;
  s.metadata("process_name", d.pid, 0,
             d.uri + (d.timestamps ? " (board clock)" : " (no board timestamps: host side only)"));
  s.sort_index("process_sort_index", d.pid, 0, d.pid);
}

void Session::take_host_events(bool final) {
  const std::uint64_t cut = final ? UINT64_MAX : now();
  std::vector<std::shared_ptr<ThreadBuf>> bufs;
  {
    std::lock_guard lock(mu);
    bufs = threads;
  }
  std::uint64_t lost = 0;
  std::vector<ThreadBuf*> fresh;
  // Each thread's events are in time order (read under its lock), and so is
  // each run held back from earlier rounds: merge the runs up to the cut.
  struct Run {
    std::vector<Event>* events;
    std::size_t at, end;
  };
  std::vector<Run> runs;
  std::vector<std::vector<Event>> carry;
  auto add = [&](std::vector<Event>& v) {
    const auto end = static_cast<std::size_t>(
        std::upper_bound(v.begin(), v.end(), cut, [](std::uint64_t t, const Event& e) { return t < e.ts; }) -
        v.begin());
    if (end < v.size())
      carry.emplace_back(std::make_move_iterator(v.begin() + static_cast<std::ptrdiff_t>(end)),
                         std::make_move_iterator(v.end()));
    if (end > 0) runs.push_back({&v, 0, end});
  };
  for (auto& h : held) add(h);
  for (auto& b : bufs) {
    {
      std::lock_guard lock(b->mu);
      b->taken.swap(b->events);
      lost += b->dropped;
      b->dropped = 0;
    }
    if (!b->named) fresh.push_back(b.get());
    add(b->taken);
  }
  std::vector<std::shared_ptr<DeviceTrace>> devs;
  {
    std::lock_guard lock(mu);
    devs = devices;
    // A thread that ended and was drained has nothing more to say.
    std::erase_if(threads, [](const std::shared_ptr<ThreadBuf>& b) {
      std::lock_guard held_lock(b->mu);
      return b.use_count() == 1 && b->events.empty() && b->taken.empty() && b->named;
    });
  }
  std::lock_guard out_lock(out_mu);
  for (ThreadBuf* b : fresh) {
    b->named = true;
    metadata("thread_name", pid, b->tid, b->name);
  }
  for (auto& d : devs) describe_device(*this, *d);
  auto later = [](const Run& a, const Run& b) { return (*a.events)[a.at].ts > (*b.events)[b.at].ts; };
  std::make_heap(runs.begin(), runs.end(), later);
  while (!runs.empty()) {
    std::pop_heap(runs.begin(), runs.end(), later);
    Run& r = runs.back();
    const Event& e = (*r.events)[r.at];
    if (e.on_device && e.tid >= kVideoTrack)
      for (auto& d : devs)
        if (d->pid == e.pid &&
            std::find(d->channels_named.begin(), d->channels_named.end(), e.tid) == d->channels_named.end()) {
          d->channels_named.push_back(e.tid);
          metadata("thread_name", d->pid, e.tid, "video channel " + std::to_string(e.tid - kVideoTrack));
        }
    write(e);
    if (++r.at == r.end)
      runs.pop_back();
    else
      std::push_heap(runs.begin(), runs.end(), later);
  }
  for (auto& b : bufs) b->taken.clear();
  held = std::move(carry);
  if (lost) {
    dropped += lost;
    begin_event();
    out += "{\"ph\":\"C\",\"name\":\"dropped trace events\",\"cat\":\"hal\",\"ts\":";
    micros(out, final ? now() : cut);
    fmt::format_to(std::back_inserter(out), ",\"pid\":{},\"tid\":0,\"args\":{{\"events\":{}}}}}", pid, dropped);
  }
}

void Session::sample_counters(std::uint64_t t) {
  std::vector<std::shared_ptr<DeviceTrace>> devs;
  {
    std::lock_guard lock(mu);
    devs = devices;
  }
  for (auto& d : devs) {
    auto dev = d->device.lock();
    if (!dev) continue;
    MemoryStats stats;
    try {
      stats = dev->backend().memory_stats();
    } catch (const Error&) {
      continue;
    }
    std::lock_guard out_lock(out_mu);
    for (const auto& h : stats.heaps) {
      auto [it, added] = d->heap_used.try_emplace(h.name, UINT64_MAX);
      if (it->second == h.used) continue;
      it->second = h.used;
      begin_event();
      out += fmt::format("{{\"ph\":\"C\",\"name\":\"memory {}\",\"cat\":\"device\",\"ts\":", h.name);
      micros(out, t);
      out += fmt::format(",\"pid\":{},\"tid\":0,\"args\":{{\"bytes\":{}}}}}", d->pid, h.used);
    }
  }
}

// Writes the round's completed submissions, each after those it waited for;
// out_mu held.
void Session::emit_in_order(const std::vector<std::shared_ptr<QueueTrace>>& qs, std::vector<Drained>& drained) {
  std::vector<const Drained*> busy;  // guards against a cycle, which a board cannot make
  std::function<void(Drained&)> emit_next;
  auto upto = [&](const QueueTrace* q, std::uint64_t value) {
    for (Drained& d : drained) {
      if (d.q.get() != q) continue;
      if (std::find(busy.begin(), busy.end(), &d) != busy.end()) return;
      while (d.next < d.done.size() && d.q->emitted < value) emit_next(d);
    }
  };
  emit_next = [&](Drained& d) {
    busy.push_back(&d);
    const Pending& p = d.done[d.next];
    for (const CmdInfo& c : p.cmds)
      if (const auto x = find_queue(qs, c.waits_on)) upto(x.get(), c.value);
    emit_completed(*this, *d.q, p, [&](const CmdInfo& c) {
      const auto x = find_queue(qs, c.waits_on);
      return x ? end_of(*x, c.value) : std::uint64_t{0};
    });
    ++d.next;
    busy.pop_back();
  };
  for (Drained& d : drained)
    while (d.next < d.done.size()) emit_next(d);
}

void Session::round(bool final) {
  take_host_events(final);
  std::vector<std::shared_ptr<QueueTrace>> qs;
  {
    std::lock_guard lock(mu);
    qs = queues;
  }
  std::vector<Drained> drained;
  {
    std::lock_guard lock(closed_mu);
    drained.swap(closed);
  }
  // The queues are read one after another while they run: a submission
  // can complete between the reads of two queues, after its queue was read
  // and before another it waited for was. The queues with work in flight
  // are read again until a pass finds nothing new (a few at most), so that
  // whatever this round leaves completed after every queue's last read:
  // the host saw it later than anything written now, and work that waits
  // for other work is taken in the same round as that work or a later one.
  std::vector<std::shared_ptr<QueueTrace>> busy = qs;
  for (int pass = 0; pass < 4 && !busy.empty(); ++pass) {
    std::vector<std::shared_ptr<QueueTrace>> again;
    bool fresh = false;
    for (auto& q : busy) {
      std::lock_guard lock(q->mu);
      Drained d = extract_locked(q, final);
      fresh = fresh || !d.done.empty();
      if (!q->pending.empty() && !d.failed) again.push_back(q);
      if (pass == 0 || !d.done.empty() || !d.open.empty() || d.failure.size() || d.depth)
        drained.push_back(std::move(d));
    }
    if (!fresh) break;
    busy = std::move(again);
  }
  // Every submission taken is placed with the middle of the bounds once
  // all of them are folded in (one estimate for the round, which satisfies
  // each one's own bounds), unless the bounds started again on the way:
  // then each keeps the estimate of its own fold.
  std::map<const DeviceTrace*, std::uint64_t> resyncs;
  for (Drained& d : drained) {
    resyncs.try_emplace(d.q->dev.get(), d.q->dev->resyncs);
    for (Pending& p : d.done) p.off = fold_bounds(*d.q, p);
  }
  for (Drained& d : drained) {
    DeviceTrace& dev = *d.q->dev;
    std::lock_guard lock(dev.mu);
    if (dev.resyncs != resyncs[&dev]) continue;
    for (Pending& p : d.done) p.off = dev.lo / 2 + dev.hi / 2;
  }
  {
    std::lock_guard out_lock(out_mu);
    emit_in_order(qs, drained);
    for (const Drained& d : drained) emit(*this, d);
  }
  const std::uint64_t t = now();
  if (t - last_counters >= kCounterEveryNs || final) {
    last_counters = t;
    sample_counters(t);
  }
  std::lock_guard out_lock(out_mu);
  flush();
}

void Session::run() {
  pthread_setname_np(pthread_self(), "tpuhal-trace");
  // The program's threads come first: the writer takes what CPU is left,
  // and when that is not enough, events are dropped and counted.
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(gettid_now()), 19);
  std::unique_lock lock(wake_mu);
  while (!stopping) {
    wake.wait_for(lock, kRound, [&] { return stopping || kicked; });
    kicked = false;
    if (stopping) break;
    lock.unlock();
    round(false);
    lock.lock();
  }
}

std::string expand_path(std::string_view path) {
  std::string out;
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '%' && i + 1 < path.size() && path[i + 1] == 'p') {
      out += std::to_string(::getpid());
      ++i;
    } else {
      out += path[i];
    }
  }
  return out;
}

std::string process_name() {
  char comm[64] = {};
  if (std::FILE* f = std::fopen("/proc/self/comm", "r")) {
    if (std::fgets(comm, sizeof comm, f)) comm[std::strcspn(comm, "\n")] = 0;
    std::fclose(f);
  }
  return comm[0] ? comm : "process";
}

// Children of fork() do not inherit the trace: they would share its file,
// and its writer thread is not in them. stop() there leaves it be.
void after_fork_child() {
  g_on.store(false, std::memory_order_relaxed);
  g_gen.fetch_add(1, std::memory_order_acq_rel);
}

}  // namespace

// ---- hooks ------------------------------------------------------------------------

Slice::Slice(const char* name, std::initializer_list<Arg> args, std::string text, const char* text_key, Kind kind) {
  if (!tracing::on()) return;
  on_ = true;
  kind_ = kind;
  if (kind != Kind::Call) exceptions_ = std::uncaught_exceptions();
  if (kind == Kind::Nesting) {
    Event e = make('B', name, args, std::move(text));
    e.text_key = text_key;
    push(std::move(e));
    return;
  }
  name_ = name;
  text_key_ = text_key;
  text_ = std::move(text);
  for (const Arg& a : args)
    if (nargs_ < std::size(args_)) args_[nargs_++] = a;
  begin_ = now();
}

void Slice::end_arg(const Arg& a) {
  if (on_ && nargs_ < std::size(args_)) args_[nargs_++] = a;
}

Slice::~Slice() {
  if (!on_) return;
  const bool threw = kind_ == Kind::Call ? failed_ : std::uncaught_exceptions() > exceptions_;
  push_with([&](Event& e) {
    if (kind_ == Kind::Nesting) {
      e.ph = 'E';
    } else {
      e.ph = 'X';
      e.name = name_;
      e.ts = begin_;
      e.id = flow_;
      if (!text_.empty()) e.text = std::move(text_);
      e.text_key = text_key_;
    }
    std::copy_n(args_, nargs_, e.args);
    e.nargs = nargs_;
    if (threw && e.nargs < std::size(e.args)) e.args[e.nargs++] = Arg("threw", std::uint64_t{1});
  });
}

void instant(const char* name, std::initializer_list<Arg> args, std::string text) {
  if (!on()) return;
  push(make('i', name, args, std::move(text)));
}

std::shared_ptr<QueueTrace> queue_trace(QueueImpl& queue) {
  std::lock_guard lock(queue.tracing_mu);
  const std::uint64_t gen = g_gen.load(std::memory_order_acquire);
  if (queue.tracing && queue.tracing_gen == gen) return queue.tracing;
  queue.tracing.reset();
  auto s = session();
  if (!s || s->gen != gen) return nullptr;
  auto q = std::make_shared<QueueTrace>();
  q->dev = device_trace(*s, queue.device());
  q->backend = queue.backend_ptr();
  q->name = queue.name();
  const Engine engine = q->backend->engine();
  q->track = std::string(to_string(engine)) + " queue " + std::to_string(q->backend->index());
  q->tid = 1 + static_cast<std::uint32_t>(engine) * 100 + q->backend->index();
  q->key.store(q->backend.get(), std::memory_order_relaxed);
  if (q->dev->timestamps) {
    try {
      q->stamps = queue.device()->backend().allocate(kSlots * 8, Memory::HostPinned, {});
      q->base = q->stamps->map().data();
    } catch (const Error& e) {
      base::logger("trace")->warn("trace: {}: no pinned memory for board timestamps ({}); host side only", q->name,
                                  e.what());
      q->stamps.reset();
      q->base = nullptr;
    }
  }
  {
    std::lock_guard reg(s->mu);
    s->queues.push_back(q);
  }
  queue.tracing = q;
  queue.tracing_gen = gen;
  return q;
}

const char* queue_trace_name(const QueueTrace& q) noexcept { return q.name.c_str(); }

void observed(QueueImpl& queue, std::uint64_t completed) {
  std::shared_ptr<QueueTrace> q;
  {
    std::lock_guard lock(queue.tracing_mu);
    if (queue.tracing_gen != g_gen.load(std::memory_order_acquire)) return;
    q = queue.tracing;
  }
  if (!q || completed <= q->seen_max.load(std::memory_order_relaxed)) return;
  const std::uint64_t t = now();
  std::lock_guard lock(q->mu);
  if (completed <= q->seen_max.load(std::memory_order_relaxed)) return;
  q->seen_max.store(completed, std::memory_order_relaxed);
  note_seen(*q, completed, t);
}

void queue_closing(QueueImpl& queue) {
  std::shared_ptr<QueueTrace> q;
  std::uint64_t gen;
  {
    std::lock_guard lock(queue.tracing_mu);
    q = std::move(queue.tracing);
    gen = queue.tracing_gen;
  }
  if (!q) return;
  std::shared_ptr<driver::BufferBackend> stamps;
  std::shared_ptr<driver::QueueBackend> backend;
  auto s = session();
  if (s && s->gen != gen) s.reset();  // a trace since stopped: its queue state goes unwritten
  Drained last;
  {
    std::lock_guard lock(q->mu);
    if (s && q->backend) last = extract_locked(q, true);
    q->pending.clear();
    q->key.store(nullptr, std::memory_order_relaxed);
    stamps = std::move(q->stamps);
    backend = std::move(q->backend);
    q->base = nullptr;
  }
  // The writer writes it: this thread does not wait for the writer.
  if (s && last.q) {
    std::lock_guard lock(s->closed_mu);
    s->closed.push_back(std::move(last));
  }
  // `stamps` and `backend` go here, outside the locks.
}

SubmitScope::SubmitScope(QueueImpl& queue, std::span<const driver::Command> commands) : commands_(commands) {
  if (!on()) return;
  q_ = queue_trace(queue);
  if (!q_) return;
  slice_.emplace("submit",
                 std::initializer_list<Arg>{Arg("queue", q_->name.c_str()),
                                            Arg("commands", static_cast<std::uint64_t>(commands.size()))},
                 std::string(), "message", Slice::Kind::Call);
  if (commands.empty()) return;
  if (!q_->base) {
    if (q_->dev->timestamps) q_->dev->unstamped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const bool per = commands.size() <= trace::kStampedCommands;
  const auto need = static_cast<std::uint32_t>(per ? commands.size() + 1 : 2);
  std::uint64_t slot;
  {
    std::lock_guard lock(q_->mu);
    if (q_->head + need - q_->tail > kSlots) {
      q_->dev->unstamped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    slot = q_->head;
    q_->head += need;
    Pending p;
    p.id = q_->next_id++;
    p.slot = slot;
    p.stamps = need;
    p.per_command = per;
    p.commands = static_cast<std::uint32_t>(commands.size());
    correlation_ = p.correlation = g_correlation.fetch_add(1, std::memory_order_relaxed) + 1;
    pending_ = p.id;
    q_->pending.push_back(std::move(p));
  }
  // Describe outside the queue's lock; the commands' objects are alive now.
  std::vector<CmdInfo> cmds;
  if (per) {
    const Properties& props = queue.device()->backend().properties();
    cmds.reserve(commands.size());
    for (const auto& c : commands) cmds.push_back(describe(c, props));
  }
  auto stamp = [&](std::uint32_t i) {
    return driver::cmd::Timestamp{{q_->stamps.get(), ((slot + i) % kSlots) * 8}, true};
  };
  stamped_.reserve(commands.size() + need);
  stamped_.push_back(stamp(0));
  for (std::size_t i = 0; i < commands.size(); ++i) {
    stamped_.push_back(commands[i]);
    if (per) stamped_.push_back(stamp(static_cast<std::uint32_t>(i + 1)));
  }
  if (!per) stamped_.push_back(stamp(1));
  commands_ = stamped_;
  std::lock_guard lock(q_->mu);
  for (auto& p : q_->pending)
    if (p.id == pending_) {
      p.cmds = std::move(cmds);
      p.host_submit = now();  // the board cannot stamp before this
    }
}

void SubmitScope::retain(std::vector<std::shared_ptr<const void>>& retained) const {
  if (pending_) retained.push_back(q_->stamps);
}

bool SubmitScope::drop_stamps() {
  if (!pending_) return false;
  {
    std::lock_guard lock(q_->mu);
    for (auto& p : q_->pending)
      if (p.id == pending_) p.cancelled = true;
  }
  q_->dev->unstamped.fetch_add(1, std::memory_order_relaxed);
  pending_ = 0;
  correlation_ = 0;
  stamped_.clear();
  return true;
}

void SubmitScope::submitted(std::uint64_t value) {
  done_ = true;
  if (!q_) return;
  if (pending_) {
    {
      std::lock_guard lock(q_->mu);
      for (auto& p : q_->pending)
        if (p.id == pending_) p.value = value;
    }
    q_->dev->stamped.fetch_add(1, std::memory_order_relaxed);
    slice_->flow(correlation_);
    slice_->end_arg(Arg("correlation", correlation_));
  }
  slice_->end_arg(Arg("value", value));
}

SubmitScope::~SubmitScope() {
  if (!done_ && slice_) slice_->failed();
  if (!done_ && pending_ && q_) {
    std::lock_guard lock(q_->mu);
    for (auto& p : q_->pending)
      if (p.id == pending_) p.cancelled = true;
  }
}

void device_instant(const std::shared_ptr<DeviceImpl>& device, const char* name, std::string text) {
  if (!on()) return;
  auto s = session();
  if (!s) return;
  auto d = device_trace(*s, device);
  Event e = make('i', name, {}, std::move(text));
  e.on_device = true;
  e.pid = d->pid;
  e.tid = 0;
  push(std::move(e));
}

void frame(const std::shared_ptr<DeviceImpl>& device, std::uint32_t channel, std::int64_t pts, std::uint64_t index,
           std::uint32_t width, std::uint32_t height) {
  if (!on()) return;
  auto s = session();
  if (!s) return;
  auto d = device_trace(*s, device);
  Event e =
      make('i', "frame",
           {Arg("channel", std::uint64_t{channel}), Arg("index", index), Arg("pts", static_cast<std::uint64_t>(pts)),
            Arg("width", std::uint64_t{width}), Arg("height", std::uint64_t{height})},
           {});
  e.on_device = true;
  e.pid = d->pid;
  e.tid = kVideoTrack + channel;
  push(std::move(e));
}

}  // namespace tpuhal::detail::tracing

// ---- the public API ------------------------------------------------------------------

namespace tpuhal::trace {

using detail::tracing::g_gen;
using detail::tracing::g_mu;
using detail::tracing::g_on;
using detail::tracing::g_session;

void start(std::string_view path_in) {
  namespace t = detail::tracing;
  if (path_in.empty()) throw Error(Status::InvalidArgument, "trace::start: no file name given");
  const std::string path = t::expand_path(path_in);
  std::lock_guard lock(g_mu);
  if (g_session)
    throw Error(Status::FailedPrecondition,
                "trace::start: a trace is already being written to " + g_session->path + "; stop it first");
  // A new file, renamed over `path` at once and then written as the program
  // runs (a crash leaves what was written): a link someone planted at the
  // name in a shared directory is replaced, never followed.
  std::FILE* f = nullptr;
  int err = 0;
  std::string why;
  try {
    base::OutputFile out(path);
    out.publish();
    const int fd = out.release();
    f = ::fdopen(fd, "w");
    if (!f) {
      err = errno;
      why = "cannot create " + path + ": " + std::strerror(err);
      ::close(fd);
    }
  } catch (const std::system_error& e) {
    err = e.code().value();
    why = e.what();
  }
  if (!f) {
    const Status st = err == ENOENT                                   ? Status::NotFound
                      : err == EACCES || err == EPERM || err == EROFS ? Status::PermissionDenied
                                                                      : Status::InvalidArgument;
    throw Error(st, "trace: " + why);
  }
  auto s = std::make_shared<t::Session>();
  s->path = path;
  s->file = f;
  s->pid = ::getpid();
  s->gen = g_gen.load() + 1;
  t::g_correlation.store(static_cast<std::uint64_t>(s->pid) << 31, std::memory_order_relaxed);
  s->out = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[";
  s->metadata("process_name", s->pid, 0, t::process_name());
  s->sort_index("process_sort_index", s->pid, 0, 0);
  s->flush();
  static std::once_flag fork_handler;
  std::call_once(fork_handler, [] { pthread_atfork(nullptr, nullptr, t::after_fork_child); });
  g_session = s;
  g_gen.store(s->gen, std::memory_order_release);
  g_on.store(true, std::memory_order_release);
  s->writer = std::thread([s] { s->run(); });
}

Summary stop() {
  namespace t = detail::tracing;
  std::shared_ptr<t::Session> s;
  {
    std::lock_guard lock(g_mu);
    s = std::move(g_session);
    g_session.reset();
    if (!s) return {};
    if (s->pid != ::getpid()) {
      // A fork()ed child: the trace is its parent's. Forget it unfinished.
      new std::shared_ptr<t::Session>(std::move(s));  // NOLINT: deliberately never freed
      return {};
    }
    g_on.store(false, std::memory_order_release);
    g_gen.fetch_add(1, std::memory_order_acq_rel);  // stale thread buffers stop being used
  }
  {
    std::lock_guard lock(s->wake_mu);
    s->stopping = true;
  }
  s->wake.notify_one();
  if (s->writer.joinable()) s->writer.join();
  s->round(true);
  std::uint64_t unstamped = 0;
  std::lock_guard out(s->out_mu);
  s->out += "\n],\"otherData\":{\"clock\":\"CLOCK_MONOTONIC\",\"tpuhal_version\":";
  t::quoted(s->out, version());
  s->out += fmt::format(",\"events\":{},\"dropped_events\":{},\"devices\":{{", s->events, s->dropped);
  {
    std::lock_guard lock(s->mu);
    bool comma = false;
    for (auto& d : s->devices) {
      if (comma) s->out += ',';
      comma = true;
      t::quoted(s->out, d->uri);
      s->out += ':';
      std::lock_guard dl(d->mu);
      unstamped += d->unstamped.load();
      s->out += fmt::format("{{\"pid\":{},\"board_timestamps\":{}", d->pid, d->timestamps);
      if (d->modelled) s->out += ",\"board_clock\":\"modelled\"";
      if (!d->timestamps) s->out += ",\"note\":\"the device keeps no board timestamps: only the host side is traced\"";
      s->out += fmt::format(",\"stamped_submissions\":{},\"unstamped_submissions\":{}", d->stamped.load(),
                            d->unstamped.load());
      if (d->lo != INT64_MIN && d->hi != INT64_MAX)
        s->out += fmt::format(",\"clock_offset_ns\":{},\"sync_error_ns\":{},\"resyncs\":{}", d->lo / 2 + d->hi / 2,
                              (d->hi - d->lo + 1) / 2, d->resyncs);
      s->out += '}';
    }
  }
  s->out += "}}}\n";
  s->flush();
  Summary sum{s->path, s->events, s->dropped, unstamped, s->error};
  if (std::fclose(s->file) != 0 && sum.error.empty()) sum.error = s->path + ": " + std::strerror(errno);
  s->file = nullptr;
  return sum;
}

bool active() noexcept { return g_on.load(std::memory_order_relaxed); }

Scope::Scope(std::string_view name) {
  if (!detail::tracing::on()) return;
  on_ = true;
  detail::tracing::Event e;
  e.ph = 'B';
  e.dyn_name = name;
  detail::tracing::push(std::move(e));
}

Scope::~Scope() {
  if (!on_) return;
  detail::tracing::Event e;
  e.ph = 'E';
  detail::tracing::push(std::move(e));
}

void mark(std::string_view name) {
  if (!detail::tracing::on()) return;
  detail::tracing::Event e;
  e.ph = 'i';
  e.dyn_name = name;
  detail::tracing::push(std::move(e));
}

namespace {
// TPUHAL_TRACE=FILE: the whole program is traced; the file is finished
// when the library unloads (at exit).
struct FromEnvironment {
  bool started = false;
  FromEnvironment() {
    const char* path = std::getenv("TPUHAL_TRACE");
    if (!path || !*path) return;
    try {
      start(path);
      started = true;
    } catch (const Error& e) {
      std::fprintf(stderr, "tpuhal: TPUHAL_TRACE: %s; running without a trace\n", e.what());
    }
  }
  ~FromEnvironment() {
    if (!started) return;
    const Summary s = stop();
    if (!s.error.empty()) std::fprintf(stderr, "tpuhal: TPUHAL_TRACE: %s\n", s.error.c_str());
  }
} g_from_environment;
}  // namespace

}  // namespace tpuhal::trace
