// Decoding the board's telemetry block (fw/telemetry.h).
#include "tpuhal/tpu/telemetry.h"

#include <algorithm>
#include <cstring>

#include "device_impl.h"
#include "tpuhal/base/hex.h"
#include "tpuhal/fw/status.h"
#include "tpuhal/fw/telemetry.h"

namespace tpuhal::tpu {

Engine to_engine(fw::EngineType e) {
  switch (e) {
    case fw::EngineType::kCopy: return Engine::Copy;
    case fw::EngineType::kVideo: return Engine::Video;
    default: return Engine::Compute;
  }
}

fw::EngineType to_fw(Engine e) {
  switch (e) {
    case Engine::Compute: return fw::EngineType::kCompute;
    case Engine::Copy: return fw::EngineType::kCopy;
    case Engine::Video: return fw::EngineType::kVideo;
  }
  return fw::EngineType::kNone;
}

Telemetry decode_telemetry(std::span<const std::byte> bytes, std::span<const Engine> engines_in,
                           const std::string& who) {
  if (bytes.size() < sizeof(fw::TelemetryHeader))
    throw Error(Status::DeviceFault,
                who + ": the telemetry block is " + std::to_string(bytes.size()) + " bytes, shorter than its header");
  const std::byte* block = bytes.data();
  fw::TelemetryHeader h;
  std::memcpy(&h, block, sizeof h);
  if (h.magic != fw::kTelemetryMagic || h.version < 1 || h.header_bytes < sizeof h || h.total_bytes > bytes.size() ||
      h.queue_bytes < sizeof(fw::TelemetryQueue) || h.channel_bytes < sizeof(fw::TelemetryChannel) ||
      std::uint64_t{h.header_bytes} + std::uint64_t{h.num_queues} * h.queue_bytes +
              std::uint64_t{h.num_channels} * h.channel_bytes >
          bytes.size())
    throw Error(Status::DeviceFault, who + ": the board's telemetry block is malformed (magic " + hex(h.magic) +
                                         ", version " + std::to_string(h.version) + ", " +
                                         std::to_string(bytes.size()) + " bytes)");
  // Without a list, the engines are those the queue entries name.
  std::vector<Engine> engines(engines_in.begin(), engines_in.end());
  const std::byte* entry = block + h.header_bytes;
  for (std::uint32_t i = 0; engines_in.empty() && i < h.num_queues; ++i, entry += h.queue_bytes) {
    fw::TelemetryQueue q;
    std::memcpy(&q, entry, sizeof q);
    const Engine e = to_engine(static_cast<fw::EngineType>(q.engine));
    if (std::find(engines.begin(), engines.end(), e) == engines.end()) engines.push_back(e);
  }
  std::sort(engines.begin(), engines.end());
  Telemetry out;
  out.time_ns = h.board_time_ns;
  out.uptime_ns = h.uptime_ns;
  out.resets = h.resets;
  for (const Engine e : engines) out.engines.push_back({e, h.engine_busy_ns[static_cast<std::uint32_t>(to_fw(e))]});
  const std::byte* at = block + h.header_bytes;
  for (std::uint32_t i = 0; i < h.num_queues; ++i, at += h.queue_bytes) {
    fw::TelemetryQueue q;
    std::memcpy(&q, at, sizeof q);
    out.queues.push_back(
        {to_engine(static_cast<fw::EngineType>(q.engine)), q.index, q.commands, q.busy_ns, q.failures});
  }
  for (std::uint32_t i = 0; i < h.num_channels; ++i, at += h.channel_bytes) {
    fw::TelemetryChannel c;
    std::memcpy(&c, at, sizeof c);
    out.channels.push_back({i, c.packets, c.frames, c.errors, c.busy_ns});
  }
  out.h2d_bytes = h.dma_bytes[static_cast<std::uint32_t>(fw::DmaDirection::kHostToDevice)];
  out.d2h_bytes = h.dma_bytes[static_cast<std::uint32_t>(fw::DmaDirection::kDeviceToHost)];
  out.d2d_bytes = h.dma_bytes[static_cast<std::uint32_t>(fw::DmaDirection::kDeviceToDevice)];
  out.h2h_bytes = h.dma_bytes[static_cast<std::uint32_t>(fw::DmaDirection::kHostToHost)];
  for (std::uint32_t k = 1; k < fw::kTelemetryFaultKinds; ++k)
    if (h.faults[k]) out.faults.push_back({fw::to_string(static_cast<fw::CmdStatus>(k)), h.faults[k]});
  if (h.firmware_crashes) out.faults.push_back({"firmware crash", h.firmware_crashes});
  out.temperature_c = h.temperature_mc / 1000.0;
  out.power_w = h.power_mw / 1000.0;
  out.power_limit_w = h.power_limit_mw / 1000.0;
  out.energy_j = static_cast<double>(h.energy_uj) / 1e6;
  out.clock_mhz = h.clock_mhz;
  return out;
}

}  // namespace tpuhal::tpu
