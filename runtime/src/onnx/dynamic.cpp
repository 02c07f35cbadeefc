// Ops whose output's shape depends on their inputs' values: NonZero,
// NonMaxSuppression and If. On constants they fold at compile time (an If
// on a constant condition is its branch); on values the device computes
// they start the model's host stage (Graph::host_stage, host_stage.cpp),
// where the runtime folds them on the host after the program.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "onnx/importer.hpp"

namespace tpuhal::rt::detail {
namespace {

// NonZero: [rank, count] int64, the coordinates of each nonzero element
// in row-major order.
Value fold_non_zero(Importer& im, Node& n) {
  const Value& x = im.in(n, 0);
  const auto strides = row_major_strides(x.shape);
  const std::size_t rank = x.shape.empty() ? 1 : x.shape.size();
  std::vector<std::uint64_t> at;
  for (std::uint64_t i = 0; i < x.elements(); ++i)
    if (value_at(x, i) != 0) at.push_back(i);
  im.check_folded(n, {static_cast<std::int64_t>(rank), static_cast<std::int64_t>(at.size())});
  std::vector<double> r(rank * at.size());
  for (std::size_t d = 0; d < rank; ++d)
    for (std::size_t k = 0; k < at.size(); ++k)
      r[d * at.size() + k] =
          x.shape.empty() ? 0.0 : static_cast<double>(static_cast<std::int64_t>(at[k]) / strides[d] % x.shape[d]);
  return make_constant({static_cast<std::int64_t>(rank), static_cast<std::int64_t>(at.size())}, r, true);
}

struct NmsAttrs {
  bool center_point_box = false;
  static NmsAttrs read(const Attrs& a) { return {a.i("center_point_box", 0) != 0}; }
};

// A box as [x1, y1, x2, y2] with x1 <= x2 and y1 <= y2, from ONNX's two
// encodings: corners in either order ([y1, x1, y2, x2]), or centre and size.
struct Box {
  float x1, y1, x2, y2;
};
Box box_at(const std::vector<double>& b, std::size_t at, bool center) {
  const auto f = [&](std::size_t k) { return static_cast<float>(b[at + k]); };
  if (center) {
    const float hw = f(2) / 2.0f, hh = f(3) / 2.0f;
    return {f(0) - hw, f(1) - hh, f(0) + hw, f(1) + hh};
  }
  return {std::min(f(1), f(3)), std::min(f(0), f(2)), std::max(f(1), f(3)), std::max(f(0), f(2))};
}

// Whether `b` overlaps `a` by an IoU above `threshold`, each step in f32
// as ONNX Runtime computes it (no overlap, or an empty box, suppresses
// nothing).
bool suppresses(const Box& a, const Box& b, float threshold) {
  const float iw = std::min(a.x2, b.x2) - std::max(a.x1, b.x1);
  const float ih = std::min(a.y2, b.y2) - std::max(a.y1, b.y1);
  if (iw <= 0.0f || ih <= 0.0f) return false;
  const float inter = iw * ih;
  const float area_a = (a.x2 - a.x1) * (a.y2 - a.y1), area_b = (b.x2 - b.x1) * (b.y2 - b.y1);
  const float uni = area_a + area_b - inter;
  if (area_a <= 0.0f || area_b <= 0.0f || uni <= 0.0f) return false;
  return inter / uni > threshold;
}

// One class's suppression over `boxes`, best first: the positions kept.
// A candidate is tested against the kept boxes that can overlap it along
// x, found among the candidates sorted by x1 (a kept box whose x1 is below
// the candidate's by more than the widest box, or not below its x2, cannot
// overlap it), so that boxes far apart (torchvision offsets each class's
// boxes apart to suppress them in one call) are not compared; with a
// coordinate that is not finite, every kept box.
std::vector<std::size_t> suppress(const std::vector<Box>& boxes, float threshold, double most) {
  std::vector<std::size_t> kept;
  bool finite = true;
  double widest = 0;
  for (const Box& b : boxes) {
    finite = finite && std::isfinite(b.x1) && std::isfinite(b.x2);
    widest = std::max(widest, static_cast<double>(b.x2) - static_cast<double>(b.x1));
  }
  std::vector<std::size_t> by_x(boxes.size());
  std::iota(by_x.begin(), by_x.end(), 0);
  std::sort(by_x.begin(), by_x.end(), [&](std::size_t p, std::size_t q) { return boxes[p].x1 < boxes[q].x1; });
  std::vector<double> xs(boxes.size());
  for (std::size_t i = 0; i < by_x.size(); ++i) xs[i] = boxes[by_x[i]].x1;
  std::vector<char> is_kept(boxes.size(), 0);  // by position in by_x
  std::vector<std::size_t> rank(boxes.size());
  for (std::size_t i = 0; i < by_x.size(); ++i) rank[by_x[i]] = i;
  for (std::size_t k = 0; k < boxes.size() && static_cast<double>(kept.size()) < most; ++k) {
    const Box& b = boxes[k];
    bool hit = false;
    if (finite) {
      const auto lo = std::lower_bound(xs.begin(), xs.end(), static_cast<double>(b.x1) - widest) - xs.begin();
      const auto hi = std::lower_bound(xs.begin(), xs.end(), static_cast<double>(b.x2)) - xs.begin();
      for (auto j = lo; j < hi && !hit; ++j)
        hit =
            is_kept[static_cast<std::size_t>(j)] && suppresses(boxes[by_x[static_cast<std::size_t>(j)]], b, threshold);
    } else {
      for (std::size_t j = 0; j < kept.size() && !hit; ++j) hit = suppresses(boxes[kept[j]], b, threshold);
    }
    if (hit) continue;
    kept.push_back(k);
    is_kept[rank[k]] = 1;
  }
  return kept;
}

// An optional scalar input, or `def` where it is not given.
double scalar_or(Importer& im, Node& n, std::size_t i, double def) {
  if (!im.has(n, i)) return def;
  const Value& v = im.in(n, i);
  if (v.elements() != 1) im.fail_node(n, "input " + std::to_string(i) + " is not one value");
  return values_of(v)[0];
}

// NonMaxSuppression: per batch and class, the boxes whose score is above
// the threshold, best first (equal scores: the lower index first), each
// kept unless a kept box overlaps it by an IoU above the threshold, at
// most max_output_boxes_per_class; rows [batch, class, box], int64.
Value fold_nms(Importer& im, Node& n) {
  const Value& boxes = im.in(n, 0);
  const Value& scores = im.in(n, 1);
  const auto& bs = boxes.shape;
  const auto& ss = scores.shape;
  if (bs.size() != 3 || bs[2] != 4 || ss.size() != 3 || ss[0] != bs[0] || ss[2] != bs[1])
    im.fail_node(n, "boxes " + dims_text(bs) + " and scores " + dims_text(ss) +
                        " are not [batches, boxes, 4] and [batches, classes, boxes]");
  const double most = scalar_or(im, n, 2, 0);
  const auto iou = static_cast<float>(scalar_or(im, n, 3, 0));
  const bool threshold = im.has(n, 4);
  const auto score_min = static_cast<float>(scalar_or(im, n, 4, 0));
  const bool center = n.attr<NmsAttrs>().center_point_box;
  const auto b = values_of(boxes), s = values_of(scores);
  const auto count = static_cast<std::size_t>(bs[1]);
  std::vector<double> rows;
  for (std::int64_t batch = 0; batch < bs[0]; ++batch)
    for (std::int64_t cls = 0; cls < ss[1]; ++cls) {
      const std::size_t base = static_cast<std::size_t>(batch * ss[1] + cls) * count;
      std::vector<std::size_t> order;
      for (std::size_t k = 0; k < count; ++k)
        if (!threshold || static_cast<float>(s[base + k]) > score_min) order.push_back(k);
      std::stable_sort(order.begin(), order.end(), [&](std::size_t p, std::size_t q) {
        return static_cast<float>(s[base + p]) > static_cast<float>(s[base + q]);
      });
      std::vector<Box> candidates;
      for (std::size_t k : order)
        candidates.push_back(box_at(b, (static_cast<std::size_t>(batch) * count + k) * 4, center));
      for (std::size_t at : suppress(candidates, iou, most))
        rows.insert(rows.end(), {static_cast<double>(batch), static_cast<double>(cls), static_cast<double>(order[at])});
    }
  return make_constant({static_cast<std::int64_t>(rows.size() / 3), 3}, rows, true);
}

// If on a constant condition: its branch's nodes, emitted in its place,
// and its outputs those of the branch.
void expand_if(Importer& im, Node& n, const onnx::NodeProto& p) {
  const Value& cond = im.constant(n, 0, "condition");
  if (cond.elements() != 1) im.fail_node(n, "its condition has " + std::to_string(cond.elements()) + " values");
  const char* name = values_of(cond)[0] != 0 ? "then_branch" : "else_branch";
  const onnx::AttributeProto* branch = Attrs{p}.find(name);
  if (!branch || !branch->has_g()) im.fail_node(n, std::string("no ") + name);
  const onnx::GraphProto& g = branch->g();
  if (g.output_size() != p.output_size())
    im.fail_node(n, std::string("its ") + name + " has " + std::to_string(g.output_size()) + " outputs; the node " +
                        std::to_string(p.output_size()));
  for (int i = 0; i < g.node_size(); ++i) im.read_node(g.node(i), i);
  for (int k = 0; k < p.output_size(); ++k) {
    const std::string& from = g.output(k).name();
    const std::string value = im.resolve(from);
    if (!im.g.values.count(value) && !im.host.values.count(value))
      im.fail_node(n, "its " + std::string(name) + "'s output '" + from + "' is not produced in it");
    im.alias[p.output(k)] = im.resolve(from);
  }
}

}  // namespace

std::span<const OpHandler> dynamic_handlers() {
  static const OpHandler h[] = {
      {.ops = {"NonZero"},
       .opsets = {.first = 9, .refusal = "NonZero before opset 9"},
       .fold = fold_non_zero,
       .folds = Fold::IfConstant,
       .data_dependent = true},
      {.ops = {"NonMaxSuppression"},
       .opsets = {.first = 10, .refusal = "NonMaxSuppression before opset 10"},
       .read = read_attrs<NmsAttrs>,
       .fold = fold_nms,
       .folds = Fold::IfConstant,
       .data_dependent = true},
      {.ops = {"If"}, .expand = expand_if, .data_dependent = true, .outputs = 0},
  };
  return h;
}

}  // namespace tpuhal::rt::detail
