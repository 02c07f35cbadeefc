#include "tpuhal/base/env.h"

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

}  // namespace tpuhal::base
