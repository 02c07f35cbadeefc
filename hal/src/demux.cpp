// Demuxer: files and live URLs to Annex B / JPEG packets with libavformat.
#include <spdlog/spdlog.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdarg>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "tpuhal/base/ffmpeg.h"
#include "tpuhal/base/log.h"
#include "tpuhal/base/wait.h"
#include "tpuhal/tpuhal.hpp"

namespace tpuhal {

namespace {

// FFmpeg, loaded by the first Demuxer (which throws if it cannot be): every
// use below runs on behalf of one.
const base::ffmpeg::Api& av() { return *base::ffmpeg::load(base::ffmpeg::Part::kDemux, nullptr); }

void load_ffmpeg(const std::string& path) {
  if (std::string why; !base::ffmpeg::load(base::ffmpeg::Part::kDemux, &why))
    throw Error(Status::Unsupported, path + ": reading video needs FFmpeg: " + why);
}

std::string av_error(int code) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {};
  av().av_strerror(code, buf, sizeof buf);
  return buf;
}

bool is_url(const std::string& s) { return s.find("://") != std::string::npos; }

std::string ms(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

// What libavformat tells of a live source only in its log. Its RTP
// depacketiser has no statistics API, but it logs every sequence-number gap
// it finds ("RTP: missed N packets") and every RTCP BYE ("Received BYE for
// stream ...", at debug level) against the demuxer's AVFormatContext. A log
// callback notes both for the live Demuxers it knows, and hands every
// message to libav's default (which filters by level).
struct Heard {
  std::atomic<std::uint64_t> lost{0};  // packets
  std::atomic<bool> bye{false};        // the server ended the stream
};
struct HeardByContext {
  std::mutex mu;
  std::unordered_map<const void*, Heard*> by_context;
};
HeardByContext& heard_by_context() {
  static auto* c = new HeardByContext;  // used by log calls until the process ends
  return *c;
}

void listen_to_libav(void* avcl, int level, const char* fmt, va_list vl) {
  static constexpr char kMissed[] = "RTP: missed %d packets";
  static constexpr char kBye[] = "Received BYE for stream";
  const bool missed = avcl && fmt && std::strncmp(fmt, kMissed, sizeof kMissed - 1) == 0;
  const bool bye = avcl && fmt && std::strncmp(fmt, kBye, sizeof kBye - 1) == 0;
  if (missed || bye) {
    int n = 0;
    if (missed) {
      va_list args;
      va_copy(args, vl);
      n = va_arg(args, int);
      va_end(args);
    }
    HeardByContext& c = heard_by_context();
    std::lock_guard lock(c.mu);
    if (auto it = c.by_context.find(avcl); it != c.by_context.end()) {
      if (missed && n > 0) it->second->lost.fetch_add(static_cast<std::uint64_t>(n), std::memory_order_relaxed);
      if (bye) it->second->bye.store(true, std::memory_order_relaxed);
    }
  }
  av().av_log_default_callback(avcl, level, fmt, vl);
}

// libavformat's parser hands a unit out once the next one begins. When a
// read fails it flushes what it holds as a last unit and closes itself: a
// unit that comes with the parser gone was handed out that way. The source
// ended (an RTSP server's BYE: the unit is whole), or it dropped or stalled,
// perhaps inside the unit.
bool flushed_by_a_failed_read(AVStream* st, bool had_parser) { return had_parser && !av().av_stream_get_parser(st); }

}  // namespace

struct Demuxer::State {
  std::string path;
  DemuxerOptions options;
  bool live = false;
  bool rtsp = false;  // live over RTSP, whose BYE says that a stream ended
  AVFormatContext* fmt = nullptr;
  AVBSFContext* bsf = nullptr;  // length-prefixed H.264/H.265 -> Annex B
  AVPacket* pkt = nullptr;
  int stream = -1;
  Codec codec = Codec::H264;
  std::uint32_t width = 0, height = 0;
  std::int64_t frames = 0;  // for streams without timestamps
  bool eof = false;         // the file is exhausted; the filter is being drained
  bool new_stream = false;  // the next packet is the first since a reconnect
  std::uint64_t reconnects = 0;
  Heard heard;  // listen_to_libav() writes it from libav's thread

  // Bounds every blocking libavformat call on a live source: the callback
  // below ends it once `deadline_ns` passes or interrupt() was called.
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> deadline_ns{0};
  std::mutex mu;  // for the backoff's sleep, which interrupt() cuts short
  std::condition_variable wake;

  static int interrupted(void* opaque) {
    auto* s = static_cast<State*>(opaque);
    const std::uint64_t deadline = s->deadline_ns.load(std::memory_order_relaxed);
    return s->stop.load(std::memory_order_relaxed) || (deadline && base::monotonic_ns() > deadline) ? 1 : 0;
  }
  void arm() {
    deadline_ns.store(live ? base::monotonic_ns() + static_cast<std::uint64_t>(options.timeout.count()) * 1'000'000
                           : 0);
  }

  void close() {
    if (fmt && live) {
      HeardByContext& c = heard_by_context();
      std::lock_guard lock(c.mu);
      c.by_context.erase(fmt);
    }
    av().av_bsf_free(&bsf);
    av().avformat_close_input(&fmt);
    stream = -1;
    eof = false;
  }
  // Opens the source (again); throws Error naming it.
  void open();

  ~State() {
    av().av_packet_free(&pkt);
    close();
  }
};

void Demuxer::State::open() {
  close();
  fmt = av().avformat_alloc_context();
  if (!fmt) throw Error(Status::OutOfMemory, path + ": cannot allocate a demuxer");
  fmt->interrupt_callback = {&State::interrupted, this};
  heard.bye.store(false);
  if (live) {
    HeardByContext& c = heard_by_context();
    std::lock_guard lock(c.mu);
    c.by_context[fmt] = &heard;
  }
  AVDictionary* opts = nullptr;
  if (live) {
    const auto us = std::to_string(static_cast<std::int64_t>(options.timeout.count()) * 1000);
    av().av_dict_set(&opts, "timeout", us.c_str(), 0);  // RTSP, HTTP and UDP sockets, in µs
    if (rtsp) {
      if (options.transport == DemuxerOptions::Transport::Tcp) av().av_dict_set(&opts, "rtsp_transport", "tcp", 0);
      if (options.transport == DemuxerOptions::Transport::Udp) av().av_dict_set(&opts, "rtsp_transport", "udp", 0);
      av().av_dict_set(&opts, "allowed_media_types", "video", 0);
    }
  }
  arm();
  const std::uint64_t started = base::monotonic_ns();
  const void* context = fmt;
  int r = av().avformat_open_input(&fmt, path.c_str(), nullptr, &opts);  // frees fmt when it fails
  av().av_dict_free(&opts);
  if (r < 0) {
    if (live) {
      HeardByContext& c = heard_by_context();
      std::lock_guard lock(c.mu);
      c.by_context.erase(context);
    }
    if (stop.load()) throw Error(Status::Unavailable, path + ": interrupted");
    // Our deadline, or the socket's timeout, which libavformat reports as
    // whatever the protocol made of the silence.
    const bool timed_out = r == AVERROR_EXIT || base::monotonic_ns() - started >=
                                                    static_cast<std::uint64_t>(options.timeout.count()) * 1'000'000;
    std::string why = av_error(r);
    if (timed_out) why = "no answer within " + ms(options.timeout) + (r == AVERROR_EXIT ? "" : ": " + why);
    if (live) throw Error(Status::Unavailable, path + ": cannot open the stream (" + why + ")");
    throw Error(Status::InvalidArgument, path + ": not a media file libavformat can read (" + av_error(r) + ")");
  }
  arm();
  r = av().avformat_find_stream_info(fmt, nullptr);
  if (r < 0)
    throw Error(live ? Status::Unavailable : Status::InvalidArgument,
                path + ": cannot read stream information (" + av_error(r) + ")");
  for (unsigned i = 0; i < fmt->nb_streams && stream < 0; ++i) {
    const AVCodecParameters* par = fmt->streams[i]->codecpar;
    if (par->codec_type != AVMEDIA_TYPE_VIDEO) continue;
    switch (par->codec_id) {
      case AV_CODEC_ID_H264: codec = Codec::H264; break;
      case AV_CODEC_ID_HEVC: codec = Codec::H265; break;
      case AV_CODEC_ID_MJPEG: codec = Codec::Jpeg; break;
      default: continue;
    }
    stream = static_cast<int>(i);
    width = static_cast<std::uint32_t>(par->width);
    height = static_cast<std::uint32_t>(par->height);
  }
  if (stream < 0)
    throw Error(Status::Unsupported,
                path + ": no H.264, H.265 or JPEG video stream (format " + std::string(fmt->iformat->name) + ")");
  AVStream* st = fmt->streams[stream];
  // mp4 and mkv carry H.264/H.265 with length prefixes and the parameter
  // sets out of band: the filter turns them into an Annex B byte stream
  // (and passes Annex B input through unchanged).
  if (codec != Codec::Jpeg) {
    const AVBitStreamFilter* f =
        av().av_bsf_get_by_name(codec == Codec::H264 ? "h264_mp4toannexb" : "hevc_mp4toannexb");
    if (!f || av().av_bsf_alloc(f, &bsf) < 0)
      throw Error(Status::Unavailable, path + ": libavcodec lacks the Annex B filter");
    av().avcodec_parameters_copy(bsf->par_in, st->codecpar);
    bsf->time_base_in = st->time_base;
    r = av().av_bsf_init(bsf);
    if (r < 0)
      throw Error(Status::InvalidArgument, path + ": cannot convert the stream to Annex B (" + av_error(r) + ")");
  }
}

Demuxer::Demuxer(const std::string& path, const DemuxerOptions& options)
    : s_((load_ffmpeg(path), std::make_unique<State>())) {
  s_->path = path;
  s_->options = options;
  s_->live = is_url(path);
  s_->rtsp = path.rfind("rtsp://", 0) == 0;
  if (s_->live) {
    static std::once_flag network;
    std::call_once(network, [] {
      av().avformat_network_init();
      av().av_log_set_callback(listen_to_libav);
    });
    if (options.timeout.count() <= 0 || options.initial_backoff.count() <= 0 ||
        options.max_backoff < options.initial_backoff)
      throw Error(Status::InvalidArgument, path +
                                               ": DemuxerOptions needs a positive timeout and initial_backoff, and "
                                               "max_backoff at least initial_backoff");
  } else {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) throw Error(Status::NotFound, path + ": no such file");
  }
  s_->pkt = av().av_packet_alloc();
  if (!s_->pkt) throw Error(Status::OutOfMemory, path + ": cannot allocate a packet");
  s_->open();
}

Demuxer::~Demuxer() = default;
Demuxer::Demuxer(Demuxer&&) noexcept = default;
Demuxer& Demuxer::operator=(Demuxer&&) noexcept = default;

Codec Demuxer::codec() const { return s_->codec; }
std::uint32_t Demuxer::width() const { return s_->width; }
std::uint32_t Demuxer::height() const { return s_->height; }
const std::string& Demuxer::path() const { return s_->path; }
bool Demuxer::live() const { return s_->live; }
std::uint64_t Demuxer::reconnects() const { return s_->reconnects; }
std::uint64_t Demuxer::packets_lost() const { return s_->heard.lost.load(std::memory_order_relaxed); }

void Demuxer::interrupt() noexcept {
  {
    std::lock_guard lock(s_->mu);
    s_->stop.store(true);
  }
  s_->wake.notify_all();
}

std::optional<Demuxer::Packet> Demuxer::next() {
  State& s = *s_;
  auto take = [&](AVPacket* p) {
    Packet out;
    out.data.assign(reinterpret_cast<const std::byte*>(p->data), reinterpret_cast<const std::byte*>(p->data) + p->size);
    out.pts = p->pts != AV_NOPTS_VALUE ? p->pts : p->dts != AV_NOPTS_VALUE ? p->dts : s.frames;
    out.keyframe = (p->flags & AV_PKT_FLAG_KEY) != 0;
    if (p->flags & AV_PKT_FLAG_CORRUPT) s.heard.lost.fetch_add(1, std::memory_order_relaxed);  // MPEG-TS continuity
    out.new_stream = std::exchange(s.new_stream, false);
    out.arrival_ns = base::monotonic_ns();
    ++s.frames;
    av().av_packet_unref(p);
    return out;
  };
  // A live source that failed (`why`, naming it): open it again, backing
  // off, until it works, the attempts run out (Unavailable) or interrupt()
  // (false).
  auto reconnect = [&](std::string why) {
    auto backoff = s.options.initial_backoff;
    for (std::uint32_t attempt = 1;; ++attempt) {
      base::logger("hal")->warn("{}; opening it again in {} (attempt {})", why, ms(backoff), attempt);
      {
        std::unique_lock lock(s.mu);
        if (s.wake.wait_for(lock, backoff, [&] { return s.stop.load(); })) return false;
      }
      try {
        s.open();
        ++s.reconnects;
        s.new_stream = true;
        base::logger("hal")->info("{}: reconnected ({} {}x{})", s.path, to_string(s.codec), s.width, s.height);
        return true;
      } catch (const Error& e) {
        if (s.stop.load()) return false;
        why = e.what();
      }
      if (s.options.max_attempts && attempt >= s.options.max_attempts)
        throw Error(Status::Unavailable, why + "; gave up after " + std::to_string(attempt) + " attempt(s)");
      backoff = std::min(backoff * 2, s.options.max_backoff);
    }
  };
  for (;;) {
    if (s.stop.load()) return std::nullopt;
    if (s.bsf) {
      const int r = av().av_bsf_receive_packet(s.bsf, s.pkt);
      if (r == 0) {
        if (s.pkt->size == 0) {
          av().av_packet_unref(s.pkt);
          continue;
        }
        return take(s.pkt);
      }
      if (r == AVERROR_EOF) return std::nullopt;
      if (r != AVERROR(EAGAIN)) throw Error(Status::InvalidArgument, s.path + ": " + av_error(r));
    } else if (s.eof) {
      return std::nullopt;
    }
    if (s.eof) return std::nullopt;
    s.arm();
    const bool had_parser = av().av_stream_get_parser(s.fmt->streams[s.stream]) != nullptr;
    const int r = av().av_read_frame(s.fmt, s.pkt);
    if (r < 0 && s.live && !s.stop.load() && s.options.reconnect) {
      // Stalled (our deadline), dropped, or ended (an RTSP server's BYE):
      // a live source goes on with a new connection.
      const std::string why = r == AVERROR_EXIT  ? "no data for " + ms(s.options.timeout)
                              : r == AVERROR_EOF ? "the stream ended"
                                                 : av_error(r);
      if (!reconnect(s.path + ": " + why)) return std::nullopt;
      continue;
    }
    if (r < 0 && s.stop.load()) return std::nullopt;
    if (r == AVERROR_EOF) {
      s.eof = true;
      if (s.bsf) av().av_bsf_send_packet(s.bsf, nullptr);
      continue;
    }
    if (r < 0)
      throw Error(s.live ? Status::Unavailable : Status::InvalidArgument,
                  s.path + ": " + (r == AVERROR_EXIT ? "no data for " + ms(s.options.timeout) : av_error(r)));
    if (s.pkt->stream_index != s.stream) {
      av().av_packet_unref(s.pkt);
      continue;
    }
    if (s.rtsp && flushed_by_a_failed_read(s.fmt->streams[s.stream], had_parser) && !s.heard.bye.load()) {
      // The connection dropped or stalled without a BYE: the last unit may
      // be cut short, and the decoder would take what came for a corrupt
      // frame. It counts as lost (unless interrupt() ended the read); the
      // next read fails and reconnects.
      if (!s.stop.load()) {
        base::logger("hal")->warn(
            "{}: the stream broke off without its server's BYE; its last frame ({} bytes, "
            "perhaps cut short) is dropped",
            s.path, s.pkt->size);
        s.heard.lost.fetch_add(1, std::memory_order_relaxed);
      }
      av().av_packet_unref(s.pkt);
      continue;
    }
    if (!s.bsf) {
      if (s.pkt->size == 0) {
        av().av_packet_unref(s.pkt);
        continue;
      }
      return take(s.pkt);
    }
    const int b = av().av_bsf_send_packet(s.bsf, s.pkt);
    if (b < 0) {
      av().av_packet_unref(s.pkt);
      throw Error(Status::InvalidArgument, s.path + ": " + av_error(b));
    }
  }
}

}  // namespace tpuhal
