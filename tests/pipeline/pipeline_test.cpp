// The video pipeline (tpuhal/pipeline/pipeline.hpp) with compiled models:
// each frame's classes or boxes against the same model run frame by frame
// through rt::Instance::run on the same preprocessed pixels, models the
// pipeline cannot feed refused, and a channel's failure kept to itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "support/error_of.hpp"
#include "support/onnx_builder.hpp"
#include "tpuhal/error.hpp"
#include "tpuhal/pipeline/pipeline.hpp"
#include "tpuhal/rt/compile.hpp"

namespace tpuhal::pipeline {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::OnnxBuilder;

constexpr std::int64_t kSize = 32;  // the models' input, kSize x kSize
constexpr int kFrames = 12;         // of the test clip

std::vector<float> random(std::size_t n, std::uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

rt::Model load(Device& dev, const OnnxBuilder& b, const rt::DetectOptions& detect = {}) {
  rt::CompileOptions o;
  o.detect = detect;
  return rt::Model::load(dev, rt::compile_onnx(b.bytes(), o).model);
}

// A YOLOv8-style detector of 3 classes over 16 anchors: one 8x8/8
// convolution, its outputs squashed into boxes (centres within the input,
// sides up to a third of it) and scores, then --detect's NMS.
rt::Model detector(Device& dev) {
  OnnxBuilder b;
  b.input("x", {1, 3, kSize, kSize});
  b.init("w", {7, 3, 8, 8}, random(7 * 3 * 64, 7, 0.1f));
  b.init("bias", {7}, random(7, 8, 0.5f));
  const float third = static_cast<float>(kSize) / 3;
  b.init("span", {1, 7, 1}, {kSize, kSize, third, third, 1, 1, 1});
  b.init_i64("flat", {1, 7, 16});
  auto* conv = b.node("Conv", {"x", "w", "bias"}, "c", "conv");
  OnnxBuilder::ints(conv, "strides", {8, 8});
  b.node("Reshape", {"c", "flat"}, "r", "flatten");
  b.node("Sigmoid", {"r"}, "s", "squash");
  b.node("Mul", {"s", "span"}, "head", "span");
  b.output("head");
  rt::DetectOptions d;
  d.head = "yolov8";
  d.score_threshold = 0.5f;
  d.max_boxes = 10;
  return load(dev, b, d);
}

// A classifier of 5 classes: global average pool, then a matrix product.
rt::Model classifier(Device& dev) {
  OnnxBuilder b;
  b.input("x", {1, 3, kSize, kSize});
  b.init("w", {3, 5}, random(15, 9, 1.0f));
  b.node("GlobalAveragePool", {"x"}, "p", "pool");
  b.node("Flatten", {"p"}, "f", "flatten");
  b.node("MatMul", {"f", "w"}, "scores", "fc");
  b.output("scores");
  return load(dev, b);
}

// What the network sees: a YOLO's normalisation.
PipelineOptions yolo_style(const rt::Model& model) {
  PipelineOptions o;
  o.model = model;
  o.mean = {0, 0, 0};
  o.scale = {1 / 255.f, 1 / 255.f, 1 / 255.f};
  return o;
}

class Pipeline : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tpuhal_pipeline_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    clip_ = make_test_clip(dir_.string(), "96x64", kFrames);
    if (clip_.empty()) GTEST_SKIP() << "making the test clip needs ffmpeg (scripts/setup.sh --test installs it)";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Each frame of the clip decoded, converted and resized as the pipeline
  // does, then run through `model` from host memory, frame by frame; the
  // rows of its first output per frame, with the frame's size.
  struct Reference {
    std::vector<float> out;
    std::uint32_t width, height;
  };
  std::vector<Reference> reference(Device& dev, const rt::Model& model, const PipelineOptions& o) {
    Demuxer in(clip_);
    VideoDecoder dec = dev.open_decoder(decoder_options(in));
    Queue q = dev.queue(Engine::Compute);
    rt::Instance inst = model.instance();
    const auto& spec = model.inputs()[0];
    Buffer x = dev.allocate(spec.bytes()), host = dev.allocate(spec.bytes(), Memory::HostPinned);
    Tensor xt(x, DType::F32, spec.shape);
    std::vector<float> padded;  // letterboxed: the input filled with the pad value, normalised
    if (o.letterbox) {
      const auto plane = static_cast<std::size_t>(kSize * kSize);
      for (std::size_t c = 0; c < 3; ++c) padded.insert(padded.end(), plane, (o.pad - o.mean[c]) * o.scale[c]);
    }
    ops::ColorConvertOptions cc;
    cc.mean = o.mean;
    cc.scale = o.scale;
    ops::ResizeOptions rs;
    rs.mode = ResizeMode::Linear;
    std::vector<Reference> frames;
    auto drain = [&] {
      while (auto f = dec.receive()) {
        Buffer rgb = dev.allocate(3ull * f->width() * f->height() * 4);
        const Tensor rgb_t(rgb, DType::F32, {1, 3, f->height(), f->width()});
        if (o.letterbox) {  // the frame's 96 x 64 scaled by 1/3 to 32 x 21, 5 rows down
          ASSERT_EQ(std::make_pair(f->width(), f->height()), std::make_pair(96u, 64u));
          std::memcpy(host.map().data(), padded.data(), spec.bytes());
          q.copy(host, x).submit().wait();
          xt = Tensor(x, DType::F32, {1, 3, 21, kSize}, {3 * kSize * kSize, kSize * kSize, kSize, 1}, 5 * kSize * 4);
        }
        q.batch()
            .run(ops::nv12_to_rgb(f->luma(), f->chroma(), rgb_t.reshape({3, f->height(), f->width()}), cc))
            .run(ops::resize(rgb_t, xt, rs))
            .copy(x, host)
            .submit()
            .wait();
        Reference r{std::vector<float>(model.outputs()[0].elements()), f->width(), f->height()};
        std::vector<rt::HostArray> ins{{host.map().data(), spec.bytes()}};
        std::vector<rt::HostArray> outs{rt::host(r.out)};
        inst.run(ins, outs);
        frames.push_back(std::move(r));
      }
    };
    while (auto p = in.next()) {
      dec.send(p->data, p->pts);
      drain();
    }
    dec.flush();
    drain();
    return frames;
  }

  // Runs the pipeline on `channels` copies of the clip; each channel's
  // frames, in order, as on_frame gave them.
  std::vector<std::vector<FrameResult>> run(Device& dev, PipelineOptions o, std::size_t channels,
                                            PipelineResult* result = nullptr) {
    std::mutex mu;
    std::vector<std::vector<FrameResult>> got(channels);
    auto user = o.on_frame;
    o.on_frame = [&](const FrameResult& f) {
      {
        std::lock_guard lock(mu);
        got.at(f.channel).push_back(f);
      }
      if (user) user(f);
    };
    PipelineResult r = run_pipeline(dev, std::vector<std::string>(channels, clip_), o);
    if (result) *result = std::move(r);
    return got;
  }

  void expect_detections_as_the_model_gives(bool letterbox);

  fs::path dir_;
  std::string clip_;
};

// The detector's boxes, the frames stretched to its input or letterboxed
// into it (as YOLO's training does).
void Pipeline::expect_detections_as_the_model_gives(bool letterbox) {
  Device dev = open("sim:0");
  const rt::Model model = detector(dev);
  ASSERT_EQ(check_model(dev, model), NetworkKind::Detector);
  PipelineOptions o = yolo_style(model);
  o.letterbox = letterbox;
  const auto want = reference(dev, model, o);
  ASSERT_EQ(want.size(), static_cast<std::size_t>(kFrames));
  PipelineResult r;
  const auto got = run(dev, o, 2, &r);
  std::uint64_t boxes = 0;
  for (std::size_t c = 0; c < 2; ++c) {
    SCOPED_TRACE("channel " + std::to_string(c));
    ASSERT_EQ(got[c].size(), want.size());
    std::uint64_t channel_boxes = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const FrameResult& f = got[c][i];
      EXPECT_EQ(f.frame, i);
      EXPECT_EQ(f.cls, -1);
      ASSERT_EQ(f.width, want[i].width);
      ASSERT_EQ(f.height, want[i].height);
      // The model's rows in its input's pixels, mapped to the frame's:
      // stretched, or letterboxed (32 x 21 at 0, 5).
      const float sx = static_cast<float>(f.width) / kSize;
      const float sy = static_cast<float>(f.height) / (letterbox ? 21 : kSize), top = letterbox ? 5 : 0;
      std::vector<Detection> expect;
      for (std::size_t row = 0; row < want[i].out.size() / 6; ++row) {
        const float* d = &want[i].out[row * 6];
        if (d[5] < 0) break;
        const auto in = [](float v, std::uint32_t hi) { return std::clamp(v, 0.0f, static_cast<float>(hi)); };
        expect.push_back({in(d[0] * sx, f.width), in((d[1] - top) * sy, f.height), in(d[2] * sx, f.width),
                          in((d[3] - top) * sy, f.height), d[4], static_cast<int>(d[5])});
      }
      ASSERT_EQ(f.detections.size(), expect.size()) << "frame " << i;
      for (std::size_t k = 0; k < expect.size(); ++k) {
        const Detection &a = f.detections[k], &e = expect[k];
        EXPECT_EQ(std::make_tuple(a.cls, a.score, a.x1, a.y1, a.x2, a.y2),
                  std::make_tuple(e.cls, e.score, e.x1, e.y1, e.x2, e.y2))
            << "frame " << i << " box " << k;
      }
      channel_boxes += expect.size();
    }
    EXPECT_EQ(r.channels[c].detections, channel_boxes);
    EXPECT_EQ(r.channels[c].frames, want.size());
    EXPECT_EQ(r.channels[c].last_class, -1);
    EXPECT_EQ(r.channels[c].error, "");
    boxes += channel_boxes;
  }
  EXPECT_GT(boxes, 2u * kFrames) << "the test's frames have boxes";
}

TEST_F(Pipeline, ADetectorGivesEachFramesBoxesAsTheModelDoes) { expect_detections_as_the_model_gives(false); }

TEST_F(Pipeline, ALetterboxedDetectorGivesEachFramesBoxesAsTheModelDoes) { expect_detections_as_the_model_gives(true); }

TEST_F(Pipeline, AClassifierModelGivesEachFramesClassAsTheModelDoes) {
  Device dev = open("sim:0");
  const rt::Model model = classifier(dev);
  ASSERT_EQ(check_model(dev, model), NetworkKind::Classifier);
  const PipelineOptions o = yolo_style(model);
  const auto want = reference(dev, model, o);
  PipelineResult r;
  const auto got = run(dev, o, 1, &r);
  ASSERT_EQ(got[0].size(), want.size());
  ASSERT_FALSE(want.empty());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const auto& scores = want[i].out;
    const auto best = std::max_element(scores.begin(), scores.end());
    EXPECT_EQ(got[0][i].cls, best - scores.begin()) << "frame " << i;
    EXPECT_EQ(got[0][i].score, *best) << "frame " << i;
    EXPECT_TRUE(got[0][i].detections.empty());
  }
  EXPECT_EQ(r.channels[0].last_class, got[0].back().cls);
  EXPECT_EQ(r.channels[0].detections, 0u);
}

TEST_F(Pipeline, TheBuiltInClassifierRunsEveryFrame) {
  Device dev = open("sim:0");
  PipelineResult r;
  const auto got = run(dev, PipelineOptions{}, 1, &r);
  ASSERT_EQ(got[0].size(), static_cast<std::size_t>(kFrames));
  for (const auto& f : got[0]) {
    EXPECT_GE(f.cls, 0);
    EXPECT_LT(f.cls, 10);
    EXPECT_GT(f.score, 0.0f);  // a softmax's probability
    EXPECT_LE(f.score, 1.0f);
  }
  EXPECT_EQ(r.channels[0].last_class, got[0].back().cls);
}

TEST_F(Pipeline, OnTheBoardsVirtualClockEveryFrameRunsAsBeforeAndItsLatencyIsTheBoards) {
  // Cameras' streams: no B frames (with them a frame waits for the packets
  // that let it out, periods later).
  clip_ = make_camera_clip(dir_.string(), "h264", "96x64", 25, 6, kFrames);
  ASSERT_FALSE(clip_.empty());
  ::setenv("TPUHAL_SIM_CLOCK", "virtual", 1);
  Device dev = open("sim:bm1684x");
  ::unsetenv("TPUHAL_SIM_CLOCK");
  const auto plain = run(dev, PipelineOptions{}, 3);
  PipelineOptions o;
  o.board_clock = true;
  o.arrival_fps = 25;
  o.deadline_ms = 40;
  PipelineResult r;
  const auto timed = run(dev, o, 3, &r);
  for (std::size_t c = 0; c < 3; ++c) {
    SCOPED_TRACE(c);
    ASSERT_EQ(timed[c].size(), static_cast<std::size_t>(kFrames));
    for (std::size_t i = 0; i < timed[c].size(); ++i) EXPECT_EQ(timed[c][i].cls, plain[c][i].cls) << "frame " << i;
    const ChannelStats& st = r.channels[c];
    EXPECT_TRUE(st.error.empty()) << st.error;
    // Three 96x64 cameras at 25 fps keep a BM1684X idle most of the time: a
    // frame is out within a millisecond of the board's time after its
    // packet arrives, whatever the host took.
    EXPECT_EQ(st.late, 0u);
    EXPECT_GT(st.latency_max_ms, 0.0);
    EXPECT_LT(st.latency_max_ms, 1.0);
  }
  // Bad input, before any channel starts.
  o.arrival_fps = 0;
  EXPECT_EQ(error_of([&] { run_pipeline(dev, {clip_}, o); }).status(), Status::InvalidArgument);
  o.arrival_fps = 25;
  o.deadline_ms = -1;
  EXPECT_EQ(error_of([&] { run_pipeline(dev, {clip_}, o); }).status(), Status::InvalidArgument);
}

TEST_F(Pipeline, AModelItCannotFeedOrReadIsRefusedBeforeAnyChannelStarts) {
  Device dev = open("sim:0");
  struct Case {
    std::vector<std::int64_t> in;
    bool reshape_out;  // the output [1, 3, 4] instead of [1, 12]
    std::string says;
  };
  for (const Case& c :
       {Case{{1, 1, 8, 8},
             false,
             "a frame goes into a first input of f32[1, 3, H, W] (planar RGB); the model's first input "
             "is x f32[1, 1, 8, 8]"},
        Case{{2, 3, 8, 8}, false, "the model's first input is x f32[2, 3, 8, 8]"},
        Case{{1, 3, 2, 2},
             true,
             "a first output of a classifier's scores f32[1, K] or a detector's detections f32[1, M, 6] (tpuhal "
             "compile --detect) is read per frame; the model's first output is y f32[1, 3, 4]"}}) {
    OnnxBuilder b;
    b.input("x", c.in);
    b.init_i64("shape", c.reshape_out ? std::vector<std::int64_t>{1, 3, 4} : std::vector<std::int64_t>{c.in[0], -1});
    b.node("Reshape", {"x", "shape"}, "y", "reshape");
    b.output("y");
    const rt::Model model = load(dev, b);
    PipelineOptions o;
    o.model = model;
    bool ran = false;
    o.on_frame = [&](const FrameResult&) { ran = true; };
    try {
      run_pipeline(dev, {clip_}, o);
      ADD_FAILURE() << "not refused: " << c.says;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << e.what();
    }
    EXPECT_FALSE(ran);
  }
  {  // two inputs: the pipeline would leave the second unfilled
    OnnxBuilder b;
    b.input("x", {1, 3, 4, 4});
    b.input("z", {1, 3, 4, 4});
    b.node("Add", {"x", "z"}, "s", "add");
    b.init_i64("flat", {1, -1});
    b.node("Reshape", {"s", "flat"}, "y", "flatten");
    b.output("y");
    PipelineOptions o;
    o.model = load(dev, b);
    try {
      run_pipeline(dev, {clip_}, o);
      ADD_FAILURE() << "a model of two inputs was not refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("pipeline: a frame is a model's one input; the model has 2"),
                std::string::npos)
          << e.what();
    }
  }
  // The same model then runs.
  const auto got = run(dev, yolo_style(classifier(dev)), 1);
  EXPECT_EQ(got[0].size(), static_cast<std::size_t>(kFrames));
}

TEST_F(Pipeline, AnOnFrameThatThrowsStopsOnlyItsChannel) {
  Device dev = open("sim:0");
  PipelineOptions o = yolo_style(detector(dev));
  o.on_frame = [](const FrameResult& f) {
    if (f.channel == 0 && f.frame == 3) throw std::runtime_error("the application's frame 3 handler failed");
  };
  PipelineResult r;
  const auto got = run(dev, o, 2, &r);
  EXPECT_EQ(r.channels[0].frames, 4u);
  EXPECT_NE(r.channels[0].error.find("the application's frame 3 handler failed"), std::string::npos)
      << r.channels[0].error;
  EXPECT_EQ(r.channels[1].frames, static_cast<std::uint64_t>(kFrames));
  EXPECT_EQ(r.channels[1].error, "");
  EXPECT_EQ(got[1].size(), static_cast<std::size_t>(kFrames));
}

}  // namespace
}  // namespace tpuhal::pipeline
