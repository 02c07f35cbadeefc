// Logging: one spdlog logger per subsystem ("hal", "tpu", "sim", ...).
//
// The level comes from the TPUHAL_LOG environment variable, read once:
//   TPUHAL_LOG=debug              every subsystem at debug
//   TPUHAL_LOG=warn,sim=trace     warn by default, the simulator at trace
// Levels: trace, debug, info, warn, error, critical, off. Default: warn.
// Messages go to stderr.
#pragma once

#include <memory>
#include <string_view>

namespace spdlog {
class logger;
}

namespace tpuhal::base {

// The logger for `subsystem`, created on first use. Thread-safe.
std::shared_ptr<spdlog::logger> logger(std::string_view subsystem);

// Re-reads TPUHAL_LOG-style `spec` and applies it to every logger, existing
// and future. Returns false (and changes nothing) if the spec does not parse.
bool set_log_spec(std::string_view spec);

}  // namespace tpuhal::base
