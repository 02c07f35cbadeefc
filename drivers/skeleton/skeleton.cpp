// Every call of the driver interface, each failing clearly. Replace them one
// at a time; the comments say what the real thing does.
#include "tpuhal/skeleton/skeleton.h"

#include <string>

namespace tpuhal::skeleton {
namespace {

[[noreturn]] void unimplemented(const std::string& uri, const char* what) {
  throw Error(Status::Unsupported, uri + ": the skeleton driver does not implement " + what);
}

class SkeletonDevice final : public driver::DeviceBackend {
 public:
  explicit SkeletonDevice(std::string uri) {
    // Fill the properties from what the device reports; capabilities stay
    // false until the calls behind them work.
    props_.uri = std::move(uri);
    props_.driver = "skeleton";
    props_.board = "skeleton (no hardware)";
    props_.bus = "none";
  }

  const Properties& properties() const override { return props_; }

  // Per-heap statistics from the driver's allocator.
  MemoryStats memory_stats() const override { return {}; }

  // Per-queue state read from the device.
  DeviceStatus status() const override { return {}; }

  // Carve device memory from a heap, or allocate and DMA-map host memory.
  std::shared_ptr<driver::BufferBackend> allocate(std::uint64_t, Memory memory,
                                                  const AllocOptions&) override {
    unimplemented(props_.uri, memory == Memory::HostPinned ? "pinned host memory" : "device memory");
  }

  // Claim a hardware queue of the engine and set up its ring.
  std::shared_ptr<driver::QueueBackend> create_queue(Engine engine, const QueueOptions&) override {
    unimplemented(props_.uri, (std::string(to_string(engine)) + " queues").c_str());
  }

  // import_host() keeps the interface's default: Unsupported.

 private:
  Properties props_;
};

class SkeletonProvider final : public driver::Provider {
 public:
  std::string_view scheme() const override { return "skeleton"; }
  // Discover devices: scan the bus, match IDs, describe each one.
  std::vector<DeviceInfo> enumerate() override { return {}; }
  // Open the device the URI names: map its registers, bring it up.
  std::shared_ptr<driver::DeviceBackend> open(std::string_view uri) override {
    return make_device(std::string(uri));
  }
  // Say why no devices can be found here (a missing library, no permission).
  std::string unavailable_reason() const override {
    return "the skeleton driver drives no hardware; it is the template for new drivers";
  }
};

}  // namespace

std::shared_ptr<driver::Provider> make_provider() { return std::make_shared<SkeletonProvider>(); }

std::shared_ptr<driver::DeviceBackend> make_device(std::string uri) {
  return std::make_shared<SkeletonDevice>(std::move(uri));
}

}  // namespace tpuhal::skeleton
