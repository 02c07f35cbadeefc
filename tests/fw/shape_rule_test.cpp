// The shape rules the board's decoder and the host's builders share: the
// window kinds' (fw/window.h), each fault it finds (where the board
// reports it: tensor_decode_test.cpp), and resize's and color_convert's
// (fw/planes.h).
#include <gtest/gtest.h>

#include <cmath>

#include "tpuhal/fw/planes.h"
#include "tpuhal/fw/window.h"

namespace tpuhal::fw {
namespace {

using F = WindowFault;

// The rule is constexpr: a layer may check a geometry at compile time.
static_assert(conv_shape(Window{}, {1, 3, 8, 8}, {4, 3, 3, 3}).out[2] == 6);
static_assert(pool_shape(Window{{2, 2}, {2, 2}}, {1, 3, 8, 8}).out[3] == 4);

TEST(FwWindowRule, WindowValuesAreCheckedPerAxisThenThePads) {
  Window w;
  EXPECT_TRUE(window_values(w, true).ok());
  w.stride[1] = 0;
  w.kernel[1] = kMaxWindowValue + 1;
  // Pooling: the kernel first along an axis, then its stride and dilation.
  WindowVerdict v = window_values(w, true);
  EXPECT_EQ(v.fault, F::kKernel);
  EXPECT_EQ(v.at, 1u);
  EXPECT_EQ(v.got, kMaxWindowValue + 1);
  EXPECT_EQ(v.want, kMaxWindowValue);
  // A convolution's kernel is its weights': not an attribute.
  v = window_values(w, false);
  EXPECT_EQ(v.fault, F::kStride);
  EXPECT_EQ(v.got, 0u);

  w = Window{};
  w.dilation[0] = 0;
  w.pad[3] = kMaxWindowValue + 1;
  EXPECT_EQ(window_values(w, false).fault, F::kDilation);
  w.dilation[0] = 1;
  v = window_values(w, false);
  EXPECT_EQ(v.fault, F::kPad);
  EXPECT_EQ(v.at, 3u);

  // Pooling: a pad as wide as the window leaves windows of padding alone.
  w = Window{{3, 2}};
  w.pad[2] = 3;
  EXPECT_TRUE(window_values(w, false).ok());
  v = window_values(w, true);
  EXPECT_EQ(v.fault, F::kPadPastWindow);
  EXPECT_EQ(v.at, 0u);
  EXPECT_EQ(v.want, 3u);
}

TEST(FwWindowRule, AConvolutionsGroupsWeightsAndOutput) {
  Window w;
  w.groups = 2;
  WindowVerdict v = conv_shape(w, {1, 4, 6, 6}, {6, 2, 3, 3});
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v.out[0], 1);
  EXPECT_EQ(v.out[1], 6);
  EXPECT_EQ(v.out[2], 4);
  EXPECT_EQ(v.out[3], 4);
  EXPECT_TRUE(check_window_output(v, {1, 6, 4, 4}).ok());
  v = check_window_output(v, {1, 6, 4, 5});
  EXPECT_EQ(v.fault, F::kOutput);
  EXPECT_EQ(v.at, 3u);
  EXPECT_EQ(v.got, 5u);
  EXPECT_EQ(v.want, 4u);

  EXPECT_EQ(conv_shape(w, {1, 4, 6, 6}, {5, 2, 3, 3}).fault, F::kGroups);  // 5 output channels
  v = conv_shape(w, {1, 4, 6, 6}, {6, 4, 3, 3});
  EXPECT_EQ(v.fault, F::kWeight);
  EXPECT_EQ(v.at, 1u);
  EXPECT_EQ(v.got, 4u);
  EXPECT_EQ(v.want, 2u);

  // A kernel that never fits gives an empty output, which the board runs.
  v = conv_shape(Window{}, {1, 1, 2, 2}, {1, 1, 3, 3});
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v.out[2], 0);
  EXPECT_TRUE(check_window_output(v, {1, 1, 0, 0}).ok());
}

TEST(FwWindowRule, ATransposedConvolutionTakesAnOutputPaddingBelowItsStride) {
  Window w;
  w.stride[0] = w.stride[1] = 2;
  const WindowVerdict v = conv_transpose_shape(w, {1, 2, 3, 3}, {2, 4, 3, 3});
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v.out[1], 4);
  EXPECT_EQ(v.out[2], 7);
  EXPECT_EQ(v.slack[0], 1);
  EXPECT_TRUE(check_window_output(v, {1, 4, 7, 7}).ok());
  EXPECT_TRUE(check_window_output(v, {1, 4, 8, 8}).ok());
  const WindowVerdict past = check_window_output(v, {1, 4, 9, 7});
  EXPECT_EQ(past.fault, F::kOutput);
  EXPECT_EQ(past.at, 2u);
  EXPECT_EQ(past.want, 7u);

  // Pads larger than the output: no extent fits, and the least is 0 in a fault.
  w = Window{};
  w.pad[0] = w.pad[2] = 2;
  const WindowVerdict cropped = conv_transpose_shape(w, {1, 2, 1, 1}, {2, 4, 3, 3});
  EXPECT_EQ(cropped.out[2], -1);
  EXPECT_EQ(check_window_output(cropped, {1, 4, 1, 3}).want, 0u);
  EXPECT_EQ(check_window_output(cropped, {1, 4, 0, 3}).fault, F::kOutput);

  // Empty X or W along an axis, found after the batch and channels.
  const WindowVerdict empty = conv_transpose_shape(Window{}, {1, 2, 3, 0}, {2, 4, 3, 3});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(check_window_output(empty, {2, 4, 5, 1}).fault, F::kOutput);
  const WindowVerdict e = check_window_output(empty, {1, 4, 5, 1});
  EXPECT_EQ(e.fault, F::kEmptyInput);
  EXPECT_EQ(e.at, 0u);
  EXPECT_EQ(e.axis, 1u);
  const WindowVerdict no_kernel =
      check_window_output(conv_transpose_shape(Window{}, {1, 2, 3, 3}, {2, 4, 0, 3}), {1, 4, 5, 5});
  EXPECT_EQ(no_kernel.fault, F::kEmptyInput);
  EXPECT_EQ(no_kernel.at, 1u);
  EXPECT_EQ(no_kernel.axis, 0u);

  EXPECT_EQ(conv_transpose_shape(Window{}, {1, 2, 3, 3}, {3, 4, 3, 3}).fault, F::kWeight);
  w = Window{};
  w.groups = 3;
  EXPECT_EQ(conv_transpose_shape(w, {1, 2, 3, 3}, {2, 4, 3, 3}).fault, F::kGroups);
}

TEST(FwWindowRule, APoolingWindowNeedsATapInTheInput) {
  Window w{{2, 1}, {1, 1}, {3, 1}, {1, 0, 1, 0}};
  const WindowVerdict v = pool_shape(w, {1, 1, 2, 2});
  EXPECT_EQ(v.fault, F::kEmptyWindow);
  EXPECT_EQ(v.at, 0u);
  EXPECT_EQ(v.got, 0u);  // the first window

  const WindowVerdict ok = pool_shape(Window{{3, 3}, {2, 2}}, {2, 5, 7, 7});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok.out[0], 2);
  EXPECT_EQ(ok.out[1], 5);
  EXPECT_EQ(ok.out[2], 3);
}

TEST(FwPlanes, ColorPlanesAreHalfTheLumaAndYIsPlanarRgb) {
  EXPECT_TRUE(luma_even(4, 6));
  EXPECT_FALSE(luma_even(3, 6));
  EXPECT_FALSE(luma_even(4, 5));
  const ColorPlanes nv12 = color_planes(true, 4, 6);
  EXPECT_EQ(nv12.chroma_rank, 3u);
  EXPECT_EQ(nv12.chroma[0], 2u);
  EXPECT_EQ(nv12.chroma[1], 3u);
  EXPECT_EQ(nv12.chroma[2], 2u);  // U and V interleaved
  const ColorPlanes i420 = color_planes(false, 4, 6);
  EXPECT_EQ(i420.chroma_rank, 2u);
  EXPECT_EQ(i420.chroma[1], 3u);
  EXPECT_EQ(i420.y[0], 3u);
  EXPECT_EQ(i420.y[1], 4u);
  EXPECT_EQ(i420.y[2], 6u);
}

TEST(FwPlanes, AResizeScaleIsFiniteAbove0AndAtMost65536) {
  EXPECT_TRUE(resize_scale_ok(0.5f));
  EXPECT_TRUE(resize_scale_ok(kMaxResizeScale));
  EXPECT_FALSE(resize_scale_ok(65537.0f));
  EXPECT_FALSE(resize_scale_ok(0.0f));
  EXPECT_FALSE(resize_scale_ok(-1.0f));
  EXPECT_FALSE(resize_scale_ok(INFINITY));
  EXPECT_FALSE(resize_scale_ok(NAN));
}

}  // namespace
}  // namespace tpuhal::fw
