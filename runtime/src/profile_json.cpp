// Profile's one JSON form (model.hpp): the CLI and the Python binding both
// give it, so its keys are named here only.
#include <nlohmann/json.hpp>

#include "tpuhal/rt/model.hpp"

namespace tpuhal::rt {

std::string to_json(const Profile& p) {
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const auto& l : p.layers) {
    layers.push_back({{"node", l.node},
                      {"ops", l.ops},
                      {"output", l.shape},
                      {"device_ns", l.device_ns},
                      {"share", l.share},
                      {"flops", l.flops},
                      {"achieved_per_s", l.achieved},
                      {"peak_per_s", l.peak}});
    if (p.modelled) layers.back()["modelled_ms"] = static_cast<double>(l.device_ns) / 1e6;
    if (!l.bound.empty()) layers.back()["bound_by"] = l.bound;
  }
  nlohmann::ordered_json j;
  j["layers"] = std::move(layers);
  j["iterations"] = p.iterations;
  j["runs_kept"] = p.runs_kept;
  j["device_ns"] = p.device_ns;
  j["run_ns"] = p.run_ns;
  j["host_overhead_ns"] = p.host_overhead_ns;
  j["board_clock"] = p.modelled ? "modelled" : "measured";
  if (p.modelled) j["modelled_ms"] = static_cast<double>(p.device_ns) / 1e6;
  return j.dump();
}

}  // namespace tpuhal::rt
