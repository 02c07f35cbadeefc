// Settings from the environment.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tpuhal::base {

// The comma-separated items of environment variable `name` ("a,b,,c" ->
// a, b, c: empty items are skipped), or of `fallback` when it is unset. Set
// but empty means no items.
std::vector<std::string> env_list(const char* name, std::string_view fallback = {});

}  // namespace tpuhal::base
