// tpuhal exporter: every board's telemetry as Prometheus metrics
// (docs/operations.md), in prometheus-cpp's text format, served by a small
// HTTP server of its own that no client can starve (below).
#include <netdb.h>
#include <netinet/in.h>
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <unordered_map>

#include "cli.h"
#include "tpuhal/base/fd.h"
#include "tpuhal/monitor.hpp"

namespace tpuhal::cli {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

// The families of one scrape, by name, in the order first used.
class Families {
 public:
  void add(const std::string& name, MetricType type, const std::string& help, Labels labels, double value) {
    auto [it, fresh] = index_.try_emplace(name, families_.size());
    if (fresh) families_.push_back({name, help, type, {}});
    ClientMetric m;
    m.label = std::move(labels);
    if (type == MetricType::Counter)
      m.counter.value = value;
    else
      m.gauge.value = value;
    families_[it->second].metric.push_back(std::move(m));
  }
  void counter(const std::string& name, const std::string& help, Labels labels, double value) {
    add(name, MetricType::Counter, help, std::move(labels), value);
  }
  void gauge(const std::string& name, const std::string& help, Labels labels, double value) {
    add(name, MetricType::Gauge, help, std::move(labels), value);
  }
  std::vector<MetricFamily> take() { return std::move(families_); }

 private:
  std::vector<MetricFamily> families_;
  std::map<std::string, std::size_t> index_;
};

Labels with(Labels base, std::initializer_list<ClientMetric::Label> more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

double seconds(std::uint64_t ns) { return static_cast<double>(ns) * 1e-9; }
double num(std::uint64_t v) { return static_cast<double>(v); }

const char* const kDirections[] = {"h2d", "d2h", "d2d", "h2h"};

// The board-wide series of one telemetry snapshot.
void add_telemetry(Families& f, const Labels& dev, const Telemetry& t) {
  f.gauge("tpuhal_uptime_seconds", "Time since the board powered on (since its daemon started, when shared).", dev,
          seconds(t.uptime_ns));
  f.counter("tpuhal_resets_total", "Board resets.", dev, num(t.resets));
  for (auto& e : t.engines)
    f.counter("tpuhal_engine_busy_seconds_total",
              "Time during which at least one queue of the engine ran work (summed over shares when shared).",
              with(dev, {{"engine", to_string(e.engine)}}), seconds(e.busy_ns));
  for (auto& q : t.queues) {
    const Labels l = with(dev, {{"engine", to_string(q.engine)}, {"queue", std::to_string(q.index)}});
    f.counter("tpuhal_queue_commands_total", "Commands the hardware queue retired.", l, num(q.commands));
    f.counter("tpuhal_queue_busy_seconds_total", "Time the hardware queue spent running work.", l, seconds(q.busy_ns));
    f.counter("tpuhal_queue_failures_total", "Commands that failed on the hardware queue.", l, num(q.failures));
  }
  const std::uint64_t dma[] = {t.h2d_bytes, t.d2h_bytes, t.d2d_bytes, t.h2h_bytes};
  for (int d = 0; d < 4; ++d)
    f.counter("tpuhal_dma_bytes_total", "Bytes moved by copy and fill commands, by direction.",
              with(dev, {{"direction", kDirections[d]}}), num(dma[d]));
  for (auto& c : t.channels) {
    const Labels l = with(dev, {{"channel", std::to_string(c.channel)}});
    f.counter("tpuhal_decode_packets_total", "Compressed packets the decode channel took.", l, num(c.packets));
    f.counter("tpuhal_decode_frames_total", "Frames the decode channel decoded.", l, num(c.frames));
    f.counter("tpuhal_decode_errors_total", "Packets the decode channel could not decode.", l, num(c.errors));
    f.counter("tpuhal_decode_busy_seconds_total", "Time the decoder spent on the channel.", l, seconds(c.busy_ns));
  }
  for (auto& x : t.faults)
    f.counter("tpuhal_faults_total", "Failed commands by kind, and firmware crashes.", with(dev, {{"kind", x.kind}}),
              num(x.count));
  f.gauge("tpuhal_temperature_celsius", "Die temperature.", dev, t.temperature_c);
  f.gauge("tpuhal_power_watts", "Board power over the last interval.", dev, t.power_w);
  f.gauge("tpuhal_power_limit_watts", "The board's power limit.", dev, t.power_limit_w);
  f.counter("tpuhal_energy_joules_total", "Energy since power-on.", dev, t.energy_j);
  f.gauge("tpuhal_clock_hertz", "The compute clock.", dev, t.clock_mhz * 1e6);
}

void add_process(Families& f, const Labels& dev, const ProcessUsage& p) {
  const Labels l = with(dev, {{"vf", std::to_string(p.vf)}, {"pid", std::to_string(p.pid)}, {"process", p.name}});
  f.gauge("tpuhal_process_memory_bytes", "Device memory resident for the process.", l, num(p.memory_bytes));
  for (auto& h : p.heaps)
    f.gauge("tpuhal_process_heap_memory_bytes", "Device memory resident for the process, by heap.",
            with(l, {{"heap", h.heap}}), num(h.bytes));
  f.gauge("tpuhal_process_queues", "Hardware queues the process has enabled.", l, num(p.queues));
  f.gauge("tpuhal_process_dma_mapped_bytes", "Host memory of the process the board may reach.", l,
          num(p.dma_mapped_bytes));
  for (auto& e : p.engines)
    f.counter("tpuhal_process_engine_busy_seconds_total", "The process's engine busy time since it attached.",
              with(l, {{"engine", to_string(e.engine)}}), seconds(e.busy_ns));
  const std::uint64_t dma[] = {p.h2d_bytes, p.d2h_bytes, p.d2d_bytes, p.h2h_bytes};
  for (int d = 0; d < 4; ++d)
    f.counter("tpuhal_process_dma_bytes_total", "Bytes the process's commands moved since it attached.",
              with(l, {{"direction", kDirections[d]}}), num(dma[d]));
  f.counter("tpuhal_process_commands_total", "Commands of the process retired since it attached.", l, num(p.commands));
  f.counter("tpuhal_process_failures_total", "Commands of the process that failed since it attached.", l,
            num(p.failures));
  f.counter("tpuhal_process_frames_total", "Frames decoded for the process since it attached.", l, num(p.frames));
}

// One board the exporter watches: opened once, or observed from outside.
struct Watched {
  std::string uri;
  std::optional<Device> dev;
  std::string last_error;  // logged once until it changes
};

class BoardCollector final : public prometheus::Collectable {
 public:
  explicit BoardCollector(std::vector<std::string> uris) {
    for (auto& u : uris) boards_.push_back({u, std::nullopt, {}});
  }

  std::vector<MetricFamily> Collect() const override {
    std::lock_guard lock(mu_);
    Families f;
    for (auto& b : boards_) collect(f, b);
    f.counter("tpuhal_exporter_scrapes_total", "Scrapes this exporter has answered.", {}, num(++scrapes_));
    return f.take();
  }

 private:
  // One board's figures, read in full before any is exported, so that a
  // board that fails half-way adds nothing but tpuhal_up 0.
  struct Reading {
    std::string board, driver, serial;
    std::optional<Telemetry> telemetry;
    std::uint64_t memory_total = 0, memory_used = 0;
    std::vector<HeapStats> heaps;         // opened boards
    std::vector<ProcessUsage> processes;  // watched boards
  };

  static Reading read(Watched& b) {
    Reading r;
    if (observable(b.uri)) {
      BoardView v = observe(b.uri);
      r.board = v.board;
      r.driver = v.driver;
      r.telemetry = std::move(v.telemetry);
      r.memory_total = v.memory_bytes;
      r.memory_used = v.memory_used_bytes;
      r.processes = std::move(v.processes);
      return r;
    }
    if (!b.dev) b.dev = open(b.uri);
    const Properties& p = b.dev->properties();
    r.board = p.board;
    r.driver = p.driver;
    r.serial = p.serial;
    if (p.caps.telemetry) r.telemetry = b.dev->telemetry();
    MemoryStats m = b.dev->memory_stats();
    r.memory_total = m.device_total;
    r.memory_used = m.device_used;
    r.heaps = std::move(m.heaps);
    return r;
  }

  void collect(Families& f, Watched& b) const {
    const Labels dev = {{"device", b.uri}};
    const char* up = "1 when the board answered this scrape, 0 when it did not.";
    Reading r;
    try {
      r = read(b);
      b.last_error.clear();
    } catch (const Error& e) {
      // The board's series are left out of this scrape (they go stale, as
      // Prometheus expects of a target that lost a source); tpuhal_up says
      // so. A device that failed is opened afresh next time.
      if (b.last_error != e.what()) std::fprintf(stderr, "tpuhal exporter: %s\n", e.what());
      b.last_error = e.what();
      b.dev.reset();
      f.gauge("tpuhal_up", up, dev, 0);
      return;
    }
    f.gauge("tpuhal_device_info", "The board: its model, driver and serial number (always 1).",
            with(dev, {{"board", r.board}, {"driver", r.driver}, {"serial", r.serial}}), 1);
    if (r.telemetry) add_telemetry(f, dev, *r.telemetry);
    f.gauge("tpuhal_memory_total_bytes", "Device memory in total.", dev, num(r.memory_total));
    f.gauge("tpuhal_memory_used_bytes", "Device memory in use (resident for its processes, when shared).", dev,
            num(r.memory_used));
    for (auto& h : r.heaps) {
      const Labels l = with(dev, {{"heap", h.name}});
      f.gauge("tpuhal_heap_total_bytes", "The heap's size.", l, num(h.total));
      f.gauge("tpuhal_heap_used_bytes", "The heap's bytes in use.", l, num(h.used));
    }
    for (auto& p : r.processes) add_process(f, dev, p);
    f.gauge("tpuhal_up", up, dev, 1);
  }

  mutable std::mutex mu_;
  mutable std::vector<Watched> boards_;
  mutable std::uint64_t scrapes_ = 0;
};

std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop.store(true); }

// ---- the HTTP side ----------------------------------------------------------------
//
// One thread serves every connection from an epoll loop: a client that
// connects and sends nothing, or sends its request a byte at a time, costs
// a file descriptor and a few bytes, never a thread, and is cut off by
// deadlines that its trickle cannot push back. The limits:
constexpr std::size_t kMaxConnections = 512;                 // open at once (less where RLIMIT_NOFILE is lower)
constexpr auto kRequestTimeout = std::chrono::seconds(5);    // from accept to the request's end
constexpr auto kResponseTimeout = std::chrono::seconds(10);  // to hand the answer to the kernel
constexpr std::size_t kMaxRequestBytes = 8192;               // request line and headers
constexpr int kAcceptsPerRound = 64;                         // well below kMaxConnections (below)
constexpr int kBacklog = SOMAXCONN;                          // the kernel caps it at net.core.somaxconn
// At the limit a new connection closes the oldest one still sending its
// request: a flood of idle connections pushes out its own, while a scraper,
// which sends its request as it connects, is served before kMaxConnections
// / kAcceptsPerRound rounds of newcomers could push it out. Every answer
// ends the connection (Connection: close), so nothing idles between scrapes.

using Clock = std::chrono::steady_clock;

// Why the server closed a connection before answering it, as exported.
enum Dropped { kTimedOut, kEvicted, kTooLarge, kWriteTimedOut, kDroppedKinds };
const char* const kDroppedNames[] = {"request_timeout", "evicted", "request_too_large", "response_timeout"};

class MetricsServer {
 public:
  MetricsServer(base::UniqueFd listener, std::shared_ptr<BoardCollector> collector)
      : listener_(std::move(listener)), collector_(std::move(collector)) {
    rlimit nofile{};
    max_connections_ = kMaxConnections;
    if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY)
      max_connections_ = std::min<std::size_t>(max_connections_, nofile.rlim_cur > 96 ? nofile.rlim_cur - 64 : 32);
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!epoll_) throw std::system_error(errno, std::generic_category(), "epoll_create1");
    watch(listener_.get(), EPOLLIN);
  }

  // Serves until `stop` is set (checked at least every 200 ms).
  void run(const std::atomic<bool>& stop) {
    epoll_event events[64];
    while (!stop.load()) {
      const int n = ::epoll_wait(epoll_.get(), events, 64, wait_ms());
      if (n < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "epoll_wait");
      bool accept_ready = false;
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == listener_.get()) {
          accept_ready = true;
          continue;
        }
        auto it = conns_.find(fd);
        if (it == conns_.end()) continue;
        if (it->second.responding)
          write_some(it->second);
        else
          read_some(it->second);
      }
      // Clients already connected come first; then a bounded number of new ones.
      if (accept_ready) accept_some();
      expire(Clock::now());
    }
  }

 private:
  struct Conn {
    base::UniqueFd fd;
    std::uint64_t seq = 0;  // accept order
    Clock::time_point deadline;
    std::string in, out;
    std::size_t sent = 0;
    bool responding = false;
  };

  void watch(int fd, std::uint32_t what) {
    epoll_event ev{};
    ev.events = what;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0)
      throw std::system_error(errno, std::generic_category(), "epoll_ctl");
  }

  int wait_ms() const {
    auto next = Clock::now() + std::chrono::milliseconds(200);
    if (!reading_.empty()) next = std::min(next, conns_.at(reading_.begin()->second).deadline);
    if (!writing_.empty()) next = std::min(next, writing_.begin()->first.first);
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count();
    return static_cast<int>(std::clamp<std::int64_t>(ms, 0, 200));
  }

  void accept_some() {
    for (int i = 0; i < kAcceptsPerRound; ++i) {
      const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if ((errno == EMFILE || errno == ENFILE) && evict_oldest()) continue;
        return;  // EAGAIN: none left; anything else: try again next round
      }
      if (conns_.size() >= max_connections_ && !evict_oldest()) {
        ::close(fd);  // every connection is being answered: this one waits for none
        continue;
      }
      Conn& c = conns_[fd];
      c.fd.reset(fd);
      c.seq = next_seq_++;
      c.deadline = Clock::now() + kRequestTimeout;
      reading_.emplace(c.seq, fd);
      try {
        watch(fd, EPOLLIN | EPOLLRDHUP);
      } catch (const std::system_error&) {
        close(c);
        continue;
      }
      read_some(c);  // a scraper's request is usually there already
    }
  }

  bool evict_oldest() {
    if (reading_.empty()) return false;
    ++dropped_[kEvicted];
    close(conns_.at(reading_.begin()->second));
    return true;
  }

  void close(Conn& c) {
    if (c.responding)
      writing_.erase({c.deadline, c.seq});
    else
      reading_.erase(c.seq);
    conns_.erase(c.fd.get());  // closing the descriptor takes it out of the epoll set
  }

  void read_some(Conn& c) {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) return close(c);  // the client left, or its request ended short
      c.in.append(buf, static_cast<std::size_t>(n));
      if (c.in.find("\r\n\r\n") != std::string::npos || c.in.find("\n\n") != std::string::npos) return answer(c);
      if (c.in.size() > kMaxRequestBytes) {
        ++dropped_[kTooLarge];
        return respond(c, 431, "Request Header Fields Too Large", "request headers over 8 KiB\n", true);
      }
    }
  }

  // The request line decides: GET or HEAD of /metrics is a scrape.
  void answer(Conn& c) {
    const std::string line = c.in.substr(0, c.in.find_first_of("\r\n"));
    const auto sp1 = line.find(' '), sp2 = line.rfind(' ');
    if (sp1 == std::string::npos || sp2 == sp1 || line.compare(sp2 + 1, 5, "HTTP/") != 0)
      return respond(c, 400, "Bad Request", "not an HTTP request\n", true);
    const std::string method = line.substr(0, sp1);
    std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    target = target.substr(0, target.find('?'));
    const bool head = method == "HEAD";
    if (target != "/metrics") return respond(c, 404, "Not Found", "tpuhal exporter: metrics are at /metrics\n", !head);
    if (method != "GET" && !head)
      return respond(c, 405, "Method Not Allowed", "GET or HEAD\n", true, "Allow: GET, HEAD\r\n");
    std::string body;
    try {
      auto families = collector_->Collect();
      add_server_metrics(families);
      body = prometheus::TextSerializer().Serialize(families);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tpuhal exporter: a scrape failed: %s\n", e.what());
      return respond(c, 500, "Internal Server Error", std::string(e.what()) + "\n", !head);
    }
    respond(c, 200, "OK", body, !head);
  }

  void add_server_metrics(std::vector<MetricFamily>& families) const {
    MetricFamily f;
    f.name = "tpuhal_exporter_connections_dropped_total";
    f.help = "Connections the exporter closed before answering them, by reason.";
    f.type = MetricType::Counter;
    for (int k = 0; k < kDroppedKinds; ++k) {
      ClientMetric m;
      m.label = {{"reason", kDroppedNames[k]}};
      m.counter.value = num(dropped_[k]);
      f.metric.push_back(std::move(m));
    }
    families.push_back(std::move(f));
  }

  void respond(Conn& c, int code, const char* reason, const std::string& body, bool with_body,
               const char* extra_headers = "") {
    c.out = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\n" +
            (code == 200 ? "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                         : "Content-Type: text/plain; charset=utf-8\r\n") +
            extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
    if (with_body) c.out += body;
    c.in.clear();
    c.in.shrink_to_fit();
    reading_.erase(c.seq);
    c.responding = true;
    c.deadline = Clock::now() + kResponseTimeout;
    writing_.emplace(std::make_pair(c.deadline, c.seq), c.fd.get());
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.fd = c.fd.get();
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
    write_some(c);
  }

  void write_some(Conn& c) {
    while (c.sent < c.out.size()) {
      const ssize_t n = ::send(c.fd.get(), c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0) return close(c);
      c.sent += static_cast<std::size_t>(n);
    }
    // All handed over: end our side, and let go of what the client sent
    // beyond its request, so that closing sends no reset ahead of the answer.
    ::shutdown(c.fd.get(), SHUT_WR);
    char buf[4096];
    while (::recv(c.fd.get(), buf, sizeof buf, 0) > 0) {
    }
    close(c);
  }

  void expire(Clock::time_point now) {
    while (!reading_.empty()) {
      const auto [seq, fd] = *reading_.begin();
      if (conns_.at(fd).deadline > now) break;
      // What came while the loop was busy (a long scrape) still counts.
      read_some(conns_.at(fd));
      if (!reading_.empty() && reading_.begin()->first == seq) {
        ++dropped_[kTimedOut];
        close(conns_.at(fd));
      }
    }
    while (!writing_.empty() && writing_.begin()->first.first <= now) {
      ++dropped_[kWriteTimedOut];
      close(conns_.at(writing_.begin()->second));
    }
  }

  base::UniqueFd listener_, epoll_;
  std::shared_ptr<BoardCollector> collector_;
  std::size_t max_connections_;
  std::unordered_map<int, Conn> conns_;  // by descriptor
  // Connections still sending their request, oldest first (their
  // deadlines are in the same order), and those being answered, by deadline.
  std::map<std::uint64_t, int> reading_;
  std::map<std::pair<Clock::time_point, std::uint64_t>, int> writing_;
  std::uint64_t next_seq_ = 0;
  std::uint64_t dropped_[kDroppedKinds] = {};
};

// A listening socket on HOST:PORT (HOST a name or an address, IPv6 in
// brackets); port 0 takes a free one. Throws std::runtime_error saying why.
base::UniqueFd listen_on(std::string host, const std::string& port) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0)
    throw std::runtime_error(::gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, &::freeaddrinfo);
  int err = EADDRNOTAVAIL;
  for (addrinfo* a = found; a; a = a->ai_next) {
    base::UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) {
      err = errno;
      continue;
    }
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // restarts while old ones linger
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd.get(), kBacklog) == 0) return fd;
    err = errno;
  }
  throw std::runtime_error(std::strerror(err));
}

int bound_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return 0;
}

}  // namespace

int cmd_exporter(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("listen", po::value<std::string>()->default_value("127.0.0.1:9841"),
                     "ADDRESS:PORT to serve /metrics on (port 0: any free one; the line 'listening on "
                     "ADDRESS:PORT' says which; IPv6 in brackets, [::1]:9841)")(
      "device,d", po::value<std::vector<std::string>>(), "a board to export (repeat; default: every board)")(
      "once", "print one scrape's metrics to standard output and exit");
  po::variables_map vm;
  int rc = 0;
  if (!parse(args, opts, {}, vm,
             "Usage: tpuhal exporter [--listen ADDRESS:PORT] [--device URI]... [--once]\n\n"
             "Serves every board's telemetry at http://ADDRESS:PORT/metrics in Prometheus' text\n"
             "format, read afresh at each scrape: engine and queue busy time, commands, DMA bytes,\n"
             "decoded frames, faults, temperature, power, memory, and for boards shared by the\n"
             "simulator daemon (simd:) the processes using them. Boards a daemon shares are\n"
             "watched without being opened; other boards are opened once, so a simulated board\n"
             "(sim:) is the exporter's own. Metrics and labels: docs/operations.md.\n\n"
             "It listens on localhost unless told otherwise. The HTTP server has no threads to\n"
             "starve: at most 512 connections, each given 5 s to send its request (the oldest\n"
             "still sending makes room for a newcomer), 10 s to take the answer, then closed.\n"
             "It has no TLS and no authentication: to expose it, listen on an address only\n"
             "Prometheus can reach, or behind a proxy that authenticates (docs/operations.md).",
             &rc))
    return rc;
  std::vector<std::string> uris;
  if (vm.count("device")) {
    uris = vm["device"].as<std::vector<std::string>>();
  } else {
    for (auto& d : enumerate()) uris.push_back(d.uri);
  }
  auto collector = std::make_shared<BoardCollector>(uris);
  if (vm.count("once")) {
    std::cout << prometheus::TextSerializer().Serialize(collector->Collect());
    return 0;
  }
  const std::string listen = vm["listen"].as<std::string>();
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size() ||
      listen.find_first_not_of("0123456789", colon + 1) != std::string::npos || listen.size() - colon > 6 ||
      std::stoi(listen.substr(colon + 1)) > 65535) {
    std::fprintf(stderr, "tpuhal exporter: --listen takes ADDRESS:PORT (127.0.0.1:9841), got '%s'\n", listen.c_str());
    return 2;
  }
  std::unique_ptr<MetricsServer> server;
  int port = 0;
  try {
    base::UniqueFd fd = listen_on(listen.substr(0, colon), listen.substr(colon + 1));
    port = bound_port(fd.get());
    server = std::make_unique<MetricsServer>(std::move(fd), collector);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpuhal exporter: cannot listen on %s: %s\n", listen.c_str(), e.what());
    return 1;
  }
  std::printf("listening on %s:%d (%zu board(s))\n", listen.substr(0, colon).c_str(), port, uris.size());
  std::fflush(stdout);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  try {
    server->run(g_stop);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpuhal exporter: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace tpuhal::cli
