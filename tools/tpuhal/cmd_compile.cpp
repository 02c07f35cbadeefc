// tpuhal compile MODEL.onnx -o OUT.tpm: compiles an ONNX model for the
// board in one precision (docs/runtime.md); tpuhal model-info OUT.tpm
// describes a compiled model.
#include <cmath>
#include <cstdio>
#include <iostream>

#include "cli.h"
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
    std::printf("  %-24s %-20s %12.4g %12.4g %9.4f %s\n", e.node.c_str(), e.op.c_str(), e.max_abs, e.rms, e.rel_rms,
                snr);
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
      "LAYER: an ONNX node name that runs in fp16 in an int8 model (repeatable)")(
      "target-snr", po::value<double>(),
      "DB: int8 with mixed precision: move the layers that lose the most signal to fp16 until every output's "
      "signal-to-noise ratio against fp32 on the calibration data reaches DB")(
      "report", po::bool_switch(), "measure each layer's error against fp32 on the calibration data")(
      "device,d", po::value<std::string>()->default_value("sim:0"), "device that runs calibration and the report");
  po::positional_options_description pos;
  pos.add("model", 1);
  po::variables_map vm;
  int rc = 0;
  const char* usage =
      "Usage: tpuhal compile MODEL.onnx -o OUT.tpm [--shape NAME=DIMS]... [--precision fp32|fp16|bf16|int8]\n"
      "                      [--calibration FILE.npy]... [--calibration-method minmax|percentile[:P]|entropy]\n"
      "                      [--keep-fp16 LAYER]... [--target-snr DB] [--report]\n\n"
      "Compiles an ONNX model for a fixed input shape and a precision into a compiled model that\n"
      "'tpuhal model-info' describes and the runtime loads on any device. Inputs and outputs stay\n"
      "float32; fp16 and bf16 run every layer in that type; int8 quantises Conv and Gemm layers with\n"
      "per-channel weight scales and activation ranges calibrated on --calibration samples, and\n"
      "runs the layers --keep-fp16 names (or --target-snr chooses) in fp16.\n"
      "Unsupported ops are all listed in one error. See docs/runtime.md.";
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
  if (vm.count("target-snr")) {
    o.target_snr_db = vm["target-snr"].as<double>();
    if (!(o.target_snr_db > 0 && o.target_snr_db < 200))
      throw Error(Status::InvalidArgument,
                  "--target-snr " + std::to_string(o.target_snr_db) + ": expected dB in (0, 200)");
  }
  const std::string in = vm["model"].as<std::string>(), out = vm["output"].as<std::string>();
  rt::CompileResult r = rt::compile_onnx(in, o);
  rt::write_model_file(out, r.model);
  for (const auto& n : r.notes) std::printf("  %s\n", n.c_str());
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
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("%s: %s model, %s of weights, %s of activations per instance (checked on %s)\n", path.c_str(),
              rt::to_string(m.precision()), bytes(m.weight_bytes()).c_str(), bytes(m.activation_bytes()).c_str(),
              dev.uri().c_str());
  for (const auto& s : m.inputs()) std::printf("  input   %s\n", s.describe().c_str());
  for (const auto& s : m.outputs()) std::printf("  output  %s\n", s.describe().c_str());
  for (const auto& [k, v] : m.meta()) std::printf("  %-20s %s\n", k.c_str(), v.c_str());
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

}  // namespace tpuhal::cli
