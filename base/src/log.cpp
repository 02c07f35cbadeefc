#include "tpuhal/base/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace tpuhal::base {
namespace {

std::optional<spdlog::level::level_enum> parse_level(std::string_view s) {
  static const std::pair<std::string_view, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace},       {"debug", spdlog::level::debug},  {"info", spdlog::level::info},
      {"warn", spdlog::level::warn},         {"warning", spdlog::level::warn}, {"error", spdlog::level::err},
      {"critical", spdlog::level::critical}, {"off", spdlog::level::off}};
  for (auto& [name, level] : kLevels)
    if (s == name) return level;
  return std::nullopt;
}

struct Spec {
  spdlog::level::level_enum fallback = spdlog::level::warn;
  std::map<std::string, spdlog::level::level_enum, std::less<>> per_logger;

  spdlog::level::level_enum level_for(std::string_view name) const {
    auto it = per_logger.find(name);
    return it == per_logger.end() ? fallback : it->second;
  }
};

std::optional<Spec> parse_spec(std::string_view text) {
  Spec spec;
  while (!text.empty()) {
    auto comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string_view::npos) {
      auto level = parse_level(item);
      if (!level) return std::nullopt;
      spec.fallback = *level;
    } else {
      auto level = parse_level(item.substr(eq + 1));
      if (!level || eq == 0) return std::nullopt;
      spec.per_logger[std::string(item.substr(0, eq))] = *level;
    }
  }
  return spec;
}

struct Registry {
  std::mutex mu;
  Spec spec;
  std::map<std::string, std::shared_ptr<spdlog::logger>, std::less<>> loggers;
  std::shared_ptr<spdlog::sinks::stderr_color_sink_mt> sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();

  Registry() {
    if (const char* env = std::getenv("TPUHAL_LOG")) {
      if (auto parsed = parse_spec(env)) {
        spec = *parsed;
      } else {
        spdlog::logger("tpuhal", sink)
            .warn(
                "TPUHAL_LOG='{}' does not parse; expected e.g. 'debug' or "
                "'warn,sim=trace'; using warn",
                env);
      }
    }
  }
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: loggers outlive statics
  return *r;
}

}  // namespace

std::shared_ptr<spdlog::logger> logger(std::string_view subsystem) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.loggers.find(subsystem);
  if (it != r.loggers.end()) return it->second;
  auto log = std::make_shared<spdlog::logger>(std::string(subsystem), r.sink);
  log->set_level(r.spec.level_for(subsystem));
  log->set_pattern("[%H:%M:%S.%f] [tpuhal:%n] [%l] %v");
  r.loggers.emplace(std::string(subsystem), log);
  return log;
}

bool set_log_spec(std::string_view text) {
  auto parsed = parse_spec(text);
  if (!parsed) return false;
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.spec = *parsed;
  for (auto& [name, log] : r.loggers) log->set_level(r.spec.level_for(name));
  return true;
}

}  // namespace tpuhal::base
