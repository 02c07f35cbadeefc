// Video decoding (tpuhal/video.hpp): Device.open_decoder(), tpuhal.VideoDecoder,
// tpuhal.Frame, tpuhal.Demuxer and tpuhal.Packet. The package's __init__.py
// adds VideoDecoder.decode(), the generator that feeds packets and yields
// frames.
//
// Every call that may wait (open_decoder, send, flush, receive, reset,
// Demuxer reads, frame downloads) runs without the GIL.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <mutex>

#include "common.hpp"
#include "transfer.hpp"

namespace tpuhal::python {
namespace {

// tpuhal.VideoDecoder: a channel of the codec unit until close().
struct PyDecoder {
  explicit PyDecoder(VideoDecoder d) : decoder(std::move(d)), channel(decoder.channel()), uri(decoder.device().uri()) {}
  ~PyDecoder() { close(); }
  PyDecoder(const PyDecoder&) = delete;
  PyDecoder& operator=(const PyDecoder&) = delete;

  // A handle to use without the GIL: close() on another thread cannot pull
  // it from under a call in progress.
  VideoDecoder get(const char* use) const {
    std::lock_guard lock(mu);
    if (closed)
      fail(Status::FailedPrecondition, std::string(use) + ": decoder channel " + std::to_string(channel) + " on " +
                                           uri + " is closed (VideoDecoder.close() or the end of its with block)");
    return decoder;
  }
  void close() {
    VideoDecoder d;
    {
      std::lock_guard lock(mu);
      if (closed) return;
      closed = true;
      d = std::move(decoder);
      decoder = VideoDecoder();
    }
    if (python_alive() && PyGILState_Check()) {
      PythonFramesKept frames;  // reports made meanwhile name the Python line
      py::gil_scoped_release release;
      d = VideoDecoder();
    }
  }

  mutable std::mutex mu;
  VideoDecoder decoder;
  bool closed = false;
  std::uint32_t channel;
  std::string uri;
};
using DecoderRef = std::shared_ptr<PyDecoder>;

// tpuhal.Frame. Its Buffer (made on first use) keeps a copy of the Frame as
// the "owner" of its memory, so that tensors and queued work using the
// buffer hold the frame buffer, and the channel cannot reuse it under them.
struct PyFrame {
  explicit PyFrame(Frame f) : frame(std::move(f)) {}

  const BufferRef& buffer() {
    if (!buffer_ref) {
      Keep hold = std::make_shared<const Frame>(frame);
      buffer_ref = std::make_shared<PyBuffer>(frame.buffer(), std::move(hold));
    }
    return buffer_ref;
  }
  PyTensor view(const Tensor& t) { return {t, buffer()}; }

  Frame frame;
  BufferRef buffer_ref;
};
using FrameRef = std::shared_ptr<PyFrame>;

// tpuhal.Demuxer: not thread-safe in C++, so calls are serialised here.
struct PyDemuxer {
  std::mutex mu;
  std::optional<Demuxer> demuxer;
};

// tpuhal.Packet: one packet of a Demuxer, ready for VideoDecoder.send().
struct PyPacket {
  py::bytes data;
  std::int64_t pts = 0;
  bool keyframe = false;
  bool new_stream = false;
  std::uint64_t arrival_ns = 0;
};

// The bytes of a buffer-protocol object (bytes, bytearray, memoryview,
// a C-contiguous NumPy array, a Packet's data).
struct PacketBytes {
  explicit PacketBytes(const py::handle& obj) {
    if (!PyObject_CheckBuffer(obj.ptr()))
      throw py::type_error(
          "send: the packet must be bytes or a buffer-protocol object (bytearray, memoryview, "
          "numpy.ndarray, Packet), not " +
          type_name(obj));
    if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Clear();
      fail(Status::InvalidArgument, "send: the packet's " + type_name(obj) +
                                        " is not C-contiguous; pass bytes(...) or numpy.ascontiguousarray(...)");
    }
  }
  ~PacketBytes() { PyBuffer_Release(&view); }
  PacketBytes(const PacketBytes&) = delete;
  PacketBytes& operator=(const PacketBytes&) = delete;
  std::span<const std::byte> span() const {
    return {static_cast<const std::byte*>(view.buf), static_cast<std::size_t>(view.len)};
  }
  Py_buffer view{};
};

py::object receive(const DecoderRef& self, const py::object& timeout) {
  VideoDecoder d = self->get("receive");
  std::optional<Frame> f;
  if (timeout.is_none()) {
    f = without_gil([&] { return d.receive(); });
  } else {
    const auto t = to_duration(timeout, "timeout");
    f = without_gil([&] { return d.receive(t); });
  }
  if (!f) return py::none();
  return py::cast(std::make_shared<PyFrame>(std::move(*f)));
}

py::object try_receive(const DecoderRef& self) {
  VideoDecoder d = self->get("try_receive");
  std::optional<Frame> f = without_gil([&] { return d.try_receive(); });
  if (!f) return py::none();
  return py::cast(std::make_shared<PyFrame>(std::move(*f)));
}

void send(const DecoderRef& self, const py::object& packet, const py::object& pts,
          std::optional<std::uint64_t> arrival_ns) {
  VideoDecoder d = self->get("send");
  py::object data = packet;
  std::int64_t p = 0;
  if (py::isinstance<PyPacket>(packet)) {
    const auto& pk = packet.cast<const PyPacket&>();
    data = pk.data;
    p = pk.pts;
  }
  if (!pts.is_none()) p = pts.cast<std::int64_t>();
  PacketBytes bytes(data);
  without_gil([&] {
    if (arrival_ns)
      d.send_at(*arrival_ns, bytes.span(), p);
    else
      d.send(bytes.span(), p);
  });
}

// Frame.to_numpy(): the planes in one read of the bytes they span, then each
// row into a tight array; all without the GIL.
py::tuple to_numpy(const FrameRef& self, const std::optional<QueueRef>& queue) {
  const Frame& f = self->frame;
  const auto planes = f.planes();
  if (planes.empty()) return py::tuple();
  std::uint64_t lo = planes[0].offset, hi = 0;
  for (const auto& p : planes) {
    lo = std::min(lo, p.offset);
    if (p.rows) hi = std::max(hi, p.offset + std::uint64_t(p.pitch) * (p.rows - 1) + p.row_bytes);
  }
  const bool nv12 = f.format() == PixelFormat::NV12;
  std::vector<py::array_t<std::uint8_t>> arrays;
  std::vector<std::uint8_t*> dst;
  for (std::size_t i = 0; i < planes.size(); ++i) {
    const auto& p = planes[i];
    std::vector<py::ssize_t> shape{py::ssize_t(p.rows), py::ssize_t(p.row_bytes)};
    if (nv12 && i == 1) shape = {py::ssize_t(p.rows), py::ssize_t(p.row_bytes / 2), 2};
    arrays.emplace_back(shape);
    dst.push_back(arrays.back().mutable_data());
  }
  const Queue* q = queue && *queue ? &(*queue)->queue : nullptr;
  Frame keep = f;  // the frame buffer stays this frame's while the bytes move
  without_gil([&] {
    auto t = Transfers::shared(keep.buffer().device());
    std::vector<std::byte> bytes(hi > lo ? hi - lo : 0);
    if (!bytes.empty()) t->read(keep.buffer(), lo, bytes.data(), bytes.size(), q);
    for (std::size_t i = 0; i < planes.size(); ++i) {
      const auto& p = planes[i];
      for (std::uint32_t r = 0; r < p.rows; ++r)
        std::memcpy(dst[i] + std::size_t(r) * p.row_bytes, bytes.data() + (p.offset - lo) + std::size_t(r) * p.pitch,
                    p.row_bytes);
    }
  });
  py::tuple out(arrays.size());
  for (std::size_t i = 0; i < arrays.size(); ++i) out[i] = arrays[i];
  return out;
}

std::string describe(const Frame& f) {
  return std::to_string(f.width()) + "x" + std::to_string(f.height()) + " " + to_string(f.format()) +
         ", pts=" + std::to_string(f.pts()) + ", packet " + std::to_string(f.packet()) + ", index " +
         std::to_string(f.index()) + ", channel " + std::to_string(f.channel());
}

}  // namespace

void bind_video(py::module_& m) {
  // ---- Device.open_decoder ----
  auto dev = py::reinterpret_borrow<py::class_<PyDevice, std::shared_ptr<PyDevice>>>(m.attr("Device"));
  dev.def(
      "open_decoder",
      [](const PyDevice& d, py::handle codec, py::handle format, std::uint32_t max_width, std::uint32_t max_height,
         std::uint32_t frame_buffers, py::handle frame_buffer_wait) {
        Device device = d.get();
        VideoDecoderOptions o;
        o.codec = to_codec(codec);
        o.format = to_pixel_format(format);
        o.max_width = max_width;
        o.max_height = max_height;
        o.frame_buffers = frame_buffers;
        o.frame_buffer_wait =
            std::chrono::duration_cast<std::chrono::milliseconds>(to_duration(frame_buffer_wait, "frame_buffer_wait"));
        VideoDecoder dec = without_gil([&] { return device.open_decoder(o); });
        return std::make_shared<PyDecoder>(std::move(dec));
      },
      py::arg("codec") = "h264", py::kw_only(), py::arg("format") = "nv12", py::arg("max_width") = 1920,
      py::arg("max_height") = 1088, py::arg("frame_buffers") = 4, py::arg("frame_buffer_wait") = 0,
      "Opens one channel of the board's codec unit (Properties.decode_channels, Properties.codecs): a "
      "VideoDecoder for `codec` ('h264', 'h265', 'jpeg' or a tpuhal.Codec; Demuxer.codec gives a file's) "
      "giving frames in `format` ('nv12' or 'i420'). Frames larger than max_width x max_height are errors; "
      "`frame_buffers` (1..64) is how many frames the caller may hold at once plus the ones the board is "
      "writing. When the caller holds them all and the board has a frame for one, receive() waits up to "
      "`frame_buffer_wait` (seconds or a timedelta; default 0: not at all) for a frame to be dropped, then "
      "raises tpuhal.ResourceExhausted. Usable as a context manager; close() gives the channel back. Raises "
      "tpuhal.Unsupported "
      "without video decoding or for a codec the board lacks, tpuhal.ResourceExhausted when every channel "
      "is open, tpuhal.InvalidArgument for bad options.");

  // ---- VideoDecoder ----
  py::class_<PyDecoder, DecoderRef>(
      m, "VideoDecoder",
      "One channel of the board's codec unit (Device.open_decoder()): packets in, frames out in device "
      "memory, in display order. decode(packets) is the simple way to use it; send()/flush()/receive() "
      "the step-by-step one. Safe to use from several threads (calls on one decoder are serialised); "
      "a context manager that closes the channel at the end of the block.")
      .def("send", &send, py::arg("packet"), py::arg("pts") = py::none(), py::kw_only(),
           py::arg("arrival_ns") = py::none(),
           "Sends one packet: bytes or any C-contiguous buffer-protocol object holding Annex B data (an "
           "access unit, or any run of whole NAL units) for H.264 and H.265, a whole JPEG file for JPEG, or "
           "a tpuhal.Packet (whose pts is used unless `pts` is given). The bytes are copied before it "
           "returns. `pts` (default 0) comes back on the frames the packet gives. With `arrival_ns` (a board "
           "time, caps.wait_time) the codec unit takes the packet no earlier, as a camera's frame arrives at "
           "its time. Releases the GIL. Raises "
           "tpuhal.FailedPrecondition after flush() until reset(), tpuhal.ResourceExhausted when the caller "
           "holds every frame buffer while the board has frames waiting for one.")
      .def(
          "flush",
          [](const DecoderRef& self) {
            VideoDecoder d = self->get("flush");
            without_gil([&] { d.flush(); });
          },
          "End of stream: the frames the decoder still holds (reordering) come out of receive(), then "
          "receive() returns None and end_of_stream is True.")
      .def("receive", &receive, py::arg("timeout") = py::none(),
           "The next frame (a tpuhal.Frame), waiting for the board while it still has work from the packets "
           "sent; None when nothing more will come without more packets (or after the end of stream). "
           "Releases the GIL while it waits. A packet that does not decode raises tpuhal.Error naming the "
           "device, the channel and the packet ('packet N'): tpuhal.InvalidArgument for corrupt or truncated "
           "data, tpuhal.Unsupported for a stream the unit does not take, tpuhal.OutOfRange for a frame "
           "larger than max_width x max_height; the decoder keeps going with the packets after it. Raises "
           "tpuhal.Timeout if the board makes no progress for `timeout` (seconds or a timedelta; default: the "
           "device's wait timeout). When every frame buffer is held, it waits up to frame_buffer_wait for one "
           "to be dropped, then raises tpuhal.ResourceExhausted; interrupt() ends a wait early (None).")
      .def(
          "interrupt",
          [](const DecoderRef& self) {
            VideoDecoder d = self->get("interrupt");
            d.interrupt();
          },
          "From any thread: a receive() in progress (waiting for the board or for a frame buffer) returns None "
          "soon; with none in progress, the next one does, at once. reset() forgets an interrupt not yet seen.")
      .def("try_receive", &try_receive,
           "The next frame if the board has published one, else None at once: never waits. For keeping "
           "several packets in flight (send a few, collect what is ready, block in receive() only at the "
           "end). Errors and the end of the stream come out as from receive().")
      .def(
          "reset",
          [](const DecoderRef& self) {
            VideoDecoder d = self->get("reset");
            without_gil([&] { d.reset(); });
          },
          "Drops packets and frames still inside and starts a new stream (also after flush()); frames "
          "already received stay valid.")
      .def("close", &PyDecoder::close,
           "Gives the channel back (once the frames received from it are gone too). Frames already received "
           "stay valid. Calling it twice is harmless.")
      .def_property_readonly(
          "closed",
          [](const PyDecoder& d) {
            std::lock_guard lock(d.mu);
            return d.closed;
          },
          "True once closed.")
      .def_property_readonly(
          "channel", [](const PyDecoder& d) { return d.channel; }, "The codec unit's channel number.")
      .def_property_readonly(
          "codec", [](const PyDecoder& d) { return from_codec(d.get("codec").options().codec); },
          "The tpuhal.Codec it decodes.")
      .def_property_readonly(
          "format", [](const PyDecoder& d) { return from_pixel_format(d.get("format").options().format); },
          "The tpuhal.PixelFormat of its frames.")
      .def_property_readonly(
          "max_width", [](const PyDecoder& d) { return d.get("max_width").options().max_width; },
          "The widest frame it takes.")
      .def_property_readonly(
          "max_height", [](const PyDecoder& d) { return d.get("max_height").options().max_height; },
          "The tallest frame it takes.")
      .def_property_readonly(
          "frame_buffers", [](const PyDecoder& d) { return d.get("frame_buffers").options().frame_buffers; },
          "Frame buffers of the channel.")
      .def_property_readonly(
          "frame_buffer_wait",
          [](const PyDecoder& d) {
            return static_cast<double>(d.get("frame_buffer_wait").options().frame_buffer_wait.count()) / 1000.0;
          },
          "Seconds receive() waits for a frame buffer to be dropped when the caller holds them all.")
      .def_property_readonly(
          "end_of_stream", [](const PyDecoder& d) { return d.get("end_of_stream").end_of_stream(); },
          "True once flush() was called and every frame came out.")
      .def_property_readonly(
          "packets_sent", [](const PyDecoder& d) { return d.get("packets_sent").packets_sent(); },
          "Packets sent since open or reset().")
      .def_property_readonly(
          "frames_received", [](const PyDecoder& d) { return d.get("frames_received").frames_received(); },
          "Frames received since open or reset().")
      .def("__enter__", [](const DecoderRef& d) { return d; })
      .def(
          "__exit__", [](PyDecoder& d, const py::args&) { d.close(); }, "Closes the decoder.")
      .def("__repr__", [](const PyDecoder& d) {
        std::lock_guard lock(d.mu);
        std::string s = "<tpuhal.VideoDecoder channel " + std::to_string(d.channel) + " on " + d.uri;
        if (d.closed) return s + " (closed)>";
        const auto& o = d.decoder.options();
        return s + ": " + to_string(o.codec) + " -> " + to_string(o.format) + ", " +
               std::to_string(d.decoder.packets_sent()) + " packets sent, " +
               std::to_string(d.decoder.frames_received()) + " frames received>";
      });

  // ---- Frame ----
  py::class_<PyFrame, FrameRef>(
      m, "Frame",
      "A decoded picture in device memory (VideoDecoder.receive(), VideoDecoder.decode()). It holds one of its "
      "channel's frame buffers while it, its buffer, a tensor view of it or queued work using them lives: "
      "keep frames only as long as needed (frame_buffers of them at most).")
      .def_property_readonly(
          "width", [](const PyFrame& f) { return f.frame.width(); }, "Width in pixels.")
      .def_property_readonly(
          "height", [](const PyFrame& f) { return f.frame.height(); }, "Height in pixels.")
      .def_property_readonly(
          "format", [](const PyFrame& f) { return from_pixel_format(f.frame.format()); }, "Its tpuhal.PixelFormat.")
      .def_property_readonly(
          "pts", [](const PyFrame& f) { return f.frame.pts(); }, "The pts sent with the packet it came from.")
      .def_property_readonly(
          "packet", [](const PyFrame& f) { return f.frame.packet(); }, "Index of that packet (0-based, in send order).")
      .def_property_readonly(
          "index", [](const PyFrame& f) { return f.frame.index(); },
          "Frames before it on its decoder since open or reset() (display order).")
      .def_property_readonly(
          "channel", [](const PyFrame& f) { return f.frame.channel(); }, "The decoder channel that made it.")
      .def_property_readonly(
          "decoded_ns", [](const PyFrame& f) { return f.frame.decoded_ns(); },
          "Board time (ns since its reset) at which the codec unit finished it: on a modelled clock the "
          "model's. None without caps.wait_time.")
      .def_property_readonly(
          "buffer", [](PyFrame& f) { return f.buffer(); },
          "The tpuhal.Buffer (device memory) holding its planes; see planes. Keeps the frame buffer held. "
          "Do not free() it: it belongs to the decoder channel.")
      .def_property_readonly(
          "planes",
          [](const PyFrame& f) {
            py::list out;
            for (const auto& p : f.frame.planes()) out.append(py::make_tuple(p.offset, p.pitch, p.row_bytes, p.rows));
            return out;
          },
          "The planes in buffer, as (offset, pitch, row_bytes, rows) tuples: byte offset, bytes from one row "
          "to the next, bytes of each row that hold pixels, and rows. NV12: Y, UV; I420: Y, U, V.")
      .def(
          "luma", [](PyFrame& f) { return f.view(f.frame.luma()); },
          "The Y plane as a u8 tpuhal.Tensor [height, width] (rows `pitch` apart), for ops such as "
          "tpuhal.ops.nv12_to_rgb.")
      .def(
          "chroma", [](PyFrame& f) { return f.view(f.frame.chroma()); },
          "NV12 only: the interleaved UV plane as a u8 tpuhal.Tensor [ceil(H/2), ceil(W/2), 2]. Raises "
          "tpuhal.FailedPrecondition or InvalidArgument for I420 frames (use u() and v()).")
      .def(
          "u", [](PyFrame& f) { return f.view(f.frame.u()); },
          "I420 only: the U plane as a u8 tpuhal.Tensor [ceil(H/2), ceil(W/2)].")
      .def(
          "v", [](PyFrame& f) { return f.view(f.frame.v()); },
          "I420 only: the V plane as a u8 tpuhal.Tensor [ceil(H/2), ceil(W/2)].")
      .def("to_numpy", &to_numpy, py::kw_only(), py::arg("queue") = py::none(),
           "Downloads the planes into new uint8 NumPy arrays, without row padding: I420 gives (y, u, v) of "
           "shapes [H, W], [ceil(H/2), ceil(W/2)] twice; NV12 gives (y, uv) with uv shaped [ceil(H/2), "
           "ceil(W/2), 2] (uv[..., 0] is U, uv[..., 1] is V). The bytes move on `queue` if given, else on "
           "the device's transfer queue (a copy queue where the board has one). Releases the GIL.")
      .def("__repr__", [](const PyFrame& f) { return "<tpuhal.Frame " + describe(f.frame) + ">"; });

  // ---- Demuxer and Packet ----
  py::class_<PyPacket>(m, "Packet",
                       "One packet of a video file (iterating a tpuhal.Demuxer), ready for VideoDecoder.send().")
      .def(py::init([](py::bytes data, std::int64_t pts, bool keyframe) {
             return PyPacket{std::move(data), pts, keyframe};
           }),
           py::arg("data"), py::arg("pts") = 0, py::arg("keyframe") = false, "A packet of your own.")
      .def_readonly("new_stream", &PyPacket::new_stream,
                    "True for the first packet after a live source was opened again: reset the decoder (or open "
                    "a new one if the Demuxer's codec or size changed) before sending it.")
      .def_readonly("arrival_ns", &PyPacket::arrival_ns, "When it was read (CLOCK_MONOTONIC, ns).")
      .def_readonly("data", &PyPacket::data,
                    "The bytes: Annex B for H.264 and H.265 (converted from mp4/mkv's length-prefixed form), a "
                    "whole file for JPEG.")
      .def_readonly("pts", &PyPacket::pts, "Presentation time in the stream's time base; raw streams count frames.")
      .def_readonly("keyframe", &PyPacket::keyframe, "True for a packet decoding starts from.")
      .def(
          "__len__", [](const PyPacket& p) { return py::len(p.data); }, "Bytes of data.")
      .def("__repr__", [](const PyPacket& p) {
        return "<tpuhal.Packet " + std::to_string(py::len(p.data)) + " bytes, pts=" + std::to_string(p.pts) +
               (p.keyframe ? ", keyframe>" : ">");
      });

  py::class_<PyDemuxer, std::shared_ptr<PyDemuxer>>(
      m, "Demuxer",
      "Reads a video or image file (mp4, mkv, raw .h264/.h265, .jpg, ...) with libavformat; iterating it gives "
      "its video packets (tpuhal.Packet) ready for VideoDecoder.send() or VideoDecoder.decode(). Iteration "
      "reads on: a Demuxer goes through the file once.")
      .def(py::init([](const py::object& path_like, const std::string& transport, double timeout, bool reconnect,
                       double initial_backoff, double max_backoff, std::uint32_t max_attempts) {
             const auto path = py::module_::import("os").attr("fspath")(path_like).cast<std::string>();
             DemuxerOptions o;
             if (transport == "tcp")
               o.transport = DemuxerOptions::Transport::Tcp;
             else if (transport == "udp")
               o.transport = DemuxerOptions::Transport::Udp;
             else if (transport != "auto")
               throw Error(Status::InvalidArgument,
                           "transport must be 'auto', 'tcp' or 'udp', not '" + transport + "'");
             auto millis = [](double s) { return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000)); };
             o.timeout = millis(timeout);
             o.reconnect = reconnect;
             o.initial_backoff = millis(initial_backoff);
             o.max_backoff = millis(max_backoff);
             o.max_attempts = max_attempts;
             auto d = std::make_shared<PyDemuxer>();
             without_gil([&] { d->demuxer.emplace(path, o); });
             return d;
           }),
           py::arg("path"), py::kw_only(), py::arg("transport") = "auto", py::arg("timeout") = 5.0,
           py::arg("reconnect") = true, py::arg("initial_backoff") = 0.1, py::arg("max_backoff") = 5.0,
           py::arg("max_attempts") = 0,
           "Opens `path` (a str or os.PathLike), or a live URL (rtsp://, http://, udp://). Raises "
           "tpuhal.NotFound (no such file), tpuhal.InvalidArgument (not a media file), tpuhal.Unsupported (no "
           "H.264, H.265 or JPEG stream in it) or tpuhal.Unavailable (a URL that does not open within `timeout` "
           "seconds), naming it. For a URL: `transport` is RTSP's ('auto', 'tcp', 'udp'); a source that brings "
           "nothing for `timeout` seconds, drops or ends is opened again after `initial_backoff` seconds, "
           "doubling up to `max_backoff`, until `max_attempts` fail in a row (0: never).")
      .def_property_readonly(
          "live", [](PyDemuxer& d) { return d.demuxer->live(); }, "True for a URL.")
      .def_property_readonly(
          "reconnects", [](PyDemuxer& d) { return d.demuxer->reconnects(); }, "Times a live source was opened again.")
      .def_property_readonly(
          "packets_lost", [](PyDemuxer& d) { return d.demuxer->packets_lost(); },
          "Packets lost: RTP gaps over UDP, MPEG-TS continuity errors, and the unit an RTSP connection broke "
          "off inside (dropped, not handed on cut short).")
      .def(
          "interrupt", [](PyDemuxer& d) { d.demuxer->interrupt(); },
          "From any thread: ends a read blocked on a live source soon (StopIteration), and every later one.")
      .def_property_readonly(
          "codec", [](PyDemuxer& d) { return from_codec(d.demuxer->codec()); },
          "The tpuhal.Codec of its video stream; pass it to Device.open_decoder().")
      .def_property_readonly(
          "width", [](PyDemuxer& d) { return d.demuxer->width(); }, "Frame width in pixels.")
      .def_property_readonly(
          "height", [](PyDemuxer& d) { return d.demuxer->height(); }, "Frame height in pixels.")
      .def_property_readonly(
          "path", [](PyDemuxer& d) { return d.demuxer->path(); }, "The file.")
      .def("__iter__", [](const std::shared_ptr<PyDemuxer>& d) { return d; })
      .def(
          "__next__",
          [](PyDemuxer& d) {
            std::optional<Demuxer::Packet> p = without_gil([&] {
              std::lock_guard lock(d.mu);
              return d.demuxer->next();
            });
            if (!p) throw py::stop_iteration();
            py::bytes data(reinterpret_cast<const char*>(p->data.data()), p->data.size());
            return PyPacket{std::move(data), p->pts, p->keyframe, p->new_stream, p->arrival_ns};
          },
          "The next packet; StopIteration at the end of the file (or after interrupt()). Raises "
          "tpuhal.InvalidArgument if the file is damaged, tpuhal.Unavailable when a live source's reconnection "
          "attempts run out. Releases the GIL while it reads.")
      .def("__repr__", [](PyDemuxer& d) {
        return "<tpuhal.Demuxer " + py::repr(py::str(d.demuxer->path())).cast<std::string>() + ": " +
               to_string(d.demuxer->codec()) + " " + std::to_string(d.demuxer->width()) + "x" +
               std::to_string(d.demuxer->height()) + ">";
      });
}

}  // namespace tpuhal::python
