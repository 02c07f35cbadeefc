// A detector's post-processing on the board (CompileOptions::detect): the
// model's one output, a YOLO head's boxes and class scores, read through
// strided views of itself and reduced by one nms op to the detections, the
// compiled model's one output. It is a node of the compiler's graph like
// any other (lowered, calibrated around, profiled and timed as a layer),
// though no ONNX op makes it.
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
  if (g.outputs.size() != 1)
    im.fail(Status::InvalidArgument,
            "--detect " + d.head + " takes a model of one output; this one has " + std::to_string(g.outputs.size()));
  const auto [output, value] = g.outputs[0];
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
