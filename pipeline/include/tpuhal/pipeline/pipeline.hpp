// The video-analytics pipeline: N camera streams decoded on the board's
// video unit, converted and resized on its tensor engine, and run through a
// network there: a compiled model (a classifier, or a detector compiled with
// `tpuhal compile --detect`) or a small built-in classifier. No frame goes
// back to the host; only the network's output does. `tpuhal demo` shows it;
// examples/video_pipeline.cpp runs it on any files or live streams
// (rtsp://, http://, udp://).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tpuhal/rt/model.hpp"
#include "tpuhal/tpuhal.hpp"
#include "tpuhal/video.hpp"

namespace tpuhal::pipeline {

// A box a detector found in a frame: corners in the frame's pixels (the
// model's boxes, in its input's pixels, mapped back through the resize,
// or the letterbox, and clamped to the frame), its score and class.
struct Detection {
  float x1 = 0, y1 = 0, x2 = 0, y2 = 0;
  float score = 0;
  int cls = 0;
};

// What the network made of one frame (PipelineOptions::on_frame).
struct FrameResult {
  std::size_t channel = 0;  // the source's index
  std::uint64_t frame = 0;  // frames of this channel before it
  std::int64_t pts = 0;     // Frame::pts
  std::uint32_t width = 0, height = 0;
  // A classifier's best class and its score (output value); -1 and 0 for a
  // detector.
  int cls = -1;
  float score = 0;
  std::vector<Detection> detections;  // a detector's boxes, best first
};

struct PipelineOptions {
  DemuxerOptions demuxer;  // how live sources are read and reconnected
  // Stop every channel after this long (0: when its source ends; a live
  // source then runs until its reconnection attempts run out).
  double seconds = 0;
  // The network every frame goes through: a compiled model loaded on the
  // pipeline's device (rt::Model::load), shared by the channels, each of
  // which runs its own rt::Instance. Its one input is f32 [1, 3, H, W]
  // (planar RGB; the frame is resized to W x H); its first output either a
  // classifier's scores [1, K] or a detector's `detections` [1, M, 6]
  // (tpuhal compile --detect; docs/runtime.md). Empty: the built-in
  // classifier (64 x 64 in, 10 classes, fixed random weights).
  rt::Model model;
  // The RGB values (0 to 255) the network sees: (rgb - mean) * scale.
  // ImageNet's by default; a YOLO detector takes mean 0, scale 1/255.
  std::array<float, 3> mean{123.7f, 116.3f, 103.5f};
  std::array<float, 3> scale{1 / 58.4f, 1 / 57.1f, 1 / 57.4f};
  // Keep the frame's aspect, as YOLO's training does: the frame is resized
  // by the one factor that fits it in the input, centred (offsets rounded
  // down), and the rest of the input is `pad` (an RGB value, normalised
  // like the pixels; YOLO's 114). Off: the frame is stretched to the input.
  bool letterbox = false;
  float pad = 114;
  // Time the run on the board's clock (caps.wait_time), as a deployment
  // of live cameras would meet it: source c of n's packet k arrives at
  // board time start + (k + c / n) / arrival_fps, where start is the
  // board's time once every channel is ready (Device::board_time_ns()); the
  // codec unit takes it no earlier (VideoDecoder::send_at), a frame's ops
  // start no earlier than the unit finished it (Frame::decoded_ns), and the
  // channels take turns in arrival order, so that the board's units see the
  // frames in the order a board serving live cameras would. A frame's
  // latency (ChannelStats) is then board time, from its packet's arrival to
  // its output copied; frames past `deadline_ms` (0: none) count as late.
  // On a simulated board with TPUHAL_SIM_CLOCK=virtual the board's time is
  // the timing model's alone, so the run gives the board's own latencies
  // on any host, however slow (docs/timing.md); that is what it is for. On
  // a board that keeps the host's time the turns serialise the channels'
  // work, so the latencies are upper bounds, and a live source whose turn
  // it is holds the others while it waits for its data. `seconds` still
  // counts the host's time.
  bool board_clock = false;
  double arrival_fps = 0;  // board_clock: each source's frame rate (> 0)
  double deadline_ms = 0;
  // Called after each frame with what the network made of it, from the
  // frame's channel thread: concurrently for different channels, in frame
  // order within one. An exception it throws stops its channel (the
  // channel's error says what it was).
  std::function<void(const FrameResult&)> on_frame;
};

// One channel's statistics.
struct ChannelStats {
  std::string source;
  std::uint64_t packets = 0;         // sent to the decoder
  std::uint64_t frames = 0;          // decoded and run through the network
  double fps = 0;                    // frames over the channel's run time
  std::uint64_t packets_lost = 0;    // by the network (Demuxer::packets_lost)
  std::uint64_t corrupt_frames = 0;  // packets that did not decode
  std::uint64_t reconnects = 0;      // of a live source
  // Packet read to frame decoded, on the host's clock; with
  // PipelineOptions::board_clock, packet arrival to output copied, on the
  // board's.
  double latency_mean_ms = 0;
  double latency_max_ms = 0;
  std::uint64_t late = 0;        // board_clock: frames past PipelineOptions::deadline_ms
  int last_class = -1;           // a classifier's best class for its last frame
  std::uint64_t detections = 0;  // a detector's boxes over all its frames
  std::string error;             // why it stopped early; empty when it ran to the end
};

struct PipelineResult {
  std::vector<ChannelStats> channels;
  double total_fps = 0;
  double seconds = 0;
};

// Decodes each source on its own decoder channel (from its own host
// thread), runs every frame through NV12 -> RGB (mean/scale normalisation),
// a resize to the network's input and the network, in one submission, and
// returns each channel's statistics. A live source that stalls, drops or ends is reconnected and
// its decoder channel starts a new stream (a new channel where the codec or
// size changed); the other channels go on untouched. A channel that fails
// (its source gives up, a device error) reports why in its stats and the
// rest run on. Throws only what stops every channel: no compute queue, or
// InvalidArgument for a model the pipeline cannot feed or read (check_model)
// before any channel starts.
PipelineResult run_pipeline(Device& dev, const std::vector<std::string>& sources, const PipelineOptions& options = {});

// What the pipeline reads from a model's first output.
enum class NetworkKind { Classifier, Detector };
// Checks that the pipeline can run `model` on `dev` and says how it reads
// its output; InvalidArgument naming what does not fit: a model loaded on
// another device, more than one input, an input other than f32
// [1, 3, H, W], or a first output neither [1, K] nor a detector's
// `detections` [1, M, 6].
NetworkKind check_model(const Device& dev, const rt::Model& model);

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
// A camera's clip: `codec` ("h264" or "h265"), `size` ("1920x1080") at
// `fps`, an I frame every `gop` frames and no B frames, as live cameras
// send; the same fallback.
std::string make_camera_clip(const std::string& dir, const std::string& codec, const std::string& size, double fps,
                             int gop, int frames);

}  // namespace tpuhal::pipeline
