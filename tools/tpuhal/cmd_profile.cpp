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
namespace {

double ms(std::uint64_t ns) { return static_cast<double>(ns) / 1e6; }

// ", batch 2 of 8" for a model with a maximum batch.
std::string batch_text(const rt::Model& m, std::int64_t batch) {
  if (m.max_batch() == 0) return "";
  return ", batch " + std::to_string(batch > 0 ? batch : m.max_batch()) + " of 1 to " + std::to_string(m.max_batch());
}

int print_modelled(const std::string& path, const Device& dev, const rt::Model& m, const rt::Instance& inst, bool json,
                   std::int64_t batch) {
  const auto run = inst.modelled(batch);
  if (!run) throw Error(Status::Unsupported, dev.uri() + " has no timing model (docs/timing.md; sim:bm1684x has one)");
  if (json) {
    nlohmann::ordered_json layers = nlohmann::ordered_json::array();
    for (const auto& l : run->layers)
      layers.push_back({{"node", l.node},
                        {"ops", l.ops},
                        {"modelled_ms", ms(l.ns)},
                        {"compute_ms", ms(l.compute_ns)},
                        {"memory_ms", ms(l.memory_ns)},
                        {"overhead_ms", ms(l.overhead_ns)},
                        {"bound_by", to_string(l.bound)}});
    nlohmann::ordered_json j;
    j["model"] = path;
    j["device"] = dev.uri();
    j["precision"] = rt::to_string(m.precision());
    if (m.max_batch() > 0) j["batch"] = batch > 0 ? batch : m.max_batch();
    j["layers"] = std::move(layers);
    j["modelled_ms"] = ms(run->ns);
    j["input_copy_ms"] = ms(run->input_copy_ns);
    j["output_copy_ms"] = ms(run->output_copy_ns);
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("%s (%s%s) on %s, in the board's timing model (nothing ran)\n\n", path.c_str(),
              rt::to_string(m.precision()), batch_text(m, batch).c_str(), dev.uri().c_str());
  int width = 12;
  for (const auto& l : run->layers) width = std::max(width, std::min(48, static_cast<int>(l.node.size())));
  std::printf("  %-*s %-22s %10s %10s %10s %10s  %s\n", width, "layer", "ops", "time", "compute", "memory", "overhead",
              "bound by");
  for (const auto& l : run->layers)
    std::printf("  %-*s %-22s %8.3fms %8.3fms %8.3fms %8.3fms  %s\n", width,
                l.node.empty() ? "(conversions)" : l.node.c_str(), l.ops.c_str(), ms(l.ns), ms(l.compute_ns),
                ms(l.memory_ns), ms(l.overhead_ns), to_string(l.bound));
  std::printf("\n  board time of a run  %10.3f ms (modelled)\n", ms(run->ns));
  std::printf("  inputs to the board  %10.3f ms, outputs back %.3f ms\n", ms(run->input_copy_ns),
              ms(run->output_copy_ns));
  return 0;
}

}  // namespace

int cmd_profile(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("model", po::value<std::string>(), "the compiled model (.tpm)")(
      "device,d", po::value<std::string>(), "device to run it on (default: the first one)")(
      "iterations,n", po::value<unsigned>()->default_value(10), "runs to time (the middle half count)")(
      "batch,b", po::value<std::int64_t>(),
      "B: a model compiled with --max-batch runs B samples (1 to its maximum; default: the maximum)")(
      "json", po::bool_switch(), "print JSON")(
      "modelled", po::bool_switch(),
      "do not run: the board's timing model's time per layer, computed from the ops (docs/timing.md)");
  po::positional_options_description pos;
  pos.add("model", 1);
  po::variables_map vm;
  int rc = 0;
  const char* usage =
      "Usage: tpuhal profile FILE.tpm [--device URI] [--iterations N] [--batch B] [--modelled] [--json]\n\n"
      "Runs a compiled model on random inputs (uniform in [-1, 1], the same every time; an i32 input, such as\n"
      "token ids, all 0) and prints, per\n"
      "layer (ONNX node, as compile --report names it), the device ops, the output, the board time (the\n"
      "mean over the middle half of N runs by their board time, from board timestamps between ops), its\n"
      "share, the operations and the rate achieved\n"
      "against the board's peak for the layer's precision; then the board time of a whole run, the host\n"
      "time of a run as Instance::run submits it, and the difference: the host's overhead. Where the\n"
      "board's clock is modelled (a simulated board with a timing model, docs/timing.md) the board times\n"
      "are modelled, the same on every host, and each layer says what bounds it: compute, memory or\n"
      "overhead. --modelled runs nothing: it prints the timing model's time per layer, with its\n"
      "compute, memory and overhead parts, and the copies of the inputs and outputs. A model compiled\n"
      "with --max-batch runs its largest batch, or --batch B samples.";
  if (!parse(args, opts, pos, vm, usage, &rc)) return rc;
  if (!vm.count("model")) {
    std::fprintf(stderr, "tpuhal profile: name the compiled model\n%s\n", usage);
    return 2;
  }
  const std::string path = vm["model"].as<std::string>();
  Device dev = open(pick_device(vm));
  const rt::Model m = rt::Model::load(dev, rt::read_model_file(path), path);
  rt::Instance inst = m.instance();
  const std::int64_t batch = vm.count("batch") ? vm["batch"].as<std::int64_t>() : 0;
  if (vm.count("batch") && (m.max_batch() == 0 || batch < 1 || batch > m.max_batch()))
    throw Error(Status::InvalidArgument,
                "--batch " + std::to_string(batch) + ": " + path +
                    (m.max_batch() == 0 ? " was compiled for fixed shapes (compile it with --max-batch to run others)"
                                        : " runs 1 to " + std::to_string(m.max_batch()) + " samples"));
  if (vm["modelled"].as<bool>()) return print_modelled(path, dev, m, inst, vm["json"].as<bool>(), batch);
  // Each array's elements for the batch run.
  auto elements = [&](const rt::TensorSpec& s) {
    return m.max_batch() > 0 && batch > 0 ? s.elements() / static_cast<std::uint64_t>(m.max_batch()) * batch
                                          : s.elements();
  };
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::vector<float>> in(m.inputs().size()), out(m.outputs().size());
  std::vector<rt::HostArray> hin, hout;
  for (std::size_t i = 0; i < in.size(); ++i) {
    in[i].resize(elements(m.inputs()[i]));  // an i32 input (token ids) stays 0, an index every table has
    if (m.inputs()[i].dtype == DType::F32)
      for (auto& v : in[i]) v = dist(rng);
    hin.push_back(rt::host(in[i]));
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i].resize(elements(m.outputs()[i]));
    hout.push_back(rt::host(out[i]));
  }
  inst.run(hin, hout);  // the inputs in place, and a first run
  const rt::Profile p = inst.profile(vm["iterations"].as<unsigned>(), batch);
  if (vm["json"].as<bool>()) {
    nlohmann::json j = nlohmann::json::parse(rt::to_json(p));  // the runtime's form, with what the command knows
    j["model"] = path;
    j["device"] = dev.uri();
    j["precision"] = rt::to_string(m.precision());
    if (m.max_batch() > 0) j["batch"] = batch > 0 ? batch : m.max_batch();
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("%s (%s%s) on %s, mean of the middle %u of %u runs\n\n", path.c_str(), rt::to_string(m.precision()),
              batch_text(m, batch).c_str(), dev.uri().c_str(), p.runs_kept, p.iterations);
  int width = 12;  // the layer column: the longest name, within reason
  for (const auto& l : p.layers) width = std::max(width, std::min(48, static_cast<int>(l.node.size())));
  std::printf("  %-*s %-22s %-22s %10s %6s %10s %12s %7s %s\n", width, "layer", "ops", "output", "time", "share", "ops",
              "rate", "of peak", p.layers.empty() || p.layers[0].bound.empty() ? "" : " bound by");
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
    std::printf("  %-*s %-22s %-22s %8.3fms %5.1f%% %10s %12s %7s  %s\n", width, name.c_str(), l.ops.c_str(),
                l.shape.c_str(), static_cast<double>(l.device_ns) / 1e6, 100.0 * l.share, count(l.flops).c_str(),
                rate(l.achieved).c_str(), peak, l.bound.c_str());
  }
  std::printf("\n  board time of a run  %10.3f ms%s\n", static_cast<double>(p.device_ns) / 1e6,
              p.modelled ? " (modelled: the board's timing model, docs/timing.md)" : "");
  std::printf("  host time of a run   %10.3f ms (submit to fence)\n", static_cast<double>(p.run_ns) / 1e6);
  if (p.modelled)
    std::printf("  host overhead        n/a (the board's time is modelled, the host's measured)\n");
  else
    std::printf("  host overhead        %10.3f ms\n", static_cast<double>(p.host_overhead_ns) / 1e6);
  return 0;
}

}  // namespace tpuhal::cli
