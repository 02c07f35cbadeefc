// tpuhal compile MODEL.onnx -o OUT.tpm: compiles an ONNX model for the
// board in one precision (docs/runtime.md), and prints the precision report
// (which tpuhal model-info prints too: cmd_model_info.cpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "cli.h"
#include "tpuhal/base/units.h"
#include "tpuhal/rt/compile.hpp"
#include "tpuhal/rt/model.hpp"

namespace tpuhal::cli {
namespace {

// "image=1x1x28x28" -> {"image", {1, 1, 28, 28}}
// NAME=DIMS; with a maximum batch, the first dimension may be N (it is the
// batch, whatever is given).
std::pair<std::string, std::vector<std::int64_t>> parse_shape(const std::string& text, bool batched) {
  const auto eq = text.rfind('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    throw Error(Status::InvalidArgument, "--shape '" + text + "': expected NAME=DIMS, e.g. image=1x1x28x28");
  std::vector<std::int64_t> dims;
  std::string num;
  std::string given = text.substr(eq + 1);
  if (batched && !given.empty() && given[0] == 'N' && (given.size() == 1 || given[1] == 'x' || given[1] == ','))
    given[0] = '1';
  for (char c : given + "x") {
    if (c >= '0' && c <= '9') {
      num += c;
    } else if ((c == 'x' || c == ',') && !num.empty() && num.size() < 10) {
      dims.push_back(std::stoll(num));
      num.clear();
    } else {
      throw Error(Status::InvalidArgument, "--shape '" + text + "': dimensions are positive integers joined by x" +
                                               (batched ? " (the first may be N, the batch)" : ""));
    }
  }
  return {text.substr(0, eq), dims};
}

// "10,13,16,30" -> {10, 13, 16, 30}: numbers joined by commas (the
// compiler checks what they say).
std::vector<float> parse_anchors(const std::string& text) {
  std::vector<float> v;
  std::size_t at = 0;
  for (;;) {
    const std::size_t comma = text.find(',', at);
    const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    char* end = nullptr;
    const float f = std::strtof(item.c_str(), &end);
    if (item.empty() || end != item.c_str() + item.size())
      throw Error(Status::InvalidArgument,
                  "--anchors '" + text + "': expected numbers joined by commas, e.g. 10,13,16,30");
    v.push_back(f);
    if (comma == std::string::npos) return v;
    at = comma + 1;
  }
}

}  // namespace

void print_precision_report(const std::vector<rt::LayerError>& report) {
  std::printf("\nPrecision report (each layer against fp32, same inputs end to end):\n");
  std::printf("  %-24s %-20s %12s %12s %9s %9s\n", "node", "op", "max |err|", "rms err", "rel rms", "SNR dB");
  for (const auto& e : report) {
    char snr[32];
    if (std::isfinite(e.snr_db))
      std::snprintf(snr, sizeof snr, "%9.1f", e.snr_db);
    else
      std::snprintf(snr, sizeof snr, "%9s", e.snr_db > 0 ? "exact" : "-inf");
    std::printf("  %-24s %-20s %12.4g %12.4g %9.4f %s\n", rt::escape_text(e.node).c_str(),
                rt::escape_text(e.op).c_str(), e.max_abs, e.rms, e.rel_rms, snr);
  }
}

int cmd_compile(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("model", po::value<std::string>(), "the ONNX model")("output,o", po::value<std::string>(),
                                                                          "the compiled model to write (.tpm)")(
      "shape", po::value<std::vector<std::string>>()->composing(),
      "NAME=DIMS: fixed shape of an input with symbolic dimensions, e.g. image=8x1x28x28 (repeatable); with "
      "--max-batch the first dimension is the batch, written N: image=Nx1x28x28")(
      "max-batch", po::value<std::int64_t>(),
      "N: the model runs any batch from 1 to N without compiling again (a program for each; inputs' first "
      "dimension symbolic in the model; at most 256)")("precision,p", po::value<std::string>()->default_value("fp32"),
                                                       "fp32, fp16, bf16 or int8")(
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
      "strict-qdq", po::bool_switch(),
      "int8 of a model with QuantizeLinear/DequantizeLinear pairs: refuse it where a layer would run in fp32 "
      "because the model's Q/DQ does not cover it (without this, the notes name such layers)")(
      "max-constant-bytes", po::value<std::string>(),
      "SIZE (e.g. 4GiB): the largest constant the compiler computes when it folds Expand, Where, broadcasting "
      "arithmetic, Gather, Concat, ConstantOfShape or Range on constants (default: 1 GiB, or the model's "
      "initializers as float32 if more)")(
      "detect", po::value<std::string>(),
      "yolov8 or yolov5: end the model in box decoding and non-maximum suppression on the board; its one "
      "output becomes 'detections' [batch, max-boxes, 6] (x1, y1, x2, y2, score, class; class -1 after the "
      "last box)")("score", po::value<float>()->default_value(0.25f, "0.25"),
                   "T: with --detect, a box is a candidate when its best class scores above T")(
      "iou", po::value<float>()->default_value(0.45f, "0.45"),
      "T: with --detect, boxes overlapping a kept box of their class by an IoU above T are dropped")(
      "max-boxes", po::value<std::int64_t>()->default_value(100), "N: with --detect, the most boxes per image")(
      "agnostic", po::bool_switch(), "with --detect, a kept box suppresses boxes of every class")(
      "anchors", po::value<std::string>(),
      "W,H,W,H,...: with --detect yolov5 of a model of one output per level, each level's anchors in input "
      "pixels, the finest level first, as many per level (default: YOLOv5's own for 3 or 4 levels)")(
      "device,d", po::value<std::string>()->default_value("sim:0"),
      "device that runs calibration and the report, and on which the compiled model is checked as the loader "
      "checks it")("list-ops", po::bool_switch(),
                   "print the ONNX ops the compiler takes, one per line (those it folds at compile time when "
                   "their inputs are constants marked 'foldable'), and exit");
  po::positional_options_description pos;
  pos.add("model", 1);
  po::variables_map vm;
  int rc = 0;
  const char* usage =
      "Usage: tpuhal compile MODEL.onnx -o OUT.tpm [--shape NAME=DIMS]... [--precision fp32|fp16|bf16|int8]\n"
      "                      [--calibration FILE.npy]... [--calibration-method minmax|percentile[:P]|entropy]\n"
      "                      [--keep-fp16 LAYER]... [--target-snr DB] [--report] [--strict-qdq]\n"
      "                      [--max-constant-bytes SIZE] [--max-batch N]\n"
      "                      [--detect yolov8|yolov5 [--score T] [--iou T] [--max-boxes N] [--agnostic]\n"
      "                                              [--anchors W,H,...]]\n"
      "       tpuhal compile --list-ops\n\n"
      "Compiles an ONNX model for fixed input shapes and a precision into a compiled model that\n"
      "'tpuhal model-info' describes and the runtime loads on any device. Inputs and outputs stay\n"
      "float32 (integer and bool inputs: int32); fp16 and bf16 run every layer in that type; int8 quantises Conv and "
      "Gemm layers with\n"
      "per-channel weight scales and activation ranges calibrated on --calibration samples, and\n"
      "runs the layers --keep-fp16 names (or --target-snr chooses) in fp16 (fp32 where fp16 cannot\n"
      "hold their values). A model with QuantizeLinear/DequantizeLinear pairs (quantization-aware\n"
      "training) compiles to int8 with its own scales and zero points, without calibration.\n"
      "With --max-batch N the model runs any batch from 1 to N: its inputs' first dimension is the\n"
      "batch, and memory is planned for N.\n"
      "With --detect, a YOLO detector's output is decoded and reduced by non-maximum suppression on\n"
      "the board, and the compiled model gives its detections. A YOLOv5 exported without its Detect\n"
      "layer (one output per level, as SOPHGO's \"3output\" models) is decoded as that layer does.\n"
      "Unsupported ops are all listed in one error. A model the loader would refuse (attributes out of range,\n"
      "constants larger than their data) is refused here, and no file is written. See docs/runtime.md.";
  if (!parse(args, opts, pos, vm, usage, &rc)) return rc;
  if (vm["list-ops"].as<bool>()) {
    const auto foldable = rt::foldable_onnx_ops();
    for (const auto& op : rt::supported_onnx_ops())
      std::printf("%s%s\n", op.c_str(), std::binary_search(foldable.begin(), foldable.end(), op) ? " foldable" : "");
    return 0;
  }
  if (!vm.count("model") || !vm.count("output")) {
    std::fprintf(stderr, "tpuhal compile: name the ONNX model and the output (-o OUT.tpm)\n%s\n", usage);
    return 2;
  }
  rt::CompileOptions o;
  o.precision = rt::parse_precision(vm["precision"].as<std::string>());
  o.device = vm["device"].as<std::string>();
  o.report = vm["report"].as<bool>();
  o.strict_qdq = vm["strict-qdq"].as<bool>();
  if (vm.count("detect")) {
    o.detect.head = vm["detect"].as<std::string>();
    if (o.detect.head.empty()) throw Error(Status::InvalidArgument, "--detect takes yolov8 or yolov5");
    o.detect.score_threshold = vm["score"].as<float>();
    o.detect.iou_threshold = vm["iou"].as<float>();
    o.detect.max_boxes = vm["max-boxes"].as<std::int64_t>();
    o.detect.class_agnostic = vm["agnostic"].as<bool>();
    if (vm.count("anchors")) o.detect.anchors = parse_anchors(vm["anchors"].as<std::string>());
  } else if (!vm["score"].defaulted() || !vm["iou"].defaulted() || !vm["max-boxes"].defaulted() ||
             vm["agnostic"].as<bool>() || vm.count("anchors")) {
    throw Error(Status::InvalidArgument, "--score, --iou, --max-boxes, --agnostic and --anchors go with --detect");
  }
  if (vm.count("max-batch")) {
    o.max_batch = vm["max-batch"].as<std::int64_t>();
    if (o.max_batch < 1)
      throw Error(Status::InvalidArgument, "--max-batch " + std::to_string(o.max_batch) + ": expected 1 or more");
  }
  if (vm.count("shape"))
    for (const auto& s : vm["shape"].as<std::vector<std::string>>()) o.shapes.insert(parse_shape(s, o.max_batch > 0));
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
  if (o.report) print_precision_report(r.report);
  return 0;
}

}  // namespace tpuhal::cli
