// Non-maximum suppression (fw::NmsAttrs): a detector's boxes and class
// scores to its detections, each batch on one thread. Every value is an
// f32 comparison or one IEEE operation in a fixed order (the tree builds
// with -ffp-contract=off: nothing is fused into a multiply-add), so the
// kept boxes are the same on every host, ISA level and thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "engine.h"
#include "numerics.h"

namespace tpuhal::sim::tensor {
namespace {

struct Candidate {
  float score;
  std::uint32_t box;  // index along N
  std::uint32_t cls;
  float x1, y1, x2, y2, area;
};

// Intersection over union as torchvision's nms computes it: the areas from
// the corners, the intersection clamped at 0, one division.
float iou(const Candidate& a, const Candidate& b) {
  const float w = std::max(0.0f, std::min(a.x2, b.x2) - std::max(a.x1, b.x1));
  const float h = std::max(0.0f, std::min(a.y2, b.y2) - std::max(a.y1, b.y1));
  const float inter = w * h;
  return inter / (a.area + b.area - inter);
}

}  // namespace

fw::Problem run_nms(TensorEngine& e, const fw::NmsAttrs& at, const View* v) {
  const View &boxes = v[0], &scores = v[1], &y = v[2];
  const std::uint64_t batches = boxes.shape[0], n = boxes.shape[1], classes = scores.shape[2], rows = y.shape[1];
  const bool center = at.center != 0, agnostic = at.class_agnostic != 0;
  auto box_value = [&](std::uint64_t b, std::uint64_t i, std::uint64_t k) {
    return load_float(boxes.at(b * boxes.strides[0] + i * boxes.strides[1] + k * boxes.strides[2]), boxes.dtype);
  };
  auto put = [&](std::uint64_t b, std::uint64_t row, std::uint64_t k, float value) {
    store_float(y.at(b * y.strides[0] + row * y.strides[1] + k * y.strides[2]), y.dtype, value);
  };
  e.pool().parallel_for(batches, [&](std::uint64_t begin, std::uint64_t end) {
    std::vector<Candidate> candidates, kept;
    for (std::uint64_t b = begin; b < end; ++b) {
      candidates.clear();
      kept.clear();
      for (std::uint64_t i = 0; i < n; ++i) {
        // The best class: the first of the highest score; a NaN never wins.
        float best = -std::numeric_limits<float>::infinity();
        std::uint32_t cls = 0;
        const std::byte* s = scores.at(b * scores.strides[0] + i * scores.strides[1]);
        for (std::uint64_t c = 0; c < classes; ++c) {
          const float value = load_float(s + c * scores.strides[2] * scores.esize, scores.dtype);
          if (value > best) {
            best = value;
            cls = static_cast<std::uint32_t>(c);
          }
        }
        if (!(best > at.score_threshold)) continue;
        Candidate k{best, static_cast<std::uint32_t>(i), cls, 0, 0, 0, 0, 0};
        const float b0 = box_value(b, i, 0), b1 = box_value(b, i, 1), b2 = box_value(b, i, 2), b3 = box_value(b, i, 3);
        if (center) {
          k.x1 = b0 - b2 / 2;
          k.y1 = b1 - b3 / 2;
          k.x2 = b0 + b2 / 2;
          k.y2 = b1 + b3 / 2;
        } else {
          k.x1 = b0;
          k.y1 = b1;
          k.x2 = b2;
          k.y2 = b3;
        }
        k.area = (k.x2 - k.x1) * (k.y2 - k.y1);
        candidates.push_back(k);
      }
      std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& c) {
        return a.score != c.score ? a.score > c.score : a.box < c.box;
      });
      for (const Candidate& k : candidates) {
        if (kept.size() == rows) break;
        const bool suppressed = std::any_of(kept.begin(), kept.end(), [&](const Candidate& other) {
          return (agnostic || other.cls == k.cls) && iou(other, k) > at.iou_threshold;
        });
        if (!suppressed) kept.push_back(k);
      }
      for (std::uint64_t r = 0; r < rows; ++r) {
        if (r < kept.size()) {
          const Candidate& k = kept[r];
          const float row[6] = {k.x1, k.y1, k.x2, k.y2, k.score, static_cast<float>(k.cls)};
          for (std::uint64_t j = 0; j < 6; ++j) put(b, r, j, row[j]);
        } else {
          for (std::uint64_t j = 0; j < 5; ++j) put(b, r, j, 0.0f);
          put(b, r, 5, -1.0f);
        }
      }
    }
  });
  return {};
}

}  // namespace tpuhal::sim::tensor
