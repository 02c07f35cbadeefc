// The compiler: an ONNX model and fixed input shapes (or a maximum batch) in, a compiled model
// (model_file.hpp) out, in fp32, fp16, bf16 or int8 (docs/runtime.md).
//
//   rt::CompileOptions o;
//   o.precision = rt::Precision::Int8;
//   o.calibration = {rt::read_npy("calib.npy")};   // one array per input
//   rt::CompileResult r = rt::compile_onnx("net.onnx", o);
//   rt::write_model_file("net.tpm", r.model);
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tpuhal/rt/model.hpp"
#include "tpuhal/rt/model_file.hpp"

namespace tpuhal::rt {

// A host array of float32 values with its shape (a calibration set, a test
// batch). read_npy takes NumPy's .npy files of little-endian f4 or f8 in C
// order, or i4 or i8 (token ids) holding values within +-2^24; errors name the path and what is wrong (what they quote
// of the header escaped: escape_text).
struct NdArray {
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};
NdArray read_npy(const std::filesystem::path& path);
void write_npy(const std::filesystem::path& path, const NdArray& array);

enum class CalibrationMethod : std::uint32_t {
  MinMax = 0,      // the observed range of each activation
  Percentile = 1,  // ranges cut at the `percentile`-th and (100 - `percentile`)-th
                   // percentiles of the values (outliers cut)
  Entropy = 2,     // each range cut where the quantised distribution of the
                   // values loses least information (Kullback-Leibler
                   // divergence from the unquantised one)
};

// CompileOptions::max_constant_bytes when it is 0, for a model whose
// initializers take less.
inline constexpr std::uint64_t kDefaultMaxConstantBytes = std::uint64_t{1} << 30;  // 1 GiB

// Post-processing the compiler appends to a detector (docs/runtime.md,
// "Detectors"): the model's one output decoded into boxes and scores, and
// non-maximum suppression (ops::nms) on the board, so that the compiled
// model's one output is `detections` [batch, max_boxes, 6]: rows of x1, y1,
// x2, y2, score, class, best first, rows after the last box 0, 0, 0, 0, 0,
// -1.
struct DetectOptions {
  // "" (none); "yolov8": an output [batch, 4 + classes, anchors] of boxes
  // (cx, cy, w, h) then class scores, as ultralytics exports YOLOv8;
  // "yolov5": [batch, anchors, 5 + classes] of boxes, objectness and class
  // scores, as YOLOv5's export.py writes it (a class's score is its
  // objectness times its class score); or, a model whose Detect layer was
  // left out, one output per level, [batch, A, height, width, 5 + classes]
  // (SOPHGO's "3output" export) or [batch, A * (5 + classes), height, width]
  // (the head's convolutions), which the compiler decodes as Detect does.
  std::string head;
  // yolov5 of one output per level: each level's anchors, (width, height)
  // pairs in the input's pixels, the finest level (the largest grid)
  // first, A pairs per level. Empty: YOLOv5's own, for 3 levels (P3 to P5)
  // or 4 (P3 to P6).
  std::vector<float> anchors;
  float score_threshold = 0.25f;  // a box is a candidate when its best class scores above it (finite)
  float iou_threshold = 0.45f;    // boxes overlapping a kept one by more are dropped (0 to 1)
  std::int64_t max_boxes = 100;   // per image, 1 to 65536
  bool class_agnostic = false;    // a kept box suppresses boxes of every class
};

struct CompileOptions {
  Precision precision = Precision::F32;
  // Fixed shape for each input with a symbolic or missing dimension, by
  // name; the batch dimension is usually the one given here.
  std::map<std::string, std::vector<std::int64_t>> shapes;
  // Above 0: the model runs any batch from 1 to this many samples without
  // compiling again (Instance::run takes the batch from the arrays given).
  // Every input's first dimension is the batch: symbolic in the model,
  // whatever `shapes` gives for it; every output's first dimension must
  // follow it. The compiler makes a program for each batch size, sharing
  // the weights and one calibration (int8 and the report run at this
  // batch), and an instance's activation memory is planned for the
  // largest. At most 256. 0: the shapes are fixed.
  std::int64_t max_batch = 0;
  // int8 and the report: samples of real inputs, one array per model
  // input in input order, the first dimension the sample count and the
  // rest the input's shape without its batch dimension. They run in
  // batches of the input's batch size; the last batch is filled up by
  // wrapping round to the first samples.
  std::vector<NdArray> calibration;
  CalibrationMethod method = CalibrationMethod::Percentile;
  double percentile = 99.99;
  // Also measure, per layer, the error of this precision against fp32 on
  // the calibration data (required then), into the Report section.
  bool report = false;
  // int8: layers (ONNX node names) that run in fp16 instead (in fp32 where
  // their calibrated input or output is beyond fp16's range: docs/runtime.md).
  std::vector<std::string> keep_fp16;
  // int8: when above 0, layers are moved to fp16, those that lose the most
  // signal first, until every output's signal-to-noise ratio against fp32
  // on the calibration data reaches this many dB (or no layer is left).
  double target_snr_db = 0;
  // int8 of a model with QuantizeLinear / DequantizeLinear pairs (Q/DQ,
  // explicit quantization): its layers run in int8 with the model's own
  // scales and zero points, and need no calibration; a layer the model's
  // pairs do not cover runs in fp32, and the notes say why. With
  // strict_qdq, such a layer is an error instead (docs/runtime.md).
  bool strict_qdq = false;
  // The device that runs calibration and the report, and on which the
  // compiled program is checked as Model::load checks it (its ops built over
  // memory allocated, never written) before compile_onnx returns it.
  std::string device = "sim:0";
  // The largest constant the compiler computes when it folds a node whose
  // result can outgrow its inputs (Expand, Where, broadcasting arithmetic
  // and comparisons, Pow, Gather, Concat, ConstantOfShape, Range), in bytes
  // as float32: a larger one is refused (ResourceExhausted naming the node
  // and the size) before memory is taken for it. 0: the larger of
  // kDefaultMaxConstantBytes and the bytes of the model's initializers as
  // float32 (folding a Transpose of its largest weight always fits).
  std::uint64_t max_constant_bytes = 0;
  // Where tensors kept in ONNX external data files are read from: each
  // tensor's "location" is a file relative to this directory. Empty: the
  // model file's directory when compiling from a path; when compiling from
  // bytes, a model with external data is refused unless this is set.
  std::filesystem::path external_data_dir;
  // A detector's post-processing on the board (DetectOptions); none by default.
  DetectOptions detect;
};

// One line of the precision report: a layer's output in the compiled
// precision against the same layer of the fp32 model, both fed the same
// inputs end to end.
struct LayerError {
  std::string node;    // ONNX node name
  std::string op;      // ONNX op type
  std::string output;  // tensor name
  double max_abs = 0;  // max |reduced - fp32|
  double rms = 0;      // root mean square of the difference
  double rel_rms = 0;  // rms / rms(fp32 values)
  double snr_db = 0;   // 10 log10(signal power / error power); -inf (and the errors inf) where the
                       // reduced layer gave an infinity or NaN
};

struct CompileResult {
  ModelFile model;
  std::vector<LayerError> report;  // empty unless options.report
  std::vector<std::string> notes;  // what the compiler did: folded, fused
};

// Tensors may keep their data in ONNX external data files
// (TensorProto.data_location EXTERNAL, as onnx.save_model(...,
// save_as_external_data=True) and PyTorch's exporter for models over 2 GB
// write them): the entries "location", "offset" and "length" are read,
// others ("checksum") ignored as ONNX's own loader does; each file is
// opened once and only each tensor's bytes are read, as little-endian
// raw_data. Each file is opened beneath the directory without following a
// symbolic link in any component (openat2 RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS, or a walk with O_NOFOLLOW): a location that is or
// passes through a symbolic link, wherever it points, is InvalidArgument, as
// is one that is absolute or has a ".." component, a file that is not a
// regular file, bytes past the end of the file, or a length other than the
// tensor's element count times its element size; a missing file is
// NotFound. A model file itself over 2 GiB cannot be parsed (protobuf's
// limit) and is InvalidArgument saying to save its weights as external data.
//
// Throws tpuhal::Error: Unsupported listing every unsupported op by node
// name and op type (never skipping one); InvalidArgument for a malformed
// model (a constant whose data does not fill its shape, window attributes
// the ops do not take, a model the loader would refuse: docs/runtime.md),
// a missing shape, or calibration data of the wrong shape;
// ResourceExhausted for folding past max_constant_bytes; NotFound for a
// missing model file or external data file. Messages quote the model's
// names escaped (escape_text).
CompileResult compile_onnx(const std::filesystem::path& onnx, const CompileOptions& options);

// The ONNX ops (default domain) the compiler takes, and those of them it
// can fold to constants at compile time, each sorted by name: its table of
// op handlers (docs/runtime.md, What is compiled; `tpuhal compile --list-ops`).
// Both empty in a build without ONNX, which compiles nothing.
std::vector<std::string> supported_onnx_ops();
std::vector<std::string> foldable_onnx_ops();
CompileResult compile_onnx(std::span<const std::byte> onnx_bytes, const CompileOptions& options,
                           std::string_view name = "model");

}  // namespace tpuhal::rt
