// Video analytics on one board: N streams (files or live cameras) decoded,
// preprocessed and run through a network on the device, with each channel's
// statistics.
//
//   video_pipeline [--device URI] [--seconds S] [--transport auto|tcp|udp]
//                  [--model M.tpm [--mean R,G,B] [--scale R,G,B] [--letterbox] [--print]] [SOURCE...]
//
// A SOURCE is a file or a URL (rtsp://, http://, udp://); no sources: two
// channels of a test clip made with ffmpeg. Live sources run until --seconds
// pass (or their reconnection attempts run out); a stream that stalls,
// drops or ends is opened again. --model runs a compiled model (a
// classifier, or a detector compiled with `tpuhal compile --detect`)
// instead of the built-in classifier; --mean and --scale normalise the RGB
// values it sees ((rgb - mean) * scale; ImageNet's by default, a YOLO
// detector takes --mean 0 --scale 0.00392157); --letterbox keeps the
// frame's aspect, padded with grey 114, as YOLO's training does; --print prints each
// frame's class or boxes. Exit status 1 if a channel failed or decoded
// nothing.
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "tpuhal/pipeline/pipeline.hpp"

namespace {

const char kUsage[] =
    "usage: video_pipeline [--device URI] [--seconds S] [--transport auto|tcp|udp]\n"
    "                      [--model M.tpm [--mean R,G,B] [--scale R,G,B] [--letterbox] [--print]] [SOURCE...]\n";

// "R,G,B", or one number for all three.
bool parse_triple(const char* text, std::array<float, 3>& out) {
  char* end = nullptr;
  const char* p = text;
  for (int i = 0; i < 3; ++i) {
    out[i] = std::strtof(p, &end);
    if (end == p) return false;
    if (i == 0 && *end == '\0') {
      out = {out[0], out[0], out[0]};
      return true;
    }
    if (*end != (i < 2 ? ',' : '\0')) return false;
    p = end + 1;
  }
  return true;
}

void print_frame(const tpuhal::pipeline::FrameResult& f) {
  std::printf("channel %zu frame %llu pts %lld:", f.channel, static_cast<unsigned long long>(f.frame),
              static_cast<long long>(f.pts));
  if (f.cls >= 0) std::printf(" class %d (%.4g)", f.cls, static_cast<double>(f.score));
  for (const auto& d : f.detections)
    std::printf(" [class %d %.3f at %.1f,%.1f-%.1f,%.1f]", d.cls, static_cast<double>(d.score),
                static_cast<double>(d.x1), static_cast<double>(d.y1), static_cast<double>(d.x2),
                static_cast<double>(d.y2));
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string uri = "sim:0", model_path;
  bool print = false;
  std::vector<std::string> sources;
  tpuhal::pipeline::PipelineOptions options;
  for (int i = 1; i < argc; ++i) {
    const bool more = i + 1 < argc;
    if (!std::strcmp(argv[i], "--device") && more) {
      uri = argv[++i];
    } else if (!std::strcmp(argv[i], "--seconds") && more) {
      options.seconds = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--model") && more) {
      model_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--print")) {
      print = true;
    } else if (!std::strcmp(argv[i], "--letterbox")) {
      options.letterbox = true;
    } else if ((!std::strcmp(argv[i], "--mean") || !std::strcmp(argv[i], "--scale")) && more) {
      const char* name = argv[i];
      if (!parse_triple(argv[++i], name[2] == 'm' ? options.mean : options.scale)) {
        std::fprintf(stderr, "video_pipeline: %s takes R,G,B or one number for all three, not '%s'\n", name, argv[i]);
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--transport") && more) {
      const std::string t = argv[++i];
      if (t == "tcp")
        options.demuxer.transport = tpuhal::DemuxerOptions::Transport::Tcp;
      else if (t == "udp")
        options.demuxer.transport = tpuhal::DemuxerOptions::Transport::Udp;
      else if (t != "auto") {
        std::fprintf(stderr, "video_pipeline: --transport takes auto, tcp or udp, not '%s'\n", t.c_str());
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--help") || (argv[i][0] == '-' && argv[i][1] == '-')) {
      std::fputs(kUsage, stderr);
      return std::strcmp(argv[i], "--help") ? 2 : 0;
    } else {
      sources.push_back(argv[i]);
    }
  }
  const auto dir = std::filesystem::temp_directory_path() / ("tpuhal-pipeline-" + std::to_string(::getpid()));
  try {
    if (sources.empty()) {
      std::filesystem::create_directories(dir);
      const std::string clip = tpuhal::pipeline::make_test_clip(dir.string(), "640x360", 60);
      if (clip.empty()) {
        std::fprintf(stderr, "video_pipeline: give video files or URLs, or install ffmpeg to make test clips\n");
        return 2;
      }
      sources = {clip, clip};
    }
    tpuhal::Device dev = tpuhal::open(uri);
    if (!model_path.empty()) options.model = tpuhal::rt::Model::load(dev, model_path);
    std::mutex print_mu;
    if (print)
      options.on_frame = [&](const tpuhal::pipeline::FrameResult& f) {
        std::lock_guard lock(print_mu);
        print_frame(f);
      };
    const auto r = tpuhal::pipeline::run_pipeline(dev, sources, options);
    int status = 0;
    for (std::size_t c = 0; c < r.channels.size(); ++c) {
      const auto& ch = r.channels[c];
      std::printf(
          "channel %zu: %llu frames, %.1f fps, %llu packets, %llu lost, %llu corrupt, %llu reconnects, "
          "latency %.1f ms mean / %.1f ms max, ",
          c, static_cast<unsigned long long>(ch.frames), ch.fps, static_cast<unsigned long long>(ch.packets),
          static_cast<unsigned long long>(ch.packets_lost), static_cast<unsigned long long>(ch.corrupt_frames),
          static_cast<unsigned long long>(ch.reconnects), ch.latency_mean_ms, ch.latency_max_ms);
      if (ch.last_class >= 0)
        std::printf("last class %d", ch.last_class);
      else
        std::printf("%llu boxes", static_cast<unsigned long long>(ch.detections));
      std::printf("  (%s)\n", ch.source.c_str());
      if (!ch.error.empty()) std::printf("channel %zu: stopped: %s\n", c, ch.error.c_str());
      if (ch.frames == 0 || !ch.error.empty()) status = 1;
    }
    std::printf("total: %.1f fps over %zu channels in %.2f s\n", r.total_fps, r.channels.size(), r.seconds);
    std::filesystem::remove_all(dir);
    return status;
  } catch (const tpuhal::Error& e) {
    std::fprintf(stderr, "video_pipeline: %s\n", e.what());
    std::filesystem::remove_all(dir);
    return 1;
  }
}
