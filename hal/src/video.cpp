// VideoDecoder and Frame over driver::DecoderBackend.
#include <algorithm>
#include <mutex>

#include "impl.hpp"
#include "tpuhal/tpuhal.hpp"

namespace tpuhal {
namespace detail {

struct FrameState {
  Buffer buffer;
  std::uint32_t width = 0, height = 0;
  PixelFormat format = PixelFormat::NV12;
  std::int64_t pts = 0;
  std::uint64_t packet = 0, index = 0;
  std::optional<std::uint64_t> done_ns;
  std::uint32_t channel = 0;
  std::vector<Frame::Plane> planes;
};

class DecoderImpl {
 public:
  DecoderImpl(std::shared_ptr<DeviceImpl> device, std::shared_ptr<driver::DecoderBackend> backend,
              const VideoDecoderOptions& options)
      : device_(std::move(device)), backend_(std::move(backend)), options_(options) {}

  std::shared_ptr<DeviceImpl> device_;
  std::shared_ptr<driver::DecoderBackend> backend_;
  VideoDecoderOptions options_;
  std::mutex mu_;
  std::uint64_t sent_ = 0, received_ = 0;
  bool flushed_ = false, eos_ = false;

  std::string name() const { return device_->uri() + " video channel " + std::to_string(backend_->channel()); }

  Frame make_frame(driver::DecoderEvent& ev) {
    auto s = std::make_shared<FrameState>();
    s->buffer = Buffer(std::make_shared<BufferImpl>(device_, std::move(ev.buffer)));
    s->width = ev.width;
    s->height = ev.height;
    s->format = options_.format;
    s->pts = ev.pts;
    s->packet = ev.packet;
    s->done_ns = ev.done_ns;
    s->index = received_++;
    s->channel = backend_->channel();
    tracing::frame(device_, s->channel, s->pts, s->index, s->width, s->height);
    for (std::uint32_t p = 0; p < ev.planes; ++p)
      s->planes.push_back({ev.plane[p].offset, ev.plane[p].pitch, ev.plane[p].row_bytes, ev.plane[p].rows});
    return Frame(std::move(s));
  }

  // receive() (wait) and try_receive() (not): the caller holds mu_.
  std::optional<Frame> next(std::chrono::nanoseconds timeout, bool wait);
};

}  // namespace detail

namespace {

detail::DecoderImpl& checked(const std::shared_ptr<detail::DecoderImpl>& impl) {
  if (!impl) throw Error(Status::FailedPrecondition, "empty VideoDecoder handle");
  return *impl;
}
const detail::FrameState& checked(const std::shared_ptr<const detail::FrameState>& s) {
  if (!s) throw Error(Status::FailedPrecondition, "empty Frame handle");
  return *s;
}

}  // namespace

// ---- Frame -------------------------------------------------------------------

const Buffer& Frame::buffer() const { return checked(s_).buffer; }
std::uint32_t Frame::width() const { return checked(s_).width; }
std::uint32_t Frame::height() const { return checked(s_).height; }
PixelFormat Frame::format() const { return checked(s_).format; }
std::int64_t Frame::pts() const { return checked(s_).pts; }
std::uint64_t Frame::packet() const { return checked(s_).packet; }
std::optional<std::uint64_t> Frame::decoded_ns() const { return checked(s_).done_ns; }
std::uint64_t Frame::index() const { return checked(s_).index; }
std::uint32_t Frame::channel() const { return checked(s_).channel; }
std::span<const Frame::Plane> Frame::planes() const { return checked(s_).planes; }

Tensor Frame::luma() const {
  const auto& s = checked(s_);
  return Tensor(s.buffer, DType::U8, {s.height, s.width}, {s.planes[0].pitch, 1}, s.planes[0].offset);
}
Tensor Frame::chroma() const {
  const auto& s = checked(s_);
  if (s.format != PixelFormat::NV12)
    throw Error(Status::FailedPrecondition, "Frame::chroma(): the frame is I420; use u() and v()");
  return Tensor(s.buffer, DType::U8, {(s.height + 1) / 2, (s.width + 1) / 2, 2}, {s.planes[1].pitch, 2, 1},
                s.planes[1].offset);
}
Tensor Frame::u() const {
  const auto& s = checked(s_);
  if (s.format != PixelFormat::I420)
    throw Error(Status::FailedPrecondition, "Frame::u(): the frame is NV12; use chroma()");
  return Tensor(s.buffer, DType::U8, {(s.height + 1) / 2, (s.width + 1) / 2}, {s.planes[1].pitch, 1},
                s.planes[1].offset);
}
Tensor Frame::v() const {
  const auto& s = checked(s_);
  if (s.format != PixelFormat::I420)
    throw Error(Status::FailedPrecondition, "Frame::v(): the frame is NV12; use chroma()");
  return Tensor(s.buffer, DType::U8, {(s.height + 1) / 2, (s.width + 1) / 2}, {s.planes[2].pitch, 1},
                s.planes[2].offset);
}

// ---- VideoDecoder ----------------------------------------------------------------

VideoDecoder Device::open_decoder(const VideoDecoderOptions& o) {
  if (!impl_) throw Error(Status::FailedPrecondition, "empty Device handle");
  const Properties& p = impl_->backend().properties();
  const std::string& uri = impl_->uri();
  if (!p.caps.video_decode)
    throw Error(Status::Unsupported, uri + ": the board has no video decoder (caps.video_decode is false)");
  if (std::find(p.codecs.begin(), p.codecs.end(), o.codec) == p.codecs.end())
    throw Error(Status::Unsupported, uri + ": the board's decoder does not take " + to_string(o.codec));
  if (o.format != PixelFormat::NV12 && o.format != PixelFormat::I420)
    throw Error(Status::InvalidArgument, uri + ": unknown pixel format " + std::to_string(static_cast<int>(o.format)));
  if (o.max_width < 16 || o.max_height < 16 || o.max_width > 8192 || o.max_height > 8192)
    throw Error(Status::InvalidArgument, uri + ": max_width x max_height " + std::to_string(o.max_width) + "x" +
                                             std::to_string(o.max_height) + " is outside 16x16 .. 8192x8192");
  if (o.frame_buffers < 1 || o.frame_buffers > 64)
    throw Error(Status::InvalidArgument,
                uri + ": frame_buffers " + std::to_string(o.frame_buffers) + " is outside 1 .. 64");
  driver::DecoderConfig c;
  c.codec = o.codec;
  c.format = o.format;
  c.max_width = o.max_width;
  c.max_height = o.max_height;
  c.frame_buffers = o.frame_buffers;
  if (o.frame_buffer_wait.count() < 0)
    throw Error(Status::InvalidArgument,
                uri + ": frame_buffer_wait " + std::to_string(o.frame_buffer_wait.count()) + " ms is negative");
  c.frame_buffer_wait = o.frame_buffer_wait;
  return VideoDecoder(std::make_shared<detail::DecoderImpl>(impl_, impl_->backend().open_decoder(c), o));
}

std::uint32_t VideoDecoder::channel() const { return checked(impl_).backend_->channel(); }
const VideoDecoderOptions& VideoDecoder::options() const { return checked(impl_).options_; }
Device VideoDecoder::device() const { return Device(checked(impl_).device_); }

namespace {
void send_packet(detail::DecoderImpl& d, std::span<const std::byte> packet, std::int64_t pts,
                 std::optional<std::uint64_t> arrival_ns) {
  std::lock_guard lock(d.mu_);
  if (d.flushed_)
    throw Error(Status::FailedPrecondition, d.name() + ": send() after flush(); reset() to start a new stream");
  if (packet.empty())
    throw Error(Status::InvalidArgument, d.name() + ": an empty packet (use flush() to end the stream)");
  d.backend_->send(packet, pts, d.sent_, false, arrival_ns);
  ++d.sent_;
}
}  // namespace

void VideoDecoder::send(std::span<const std::byte> packet, std::int64_t pts) {
  send_packet(checked(impl_), packet, pts, std::nullopt);
}

void VideoDecoder::send(std::span<const std::uint8_t> packet, std::int64_t pts) { send(std::as_bytes(packet), pts); }

void VideoDecoder::send_at(std::uint64_t arrival_ns, std::span<const std::byte> packet, std::int64_t pts) {
  auto& d = checked(impl_);
  if (!d.device_->backend().properties().caps.wait_time)
    throw Error(Status::Unsupported,
                d.name() + ": send_at: the board cannot time packets on its clock (caps.wait_time)");
  if (arrival_ns > (1ull << 62))
    throw Error(Status::InvalidArgument,
                d.name() + ": send_at: board time " + std::to_string(arrival_ns) + " ns is past 2^62");
  send_packet(d, packet, pts, arrival_ns);
}

void VideoDecoder::send_at(std::uint64_t arrival_ns, std::span<const std::uint8_t> packet, std::int64_t pts) {
  send_at(arrival_ns, std::as_bytes(packet), pts);
}

void VideoDecoder::flush() {
  auto& d = checked(impl_);
  std::lock_guard lock(d.mu_);
  if (d.flushed_) return;
  d.backend_->send({}, 0, d.sent_, true, std::nullopt);
  d.flushed_ = true;
}

std::optional<Frame> VideoDecoder::receive() { return receive(checked(impl_).device_->default_timeout()); }

std::optional<Frame> VideoDecoder::try_receive() {
  auto& d = checked(impl_);
  std::lock_guard lock(d.mu_);
  return d.next(std::chrono::nanoseconds(0), false);
}

std::optional<Frame> VideoDecoder::receive(std::chrono::nanoseconds timeout) {
  auto& d = checked(impl_);
  std::lock_guard lock(d.mu_);
  return d.next(timeout, true);
}

std::optional<Frame> detail::DecoderImpl::next(std::chrono::nanoseconds timeout, bool wait) {
  auto& d = *this;
  for (;;) {
    if (d.eos_) return std::nullopt;
    driver::DecoderEvent ev = d.backend_->receive(timeout);
    switch (ev.kind) {
      case driver::DecoderEvent::Kind::Frame: return d.make_frame(ev);
      case driver::DecoderEvent::Kind::Error: throw *ev.error;
      case driver::DecoderEvent::Kind::EndOfStream: d.eos_ = true; return std::nullopt;
      case driver::DecoderEvent::Kind::Interrupted: return std::nullopt;
      case driver::DecoderEvent::Kind::NeedInput:
        // After flush() the board has taken the end-of-stream marker too:
        // the stream is over.
        d.eos_ = d.flushed_;
        return std::nullopt;
      case driver::DecoderEvent::Kind::Timeout:
        if (!wait) return std::nullopt;
        // The backend may say where the board is stuck.
        throw Error(Status::Timeout,
                    d.name() + ": no progress for " +
                        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()) +
                        " ms with " + std::to_string(d.sent_) + " packets sent and " + std::to_string(d.received_) +
                        " frames received" + (ev.error ? std::string("; ") + ev.error->what() : std::string()));
    }
  }
}

void VideoDecoder::interrupt() noexcept {
  // Not under the decoder's lock: the receive() it ends holds it.
  if (impl_) impl_->backend_->interrupt();
}

bool VideoDecoder::end_of_stream() const {
  auto& d = checked(impl_);
  std::lock_guard lock(d.mu_);
  return d.eos_;
}

void VideoDecoder::reset() {
  auto& d = checked(impl_);
  std::lock_guard lock(d.mu_);
  d.backend_->reset();
  d.sent_ = d.received_ = 0;
  d.flushed_ = d.eos_ = false;
}

std::uint64_t VideoDecoder::packets_sent() const {
  auto& d = checked(impl_);
  std::lock_guard lock(d.mu_);
  return d.sent_;
}

std::uint64_t VideoDecoder::frames_received() const {
  auto& d = checked(impl_);
  std::lock_guard lock(d.mu_);
  return d.received_;
}

}  // namespace tpuhal
