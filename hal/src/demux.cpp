// Demuxer: files to Annex B / JPEG packets with libavformat.
#include <cerrno>
#include <filesystem>

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavcodec/bsf.h>
#include <libavformat/avformat.h>
#include <libavutil/error.h>
}

#include "tpuhal/tpuhal.hpp"

namespace tpuhal {

namespace {
std::string av_error(int code) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {};
  av_strerror(code, buf, sizeof buf);
  return buf;
}
}  // namespace

struct Demuxer::State {
  std::string path;
  AVFormatContext* fmt = nullptr;
  AVBSFContext* bsf = nullptr;  // length-prefixed H.264/H.265 -> Annex B
  AVPacket* pkt = nullptr;
  int stream = -1;
  Codec codec = Codec::H264;
  std::uint32_t width = 0, height = 0;
  std::int64_t frames = 0;  // for streams without timestamps
  bool eof = false;         // the file is exhausted; the filter is being drained

  ~State() {
    av_packet_free(&pkt);
    av_bsf_free(&bsf);
    avformat_close_input(&fmt);
  }
};

Demuxer::Demuxer(const std::string& path) : s_(std::make_unique<State>()) {
  s_->path = path;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw Error(Status::NotFound, path + ": no such file");
  int r = avformat_open_input(&s_->fmt, path.c_str(), nullptr, nullptr);
  if (r < 0)
    throw Error(Status::InvalidArgument, path + ": not a media file libavformat can read (" + av_error(r) + ")");
  r = avformat_find_stream_info(s_->fmt, nullptr);
  if (r < 0) throw Error(Status::InvalidArgument, path + ": cannot read stream information (" + av_error(r) + ")");
  for (unsigned i = 0; i < s_->fmt->nb_streams && s_->stream < 0; ++i) {
    const AVCodecParameters* par = s_->fmt->streams[i]->codecpar;
    if (par->codec_type != AVMEDIA_TYPE_VIDEO) continue;
    switch (par->codec_id) {
      case AV_CODEC_ID_H264: s_->codec = Codec::H264; break;
      case AV_CODEC_ID_HEVC: s_->codec = Codec::H265; break;
      case AV_CODEC_ID_MJPEG: s_->codec = Codec::Jpeg; break;
      default: continue;
    }
    s_->stream = static_cast<int>(i);
    s_->width = static_cast<std::uint32_t>(par->width);
    s_->height = static_cast<std::uint32_t>(par->height);
  }
  if (s_->stream < 0)
    throw Error(Status::Unsupported,
                path + ": no H.264, H.265 or JPEG video stream (format " + std::string(s_->fmt->iformat->name) + ")");
  AVStream* st = s_->fmt->streams[s_->stream];
  // mp4 and mkv carry H.264/H.265 with length prefixes and the parameter
  // sets out of band: the filter turns them into an Annex B byte stream
  // (and passes Annex B input through unchanged).
  if (s_->codec != Codec::Jpeg) {
    const AVBitStreamFilter* f = av_bsf_get_by_name(s_->codec == Codec::H264 ? "h264_mp4toannexb" : "hevc_mp4toannexb");
    if (!f || av_bsf_alloc(f, &s_->bsf) < 0)
      throw Error(Status::Unavailable, path + ": libavcodec lacks the Annex B filter");
    avcodec_parameters_copy(s_->bsf->par_in, st->codecpar);
    s_->bsf->time_base_in = st->time_base;
    r = av_bsf_init(s_->bsf);
    if (r < 0)
      throw Error(Status::InvalidArgument, path + ": cannot convert the stream to Annex B (" + av_error(r) + ")");
  }
  s_->pkt = av_packet_alloc();
}

Demuxer::~Demuxer() = default;
Demuxer::Demuxer(Demuxer&&) noexcept = default;
Demuxer& Demuxer::operator=(Demuxer&&) noexcept = default;

Codec Demuxer::codec() const { return s_->codec; }
std::uint32_t Demuxer::width() const { return s_->width; }
std::uint32_t Demuxer::height() const { return s_->height; }
const std::string& Demuxer::path() const { return s_->path; }

std::optional<Demuxer::Packet> Demuxer::next() {
  State& s = *s_;
  auto take = [&](AVPacket* p) {
    Packet out;
    out.data.assign(reinterpret_cast<const std::byte*>(p->data), reinterpret_cast<const std::byte*>(p->data) + p->size);
    out.pts = p->pts != AV_NOPTS_VALUE ? p->pts : p->dts != AV_NOPTS_VALUE ? p->dts : s.frames;
    out.keyframe = (p->flags & AV_PKT_FLAG_KEY) != 0;
    ++s.frames;
    av_packet_unref(p);
    return out;
  };
  for (;;) {
    if (s.bsf) {
      const int r = av_bsf_receive_packet(s.bsf, s.pkt);
      if (r == 0) {
        if (s.pkt->size == 0) {
          av_packet_unref(s.pkt);
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
    const int r = av_read_frame(s.fmt, s.pkt);
    if (r == AVERROR_EOF) {
      s.eof = true;
      if (s.bsf) av_bsf_send_packet(s.bsf, nullptr);
      continue;
    }
    if (r < 0) throw Error(Status::InvalidArgument, s.path + ": " + av_error(r));
    if (s.pkt->stream_index != s.stream) {
      av_packet_unref(s.pkt);
      continue;
    }
    if (!s.bsf) {
      if (s.pkt->size == 0) {
        av_packet_unref(s.pkt);
        continue;
      }
      return take(s.pkt);
    }
    const int b = av_bsf_send_packet(s.bsf, s.pkt);
    if (b < 0) {
      av_packet_unref(s.pkt);
      throw Error(Status::InvalidArgument, s.path + ": " + av_error(b));
    }
  }
}

}  // namespace tpuhal
