// Video decoding on the board's codec unit: packets in, frames out in device
// memory, where tensor ops read them with no copy to the host.
//
//   tpuhal::Demuxer in("cam0.mp4");
//   tpuhal::VideoDecoder dec = dev.open_decoder({.codec = in.codec()});
//   while (auto pkt = in.next()) {
//     dec.send(pkt->data, pkt->pts);
//     while (auto frame = dec.receive()) use(*frame);   // nullopt: needs more input
//   }
//   dec.flush();
//   while (auto frame = dec.receive()) use(*frame);     // the frames still inside
//
// A decoder is one channel of the board's codec unit; channels decode in
// parallel on the unit's shared decode threads. A VideoDecoder is safe to
// use from several threads (calls on one decoder are serialised); frames
// may be used and dropped on any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tpuhal/export.hpp"
#include "tpuhal/ops.hpp"
#include "tpuhal/tpuhal.hpp"
#include "tpuhal/types.hpp"

namespace tpuhal {

namespace detail {
struct FrameState;
class DecoderImpl;
}  // namespace detail

// A decoded picture in device memory, in display order. It holds one of its
// channel's frame buffers until the last copy of it is dropped: keep frames
// only as long as needed (VideoDecoderOptions::frame_buffers of them at most).
class TPUHAL_API Frame {
 public:
  struct Plane {
    std::uint64_t offset;     // bytes into buffer()
    std::uint32_t pitch;      // bytes from one row to the next
    std::uint32_t row_bytes;  // bytes of each row that hold pixels
    std::uint32_t rows;
  };

  const Buffer& buffer() const;  // Memory::Device
  std::uint32_t width() const;
  std::uint32_t height() const;
  PixelFormat format() const;
  std::int64_t pts() const;      // the pts sent with the packet it came from
  std::uint64_t packet() const;  // index of that packet (0-based, in send order)
  std::uint64_t index() const;   // frames before it on this decoder since open or reset
  // Board time (ns since its reset) at which the codec unit finished the
  // frame: on a modelled clock, the model's (docs/timing.md). Work timed to
  // the board starts after it (Batch::wait_until). nullopt without
  // caps.wait_time.
  std::optional<std::uint64_t> decoded_ns() const;
  std::uint32_t channel() const;
  std::span<const Plane> planes() const;  // NV12: Y, UV; I420: Y, U, V

  // Tensor views of the planes (u8), for ops such as ops::nv12_to_rgb:
  // luma [H, W]; NV12 chroma [ceil(H/2), ceil(W/2), 2]; I420 u, v
  // [ceil(H/2), ceil(W/2)].
  Tensor luma() const;
  Tensor chroma() const;  // NV12 only
  Tensor u() const;       // I420 only
  Tensor v() const;       // I420 only

 private:
  friend class detail::DecoderImpl;
  friend class VideoDecoder;
  explicit Frame(std::shared_ptr<const detail::FrameState> s) : s_(std::move(s)) {}
  std::shared_ptr<const detail::FrameState> s_;
};

class TPUHAL_API VideoDecoder {
 public:
  VideoDecoder() = default;

  std::uint32_t channel() const;
  const VideoDecoderOptions& options() const;
  Device device() const;

  // Sends one packet: Annex B bytes (an access unit, or any run of whole NAL
  // units) for H.264 and H.265, a whole JPEG file for JPEG. The bytes are
  // copied before it returns. `pts` comes back on the frames the packet
  // gives. Throws FailedPrecondition after flush() until reset(), and
  // ResourceExhausted when the caller holds every frame buffer while the
  // board has frames waiting for one.
  void send(std::span<const std::byte> packet, std::int64_t pts = 0);
  void send(std::span<const std::uint8_t> packet, std::int64_t pts = 0);
  // The same for a packet that arrives at board time `arrival_ns` (ns since
  // the board's reset; Device::board_time_ns() says where the board's clock
  // is): the codec unit takes it no earlier, as a camera's frame arrives at
  // its time (caps.wait_time; Unsupported without). At most 2^62.
  void send_at(std::uint64_t arrival_ns, std::span<const std::byte> packet, std::int64_t pts = 0);
  void send_at(std::uint64_t arrival_ns, std::span<const std::uint8_t> packet, std::int64_t pts = 0);

  // End of stream: the frames the decoder still holds (reordering) come out,
  // then receive() returns nullopt and end_of_stream() is true.
  void flush();

  // The next frame, waiting for the board while it still has work from the
  // packets sent. Returns nullopt when nothing more will come without more
  // packets (or after the end of stream), or when interrupt() ended the
  // wait. A packet that does not decode
  // throws Error (InvalidArgument for corrupt or truncated data, Unsupported
  // for a stream the unit does not take, OutOfRange for a frame larger than
  // max_width x max_height) naming the device, the channel and the packet;
  // the decoder keeps going with the packets after it. Throws Timeout if the
  // board makes no progress for `timeout` (default: the device's wait
  // timeout). When the caller holds every frame buffer and the board has a
  // frame for one, waits up to VideoDecoderOptions::frame_buffer_wait for
  // one to be dropped, then throws ResourceExhausted.
  std::optional<Frame> receive();
  std::optional<Frame> receive(std::chrono::nanoseconds timeout);

  // The next frame if the board has published one, else nullopt at once:
  // never waits. For callers that keep many packets in flight (send several,
  // collect what is ready, block in receive() only at the end). Errors and
  // the end of the stream come out as from receive().
  std::optional<Frame> try_receive();

  bool end_of_stream() const;

  // From any thread: a receive() in progress (waiting for the board or for
  // a frame buffer) returns nullopt soon; with none in progress, the next
  // one does, at once. reset() forgets an interrupt not yet seen. For a
  // pipeline's flush or stop while its streaming thread waits here.
  void interrupt() noexcept;

  // Drops packets and frames still inside and starts a new stream; frames
  // already received stay valid.
  void reset();

  std::uint64_t packets_sent() const;
  std::uint64_t frames_received() const;

 private:
  friend class Device;
  explicit VideoDecoder(std::shared_ptr<detail::DecoderImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<detail::DecoderImpl> impl_;
};

// How a Demuxer reads a live source (a URL: rtsp://, http://, udp://, ...).
// Files ignore it.
struct DemuxerOptions {
  enum class Transport : std::uint8_t { Auto, Tcp, Udp };
  Transport transport = Transport::Auto;  // RTSP's: Auto tries UDP, then TCP
  // A source that brings nothing for this long has stalled (opening it
  // included).
  std::chrono::milliseconds timeout{5000};
  // A live source that stalls, drops or ends is opened again, after
  // initial_backoff, doubling up to max_backoff between attempts; next()
  // gives up after max_attempts failed attempts in a row (0: never).
  bool reconnect = true;
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{5000};
  std::uint32_t max_attempts = 0;
};

// Reads a video or image with libavformat, from a file (mp4, mkv, raw
// .h264/.h265, .jpg, ...) or a live URL (rtsp://, http://, udp://), and
// returns its packets ready for VideoDecoder::send: H.264 and H.265 in Annex
// B (length-prefixed streams from mp4/mkv are converted), JPEG as whole
// files. Not thread-safe, except interrupt().
class TPUHAL_API Demuxer {
 public:
  struct Packet {
    std::vector<std::byte> data;
    std::int64_t pts = 0;  // in the stream's time base; raw streams count frames
    bool keyframe = false;
    // The first packet after a live source was opened again: the stream
    // may have a new codec or size (codec(), width(), height() say which).
    // Reset the decoder, or open a new one, before sending it.
    bool new_stream = false;
    std::uint64_t arrival_ns = 0;  // when it was read (CLOCK_MONOTONIC)
  };

  // Throws NotFound (no such file), InvalidArgument (not a media file), or
  // Unsupported (no H.264, H.265 or JPEG stream in it), naming the source;
  // Unavailable for a URL that cannot be opened within options.timeout.
  explicit Demuxer(const std::string& source, const DemuxerOptions& options = {});
  ~Demuxer();
  Demuxer(Demuxer&&) noexcept;
  Demuxer& operator=(Demuxer&&) noexcept;
  Demuxer(const Demuxer&) = delete;
  Demuxer& operator=(const Demuxer&) = delete;

  Codec codec() const;
  std::uint32_t width() const;  // 0 where a live source does not say
  std::uint32_t height() const;
  const std::string& path() const;
  bool live() const;                 // a URL, not a file
  std::uint64_t reconnects() const;  // times a live source was opened again
  // Packets lost, as far as the transport can tell: RTP over UDP (the
  // sequence-number gaps libavformat reports, which need not be all of
  // them), MPEG-TS (continuity errors), and the unit an RTSP connection
  // broke off inside (it drops or stalls without the server's BYE): that
  // unit is dropped, not handed on cut short. TCP itself loses nothing.
  // Counting installs a libav log callback (av_log_set_callback) that
  // passes every message on to libav's default one; an application that
  // installs its own after opening a live Demuxer turns the count off, and
  // then every RTSP stream's last unit counts as broken off.
  std::uint64_t packets_lost() const;

  // The next packet of the video stream; nullopt at the end of a file, or
  // once interrupt() was called. A live source that stalls, drops or ends
  // is reconnected here (DemuxerOptions); Unavailable when the attempts run
  // out. Throws InvalidArgument if a file is damaged.
  std::optional<Packet> next();

  // From any thread: makes a next() blocked on a live source (or waiting to
  // reconnect) return nullopt soon, and every later one at once.
  void interrupt() noexcept;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace tpuhal
