// The video-analytics pipeline: N camera streams decoded on the board's
// video unit, converted and resized on its tensor engine, and classified by
// a small network recorded once as a Program; no frame goes back to the host.
// `tpuhal demo` shows it; examples/video_pipeline.cpp runs it on any files
// or live streams (rtsp://, http://, udp://).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tpuhal/tpuhal.hpp"
#include "tpuhal/video.hpp"

namespace tpuhal::pipeline {

struct PipelineOptions {
  DemuxerOptions demuxer;  // how live sources are read and reconnected
  // Stop every channel after this long (0: when its source ends; a live
  // source then runs until its reconnection attempts run out).
  double seconds = 0;
};

// One channel's statistics.
struct ChannelStats {
  std::string source;
  std::uint64_t packets = 0;         // sent to the decoder
  std::uint64_t frames = 0;          // decoded and classified
  double fps = 0;                    // frames over the channel's run time
  std::uint64_t packets_lost = 0;    // by the network (Demuxer::packets_lost)
  std::uint64_t corrupt_frames = 0;  // packets that did not decode
  std::uint64_t reconnects = 0;      // of a live source
  double latency_mean_ms = 0;        // packet read to frame decoded
  double latency_max_ms = 0;
  int last_class = -1;  // of its last frame
  std::string error;    // why it stopped early; empty when it ran to the end
};

struct PipelineResult {
  std::vector<ChannelStats> channels;
  double total_fps = 0;
  double seconds = 0;
};

// Decodes each source on its own decoder channel (from its own host
// thread), runs every frame through NV12 -> RGB (mean/scale normalisation),
// a resize to 64x64 and the classifier, and returns each channel's
// statistics. A live source that stalls, drops or ends is reconnected and
// its decoder channel starts a new stream (a new channel where the codec or
// size changed); the other channels go on untouched. A channel that fails
// (its source gives up, a device error) reports why in its stats and the
// rest run on. Throws only what stops every channel (no compute queue).
PipelineResult run_pipeline(Device& dev, const std::vector<std::string>& sources, const PipelineOptions& options = {});

// How a decoder for a demuxed source is sized, for every user of the video
// unit (the pipeline, `tpuhal decode`): `base` (format, frame buffers, ...)
// with the source's codec and a largest frame of the source's size, at
// least 16x16; a live source's at least 1920x1088, since it may not say its
// size before it decodes and may come back larger after a reconnection.
VideoDecoderOptions decoder_options(const Demuxer& source, VideoDecoderOptions base = {});
// After a reconnection (Packet::new_stream): whether a decoder opened with
// `options` takes the source's stream as it is now (the same codec, a size
// within its largest), so that it starts a new stream (VideoDecoder::reset());
// if not, a new channel sized by decoder_options() replaces it.
bool decoder_fits(const VideoDecoderOptions& options, const Demuxer& source);

// Makes a short H.264 test clip with ffmpeg (testsrc2); returns its path, or
// an empty string if ffmpeg is not there.
std::string make_test_clip(const std::string& dir, const std::string& size, int frames);

}  // namespace tpuhal::pipeline
