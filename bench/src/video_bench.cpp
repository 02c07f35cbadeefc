// Video decode throughput: N channels of the board's codec unit beside
// libavcodec decoding the same clips directly, with as many threads as the
// unit has, in the same run.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

extern "C" {}

#include "tpuhal/base/ffmpeg.h"
#include "tpuhal/bench/bench.h"

namespace tpuhal::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Packets a host thread keeps in flight per channel on the device, and
// feeds each libavcodec decoder per turn.
constexpr std::uint64_t kDepth = 6;

struct Clip {
  std::string label;  // "1080p h264"
  Codec codec;
  std::uint32_t width, height;
  std::vector<Demuxer::Packet> packets;
};

// Encodes a testsrc2 clip with Debian's ffmpeg and reads its packets.
Clip make_clip(const fs::path& dir, const std::string& label, Codec codec, const std::string& size, int frames) {
  std::string file = label + (codec == Codec::H264 ? ".h264" : ".h265");
  std::replace(file.begin(), file.end(), ' ', '_');
  const fs::path path = dir / file;
  const std::string enc = codec == Codec::H264 ? "-c:v libx264 -preset veryfast"
                                               : "-c:v libx265 -preset veryfast -x265-params log-level=none";
  const std::string cmd = "ffmpeg -nostdin -loglevel error -y -f lavfi -i testsrc2=size=" + size +
                          ":rate=30 -frames:v " + std::to_string(frames) + " " + enc +
                          " -g 30 -bf 2 -pix_fmt yuv420p " + path.string() + " 2>&1";
  if (std::system(cmd.c_str()) != 0)
    throw Error(Status::Unavailable,
                "tpuhal bench video: could not make a clip with ffmpeg (is it installed?): " + cmd);
  Demuxer in(path.string());
  Clip c{label, codec, in.width(), in.height(), {}};
  while (auto p = in.next()) c.packets.push_back(std::move(*p));
  return c;
}

// Frames per second of `channels` decoders on the device, each fed the clip
// `loops` times back to back (one stream whose key frames restart it). A few host threads drive the channels as a
// pipelining application would: each keeps up to kDepth packets in flight per channel, collects what is ready with
// try_receive(), and blocks only when a channel is that far ahead or at the end of the stream.
double device_fps(Device& dev, const Clip& clip, std::uint32_t channels, std::uint32_t loops) {
  VideoDecoderOptions o;
  o.codec = clip.codec;
  o.format = PixelFormat::NV12;
  o.max_width = clip.width;
  o.max_height = clip.height;
  o.frame_buffers = 4;
  std::vector<VideoDecoder> dec;
  for (std::uint32_t i = 0; i < channels; ++i) dec.push_back(dev.open_decoder(o));
  const std::uint32_t threads = std::min<std::uint32_t>(channels, 4);
  std::atomic<std::uint64_t> frames{0};
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (std::uint32_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      std::uint64_t n = 0;
      for (std::uint32_t loop = 0; loop < loops; ++loop)
        for (const auto& pkt : clip.packets)
          for (std::uint32_t c = t; c < channels; c += threads) {
            VideoDecoder& d = dec[c];
            while (d.packets_sent() - d.frames_received() >= kDepth && d.receive(std::chrono::seconds(60))) ++n;
            d.send(pkt.data, pkt.pts);
            while (d.try_receive()) ++n;
          }
      for (std::uint32_t c = t; c < channels; c += threads) dec[c].flush();
      for (std::uint32_t c = t; c < channels; c += threads)
        while (dec[c].receive(std::chrono::seconds(60))) ++n;
      frames += n;
    });
  for (auto& th : pool) th.join();
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  const std::uint64_t expected = std::uint64_t{channels} * loops * clip.packets.size();
  if (frames.load() != expected)
    throw Error(Status::Internal, "tpuhal bench video: " + std::to_string(frames.load()) + " frames decoded of " +
                                      std::to_string(expected));
  return static_cast<double>(frames.load()) / s;
}

// The same with libavcodec directly: `channels` decoders (one thread each
// inside) shared out over `threads` threads. Each thread feeds its channels
// in turn, kDepth packets each, as the device's host threads keep kDepth in
// flight per channel: both sides decode the same interleaved schedule of
// concurrent streams (and so keep as many decoders' reference frames hot).
double libavcodec_fps(const base::ffmpeg::Api& av, const Clip& clip, std::uint32_t channels, std::uint32_t loops,
                      std::uint32_t threads) {
  const AVCodec* codec = av.avcodec_find_decoder(clip.codec == Codec::H264 ? AV_CODEC_ID_H264 : AV_CODEC_ID_HEVC);
  std::atomic<std::uint64_t> frames{0};
  threads = std::min(threads, channels);
  // Decoders made before the clock starts, as the device's are.
  std::vector<AVCodecContext*> contexts(channels);
  for (auto& ctx : contexts) {
    ctx = av.avcodec_alloc_context3(codec);
    ctx->thread_count = 1;
    av.avcodec_open2(ctx, codec, nullptr);
  }
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (std::uint32_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      AVPacket* pkt = av.av_packet_alloc();
      AVFrame* frame = av.av_frame_alloc();
      std::uint64_t n = 0;
      auto drain = [&](AVCodecContext* ctx) {
        while (av.avcodec_receive_frame(ctx, frame) == 0) {
          ++n;
          av.av_frame_unref(frame);
        }
      };
      const std::uint64_t total = std::uint64_t{loops} * clip.packets.size();
      for (std::uint64_t first = 0; first < total; first += kDepth)
        for (std::uint32_t c = t; c < channels; c += threads)
          for (std::uint64_t i = first; i < std::min(first + kDepth, total); ++i) {
            const auto& p = clip.packets[i % clip.packets.size()];
            pkt->data = reinterpret_cast<std::uint8_t*>(const_cast<std::byte*>(p.data.data()));
            pkt->size = static_cast<int>(p.data.size());
            pkt->pts = p.pts;
            av.avcodec_send_packet(contexts[c], pkt);
            drain(contexts[c]);
          }
      for (std::uint32_t c = t; c < channels; c += threads) {
        av.avcodec_send_packet(contexts[c], nullptr);
        drain(contexts[c]);
      }
      av.av_frame_free(&frame);
      av.av_packet_free(&pkt);
      frames += n;
    });
  for (auto& th : pool) th.join();
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  for (auto& ctx : contexts) av.avcodec_free_context(&ctx);
  const std::uint64_t expected = std::uint64_t{channels} * loops * clip.packets.size();
  if (frames.load() != expected)
    throw Error(Status::Internal, "tpuhal bench video: libavcodec decoded " + std::to_string(frames.load()) +
                                      " frames of " + std::to_string(expected));
  return static_cast<double>(frames.load()) / s;
}

}  // namespace

std::vector<Result> run_video(Device& device, const Options& options) {
  std::vector<Result> out;
  if (!device.properties().caps.video_decode) return out;
  std::string why;
  const base::ffmpeg::Api* av = base::ffmpeg::load(base::ffmpeg::Part::kDecode, &why);
  if (!av) throw Error(Status::Unsupported, "tpuhal bench video: the reference decoder needs FFmpeg: " + why);
  av->av_log_set_level(AV_LOG_FATAL);
  const fs::path dir = fs::temp_directory_path() / ("tpuhal-bench-video-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  struct Cleanup {
    fs::path d;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
  } cleanup{dir};
  // The codec unit's decode threads: one per core unless its profile or
  // TPUHAL_SIM_VIDEO_THREADS says fewer; the reference gets as many.
  std::uint32_t threads = std::max(1u, std::thread::hardware_concurrency());
  if (const char* env = std::getenv("TPUHAL_SIM_VIDEO_THREADS"))
    threads = std::min<std::uint32_t>(threads, static_cast<std::uint32_t>(std::max(1L, std::strtol(env, nullptr, 10))));
  const int frames_1080 = options.quick ? 10 : 60, frames_360 = options.quick ? 5 : 30;
  const Clip clips[] = {
      make_clip(dir, "1080p h264", Codec::H264, "1920x1080", frames_1080),
      make_clip(dir, "1080p h265", Codec::H265, "1920x1080", frames_1080),
      make_clip(dir, "360p h264", Codec::H264, "640x360", frames_360),
  };
  struct Case {
    const Clip* clip;
    std::uint32_t channels;
  };
  std::vector<Case> cases;
  for (int c = 0; c < 2; ++c)
    for (std::uint32_t n : {1u, 8u, 32u})
      if (!options.quick || n <= 8) cases.push_back({&clips[c], n});
  cases.push_back({&clips[2], options.quick ? 32u : 192u});
  double h264_32 = 0;
  for (const Case& k : cases) {
    if (k.channels > device.properties().decode_channels) continue;
    // Each measurement decodes at least kMinFrames frames (a single 1080p
    // channel would otherwise finish in a fraction of a second, too short
    // to measure on a shared machine). Device and reference alternate;
    // the best of three rounds each is kept.
    const std::uint64_t kMinFrames = options.quick ? 0 : 360;
    const std::uint64_t per_loop = std::uint64_t{k.channels} * k.clip->packets.size();
    const auto loops = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, (kMinFrames + per_loop - 1) / per_loop));
    double dev_fps = 0, ref_fps = 0;
    for (int round = 0; round < (options.quick ? 1 : 3); ++round) {
      dev_fps = std::max(dev_fps, device_fps(device, *k.clip, k.channels, loops));
      ref_fps = std::max(ref_fps, libavcodec_fps(*av, *k.clip, k.channels, loops, threads));
    }
    Result r;
    r.bench = "video_decode";
    r.params = {{"clip", k.clip->label}, {"channels", std::to_string(k.channels)}};
    r.value = dev_fps;
    r.unit = "fps";
    r.baseline = ref_fps;
    r.baseline_name = "libavcodec x" + std::to_string(threads);
    r.ratio = ref_fps > 0 ? dev_fps / ref_fps : 0;
    r.extra["threads"] = threads;
    r.extra["frames"] = static_cast<double>(per_loop * loops);
    if (k.clip == &clips[0] && k.channels == (options.quick ? 8u : 32u)) h264_32 = dev_fps;
    out.push_back(r);
    if (options.on_result) options.on_result(r);
  }
  if (h264_32 > 0) {
    Result r;
    r.bench = "realtime_channels";
    r.params = {{"clip", "1080p30 h264"}};
    r.value = h264_32 / 30.0;
    r.unit = "ch";
    r.baseline = 0;
    r.baseline_name = "";
    r.ratio = 0;
    out.push_back(r);
    if (options.on_result) options.on_result(r);
  }
  return out;
}

}  // namespace tpuhal::bench
