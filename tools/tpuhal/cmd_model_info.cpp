// tpuhal model-info OUT.tpm: checks a compiled model (reads it and loads it
// on a device) and describes it, with its precision report if it has one.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <vector>

#include "cli.h"
#include "tpuhal/rt/compile.hpp"
#include "tpuhal/rt/model.hpp"

namespace tpuhal::cli {

int cmd_model_info(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("model", po::value<std::string>(), "the compiled model (.tpm)")(
      "device,d", po::value<std::string>(), "device to load it on to check it (default: the first one)")(
      "json", po::bool_switch(), "print JSON");
  po::positional_options_description pos;
  pos.add("model", 1);
  po::variables_map vm;
  int rc = 0;
  const char* usage =
      "Usage: tpuhal model-info FILE.tpm [--device URI] [--json]\n\n"
      "Checks a compiled model (reads it and loads it on a device) and prints its precision, inputs,\n"
      "outputs, weights, metadata and, if it has one, its precision report.";
  if (!parse(args, opts, pos, vm, usage, &rc)) return rc;
  if (!vm.count("model")) {
    std::fprintf(stderr, "tpuhal model-info: name the compiled model\n%s\n", usage);
    return 2;
  }
  const std::string path = vm["model"].as<std::string>();
  const rt::ModelFile file = rt::read_model_file(path);
  Device dev = open(pick_device(vm));
  const rt::Model m = rt::Model::load(dev, file, path);
  nlohmann::json report;
  if (file.has(rt::SectionKind::Report)) {
    const auto b = file.get(rt::SectionKind::Report);
    report = nlohmann::json::parse(reinterpret_cast<const char*>(b.data()),
                                   reinterpret_cast<const char*>(b.data()) + b.size(), nullptr, false);
  }
  if (vm["json"].as<bool>()) {
    nlohmann::json j;
    j["path"] = path;
    j["precision"] = rt::to_string(m.precision());
    j["weight_bytes"] = m.weight_bytes();
    j["activation_bytes"] = m.activation_bytes();
    j["max_batch"] = m.max_batch();
    j["meta"] = m.meta();
    for (const auto* list : {&m.inputs(), &m.outputs()})
      for (const auto& s : *list)
        j[list == &m.inputs() ? "inputs" : "outputs"].push_back(
            {{"name", s.name}, {"dtype", to_string(s.dtype)}, {"shape", s.shape}});
    if (const rt::HostStageInfo* h = m.host_stage())
      j["host_stage"] = {{"outputs", h->outputs}, {"nodes", h->nodes}, {"ops", h->ops}};
    if (!report.is_discarded() && !report.is_null()) j["report"] = report;
    // ASCII only: strings from the file are \u-escaped, bytes that are not
    // UTF-8 replaced (U+FFFD), so that nothing in it reaches the terminal raw.
    std::cout << j.dump(2, ' ', true, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
  }
  std::printf("%s: %s model, %s of weights, %s of activations per instance (checked on %s)\n", path.c_str(),
              rt::to_string(m.precision()), bytes(m.weight_bytes()).c_str(), bytes(m.activation_bytes()).c_str(),
              dev.uri().c_str());
  if (m.max_batch() > 0)
    std::printf("  batch   1 to %lld samples (each input's and output's first dimension; shapes below at %lld)\n",
                static_cast<long long>(m.max_batch()), static_cast<long long>(m.max_batch()));
  for (const auto& s : m.inputs()) std::printf("  input   %s\n", s.describe().c_str());
  const rt::HostStageInfo* host = m.host_stage();
  for (const auto& s : m.outputs())
    std::printf("  %s  %s\n", host ? "program output" : "output", rt::escape_text(s.describe()).c_str());
  if (host) {
    std::string ops;
    for (const auto& [op, n] : host->ops) ops += (ops.empty() ? "" : ", ") + std::to_string(n) + " " + op;
    std::printf("  host stage  %zu nodes on the host after the program (%s)\n", host->nodes,
                rt::escape_text(ops).c_str());
    for (const auto& o : host->outputs)
      std::printf("  output  %s (its shape decided by the data)\n", rt::escape_text(o).c_str());
  }
  // Names and metadata come from the file: escaped for the terminal.
  for (const auto& [k, v] : m.meta())
    std::printf("  %-20s %s\n", rt::escape_text(k).c_str(), rt::escape_text(v).c_str());
  if (report.is_object() && report.contains("layers") && report["layers"].is_array()) {
    std::vector<rt::LayerError> layers;
    for (const auto& l : report["layers"]) {
      rt::LayerError e;
      e.node = l.value("node", "");
      e.op = l.value("op", "");
      e.output = l.value("output", "");
      e.max_abs = l.value("max_abs", 0.0);
      e.rms = l.value("rms", 0.0);
      e.rel_rms = l.value("rel_rms", 0.0);
      e.snr_db = l.contains("snr_db") && l["snr_db"].is_number() ? l["snr_db"].get<double>() : INFINITY;
      layers.push_back(e);
    }
    print_precision_report(layers);
  }
  return 0;
}

}  // namespace tpuhal::cli
