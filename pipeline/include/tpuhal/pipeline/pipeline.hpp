// The video-analytics pipeline: N camera streams decoded on the board's
// video unit, converted and resized on its tensor engine, and classified by
// a small network recorded once as a Program; no frame goes back to the host.
// `tpuhal demo` shows it; examples/video_pipeline.cpp runs it on any files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tpuhal/tpuhal.hpp"

namespace tpuhal::pipeline {

struct PipelineResult {
  std::vector<std::uint64_t> frames;  // per channel
  std::vector<double> fps;            // per channel
  double total_fps = 0;
  double seconds = 0;
  std::vector<int> last_class;  // per channel: the class of its last frame
};

// Decodes each file on its own channel (from its own host thread), runs
// every frame through NV12 -> RGB (mean/scale normalisation), a resize to
// 64x64 and the classifier, and returns the rates.
PipelineResult run_pipeline(Device& dev, const std::vector<std::string>& files);

// Makes a short H.264 test clip with ffmpeg (testsrc2); returns its path, or
// an empty string if ffmpeg is not there.
std::string make_test_clip(const std::string& dir, const std::string& size, int frames);

}  // namespace tpuhal::pipeline
