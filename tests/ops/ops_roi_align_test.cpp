// roi_align (docs/ops.md, kinds with rules): ONNX RoiAlign against a
// reference that works out each output on its own, sample by sample (the
// board computes each region's sample positions once and shares them
// across channels), in every dtype, mode, sampling and coordinate mode;
// a case worked by hand; strided views; the board's refusals of a region
// when it runs; and the builder's refusals.
#include "ops_reference.hpp"

namespace tpuhal::ops_test {
namespace {

struct RoiCase {
  bool max = false, half_pixel = true;
  std::int64_t ratio = 0;
  float scale = 1.0f;
};

// One sample of plane (n, c) of x at (y, x), as the docs say: 0 more than a
// pixel outside; else bilinear between the four nearest pixels, each
// weighted corner its own product. Returns the four weighted corners.
std::array<float, 4> corners(const Host& x, std::int64_t n, std::int64_t c, float y, float xx) {
  const std::int64_t h = x.shape[2], w = x.shape[3];
  auto at = [&](std::int64_t i, std::int64_t j) { return static_cast<float>(x.at({n, c, i, j})); };
  if (y < -1.0f || y > static_cast<float>(h) || xx < -1.0f || xx > static_cast<float>(w)) {
    const float z = 0.0f * at(0, 0);
    return {z, z, z, z};
  }
  if (y <= 0) y = 0;
  if (xx <= 0) xx = 0;
  std::int64_t y0 = static_cast<std::int64_t>(y), x0 = static_cast<std::int64_t>(xx), y1 = y0 + 1, x1 = x0 + 1;
  if (y0 >= h - 1) y0 = y1 = h - 1, y = static_cast<float>(y0);
  if (x0 >= w - 1) x0 = x1 = w - 1, xx = static_cast<float>(x0);
  const float ly = y - static_cast<float>(y0), lx = xx - static_cast<float>(x0);
  const float hy = 1.0f - ly, hx = 1.0f - lx;
  return {hy * hx * at(y0, x0), hy * lx * at(y0, x1), ly * hx * at(y1, x0), ly * lx * at(y1, x1)};
}

std::vector<double> ref_roi_align(const Host& x, const Host& rois, const Host& idx, const Shape& ys, const RoiCase& k) {
  const std::int64_t r_count = ys[0], channels = ys[1], oh = ys[2], ow = ys[3];
  std::vector<double> out;
  for (std::int64_t r = 0; r < r_count; ++r) {
    const auto b = static_cast<std::int64_t>(idx.v[static_cast<std::size_t>(r)]);
    const std::int64_t n = b < 0 ? b + x.shape[0] : b;
    const float off = k.half_pixel ? 0.5f : 0.0f;
    const float x1 = static_cast<float>(rois.at({r, 0})) * k.scale - off;
    const float y1 = static_cast<float>(rois.at({r, 1})) * k.scale - off;
    float rw = static_cast<float>(rois.at({r, 2})) * k.scale - off - x1;
    float rh = static_cast<float>(rois.at({r, 3})) * k.scale - off - y1;
    if (!k.half_pixel) rw = std::max(rw, 1.0f), rh = std::max(rh, 1.0f);
    const float bh = rh / static_cast<float>(oh), bw = rw / static_cast<float>(ow);
    auto grid = [&](float extent, std::int64_t bins) {
      return k.ratio > 0 ? k.ratio : std::max<std::int64_t>(0, static_cast<std::int64_t>(std::ceil(extent / bins)));
    };
    const std::int64_t gh = grid(rh, oh), gw = grid(rw, ow);
    for (std::int64_t c = 0; c < channels; ++c)
      for (std::int64_t i = 0; i < oh; ++i)
        for (std::int64_t j = 0; j < ow; ++j) {
          float acc = 0.0f;
          for (std::int64_t s = 0; s < gh * gw; ++s) {
            const std::int64_t iy = s / gw, ix = s % gw;
            const float y = y1 + static_cast<float>(i) * bh + (static_cast<float>(iy) + 0.5f) * bh / gh;
            const float xx = x1 + static_cast<float>(j) * bw + (static_cast<float>(ix) + 0.5f) * bw / gw;
            const auto v = corners(x, n, c, y, xx);
            acc = !k.max   ? acc + (v[0] + v[1] + v[2] + v[3])
                  : s == 0 ? std::max(std::max(std::max(v[0], v[1]), v[2]), v[3])
                           : std::max(acc, std::max(std::max(std::max(v[0], v[1]), v[2]), v[3]));
          }
          if (!k.max) acc /= static_cast<float>(std::max<std::int64_t>(gh * gw, 1));
          out.push_back(round_to(x.dtype, acc));
        }
  }
  return out;
}

std::string text(const RoiCase& k) {
  return std::string(k.max ? "max" : "avg") + (k.half_pixel ? " half_pixel" : " output_half_pixel") + " ratio " +
         std::to_string(k.ratio) + " scale " + num(k.scale);
}

// Regions in and around a 2 * size image (the scale halves some): corners in
// quarters, some degenerate (x2 < x1) and some reaching outside.
Host roi_boxes(Rng& r, DType t, std::int64_t count, std::int64_t size) {
  Host h(t, {count, 4});
  auto q = [&] { return round_to(t, static_cast<double>(r.integer(-8, 8 * size + 8)) / 4); };
  for (std::int64_t i = 0; i < count; ++i) {
    double v[4] = {q(), q(), q(), q()};
    if (!r.coin(0.15)) {  // most regions well formed
      if (v[2] < v[0]) std::swap(v[0], v[2]);
      if (v[3] < v[1]) std::swap(v[1], v[3]);
    }
    for (int k = 0; k < 4; ++k) h.v[static_cast<std::size_t>(i * 4 + k)] = v[k];
  }
  return h;
}

Host roi_indices(Rng& r, std::int64_t count, std::int64_t batches) {
  Host h(DType::I32, {count});
  for (auto& v : h.v) v = static_cast<double>(r.integer(-batches, batches - 1));
  return h;
}

// Why `lab`'s device refuses roi_align, or empty where it runs it: the
// CUDA shim has no kernel for it yet and says so when the op is run.
std::string refusal(Lab& lab) {
  const Tensor x = lab.output(DType::F32, {1, 1, 2, 2}), rois = lab.output(DType::F32, {1, 4});
  const Tensor idx = lab.output(DType::I32, {1}), y = lab.output(DType::F32, {1, 1, 1, 1});
  try {
    lab.q.run(ops::roi_align(x, rois, idx, y));
  } catch (const Error& e) {
    if (e.status() != Status::Unsupported) throw;
    return e.what();
  }
  return {};
}

#define TPUHAL_SKIP_WHERE_REFUSED()                           \
  if (const std::string why = refusal(lab()); !why.empty()) { \
    EXPECT_THAT(why, HasSubstr("cannot run roi_align"));      \
    GTEST_SKIP() << why;                                      \
  }

TEST_P(Ops, RoiAlignMatchesTheReferenceInEveryDtypeModeAndSampling) {
  TPUHAL_SKIP_WHERE_REFUSED();
  const std::vector<RoiCase> cases{{false, true, 0, 1.0f}, {false, false, 0, 0.5f}, {true, true, 2, 0.5f},
                                   {true, false, 0, 1.0f}, {false, true, 1, 0.25f}, {false, false, 3, 1.0f},
                                   {true, true, 0, 0.25f}};
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const RoiCase& k : cases) {
      const Host x = rand_host(rng_, dt, {2, 3, 9, 11}, -4, 4);
      // Regions in f32 beside bf16 data (the compiler keeps them so), else in the data's dtype.
      const Host rois = roi_boxes(rng_, dt == DType::BF16 ? DType::F32 : dt, 12, 10), idx = roi_indices(rng_, 12, 2);
      const Shape ys{12, 3, rng_.integer(1, 4), rng_.integer(1, 4)};
      const Tensor y = lab().output(dt, ys);
      const Op op = ops::roi_align(lab().upload(x), lab().upload(rois), lab().upload(idx), y,
                                   k.max ? RoiAlignMode::Max : RoiAlignMode::Average, k.ratio, k.scale, k.half_pixel);
      expect_exact(std::string("roi_align ") + to_string(dt) + " " + text(k), lab().run(op, y),
                   ref_roi_align(x, rois, idx, ys, k));
    }
}

TEST_P(Ops, RoiAlignAveragesAndTakesTheLargestWeightedCornerByHand) {
  TPUHAL_SKIP_WHERE_REFUSED();
  // x[1, 1, 4, 4] holds 0..15; the region (0, 0, 3, 3), not shifted, in one
  // bin of one sample: the sample sits at (1.5, 1.5), between 5, 6, 9 and 10,
  // each weighted 0.25. avg: 7.5. max (ONNX's): the largest weighted corner,
  // 0.25 * 10.
  Host x(DType::F32, {1, 1, 4, 4});
  for (std::size_t i = 0; i < x.size(); ++i) x.v[i] = static_cast<double>(i);
  Host rois(DType::F32, {1, 4});
  rois.v = {0, 0, 3, 3};
  Host idx(DType::I32, {1});
  idx.v = {0};
  const Tensor tx = lab().upload(x), tr = lab().upload(rois), ti = lab().upload(idx);
  const Tensor y = lab().output(DType::F32, {1, 1, 1, 1});
  expect_exact("avg", lab().run(ops::roi_align(tx, tr, ti, y, RoiAlignMode::Average, 1, 1.0f, false), y), {7.5});
  expect_exact("max", lab().run(ops::roi_align(tx, tr, ti, y, RoiAlignMode::Max, 1, 1.0f, false), y), {2.5});
  // Shifted by half a pixel, the sample is at (1, 1): the pixel 5 alone.
  expect_exact("half_pixel", lab().run(ops::roi_align(tx, tr, ti, y, RoiAlignMode::Average, 1, 1.0f, true), y), {5});
  // A region wholly left of the image: every sample outside, 0.
  Host away(DType::F32, {1, 4});
  away.v = {-9, 0, -5, 3};
  expect_exact("outside", lab().run(ops::roi_align(tx, lab().upload(away), ti, y), y), {0});
  // An empty X (no rows, or no columns): every sample outside it, 0.
  for (const Shape& shape : {Shape{1, 1, 0, 4}, Shape{1, 1, 4, 0}})
    for (const RoiAlignMode mode : {RoiAlignMode::Average, RoiAlignMode::Max})
      expect_exact("empty x", lab().run(ops::roi_align(lab().output(DType::F32, shape), tr, ti, y, mode), y), {0});
}

TEST_P(Ops, RoiAlignReadsStridedViews) {
  TPUHAL_SKIP_WHERE_REFUSED();
  // X channels last (a permuted NHWC tensor), the regions the last four
  // columns of a detector's [R, 5] rows (batch index first, as torchvision
  // keeps them), the indices every other element.
  const Host x = rand_host(rng_, DType::F32, {2, 4, 6, 7}, -2, 2);
  const Host nhwc = permuted(x, {0, 2, 3, 1});
  const Tensor tx = lab().upload(nhwc).permute({0, 3, 1, 2});
  const Host rois = roi_boxes(rng_, DType::F32, 5, 7), idx = roi_indices(rng_, 5, 2);
  const Tensor tr = lab().upload_view(rois, {5, 1}, 1);
  const Tensor ti = lab().upload_view(idx, {2}, 0);
  const RoiCase k{false, true, 2, 1.0f};
  const Tensor y = lab().output(DType::F32, {5, 4, 3, 2});
  expect_exact("views", lab().run(ops::roi_align(tx, tr, ti, y, RoiAlignMode::Average, 2), y),
               ref_roi_align(x, rois, idx, {5, 4, 3, 2}, k));
}

// A region the board refuses when it runs fails the op, says why, and
// leaves y unwritten; a new queue goes on.
TEST_P(Ops, RoiAlignRefusesABadRegionWhenItRunsAndWritesNothing) {
  TPUHAL_SKIP_WHERE_REFUSED();
  const Host x = rand_host(rng_, DType::F32, {2, 1, 4, 4}, -1, 1);
  struct Bad {
    std::vector<double> rois;
    double index;
    std::string says;
  };
  const std::vector<Bad> cases{
      {{0, 0, 2, 2}, 2, "tensor 2 holds the index 2, outside [-2, 2)"},
      {{0, 0, 2, 2}, -3, "tensor 2 holds the index -3, outside [-2, 2)"},
      {{0, kInf, 2, 2}, 0, "row 1 of tensor 1 holds a value that is not finite once scaled"},
      {{0, 0, 2, kNaN}, 0, "row 1 of tensor 1 holds a value that is not finite once scaled"},
      {{0, 0, 3e5, 3e5}, 0, "row 1 of tensor 1 asks for more than 1048576 samples (the most one row may take)"},
  };
  for (const Bad& b : cases) {
    Host rois(DType::F32, {2, 4}), idx(DType::I32, {2});
    rois.v = {0, 0, 1, 1};
    rois.v.insert(rois.v.end(), b.rois.begin(), b.rois.end());
    idx.v = {0, b.index};
    const Tensor y = lab().output(DType::F32, {2, 1, 2, 2});
    const Op op = ops::roi_align(lab().upload(x), lab().upload(rois), lab().upload(idx), y);
    const std::string msg = message_of([&] { lab().q.run(op).submit().wait(); });
    lab().q = Queue();
    lab().q = lab().dev.queue(Engine::Compute);
    EXPECT_THAT(msg, HasSubstr("failed at command 1 of 1 (roi_align, ring position")) << b.says;
    EXPECT_THAT(msg, HasSubstr(b.says));
    const auto raw = lab().bytes(y.buffer());
    EXPECT_TRUE(std::all_of(raw.begin(), raw.begin() + 32, [](std::byte v) { return v == std::byte{0xA5}; }))
        << "y was written by a roi_align that failed: " << b.says;
  }
}

TEST_P(Ops, RoiAlignRefusesWhatItsRuleDoesNotTake) {
  auto t = [&](DType dt, Shape s) { return lab().output(dt, std::move(s)); };
  const Tensor x = t(DType::F32, {2, 3, 8, 8}), rois = t(DType::F32, {4, 4}), idx = t(DType::I32, {4});
  const Tensor y = t(DType::F32, {4, 3, 2, 2});
  const auto avg = RoiAlignMode::Average;
  const Refusals cases{
      {[&] {
         ops::roi_align(t(DType::I32, {2, 3, 8, 8}), rois, idx, y);
       },
       "roi_align: x is i32; supported: f32, f16, bf16"},
      {[&] {
         ops::roi_align(x, t(DType::I32, {4, 4}), idx, y);
       },
       "roi_align: rois is i32; supported: f32, f16, bf16"},
      {[&] { ops::roi_align(x, rois, t(DType::F32, {4}), y); }, "roi_align: batch_indices is f32; supported: i32"},
      {[&] {
         ops::roi_align(x, t(DType::F32, {4, 5}), idx, y);
       },
       "roi_align: rois has shape [4, 5]; expected 4 as its dimension 1"},
      {[&] { ops::roi_align(x, rois, t(DType::I32, {3}), y); },
       "roi_align: batch_indices has shape [3]; expected dimension 0 of rois (4) as its dimension 0"},
      {[&] {
         ops::roi_align(x, rois, idx, t(DType::F32, {4, 2, 2, 2}));
       },
       "roi_align: y has shape [4, 2, 2, 2]; expected dimension 1 of x (3) as its dimension 1"},
      {[&] { ops::roi_align(x, rois, idx, y, avg, -1); }, "roi_align: sampling_ratio is -1; expected 0 to 65536"},
      {[&] { ops::roi_align(x, rois, idx, y, avg, 65537); }, "roi_align: sampling_ratio is 65537; expected 0 to 65536"},
      {[&] { ops::roi_align(x, rois, idx, y, avg, 0, -0.5f); },
       "roi_align: spatial_scale is -0.5; expected a finite number, at least 0"},
  };
  expect_refusals(cases);
}

}  // namespace
}  // namespace tpuhal::ops_test
