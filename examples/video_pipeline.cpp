// Video analytics on one board: N streams decoded, preprocessed and
// classified on the device.
//
//   video_pipeline [--device URI] [FILE...]     (no files: two test clips made with ffmpeg)
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tpuhal/pipeline/pipeline.hpp"

int main(int argc, char** argv) {
  std::string uri = "sim:0";
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--device") && i + 1 < argc)
      uri = argv[++i];
    else
      files.push_back(argv[i]);
  }
  const auto dir = std::filesystem::temp_directory_path() / ("tpuhal-pipeline-" + std::to_string(::getpid()));
  try {
    if (files.empty()) {
      std::filesystem::create_directories(dir);
      const std::string clip = tpuhal::pipeline::make_test_clip(dir.string(), "640x360", 60);
      if (clip.empty()) {
        std::fprintf(stderr, "video_pipeline: give video files, or install ffmpeg to make test clips\n");
        return 2;
      }
      files = {clip, clip};
    }
    tpuhal::Device dev = tpuhal::open(uri);
    const auto r = tpuhal::pipeline::run_pipeline(dev, files);
    for (std::size_t c = 0; c < files.size(); ++c)
      std::printf("channel %zu: %llu frames, %.1f fps, last frame class %d  (%s)\n", c,
                  static_cast<unsigned long long>(r.frames[c]), r.fps[c], r.last_class[c], files[c].c_str());
    std::printf("total: %.1f fps over %zu channels in %.2f s\n", r.total_fps, files.size(), r.seconds);
    std::filesystem::remove_all(dir);
    for (auto n : r.frames)
      if (n == 0) return 1;
    return 0;
  } catch (const tpuhal::Error& e) {
    std::fprintf(stderr, "video_pipeline: %s\n", e.what());
    std::filesystem::remove_all(dir);
    return 1;
  }
}
