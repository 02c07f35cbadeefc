#include "tpuhal/base/env.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace tpuhal::base {

std::vector<std::string> env_list(const char* name, std::string_view fallback) {
  const char* env = std::getenv(name);
  std::string_view list = env ? std::string_view(env) : fallback;
  std::vector<std::string> out;
  while (!list.empty()) {
    const auto comma = list.find(',');
    const auto item = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    if (!item.empty()) out.emplace_back(item);
  }
  return out;
}

std::optional<std::set<std::string>> visible_devices() {
  std::optional<std::set<std::string>> out;
  if (std::getenv("TPUHAL_VISIBLE_DEVICES")) {
    out.emplace();
    for (auto& u : env_list("TPUHAL_VISIBLE_DEVICES")) out->insert(u);
  }
  constexpr std::string_view kPrefix = "TPUHAL_VISIBLE_DEVICE_";
  for (char** e = environ; e && *e; ++e) {
    const std::string_view kv(*e);
    const auto eq = kv.find('=');
    if (eq == std::string_view::npos || eq <= kPrefix.size() || kv.substr(0, kPrefix.size()) != kPrefix) continue;
    if (!out) out.emplace();
    if (eq + 1 < kv.size()) out->insert(std::string(kv.substr(eq + 1)));
  }
  return out;
}

}  // namespace tpuhal::base
