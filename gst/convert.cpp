// tpuhalconvert: decoded frames (NV12 or I420, in device memory) to planar
// RGB float tensors [1, 3, H, W] on the board, resized and normalised
// ((rgb - mean) * scale), the input tpuhalinfer's models take.
//
// Output caps: other/x-tpuhal-tensor(memory:TpuhalDevice), dtype=f32,
// layout=nchw, channels=3, width, height. The size comes from the width and
// height properties, else from downstream (tpuhalinfer asks for its model's),
// else the frame's own.
#include <gst/base/gstbasetransform.h>
#include <gst/video/video.h>

#include <array>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "elements.h"
#include "memory.h"

#define GST_CAT_DEFAULT tpuhal_debug

namespace {

namespace tg = tpuhal::gst;
using tpuhal::Error;

constexpr std::size_t kPool = 8;  // output tensors kept for reuse

struct ConvertImpl {
  // Properties.
  guint width = 0, height = 0;
  std::array<float, 3> mean{0, 0, 0}, scale{1, 1, 1};
  bool linear = true;

  GstVideoInfo in{};
  gint out_w = 0, out_h = 0;
  tpuhal::Device device;
  tg::SharedQueue queue;
  tpuhal::Buffer scratch;  // full-size RGB before the resize
  std::vector<std::shared_ptr<tg::Payload>> pool;
};

struct TpuhalConvert {
  GstBaseTransform parent;
  ConvertImpl* impl;
};
struct TpuhalConvertClass {
  GstBaseTransformClass parent_class;
};

}  // namespace

G_DEFINE_TYPE(TpuhalConvert, tpuhal_convert, GST_TYPE_BASE_TRANSFORM)

namespace {

enum { PROP_0, PROP_WIDTH, PROP_HEIGHT, PROP_MEAN, PROP_SCALE, PROP_METHOD };

GstStaticPadTemplate sink_template = GST_STATIC_PAD_TEMPLATE(
    "sink", GST_PAD_SINK, GST_PAD_ALWAYS,
    GST_STATIC_CAPS(GST_VIDEO_CAPS_MAKE_WITH_FEATURES("memory:TpuhalDevice", "{ NV12, I420 }")));

GstStaticPadTemplate src_template = GST_STATIC_PAD_TEMPLATE(
    "src", GST_PAD_SRC, GST_PAD_ALWAYS,
    GST_STATIC_CAPS("other/x-tpuhal-tensor(memory:TpuhalDevice), dtype = (string) f32, layout = (string) nchw, "
                    "channels = (int) 3, width = (int) [ 1, 16384 ], height = (int) [ 1, 16384 ]"));

ConvertImpl& impl_of(GstBaseTransform* t) { return *reinterpret_cast<TpuhalConvert*>(t)->impl; }

GstCaps* convert_transform_caps(GstBaseTransform* t, GstPadDirection direction, GstCaps* caps, GstCaps* filter) {
  ConvertImpl& s = impl_of(t);
  GstCaps* result = nullptr;
  if (direction == GST_PAD_SINK) {
    result = gst_caps_new_empty();
    for (guint i = 0; i < gst_caps_get_size(caps); ++i) {
      GstStructure* st = gst_structure_new("other/x-tpuhal-tensor", "dtype", G_TYPE_STRING, "f32", "layout",
                                           G_TYPE_STRING, "nchw", "channels", G_TYPE_INT, 3, nullptr);
      GST_OBJECT_LOCK(t);
      const guint w = s.width, h = s.height;
      GST_OBJECT_UNLOCK(t);
      if (w)
        gst_structure_set(st, "width", G_TYPE_INT, static_cast<gint>(w), nullptr);
      else
        gst_structure_set(st, "width", GST_TYPE_INT_RANGE, 1, 16384, nullptr);
      if (h)
        gst_structure_set(st, "height", G_TYPE_INT, static_cast<gint>(h), nullptr);
      else
        gst_structure_set(st, "height", GST_TYPE_INT_RANGE, 1, 16384, nullptr);
      result = gst_caps_merge_structure_full(result, st, gst_caps_features_new(tg::kCapsFeature, nullptr));
    }
  } else {
    result = gst_static_pad_template_get_caps(&sink_template);
  }
  if (filter) {
    GstCaps* both = gst_caps_intersect_full(filter, result, GST_CAPS_INTERSECT_FIRST);
    gst_caps_unref(result);
    result = both;
  }
  return result;
}

// Without a size from the properties or downstream, the frame's own.
GstCaps* convert_fixate_caps(GstBaseTransform*, GstPadDirection direction, GstCaps* caps, GstCaps* othercaps) {
  othercaps = gst_caps_truncate(othercaps);
  othercaps = gst_caps_make_writable(othercaps);
  if (direction == GST_PAD_SINK) {
    GstVideoInfo in;
    if (gst_video_info_from_caps(&in, caps)) {
      GstStructure* st = gst_caps_get_structure(othercaps, 0);
      gst_structure_fixate_field_nearest_int(st, "width", GST_VIDEO_INFO_WIDTH(&in));
      gst_structure_fixate_field_nearest_int(st, "height", GST_VIDEO_INFO_HEIGHT(&in));
    }
  }
  return gst_caps_fixate(othercaps);
}

gboolean convert_set_caps(GstBaseTransform* t, GstCaps* incaps, GstCaps* outcaps) {
  ConvertImpl& s = impl_of(t);
  if (!gst_video_info_from_caps(&s.in, incaps)) return FALSE;
  GstStructure* st = gst_caps_get_structure(outcaps, 0);
  if (!gst_structure_get_int(st, "width", &s.out_w) || !gst_structure_get_int(st, "height", &s.out_h)) return FALSE;
  s.pool.clear();
  s.scratch = tpuhal::Buffer();
  GST_INFO_OBJECT(t, "%dx%d %s -> f32[1, 3, %d, %d]", GST_VIDEO_INFO_WIDTH(&s.in), GST_VIDEO_INFO_HEIGHT(&s.in),
                  gst_video_format_to_string(GST_VIDEO_INFO_FORMAT(&s.in)), s.out_h, s.out_w);
  return TRUE;
}

gboolean convert_stop(GstBaseTransform* t) {
  ConvertImpl& s = impl_of(t);
  s.pool.clear();
  s.scratch = tpuhal::Buffer();
  s.queue = tg::SharedQueue();
  s.device = tpuhal::Device();
  return TRUE;
}

// An output tensor: a pooled one no buffer holds any more, else a new one.
std::shared_ptr<tg::Payload> output_tensor(ConvertImpl& s) {
  for (auto& p : s.pool)
    if (p.use_count() == 1) return p;
  auto p = std::make_shared<tg::Payload>();
  p->device = s.device;
  p->size = 3ull * static_cast<std::uint64_t>(s.out_w) * static_cast<std::uint64_t>(s.out_h) * sizeof(float);
  p->buffer = s.device.allocate(p->size);
  if (s.pool.size() < kPool) s.pool.push_back(p);
  return p;
}

GstFlowReturn convert_prepare_output_buffer(GstBaseTransform* t, GstBuffer* input, GstBuffer** out) {
  ConvertImpl& s = impl_of(t);
  const std::shared_ptr<tg::Payload> in = tg::payload_of(input);
  if (!in || !in->frame) {
    GST_ELEMENT_ERROR(t, STREAM, FORMAT, ("input is not a frame in tpuhal device memory"), (nullptr));
    return GST_FLOW_ERROR;
  }
  try {
    if (!s.device || s.device.uri() != in->device.uri()) {
      s.pool.clear();
      s.scratch = tpuhal::Buffer();
      s.queue = tg::SharedQueue();
      s.device = in->device;
      s.queue = tg::SharedQueue(s.device, tpuhal::Engine::Compute);
    }
    std::shared_ptr<tg::Payload> p = output_tensor(s);
    p->channel = in->channel;
    p->index = in->index;
    *out = gst_buffer_new();
    gst_buffer_append_memory(*out, tg::wrap(std::move(p)));
  } catch (const Error& e) {
    const std::string text = tg::channel_text(in->channel, "cannot allocate a tensor");
    GST_ELEMENT_ERROR(t, RESOURCE, NO_SPACE_LEFT, ("%s", text.c_str()), ("%s", e.what()));
    return GST_FLOW_ERROR;
  }
  GST_BASE_TRANSFORM_CLASS(tpuhal_convert_parent_class)->copy_metadata(t, input, *out);
  return GST_FLOW_OK;
}

GstFlowReturn convert_transform(GstBaseTransform* t, GstBuffer* input, GstBuffer* output) {
  ConvertImpl& s = impl_of(t);
  const std::shared_ptr<tg::Payload> in = tg::payload_of(input);
  const std::shared_ptr<tg::Payload> out = tg::payload_of(output);
  const tpuhal::Frame& f = *in->frame;
  try {
    const std::int64_t fh = f.height(), fw = f.width(), oh = s.out_h, ow = s.out_w;
    tpuhal::ops::ColorConvertOptions cc;
    GST_OBJECT_LOCK(t);
    cc.mean = s.mean;
    cc.scale = s.scale;
    tpuhal::ops::ResizeOptions rs;
    rs.mode = s.linear ? tpuhal::ResizeMode::Linear : tpuhal::ResizeMode::Nearest;
    GST_OBJECT_UNLOCK(t);
    const bool resize = fh != oh || fw != ow;
    if (resize && (!s.scratch.valid() || s.scratch.size() < static_cast<std::uint64_t>(3 * fh * fw * 4)))
      s.scratch = s.device.allocate(static_cast<std::uint64_t>(3 * fh * fw * 4));
    const tpuhal::Tensor rgb(resize ? s.scratch : out->buffer, tpuhal::DType::F32, {3, fh, fw});
    tpuhal::Batch b = s.queue.get().batch();
    if (f.format() == tpuhal::PixelFormat::NV12)
      b.run(tpuhal::ops::nv12_to_rgb(f.luma(), f.chroma(), rgb, cc));
    else
      b.run(tpuhal::ops::i420_to_rgb(f.luma(), f.u(), f.v(), rgb, cc));
    if (resize)
      b.run(tpuhal::ops::resize(rgb.reshape({1, 3, fh, fw}),
                                tpuhal::Tensor(out->buffer, tpuhal::DType::F32, {1, 3, oh, ow}), rs));
    b.submit().wait();
  } catch (const Error& e) {
    const std::string text = tg::channel_text(in->channel, "conversion failed");
    GST_ELEMENT_ERROR(t, STREAM, FAILED, ("%s", text.c_str()), ("%s", e.what()));
    return GST_FLOW_ERROR;
  }
  return GST_FLOW_OK;
}

bool parse_triple(const gchar* text, std::array<float, 3>& out) {
  std::array<float, 3> v{};
  char tail = 0;
  if (!text || std::sscanf(text, "%f,%f,%f%c", &v[0], &v[1], &v[2], &tail) != 3) return false;
  out = v;
  return true;
}

std::string triple_text(const std::array<float, 3>& v) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%g,%g,%g", static_cast<double>(v[0]), static_cast<double>(v[1]),
                static_cast<double>(v[2]));
  return buf;
}

void convert_set_property(GObject* object, guint id, const GValue* value, GParamSpec* pspec) {
  ConvertImpl& s = *reinterpret_cast<TpuhalConvert*>(object)->impl;
  GST_OBJECT_LOCK(object);
  switch (id) {
    case PROP_WIDTH: s.width = g_value_get_uint(value); break;
    case PROP_HEIGHT: s.height = g_value_get_uint(value); break;
    case PROP_MEAN:
    case PROP_SCALE:
      if (!parse_triple(g_value_get_string(value), id == PROP_MEAN ? s.mean : s.scale))
        g_warning("tpuhalconvert: %s takes three numbers, R,G,B (\"%s\" kept as it was)", pspec->name,
                  g_value_get_string(value) ? g_value_get_string(value) : "");
      break;
    case PROP_METHOD: s.linear = g_value_get_boolean(value); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
  }
  GST_OBJECT_UNLOCK(object);
}

void convert_get_property(GObject* object, guint id, GValue* value, GParamSpec* pspec) {
  ConvertImpl& s = *reinterpret_cast<TpuhalConvert*>(object)->impl;
  GST_OBJECT_LOCK(object);
  switch (id) {
    case PROP_WIDTH: g_value_set_uint(value, s.width); break;
    case PROP_HEIGHT: g_value_set_uint(value, s.height); break;
    case PROP_MEAN: g_value_set_string(value, triple_text(s.mean).c_str()); break;
    case PROP_SCALE: g_value_set_string(value, triple_text(s.scale).c_str()); break;
    case PROP_METHOD: g_value_set_boolean(value, s.linear); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
  }
  GST_OBJECT_UNLOCK(object);
}

void convert_finalize(GObject* object) {
  delete reinterpret_cast<TpuhalConvert*>(object)->impl;
  G_OBJECT_CLASS(tpuhal_convert_parent_class)->finalize(object);
}

}  // namespace

static void tpuhal_convert_init(TpuhalConvert* self) {
  self->impl = new ConvertImpl;
  gst_base_transform_set_qos_enabled(GST_BASE_TRANSFORM(self), FALSE);
}

static void tpuhal_convert_class_init(TpuhalConvertClass* klass) {
  auto* o = G_OBJECT_CLASS(klass);
  o->set_property = convert_set_property;
  o->get_property = convert_get_property;
  o->finalize = convert_finalize;
  const auto rw = static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  g_object_class_install_property(
      o, PROP_WIDTH,
      g_param_spec_uint("width", "Width", "Output width (0: what downstream asks for, else the frame's)", 0, 16384, 0,
                        rw));
  g_object_class_install_property(
      o, PROP_HEIGHT,
      g_param_spec_uint("height", "Height", "Output height (0: what downstream asks for, else the frame's)", 0, 16384,
                        0, rw));
  g_object_class_install_property(
      o, PROP_MEAN,
      g_param_spec_string("mean", "Mean", "R,G,B subtracted from each pixel (0-255 scale)", "0,0,0",
                          static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS)));
  g_object_class_install_property(
      o, PROP_SCALE,
      g_param_spec_string("scale", "Scale", "R,G,B factors applied after the mean: y = (rgb - mean) * scale", "1,1,1",
                          static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS)));
  g_object_class_install_property(
      o, PROP_METHOD,
      g_param_spec_boolean("linear", "Linear", "Resize with linear interpolation (false: nearest)", TRUE,
                           static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS)));

  auto* e = GST_ELEMENT_CLASS(klass);
  gst_element_class_add_static_pad_template(e, &sink_template);
  gst_element_class_add_static_pad_template(e, &src_template);
  gst_element_class_set_static_metadata(e, "tpuhal frame to tensor", "Filter/Converter/Video/Hardware",
                                        "NV12 or I420 frames to normalised planar RGB tensors, resized, on a tpuhal "
                                        "board",
                                        "tpuhal");
  auto* b = GST_BASE_TRANSFORM_CLASS(klass);
  b->transform_caps = convert_transform_caps;
  b->fixate_caps = convert_fixate_caps;
  b->set_caps = convert_set_caps;
  b->stop = convert_stop;
  b->prepare_output_buffer = convert_prepare_output_buffer;
  b->transform = convert_transform;
  b->passthrough_on_same_caps = FALSE;
}
