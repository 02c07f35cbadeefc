// The host's operand checks, and the devices the Ops suite runs on.
#include "ops_reference.hpp"

namespace tpuhal::ops_test {
namespace {

TEST_P(Ops, HostChecksNameTheOperandAndTheShape) {
  auto t = [&](DType d, Shape s) { return lab().output(d, s); };
  struct Case {
    std::function<void()> f;
    Status status;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases{
      {[&] {
         ops::matmul(t(DType::F32, {2, 3}), t(DType::F32, {4, 5}), t(DType::F32, {2, 5}));
       },
       Status::InvalidArgument,
       {"matmul: a [2, 3] and b [4, 5] disagree on the inner dimension (3 vs 4)"}},
      {[&] {
         ops::matmul(t(DType::F32, {2, 3}), t(DType::F32, {3, 5}), t(DType::F32, {2, 4}));
       },
       Status::InvalidArgument,
       {"matmul: y has shape [2, 4]; expected [2, 5] (from a and b)"}},
      {[&] {
         ops::matmul(t(DType::F32, {2, 2, 3}), t(DType::F32, {3, 3, 5}), t(DType::F32, {2, 2, 5}));
       },
       Status::InvalidArgument,
       {"matmul: a [2, 2, 3] and b [3, 3, 5] have batch dimensions that do not broadcast"}},
      {[&] {
         MatMulOptions o;
         o.c = t(DType::F32, {3});
         ops::matmul(t(DType::F32, {2, 3}), t(DType::F32, {3, 5}), t(DType::F32, {2, 5}), o);
       },
       Status::InvalidArgument,
       {"matmul: c has shape [3], which does not broadcast to [2, 5]"}},
      {[&] {
         ops::conv2d(t(DType::F32, {1, 2, 6, 6}), t(DType::F32, {4, 2, 3, 3}), t(DType::F32, {1, 4, 6, 6}));
       },
       Status::InvalidArgument,
       {"conv2d: y has shape [1, 4, 6, 6]; expected [1, 4, 4, 4] (from x [1, 2, 6, 6], w [4, 2, 3, 3]"}},
      {[&] {
         Conv2dOptions o;
         o.groups = 3;
         ops::conv2d(t(DType::F32, {1, 2, 6, 6}), t(DType::F32, {4, 2, 3, 3}), t(DType::F32, {1, 4, 4, 4}), o);
       },
       Status::InvalidArgument,
       {"conv2d: groups 3 must divide the input channels (2) and output channels (4)"}},
      {[&] {
         ops::conv2d(t(DType::F32, {1, 2, 2, 2}), t(DType::F32, {4, 2, 3, 3}), t(DType::F32, {1, 4, 1, 1}));
       },
       Status::InvalidArgument,
       {"conv2d: a 3x3 kernel does not fit the padded 2x2 input"}},
      {[&] {
         ops::add(t(DType::F32, {2, 3}), t(DType::F32, {4}), t(DType::F32, {2, 3}));
       },
       Status::InvalidArgument,
       {"add: b has shape [4], which does not broadcast to [2, 3]"}},
      {[&] {
         ops::softmax(t(DType::F32, {2, 3}), t(DType::F32, {2, 3}), 2);
       },
       Status::InvalidArgument,
       {"softmax: axis 2 is out of range for rank 2"}},
      {[&] {
         Pool2dOptions o;
         o.kernel = {3, 3};
         o.pads = {3, 0, 0, 0};
         ops::max_pool2d(t(DType::F32, {1, 1, 6, 6}), t(DType::F32, {1, 1, 7, 4}), o);
       },
       Status::InvalidArgument,
       {"max_pool2d: pads (3, 0) must be smaller than the window (3)"}},
      // Window values the board's decoder refuses (fw::kMaxWindowValue)
      // are refused here first, by name.
      {[&] {
         Conv2dOptions o;
         o.strides = {70000, 1};
         ops::conv2d(t(DType::F32, {1, 2, 6, 6}), t(DType::F32, {4, 2, 3, 3}), t(DType::F32, {1, 4, 1, 4}), o);
       },
       Status::InvalidArgument,
       {"conv2d: strides and dilations must be 1 to 65536"}},
      {[&] {
         Conv2dOptions o;
         o.pads = {0, 65537, 0, 0};
         ops::conv2d(t(DType::F32, {1, 2, 6, 6}), t(DType::F32, {4, 2, 3, 3}), t(DType::F32, {1, 4, 4, 4}), o);
       },
       Status::InvalidArgument,
       {"conv2d: pad 65537 is above 65536"}},
      {[&] {
         Pool2dOptions o;
         o.kernel = {70000, 1};
         ops::max_pool2d(t(DType::F32, {1, 1, 6, 6}), t(DType::F32, {1, 1, 1, 6}), o);
       },
       Status::InvalidArgument,
       {"max_pool2d: kernel 70000 must be 1 to 65536"}},
      {[&] {
         Pool2dOptions o;
         o.kernel = {2, 2};
         o.dilations = {1, 0};
         ops::avg_pool2d(t(DType::F32, {1, 1, 6, 6}), t(DType::F32, {1, 1, 5, 5}), o);
       },
       Status::InvalidArgument,
       {"avg_pool2d: strides and dilations must be 1 to 65536"}},
      {[&] {
         // Along H the one window's two taps, dilated by 3 from the top
         // pad, land above and below a 2-row x.
         Pool2dOptions o;
         o.kernel = {2, 1};
         o.dilations = {3, 1};
         o.pads = {1, 0, 1, 0};
         ops::max_pool2d(t(DType::F32, {1, 1, 2, 2}), t(DType::F32, {1, 1, 1, 2}), o);
       },
       Status::InvalidArgument,
       {"max_pool2d: window 0 down x has no tap inside x (kernel 2, dilation 3, pad 1, x extent 2)"}},
      // The rest of fw/window.h's rule, in the host's words.
      {[&] {
         Conv2dOptions o;
         o.groups = 2;
         ops::conv2d(t(DType::F32, {1, 4, 6, 6}), t(DType::F32, {4, 4, 3, 3}), t(DType::F32, {1, 4, 4, 4}), o);
       },
       Status::InvalidArgument,
       {"conv2d: w has shape [4, 4, 3, 3]; its dimension 1 must be input channels / groups = 2"}},
      {[&] {
         Pool2dOptions o;
         o.kernel = {3, 3};
         o.pads = {1, 1, 1, 1};
         ops::avg_pool2d(t(DType::F32, {1, 1, 0, 4}), t(DType::F32, {1, 1, 1, 4}), o);
       },
       Status::InvalidArgument,
       {"avg_pool2d: the window does not fit the padded input"}},
      // Only conv2d accumulates into y.
      {[&] {
         Conv2dOptions o;
         o.accumulate = true;
         ops::conv_transpose2d(t(DType::F32, {1, 2, 3, 3}), t(DType::F32, {2, 4, 3, 3}), t(DType::F32, {1, 4, 5, 5}),
                               o);
       },
       Status::InvalidArgument,
       {"conv_transpose2d: does not accumulate into y (conv2d does)"}},
      {[&] {
         Conv2dOptions o;
         o.accumulate = true;
         ops::conv_integer(t(DType::U8, {1, 1, 3, 3}), t(DType::I8, {1, 1, 1, 1}), t(DType::I32, {1, 1, 3, 3}),
                           std::nullopt, std::nullopt, o);
       },
       Status::InvalidArgument,
       {"conv_integer: does not accumulate into y (conv2d does)"}},
      {[&] {
         Conv2dOptions o;
         o.accumulate = true;
         const Tensor s = t(DType::F32, {}), z = t(DType::U8, {}), wz = t(DType::I8, {});
         ops::qlinear_conv(t(DType::U8, {1, 1, 3, 3}), s, z, t(DType::I8, {1, 1, 1, 1}), s, wz, s, z,
                           t(DType::U8, {1, 1, 3, 3}), o);
       },
       Status::InvalidArgument,
       {"qlinear_conv: does not accumulate into y (conv2d does)"}},
      {[&] {
         ops::conv_transpose2d(t(DType::F32, {1, 2, 0, 3}), t(DType::F32, {2, 4, 3, 3}), t(DType::F32, {1, 4, 2, 5}));
       },
       Status::InvalidArgument,
       {"conv_transpose2d: x [1, 2, 0, 3] and w [2, 4, 3, 3] must not be empty"}},
      {[&] {
         // The batch is wrong: the expected shape shows the least H.
         Conv2dOptions o;
         o.layout = Layout::NHWC;
         o.strides = {2, 2};
         ops::conv_transpose2d(t(DType::F32, {1, 3, 3, 2}), t(DType::F32, {2, 4, 3, 3}), t(DType::F32, {2, 8, 7, 4}),
                               o);
       },
       Status::InvalidArgument,
       {"conv_transpose2d: y has shape [2, 8, 7, 4]; expected [1, 7, 7, 4] (plus up to 1 output padding along H and "
        "W) from x [1, 3, 3, 2], w [2, 4, 3, 3], strides, pads and dilations"}},
      {[&] {
         Conv2dOptions o;
         o.pads = {2, 2, 2, 2};
         ops::conv_transpose2d(t(DType::F32, {1, 2, 1, 1}), t(DType::F32, {2, 4, 3, 3}), t(DType::F32, {1, 4, 1, 1}),
                               o);
       },
       Status::InvalidArgument,
       {"conv_transpose2d: y has shape [1, 4, 1, 1]; expected [1, 4, -1, 1] from x [1, 2, 1, 1], w [2, 4, 3, 3], "
        "strides, pads and dilations"}},
      {[&] {
         ops::matmul_integer(t(DType::U8, {2, 3}), t(DType::U8, {3, 4}), t(DType::I32, {2, 4}), t(DType::U8, {3}));
       },
       Status::InvalidArgument,
       {"matmul_integer: a_zero_point has shape [3]; expected a scalar or [2] (one per row)"}},
      {[&] {
         ops::qlinear_matmul(t(DType::U8, {2, 3}), t(DType::F32, {}), t(DType::U8, {}), t(DType::U8, {3, 4}),
                             t(DType::F32, {}), t(DType::U8, {}), t(DType::F32, {4}), t(DType::U8, {}),
                             t(DType::U8, {2, 4}));
       },
       Status::InvalidArgument,
       {"qlinear_matmul: y_scale must be one value, not [4]"}},
      {[&] {
         ops::qlinear_add(t(DType::U8, {2, 3}), t(DType::F32, {}), t(DType::U8, {}), t(DType::I8, {3}),
                          t(DType::F32, {}), t(DType::I8, {}), t(DType::F32, {2}), t(DType::U8, {}),
                          t(DType::U8, {2, 3}));
       },
       Status::InvalidArgument,
       {"qlinear_add: y_scale must be one value, not [2]"}},
      {[&] {
         ops::qlinear_add(t(DType::U8, {2, 3}), t(DType::F32, {}), t(DType::I8, {}), t(DType::U8, {2, 3}),
                          t(DType::F32, {}), t(DType::U8, {}), t(DType::F32, {}), t(DType::U8, {}),
                          t(DType::U8, {2, 3}));
       },
       Status::InvalidArgument,
       {"qlinear_add: a_zero_point", "i8", "u8"}},
      {[&] {
         ops::qlinear_add(t(DType::F32, {2, 3}), t(DType::F32, {}), t(DType::F32, {}), t(DType::U8, {2, 3}),
                          t(DType::F32, {}), t(DType::U8, {}), t(DType::F32, {}), t(DType::U8, {}),
                          t(DType::U8, {2, 3}));
       },
       Status::InvalidArgument,
       {"qlinear_add: a is f32"}},
      {[&] {
         ops::qlinear_add(t(DType::U8, {2, 3}), t(DType::F32, {}), t(DType::U8, {}), t(DType::U8, {4}),
                          t(DType::F32, {}), t(DType::U8, {}), t(DType::F32, {}), t(DType::U8, {}),
                          t(DType::U8, {2, 3}));
       },
       Status::InvalidArgument,
       {"qlinear_add: b"}},
      {[&] {
         ops::quantize(t(DType::F32, {2, 3}), t(DType::F32, {2}), std::nullopt, t(DType::U8, {2, 3}), 1);
       },
       Status::InvalidArgument,
       {"quantize: scale has 2 elements; expected 1, or one per index of axis 1 of [2, 3]"}},
      {[&] { ops::activation(t(DType::F32, {4}), t(DType::F32, {4}), ActivationParams::clip(2, 1)); },
       Status::InvalidArgument,
       {"activation: clip minimum 2", "is above its maximum 1"}},
      {[&] {
         ops::transpose(t(DType::F32, {2, 3}), t(DType::F32, {2, 3}), {1, 0});
       },
       Status::InvalidArgument,
       {"transpose: y has shape [2, 3]; expected [3, 2]"}},
      {[&] {
         ops::transpose(t(DType::F32, {2, 3}), t(DType::F32, {3, 2}), {1, 1});
       },
       Status::InvalidArgument,
       {"transpose: permute: axis 1 at position 1 is out of range or repeated"}},
      {[&] {
         ResizeOptions o;
         o.scales = std::array<float, 2>{std::numeric_limits<float>::infinity(), 1.0f};
         ops::resize(t(DType::F32, {1, 1, 2, 2}), t(DType::F32, {1, 1, 4, 2}), o);
       },
       Status::InvalidArgument,
       {"resize: scale inf must be positive and finite"}},
      {[&] {
         ops::nv12_to_rgb(t(DType::U8, {3, 4}), t(DType::U8, {1, 2, 2}), t(DType::F32, {3, 3, 4}));
       },
       Status::InvalidArgument,
       {"nv12_to_rgb: luma [3, 4] must have even height and width"}},
  };
  for (const Case& c : cases) {
    const Error e = error_of(c.f);
    EXPECT_EQ(e.status(), c.status) << e.what();
    for (const auto& s : c.says) EXPECT_THAT(e.what(), HasSubstr(s));
  }
}

TEST_P(Ops, HostChecksRefuseUnsupportedDtypes) {
  auto t = [&](DType d, Shape s) { return lab().output(d, s); };
  const std::vector<std::pair<std::function<void()>, std::string>> cases{
      {[&] {
         ops::matmul(t(DType::I8, {2, 3}), t(DType::I8, {3, 2}), t(DType::I32, {2, 2}));
       },
       "matmul: a is i8; supported: f32, f16, bf16"},
      {[&] {
         ops::matmul(t(DType::F16, {2, 3}), t(DType::F16, {3, 2}), t(DType::BF16, {2, 2}));
       },
       "matmul: y is bf16; it must be f16 like a, or f32"},
      {[&] {
         ops::matmul(t(DType::F32, {2, 3}), t(DType::F16, {3, 2}), t(DType::F32, {2, 2}));
       },
       "matmul: b is f16 but a is f32"},
      {[&] {
         ops::conv2d(t(DType::I32, {1, 1, 3, 3}), t(DType::I32, {1, 1, 1, 1}), t(DType::I32, {1, 1, 3, 3}));
       },
       "conv2d: x is i32; supported: f32, f16, bf16"},
      {[&] {
         Pool2dOptions o;
         ops::avg_pool2d(t(DType::U8, {1, 1, 3, 3}), t(DType::U8, {1, 1, 3, 3}), o);
       },
       "avg_pool2d: x is u8; supported: f32, f16, bf16"},
      {[&] {
         Pool2dOptions o;
         ops::max_pool2d(t(DType::I32, {1, 1, 3, 3}), t(DType::I32, {1, 1, 3, 3}), o);
       },
       "max_pool2d: x is i32; supported: f32, f16, bf16, i8, u8"},
      {[&] { ops::softmax(t(DType::U8, {4}), t(DType::U8, {4})); }, "softmax: x is u8; supported: f32, f16, bf16"},
      {[&] { ops::exp(t(DType::I32, {4}), t(DType::I32, {4})); }, "exp: x is i32; supported: f32, f16, bf16"},
      {[&] { ops::erf(t(DType::U8, {4}), t(DType::U8, {4})); }, "erf: x is u8; supported: f32, f16, bf16"},
      {[&] { ops::erf(t(DType::F32, {4}), t(DType::F16, {4})); }, "erf: y is f16 but x is f32"},
      {[&] { ops::ceil(t(DType::I32, {4}), t(DType::I32, {4})); }, "ceil: x is i32; supported: f32, f16, bf16"},
      {[&] { ops::round(t(DType::U8, {4}), t(DType::U8, {4})); }, "round: x is u8; supported: f32, f16, bf16"},
      {[&] { ops::floor(t(DType::F16, {4}), t(DType::F16, {5})); },
       "floor: x has shape [4], which does not broadcast to [5]"},
      {[&] { ops::less(t(DType::F32, {4}), t(DType::F32, {4}), t(DType::F32, {4})); }, "less: y is f32; supported: u8"},
      {[&] { ops::equal(t(DType::F32, {4}), t(DType::F16, {4}), t(DType::U8, {4})); }, "equal: b is f16 but a is f32"},
      {[&] { ops::logical_and(t(DType::F32, {4}), t(DType::F32, {4}), t(DType::U8, {4})); },
       "logical_and: a is f32; supported: u8"},
      {[&] { ops::logical_not(t(DType::U8, {4}), t(DType::I8, {4})); }, "logical_not: y is i8; supported: u8"},
      {[&] { ops::add(t(DType::F32, {4}), t(DType::F32, {4}), t(DType::F16, {4})); }, "add: y is f16 but a is f32"},
      {[&] {
         ops::matmul_integer(t(DType::F32, {2, 3}), t(DType::U8, {3, 2}), t(DType::I32, {2, 2}));
       },
       "matmul_integer: a is f32; supported: u8, i8"},
      {[&] {
         ops::matmul_integer(t(DType::U8, {2, 3}), t(DType::U8, {3, 2}), t(DType::F32, {2, 2}));
       },
       "matmul_integer: y is f32; supported: i32"},
      {[&] { ops::quantize(t(DType::F32, {4}), t(DType::F32, {}), t(DType::I8, {}), t(DType::U8, {4})); },
       "quantize: zero_point is i8 but y is u8"},
      {[&] { ops::quantize(t(DType::F32, {4}), t(DType::F16, {}), std::nullopt, t(DType::U8, {4})); },
       "quantize: scale is f16; supported: f32"},
      {[&] { ops::dequantize(t(DType::F32, {4}), t(DType::F32, {}), std::nullopt, t(DType::F32, {4})); },
       "dequantize: x is f32; supported: u8, i8, i32"},
      {[&] {
         ops::resize(t(DType::I32, {1, 1, 2, 2}), t(DType::I32, {1, 1, 4, 4}));
       },
       "resize: x is i32; supported: f32, f16, bf16, u8, i8"},
      {[&] {
         ops::i420_to_rgb(t(DType::U8, {2, 2}), t(DType::U8, {1, 1}), t(DType::U8, {1, 1}), t(DType::I32, {3, 2, 2}));
       },
       "i420_to_rgb: y is i32; supported: f32, f16, bf16, u8"},
      {[&] {
         ops::conv_integer(t(DType::U8, {1, 1, 3, 3}), t(DType::U8, {1, 1, 1, 1}), t(DType::I32, {1, 1, 3, 3}),
                           t(DType::I8, {}), std::nullopt);
       },
       "conv_integer: x_zero_point is i8 but x is u8"},
  };
  for (const auto& [f, says] : cases) {
    const Error e = error_of(f);
    EXPECT_EQ(e.status(), Status::InvalidArgument) << e.what();
    EXPECT_THAT(e.what(), HasSubstr(says));
  }
}

TEST_P(Ops, HostChecksRefuseBadViewsOverlapsAndStrideZeroOutputs) {
  Buffer buf = dev().allocate(4096);
  // Views that do not fit their buffer.
  Error e = error_of([&] { Tensor(buf, DType::F32, {32, 33}); });
  EXPECT_EQ(e.status(), Status::OutOfRange);
  EXPECT_THAT(e.what(), HasSubstr("Tensor: f32[32, 33] at offset 0 needs 4224 bytes but the buffer has 4096"));
  e = error_of([&] { Tensor(buf, DType::F32, {1024}, 4); });
  EXPECT_EQ(e.status(), Status::OutOfRange);
  EXPECT_THAT(e.what(), HasSubstr("at offset 4 needs 4096 bytes but the buffer has 4096"));
  e = error_of([&] { Tensor(buf, DType::F32, {2, 3}, {1024, 1}, 0); });
  EXPECT_EQ(e.status(), Status::OutOfRange);
  EXPECT_THAT(e.what(), HasSubstr("needs 4108 bytes"));
  e = error_of([&] { Tensor(buf, DType::F32, {2, -3}); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("shape[1] = -3"));
  e = error_of([&] { Tensor(buf, DType::F32, {1, 1, 1, 1, 1, 1, 1}); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("rank 7 is above the limit of 6"));
  e = error_of([&] { Tensor(buf, DType::F32, {4}, 2); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("offset 2 is not a multiple of the f32 element size 4"));

  // Outputs overlapping an input: in place, partly, and through a view.
  const Tensor a(buf, DType::F32, {2, 3}), b(buf, DType::F32, {2, 3}, 1024);
  e = error_of([&] { ops::relu(a, a); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(),
              HasSubstr("activation: the output y overlaps input x (bytes [0, 24) and [0, 24) of the same buffer)"));
  e = error_of([&] { ops::add(a, b, Tensor(buf, DType::F32, {2, 3}, 1032)); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("add: the output y overlaps input b (bytes [1032, 1056) and [1024, 1048)"));
  e = error_of([&] {
    ops::matmul(a, Tensor(buf, DType::F32, {3, 2}, 2048), Tensor(buf, DType::F32, {2, 2}, {1, 2}, 2060));
  });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("matmul: the output y overlaps input b"));
  // Disjoint views of one buffer are fine.
  EXPECT_NO_THROW(ops::add(a, a, Tensor(buf, DType::F32, {2, 3}, 24)));

  // An output with stride 0 would write an element twice.
  e = error_of([&] { ops::add(a, a, Tensor(buf, DType::F32, {2, 3}, {0, 1}, 2048)); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("add: the output y has stride 0 in dimension 0"));
  e = error_of([&] { ops::cast(a, Tensor(buf, DType::I8, {2, 3}, {1, 0}, 2048)); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("cast: the output y has stride 0 in dimension 1"));

  // Empty tensors and freed buffers.
  e = error_of([&] { ops::relu(Tensor(), a); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("empty Tensor"));
  Buffer gone = dev().allocate(64);
  const Tensor tg(gone, DType::F32, {4});
  gone.free();
  e = error_of([&] { ops::relu(tg, Tensor(buf, DType::F32, {4})); });
  EXPECT_EQ(e.status(), Status::FailedPrecondition);
  EXPECT_THAT(e.what(), HasSubstr("activation"));
}

TEST_P(Ops, HostChecksRefuseOperandsFromAnotherDevice) {
  const std::string other_uri = GetParam() == "sim:tiny" ? "sim:0" : "sim:tiny";
  Device other = open(other_uri);
  if (!other.properties().caps.tensor) GTEST_SKIP() << other_uri << " has no tensor engine";
  const Tensor a = lab().output(DType::F32, {2, 3});
  const Tensor b(other.allocate(64), DType::F32, {2, 3});
  const Tensor y = lab().output(DType::F32, {2, 3});
  Error e = error_of([&] { ops::add(a, b, y); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("add: b is on " + other_uri + ", the other operands on " + GetParam()));
  // An op of the other device on a queue of this one.
  const Tensor ob(other.allocate(64), DType::F32, {2, 3}), oy(other.allocate(64), DType::F32, {2, 3});
  const Op foreign = ops::relu(ob, oy);
  EXPECT_EQ(foreign.device().uri(), other_uri);
  e = error_of([&] { lab().q.batch().run(foreign); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(),
              HasSubstr("run: activation's operands are on " + other_uri + " but the batch is for " + GetParam()));
  // And a program recorded on the other device.
  const Program prog = other.record([&](Batch& bt) { bt.run(foreign); });
  e = error_of([&] { lab().q.run(prog); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("the program was recorded for " + other_uri));
}

INSTANTIATE_TEST_SUITE_P(Devices, Ops, ::testing::ValuesIn(testing::conformance_devices()), device_name);

}  // namespace
}  // namespace tpuhal::ops_test
