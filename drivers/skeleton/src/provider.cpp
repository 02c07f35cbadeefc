// The skeleton's provider: the "skeleton:" URI scheme and its one board.
//
// A port's provider owns its bus: enumerate() finds the boards on it and
// open() brings one up. The skeleton's board needs no bus, so it is always
// there, as "skeleton:0": a device with nothing in it, which the conformance
// suite opens like any other.
#include "device_impl.h"

namespace tpuhal::skeleton {

namespace {
constexpr std::string_view kOnlyDevice = "skeleton:0";
}  // namespace

void unsupported(std::string_view uri, std::string_view what, std::string_view port) {
  throw Error(Status::Unsupported,
              std::string(uri) + ": the skeleton driver " + std::string(what) + "; a port " + std::string(port));
}

// Contract: the devices this provider can open, one DeviceInfo each (URI,
// driver, board, memory). A port scans its bus, matches the IDs of its
// boards and describes each one; a bus with no board lists nothing.
std::vector<DeviceInfo> SkeletonProvider::enumerate() {
  return {DeviceInfo{std::string(kOnlyDevice), "skeleton", "skeleton (no hardware)", 0}};
}

// Contract: `uri` is the whole URI, scheme included. A port checks that the
// URI names a board it found (NotFound naming the ones there are, if not),
// maps its registers and brings it up.
std::shared_ptr<driver::DeviceBackend> SkeletonProvider::open(std::string_view uri) {
  if (uri != kOnlyDevice)
    throw Error(Status::NotFound,
                "no device '" + std::string(uri) + "': the skeleton driver has one, " + std::string(kOnlyDevice));
  return make_device(std::string(uri));
}

// Contract: non-empty when the provider cannot work on this machine, saying
// why (a missing library, no permission on the bus). The skeleton needs
// nothing, so it always works.
std::string SkeletonProvider::unavailable_reason() const { return {}; }

// Contract: sends a firmware image to the board at `uri` waiting in its
// loader and waits up to `timeout` for it to come back running it.
// Default: Unsupported.
void SkeletonProvider::upload_firmware(std::string_view uri, std::span<const std::byte>, std::chrono::milliseconds) {
  unsupported(uri, "has no loader to send firmware to (its board boots its own)",
              "whose boards wait in a loader sends the image here (SkeletonProvider::upload_firmware, "
              "src/provider.cpp); one whose boards boot their own deletes this override");
}

std::shared_ptr<driver::Provider> make_provider() { return std::make_shared<SkeletonProvider>(); }

std::shared_ptr<driver::DeviceBackend> make_device(std::string uri) {
  return std::make_shared<SkeletonDevice>(std::move(uri));
}

}  // namespace tpuhal::skeleton
