// tpuhal compile MODEL.onnx -o OUT.tpm: compiles an ONNX model for the
// board in one precision (docs/runtime.md); tpuhal model-info OUT.tpm
// describes a compiled model; tpuhal profile OUT.tpm times it per layer.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>

#include "cli.h"
#include "tpuhal/base/units.h"
#include "tpuhal/rt/compile.hpp"
#include "tpuhal/rt/model.hpp"

namespace tpuhal::cli {
namespace {

// "image=1x1x28x28" -> {"image", {1, 1, 28, 28}}
std::pair<std::string, std::vector<std::int64_t>> parse_shape(const std::string& text) {
  const auto eq = text.rfind('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    throw Error(Status::InvalidArgument, "--shape '" + text + "': expected NAME=DIMS, e.g. image=1x1x28x28");
  std::vector<std::int64_t> dims;
  std::string num;
  for (char c : text.substr(eq + 1) + "x") {
    if (c >= '0' && c <= '9') {
      num += c;
    } else if ((c == 'x' || c == ',') && !num.empty() && num.size() < 10) {
      dims.push_back(std::stoll(num));
      num.clear();
    } else {
      throw Error(Status::InvalidArgument, "--shape '" + text + "': dimensions are positive integers joined by x");
    }
  }
  return {text.substr(0, eq), dims};
}

void print_report(const std::vector<rt::LayerError>& report) {
  std::printf("\nPrecision report (each layer against fp32, same inputs end to end):\n");
  std::printf("  %-24s %-20s %12s %12s %9s %9s\n", "node", "op", "max |err|", "rms err", "rel rms", "SNR dB");
  for (const auto& e : report) {
    char snr[32];
    if (std::isfinite(e.snr_db))
      std::snprintf(snr, sizeof snr, "%9.1f", e.snr_db);
    else
      std::snprintf(snr, sizeof snr, "%9s", "exact");
    std::printf("  %-24s %-20s %12.4g %12.4g %9.4f %s\n", rt::escape_text(e.node).c_str(),
                rt::escape_text(e.op).c_str(), e.max_abs, e.rms, e.rel_rms, snr);
  }
}

}  // namespace

int cmd_compile(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("model", po::value<std::string>(), "the ONNX model")("output,o", po::value<std::string>(),
                                                                          "the compiled model to write (.tpm)")(
      "shape", po::value<std::vector<std::string>>()->composing(),
      "NAME=DIMS: fixed shape of an input with symbolic dimensions, e.g. image=8x1x28x28 (repeatable)")(
      "precision,p", po::value<std::string>()->default_value("fp32"), "fp32, fp16, bf16 or int8")(
      "calibration", po::value<std::vector<std::string>>()->composing(),
      "FILE.npy: calibration samples for int8 and --report, one file per input in input order, the first "
      "dimension the sample count (float32 or float64)")(
      "calibration-method", po::value<std::string>()->default_value("percentile"),
      "minmax, percentile[:P] (activation ranges cut at the P-th percentile, default 99.99), or entropy "
      "(ranges cut where quantising loses least information, by Kullback-Leibler divergence)")(
      "keep-fp16", po::value<std::vector<std::string>>()->composing(),
      "LAYER: an ONNX node name that runs in fp16 in an int8 model, or in fp32 where its calibrated values are "
      "beyond fp16's range (repeatable)")(
      "target-snr", po::value<double>(),
      "DB: int8 with mixed precision: move the layers that lose the most signal to fp16 until every output's "
      "signal-to-noise ratio against fp32 on the calibration data reaches DB")(
      "report", po::bool_switch(), "measure each layer's error against fp32 on the calibration data")(
      "max-constant-bytes", po::value<std::string>(),
      "SIZE (e.g. 4GiB): the largest constant the compiler computes when it folds Expand, Where, broadcasting "
      "arithmetic, Gather, Concat, ConstantOfShape or Range on constants (default: 1 GiB, or the model's "
      "initializers as float32 if more)")(
      "device,d", po::value<std::string>()->default_value("sim:0"),
      "device that runs calibration and the report, and on which the compiled model is checked as the loader "
      "checks it");
  po::positional_options_description pos;
  pos.add("model", 1);
  po::variables_map vm;
  int rc = 0;
  const char* usage =
      "Usage: tpuhal compile MODEL.onnx -o OUT.tpm [--shape NAME=DIMS]... [--precision fp32|fp16|bf16|int8]\n"
      "                      [--calibration FILE.npy]... [--calibration-method minmax|percentile[:P]|entropy]\n"
      "                      [--keep-fp16 LAYER]... [--target-snr DB] [--report] [--max-constant-bytes SIZE]\n\n"
      "Compiles an ONNX model for a fixed input shape and a precision into a compiled model that\n"
      "'tpuhal model-info' describes and the runtime loads on any device. Inputs and outputs stay\n"
      "float32; fp16 and bf16 run every layer in that type; int8 quantises Conv and Gemm layers with\n"
      "per-channel weight scales and activation ranges calibrated on --calibration samples, and\n"
      "runs the layers --keep-fp16 names (or --target-snr chooses) in fp16 (fp32 where fp16 cannot\n"
      "hold their values).\n"
      "Unsupported ops are all listed in one error. A model the loader would refuse (attributes out of range,\n"
      "constants larger than their data) is refused here, and no file is written. See docs/runtime.md.";
  if (!parse(args, opts, pos, vm, usage, &rc)) return rc;
  if (!vm.count("model") || !vm.count("output")) {
    std::fprintf(stderr, "tpuhal compile: name the ONNX model and the output (-o OUT.tpm)\n%s\n", usage);
    return 2;
  }
  rt::CompileOptions o;
  o.precision = rt::parse_precision(vm["precision"].as<std::string>());
  o.device = vm["device"].as<std::string>();
  o.report = vm["report"].as<bool>();
  if (vm.count("shape"))
    for (const auto& s : vm["shape"].as<std::vector<std::string>>()) o.shapes.insert(parse_shape(s));
  if (vm.count("calibration"))
    for (const auto& f : vm["calibration"].as<std::vector<std::string>>()) o.calibration.push_back(rt::read_npy(f));
  const std::string method = vm["calibration-method"].as<std::string>();
  if (method == "minmax") {
    o.method = rt::CalibrationMethod::MinMax;
  } else if (method == "entropy") {
    o.method = rt::CalibrationMethod::Entropy;
  } else if (method.rfind("percentile", 0) == 0) {
    o.method = rt::CalibrationMethod::Percentile;
    if (method.size() > 10) {
      if (method[10] != ':')
        throw Error(Status::InvalidArgument,
                    "--calibration-method '" + method + "': expected minmax, percentile[:P] or entropy");
      try {
        o.percentile = std::stod(method.substr(11));
      } catch (const std::exception&) {
        throw Error(Status::InvalidArgument, "--calibration-method '" + method + "': P is not a number");
      }
    }
  } else {
    throw Error(Status::InvalidArgument,
                "--calibration-method '" + method + "': expected minmax, percentile[:P] or entropy");
  }
  if (vm.count("keep-fp16")) o.keep_fp16 = vm["keep-fp16"].as<std::vector<std::string>>();
  if (vm.count("max-constant-bytes")) {
    const std::string text = vm["max-constant-bytes"].as<std::string>();
    const auto limit = base::parse_bytes(text);
    if (!limit || *limit == 0)
      throw Error(Status::InvalidArgument, "--max-constant-bytes '" + rt::escape_text(text) +
                                               "': expected a size above 0, e.g. 1073741824 or 4GiB");
    o.max_constant_bytes = *limit;
  }
  if (vm.count("target-snr")) {
    o.target_snr_db = vm["target-snr"].as<double>();
    if (!(o.target_snr_db > 0 && o.target_snr_db < 200))
      throw Error(Status::InvalidArgument,
                  "--target-snr " + std::to_string(o.target_snr_db) + ": expected dB in (0, 200)");
  }
  const std::string in = vm["model"].as<std::string>(), out = vm["output"].as<std::string>();
  rt::CompileResult r = rt::compile_onnx(in, o);
  rt::write_model_file(out, r.model);
  for (const auto& n : r.notes) std::printf("  %s\n", rt::escape_text(n).c_str());
  std::uint64_t weights = r.model.has(rt::SectionKind::Weights) ? r.model.get(rt::SectionKind::Weights).size() : 0;
  std::printf("%s: %s, %s of weights -> %s\n", in.c_str(), rt::to_string(o.precision), bytes(weights).c_str(),
              out.c_str());
  if (o.report) print_report(r.report);
  return 0;
}

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
    j["meta"] = m.meta();
    for (const auto* list : {&m.inputs(), &m.outputs()})
      for (const auto& s : *list)
        j[list == &m.inputs() ? "inputs" : "outputs"].push_back(
            {{"name", s.name}, {"dtype", to_string(s.dtype)}, {"shape", s.shape}});
    if (!report.is_discarded() && !report.is_null()) j["report"] = report;
    // ASCII only: strings from the file are \u-escaped, bytes that are not
    // UTF-8 replaced (U+FFFD), so that nothing in it reaches the terminal raw.
    std::cout << j.dump(2, ' ', true, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
  }
  std::printf("%s: %s model, %s of weights, %s of activations per instance (checked on %s)\n", path.c_str(),
              rt::to_string(m.precision()), bytes(m.weight_bytes()).c_str(), bytes(m.activation_bytes()).c_str(),
              dev.uri().c_str());
  for (const auto& s : m.inputs()) std::printf("  input   %s\n", s.describe().c_str());
  for (const auto& s : m.outputs()) std::printf("  output  %s\n", s.describe().c_str());
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
    print_report(layers);
  }
  return 0;
}

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
    nlohmann::json j;
    j["model"] = path;
    j["device"] = dev.uri();
    j["precision"] = rt::to_string(m.precision());
    j["iterations"] = p.iterations;
    j["runs_kept"] = p.runs_kept;
    j["device_ns"] = p.device_ns;
    j["run_ns"] = p.run_ns;
    j["host_overhead_ns"] = p.host_overhead_ns;
    j["layers"] = nlohmann::json::array();
    for (const auto& l : p.layers)
      j["layers"].push_back({{"node", l.node},
                             {"ops", l.ops},
                             {"output", l.shape},
                             {"device_ns", l.device_ns},
                             {"share", l.share},
                             {"flops", l.flops},
                             {"achieved_per_s", l.achieved},
                             {"peak_per_s", l.peak}});
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
