// The video-analytics pipeline (tpuhal/pipeline/pipeline.hpp): the classifier
// recorded once per channel, and the channels run from their own threads.
#include "tpuhal/pipeline/pipeline.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

namespace tpuhal::pipeline {
namespace {

// A small classifier: conv 3->16 3x3/2 + relu, conv 16->32 3x3/2 + relu,
// global average pool, fully connected 32->10, softmax. Input [1,3,64,64].
struct Classifier {
  Buffer input, w1, b1, a1, w2, b2, a2, pooled, fc, probs;
  Program program;

  // Weights go up through `q` (any queue copies).
  Classifier(Device& dev, Queue& q) {
    std::mt19937 rng(1234);
    std::normal_distribution<float> n(0.0f, 0.1f);
    auto weights = [&](std::uint64_t count) {
      Buffer host = dev.allocate(count * 4, Memory::HostPinned);
      auto* p = reinterpret_cast<float*>(host.map().data());
      for (std::uint64_t i = 0; i < count; ++i) p[i] = n(rng);
      Buffer d = dev.allocate(count * 4);
      q.copy(host, d).submit().wait();
      return d;
    };
    input = dev.allocate(3 * 64 * 64 * 4);
    w1 = weights(16 * 3 * 9);
    b1 = weights(16);
    a1 = dev.allocate(16 * 32 * 32 * 4);
    w2 = weights(32 * 16 * 9);
    b2 = weights(32);
    a2 = dev.allocate(32 * 16 * 16 * 4);
    pooled = dev.allocate(32 * 4);
    fc = weights(32 * 10);
    probs = dev.allocate(10 * 4);
    Tensor x(input, DType::F32, {1, 3, 64, 64});
    Tensor y1(a1, DType::F32, {1, 16, 32, 32}), y2(a2, DType::F32, {1, 32, 16, 16});
    Tensor p(pooled, DType::F32, {1, 32, 1, 1}), logits_in = p.reshape({1, 32});
    Tensor probs_t(probs, DType::F32, {1, 10});
    ops::Conv2dOptions c1;
    c1.strides = {2, 2};
    c1.pads = {1, 1, 1, 1};
    c1.bias = Tensor(b1, DType::F32, {16});
    c1.activation = ActivationParams::relu();
    ops::Conv2dOptions c2 = c1;
    c2.bias = Tensor(b2, DType::F32, {32});
    ops::Pool2dOptions gap;
    gap.kernel = {16, 16};
    Buffer logits = dev.allocate(10 * 4);
    Tensor logits_t(logits, DType::F32, {1, 10});
    program = dev.record([&](Batch& b) {
      b.run(ops::conv2d(x, Tensor(w1, DType::F32, {16, 3, 3, 3}), y1, c1))
          .run(ops::conv2d(y1, Tensor(w2, DType::F32, {32, 16, 3, 3}), y2, c2))
          .run(ops::avg_pool2d(y2, p, gap))
          .run(ops::matmul(logits_in, Tensor(fc, DType::F32, {32, 10}), logits_t))
          .run(ops::softmax(logits_t, probs_t));
    });
  }
};

}  // namespace

std::string make_test_clip(const std::string& dir, const std::string& size, int frames) {
  const std::string path = dir + "/camera-" + size + ".mp4";
  const std::string cmd = "ffmpeg -nostdin -loglevel error -y -f lavfi -i testsrc2=size=" + size +
                          ":rate=30 -frames:v " + std::to_string(frames) +
                          " -c:v libx264 -preset veryfast -bf 2 -pix_fmt yuv420p " + path + " >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0 ? path : std::string();
}

PipelineResult run_pipeline(Device& dev, const std::vector<std::string>& files) {
  const std::size_t n = files.size();
  PipelineResult r;
  r.frames.assign(n, 0);
  r.fps.assign(n, 0);
  r.last_class.assign(n, -1);
  // Compute queues are shared by the channels (a queue takes batches from
  // any thread); each channel has its own classifier instance.
  // As many as are free, up to one per channel.
  std::vector<Queue> queues;
  try {
    while (queues.size() < n) queues.push_back(dev.queue(Engine::Compute));
  } catch (const Error& e) {
    if (e.status() != Status::ResourceExhausted || queues.empty()) throw;
  }
  std::vector<std::thread> threads;
  std::mutex mu;
  std::exception_ptr failure;
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t c = 0; c < n; ++c)
    threads.emplace_back([&, c] {
      try {
        Demuxer in(files[c]);
        VideoDecoderOptions o;
        o.codec = in.codec();
        o.max_width = in.width();
        o.max_height = in.height();
        VideoDecoder dec = dev.open_decoder(o);
        Queue& q = queues[c % queues.size()];
        Classifier net(dev, q);
        Buffer rgb = dev.allocate(3ull * in.width() * in.height() * 4);
        Buffer result = dev.allocate(10 * 4, Memory::HostPinned);
        Tensor rgb_t(rgb, DType::F32, {1, 3, in.height(), in.width()});
        Tensor small(net.input, DType::F32, {1, 3, 64, 64});
        ops::ColorConvertOptions cc;  // ImageNet-style normalisation
        cc.mean = {123.7f, 116.3f, 103.5f};
        cc.scale = {1 / 58.4f, 1 / 57.1f, 1 / 57.4f};
        ops::ResizeOptions rs;
        rs.mode = ResizeMode::Linear;
        const auto t0 = std::chrono::steady_clock::now();
        std::uint64_t frames = 0;
        Fence last;
        auto process = [&](const Frame& f) {
          last = q.batch()
                     .run(ops::nv12_to_rgb(f.luma(), f.chroma(), rgb_t.reshape({3, in.height(), in.width()}), cc))
                     .run(ops::resize(rgb_t, small, rs))
                     .run(net.program)
                     .copy(net.probs, result)
                     .submit();
          last.wait();  // the frame's buffer goes back to the channel
          ++frames;
        };
        while (auto p = in.next()) {
          dec.send(p->data, p->pts);
          while (auto f = dec.receive()) process(*f);
        }
        dec.flush();
        while (auto f = dec.receive()) process(*f);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const auto* probs = reinterpret_cast<const float*>(result.map().data());
        int best = 0;
        for (int k = 1; k < 10; ++k)
          if (probs[k] > probs[best]) best = k;
        std::lock_guard lock(mu);
        r.frames[c] = frames;
        r.fps[c] = s > 0 ? static_cast<double>(frames) / s : 0;
        r.last_class[c] = frames ? best : -1;
      } catch (...) {
        std::lock_guard lock(mu);
        if (!failure) failure = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::uint64_t total = 0;
  for (auto f : r.frames) total += f;
  r.total_fps = r.seconds > 0 ? static_cast<double>(total) / r.seconds : 0;
  return r;
}

}  // namespace tpuhal::pipeline
