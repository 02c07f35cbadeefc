// tpuhal profile OUT.tpm: runs a compiled model on random inputs and
// times it per layer on the board's clock (docs/runtime.md).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <random>
#include <vector>

#include "cli.h"
#include "tpuhal/rt/model.hpp"

namespace tpuhal::cli {

int cmd_profile(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("model", po::value<std::string>(), "the compiled model (.tpm)")(
      "device,d", po::value<std::string>(), "device to run it on (default: the first one)")(
      "iterations,n", po::value<unsigned>()->default_value(10), "runs to time (the middle half count)")(
      "json", po::bool_switch(), "print JSON");
  po::positional_options_description pos;
  pos.add("model", 1);
  po::variables_map vm;
  int rc = 0;
  const char* usage =
      "Usage: tpuhal profile FILE.tpm [--device URI] [--iterations N] [--json]\n\n"
      "Runs a compiled model on random inputs (uniform in [-1, 1], the same every time) and prints, per\n"
      "layer (ONNX node, as compile --report names it), the device ops, the output, the board time (the\n"
      "mean over the middle half of N runs by their board time, from board timestamps between ops), its\n"
      "share, the operations and the rate achieved\n"
      "against the board's peak for the layer's precision; then the board time of a whole run, the host\n"
      "time of a run as Instance::run submits it, and the difference: the host's overhead.";
  if (!parse(args, opts, pos, vm, usage, &rc)) return rc;
  if (!vm.count("model")) {
    std::fprintf(stderr, "tpuhal profile: name the compiled model\n%s\n", usage);
    return 2;
  }
  const std::string path = vm["model"].as<std::string>();
  Device dev = open(pick_device(vm));
  const rt::Model m = rt::Model::load(dev, rt::read_model_file(path), path);
  rt::Instance inst = m.instance();
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::vector<float>> in(m.inputs().size()), out(m.outputs().size());
  std::vector<rt::HostArray> hin, hout;
  for (std::size_t i = 0; i < in.size(); ++i) {
    in[i].resize(m.inputs()[i].elements());
    for (auto& v : in[i]) v = dist(rng);
    hin.push_back(rt::host(in[i]));
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i].resize(m.outputs()[i].elements());
    hout.push_back(rt::host(out[i]));
  }
  inst.run(hin, hout);  // the inputs in place, and a first run
  const rt::Profile p = inst.profile(vm["iterations"].as<unsigned>());
  if (vm["json"].as<bool>()) {
    nlohmann::json j = nlohmann::json::parse(rt::to_json(p));  // the runtime's form, with what the command knows
    j["model"] = path;
    j["device"] = dev.uri();
    j["precision"] = rt::to_string(m.precision());
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("%s (%s) on %s, mean of the middle %u of %u runs\n\n", path.c_str(), rt::to_string(m.precision()),
              dev.uri().c_str(), p.runs_kept, p.iterations);
  int width = 12;  // the layer column: the longest name, within reason
  for (const auto& l : p.layers) width = std::max(width, std::min(48, static_cast<int>(l.node.size())));
  std::printf("  %-*s %-22s %-22s %10s %6s %10s %12s %7s\n", width, "layer", "ops", "output", "time", "share", "ops",
              "rate", "of peak");
  auto rate = [](double per_s) {
    char b[32];
    if (per_s >= 1e12)
      std::snprintf(b, sizeof b, "%.2f T/s", per_s / 1e12);
    else if (per_s >= 1e9)
      std::snprintf(b, sizeof b, "%.2f G/s", per_s / 1e9);
    else
      std::snprintf(b, sizeof b, "%.2f M/s", per_s / 1e6);
    return std::string(b);
  };
  auto count = [](double n) {
    char b[32];
    if (n >= 1e9)
      std::snprintf(b, sizeof b, "%.2fG", n / 1e9);
    else if (n >= 1e6)
      std::snprintf(b, sizeof b, "%.2fM", n / 1e6);
    else
      std::snprintf(b, sizeof b, "%.0f", n);
    return std::string(b);
  };
  for (const auto& l : p.layers) {
    char peak[16] = "";
    if (l.peak > 0) std::snprintf(peak, sizeof peak, "%6.1f%%", 100.0 * l.achieved / l.peak);
    const std::string name = l.node.empty() ? "(conversions)" : l.node;
    std::printf("  %-*s %-22s %-22s %8.3fms %5.1f%% %10s %12s %7s\n", width, name.c_str(), l.ops.c_str(),
                l.shape.c_str(), static_cast<double>(l.device_ns) / 1e6, 100.0 * l.share, count(l.flops).c_str(),
                rate(l.achieved).c_str(), peak);
  }
  std::printf("\n  board time of a run  %10.3f ms\n", static_cast<double>(p.device_ns) / 1e6);
  std::printf("  host time of a run   %10.3f ms (submit to fence)\n", static_cast<double>(p.run_ns) / 1e6);
  std::printf("  host overhead        %10.3f ms\n", static_cast<double>(p.host_overhead_ns) / 1e6);
  return 0;
}

}  // namespace tpuhal::cli
