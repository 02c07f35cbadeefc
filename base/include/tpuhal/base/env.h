// Settings from the environment.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace tpuhal::base {

// The comma-separated items of environment variable `name` ("a,b,,c" ->
// a, b, c: empty items are skipped), or of `fallback` when it is unset. Set
// but empty means no items.
std::vector<std::string> env_list(const char* name, std::string_view fallback = {});

// The device URIs enumeration may list when the environment restricts it
// (a container given some boards, docs/operations.md): those of
// TPUHAL_VISIBLE_DEVICES (comma-separated) and of every
// TPUHAL_VISIBLE_DEVICE_<NAME> (one URI each, as a CDI spec sets one per
// device). Empty optional: neither is set, nothing is restricted.
std::optional<std::set<std::string>> visible_devices();

}  // namespace tpuhal::base
