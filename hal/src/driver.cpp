// Defaults of the driver interface's optional calls.
#include "tpuhal/driver/driver.hpp"

namespace tpuhal::driver {

BufferBackend::~BufferBackend() = default;
QueueBackend::~QueueBackend() = default;
DeviceBackend::~DeviceBackend() = default;
Provider::~Provider() = default;
ProgramBackend::~ProgramBackend() = default;
DecoderBackend::~DecoderBackend() = default;
void DecoderBackend::interrupt() noexcept {}

std::shared_ptr<DecoderBackend> DeviceBackend::open_decoder(const DecoderConfig&) {
  throw Error(Status::Unsupported,
              properties().uri + ": this device has no video decoder (caps.video_decode is false)");
}

void DeviceBackend::reset() {
  throw Error(Status::Unsupported, properties().uri + ": this device cannot be reset by tpuhal");
}

void Provider::upload_firmware(std::string_view uri, std::span<const std::byte>, std::chrono::milliseconds) {
  throw Error(Status::Unsupported, std::string(uri) + ": the " + std::string(scheme()) +
                                       " driver's boards take no firmware from the host (they boot their own)");
}

bool Provider::observable(std::string_view) const { return false; }

BoardView Provider::observe(std::string_view uri) {
  throw Error(Status::Unsupported, std::string(uri) + ": the " + std::string(scheme()) +
                                       " driver's boards cannot be watched without opening them; open the device "
                                       "and read Device::telemetry()");
}

std::shared_ptr<ProgramBackend> DeviceBackend::create_program(std::span<const Command>) {
  throw Error(Status::Unsupported, properties().uri + ": this device cannot record programs");
}

std::optional<std::uint64_t> QueueBackend::timestamp_ns(std::uint64_t) const { return std::nullopt; }

std::string QueueBackend::diagnose() const { return {}; }

Telemetry DeviceBackend::telemetry() const {
  throw Error(Status::Unsupported, properties().uri + ": this device reports no telemetry (caps.telemetry is false)");
}

std::optional<ModelledTime> DeviceBackend::model_op(const OpDesc&) const { return std::nullopt; }
std::optional<ModelledTime> DeviceBackend::model_transfer(std::uint64_t, Memory, Memory) const { return std::nullopt; }
std::optional<std::uint64_t> DeviceBackend::board_time_ns() const { return std::nullopt; }
std::string DeviceBackend::refuse_op(const OpDesc&) const { return {}; }

std::optional<std::uint64_t> DeviceBackend::model_decode_ns(Codec, FrameType, std::uint32_t, std::uint32_t) const {
  return std::nullopt;
}

std::shared_ptr<BufferBackend> DeviceBackend::import_host(void*, std::uint64_t) {
  throw Error(Status::Unsupported, properties().uri +
                                       ": this device cannot import host memory "
                                       "(caps.import_host_memory is false); allocate "
                                       "Memory::HostPinned and copy into it");
}

std::string Provider::unavailable_reason() const { return {}; }

std::string Provider::protocol() const { return {}; }

}  // namespace tpuhal::driver
