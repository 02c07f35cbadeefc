// The video-analytics pipeline (tpuhal/pipeline/pipeline.hpp): a network
// per channel (a compiled model's instance, or the built-in classifier
// recorded once), and the channels run from their own threads.
#include "tpuhal/pipeline/pipeline.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
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

// What a channel runs on each frame: the input tensor the frame is resized
// into, the network's ops, and its output read back into host memory.
class ChannelNetwork {
 public:
  // The built-in classifier.
  ChannelNetwork(Device& dev, Queue& q, bool letterbox)
      : letterbox_(letterbox),
        builtin_(std::make_unique<Classifier>(dev, q)),
        input_(builtin_->input, DType::F32, {1, 3, 64, 64}),
        output_(builtin_->probs, DType::F32, {1, 10}),
        kind_(NetworkKind::Classifier),
        result_(dev.allocate(output_bytes(), Memory::HostPinned)) {}
  // A compiled model, checked (check_model).
  ChannelNetwork(Device& dev, const rt::Model& model, NetworkKind kind, bool letterbox)
      : letterbox_(letterbox),
        instance_(model.instance()),
        input_(instance_.input_tensors()[0]),
        output_(instance_.output_tensors()[0]),
        kind_(kind),
        result_(dev.allocate(output_bytes(), Memory::HostPinned)) {}

  const Tensor& input() const { return input_; }

  // Where a frame of w x h goes in the input: the region (offset x, y and
  // size), and the frame's pixels per input pixel.
  struct Placement {
    std::int64_t x = 0, y = 0, w = 0, h = 0;
    float sx = 1, sy = 1;
  };
  Placement place(std::uint32_t w, std::uint32_t h) const {
    const std::int64_t iw = input_.shape()[3], ih = input_.shape()[2];
    Placement p{
        0, 0, iw, ih, static_cast<float>(w) / static_cast<float>(iw), static_cast<float>(h) / static_cast<float>(ih)};
    if (!letterbox_) return p;
    const double fit = std::min(static_cast<double>(iw) / w, static_cast<double>(ih) / h);
    p.w = std::clamp<std::int64_t>(std::llround(w * fit), 1, iw);
    p.h = std::clamp<std::int64_t>(std::llround(h * fit), 1, ih);
    p.x = (iw - p.w) / 2;
    p.y = (ih - p.h) / 2;
    p.sx = static_cast<float>(w) / static_cast<float>(p.w);
    p.sy = static_cast<float>(h) / static_cast<float>(p.h);
    return p;
  }

  // The frame (planar RGB f32 [1, 3, h, w] on the device) resized into the
  // input: stretched, or letterboxed over a fill of the pad value.
  Batch& resize_into(Batch& b, const Tensor& rgb, std::uint32_t w, std::uint32_t h, const PipelineOptions& o) const {
    ops::ResizeOptions rs;
    rs.mode = ResizeMode::Linear;
    if (!letterbox_) return b.run(ops::resize(rgb, input_, rs));
    const Placement p = place(w, h);
    const std::int64_t iw = input_.shape()[3], ih = input_.shape()[2];
    const std::uint64_t plane = static_cast<std::uint64_t>(iw * ih) * 4;
    for (std::uint64_t c = 0; c < 3; ++c) {
      const float v = (o.pad - o.mean[c]) * o.scale[c];
      std::uint32_t bits = 0;
      std::memcpy(&bits, &v, 4);
      b.fill(input_.buffer(), input_.offset() + c * plane, plane, bits, 4);
    }
    const Tensor region(input_.buffer(), DType::F32, {1, 3, p.h, p.w}, {3 * iw * ih, iw * ih, iw, 1},
                        input_.offset() + static_cast<std::uint64_t>(p.y * iw + p.x) * 4);
    return b.run(ops::resize(rgb, region, rs));
  }

  // The network's ops and the copy of its output back.
  Batch& record(Batch& b) {
    if (builtin_)
      b.run(builtin_->program);
    else
      instance_.record(b);
    return b.copy(output_.buffer(), output_.offset(), result_, 0, output_bytes());
  }

  // Reads the output of the last run into `r`, a frame of r.width x r.height.
  void read(FrameResult& r) const {
    const auto* out = reinterpret_cast<const float*>(result_.map().data());
    const auto& shape = output_.shape();
    if (kind_ == NetworkKind::Classifier) {
      const auto* best = std::max_element(out, out + shape[1]);
      r.cls = static_cast<int>(best - out);
      r.score = *best;
      return;
    }
    const Placement at = place(r.width, r.height);
    const auto clamp = [](float v, std::uint32_t hi) {  // NaN: 0
      return v > 0 ? std::min(v, static_cast<float>(hi)) : 0.0f;
    };
    const auto fx = [&](float v) { return (v - static_cast<float>(at.x)) * at.sx; };
    const auto fy = [&](float v) { return (v - static_cast<float>(at.y)) * at.sy; };
    for (std::int64_t i = 0; i < shape[1]; ++i) {
      const float* row = out + i * 6;
      if (!(row[5] >= 0)) break;  // the rows after the last box have class -1
      Detection d;
      d.x1 = clamp(fx(row[0]), r.width);
      d.y1 = clamp(fy(row[1]), r.height);
      d.x2 = std::max(d.x1, clamp(fx(row[2]), r.width));
      d.y2 = std::max(d.y1, clamp(fy(row[3]), r.height));
      d.score = row[4];
      d.cls = static_cast<int>(row[5]);
      r.detections.push_back(d);
    }
  }

 private:
  std::uint64_t output_bytes() const { return output_.elements() * 4; }

  bool letterbox_;
  std::unique_ptr<Classifier> builtin_;
  rt::Instance instance_;
  Tensor input_, output_;
  NetworkKind kind_;
  Buffer result_;
};

// PipelineOptions::board_clock: the channels' turns in the order their
// packets arrive. Each channel waits for every other to be ready; then
// the one whose next packet arrives first (the lower channel on a tie)
// sends it and runs the frames it gives, and so on. A channel that ends
// leaves the order.
class Turns {
 public:
  Turns(std::size_t n, const Device& dev) : dev_(dev), next_(n, 0), ready_(n, false) {
    for (std::size_t c = 0; c < n; ++c) next_[c] = static_cast<double>(c) / static_cast<double>(n);
  }

  // Channel c is ready to run; returns the board time the run starts at,
  // read once every channel is ready (or has left).
  std::uint64_t ready(std::size_t c) {
    std::unique_lock lock(mu_);
    ready_[c] = true;
    start_if_ready();
    cv_.wait(lock, [&] { return started_; });
    return start_;
  }
  // Waits until channel c's next packet is the first to arrive.
  void wait(std::size_t c) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return first() == c; });
  }
  // Channel c's next packet arrives at `at` (in periods).
  void next(std::size_t c, double at) {
    std::lock_guard lock(mu_);
    next_[c] = at;
    cv_.notify_all();
  }
  // Channel c ends (or failed before it was ready).
  void leave(std::size_t c) {
    std::lock_guard lock(mu_);
    next_[c] = std::numeric_limits<double>::infinity();
    ready_[c] = true;
    start_if_ready();
    cv_.notify_all();
  }

 private:
  void start_if_ready() {
    if (started_ || !std::all_of(ready_.begin(), ready_.end(), [](bool r) { return r; })) return;
    try {
      start_ = dev_.board_time_ns().value_or(0);
    } catch (const Error&) {
      start_ = 0;  // a board that went away: every channel's next call says so
    }
    started_ = true;
    cv_.notify_all();
  }
  std::size_t first() const {
    return static_cast<std::size_t>(std::min_element(next_.begin(), next_.end()) - next_.begin());
  }

  const Device& dev_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<double> next_;
  std::vector<bool> ready_;
  bool started_ = false;
  std::uint64_t start_ = 0;
};

}  // namespace

NetworkKind check_model(const Device& dev, const rt::Model& model) {
  const auto refuse = [](const std::string& why) { throw Error(Status::InvalidArgument, "pipeline: " + why); };
  if (!model) refuse("the model is empty (rt::Model::load gives one)");
  if (model.device().uri() != dev.uri())
    refuse("the model is loaded on " + model.device().uri() + "; the pipeline runs on " + dev.uri());
  if (model.inputs().size() != 1)
    refuse("a frame is a model's one input; the model has " + std::to_string(model.inputs().size()));
  const rt::TensorSpec& in = model.inputs().at(0);
  if (in.dtype != DType::F32 || in.shape.size() != 4 || in.shape[0] != 1 || in.shape[1] != 3)
    refuse("a frame goes into a first input of f32[1, 3, H, W] (planar RGB); the model's first input is " +
           in.describe());
  const rt::TensorSpec& out = model.outputs().at(0);
  if (out.dtype == DType::F32 && out.name == "detections" && out.shape.size() == 3 && out.shape[0] == 1 &&
      out.shape[2] == 6)
    return NetworkKind::Detector;
  if (out.dtype == DType::F32 && out.shape.size() == 2 && out.shape[0] == 1 && out.shape[1] > 0)
    return NetworkKind::Classifier;
  refuse(
      "a first output of a classifier's scores f32[1, K] or a detector's detections f32[1, M, 6] (tpuhal "
      "compile --detect) is read per frame; the model's first output is " +
      out.describe());
  return NetworkKind::Classifier;  // not reached
}

VideoDecoderOptions decoder_options(const Demuxer& source, VideoDecoderOptions base) {
  const std::uint32_t floor_w = source.live() ? 1920 : 16, floor_h = source.live() ? 1088 : 16;
  base.codec = source.codec();
  base.max_width = std::max(floor_w, source.width());
  base.max_height = std::max(floor_h, source.height());
  return base;
}

bool decoder_fits(const VideoDecoderOptions& options, const Demuxer& source) {
  return source.codec() == options.codec && source.width() <= options.max_width &&
         source.height() <= options.max_height;
}

std::string make_camera_clip(const std::string& dir, const std::string& codec, const std::string& size, double fps,
                             int gop, int frames) {
  const std::string path = dir + "/camera-" + codec + "-" + size + ".mkv";
  const std::string encoder = codec == "h265" ? "libx265 -x265-params log-level=error:bframes=0" : "libx264 -bf 0";
  const std::string cmd = "ffmpeg -nostdin -loglevel error -y -f lavfi -i testsrc2=size=" + size +
                          ":rate=" + std::to_string(fps) + " -frames:v " + std::to_string(frames) + " -c:v " + encoder +
                          " -preset veryfast -g " + std::to_string(gop) + " -keyint_min " + std::to_string(gop) +
                          " -sc_threshold 0 -pix_fmt yuv420p '" + path + "' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0 ? path : std::string();
}

std::string make_test_clip(const std::string& dir, const std::string& size, int frames) {
  const std::string path = dir + "/camera-" + size + ".mp4";
  const std::string cmd = "ffmpeg -nostdin -loglevel error -y -f lavfi -i testsrc2=size=" + size +
                          ":rate=30 -frames:v " + std::to_string(frames) +
                          " -c:v libx264 -preset veryfast -bf 2 -pix_fmt yuv420p " + path + " >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0 ? path : std::string();
}

PipelineResult run_pipeline(Device& dev, const std::vector<std::string>& sources, const PipelineOptions& options) {
  const std::size_t n = sources.size();
  const NetworkKind kind = options.model ? check_model(dev, options.model) : NetworkKind::Classifier;
  const bool timed = options.board_clock;
  if (timed) {
    if (!dev.properties().caps.wait_time)
      throw Error(Status::Unsupported,
                  "pipeline: board_clock: " + dev.uri() + " cannot time work on its clock (caps.wait_time)");
    if (!(options.arrival_fps > 0 && options.arrival_fps <= 1000))
      throw Error(Status::InvalidArgument, "pipeline: board_clock needs arrival_fps, 0 to 1000");
  }
  if (!(options.deadline_ms >= 0)) throw Error(Status::InvalidArgument, "pipeline: deadline_ms must be 0 or more");
  const double period_ns = timed ? 1e9 / options.arrival_fps : 0;
  const auto deadline_ns = static_cast<std::uint64_t>(options.deadline_ms * 1e6);
  Turns turns(n, dev);
  PipelineResult r;
  r.channels.resize(n);
  // Compute queues are shared by the channels (a queue takes batches from
  // any thread); each channel has its own classifier instance.
  // As many as are free, up to one per channel.
  std::vector<Queue> queues;
  try {
    while (queues.size() < n) queues.push_back(dev.queue(Engine::Compute));
  } catch (const Error& e) {
    if (e.status() != Status::ResourceExhausted || queues.empty()) throw;
  }
  // The demuxers, for the timer to interrupt when options.seconds pass.
  std::mutex mu;
  std::condition_variable done;
  bool finished = false;
  std::size_t ended = 0;
  std::vector<Demuxer*> open_sources(n, nullptr);
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t c = 0; c < n; ++c)
    threads.emplace_back([&, c] {
      ChannelStats st;
      st.source = sources[c];
      const auto t0 = std::chrono::steady_clock::now();
      double latency_sum_ms = 0;
      struct Leave {
        Turns* turns;  // null: the run is not timed
        std::size_t c;
        ~Leave() {
          if (turns) turns->leave(c);
        }
      } leave{timed ? &turns : nullptr, c};
      std::uint64_t start_ns = 0;  // board_clock: the board time packet 0 of channel 0 arrives
      // board_clock: when packet k arrives, in periods and in board ns.
      const auto period_at = [&](std::uint64_t k) {
        return static_cast<double>(k) + static_cast<double>(c) / static_cast<double>(n);
      };
      const auto arrives_ns = [&](std::uint64_t k) {
        return start_ns + static_cast<std::uint64_t>(std::llround(period_at(k) * period_ns));
      };
      try {
        Demuxer in(sources[c], options.demuxer);
        {
          std::lock_guard lock(mu);
          open_sources[c] = &in;
          if (finished) in.interrupt();
        }
        struct Unregister {
          std::mutex& m;
          Demuxer*& slot;
          ~Unregister() {
            std::lock_guard lock(m);
            slot = nullptr;
          }
        } unregister{mu, open_sources[c]};
        VideoDecoderOptions o = decoder_options(in);
        VideoDecoder dec = dev.open_decoder(o);
        Queue& q = queues[c % queues.size()];
        ChannelNetwork net = options.model ? ChannelNetwork(dev, options.model, kind, options.letterbox)
                                           : ChannelNetwork(dev, q, options.letterbox);
        Buffer rgb;
        std::uint32_t rgb_w = 0, rgb_h = 0;
        ops::ColorConvertOptions cc;
        cc.mean = options.mean;
        cc.scale = options.scale;
        // When each packet since the decoder's last reset was read (or, on
        // the board's clock, arrived), by its index there (Frame::packet());
        // frames come out a few packets late.
        std::array<std::uint64_t, 256> arrival{};
        auto latency = [&](std::uint64_t read, std::uint64_t now) {
          const double ms = read && now > read ? static_cast<double>(now - read) / 1e6 : 0.0;
          latency_sum_ms += ms;
          st.latency_max_ms = std::max(st.latency_max_ms, ms);
          if (timed && deadline_ns && now - std::min(now, read) > deadline_ns) ++st.late;
        };
        auto process = [&](const Frame& f) {
          const std::uint64_t read = arrival[f.packet() % arrival.size()];
          if (!timed)
            latency(read, static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                         std::chrono::steady_clock::now().time_since_epoch())
                                                         .count()));
          if (f.width() != rgb_w || f.height() != rgb_h) {
            rgb = dev.allocate(3ull * f.width() * f.height() * 4);
            rgb_w = f.width();
            rgb_h = f.height();
          }
          const Tensor rgb_t(rgb, DType::F32, {1, 3, f.height(), f.width()});
          Batch b = q.batch();
          if (timed && f.decoded_ns()) b.wait_until(*f.decoded_ns());
          b.run(ops::nv12_to_rgb(f.luma(), f.chroma(), rgb_t.reshape({3, f.height(), f.width()}), cc));
          net.resize_into(b, rgb_t, f.width(), f.height(), options);
          const Fence ran = net.record(b).submit();
          ran.wait();  // the frame's buffer goes back to the channel
          if (timed) latency(read, ran.timestamp_ns().value_or(read));
          FrameResult fr;
          fr.channel = c;
          fr.frame = st.frames;
          fr.pts = f.pts();
          fr.width = f.width();
          fr.height = f.height();
          net.read(fr);
          st.last_class = fr.cls;
          st.detections += fr.detections.size();
          ++st.frames;
          if (options.on_frame) options.on_frame(fr);
        };
        auto drain = [&] {
          for (;;) {
            std::optional<Frame> f;
            try {
              f = dec.receive();
            } catch (const Error& e) {
              // A packet that did not decode; the stream goes on.
              if (e.status() != Status::InvalidArgument && e.status() != Status::OutOfRange) throw;
              ++st.corrupt_frames;
              continue;
            }
            if (!f) return;
            process(*f);
          }
        };
        if (timed) start_ns = turns.ready(c);
        try {
          while (auto p = in.next()) {
            if (timed) turns.wait(c);
            if (p->new_stream) {
              // Reconnected: the old stream's frames leave first; then the
              // same channel starts over, or a new one takes another codec
              // or a larger size.
              dec.flush();
              drain();
              if (decoder_fits(o, in)) {
                dec.reset();
              } else {
                o = decoder_options(in, o);
                dec = dev.open_decoder(o);
              }
            }
            if (timed) {
              arrival[dec.packets_sent() % arrival.size()] = arrives_ns(st.packets);
              dec.send_at(arrives_ns(st.packets), p->data, p->pts);
            } else {
              arrival[dec.packets_sent() % arrival.size()] = p->arrival_ns;
              dec.send(p->data, p->pts);
            }
            ++st.packets;
            drain();
            if (timed) turns.next(c, period_at(st.packets));
          }
        } catch (const Error& e) {
          if (e.status() != Status::Unavailable) throw;
          st.error = e.what();  // the source gave up; its frames so far count
        }
        if (timed) turns.wait(c);  // the frames still inside, in turn
        dec.flush();
        drain();
        st.packets_lost = in.packets_lost();
        st.reconnects = in.reconnects();
      } catch (const std::exception& e) {
        st.error = e.what();
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      st.fps = s > 0 ? static_cast<double>(st.frames) / s : 0;
      st.latency_mean_ms = st.frames ? latency_sum_ms / static_cast<double>(st.frames) : 0;
      std::lock_guard lock(mu);
      r.channels[c] = std::move(st);
      ++ended;
      done.notify_all();
    });
  if (options.seconds > 0) {
    std::unique_lock lock(mu);
    done.wait_for(lock, std::chrono::duration<double>(options.seconds), [&] { return ended == n; });
    finished = true;
    for (Demuxer* d : open_sources)
      if (d) d->interrupt();
  }
  for (auto& t : threads) t.join();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::uint64_t total = 0;
  for (const auto& c : r.channels) total += c.frames;
  r.total_fps = r.seconds > 0 ? static_cast<double>(total) / r.seconds : 0;
  return r;
}

}  // namespace tpuhal::pipeline
