// tpuhaldec: H.264, H.265 and JPEG decode on the board's video decoder.
//
// A GstVideoDecoder in packetized mode: each input buffer is one access
// unit (h264parse/h265parse with alignment=au) or one whole JPEG
// (jpegparse), sent to a decoder channel with the GstVideoCodecFrame's
// system_frame_number as its pts, so the frame that comes back names the
// GstVideoCodecFrame it finishes, in display order.
//
// Output goes where downstream wants it: caps with memory:TpuhalDevice keep
// the frame in device memory (the buffer holds the channel's frame buffer
// until it is freed); plain video/x-raw copies it to system memory.
#include <gst/video/gstvideodecoder.h>
#include <gst/video/video.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "elements.h"
#include "memory.h"

#define GST_CAT_DEFAULT tpuhal_debug

namespace {

using tpuhal::Error;
using tpuhal::Status;
namespace tg = tpuhal::gst;

constexpr guint kDefaultFrameBuffers = 12;
constexpr guint kDefaultInFlight = 4;
constexpr auto kWait = std::chrono::seconds(10);  // for the board to make progress
// Downstream holds every frame buffer: the element waits for one in slices
// of this (the decoder's frame_buffer_wait), and warns after the first.
constexpr auto kBufferSlice = std::chrono::milliseconds(1000);

struct DecImpl {
  // Properties (set from any thread, read at start and open).
  std::string uri;
  guint frame_buffers = kDefaultFrameBuffers;
  std::atomic<guint> in_flight{kDefaultInFlight};  // may change while playing
  std::atomic<guint> frame_buffer_timeout_ms{0};   // 0: wait as long as downstream holds them

  tpuhal::Device device;
  std::optional<tpuhal::VideoDecoder> dec;
  tpuhal::VideoDecoderOptions opts;
  GstVideoCodecState* input = nullptr;

  // The output, chosen from downstream's caps when the input's arrive.
  bool device_out = true;
  GstVideoFormat format = GST_VIDEO_FORMAT_NV12;
  bool negotiated = false;
  GstVideoInfo info{};  // the negotiated output

  tg::SharedQueue copy;  // system-memory output: device -> staging
  tpuhal::Buffer staging;
  std::atomic<guint> channel{G_MAXUINT};
  std::atomic<guint64> corrupt{0};

  // A flush or a stop ends the streaming thread's waits: set (and the
  // decoder interrupted) from the thread that flushes or changes state.
  std::atomic<bool> flushing{false};
  std::mutex live_mu;
  tpuhal::VideoDecoder live;          // a handle on `dec` for interrupt(), under live_mu
  bool warned = false;                // the exhausted-pool warning went out (streaming thread)
  std::atomic<guint64> exhausted{0};  // one-second slices waited with every frame buffer downstream

  void set_live(const std::optional<tpuhal::VideoDecoder>& d) {
    std::lock_guard lock(live_mu);
    live = d ? *d : tpuhal::VideoDecoder();
  }
  void interrupt() {
    flushing = true;
    std::lock_guard lock(live_mu);
    live.interrupt();
  }
};

struct TpuhalDec {
  GstVideoDecoder parent;
  DecImpl* impl;
};
struct TpuhalDecClass {
  GstVideoDecoderClass parent_class;
};

}  // namespace

G_DEFINE_TYPE(TpuhalDec, tpuhal_dec, GST_TYPE_VIDEO_DECODER)

namespace {

enum {
  PROP_0,
  PROP_DEVICE,
  PROP_FRAME_BUFFERS,
  PROP_IN_FLIGHT,
  PROP_CHANNEL,
  PROP_CORRUPT,
  PROP_FRAME_BUFFER_TIMEOUT,
  PROP_EXHAUSTED
};

GstStaticPadTemplate sink_template = GST_STATIC_PAD_TEMPLATE(
    "sink", GST_PAD_SINK, GST_PAD_ALWAYS,
    GST_STATIC_CAPS("video/x-h264, stream-format = (string) byte-stream, alignment = (string) au; "
                    "video/x-h265, stream-format = (string) byte-stream, alignment = (string) au; "
                    "image/jpeg, parsed = (boolean) true"));

// Device memory first: an element that takes anything (fakesink, queue)
// gets frames without a copy.
GstStaticPadTemplate src_template =
    GST_STATIC_PAD_TEMPLATE("src", GST_PAD_SRC, GST_PAD_ALWAYS,
                            GST_STATIC_CAPS(GST_VIDEO_CAPS_MAKE_WITH_FEATURES(
                                "memory:TpuhalDevice", "{ NV12, I420 }") ";" GST_VIDEO_CAPS_MAKE("{ NV12, I420 }")));

TpuhalDec* self_of(GstVideoDecoder* d) { return reinterpret_cast<TpuhalDec*>(d); }

guint channel_of(DecImpl& s) { return s.dec ? s.dec->channel() : 0; }

// A device error on this element: an error message naming the channel.
void post_error(GstVideoDecoder* d, const Error& e) {
  DecImpl& s = *self_of(d)->impl;
  const std::string text = tg::channel_text(channel_of(s), "decoder failed");
  GST_ELEMENT_ERROR(d, STREAM, DECODE, ("%s", text.c_str()), ("%s", e.what()));
}

// Picks device or system memory, and NV12 or I420, from what downstream
// takes (its first preference).
void choose_output(GstVideoDecoder* d) {
  DecImpl& s = *self_of(d)->impl;
  GstCaps* allowed = gst_pad_get_allowed_caps(GST_VIDEO_DECODER_SRC_PAD(d));
  s.device_out = true;
  s.format = GST_VIDEO_FORMAT_NV12;
  if (allowed && !gst_caps_is_empty(allowed) && !gst_caps_is_any(allowed)) {
    s.device_out = tg::has_device_feature(allowed);
    GstStructure* st = gst_structure_copy(gst_caps_get_structure(allowed, 0));
    gst_structure_fixate_field_string(st, "format", "NV12");
    const gchar* f = gst_structure_get_string(st, "format");
    if (f && !std::strcmp(f, "I420")) s.format = GST_VIDEO_FORMAT_I420;
    gst_structure_free(st);
  }
  if (allowed) gst_caps_unref(allowed);
}

// Sets and negotiates the output state for w x h when it changes.
bool ensure_output(GstVideoDecoder* d, guint w, guint h) {
  DecImpl& s = *self_of(d)->impl;
  if (s.negotiated && GST_VIDEO_INFO_WIDTH(&s.info) == static_cast<gint>(w) &&
      GST_VIDEO_INFO_HEIGHT(&s.info) == static_cast<gint>(h))
    return true;
  for (int attempt = 0; attempt < 2; ++attempt) {
    GstVideoCodecState* state = gst_video_decoder_set_output_state(d, s.format, w, h, s.input);
    if (!state) return false;
    state->caps = gst_video_info_to_caps(&state->info);
    if (s.device_out) gst_caps_set_features(state->caps, 0, gst_caps_features_new(tg::kCapsFeature, nullptr));
    s.info = state->info;
    gst_video_codec_state_unref(state);
    if (gst_video_decoder_negotiate(d)) {
      s.negotiated = true;
      return true;
    }
    if (!s.device_out) break;
    s.device_out = false;  // downstream changed its mind: copy out instead
  }
  s.negotiated = false;
  return false;
}

// Finishes the GstVideoCodecFrame that `f` decodes.
GstFlowReturn push(GstVideoDecoder* d, tpuhal::Frame f) {
  DecImpl& s = *self_of(d)->impl;
  GstVideoCodecFrame* out = gst_video_decoder_get_frame(d, static_cast<int>(f.pts()));
  if (!out) {
    GST_DEBUG_OBJECT(d, "frame for system frame %lld is gone (flushed)", static_cast<long long>(f.pts()));
    return GST_FLOW_OK;
  }
  if (!ensure_output(d, f.width(), f.height())) {
    gst_video_decoder_drop_frame(d, out);
    return GST_FLOW_NOT_NEGOTIATED;
  }
  const std::vector<tpuhal::Frame::Plane> planes(f.planes().begin(), f.planes().end());  // outlives f
  if (s.device_out) {
    auto p = std::make_shared<tg::Payload>();
    p->device = s.device;
    p->buffer = f.buffer();
    p->size = planes.back().offset + std::uint64_t{planes.back().pitch} * planes.back().rows;
    p->channel = f.channel();
    p->index = f.index();
    gsize offsets[GST_VIDEO_MAX_PLANES] = {};
    gint strides[GST_VIDEO_MAX_PLANES] = {};
    for (std::size_t i = 0; i < planes.size() && i < GST_VIDEO_MAX_PLANES; ++i) {
      offsets[i] = planes[i].offset;
      strides[i] = static_cast<gint>(planes[i].pitch);
    }
    const GstVideoFormat format =
        f.format() == tpuhal::PixelFormat::I420 ? GST_VIDEO_FORMAT_I420 : GST_VIDEO_FORMAT_NV12;
    p->frame = std::move(f);
    GstBuffer* buf = gst_buffer_new();
    gst_buffer_append_memory(buf, tg::wrap(std::move(p)));
    gst_buffer_add_video_meta_full(buf, GST_VIDEO_FRAME_FLAG_NONE, format, GST_VIDEO_INFO_WIDTH(&s.info),
                                   GST_VIDEO_INFO_HEIGHT(&s.info), static_cast<guint>(planes.size()), offsets, strides);
    out->output_buffer = buf;
    return gst_video_decoder_finish_frame(d, out);
  }
  GstFlowReturn ret = gst_video_decoder_allocate_output_frame(d, out);
  if (ret != GST_FLOW_OK) {
    gst_video_decoder_drop_frame(d, out);
    return ret;
  }
  const std::uint64_t need = planes.back().offset + std::uint64_t{planes.back().pitch} * planes.back().rows;
  if (!s.copy) s.copy = tg::SharedQueue(s.device, tpuhal::Engine::Copy);
  if (!s.staging.valid() || s.staging.size() < need) s.staging = s.device.allocate(need, tpuhal::Memory::HostPinned);
  {
    const tpuhal::Frame done = std::move(f);  // its frame buffer goes back to the channel after the copy
    s.copy.get().copy(done.buffer(), 0, s.staging, 0, need).submit().wait();
  }
  GstVideoFrame vf;
  if (!gst_video_frame_map(&vf, &s.info, out->output_buffer, GST_MAP_WRITE)) {
    gst_video_decoder_drop_frame(d, out);
    GST_ELEMENT_ERROR(d, RESOURCE, WRITE, ("cannot map an output buffer"), (nullptr));
    return GST_FLOW_ERROR;
  }
  const std::byte* host = s.staging.map().data();
  for (std::size_t i = 0; i < planes.size() && i < GST_VIDEO_FRAME_N_PLANES(&vf); ++i) {
    auto* dst = static_cast<std::uint8_t*>(GST_VIDEO_FRAME_PLANE_DATA(&vf, i));
    const auto dst_stride = static_cast<std::size_t>(GST_VIDEO_FRAME_PLANE_STRIDE(&vf, i));
    const std::size_t rows = std::min<std::size_t>(planes[i].rows, GST_VIDEO_FRAME_COMP_HEIGHT(&vf, i));
    const std::size_t bytes = std::min<std::size_t>(planes[i].row_bytes, dst_stride);
    for (std::size_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * dst_stride, host + planes[i].offset + r * planes[i].pitch, bytes);
  }
  gst_video_frame_unmap(&vf);
  return gst_video_decoder_finish_frame(d, out);
}

// Downstream has held every frame buffer for another slice: a warning the
// first time (naming the property to raise), an error once the
// frame-buffer-timeout property's bound has passed.
void exhausted_slice(GstVideoDecoder* d, const Error& e, std::chrono::steady_clock::time_point since) {
  DecImpl& s = *self_of(d)->impl;
  ++s.exhausted;
  if (!s.warned) {
    s.warned = true;
    const std::string text =
        tg::channel_text(channel_of(s), "downstream holds all " + std::to_string(s.opts.frame_buffers) +
                                            " frame buffers; waiting for one (raise frame-buffers "
                                            "to keep more frames downstream)");
    GST_ELEMENT_WARNING(d, RESOURCE, BUSY, ("%s", text.c_str()), ("%s", e.what()));
  }
  const guint limit = s.frame_buffer_timeout_ms.load();
  if (limit && std::chrono::steady_clock::now() - since >= std::chrono::milliseconds(limit))
    throw Error(Status::ResourceExhausted, "downstream held every frame buffer for " + std::to_string(limit) +
                                               " ms (frame-buffer-timeout); raise frame-buffers, or free buffers "
                                               "sooner: " +
                                               e.what());
}

// receive() that turns a packet that did not decode into a decoder error
// (an error message once max-errors is passed; 0 by default) and goes on.
// Blocking, it waits for downstream to return a frame buffer when it holds
// them all (in slices, until frame-buffer-timeout); a flush or a stop ends
// the wait with GST_FLOW_FLUSHING.
GstFlowReturn take(GstVideoDecoder* d, bool block, bool* got) {
  DecImpl& s = *self_of(d)->impl;
  *got = false;
  try {
    std::optional<tpuhal::Frame> f;
    const auto since = std::chrono::steady_clock::now();
    for (;;) {
      if (s.flushing) return GST_FLOW_FLUSHING;
      try {
        f = block ? s.dec->receive(kWait) : s.dec->try_receive();
        break;
      } catch (const Error& e) {
        if (e.status() != Status::ResourceExhausted) throw;
        exhausted_slice(d, e, since);
      }
    }
    if (!f) return s.flushing ? GST_FLOW_FLUSHING : GST_FLOW_OK;
    *got = true;
    return push(d, std::move(*f));
  } catch (const Error& e) {
    if (e.status() != Status::InvalidArgument && e.status() != Status::OutOfRange) throw;
    s.corrupt.fetch_add(1, std::memory_order_relaxed);
    *got = true;
    GstFlowReturn ret = GST_FLOW_OK;
    const std::string text = tg::channel_text(channel_of(s), "corrupt stream: a packet did not decode");
    GST_VIDEO_DECODER_ERROR(d, 1, STREAM, DECODE, ("%s", text.c_str()), ("%s", e.what()), ret);
    return ret;
  }
}

// Every frame still inside, then a fresh stream on the same channel.
GstFlowReturn drain(GstVideoDecoder* d) {
  DecImpl& s = *self_of(d)->impl;
  if (!s.dec) return GST_FLOW_OK;
  GstFlowReturn ret = GST_FLOW_OK;
  try {
    s.dec->flush();
    for (bool got = true; got && ret == GST_FLOW_OK;) ret = take(d, true, &got);
    s.dec->reset();
  } catch (const Error& e) {
    post_error(d, e);
    return GST_FLOW_ERROR;
  }
  return ret;
}

gboolean dec_open(GstVideoDecoder* d) {
  DecImpl& s = *self_of(d)->impl;
  try {
    std::string uri;
    GST_OBJECT_LOCK(d);
    uri = s.uri;
    GST_OBJECT_UNLOCK(d);
    s.device = tg::open_device(uri);
  } catch (const Error& e) {
    GST_ELEMENT_ERROR(d, RESOURCE, OPEN_READ_WRITE, ("cannot open the device"), ("%s", e.what()));
    return FALSE;
  }
  return TRUE;
}

gboolean dec_close(GstVideoDecoder* d) {
  DecImpl& s = *self_of(d)->impl;
  s.staging = tpuhal::Buffer();
  s.copy = tg::SharedQueue();
  s.dec.reset();
  s.device = tpuhal::Device();
  return TRUE;
}

gboolean dec_start(GstVideoDecoder* d) {
  gst_video_decoder_set_packetized(d, TRUE);
  self_of(d)->impl->flushing = false;
  return TRUE;
}

gboolean dec_stop(GstVideoDecoder* d) {
  DecImpl& s = *self_of(d)->impl;
  s.set_live(std::nullopt);
  s.dec.reset();
  s.flushing = false;
  s.channel = G_MAXUINT;
  s.negotiated = false;
  if (s.input) gst_video_codec_state_unref(s.input);
  s.input = nullptr;
  return TRUE;
}

gboolean dec_set_format(GstVideoDecoder* d, GstVideoCodecState* state) {
  DecImpl& s = *self_of(d)->impl;
  const gchar* name = gst_structure_get_name(gst_caps_get_structure(state->caps, 0));
  tpuhal::Codec codec = tpuhal::Codec::H264;
  if (!std::strcmp(name, "video/x-h265"))
    codec = tpuhal::Codec::H265;
  else if (!std::strcmp(name, "image/jpeg"))
    codec = tpuhal::Codec::Jpeg;
  const auto w = static_cast<std::uint32_t>(std::max(0, GST_VIDEO_INFO_WIDTH(&state->info)));
  const auto h = static_cast<std::uint32_t>(std::max(0, GST_VIDEO_INFO_HEIGHT(&state->info)));
  if (s.input) gst_video_codec_state_unref(s.input);
  s.input = gst_video_codec_state_ref(state);
  choose_output(d);
  const tpuhal::PixelFormat format =
      s.format == GST_VIDEO_FORMAT_I420 ? tpuhal::PixelFormat::I420 : tpuhal::PixelFormat::NV12;
  const bool fits =
      s.dec && s.opts.codec == codec && s.opts.format == format && w <= s.opts.max_width && h <= s.opts.max_height;
  try {
    if (!fits) {
      // The old stream's frames leave first, then a channel for the new one.
      if (s.dec && drain(d) != GST_FLOW_OK) return FALSE;
      s.set_live(std::nullopt);
      s.dec.reset();
      s.opts.codec = codec;
      s.opts.format = format;
      // The stream's own size where the caps say it (a multiple of 16 rows
      // for the decoder's macroblocks), else 1080p.
      s.opts.max_width = w ? w : 1920;
      s.opts.max_height = h ? (h + 15) / 16 * 16 : 1088;
      GST_OBJECT_LOCK(d);
      s.opts.frame_buffers = s.frame_buffers;
      GST_OBJECT_UNLOCK(d);
      s.opts.frame_buffer_wait = kBufferSlice;
      s.dec = s.device.open_decoder(s.opts);
      s.set_live(s.dec);
      s.channel = s.dec->channel();
      GST_INFO_OBJECT(d, "channel %u: %s up to %ux%u", s.dec->channel(), tpuhal::to_string(codec), s.opts.max_width,
                      s.opts.max_height);
    }
  } catch (const Error& e) {
    GST_ELEMENT_ERROR(d, RESOURCE, OPEN_READ_WRITE, ("cannot open a decoder channel"), ("%s", e.what()));
    return FALSE;
  }
  s.negotiated = false;
  return w && h ? ensure_output(d, w, h) : TRUE;
}

GstFlowReturn dec_handle_frame(GstVideoDecoder* d, GstVideoCodecFrame* frame) {
  DecImpl& s = *self_of(d)->impl;
  if (!s.dec) {
    gst_video_decoder_drop_frame(d, frame);
    GST_ELEMENT_ERROR(d, CORE, NEGOTIATION, ("no caps before data"), (nullptr));
    return GST_FLOW_NOT_NEGOTIATED;
  }
  GstMapInfo map;
  if (!gst_buffer_map(frame->input_buffer, &map, GST_MAP_READ)) {
    gst_video_decoder_drop_frame(d, frame);
    GST_ELEMENT_ERROR(d, RESOURCE, READ, ("cannot map an input buffer"), (nullptr));
    return GST_FLOW_ERROR;
  }
  const auto pts = static_cast<std::int64_t>(frame->system_frame_number);
  GstFlowReturn ret = GST_FLOW_OK;
  bool got = false;
  try {
    for (;;) {
      try {
        s.dec->send(std::span<const std::uint8_t>(map.data, map.size), pts);
        break;
      } catch (const Error& e) {
        if (e.status() != Status::ResourceExhausted) throw;
      }
      // The board waits for frame buffers: the frames it has finished go
      // downstream first; when downstream holds them all, the receive
      // waits for one to come back (take()).
      ret = take(d, true, &got);
      if (ret != GST_FLOW_OK) break;
    }
  } catch (const Error& e) {
    post_error(d, e);
    ret = GST_FLOW_ERROR;
  }
  gst_buffer_unmap(frame->input_buffer, &map);
  gst_video_codec_frame_unref(frame);  // the base class keeps it; push() finds it again
  if (ret != GST_FLOW_OK) return ret;
  try {
    // What is ready goes now; the element waits only when `in-flight`
    // packets are on the device (more: throughput, fewer: latency).
    do ret = take(d, false, &got);
    while (ret == GST_FLOW_OK && got);
    while (ret == GST_FLOW_OK && s.dec->packets_sent() - s.dec->frames_received() >= s.in_flight.load()) {
      ret = take(d, true, &got);
      if (!got) break;  // the decoder holds frames back to reorder them
    }
  } catch (const Error& e) {
    post_error(d, e);
    ret = GST_FLOW_ERROR;
  }
  return ret;
}

GstFlowReturn dec_finish(GstVideoDecoder* d) { return drain(d); }
GstFlowReturn dec_drain(GstVideoDecoder* d) { return drain(d); }

gboolean dec_flush(GstVideoDecoder* d) {
  DecImpl& s = *self_of(d)->impl;
  try {
    if (s.dec) s.dec->reset();  // what is inside is dropped (an interrupt too); the base class drops its frames
  } catch (const Error& e) {
    post_error(d, e);
    return FALSE;
  }
  s.flushing = false;
  return TRUE;
}

// A flush starts on the thread that seeks, while the streaming thread may
// wait in the decoder for a frame buffer that downstream (being flushed
// too) will not return: the wait ends now.
gboolean dec_sink_event(GstVideoDecoder* d, GstEvent* event) {
  if (GST_EVENT_TYPE(event) == GST_EVENT_FLUSH_START) self_of(d)->impl->interrupt();
  return GST_VIDEO_DECODER_CLASS(tpuhal_dec_parent_class)->sink_event(d, event);
}

// Stopping deactivates the pads, which waits for the streaming thread: a
// wait of it in the decoder ends first.
GstStateChangeReturn dec_change_state(GstElement* element, GstStateChange transition) {
  if (transition == GST_STATE_CHANGE_PAUSED_TO_READY) self_of(GST_VIDEO_DECODER(element))->impl->interrupt();
  return GST_ELEMENT_CLASS(tpuhal_dec_parent_class)->change_state(element, transition);
}

gboolean dec_decide_allocation(GstVideoDecoder* d, GstQuery* query) {
  if (self_of(d)->impl->device_out) {
    // Frames go out in the decoder's own frame buffers; the base class still
    // wants a pool, so it gets an empty one it never draws from.
    while (gst_query_get_n_allocation_pools(query) > 0) gst_query_remove_nth_allocation_pool(query, 0);
    GstBufferPool* pool = gst_buffer_pool_new();
    GstCaps* caps = nullptr;
    gst_query_parse_allocation(query, &caps, nullptr);
    GstStructure* config = gst_buffer_pool_get_config(pool);
    gst_buffer_pool_config_set_params(config, caps, 64, 0, 0);
    gst_buffer_pool_set_config(pool, config);
    gst_query_add_allocation_pool(query, pool, 64, 0, 0);
    gst_object_unref(pool);
    return TRUE;
  }
  return GST_VIDEO_DECODER_CLASS(tpuhal_dec_parent_class)->decide_allocation(d, query);
}

void dec_set_property(GObject* object, guint id, const GValue* value, GParamSpec* pspec) {
  DecImpl& s = *reinterpret_cast<TpuhalDec*>(object)->impl;
  GST_OBJECT_LOCK(object);
  switch (id) {
    case PROP_DEVICE: {
      const gchar* v = g_value_get_string(value);
      s.uri = v ? v : "";
      break;
    }
    case PROP_FRAME_BUFFERS: s.frame_buffers = g_value_get_uint(value); break;
    case PROP_IN_FLIGHT: s.in_flight = g_value_get_uint(value); break;
    case PROP_FRAME_BUFFER_TIMEOUT: s.frame_buffer_timeout_ms = g_value_get_uint(value); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
  }
  GST_OBJECT_UNLOCK(object);
}

void dec_get_property(GObject* object, guint id, GValue* value, GParamSpec* pspec) {
  DecImpl& s = *reinterpret_cast<TpuhalDec*>(object)->impl;
  GST_OBJECT_LOCK(object);
  switch (id) {
    case PROP_DEVICE: g_value_set_string(value, s.uri.c_str()); break;
    case PROP_FRAME_BUFFERS: g_value_set_uint(value, s.frame_buffers); break;
    case PROP_IN_FLIGHT: g_value_set_uint(value, s.in_flight); break;
    case PROP_CHANNEL: g_value_set_int(value, s.channel == G_MAXUINT ? -1 : static_cast<gint>(s.channel.load())); break;
    case PROP_CORRUPT: g_value_set_uint64(value, s.corrupt.load()); break;
    case PROP_FRAME_BUFFER_TIMEOUT: g_value_set_uint(value, s.frame_buffer_timeout_ms.load()); break;
    case PROP_EXHAUSTED: g_value_set_uint64(value, s.exhausted.load()); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
  }
  GST_OBJECT_UNLOCK(object);
}

void dec_finalize(GObject* object) {
  auto* self = reinterpret_cast<TpuhalDec*>(object);
  if (self->impl->input) gst_video_codec_state_unref(self->impl->input);
  delete self->impl;
  G_OBJECT_CLASS(tpuhal_dec_parent_class)->finalize(object);
}

}  // namespace

static void tpuhal_dec_init(TpuhalDec* self) {
  self->impl = new DecImpl;
  // A packet that does not decode is an error, not a warning (the base
  // class's default tolerates any number); max-errors=-1 tolerates them.
  gst_video_decoder_set_max_errors(GST_VIDEO_DECODER(self), 0);
}

static void tpuhal_dec_class_init(TpuhalDecClass* klass) {
  auto* o = G_OBJECT_CLASS(klass);
  o->set_property = dec_set_property;
  o->get_property = dec_get_property;
  o->finalize = dec_finalize;
  const auto rw = static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  const auto ro = static_cast<GParamFlags>(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);
  g_object_class_install_property(
      o, PROP_DEVICE,
      g_param_spec_string("device", "Device",
                          "The board's URI (sim:0, pcie:0000:01:00.0, simd:PATH#N); empty: the first "
                          "board tpuhal finds",
                          "", rw));
  g_object_class_install_property(
      o, PROP_FRAME_BUFFERS,
      g_param_spec_uint("frame-buffers", "Frame buffers",
                        "Frame buffers of the channel: frames in flight, held for reordering, and held downstream", 2,
                        64, kDefaultFrameBuffers, rw));
  g_object_class_install_property(
      o, PROP_IN_FLIGHT,
      g_param_spec_uint(
          "in-flight", "Packets in flight",
          "Packets on the device before the element waits for a frame (more: throughput; 1: the least "
          "latency)",
          1, 32, kDefaultInFlight,
          static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_PLAYING)));
  g_object_class_install_property(
      o, PROP_CHANNEL,
      g_param_spec_int("channel", "Channel", "The decoder channel in use (-1: none yet)", -1, G_MAXINT, -1, ro));
  g_object_class_install_property(
      o, PROP_CORRUPT,
      g_param_spec_uint64("corrupt-packets", "Corrupt packets", "Packets that did not decode", 0, G_MAXUINT64, 0, ro));
  g_object_class_install_property(
      o, PROP_FRAME_BUFFER_TIMEOUT,
      g_param_spec_uint(
          "frame-buffer-timeout", "Frame buffer timeout",
          "When downstream holds every frame buffer, the element waits for one to come back (warning "
          "once after a second); after this many ms it fails instead (0: it waits as long as "
          "downstream holds them; a flush or a stop ends the wait)",
          0, G_MAXUINT, 0,
          static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_PLAYING)));
  g_object_class_install_property(
      o, PROP_EXHAUSTED,
      g_param_spec_uint64("exhausted-waits", "Exhausted waits",
                          "Seconds (slices of one) the element waited with every frame buffer held downstream", 0,
                          G_MAXUINT64, 0, ro));

  auto* e = GST_ELEMENT_CLASS(klass);
  e->change_state = dec_change_state;
  gst_element_class_add_static_pad_template(e, &sink_template);
  gst_element_class_add_static_pad_template(e, &src_template);
  gst_element_class_set_static_metadata(e, "tpuhal video decoder", "Codec/Decoder/Video/Hardware",
                                        "Decodes H.264, H.265 and JPEG on a tpuhal board's video decoder", "tpuhal");
  auto* v = GST_VIDEO_DECODER_CLASS(klass);
  v->open = dec_open;
  v->close = dec_close;
  v->start = dec_start;
  v->stop = dec_stop;
  v->set_format = dec_set_format;
  v->handle_frame = dec_handle_frame;
  v->finish = dec_finish;
  v->drain = dec_drain;
  v->flush = dec_flush;
  v->sink_event = dec_sink_event;
  v->decide_allocation = dec_decide_allocation;
}
