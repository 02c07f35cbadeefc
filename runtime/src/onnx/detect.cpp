// A detector's post-processing on the board (CompileOptions::detect): the
// model's one output, a YOLO head's boxes and class scores, read through
// strided views of itself and reduced by one nms op to the detections, the
// compiled model's one output. It is a node of the compiler's graph like
// any other (lowered, calibrated around, profiled and timed as a layer),
// though no ONNX op makes it. A YOLOv5 whose Detect layer was left out of
// the model (one output per level) first gets that layer's decoding, as
// ONNX nodes of the compiler's own.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <sstream>
#include <string>

#include "onnx/importer.hpp"
#include "onnx/lowerer.hpp"
#include "onnx/passes.hpp"

namespace tpuhal::rt::detail {
namespace {

constexpr std::int64_t kMaxBoxes = 65536;

struct Head {
  std::int64_t batch = 0, anchors = 0, classes = 0;
};

// The head's output shape, checked: [B, 4 + C, A] (yolov8) or
// [B, A, 5 + C] (yolov5).
Head read_head(const Importer& im, const DetectOptions& d, const std::string& output,
               const std::vector<std::int64_t>& s) {
  const bool v8 = d.head == "yolov8";
  const std::int64_t fixed = v8 ? 4 : 5;
  const std::int64_t channels = s.size() == 3 ? s[v8 ? 1 : 2] : 0;
  if (s.size() != 3 || channels <= fixed || s[v8 ? 2 : 1] < 1)
    im.fail(Status::InvalidArgument, "--detect " + d.head + " takes an output of shape " +
                                         (v8 ? "[batch, 4 + classes, anchors]" : "[batch, anchors, 5 + classes]") +
                                         "; output '" + output + "' is " + dims_text(s));
  return {s[0], s[v8 ? 2 : 1], channels - fixed};
}

// As few digits as read back as the same float.
std::string number(float v) {
  std::ostringstream os;
  for (int digits = 6; digits <= 9; ++digits) {
    os.str("");
    os << std::setprecision(digits) << v;
    if (std::strtof(os.str().c_str(), nullptr) == v) break;
  }
  return os.str();
}

// A value name the graph does not use yet.
std::string fresh_name(const Graph& g, const std::string& want) {
  std::string name = want;
  for (int i = 1; g.values.count(name); ++i) name = want + "_" + std::to_string(i);
  return name;
}

// ---- YOLOv5's Detect layer, for a model that leaves it out ----------------

// YOLOv5's anchors (yolov5s.yaml for P3 to P5, yolov5s6.yaml for P3 to
// P6), (width, height) in input pixels, the finest level first.
const std::vector<float> kYolov5Anchors3 = {10, 13, 16,  30,  33, 23,  30,  61,  62,
                                            45, 59, 119, 116, 90, 156, 198, 373, 326};
const std::vector<float> kYolov5Anchors4 = {19,  27,  44,  40,  38,  94,  96,  68,  86,  152, 180, 137,
                                            140, 301, 303, 264, 238, 542, 436, 615, 739, 380, 925, 1024};

// One level's output, as the model gives it.
struct Level {
  std::string output, value;
  std::int64_t height = 0, width = 0, stride = 0;
  bool split = false;  // [B, A * (5 + C), H, W]: the head's convolution, its anchors' channels not yet apart
};

std::string level_shapes(std::int64_t a) {
  const std::string n = std::to_string(a);
  return "[batch, " + n + ", height, width, 5 + classes] or [batch, " + n + " * (5 + classes), height, width]";
}

// The model's outputs as YOLOv5's levels of `a` anchors each, finest first,
// checked against one another and against the input's size.
std::vector<Level> read_levels(const Importer& im, std::int64_t a, std::int64_t& channels) {
  const Graph& g = im.g;
  if (g.inputs.size() != 1 || g.value(g.inputs[0]).shape.size() != 4)
    im.fail(Status::InvalidArgument,
            "--detect yolov5 of a model of one output per level needs its one input [batch, 3, height, width], "
            "from which each level's stride follows");
  const auto& in = g.value(g.inputs[0]).shape;
  std::vector<Level> levels;
  std::int64_t batch = 0;
  channels = 0;
  for (const auto& [output, value] : g.outputs) {
    const Value& v = g.value(value);
    const auto& s = v.shape;
    if (v.data) im.fail(Status::InvalidArgument, "--detect: output '" + output + "' is a constant; nothing to detect");
    Level l{output, value, 0, 0, 0, s.size() == 4};
    std::int64_t k = 0;
    if (s.size() == 5 && s[1] == a) k = s[4];
    if (s.size() == 4 && s[1] % a == 0) k = s[1] / a;
    if (k > 5) {  // both forms: height, then width, after the anchors' dimensions
      l.height = s[2];
      l.width = s[3];
    }
    if (k <= 5 || l.height < 1 || l.width < 1 || (channels && (k != channels || s[0] != batch)))
      im.fail(Status::InvalidArgument,
              "--detect yolov5 takes one output [batch, anchors, 5 + classes], or one per level, " + level_shapes(a) +
                  " (of one batch and class count); output '" + output + "' is " + dims_text(s));
    batch = s[0];
    channels = k;
    l.stride = in[2] / l.height;
    if (in[2] % l.height || in[3] % l.width || in[3] / l.width != l.stride)
      im.fail(Status::InvalidArgument, "--detect yolov5: output '" + output + "' is a grid of " +
                                           std::to_string(l.height) + "x" + std::to_string(l.width) +
                                           ", which does not divide the input's " + std::to_string(in[2]) + "x" +
                                           std::to_string(in[3]) + " into square cells");
    levels.push_back(l);
  }
  std::stable_sort(levels.begin(), levels.end(), [](const Level& x, const Level& y) { return x.stride < y.stride; });
  for (std::size_t i = 1; i < levels.size(); ++i)
    if (levels[i].stride == levels[i - 1].stride)
      im.fail(Status::InvalidArgument, "--detect yolov5: outputs '" + levels[i - 1].output + "' and '" +
                                           levels[i].output + "' are both of stride " +
                                           std::to_string(levels[i].stride) + "; each level has its own");
  return levels;
}

// The anchors to use for `levels` levels, checked.
std::vector<float> anchors_for(const Importer& im, const DetectOptions& d, std::size_t levels) {
  std::vector<float> a = d.anchors;
  if (a.empty()) {
    if (levels != 3 && levels != 4)
      im.fail(Status::InvalidArgument, "--detect yolov5: the model has " + std::to_string(levels) +
                                           " outputs; YOLOv5's own anchors are for 3 levels or 4, so give --anchors");
    a = levels == 3 ? kYolov5Anchors3 : kYolov5Anchors4;
  }
  if (a.size() % (2 * levels))
    im.fail(Status::InvalidArgument, "--anchors: " + std::to_string(a.size()) + " values for " +
                                         std::to_string(levels) +
                                         " levels; give (width, height) pairs, as many per level");
  for (float v : a)
    if (!(v > 0) || !std::isfinite(v))
      im.fail(Status::InvalidArgument, "--anchors: " + number(v) + " is not a positive size in pixels");
  return a;
}

// `x` sliced along its last axis to [first, end) as `out`.
void emit_slice(Importer& im, const Node& from, const std::string& suffix, const std::string& x, std::int64_t first,
                std::int64_t end, std::int64_t axis, const std::string& out) {
  const std::string p = from.name + "/" + suffix;
  im.emit_derived(from, suffix, "Slice",
                  {x, im.add_constant(p + "_starts", {1}, {static_cast<double>(first)}, true),
                   im.add_constant(p + "_ends", {1}, {static_cast<double>(end)}, true),
                   im.add_constant(p + "_axes", {1}, {static_cast<double>(axis)}, true)},
                  out);
}

void emit_with_ints(Importer& im, const Node& from, const std::string& suffix, const std::string& op,
                    std::vector<std::string> inputs, const std::string& out, const char* attribute,
                    const std::vector<std::int64_t>& values, bool list) {
  onnx::NodeProto p;
  Node n = im.derived(from, suffix, op, std::move(inputs), out, p);
  auto* at = p.add_attribute();
  at->set_name(attribute);
  at->set_type(list ? onnx::AttributeProto::INTS : onnx::AttributeProto::INT);
  if (list)
    for (auto v : values) at->add_ints(v);
  else
    at->set_i(values.at(0));
  im.emit(std::move(n), p);
}

// One level decoded as YOLOv5's Detect does it (v6 and later):
//   y = sigmoid(x); xy = (y[..., 0:2] * 2 + grid) * stride;
//   wh = (y[..., 2:4] * 2) ** 2 * anchors; the rest as y; [B, A * H * W, 5 + C]
// where grid holds each cell's (column, row) - 0.5. Returns the value.
std::string decode_level(Importer& im, const Level& l, std::size_t index, const std::vector<float>& anchors,
                         std::int64_t a, std::int64_t k) {
  Node from;
  from.name = "detect/level" + std::to_string(index);
  const std::string p = from.name + "/";
  std::string x = l.value;
  if (l.split) {
    const std::string sn =
        im.add_constant(p + "split_shape", {5}, {0, double(a), double(k), double(l.height), double(l.width)}, true);
    im.emit_derived(from, "split", "Reshape", {x, sn}, p + "split");
    emit_with_ints(im, from, "transpose", "Transpose", {p + "split"}, p + "transposed", "perm", {0, 1, 3, 4, 2}, true);
    x = p + "transposed";
  }
  im.emit_derived(from, "sigmoid", "Sigmoid", {x}, p + "y");
  emit_slice(im, from, "xy", p + "y", 0, 2, 4, p + "xy");
  emit_slice(im, from, "wh", p + "y", 2, 4, 4, p + "wh");
  emit_slice(im, from, "scores", p + "y", 4, k, 4, p + "scores");
  const std::string two = im.add_constant(p + "two", {}, {2.0}, false);
  std::vector<double> grid(static_cast<std::size_t>(l.height * l.width * 2));
  for (std::int64_t r = 0; r < l.height; ++r)
    for (std::int64_t c = 0; c < l.width; ++c) {
      grid[static_cast<std::size_t>((r * l.width + c) * 2)] = static_cast<double>(c) - 0.5;
      grid[static_cast<std::size_t>((r * l.width + c) * 2 + 1)] = static_cast<double>(r) - 0.5;
    }
  const std::string g = im.add_constant(p + "grid", {1, 1, l.height, l.width, 2}, grid, false);
  const std::string stride = im.add_constant(p + "stride", {}, {static_cast<double>(l.stride)}, false);
  std::vector<double> wh(static_cast<std::size_t>(2 * a));
  for (std::size_t i = 0; i < wh.size(); ++i) wh[i] = anchors[index * wh.size() + i];
  const std::string anchor_grid = im.add_constant(p + "anchors", {1, a, 1, 1, 2}, wh, false);
  im.emit_derived(from, "xy2", "Mul", {p + "xy", two}, p + "xy*2");
  im.emit_derived(from, "grid", "Add", {p + "xy*2", g}, p + "xy*2+grid");
  im.emit_derived(from, "stride", "Mul", {p + "xy*2+grid", stride}, p + "centres");
  im.emit_derived(from, "wh2", "Mul", {p + "wh", two}, p + "wh*2");
  im.emit_derived(from, "square", "Mul", {p + "wh*2", p + "wh*2"}, p + "(wh*2)^2");
  im.emit_derived(from, "anchors", "Mul", {p + "(wh*2)^2", anchor_grid}, p + "sizes");
  emit_with_ints(im, from, "boxes", "Concat", {p + "centres", p + "sizes", p + "scores"}, p + "boxes", "axis", {4},
                 false);
  const std::string rows = im.add_constant(p + "rows_shape", {3}, {0, double(a * l.height * l.width), double(k)}, true);
  im.emit_derived(from, "rows", "Reshape", {p + "boxes", rows}, p + "rows");
  for (const char* step : {"sigmoid", "xy2", "grid", "stride", "wh2", "square", "anchors"})
    im.g.fp16_in_int8.insert(p + step);
  return p + "rows";
}

// The model's levels decoded into one head [batch, anchors, 5 + classes]:
// the value that stands for the model's one output.
std::pair<std::string, std::string> decode_yolov5_levels(Importer& im, const DetectOptions& d) {
  Graph& g = im.g;
  if (g.opset < 10)
    im.fail(Status::InvalidArgument,
            "--detect yolov5 of a model of one output per level needs opset 10 or later; "
            "this model is opset " +
                std::to_string(g.opset));
  const std::vector<float> anchors = anchors_for(im, d, g.outputs.size());
  const auto a = static_cast<std::int64_t>(anchors.size() / (2 * g.outputs.size()));
  std::int64_t k = 0;
  const std::vector<Level> levels = read_levels(im, a, k);
  std::vector<std::string> rows;
  std::string text;
  std::int64_t boxes = 0;
  for (std::size_t i = 0; i < levels.size(); ++i) {
    rows.push_back(decode_level(im, levels[i], i, anchors, a, k));
    boxes += a * levels[i].height * levels[i].width;
    text += std::string(i ? ", " : "") + "'" + levels[i].output + "' (stride " + std::to_string(levels[i].stride) + ")";
  }
  Node from;
  from.name = "detect";
  emit_with_ints(im, from, "levels", "Concat", rows, "detect/head", "axis", {1}, false);
  g.notes.push_back("--detect yolov5: outputs " + text + " decoded as YOLOv5's Detect layer does (sigmoid; centres " +
                    "from each cell, sizes from " + std::to_string(a) + " anchors per level) into " +
                    std::to_string(boxes) + " boxes");
  return {"detect/head", "detect/head"};
}

// ---- the Detect node ----------------------------------------------------------

void lower_detect(Lowerer& l, const Node& n) {
  const auto& d = n.attr<DetectOptions>();
  const auto& s = l.shape_of(n.inputs[0]);
  const bool v8 = d.head == "yolov8";
  const std::int64_t b = s[0], a = v8 ? s[2] : s[1], ch = v8 ? s[1] : s[2];
  // The head in f32, so that the boxes' corners, areas and IoUs are
  // computed as torchvision computes them whatever the model's precision;
  // dense, so that its parts are views of it.
  const std::int64_t head = l.dense(l.get(n.inputs[0], DType::F32), DType::F32, s);
  auto part = [&](std::int64_t channel, std::int64_t count, bool broadcast) {
    const std::vector<std::int64_t> strides =
        v8 ? std::vector<std::int64_t>{ch * a, 1, a} : std::vector<std::int64_t>{a * ch, ch, broadcast ? 0 : 1};
    const std::uint64_t first = static_cast<std::uint64_t>(channel * (v8 ? a : 1)) * 4;
    return l.dg().add_subview(head, {b, a, count}, strides, first);
  };
  const std::int64_t boxes = part(0, 4, false);
  std::int64_t scores = part(v8 ? 4 : 5, ch - (v8 ? 4 : 5), false);
  if (!v8) {  // a class's score is its objectness times its class score
    const std::int64_t product = l.dg().add_arena("", DType::F32, {b, a, ch - 5});
    l.op("mul", n.name, {{"a", scores}, {"b", part(4, ch - 5, true)}, {"y", product}});
    scores = product;
  }
  const std::int64_t y = l.produce(n.output, DType::F32, l.shape_of(n.output));
  l.op("nms", n.name, {{"boxes", boxes}, {"scores", scores}, {"y", y}},
       {{"iou_threshold", d.iou_threshold},
        {"score_threshold", d.score_threshold},
        {"center", true},
        {"class_agnostic", d.class_agnostic}});
}

const OpHandler kDetect{.lower = lower_detect};

}  // namespace

void add_detect(Importer& im) {
  const DetectOptions& d = im.options.detect;
  if (d.head.empty()) return;
  if (d.head != "yolov8" && d.head != "yolov5")
    im.fail(Status::InvalidArgument, "--detect: unknown head '" + d.head + "' (yolov8 or yolov5)");
  if (!std::isfinite(d.score_threshold))
    im.fail(Status::InvalidArgument, "--detect: the score threshold is not a finite number");
  if (!(d.iou_threshold >= 0 && d.iou_threshold <= 1))
    im.fail(Status::InvalidArgument, "--detect: the IoU threshold " + number(d.iou_threshold) + " is not from 0 to 1");
  if (d.max_boxes < 1 || d.max_boxes > kMaxBoxes)
    im.fail(Status::InvalidArgument, "--detect: " + std::to_string(d.max_boxes) + " boxes; from 1 to " +
                                         std::to_string(kMaxBoxes) + " per image");
  Graph& g = im.g;
  if (g.outputs.size() != 1 && d.head != "yolov5")
    im.fail(Status::InvalidArgument,
            "--detect " + d.head + " takes a model of one output; this one has " + std::to_string(g.outputs.size()));
  if (!d.anchors.empty() && (d.head != "yolov5" || g.outputs.size() == 1))
    im.fail(Status::InvalidArgument, "--anchors: only for --detect yolov5 of a model of one output per level");
  const auto [output, value] = g.outputs.size() == 1 ? g.outputs[0] : decode_yolov5_levels(im, d);
  if (g.value(value).data)
    im.fail(Status::InvalidArgument, "--detect: output '" + output + "' is a constant; nothing to detect");
  const Head h = read_head(im, d, output, g.value(value).shape);
  Node n;
  n.name = "detect";
  for (int i = 1; std::any_of(g.nodes.begin(), g.nodes.end(), [&](const Node& o) { return o.name == n.name; }); ++i)
    n.name = "detect_" + std::to_string(i);
  n.op = "Detect";
  n.handler = &kDetect;
  n.inputs = {value};
  n.output = fresh_name(g, "detections");
  n.attrs = d;
  n.fused = d.head + " boxes and scores, NMS";
  g.values[n.output].shape = {h.batch, d.max_boxes, 6};
  g.outputs = {{"detections", n.output}};
  g.notes.push_back("--detect " + d.head + ": output '" + output + "' (" + std::to_string(h.anchors) + " boxes, " +
                    std::to_string(h.classes) + " classes) ends in NMS on the board: output 'detections' [" +
                    std::to_string(h.batch) + ", " + std::to_string(d.max_boxes) +
                    ", 6] (x1, y1, x2, y2, score, class; class -1 after the last box)");
  g.nodes.push_back(std::move(n));
}

}  // namespace tpuhal::rt::detail
