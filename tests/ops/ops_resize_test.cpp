// resize: every nearest and coordinate mode, exact ties, bilinear.
#include "ops_reference.hpp"

namespace tpuhal::ops_test {
namespace {

TEST_P(Ops, ResizeNearestEveryNearestAndCoordinateMode) {
  ResizeCheck check(lab(), seed_);
  struct Size {
    std::int64_t h, w, oh, ow;
  };
  const std::vector<Size> sizes{{3, 5, 7, 11}, {8, 9, 3, 4}, {4, 4, 2, 8}, {5, 3, 5, 6}};
  for (DType dt : {DType::F32, DType::U8})
    for (NearestMode nm : kNearestModes)
      for (CoordinateMode cm : kCoordinateModes)
        for (const Size& s : sizes) {
          ResizeOptions o;
          o.mode = ResizeMode::Nearest;
          o.nearest = nm;
          o.coordinate = cm;
          o.layout = rng_.coin() ? Layout::NCHW : Layout::NHWC;
          const Host x = is_float(dt) ? rand(dt, img_shape(o.layout, 1, 2, s.h, s.w), -50, 50)
                                      : rand_int(rng_, dt, img_shape(o.layout, 1, 2, s.h, s.w));
          check.run("resize", x, s.oh, s.ow, o, false);
        }
}

TEST_P(Ops, ResizeNearestBreaksExactTiesByItsMode) {
  // Scales that are powers of two keep every coordinate exact in f32, so
  // the ties (x.5) are real and the mode alone decides them.
  ResizeCheck check(lab(), seed_);
  for (NearestMode nm : kNearestModes)
    for (CoordinateMode cm : {CoordinateMode::HalfPixel, CoordinateMode::Asymmetric, CoordinateMode::TfHalfPixelForNn,
                              CoordinateMode::PytorchHalfPixel}) {
      ResizeOptions o;
      o.nearest = nm;
      o.coordinate = cm;
      const Host x = rand(DType::F32, {1, 1, 8, 4}, -50, 50);
      check.run("tie", x, 4, 8, o, true);   // 0.5x rows, 2x columns
      check.run("tie", x, 2, 16, o, true);  // 0.25x, 4x
      check.run("tie", x, 16, 1, o, true);  // 2x, 0.25x
    }
}

TEST_P(Ops, ResizeLinearEveryCoordinateMode) {
  ResizeCheck check(lab(), seed_);
  struct Size {
    std::int64_t h, w, oh, ow;
  };
  const std::vector<Size> sizes{{3, 5, 7, 11}, {8, 9, 3, 4}, {4, 4, 8, 2}, {6, 1, 3, 3}};
  for (DType dt : {DType::F32, DType::F16, DType::U8, DType::I8})
    for (CoordinateMode cm : kCoordinateModes)
      for (const Size& s : sizes) {
        ResizeOptions o;
        o.mode = ResizeMode::Linear;
        o.coordinate = cm;
        o.layout = rng_.coin() ? Layout::NCHW : Layout::NHWC;
        const Host x = is_float(dt) ? rand(dt, img_shape(o.layout, 2, 3, s.h, s.w), -20, 20)
                                    : rand_int(rng_, dt, img_shape(o.layout, 2, 3, s.h, s.w));
        check.run("resize", x, s.oh, s.ow, o, false);
      }
  // Explicit scales (the output is floor(in * scale)).
  for (CoordinateMode cm : kCoordinateModes)
    for (ResizeMode mode : {ResizeMode::Linear, ResizeMode::Nearest}) {
      ResizeOptions o;
      o.mode = mode;
      o.coordinate = cm;
      o.scales = std::array<float, 2>{1.7f, 0.6f};
      const Host x = rand(DType::F32, {1, 2, 4, 10}, -20, 20);
      check.run("explicit scales", x, 6, 6, o, false);
    }
}

}  // namespace
}  // namespace tpuhal::ops_test
