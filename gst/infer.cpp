// tpuhalinfer: runs a compiled model (.tpm) on tpuhalconvert's tensors and
// attaches its top-k classes to each buffer, as a TpuhalClassMeta and as an
// element message "tpuhal-inference" on the bus. A detector compiled with
// --detect (its first output `detections`, [B, M, 6]) gives each buffer its
// boxes instead: a GstVideoRegionOfInterestMeta per box (roi type
// "class-N", a "detection" param with the class and score; pixels of the
// model's input) and an element message "tpuhal-detection".
//
// Buffers are gathered into batches of batch-size (by default the model's
// own batch dimension): with a funnel in front, one tpuhalinfer batches
// frames from several streams. A batch runs when it is full, or at the end
// of the stream with what it has; the buffers then leave in the order they
// came. The model's first input must be f32 [B, 3, H, W]; its first output
// [B, K] (or [B, K, 1, 1]) scores K classes.
#include <gst/base/gstbasetransform.h>
#include <gst/video/gstvideometa.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <numeric>
#include <string>
#include <vector>

#include "elements.h"
#include "memory.h"
#include "tpuhal/rt/model.hpp"

#define GST_CAT_DEFAULT tpuhal_debug

namespace {

namespace tg = tpuhal::gst;
using tpuhal::Error;

struct InferImpl {
  // Properties.
  std::string uri, model_path;
  guint batch_size = 0;  // 0: the model's
  guint top_k = 5;
  bool messages = true;

  tpuhal::Device device;
  tpuhal::rt::Model model;
  tpuhal::rt::Instance instance;
  tg::SharedQueue queue;
  tpuhal::Buffer host;  // the first output, read back
  std::int64_t batch = 1, height = 0, width = 0, classes = 0;
  std::int64_t boxes = 0;           // a detector's rows per frame (its output `detections`); 0: a classifier
  std::vector<GstBuffer*> pending;  // gathered for the next batch
  std::deque<GstBuffer*> ready;     // run, waiting to be pushed
  std::atomic<guint64> batches{0};  // read by get_property from any thread
};

struct TpuhalInfer {
  GstBaseTransform parent;
  InferImpl* impl;
};
struct TpuhalInferClass {
  GstBaseTransformClass parent_class;
};

}  // namespace

G_DEFINE_TYPE(TpuhalInfer, tpuhal_infer, GST_TYPE_BASE_TRANSFORM)

namespace {

enum { PROP_0, PROP_DEVICE, PROP_MODEL, PROP_BATCH_SIZE, PROP_TOP_K, PROP_MESSAGES, PROP_BATCHES };

#define TENSOR_CAPS                                                                            \
  "other/x-tpuhal-tensor(memory:TpuhalDevice), dtype = (string) f32, layout = (string) nchw, " \
  "channels = (int) 3, width = (int) [ 1, 16384 ], height = (int) [ 1, 16384 ]"

GstStaticPadTemplate sink_template =
    GST_STATIC_PAD_TEMPLATE("sink", GST_PAD_SINK, GST_PAD_ALWAYS, GST_STATIC_CAPS(TENSOR_CAPS));
GstStaticPadTemplate src_template =
    GST_STATIC_PAD_TEMPLATE("src", GST_PAD_SRC, GST_PAD_ALWAYS, GST_STATIC_CAPS(TENSOR_CAPS));

InferImpl& impl_of(GstBaseTransform* t) { return *reinterpret_cast<TpuhalInfer*>(t)->impl; }

void drop_buffers(InferImpl& s) {
  for (GstBuffer* b : s.pending) gst_buffer_unref(b);
  for (GstBuffer* b : s.ready) gst_buffer_unref(b);
  s.pending.clear();
  s.ready.clear();
}

gboolean infer_start(GstBaseTransform* t) {
  InferImpl& s = impl_of(t);
  std::string uri, path;
  guint batch_size;
  GST_OBJECT_LOCK(t);
  uri = s.uri;
  path = s.model_path;
  batch_size = s.batch_size;
  GST_OBJECT_UNLOCK(t);
  if (path.empty()) {
    GST_ELEMENT_ERROR(t, RESOURCE, NOT_FOUND, ("no model: set the model property to a .tpm file"), (nullptr));
    return FALSE;
  }
  try {
    s.device = tg::open_device(uri);
    s.model = tpuhal::rt::Model::load(s.device, path);
    const auto& in = s.model.inputs().at(0);
    const auto& out = s.model.outputs().at(0);
    if (in.shape.size() != 4 || in.shape[1] != 3 || in.dtype != tpuhal::DType::F32)
      throw Error(tpuhal::Status::InvalidArgument,
                  path + ": the model's first input is " + in.describe() + ", not f32[B, 3, H, W]");
    std::int64_t k = 1;
    for (std::size_t i = 1; i < out.shape.size(); ++i) k *= out.shape[i];
    if (out.shape.empty() || out.shape[0] != in.shape[0] || out.dtype != tpuhal::DType::F32)
      throw Error(tpuhal::Status::InvalidArgument,
                  path + ": the model's first output is " + out.describe() + ", not f32[B, K] scores");
    s.boxes = out.name == "detections" && out.shape.size() == 3 && out.shape[2] == 6 ? out.shape[1] : 0;
    s.batch = in.shape[0];
    s.height = in.shape[2];
    s.width = in.shape[3];
    s.classes = k;
    if (batch_size > s.batch)
      throw Error(tpuhal::Status::InvalidArgument, "batch-size " + std::to_string(batch_size) + " is over the " +
                                                       "model's batch of " + std::to_string(s.batch));
    if (batch_size) s.batch = batch_size;
    s.instance = s.model.instance();
    s.queue = tg::SharedQueue(s.device, tpuhal::Engine::Compute);
    s.host = s.device.allocate(out.bytes(), tpuhal::Memory::HostPinned);
  } catch (const Error& e) {
    GST_ELEMENT_ERROR(t, RESOURCE, OPEN_READ, ("cannot load the model \"%s\"", path.c_str()), ("%s", e.what()));
    return FALSE;
  }
  GST_INFO_OBJECT(t, "%s: input %lldx%lld, batches of %lld, %lld %s", path.c_str(), static_cast<long long>(s.width),
                  static_cast<long long>(s.height), static_cast<long long>(s.batch),
                  static_cast<long long>(s.boxes ? s.boxes : s.classes), s.boxes ? "boxes" : "classes");
  return TRUE;
}

gboolean infer_stop(GstBaseTransform* t) {
  InferImpl& s = impl_of(t);
  drop_buffers(s);
  s.host = tpuhal::Buffer();
  s.queue = tg::SharedQueue();
  s.instance = tpuhal::rt::Instance();
  s.model = tpuhal::rt::Model();
  s.device = tpuhal::Device();
  return TRUE;
}

// The model's input size, once it is loaded.
GstCaps* infer_transform_caps(GstBaseTransform* t, GstPadDirection, GstCaps* caps, GstCaps* filter) {
  InferImpl& s = impl_of(t);
  GstCaps* result = gst_caps_copy(caps);
  if (s.model) {
    GstCaps* model = gst_caps_from_string(TENSOR_CAPS);
    gst_caps_set_simple(model, "width", G_TYPE_INT, static_cast<gint>(s.width), "height", G_TYPE_INT,
                        static_cast<gint>(s.height), nullptr);
    GstCaps* both = gst_caps_intersect(result, model);
    gst_caps_unref(result);
    gst_caps_unref(model);
    result = both;
  }
  if (filter) {
    GstCaps* both = gst_caps_intersect_full(filter, result, GST_CAPS_INTERSECT_FIRST);
    gst_caps_unref(result);
    result = both;
  }
  return result;
}

// A detector's rows for buffer `b` (x1, y1, x2, y2, score, class; class -1
// after the last box): a region-of-interest meta per box, in the model
// input's pixels, and a "tpuhal-detection" message.
void attach_detections(GstBaseTransform* t, const InferImpl& s, GstBuffer* b, const tg::Payload& p, const float* rows,
                       bool messages) {
  std::string text;
  guint count = 0;
  for (std::int64_t r = 0; r < s.boxes; ++r) {
    const float* d = rows + r * 6;
    if (d[5] < 0) break;
    const auto clamp = [](float v, std::int64_t hi) {  // NaN: 0
      return v > 0 ? static_cast<guint>(std::min(v, static_cast<float>(hi))) : 0u;
    };
    const guint x1 = clamp(d[0], s.width), y1 = clamp(d[1], s.height);
    const guint x2 = std::max(x1, clamp(d[2], s.width)), y2 = std::max(y1, clamp(d[3], s.height));
    const int cls = static_cast<int>(d[5]);
    const std::string type = "class-" + std::to_string(cls);
    GstVideoRegionOfInterestMeta* m =
        gst_buffer_add_video_region_of_interest_meta(b, type.c_str(), x1, y1, x2 - x1, y2 - y1);
    m->id = static_cast<gint>(count);
    gst_video_region_of_interest_meta_add_param(
        m, gst_structure_new("detection", "class", G_TYPE_INT, cls, "score", G_TYPE_DOUBLE, static_cast<double>(d[4]),
                             "channel", G_TYPE_UINT, p.channel, nullptr));
    char item[160];
    std::snprintf(item, sizeof item, "%s%d:%.9g:%.9g,%.9g,%.9g,%.9g", count ? ";" : "", cls, static_cast<double>(d[4]),
                  static_cast<double>(d[0]), static_cast<double>(d[1]), static_cast<double>(d[2]),
                  static_cast<double>(d[3]));
    text += item;
    ++count;
  }
  if (!messages) return;
  GstStructure* st = gst_structure_new("tpuhal-detection", "channel", G_TYPE_UINT, p.channel, "frame", G_TYPE_UINT64,
                                       p.index, "pts", G_TYPE_UINT64, GST_BUFFER_PTS(b), "count", G_TYPE_UINT, count,
                                       "boxes", G_TYPE_STRING, text.c_str(), nullptr);
  gst_element_post_message(GST_ELEMENT(t), gst_message_new_element(GST_OBJECT(t), st));
}

// Runs the gathered buffers as one batch (slots past them keep what they
// held: their results are not read), attaches the results, and moves the
// buffers to `ready`.
GstFlowReturn run_batch(GstBaseTransform* t) {
  InferImpl& s = impl_of(t);
  if (s.pending.empty()) return GST_FLOW_OK;
  const std::uint64_t bytes = 3ull * static_cast<std::uint64_t>(s.height * s.width) * sizeof(float);
  const tpuhal::Tensor& input = s.instance.input_tensors().at(0);
  const tpuhal::Tensor& output = s.instance.output_tensors().at(0);
  std::vector<std::shared_ptr<tg::Payload>> payloads;
  for (GstBuffer* b : s.pending) {
    auto p = tg::payload_of(b);
    if (!p || p->frame || p->size != bytes) {
      GST_ELEMENT_ERROR(t, STREAM, FORMAT,
                        ("input is not a f32[1, 3, %lld, %lld] tensor in tpuhal device memory",
                         static_cast<long long>(s.height), static_cast<long long>(s.width)),
                        (nullptr));
      return GST_FLOW_ERROR;
    }
    if (p->device.uri() != s.device.uri()) {
      GST_ELEMENT_ERROR(t, STREAM, FORMAT,
                        ("tensors from %s, and the model is on %s", p->device.uri().c_str(), s.device.uri().c_str()),
                        ("set the device property of tpuhalinfer to the decoder's"));
      return GST_FLOW_ERROR;
    }
    payloads.push_back(std::move(p));
  }
  try {
    tpuhal::Queue& q = s.queue.get();
    tpuhal::Batch in = q.batch();
    for (std::size_t i = 0; i < payloads.size(); ++i)
      in.copy(payloads[i]->buffer, 0, input.buffer(), input.offset() + i * bytes, bytes);
    in.submit();
    s.instance.submit(q);
    q.copy(output.buffer(), output.offset(), s.host, 0, s.host.size()).submit().wait();
  } catch (const Error& e) {
    const std::string text = tg::channel_text(payloads.front()->channel, "inference failed");
    GST_ELEMENT_ERROR(t, STREAM, FAILED, ("%s", text.c_str()), ("%s", e.what()));
    return GST_FLOW_ERROR;
  }
  ++s.batches;
  const auto* scores = reinterpret_cast<const float*>(s.host.map().data());
  if (s.boxes) {
    GST_OBJECT_LOCK(t);
    const bool messages = s.messages;
    GST_OBJECT_UNLOCK(t);
    for (std::size_t i = 0; i < s.pending.size(); ++i) {
      GstBuffer* b = gst_buffer_make_writable(s.pending[i]);
      s.pending[i] = nullptr;
      attach_detections(t, s, b, *payloads[i], scores + i * static_cast<std::size_t>(s.boxes) * 6, messages);
      s.ready.push_back(b);
    }
    s.pending.clear();
    return GST_FLOW_OK;
  }
  GST_OBJECT_LOCK(t);
  const guint k = std::min<guint>({s.top_k, 16u, static_cast<guint>(s.classes)});
  const bool messages = s.messages;
  GST_OBJECT_UNLOCK(t);
  std::vector<int> order(static_cast<std::size_t>(s.classes));
  for (std::size_t i = 0; i < s.pending.size(); ++i) {
    const float* row = scores + i * static_cast<std::size_t>(s.classes);
    std::iota(order.begin(), order.end(), 0);
    // Highest score first; the lower class number first among equals.
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    GstBuffer* b = gst_buffer_make_writable(s.pending[i]);
    s.pending[i] = nullptr;
    tg::ClassMeta* m = tg::add_class_meta(b);
    m->channel = payloads[i]->channel;
    m->frame = payloads[i]->index;
    m->count = k;
    std::string top;
    for (guint j = 0; j < k; ++j) {
      m->classes[j] = order[j];
      m->scores[j] = row[order[j]];
      char item[48];
      std::snprintf(item, sizeof item, "%s%d:%.6g", j ? " " : "", order[j], static_cast<double>(row[order[j]]));
      top += item;
    }
    if (messages) {
      GstStructure* st = gst_structure_new(
          "tpuhal-inference", "channel", G_TYPE_UINT, m->channel, "frame", G_TYPE_UINT64, m->frame, "pts",
          G_TYPE_UINT64, GST_BUFFER_PTS(b), "class", G_TYPE_INT, k ? order[0] : -1, "score", G_TYPE_DOUBLE,
          k ? static_cast<double>(row[order[0]]) : 0.0, "top-k", G_TYPE_STRING, top.c_str(), nullptr);
      gst_element_post_message(GST_ELEMENT(t), gst_message_new_element(GST_OBJECT(t), st));
    }
    s.ready.push_back(b);
  }
  s.pending.clear();
  return GST_FLOW_OK;
}

GstFlowReturn infer_submit_input_buffer(GstBaseTransform* t, gboolean, GstBuffer* input) {
  InferImpl& s = impl_of(t);
  s.pending.push_back(input);
  if (static_cast<std::int64_t>(s.pending.size()) < s.batch) return GST_FLOW_OK;
  return run_batch(t);
}

GstFlowReturn infer_generate_output(GstBaseTransform* t, GstBuffer** out) {
  InferImpl& s = impl_of(t);
  *out = nullptr;
  if (s.ready.empty()) return GST_FLOW_OK;
  *out = s.ready.front();
  s.ready.pop_front();
  return GST_FLOW_OK;
}

// Runs what was gathered as a part batch and pushes it downstream, outside
// the base class's chain (for events and queries that must not wait for a
// full batch). After a push is refused, the rest stay for stop() to drop.
// Returns run_batch()'s result.
GstFlowReturn push_part_batch(GstBaseTransform* t) {
  InferImpl& s = impl_of(t);
  const GstFlowReturn ret = run_batch(t);
  while (ret == GST_FLOW_OK && !s.ready.empty()) {
    GstBuffer* b = s.ready.front();
    s.ready.pop_front();
    if (gst_pad_push(GST_BASE_TRANSFORM_SRC_PAD(t), b) != GST_FLOW_OK) break;
  }
  return ret;
}

// At the end of a stream (or a drain), a part batch runs and leaves before
// the event; a flush drops what was gathered.
gboolean infer_sink_event(GstBaseTransform* t, GstEvent* event) {
  InferImpl& s = impl_of(t);
  const GstEventType type = GST_EVENT_TYPE(event);
  if (type == GST_EVENT_EOS || type == GST_EVENT_GAP || type == GST_EVENT_SEGMENT_DONE) {
    if (push_part_batch(t) != GST_FLOW_OK) {
      gst_event_unref(event);
      return FALSE;
    }
  } else if (type == GST_EVENT_FLUSH_STOP) {
    drop_buffers(s);
  }
  return GST_BASE_TRANSFORM_CLASS(tpuhal_infer_parent_class)->sink_event(t, event);
}

gboolean infer_query(GstBaseTransform* t, GstPadDirection direction, GstQuery* query) {
  // A drain query (an upstream pool reconfiguring) gets the part batch out.
  if (direction == GST_PAD_SINK && GST_QUERY_TYPE(query) == GST_QUERY_DRAIN) {
    push_part_batch(t);
  }
  return GST_BASE_TRANSFORM_CLASS(tpuhal_infer_parent_class)->query(t, direction, query);
}

void infer_set_property(GObject* object, guint id, const GValue* value, GParamSpec* pspec) {
  InferImpl& s = *reinterpret_cast<TpuhalInfer*>(object)->impl;
  GST_OBJECT_LOCK(object);
  switch (id) {
    case PROP_DEVICE:
    case PROP_MODEL: {
      const gchar* v = g_value_get_string(value);
      (id == PROP_DEVICE ? s.uri : s.model_path) = v ? v : "";
      break;
    }
    case PROP_BATCH_SIZE: s.batch_size = g_value_get_uint(value); break;
    case PROP_TOP_K: s.top_k = g_value_get_uint(value); break;
    case PROP_MESSAGES: s.messages = g_value_get_boolean(value); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
  }
  GST_OBJECT_UNLOCK(object);
}

void infer_get_property(GObject* object, guint id, GValue* value, GParamSpec* pspec) {
  InferImpl& s = *reinterpret_cast<TpuhalInfer*>(object)->impl;
  GST_OBJECT_LOCK(object);
  switch (id) {
    case PROP_DEVICE: g_value_set_string(value, s.uri.c_str()); break;
    case PROP_MODEL: g_value_set_string(value, s.model_path.c_str()); break;
    case PROP_BATCH_SIZE: g_value_set_uint(value, s.batch_size); break;
    case PROP_TOP_K: g_value_set_uint(value, s.top_k); break;
    case PROP_MESSAGES: g_value_set_boolean(value, s.messages); break;
    case PROP_BATCHES: g_value_set_uint64(value, s.batches); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
  }
  GST_OBJECT_UNLOCK(object);
}

void infer_finalize(GObject* object) {
  auto* self = reinterpret_cast<TpuhalInfer*>(object);
  drop_buffers(*self->impl);
  delete self->impl;
  G_OBJECT_CLASS(tpuhal_infer_parent_class)->finalize(object);
}

}  // namespace

static void tpuhal_infer_init(TpuhalInfer* self) {
  self->impl = new InferImpl;
  gst_base_transform_set_qos_enabled(GST_BASE_TRANSFORM(self), FALSE);
}

static void tpuhal_infer_class_init(TpuhalInferClass* klass) {
  auto* o = G_OBJECT_CLASS(klass);
  o->set_property = infer_set_property;
  o->get_property = infer_get_property;
  o->finalize = infer_finalize;
  const auto rw = static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  g_object_class_install_property(
      o, PROP_DEVICE,
      g_param_spec_string("device", "Device", "The board's URI, the decoder's (empty: the first board tpuhal finds)",
                          "", rw));
  g_object_class_install_property(
      o, PROP_MODEL, g_param_spec_string("model", "Model", "A compiled model (.tpm, from tpuhal compile)", "", rw));
  g_object_class_install_property(
      o, PROP_BATCH_SIZE,
      g_param_spec_uint("batch-size", "Batch size", "Buffers per run, up to the model's batch (0: the model's)", 0,
                        4096, 0, rw));
  g_object_class_install_property(
      o, PROP_TOP_K,
      g_param_spec_uint("top-k", "Top k", "Classes kept per frame, best first (at most 16)", 1, 16, 5,
                        static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS)));
  g_object_class_install_property(
      o, PROP_MESSAGES,
      g_param_spec_boolean("messages", "Messages", "Post a tpuhal-inference element message per frame", TRUE,
                           static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS)));
  g_object_class_install_property(
      o, PROP_BATCHES,
      g_param_spec_uint64("batches", "Batches", "Batches run so far", 0, G_MAXUINT64, 0,
                          static_cast<GParamFlags>(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS)));

  auto* e = GST_ELEMENT_CLASS(klass);
  gst_element_class_add_static_pad_template(e, &sink_template);
  gst_element_class_add_static_pad_template(e, &src_template);
  gst_element_class_set_static_metadata(e, "tpuhal inference", "Filter/Analyzer/Video/Hardware",
                                        "Runs a compiled model on a tpuhal board and attaches its top-k classes, or a "
                                        "detector's boxes (region-of-interest metas)",
                                        "tpuhal");
  auto* b = GST_BASE_TRANSFORM_CLASS(klass);
  b->start = infer_start;
  b->stop = infer_stop;
  b->transform_caps = infer_transform_caps;
  b->submit_input_buffer = infer_submit_input_buffer;
  b->generate_output = infer_generate_output;
  b->sink_event = infer_sink_event;
  b->query = infer_query;
  b->passthrough_on_same_caps = FALSE;
}
