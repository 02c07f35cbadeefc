#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <optional>
#include <thread>

#include "cli.h"
#include "tpuhal/monitor.hpp"

namespace tpuhal::cli {
namespace {

std::string fit(const std::string& s, std::size_t width) {
  return s.size() <= width ? s : s.substr(0, width - 3) + "...";
}

// A device as smi sees it at one sample: its telemetry, when it keeps
// any, and the utilisation since the previous sample of it.
struct Sample {
  std::optional<Telemetry> now;
  std::optional<Utilisation> util;
};

// A board smi shows: opened, or watched from outside (a board shared by
// the simulator daemon, whose whole-board view and processes smi reads
// without taking a share of it; tpuhal/monitor.hpp).
struct Board {
  std::string uri;
  std::optional<Device> dev;
  std::optional<BoardView> view;  // the latest, when watched
};

Sample take_sample(Board& b, const std::optional<Telemetry>& before) {
  Sample s;
  try {
    if (b.dev) {
      if (!b.dev->properties().caps.telemetry) return s;
      s.now = b.dev->telemetry();
    } else {
      b.view = observe(b.uri);
      s.now = b.view->telemetry;
    }
    if (before && s.now->uptime_ns > before->uptime_ns) s.util = utilisation(*before, *s.now);
  } catch (const Error& e) {
    std::fprintf(stderr, "tpuhal smi: %s\n", e.what());
  }
  return s;
}

nlohmann::json process_json(const ProcessUsage& p) {
  auto heaps = nlohmann::json::array();
  for (auto& h : p.heaps) heaps.push_back({{"heap", h.heap}, {"bytes", h.bytes}});
  auto engines = nlohmann::json::array();
  for (auto& e : p.engines) engines.push_back({{"engine", to_string(e.engine)}, {"busy_ns", e.busy_ns}});
  return {{"pid", p.pid},
          {"uid", p.uid},
          {"name", p.name},
          {"vf", p.vf},
          {"queues", p.queues},
          {"memory_bytes", p.memory_bytes},
          {"heaps", heaps},
          {"dma_mappings", p.dma_mappings},
          {"dma_mapped_bytes", p.dma_mapped_bytes},
          {"attached_ns", p.attached_ns},
          {"engines", engines},
          {"h2d_bytes", p.h2d_bytes},
          {"d2h_bytes", p.d2h_bytes},
          {"d2d_bytes", p.d2d_bytes},
          {"h2h_bytes", p.h2h_bytes},
          {"commands", p.commands},
          {"failures", p.failures},
          {"frames", p.frames},
          {"decode_errors", p.decode_errors}};
}

nlohmann::json telemetry_json(const Telemetry& t) {
  auto engines = nlohmann::json::array();
  for (auto& e : t.engines) engines.push_back({{"engine", to_string(e.engine)}, {"busy_ns", e.busy_ns}});
  auto faults = nlohmann::json::array();
  for (auto& f : t.faults) faults.push_back({{"kind", f.kind}, {"count", f.count}});
  auto channels = nlohmann::json::array();
  for (auto& c : t.channels)
    channels.push_back({{"channel", c.channel},
                        {"packets", c.packets},
                        {"frames", c.frames},
                        {"errors", c.errors},
                        {"busy_ns", c.busy_ns}});
  auto queues = nlohmann::json::array();
  for (auto& q : t.queues)
    queues.push_back({{"engine", to_string(q.engine)},
                      {"index", q.index},
                      {"commands", q.commands},
                      {"busy_ns", q.busy_ns},
                      {"failures", q.failures}});
  return {{"time_ns", t.time_ns},     {"uptime_ns", t.uptime_ns},
          {"resets", t.resets},       {"temperature_c", t.temperature_c},
          {"power_w", t.power_w},     {"power_limit_w", t.power_limit_w},
          {"energy_j", t.energy_j},   {"clock_mhz", t.clock_mhz},
          {"h2d_bytes", t.h2d_bytes}, {"d2h_bytes", t.d2h_bytes},
          {"d2d_bytes", t.d2d_bytes}, {"h2h_bytes", t.h2h_bytes},
          {"engines", engines},       {"queues", queues},
          {"channels", channels},     {"faults", faults}};
}

nlohmann::json utilisation_json(const Utilisation& u) {
  return {{"interval_s", u.interval_s},
          {"compute", u.compute},
          {"copy", u.copy},
          {"video", u.video},
          {"channels", u.channels},
          {"h2d_gbps", u.h2d_gbps},
          {"d2h_gbps", u.d2h_gbps},
          {"d2d_gbps", u.d2d_gbps},
          {"commands_per_s", u.commands_per_s},
          {"frames_per_s", u.frames_per_s}};
}

nlohmann::json device_json(Board& b, const Sample& sample) {
  nlohmann::json j;
  if (!b.dev) {
    // Watched: the whole board, and who uses it.
    j = {{"uri", b.uri},
         {"board", nullptr},
         {"driver", nullptr},
         {"observed", true},
         {"memory_total", 0},
         {"memory_used", 0},
         {"host_pinned_bytes", nullptr},
         {"uptime_ns", nullptr},
         {"heaps", nullptr},
         {"queues", nullptr},
         {"processes", nlohmann::json::array()}};
    if (b.view) {
      j["board"] = b.view->board;
      j["driver"] = b.view->driver;
      j["memory_total"] = b.view->memory_bytes;
      j["memory_used"] = b.view->memory_used_bytes;
      j["uptime_ns"] = b.view->telemetry.uptime_ns;
      for (auto& p : b.view->processes) j["processes"].push_back(process_json(p));
    }
  } else {
    Device& dev = *b.dev;
    const auto& p = dev.properties();
    const auto m = dev.memory_stats();
    const auto st = dev.status();
    auto heaps = nlohmann::json::array();
    for (auto& h : m.heaps)
      heaps.push_back({{"name", h.name},
                       {"memory", to_string(h.memory)},
                       {"total", h.total},
                       {"used", h.used},
                       {"free", h.free},
                       {"largest_free", h.largest_free},
                       {"allocations", h.allocations},
                       {"peak_used", h.peak_used}});
    auto queues = nlohmann::json::array();
    for (auto& q : st.queues)
      queues.push_back({{"engine", to_string(q.engine)},
                        {"index", q.index},
                        {"in_use", q.in_use},
                        {"busy", q.busy},
                        {"failed", q.failed},
                        {"submitted", q.submitted},
                        {"completed", q.completed},
                        {"busy_ns", q.busy_ns},
                        {"retired", q.retired}});
    // Processes: known only for boards a daemon shares (null: not known).
    j = {{"uri", p.uri},
         {"board", p.board},
         {"driver", p.driver},
         {"observed", false},
         {"memory_total", m.device_total},
         {"memory_used", m.device_used},
         {"host_pinned_bytes", m.host_pinned_bytes},
         {"uptime_ns", st.uptime_ns},
         {"heaps", heaps},
         {"queues", queues},
         {"processes", nullptr}};
  }
  j["telemetry"] = nullptr;
  j["utilisation"] = nullptr;
  if (sample.now) j["telemetry"] = telemetry_json(*sample.now);
  if (sample.util) j["utilisation"] = utilisation_json(*sample.util);
  return j;
}

std::string percent(double v) { return std::to_string(static_cast<int>(v * 100 + 0.5)) + "%"; }

void print_table(std::vector<Board>& boards, const std::vector<Sample>& samples, bool with_queues) {
  char when[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%a %b %e %H:%M:%S %Y", std::localtime(&now));
  const char* rule =
      "+------------+--------------------------------+--------+-----------------+---------------------------+----------"
      "-------------+------------+";
  std::printf("tpuhal smi %-40s %89s\n", tpuhal::version(), when);
  std::printf("%s\n| %-10s | %-30s | %-6s | %-15s | %-25s | %-21s | %-10s |\n%s\n", rule, "Device", "Board", "Temp",
              "Power / Cap", "Memory used / total", "Util tensor/DMA/video", "Queues", rule);
  if (boards.empty()) std::printf("| %-135s |\n", "No devices found.");
  bool any_watched = false;
  for (std::size_t i = 0; i < boards.size(); ++i) {
    Board& b = boards[i];
    const Sample& s = samples[i];
    std::uint64_t used = 0, total = 0;
    std::string model = "N/A";
    char qs[32] = "N/A", temp[16] = "N/A", power[32] = "N/A", util[40] = "N/A", mem[64];
    if (b.dev) {
      const auto m = b.dev->memory_stats();
      const auto st = b.dev->status();
      int busy = 0;
      for (auto& q : st.queues) busy += q.busy;
      used = m.device_used;
      total = m.device_total;
      model = b.dev->properties().board;
      std::snprintf(qs, sizeof qs, "%d/%zu busy", busy, st.queues.size());
    } else if (b.view) {
      any_watched = true;
      std::uint32_t held = 0;
      for (auto& p : b.view->processes) held += p.queues;
      used = b.view->memory_used_bytes;
      total = b.view->memory_bytes;
      model = b.view->board;
      std::snprintf(qs, sizeof qs, "%u held", held);
    }
    const double pct = total ? 100.0 * static_cast<double>(used) / static_cast<double>(total) : 0;
    std::snprintf(mem, sizeof mem, "%s / %s (%.0f%%)", bytes(used).c_str(), bytes(total).c_str(), pct);
    if (s.now) {
      std::snprintf(temp, sizeof temp, "%.0fC", s.now->temperature_c);
      std::snprintf(power, sizeof power, "%.1fW / %.0fW", s.now->power_w, s.now->power_limit_w);
    }
    if (s.util)
      std::snprintf(util, sizeof util, "%4s %4s %4s", percent(s.util->compute).c_str(), percent(s.util->copy).c_str(),
                    percent(s.util->video).c_str());
    std::printf("| %-10s | %-30s | %-6s | %-15s | %-25s | %-21s | %-10s |\n", fit(b.uri, 10).c_str(),
                fit(model, 30).c_str(), temp, power, mem, util, qs);
  }
  std::printf("%s\n", rule);

  // The process table, as nvidia-smi prints it: for boards a daemon
  // shares, which knows its clients.
  const std::string wide = "+" + std::string(137, '-') + "+";
  std::printf("\n%s\n| %-135s |\n", wide.c_str(), "Processes:");
  std::printf("| %-10s  %4s  %8s  %6s  %-16s  %6s  %14s  %-57s |\n", "Device", "VF", "PID", "UID", "Process name",
              "Queues", "Device memory", "Per heap");
  std::printf("%s\n", wide.c_str());
  bool any = false;
  for (auto& b : boards) {
    if (!b.view) continue;
    for (auto& p : b.view->processes) {
      any = true;
      std::string heaps;
      for (auto& h : p.heaps)
        if (h.bytes) heaps += (heaps.empty() ? "" : ", ") + h.heap + " " + bytes(h.bytes);
      std::printf("| %-10s  %4u  %8d  %6u  %-16s  %6u  %14s  %-57s |\n", fit(b.uri, 10).c_str(), p.vf, p.pid, p.uid,
                  fit(p.name, 16).c_str(), p.queues, bytes(p.memory_bytes).c_str(), fit(heaps, 57).c_str());
    }
  }
  if (!any)
    std::printf("| %-135s |\n", any_watched ? "No running processes found."
                                            : "No running processes found (boards shared through tpuhal-simd list "
                                              "theirs; set TPUHAL_SIMD or pass --device simd:...).");
  std::printf("%s\n", wide.c_str());

  if (with_queues) {
    std::printf("\n%-10s %-8s %-5s %-8s %12s %12s %12s %14s\n", "Device", "Engine", "Queue", "State", "Submitted",
                "Completed", "Retired", "Busy time ms");
    for (auto& b : boards) {
      if (!b.dev) continue;
      for (auto& q : b.dev->status().queues) {
        const char* state = q.failed ? "failed" : q.busy ? "busy" : q.in_use ? "idle" : "free";
        std::printf("%-10s %-8s %-5u %-8s %12llu %12llu %12llu %14.3f\n", fit(b.uri, 10).c_str(), to_string(q.engine),
                    q.index, state, static_cast<unsigned long long>(q.submitted),
                    static_cast<unsigned long long>(q.completed), static_cast<unsigned long long>(q.retired),
                    static_cast<double>(q.busy_ns) / 1e6);
      }
    }
  }
}

}  // namespace

int cmd_smi(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("device,d", po::value<std::string>(), "only this device (default: every device)")(
      "json", "print a JSON array with one object per device (one line per sample with --loop)")(
      "queues,q", "also list every hardware queue")("loop,l", po::value<double>(),
                                                    "print again every SECONDS, until interrupted (or --count)")(
      "count,c", po::value<unsigned>(), "with --loop: stop after this many samples")(
      "sample-ms", po::value<unsigned>()->default_value(100),
      "without --loop: the interval utilisation is measured over");
  po::variables_map vm;
  int rc = 0;
  if (!parse(args, opts, {}, vm,
             "Usage: tpuhal smi [--device URI] [--json] [--queues] [--loop SECONDS [--count N]]\n\n"
             "Temperature, power, utilisation, memory and queues of each device. Utilisation is\n"
             "each engine's busy share of the interval between two telemetry samples (tensor:\n"
             "compute queues; DMA: copy queues; video: video queues), as DCGM measures it:\n"
             "over --sample-ms for one table, over the loop's period with --loop. N/A: the\n"
             "device reports no telemetry. A simulated board (sim:) lives in the process that\n"
             "opened it, so this shows the board as this process sees it. A board shared by\n"
             "the simulator daemon (simd:) is watched without being opened: the whole board,\n"
             "and a process table of the processes using it (PID, VF, queues, device memory).",
             &rc))
    return rc;
  const bool loop = vm.count("loop") > 0;
  const double period = loop ? vm["loop"].as<double>() : 0;
  if (loop && !(period > 0 && period <= 86400)) {
    std::fprintf(stderr, "tpuhal smi: --loop takes a period in seconds above 0, got %g\n", period);
    return 2;
  }
  if (vm.count("count") && !loop) {
    std::fprintf(stderr, "tpuhal smi: --count needs --loop\n");
    return 2;
  }
  std::vector<std::string> uris;
  if (vm.count("device")) {
    uris.push_back(vm["device"].as<std::string>());
  } else {
    for (auto& d : enumerate()) uris.push_back(d.uri);
  }
  std::vector<Board> boards;
  for (auto& u : uris) {
    Board b;
    b.uri = u;
    if (!observable(u)) b.dev = open(u);
    boards.push_back(std::move(b));
  }

  std::vector<Sample> samples(boards.size());
  auto sample_all = [&] {
    for (std::size_t i = 0; i < boards.size(); ++i) {
      Sample s = take_sample(boards[i], samples[i].now);
      samples[i] = std::move(s);
    }
  };
  auto print = [&] {
    if (vm.count("json")) {
      auto arr = nlohmann::json::array();
      for (std::size_t i = 0; i < boards.size(); ++i) arr.push_back(device_json(boards[i], samples[i]));
      std::cout << (loop ? arr.dump() : arr.dump(2)) << std::endl;
    } else {
      print_table(boards, samples, vm.count("queues") > 0);
      std::fflush(stdout);
    }
  };
  sample_all();
  if (!loop) {
    std::this_thread::sleep_for(std::chrono::milliseconds(vm["sample-ms"].as<unsigned>()));
    sample_all();
    print();
    return 0;
  }
  const unsigned count = vm.count("count") ? vm["count"].as<unsigned>() : 0;
  for (unsigned n = 0; count == 0 || n < count; ++n) {
    std::this_thread::sleep_for(std::chrono::duration<double>(period));
    sample_all();
    print();
  }
  return 0;
}

}  // namespace tpuhal::cli
