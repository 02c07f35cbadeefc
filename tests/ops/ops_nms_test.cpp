// nms (docs/ops.md, kinds with rules): a detector's boxes and class scores
// to its detections, against a reference written the other way round (each
// kept box striking out the later ones it overlaps, as torchvision's CPU
// kernel does), in every dtype, box format and mode; from the strided views
// a detector's output gives; and the builder's refusals.
#include "ops_reference.hpp"

namespace tpuhal::ops_test {
namespace {

struct NmsCase {
  float iou = 0.45f, score = 0.25f;
  bool center = true, agnostic = false;
};

// boxes [B, N, 4], scores [B, N, C] -> [B, M, 6] by the documented rule.
// Coordinates in the tests are eighths below 64 held in the dtype (at most
// 11 significant bits), so every area, intersection and sum is exact in f32
// and only the division rounds: fused or not, any compiler gets these bits.
std::vector<double> ref_nms(const Host& boxes, const Host& scores, std::int64_t rows, const NmsCase& c) {
  const std::int64_t batches = boxes.shape[0], n = boxes.shape[1], classes = scores.shape[2];
  std::vector<double> y(static_cast<std::size_t>(batches * rows * 6));
  for (std::int64_t b = 0; b < batches; ++b) {
    struct Box {
      float score, x1, y1, x2, y2;
      std::int64_t index, cls;
    };
    std::vector<Box> order;
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t cls = -1;
      float best = 0;
      for (std::int64_t k = 0; k < classes; ++k) {
        const auto s = static_cast<float>(scores.at({b, i, k}));
        if (!std::isnan(s) && (cls < 0 || s > best)) best = s, cls = k;
      }
      if (cls < 0 || !(best > c.score)) continue;
      float v[4];
      for (std::int64_t k = 0; k < 4; ++k) v[k] = static_cast<float>(boxes.at({b, i, k}));
      Box box{best, v[0], v[1], v[2], v[3], i, cls};
      if (c.center) box = {best, v[0] - v[2] / 2, v[1] - v[3] / 2, v[0] + v[2] / 2, v[1] + v[3] / 2, i, cls};
      order.push_back(box);
    }
    std::stable_sort(order.begin(), order.end(), [](const Box& a, const Box& o) { return a.score > o.score; });
    std::vector<bool> struck(order.size(), false);
    std::int64_t kept = 0;
    for (std::size_t i = 0; i < order.size() && kept < rows; ++i) {
      if (struck[i]) continue;
      const Box& k = order[i];
      const float row[6] = {k.x1, k.y1, k.x2, k.y2, k.score, static_cast<float>(k.cls)};
      for (int j = 0; j < 6; ++j)
        y[static_cast<std::size_t>((b * rows + kept) * 6 + j)] = round_to(boxes.dtype, row[j]);
      ++kept;
      const float area = (k.x2 - k.x1) * (k.y2 - k.y1);
      for (std::size_t j = i + 1; j < order.size(); ++j) {
        const Box& o = order[j];
        if (!c.agnostic && o.cls != k.cls) continue;
        const float w = std::max(0.0f, std::min(k.x2, o.x2) - std::max(k.x1, o.x1));
        const float h = std::max(0.0f, std::min(k.y2, o.y2) - std::max(k.y1, o.y1));
        const float inter = w * h;
        if (inter / (area + (o.x2 - o.x1) * (o.y2 - o.y1) - inter) > c.iou) struck[j] = true;
      }
    }
    for (std::int64_t r = kept; r < rows; ++r) y[static_cast<std::size_t>((b * rows + r) * 6 + 5)] = -1;
  }
  return y;
}

std::string text(const NmsCase& c) {
  return "iou " + num(c.iou) + " score " + num(c.score) + (c.center ? " center" : " corners") +
         (c.agnostic ? " agnostic" : "");
}

// Boxes clustered so that many overlap: corners (or centre and size) in
// quarters and eighths below 64, rounded to the dtype; positive sizes.
Host nms_boxes(Rng& r, DType t, std::int64_t batches, std::int64_t n, bool center) {
  Host h(t, {batches, n, 4});
  auto q = [&](std::int64_t lo, std::int64_t hi) { return static_cast<double>(r.integer(lo, hi)) / 4; };
  for (std::int64_t i = 0; i < batches * n; ++i) {
    const double x = q(0, 120), y = q(0, 120), w = q(1, 64), hgt = q(1, 64);
    const double v[4] = {center ? x + w / 2 : x, center ? y + hgt / 2 : y, center ? w : x + w, center ? hgt : y + hgt};
    for (int k = 0; k < 4; ++k) h.v[static_cast<std::size_t>(i * 4 + k)] = round_to(t, v[k]);
  }
  return h;
}

// Scores from a few values, so that classes and boxes tie; some NaN.
Host nms_scores(Rng& r, DType t, std::int64_t batches, std::int64_t n, std::int64_t classes) {
  Host h(t, {batches, n, classes});
  const std::vector<double> levels{0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0};
  for (auto& v : h.v) v = r.coin(0.02) ? kNaN : r.pick(levels);
  return h;
}

TEST_P(Ops, NmsKeepsWhatTheReferenceKeepsInEveryDtypeFormatAndMode) {
  const std::vector<NmsCase> cases{{0.45f, 0.25f, true, false}, {0.45f, 0.25f, false, false},
                                   {0.3f, 0.5f, true, true},    {0.0f, -1.0f, false, false},
                                   {1.0f, 0.0f, true, false},   {0.7f, 0.875f, false, true}};
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const NmsCase& c : cases)
      for (std::int64_t rows : {1, 7, 60}) {
        const Host b = nms_boxes(rng_, dt, 3, 50, c.center), s = nms_scores(rng_, dt, 3, 50, 4);
        const Tensor y = lab().output(dt, {3, rows, 6});
        const Host got =
            lab().run(ops::nms(lab().upload(b), lab().upload(s), y, c.iou, c.score, c.center, c.agnostic), y);
        expect_exact(std::string("nms ") + to_string(dt) + " " + text(c) + " rows " + std::to_string(rows), got,
                     ref_nms(b, s, rows, c));
      }
}

TEST_P(Ops, NmsKeepsTheBestOfOverlappingBoxesPerClassAndFillsTheRestWithClassMinusOne) {
  // Worked by hand: boxes 0 and 1 overlap by IoU 0.6 (0.75 / 1.25), box 2
  // overlaps box 0 as much but is of another class, box 3 scores too low.
  Host b(DType::F32, {1, 4, 4});
  b.v = {0, 0, 1, 1, 0, 0.25, 1, 1.25, 0, 0, 1, 1, 5, 5, 6, 6};
  Host s(DType::F32, {1, 4, 2});
  s.v = {0.9, 0.1, 0.8, 0.2, 0.3, 0.7, 0.2, 0.1};
  const Tensor y = lab().output(DType::F32, {1, 4, 6});
  const Tensor tb = lab().upload(b), ts = lab().upload(s);
  expect_exact("two classes", lab().run(ops::nms(tb, ts, y, 0.5f, 0.25f, false, false), y),
               {0, 0, 1, 1, 0.9f, 0, 0, 0, 1, 1, 0.7f, 1, 0, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, -1});
  expect_exact("class agnostic", lab().run(ops::nms(tb, ts, y, 0.5f, 0.25f, false, true), y),
               {0, 0, 1, 1, 0.9f, 0, 0, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, -1});
  expect_exact("IoU 0.6 kept at a threshold of 0.6", lab().run(ops::nms(tb, ts, y, 0.6f, 0.25f, false, true), y),
               {0, 0, 1, 1, 0.9f, 0, 0, 0.25f, 1, 1.25f, 0.8f, 0, 0, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, -1});
}

TEST_P(Ops, NmsReadsADetectorsChannelMajorOutputThroughStridedViews) {
  // A YOLOv8 head's [B, 4 + C, N]: boxes and scores are views of it with
  // the channel stride N and the box stride 1, as the compiler makes them.
  const std::int64_t batches = 2, n = 40, classes = 3;
  const Host b = nms_boxes(rng_, DType::F32, batches, n, true), s = nms_scores(rng_, DType::F32, batches, n, classes);
  const std::int64_t ch = 4 + classes;
  Host head(DType::F32, {batches, ch, n});
  for (std::int64_t i = 0; i < batches; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      for (std::int64_t k = 0; k < 4; ++k) head.v[static_cast<std::size_t>((i * ch + k) * n + j)] = b.at({i, j, k});
      for (std::int64_t k = 0; k < classes; ++k)
        head.v[static_cast<std::size_t>((i * ch + 4 + k) * n + j)] = s.at({i, j, k});
    }
  const Tensor t = lab().upload(head);
  const Tensor bv(t.buffer(), DType::F32, {batches, n, 4}, {ch * n, 1, n}, 0);
  const Tensor sv(t.buffer(), DType::F32, {batches, n, classes}, {ch * n, 1, n}, 4 * n * 4);
  const Tensor y = lab().output(DType::F32, {batches, 10, 6});
  const NmsCase c;
  expect_exact("nms of views", lab().run(ops::nms(bv, sv, y, c.iou, c.score), y), ref_nms(b, s, 10, c));
}

TEST_P(Ops, NmsRefusesWhatItsRuleDoesNotTake) {
  auto t = [&](DType dt, Shape s) { return lab().output(dt, std::move(s)); };
  const Tensor b = t(DType::F32, {2, 5, 4}), s = t(DType::F32, {2, 5, 3}), y = t(DType::F32, {2, 4, 6});
  const Refusals cases{
      {[&] {
         ops::nms(t(DType::I32, {2, 5, 4}), s, y);
       },
       "nms: boxes is i32; supported: f32, f16, bf16"},
      {[&] {
         ops::nms(b, t(DType::F16, {2, 5, 3}), y);
       },
       "nms: scores is f16 but boxes is f32"},
      {[&] {
         ops::nms(t(DType::F32, {5, 4}), s, y);
       },
       "nms: boxes has shape [5, 4], rank 2; expected rank 3"},
      {[&] {
         ops::nms(t(DType::F32, {2, 5, 5}), s, y);
       },
       "nms: boxes has shape [2, 5, 5]; expected 4 as its dimension 2"},
      {[&] {
         ops::nms(b, t(DType::F32, {2, 6, 3}), y);
       },
       "nms: scores has shape [2, 6, 3]; expected dimension 1 of boxes (5) as its dimension 1"},
      {[&] {
         ops::nms(b, s, t(DType::F32, {1, 4, 6}));
       },
       "nms: y has shape [1, 4, 6]; expected dimension 0 of boxes (2) as its dimension 0"},
      {[&] { ops::nms(b, s, y, 1.5f); }, "nms: iou_threshold is 1.5; expected a finite number, 0 to 1"},
      {[&] { ops::nms(b, s, y, 0.5f, std::nanf("")); }, "nms: score_threshold is nan; expected a finite number"},
  };
  expect_refusals(cases);
}

}  // namespace
}  // namespace tpuhal::ops_test
