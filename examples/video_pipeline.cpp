// Video analytics on one board: N streams (files or live cameras) decoded,
// preprocessed and classified on the device, with each channel's
// statistics.
//
//   video_pipeline [--device URI] [--seconds S] [--transport auto|tcp|udp] [SOURCE...]
//
// A SOURCE is a file or a URL (rtsp://, http://, udp://); no sources: two
// channels of a test clip made with ffmpeg. Live sources run until --seconds
// pass (or their reconnection attempts run out); a stream that stalls,
// drops or ends is opened again. Exit status 1 if a channel failed or
// decoded nothing.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tpuhal/pipeline/pipeline.hpp"

int main(int argc, char** argv) {
  std::string uri = "sim:0";
  std::vector<std::string> sources;
  tpuhal::pipeline::PipelineOptions options;
  for (int i = 1; i < argc; ++i) {
    const bool more = i + 1 < argc;
    if (!std::strcmp(argv[i], "--device") && more) {
      uri = argv[++i];
    } else if (!std::strcmp(argv[i], "--seconds") && more) {
      options.seconds = std::atof(argv[++i]);
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
      std::fprintf(stderr,
                   "usage: video_pipeline [--device URI] [--seconds S] [--transport auto|tcp|udp] [SOURCE...]\n");
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
    const auto r = tpuhal::pipeline::run_pipeline(dev, sources, options);
    int status = 0;
    for (std::size_t c = 0; c < r.channels.size(); ++c) {
      const auto& ch = r.channels[c];
      std::printf(
          "channel %zu: %llu frames, %.1f fps, %llu packets, %llu lost, %llu corrupt, %llu reconnects, "
          "latency %.1f ms mean / %.1f ms max, last class %d  (%s)\n",
          c, static_cast<unsigned long long>(ch.frames), ch.fps, static_cast<unsigned long long>(ch.packets),
          static_cast<unsigned long long>(ch.packets_lost), static_cast<unsigned long long>(ch.corrupt_frames),
          static_cast<unsigned long long>(ch.reconnects), ch.latency_mean_ms, ch.latency_max_ms, ch.last_class,
          ch.source.c_str());
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
