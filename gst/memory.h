// Device memory in GStreamer buffers: the `memory:TpuhalDevice` caps feature.
//
// tpuhaldec's frames and tpuhalconvert's tensors stay on the board between
// elements. Each such GstBuffer holds one GstMemory of type "TpuhalDevice"
// whose Payload keeps the device buffer alive (and, for a decoded frame, the
// decoder's frame buffer: it goes back to the channel when the last
// GstBuffer holding it is freed). Mapping one for reading copies it to host
// memory once, so any element can still read it (slowly); writing is
// refused.
#pragma once
#include <gst/gst.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "tpuhal/ops.hpp"
#include "tpuhal/tpuhal.hpp"
#include "tpuhal/video.hpp"

namespace tpuhal::gst {

inline constexpr const char* kMemoryType = "TpuhalDevice";
inline constexpr const char* kCapsFeature = "memory:TpuhalDevice";

struct Payload {
  Device device;
  std::optional<Frame> frame;  // tpuhaldec's output
  Buffer buffer;               // the frame's buffer, or a tensor's
  std::uint64_t size = 0;      // bytes of `buffer` the memory covers
  std::uint32_t channel = 0;   // the decoder channel the frame came from
  std::uint64_t index = 0;     // the frame's index on that channel

  std::mutex mu;  // guards host
  Buffer host;    // the copy a read mapping returns
};

// A GstMemory of type kMemoryType holding `payload` (size: payload->size).
GstMemory* wrap(std::shared_ptr<Payload> payload);

// The payload of a buffer whose first memory is device memory, else null.
std::shared_ptr<Payload> payload_of(GstBuffer* buffer);

// Whether `caps` (its first structure) carries the device-memory feature.
bool has_device_feature(const GstCaps* caps);

// Classification results tpuhalinfer attaches to a buffer.
struct ClassMeta {
  GstMeta meta;
  guint channel;
  guint64 frame;
  guint count;  // entries used below
  gint classes[16];
  gfloat scores[16];
};
GType class_meta_api_type();
const GstMetaInfo* class_meta_info();
ClassMeta* add_class_meta(GstBuffer* buffer);
ClassMeta* get_class_meta(GstBuffer* buffer);

// Queues the elements of a process share. A board has a few queues of each
// engine (the BM1684X-class profile: four compute, four copy) and a
// pipeline may hold dozens of elements; a queue takes batches from any
// thread, so they take turns. Held from an element's start to its stop.
class SharedQueue {
 public:
  SharedQueue() = default;
  SharedQueue(Device& device, Engine engine);  // throws as Device::queue
  ~SharedQueue();
  SharedQueue(SharedQueue&&) noexcept;
  SharedQueue& operator=(SharedQueue&&) noexcept;
  SharedQueue(const SharedQueue&) = delete;
  SharedQueue& operator=(const SharedQueue&) = delete;
  Queue& get() { return *queue_; }
  explicit operator bool() const { return queue_ != nullptr; }

 private:
  void release();
  std::string key_;
  Queue* queue_ = nullptr;
};

// The element's device: `uri`, or the first board tpuhal finds when it is
// empty. Throws NotFound (saying how to name one) or open()'s errors.
Device open_device(const std::string& uri);

// "channel 3: what", for errors that name the element's channel.
std::string channel_text(std::uint32_t channel, const std::string& what);

}  // namespace tpuhal::gst
