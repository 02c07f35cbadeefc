// utilisation(): what two telemetry snapshots say about the interval
// between them (docs/telemetry.md).
#include <algorithm>
#include <string>

#include "tpuhal/error.hpp"
#include "tpuhal/types.hpp"

namespace tpuhal {
namespace {

std::uint64_t delta(std::uint64_t before, std::uint64_t after) { return after > before ? after - before : 0; }

}  // namespace

Utilisation utilisation(const Telemetry& before, const Telemetry& after) {
  if (after.uptime_ns <= before.uptime_ns)
    throw Error(Status::InvalidArgument, "utilisation: the second snapshot (board up " +
                                             std::to_string(after.uptime_ns) + " ns) is not later than the first (" +
                                             std::to_string(before.uptime_ns) +
                                             " ns): two snapshots of one board, oldest first");
  Utilisation u;
  const auto ns = static_cast<double>(after.uptime_ns - before.uptime_ns);
  u.interval_s = ns * 1e-9;
  auto share = [&](std::uint64_t b, std::uint64_t a) {
    return std::clamp(static_cast<double>(delta(b, a)) / ns, 0.0, 1.0);
  };
  for (const EngineTelemetry& e : after.engines) {
    std::uint64_t was = 0;
    for (const EngineTelemetry& o : before.engines)
      if (o.engine == e.engine) was = o.busy_ns;
    const double v = share(was, e.busy_ns);
    switch (e.engine) {
      case Engine::Compute: u.compute = v; break;
      case Engine::Copy: u.copy = v; break;
      case Engine::Video: u.video = v; break;
    }
  }
  std::uint64_t frames = 0;
  for (std::size_t i = 0; i < after.channels.size(); ++i) {
    const ChannelTelemetry& c = after.channels[i];
    const ChannelTelemetry none{};
    const ChannelTelemetry& o = i < before.channels.size() ? before.channels[i] : none;
    u.channels.push_back(share(o.busy_ns, c.busy_ns));
    frames += delta(o.frames, c.frames);
  }
  std::uint64_t commands = 0;
  for (std::size_t i = 0; i < after.queues.size(); ++i)
    commands += delta(i < before.queues.size() ? before.queues[i].commands : 0, after.queues[i].commands);
  u.h2d_gbps = static_cast<double>(delta(before.h2d_bytes, after.h2d_bytes)) / ns;
  u.d2h_gbps = static_cast<double>(delta(before.d2h_bytes, after.d2h_bytes)) / ns;
  u.d2d_gbps = static_cast<double>(delta(before.d2d_bytes, after.d2d_bytes)) / ns;
  u.commands_per_s = static_cast<double>(commands) / u.interval_s;
  u.frames_per_s = static_cast<double>(frames) / u.interval_s;
  return u;
}

}  // namespace tpuhal
