// tpuhal plan MODEL.tpm --stream WxH@FPS:CODEC: how many camera streams one
// board serves with a model, from the board's timing model (docs/timing.md).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <iostream>
#include <regex>
#include <vector>

#include <unistd.h>

#include "cli.h"
#include "tpuhal/pipeline/pipeline.hpp"
#include "tpuhal/rt/model.hpp"

namespace tpuhal::cli {
namespace {

namespace fs = std::filesystem;

struct Stream {
  std::uint32_t width = 0, height = 0;
  double fps = 0;
  Codec codec = Codec::H264;
};

Stream parse_stream(const std::string& s) {
  static const std::regex re(R"((\d{1,5})x(\d{1,5})@(\d+(?:\.\d+)?):(h264|h265|jpeg))");
  std::smatch m;
  if (!std::regex_match(s, m, re))
    throw Error(Status::InvalidArgument, "--stream " + s + ": expected WIDTHxHEIGHT@FPS:CODEC, e.g. 1920x1080@25:h264");
  Stream st;
  st.width = static_cast<std::uint32_t>(std::stoul(m[1]));
  st.height = static_cast<std::uint32_t>(std::stoul(m[2]));
  st.fps = std::stod(m[3]);
  st.codec = m[4] == "h264" ? Codec::H264 : m[4] == "h265" ? Codec::H265 : Codec::Jpeg;
  if (st.width < 16 || st.height < 16 || st.width > 8192 || st.height > 8192 || st.width % 2 || st.height % 2)
    throw Error(Status::InvalidArgument, "--stream " + s + ": frames are even sizes from 16x16 to 8192x8192");
  if (!(st.fps > 0 && st.fps <= 1000)) throw Error(Status::InvalidArgument, "--stream " + s + ": fps is 0 to 1000");
  return st;
}

// A frame's work on each unit, in board ns.
struct FrameWork {
  std::uint64_t video = 0;    // the decoder, averaged over the GOP
  std::uint64_t convert = 0;  // NV12 to planar RGB at the stream's size
  std::uint64_t resize = 0;   // to the model's input
  std::uint64_t model = 0;    // a run of the model divided by its batch
  std::uint64_t dma = 0;      // the outputs to the host, per frame
  std::uint64_t tensor() const { return convert + resize + model; }
};

enum Unit { kVideo, kTensor, kDma, kUnits };
const char* const kUnitNames[kUnits] = {"video unit", "tensor engine", "dma"};

// The board's timeline: `streams` streams whose frames arrive at `fps`
// (stream s offset by s / (fps * streams) of a period), each decoded on the
// video unit, then converted, resized and inferred on the tensor engine, in
// arrival order, then its outputs copied. Frames later than `deadline_ns`
// after their arrival are late.
struct Timeline {
  std::uint64_t frames = 0, late = 0, worst_ns = 0;
};
Timeline simulate(const FrameWork& w, double fps, unsigned streams, double seconds, std::uint64_t deadline_ns) {
  Timeline t;
  const double period = 1e9 / fps;
  const auto per_stream = static_cast<std::uint64_t>(std::floor(seconds * fps));
  std::vector<std::uint64_t> arrivals;
  arrivals.reserve(per_stream * streams);
  for (std::uint64_t k = 0; k < per_stream; ++k)
    for (unsigned s = 0; s < streams; ++s)
      arrivals.push_back(static_cast<std::uint64_t>(
          std::llround(period * (static_cast<double>(k) + static_cast<double>(s) / streams))));
  std::sort(arrivals.begin(), arrivals.end());
  std::uint64_t video_free = 0, tensor_free = 0, dma_free = 0;
  for (std::uint64_t a : arrivals) {
    video_free = std::max(video_free, a) + w.video;
    tensor_free = std::max(tensor_free, video_free) + w.tensor();
    dma_free = std::max(dma_free, tensor_free) + w.dma;
    const std::uint64_t latency = dma_free - a;
    t.worst_ns = std::max(t.worst_ns, latency);
    ++t.frames;
    if (latency > deadline_ns) ++t.late;
  }
  return t;
}

// --pipeline: the video pipeline itself (pipeline::run_pipeline) on
// `streams` copies of a camera clip, timed on the board's clock.
struct PipelineRun {
  unsigned streams = 0;
  std::uint64_t frames = 0, late = 0;
  double worst_ms = 0;
  std::string error;  // the first channel's that stopped early
};
PipelineRun run_streams(Device& dev, const rt::Model& m, const std::string& clip, unsigned streams, double fps,
                        double deadline_ms) {
  PipelineRun run;
  run.streams = streams;
  pipeline::PipelineOptions o;
  o.model = m;
  o.board_clock = true;
  o.arrival_fps = fps;
  o.deadline_ms = deadline_ms;
  const auto r = pipeline::run_pipeline(dev, std::vector<std::string>(streams, clip), o);
  for (const auto& c : r.channels) {
    run.frames += c.frames;
    run.late += c.late;
    run.worst_ms = std::max(run.worst_ms, c.latency_max_ms);
    if (run.error.empty() && !c.error.empty()) run.error = c.error;
  }
  return run;
}

// A simulated board for --pipeline keeps the model's time alone
// (TPUHAL_SIM_CLOCK=virtual), whatever the host's speed.
void virtual_clock_for(const std::string& uri) {
  if (uri.rfind("sim:", 0) != 0)
    throw Error(Status::InvalidArgument,
                "--pipeline runs on a simulated board (sim:bm1684x), whose clock can be the model's alone; " + uri +
                    " is not one");
  const char* clock = std::getenv("TPUHAL_SIM_CLOCK");
  if (clock && *clock && std::string_view(clock) != "virtual")
    throw Error(Status::InvalidArgument,
                std::string("--pipeline times the board with TPUHAL_SIM_CLOCK=virtual; it is \"") + clock + "\" here");
  ::setenv("TPUHAL_SIM_CLOCK", "virtual", 1);
}

}  // namespace

int cmd_plan(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("model", po::value<std::string>(), "the compiled model (.tpm)")(
      "stream,s", po::value<std::string>(), "the camera streams: WIDTHxHEIGHT@FPS:CODEC (h264, h265, jpeg)")(
      "streams,n", po::value<unsigned>(), "report the units' utilisation at this many streams")(
      "gop", po::value<unsigned>()->default_value(50), "frames per I frame (h264, h265)")(
      "seconds", po::value<double>()->default_value(10), "length of the timeline check")(
      "deadline-ms", po::value<double>(), "a frame's deadline after it arrives (default: 3 frame periods)")(
      "device,d", po::value<std::string>(), "the board (default: the first one); it must have a timing model")(
      "pipeline", po::bool_switch(),
      "check the plan with the video pipeline itself on a simulated board, timed on its clock")(
      "json", po::bool_switch(), "print JSON");
  po::positional_options_description pos;
  pos.add("model", 1);
  po::variables_map vm;
  int rc = 0;
  const char* usage =
      "Usage: tpuhal plan FILE.tpm --stream WxH@FPS:CODEC [--streams N] [--gop N] [--device URI] [--pipeline]\n"
      "                  [--json]\n\n"
      "Plans a video-analytics deployment from the board's timing model (docs/timing.md), running nothing\n"
      "(but --pipeline): each frame is decoded on the video unit (an I frame every --gop frames), then\n"
      "converted from NV12 to planar RGB, resized to the model's input and inferred on the tensor\n"
      "engine (a run divided by the model's batch), and its outputs copied to the host. Prints each\n"
      "unit's time per frame, how many such streams one board serves and which unit binds (or the\n"
      "board's decoder channels), each unit's utilisation at that many streams (or --streams), and a\n"
      "check on the board's timeline: the streams' frames arriving at FPS for --seconds, every frame\n"
      "done within --deadline-ms of its arrival at the planned count, and some late with one stream\n"
      "more. Needs a device with a timing model (a simulated board: sim:bm1684x).\n\n"
      "With --pipeline the same check runs the video pipeline itself (tpuhal::pipeline) on the planned\n"
      "count of streams and on one more: a camera clip of the stream (ffmpeg, no B frames) decoded on the\n"
      "board's codec unit, converted, resized and inferred, each packet arriving on the board's clock at\n"
      "FPS. The simulated board keeps the timing model's time alone (TPUHAL_SIM_CLOCK=virtual), so this\n"
      "holds on any host; the host takes as long as it takes (ResNet-50 on 4 s of 21 1080p streams: minutes\n"
      "on 2 cores; keep --seconds short). Where the decoder channels bind, the stream more finds no channel,\n"
      "which the report says. Needs a model of batch 1.";
  if (!parse(args, opts, pos, vm, usage, &rc)) return rc;
  if (!vm.count("model") || !vm.count("stream")) {
    std::fprintf(stderr, "tpuhal plan: name the compiled model and --stream\n%s\n", usage);
    return 2;
  }
  const std::string path = vm["model"].as<std::string>();
  const Stream st = parse_stream(vm["stream"].as<std::string>());
  const unsigned gop = std::max(1u, vm["gop"].as<unsigned>());
  const double seconds = vm["seconds"].as<double>();
  if (!(seconds > 0 && seconds <= 3600)) throw Error(Status::InvalidArgument, "--seconds: 0 to 3600");
  const bool run_pipeline = vm["pipeline"].as<bool>();
  if (run_pipeline && st.codec == Codec::Jpeg)
    throw Error(Status::InvalidArgument, "--pipeline takes h264 or h265 camera streams");
  const std::string uri = pick_device(vm);
  if (run_pipeline) virtual_clock_for(uri);
  Device dev = open(uri);
  if (!dev.modelled_copy(1, Memory::HostPinned, Memory::Device))
    throw Error(Status::Unsupported,
                dev.uri() + " has no timing model to plan with (docs/timing.md; sim:bm1684x has one)");
  const rt::Model m = rt::Model::load(dev, rt::read_model_file(path), path);
  if (m.inputs().size() != 1 || m.inputs()[0].shape.size() != 4 || m.inputs()[0].shape[1] != 3)
    throw Error(Status::InvalidArgument,
                path + ": plan needs a model with one image input [N, 3, H, W], not " + m.inputs()[0].describe());
  const auto& in_shape = m.inputs()[0].shape;
  const auto batch = static_cast<std::uint64_t>(in_shape[0]);
  const auto in_h = static_cast<std::uint64_t>(in_shape[2]), in_w = static_cast<std::uint64_t>(in_shape[3]);
  const auto run = m.instance().modelled();
  if (!run) throw Error(Status::Unsupported, dev.uri() + ": the timing model cannot cost this model");

  FrameWork w;
  // The decoder: the GOP's frames on average.
  auto decode = [&](FrameType type) { return *dev.modelled_decode_ns(st.codec, type, st.width, st.height); };
  if (st.codec == Codec::Jpeg)
    w.video = decode(FrameType::Intra);
  else
    w.video = (decode(FrameType::Intra) + (gop - 1) * decode(FrameType::Predicted) + gop - 1) / gop;
  // The pipeline's own ops on one frame, as pipeline::Stream runs them.
  Buffer luma = dev.allocate(std::uint64_t{st.width} * st.height);
  Buffer chroma = dev.allocate(std::uint64_t{st.width} * st.height / 2);
  Buffer rgb = dev.allocate(3ull * st.width * st.height * 4);
  Buffer small = dev.allocate(3ull * in_w * in_h * 4);
  const Tensor luma_t(luma, DType::U8, {st.height, st.width});
  const Tensor chroma_t(chroma, DType::U8, {st.height / 2, st.width / 2, 2});
  const Tensor rgb_t(rgb, DType::F32, {1, 3, st.height, st.width});
  const Tensor small_t(small, DType::F32, {1, 3, static_cast<std::int64_t>(in_h), static_cast<std::int64_t>(in_w)});
  ops::ResizeOptions rs;
  rs.mode = ResizeMode::Linear;
  w.convert = dev.modelled(ops::nv12_to_rgb(luma_t, chroma_t, rgb_t.reshape({3, st.height, st.width}), {}))->ns;
  w.resize = dev.modelled(ops::resize(rgb_t, small_t, rs))->ns;
  w.model = (run->ns + batch - 1) / batch;
  w.dma = (run->output_copy_ns + batch - 1) / batch;

  // Streams each unit can serve: its busy time per second within one second.
  const std::uint64_t per_unit[kUnits] = {w.video, w.tensor(), w.dma};
  unsigned capacity = UINT32_MAX;
  std::string binding;
  for (int u = 0; u < kUnits; ++u) {
    if (per_unit[u] == 0) continue;
    const auto n = static_cast<unsigned>(std::floor(1e9 / (static_cast<double>(per_unit[u]) * st.fps)));
    if (n < capacity) {
      capacity = n;
      binding = kUnitNames[u];
    }
  }
  const std::uint32_t channels = dev.properties().decode_channels;
  if (channels && channels < capacity) {
    capacity = channels;
    binding = "decoder channels";
  }
  const unsigned at = vm.count("streams") ? vm["streams"].as<unsigned>() : capacity;
  double util[kUnits];
  for (int u = 0; u < kUnits; ++u) util[u] = static_cast<double>(per_unit[u]) * st.fps * at / 1e9;
  const double deadline_ms = vm.count("deadline-ms") ? vm["deadline-ms"].as<double>() : 3e3 / st.fps;
  if (!(deadline_ms > 0)) throw Error(Status::InvalidArgument, "--deadline-ms must be positive");
  const auto deadline_ns = static_cast<std::uint64_t>(deadline_ms * 1e6);
  const Timeline fits = capacity ? simulate(w, st.fps, capacity, seconds, deadline_ns) : Timeline{};
  const Timeline over = simulate(w, st.fps, capacity + 1, seconds, deadline_ns);

  PipelineRun ran_fits, ran_over;
  if (run_pipeline) {
    if (batch != 1)
      throw Error(Status::InvalidArgument,
                  "--pipeline runs a model of batch 1; " + path + " has " + std::to_string(batch));
    const fs::path dir = fs::temp_directory_path() / ("tpuhal-plan-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    struct Remove {
      fs::path p;
      ~Remove() {
        std::error_code ec;
        fs::remove_all(p, ec);
      }
    } remove{dir};
    const std::string clip =
        pipeline::make_camera_clip(dir.string(), st.codec == Codec::H265 ? "h265" : "h264",
                                   std::to_string(st.width) + "x" + std::to_string(st.height), st.fps,
                                   static_cast<int>(gop), static_cast<int>(std::ceil(seconds * st.fps)));
    if (clip.empty())
      throw Error(Status::Unavailable,
                  "--pipeline makes its camera clip with ffmpeg, which failed or is not installed");
    if (capacity) ran_fits = run_streams(dev, m, clip, capacity, st.fps, deadline_ms);
    ran_over = run_streams(dev, m, clip, capacity + 1, st.fps, deadline_ms);
  }

  const char* codec = to_string(st.codec);
  if (vm["json"].as<bool>()) {
    nlohmann::ordered_json j;
    j["model"] = path;
    j["device"] = dev.uri();
    j["stream"] = {{"width", st.width}, {"height", st.height}, {"fps", st.fps}, {"codec", codec}, {"gop", gop}};
    j["batch"] = batch;
    j["per_frame_ns"] = {{"video", w.video}, {"convert", w.convert}, {"resize", w.resize},
                         {"model", w.model}, {"tensor", w.tensor()}, {"dma", w.dma}};
    j["streams"] = capacity;
    j["bound_by"] = binding;
    j["utilisation_at"] = at;
    j["utilisation"] = {{"video", util[kVideo]}, {"tensor", util[kTensor]}, {"dma", util[kDma]}};
    auto timeline = [&](unsigned n, const Timeline& t) {
      return nlohmann::ordered_json{{"streams", n},
                                    {"frames", t.frames},
                                    {"late", t.late},
                                    {"worst_latency_ms", static_cast<double>(t.worst_ns) / 1e6}};
    };
    j["timeline"] = {{"seconds", seconds},
                     {"deadline_ms", deadline_ms},
                     {"planned", timeline(capacity, fits)},
                     {"one_more", timeline(capacity + 1, over)}};
    if (run_pipeline) {
      auto ran = [&](const PipelineRun& p) {
        nlohmann::ordered_json o{
            {"streams", p.streams}, {"frames", p.frames}, {"late", p.late}, {"worst_latency_ms", p.worst_ms}};
        if (!p.error.empty()) o["error"] = p.error;
        return o;
      };
      j["pipeline"] = {{"planned", ran(ran_fits)}, {"one_more", ran(ran_over)}};
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("%s on %s: streams of %ux%u at %g fps, %s%s\n\n", path.c_str(), dev.uri().c_str(), st.width, st.height,
              st.fps, codec, st.codec == Codec::Jpeg ? "" : (", an I frame every " + std::to_string(gop)).c_str());
  std::printf("  per frame (board time, modelled)\n");
  std::printf("    video unit     %9.3f ms  decode\n", static_cast<double>(w.video) / 1e6);
  std::printf("    tensor engine  %9.3f ms  colour %.3f + resize %.3f + model %.3f (a run of batch %llu / %llu)\n",
              static_cast<double>(w.tensor()) / 1e6, static_cast<double>(w.convert) / 1e6,
              static_cast<double>(w.resize) / 1e6, static_cast<double>(w.model) / 1e6,
              static_cast<unsigned long long>(batch), static_cast<unsigned long long>(batch));
  std::printf("    dma            %9.3f ms  outputs to the host\n\n", static_cast<double>(w.dma) / 1e6);
  std::printf("  streams one board serves: %u (bound by the %s)\n", capacity, binding.c_str());
  std::printf("  utilisation at %u streams: video unit %.1f %%, tensor engine %.1f %%, dma %.1f %%\n\n", at,
              100 * util[kVideo], 100 * util[kTensor], 100 * util[kDma]);
  std::printf("  on the board's timeline (%g s, deadline %.1f ms after a frame arrives):\n", seconds, deadline_ms);
  std::printf("    %u streams: %llu of %llu frames late, worst latency %.3f ms\n", capacity,
              static_cast<unsigned long long>(fits.late), static_cast<unsigned long long>(fits.frames),
              static_cast<double>(fits.worst_ns) / 1e6);
  std::printf("    %u streams: %llu of %llu frames late, worst latency %.3f ms\n", capacity + 1,
              static_cast<unsigned long long>(over.late), static_cast<unsigned long long>(over.frames),
              static_cast<double>(over.worst_ns) / 1e6);
  if (run_pipeline) {
    std::printf("\n  the video pipeline on %s, timed on the board's clock:\n", dev.uri().c_str());
    for (const PipelineRun* p : {&ran_fits, &ran_over}) {
      std::printf("    %u streams: %llu of %llu frames late, worst latency %.3f ms\n", p->streams,
                  static_cast<unsigned long long>(p->late), static_cast<unsigned long long>(p->frames), p->worst_ms);
      if (!p->error.empty()) std::printf("      a channel stopped: %s\n", p->error.c_str());
    }
  }
  return 0;
}

}  // namespace tpuhal::cli
