// The TpuhalDevice allocator and memory (memory.h), and tpuhalinfer's meta.
#include "memory.h"

#include <cstring>
#include <map>
#include <utility>
#include <vector>

namespace {

struct DeviceMemory {
  GstMemory mem;
  std::shared_ptr<tpuhal::gst::Payload>* payload;  // owned
};

struct TpuhalAllocator {
  GstAllocator parent;
};
struct TpuhalAllocatorClass {
  GstAllocatorClass parent_class;
};

GType tpuhal_allocator_get_type();
G_DEFINE_TYPE(TpuhalAllocator, tpuhal_allocator, GST_TYPE_ALLOCATOR)

// Device memory is made by wrap() only: there is nothing to make it from a size.
GstMemory* allocator_alloc(GstAllocator*, gsize, GstAllocationParams*) { return nullptr; }

void allocator_free(GstAllocator*, GstMemory* mem) {
  auto* m = reinterpret_cast<DeviceMemory*>(mem);
  delete m->payload;
  delete m;
}

DeviceMemory* make(GstAllocator* allocator, GstMemory* parent, std::shared_ptr<tpuhal::gst::Payload> p, gsize maxsize,
                   gsize offset, gsize size) {
  auto* m = new DeviceMemory{};
  gst_memory_init(&m->mem, static_cast<GstMemoryFlags>(0), allocator, parent, maxsize, 0, offset, size);
  m->payload = new std::shared_ptr<tpuhal::gst::Payload>(std::move(p));
  return m;
}

// A read mapping copies the whole memory to host memory once, through a copy
// queue of its own (mapping is the slow path: the elements here never map).
gpointer memory_map(GstMemory* mem, gsize, GstMapFlags flags) {
  if (flags & GST_MAP_WRITE) {
    GST_WARNING("device memory cannot be mapped for writing");
    return nullptr;
  }
  auto& p = **reinterpret_cast<DeviceMemory*>(mem)->payload;
  std::lock_guard lock(p.mu);
  try {
    if (!p.host.valid()) {
      tpuhal::Buffer host = p.device.allocate(p.size, tpuhal::Memory::HostPinned);
      tpuhal::Queue q = p.device.queue(tpuhal::Engine::Copy);
      q.copy(p.buffer, 0, host, 0, p.size).submit().wait();
      p.host = std::move(host);
    }
    return p.host.map().data();
  } catch (const tpuhal::Error& e) {
    GST_WARNING("cannot read device memory: %s", e.what());
    return nullptr;
  }
}

void memory_unmap(GstMemory*) {}

GstMemory* memory_share(GstMemory* mem, gssize offset, gssize size) {
  auto* m = reinterpret_cast<DeviceMemory*>(mem);
  GstMemory* parent = mem->parent ? mem->parent : mem;
  if (size == -1) size = static_cast<gssize>(mem->size) - offset;
  return &make(mem->allocator, parent, *m->payload, mem->maxsize, mem->offset + static_cast<gsize>(offset),
               static_cast<gsize>(size))
              ->mem;
}

gboolean memory_is_span(GstMemory*, GstMemory*, gsize*) { return FALSE; }

void tpuhal_allocator_class_init(TpuhalAllocatorClass* klass) {
  auto* a = GST_ALLOCATOR_CLASS(klass);
  a->alloc = allocator_alloc;
  a->free = allocator_free;
}

void tpuhal_allocator_init(TpuhalAllocator* self) {
  auto* a = GST_ALLOCATOR(self);
  a->mem_type = tpuhal::gst::kMemoryType;
  a->mem_map = memory_map;
  a->mem_unmap = memory_unmap;
  a->mem_share = memory_share;
  a->mem_is_span = memory_is_span;
  GST_OBJECT_FLAG_SET(self, GST_ALLOCATOR_FLAG_CUSTOM_ALLOC);
}

GstAllocator* allocator() {
  static GstAllocator* a = [] {
    auto* made = GST_ALLOCATOR(g_object_new(tpuhal_allocator_get_type(), nullptr));
    gst_object_ref_sink(made);
    // Kept for the process's life, as GStreamer's own allocators are.
    GST_OBJECT_FLAG_SET(made, GST_OBJECT_FLAG_MAY_BE_LEAKED);
    return made;
  }();
  return a;
}

gboolean class_meta_init(GstMeta* meta, gpointer, GstBuffer*) {
  auto* m = reinterpret_cast<tpuhal::gst::ClassMeta*>(meta);
  m->channel = 0;
  m->frame = 0;
  m->count = 0;
  return TRUE;
}

gboolean class_meta_transform(GstBuffer* dest, GstMeta* meta, GstBuffer*, GQuark type, gpointer) {
  if (!GST_META_TRANSFORM_IS_COPY(type)) return FALSE;
  auto* from = reinterpret_cast<tpuhal::gst::ClassMeta*>(meta);
  auto* to = tpuhal::gst::add_class_meta(dest);
  if (!to) return FALSE;
  to->channel = from->channel;
  to->frame = from->frame;
  to->count = from->count;
  std::memcpy(to->classes, from->classes, sizeof to->classes);
  std::memcpy(to->scores, from->scores, sizeof to->scores);
  return TRUE;
}

}  // namespace

namespace tpuhal::gst {

GstMemory* wrap(std::shared_ptr<Payload> payload) {
  const gsize size = payload->size;
  return &make(allocator(), nullptr, std::move(payload), size, 0, size)->mem;
}

std::shared_ptr<Payload> payload_of(GstBuffer* buffer) {
  if (gst_buffer_n_memory(buffer) == 0) return nullptr;
  GstMemory* mem = gst_buffer_peek_memory(buffer, 0);
  if (!gst_memory_is_type(mem, kMemoryType)) return nullptr;
  return *reinterpret_cast<DeviceMemory*>(mem)->payload;
}

bool has_device_feature(const GstCaps* caps) {
  if (!caps || gst_caps_is_any(caps) || gst_caps_get_size(caps) == 0) return false;
  GstCapsFeatures* f = gst_caps_get_features(caps, 0);
  return f && gst_caps_features_contains(f, kCapsFeature);
}

GType class_meta_api_type() {
  static GType type = [] {
    static const gchar* tags[] = {nullptr};
    return gst_meta_api_type_register("TpuhalClassMetaAPI", tags);
  }();
  return type;
}

const GstMetaInfo* class_meta_info() {
  static const GstMetaInfo* info = gst_meta_register(class_meta_api_type(), "TpuhalClassMeta", sizeof(ClassMeta),
                                                     class_meta_init, nullptr, class_meta_transform);
  return info;
}

ClassMeta* add_class_meta(GstBuffer* buffer) {
  return reinterpret_cast<ClassMeta*>(gst_buffer_add_meta(buffer, class_meta_info(), nullptr));
}

ClassMeta* get_class_meta(GstBuffer* buffer) {
  return reinterpret_cast<ClassMeta*>(gst_buffer_get_meta(buffer, class_meta_api_type()));
}

namespace {

// Per device and engine: the queues opened so far (up to two), the next to
// hand out, and how many elements hold one.
struct QueuePool {
  Device device;
  std::vector<std::unique_ptr<Queue>> queues;
  std::size_t next = 0;
  std::size_t users = 0;
};
std::mutex pools_mu;
std::map<std::string, QueuePool>& pools() {
  static auto* p = new std::map<std::string, QueuePool>;  // outlives every element
  return *p;
}

}  // namespace

SharedQueue::SharedQueue(Device& device, Engine engine) {
  std::lock_guard lock(pools_mu);
  const std::string key = device.uri() + "/" + std::to_string(static_cast<int>(engine));
  QueuePool& pool = pools()[key];
  try {
    if (pool.queues.size() < 2) {
      pool.device = device;
      pool.queues.push_back(std::make_unique<Queue>(device.queue(engine)));
    }
  } catch (const Error& e) {
    // Another process (or this one's other code) holds the rest.
    if (e.status() != Status::ResourceExhausted || pool.queues.empty()) {
      if (pool.users == 0) pools().erase(key);
      throw;
    }
  }
  queue_ = pool.queues[pool.next++ % pool.queues.size()].get();
  ++pool.users;
  key_ = key;
}

SharedQueue::~SharedQueue() { release(); }

SharedQueue::SharedQueue(SharedQueue&& o) noexcept
    : key_(std::move(o.key_)), queue_(std::exchange(o.queue_, nullptr)) {}

SharedQueue& SharedQueue::operator=(SharedQueue&& o) noexcept {
  if (this != &o) {
    release();
    key_ = std::move(o.key_);
    queue_ = std::exchange(o.queue_, nullptr);
  }
  return *this;
}

void SharedQueue::release() {
  if (!queue_) return;
  queue_ = nullptr;
  std::lock_guard lock(pools_mu);
  auto it = pools().find(key_);
  if (it != pools().end() && --it->second.users == 0) pools().erase(it);
}

Device open_device(const std::string& uri) {
  if (!uri.empty()) return open(uri);
  auto all = enumerate();
  if (all.empty()) throw Error(Status::NotFound, "no devices found (set the element's device property)");
  return open(all.front().uri);
}

std::string channel_text(std::uint32_t channel, const std::string& what) {
  return "channel " + std::to_string(channel) + ": " + what;
}

}  // namespace tpuhal::gst
