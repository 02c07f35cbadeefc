// tpuhal exporter: every board's telemetry as Prometheus metrics
// (docs/operations.md), served by prometheus-cpp's HTTP server.
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "cli.h"
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

}  // namespace

int cmd_exporter(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("listen", po::value<std::string>()->default_value("127.0.0.1:9841"),
                     "ADDRESS:PORT to serve /metrics on (port 0: any free one; the line 'listening on "
                     "ADDRESS:PORT' says which)")("device,d", po::value<std::vector<std::string>>(),
                                                  "a board to export (repeat; default: every board)")(
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
             "(sim:) is the exporter's own. Metrics and labels: docs/operations.md.",
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
      listen.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
    std::fprintf(stderr, "tpuhal exporter: --listen takes ADDRESS:PORT (127.0.0.1:9841), got '%s'\n", listen.c_str());
    return 2;
  }
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(listen, 2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpuhal exporter: cannot listen on %s: %s\n", listen.c_str(), e.what());
    return 1;
  }
  exposer->RegisterCollectable(collector);
  const auto ports = exposer->GetListeningPorts();
  std::printf("listening on %s:%d (%zu board(s))\n", listen.substr(0, colon).c_str(), ports.empty() ? 0 : ports[0],
              uris.size());
  std::fflush(stdout);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return 0;
}

}  // namespace tpuhal::cli
