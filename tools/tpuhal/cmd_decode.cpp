// tpuhal decode: a file through a board's video decoder, optionally hashing
// every frame the way `ffmpeg -f framemd5` does.
#include <chrono>
#include <cstdio>
#include <iostream>

#include "cli.h"
#include "tpuhal/base/ffmpeg.h"
#include "tpuhal/pipeline/pipeline.hpp"

namespace tpuhal::cli {
namespace {

// MD5 of the frame's planes Y, U, V packed tightly (I420), as ffmpeg's
// framemd5 muxer hashes an 8-bit 4:2:0 frame.
std::string frame_md5(const Frame& f, std::span<const std::byte> host) {
  std::string why;
  const base::ffmpeg::Api* loaded = base::ffmpeg::load(base::ffmpeg::Part::kDecode, &why);
  if (!loaded) throw Error(Status::Unsupported, "tpuhal decode --md5: hashing needs FFmpeg: " + why);
  const base::ffmpeg::Api& av = *loaded;
  AVMD5* md5 = av.av_md5_alloc();
  av.av_md5_init(md5);
  const auto* base = reinterpret_cast<const std::uint8_t*>(host.data());
  const auto planes = f.planes();
  const Frame::Plane& y = planes[0];
  for (std::uint32_t r = 0; r < y.rows; ++r)
    av.av_md5_update(md5, base + y.offset + std::uint64_t{r} * y.pitch, y.row_bytes);
  if (f.format() == PixelFormat::I420) {
    for (int p = 1; p < 3; ++p)
      for (std::uint32_t r = 0; r < planes[p].rows; ++r)
        av.av_md5_update(md5, base + planes[p].offset + std::uint64_t{r} * planes[p].pitch, planes[p].row_bytes);
  } else {  // NV12: separate the interleaved chroma
    const Frame::Plane& uv = planes[1];
    std::vector<std::uint8_t> row(uv.row_bytes / 2);
    for (int which = 0; which < 2; ++which)
      for (std::uint32_t r = 0; r < uv.rows; ++r) {
        const std::uint8_t* in = base + uv.offset + std::uint64_t{r} * uv.pitch;
        for (std::size_t x = 0; x < row.size(); ++x) row[x] = in[2 * x + which];
        av.av_md5_update(md5, row.data(), static_cast<int>(row.size()));
      }
  }
  std::uint8_t digest[16];
  av.av_md5_final(md5, digest);
  av.av_free(md5);
  char hex[33];
  for (int i = 0; i < 16; ++i) std::snprintf(hex + 2 * i, 3, "%02x", digest[i]);
  return hex;
}

}  // namespace

int cmd_decode(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("device,d", po::value<std::string>(), "device to decode on (default: the first)")(
      "file", po::value<std::string>()->required(),
      "video or image file (mp4, mkv, .h264, .h265, .jpg, ...) or a URL (rtsp://, http://, udp://)")(
      "md5", "print the MD5 of every frame (Y, U, V packed as I420), in display order")(
      "format", po::value<std::string>()->default_value("i420"), "output layout of the decoder: i420 or nv12")(
      "frames", po::value<std::uint64_t>(), "stop after this many frames")(
      "transport", po::value<std::string>()->default_value("auto"), "a URL's RTSP transport: auto, tcp or udp")(
      "timeout-ms", po::value<unsigned>()->default_value(5000),
      "a URL that brings nothing for this long has stalled and is opened again")(
      "reconnect-max", po::value<unsigned>()->default_value(0),
      "give up after this many failed reconnection attempts in a row (0: never)")(
      "backoff-ms", po::value<std::string>()->default_value("100:5000"),
      "FIRST:MAX: the wait before the first reconnection attempt, doubling up to MAX");
  po::positional_options_description pos;
  pos.add("file", 1);
  po::variables_map vm;
  int rc = 0;
  if (!parse(args, opts, pos, vm,
             "Usage: tpuhal decode [--device URI] FILE|URL [--md5] [--format i420|nv12] [--frames N]\n"
             "                     [--transport auto|tcp|udp] [--timeout-ms MS] [--reconnect-max N]\n\n"
             "Decodes FILE, or a live stream at URL, on the board's video decoder. With --md5, prints\n"
             "one line per frame in display order: index, pts, size and the MD5 of its planes packed\n"
             "as I420 (for 8-bit 4:2:0 sources, the hashes `ffmpeg -i FILE -fps_mode passthrough -f\n"
             "framemd5 -` prints). A live stream that stalls, drops or ends is opened again with a\n"
             "bounded backoff, and the decoder starts a new stream (a new channel if the codec or\n"
             "size changed); it runs until --frames, an interrupt, or --reconnect-max attempts fail.\n"
             "Packets that do not decode are reported on stderr; the exit status is then 1.",
             &rc))
    return rc;
  const std::string fmt = vm["format"].as<std::string>();
  if (fmt != "i420" && fmt != "nv12") {
    std::cerr << "tpuhal decode: --format must be i420 or nv12, not '" << fmt << "'\n";
    return 2;
  }
  DemuxerOptions dopts;
  const std::string transport = vm["transport"].as<std::string>();
  if (transport == "tcp") {
    dopts.transport = DemuxerOptions::Transport::Tcp;
  } else if (transport == "udp") {
    dopts.transport = DemuxerOptions::Transport::Udp;
  } else if (transport != "auto") {
    std::cerr << "tpuhal decode: --transport must be auto, tcp or udp, not '" << transport << "'\n";
    return 2;
  }
  unsigned first = 0, most = 0;
  char tail = 0;
  if (std::sscanf(vm["backoff-ms"].as<std::string>().c_str(), "%u:%u%c", &first, &most, &tail) != 2 || !first ||
      most < first || vm["timeout-ms"].as<unsigned>() == 0) {
    std::cerr << "tpuhal decode: --backoff-ms takes FIRST:MAX with 0 < FIRST <= MAX, and --timeout-ms a "
                 "positive number\n";
    return 2;
  }
  dopts.timeout = std::chrono::milliseconds(vm["timeout-ms"].as<unsigned>());
  dopts.initial_backoff = std::chrono::milliseconds(first);
  dopts.max_backoff = std::chrono::milliseconds(most);
  dopts.max_attempts = vm["reconnect-max"].as<unsigned>();
  Device dev = open(pick_device(vm));
  Demuxer in(vm["file"].as<std::string>(), dopts);
  VideoDecoderOptions o;
  o.format = fmt == "nv12" ? PixelFormat::NV12 : PixelFormat::I420;
  o.frame_buffers = 8;
  o = pipeline::decoder_options(in, o);  // sized as the pipeline sizes its decoders
  VideoDecoder dec = dev.open_decoder(o);
  const bool md5 = vm.count("md5") != 0;
  const std::uint64_t limit = vm.count("frames") ? vm["frames"].as<std::uint64_t>() : UINT64_MAX;

  Queue copy = dev.queue(Engine::Copy);
  Buffer host;
  std::uint64_t frames = 0, errors = 0;
  const auto start = std::chrono::steady_clock::now();
  auto drain = [&]() {
    for (;;) {
      std::optional<Frame> f;
      try {
        f = dec.receive();
      } catch (const Error& e) {
        if (e.status() == Status::Timeout || e.status() == Status::DeviceFault) throw;
        std::cerr << "tpuhal decode: " << e.what() << "\n";
        ++errors;
        continue;
      }
      if (!f) return;
      if (frames >= limit) continue;
      if (md5) {
        const std::uint64_t need =
            f->planes().back().offset + std::uint64_t{f->planes().back().pitch} * f->planes().back().rows;
        if (!host.valid() || host.size() < need) host = dev.allocate(need, Memory::HostPinned);
        copy.copy(f->buffer(), 0, host, 0, need).submit().wait();
        std::printf("%llu, %lld, %ux%u, %s\n", static_cast<unsigned long long>(frames),
                    static_cast<long long>(f->pts()), f->width(), f->height(), frame_md5(*f, host.map()).c_str());
        if (in.live()) std::fflush(stdout);  // a reader of a live stream sees each frame as it comes
      }
      ++frames;
    }
  };
  while (frames < limit) {
    auto pkt = in.next();
    if (!pkt) break;
    if (pkt->new_stream) {
      // Reconnected: the same decoder starts a new stream where it can
      // (same codec, a size it takes), else a new channel replaces it.
      const bool fits = pipeline::decoder_fits(o, in);
      std::fprintf(stderr, "tpuhal decode: %s: reconnected (%s %ux%u)%s\n", in.path().c_str(), to_string(in.codec()),
                   in.width(), in.height(), fits ? "" : "; opening a new channel for it");
      // The frames of the old stream still inside come out first.
      dec.flush();
      drain();
      if (fits) {
        dec.reset();
      } else {
        o = pipeline::decoder_options(in, o);
        dec = dev.open_decoder(o);
      }
    }
    dec.send(pkt->data, pkt->pts);
    drain();
  }
  dec.flush();
  drain();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fflush(stdout);
  std::string extra;
  if (in.live())
    extra += ", " + std::to_string(in.reconnects()) + " reconnect(s), " + std::to_string(in.packets_lost()) +
             " packet(s) lost";
  if (errors) extra += ", " + std::to_string(errors) + " packets did not decode";
  std::fprintf(stderr, "tpuhal decode: %s: %llu frames (%s %ux%u) on %s channel %u in %.2f s (%.1f fps)%s\n",
               in.path().c_str(), static_cast<unsigned long long>(frames), to_string(in.codec()), in.width(),
               in.height(), dev.uri().c_str(), dec.channel(), s, s > 0 ? static_cast<double>(frames) / s : 0.0,
               extra.c_str());
  return errors ? 1 : 0;
}

}  // namespace tpuhal::cli
