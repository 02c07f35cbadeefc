#include <cstdio>
#include <ctime>
#include <iostream>

#include "cli.h"

namespace tpuhal::cli {
namespace {

std::string fit(const std::string& s, std::size_t width) {
  return s.size() <= width ? s : s.substr(0, width - 3) + "...";
}

nlohmann::json device_json(Device& dev) {
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
  return {{"uri", p.uri},
          {"board", p.board},
          {"driver", p.driver},
          {"memory_total", m.device_total},
          {"memory_used", m.device_used},
          {"host_pinned_bytes", m.host_pinned_bytes},
          {"uptime_ns", st.uptime_ns},
          {"heaps", heaps},
          {"queues", queues}};
}

}  // namespace

int cmd_smi(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("device,d", po::value<std::string>(), "only this device (default: every device)")(
      "json", "print a JSON array with one object per device")("queues,q", "also list every hardware queue");
  po::variables_map vm;
  int rc = 0;
  if (!parse(args, opts, {}, vm,
             "Usage: tpuhal smi [--device URI] [--json] [--queues]\n\n"
             "Memory and queue use of each device. A simulated board (sim:) lives in the process\n"
             "that opened it, so this shows the board as this process sees it.",
             &rc))
    return rc;
  std::vector<std::string> uris;
  if (vm.count("device")) {
    uris.push_back(vm["device"].as<std::string>());
  } else {
    for (auto& d : enumerate()) uris.push_back(d.uri);
  }
  std::vector<Device> devices;
  for (auto& u : uris) devices.push_back(open(u));

  if (vm.count("json")) {
    auto arr = nlohmann::json::array();
    for (auto& d : devices) arr.push_back(device_json(d));
    std::cout << arr.dump(2) << "\n";
    return 0;
  }
  char when[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%a %b %e %H:%M:%S %Y", std::localtime(&now));
  const char* rule =
      "+------------+------------------------------------------+---------------------------+------------+";
  std::printf("tpuhal smi %-40s %45s\n", tpuhal::version(), when);
  std::printf("%s\n| %-10s | %-40s | %-25s | %-10s |\n%s\n", rule, "Device", "Board", "Memory used / total", "Queues",
              rule);
  if (devices.empty()) std::printf("| %-95s |\n", "No devices found.");
  for (auto& d : devices) {
    const auto m = d.memory_stats();
    const auto st = d.status();
    int busy = 0;
    for (auto& q : st.queues) busy += q.busy;
    const double pct =
        m.device_total ? 100.0 * static_cast<double>(m.device_used) / static_cast<double>(m.device_total) : 0;
    char mem[64], qs[32];
    std::snprintf(mem, sizeof mem, "%s / %s (%.0f%%)", bytes(m.device_used).c_str(), bytes(m.device_total).c_str(),
                  pct);
    std::snprintf(qs, sizeof qs, "%d/%zu busy", busy, st.queues.size());
    std::printf("| %-10s | %-40s | %-25s | %-10s |\n", fit(d.uri(), 10).c_str(), fit(d.properties().board, 40).c_str(),
                mem, qs);
  }
  std::printf("%s\n", rule);
  if (vm.count("queues")) {
    std::printf("\n%-10s %-8s %-5s %-8s %12s %12s %12s %14s\n", "Device", "Engine", "Queue", "State", "Submitted",
                "Completed", "Retired", "Busy time ms");
    for (auto& d : devices) {
      for (auto& q : d.status().queues) {
        const char* state = q.failed ? "failed" : q.busy ? "busy" : q.in_use ? "idle" : "free";
        std::printf("%-10s %-8s %-5u %-8s %12llu %12llu %12llu %14.3f\n", fit(d.uri(), 10).c_str(), to_string(q.engine),
                    q.index, state, static_cast<unsigned long long>(q.submitted),
                    static_cast<unsigned long long>(q.completed), static_cast<unsigned long long>(q.retired),
                    static_cast<double>(q.busy_ns) / 1e6);
      }
    }
  }
  return 0;
}

}  // namespace tpuhal::cli
