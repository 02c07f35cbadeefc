// The driver registry: providers by URI scheme, and the devices open in this
// process (opening an open URI again returns the same device).
#include <spdlog/spdlog.h>

#include <map>
#include <mutex>

#include "impl.hpp"
#include "tpuhal/monitor.hpp"
#include "tpuhal/base/env.h"
#include "tpuhal/base/log.h"

namespace tpuhal {
namespace detail {
namespace {

struct Registry {
  std::mutex mu;
  bool builtins_loaded = false;
  std::vector<std::shared_ptr<driver::Provider>> providers;
  std::map<std::string, std::weak_ptr<DeviceImpl>, std::less<>> open;

  void load_builtins_locked() {
    if (builtins_loaded) return;
    builtins_loaded = true;
    for (auto& p : builtin_providers()) add_locked(std::move(p));
  }
  void add_locked(std::shared_ptr<driver::Provider> provider) {
    for (auto& p : providers) {
      if (p->scheme() == provider->scheme()) {
        p = std::move(provider);
        return;
      }
    }
    providers.push_back(std::move(provider));
  }
  std::vector<std::shared_ptr<driver::Provider>> snapshot() {
    std::lock_guard lock(mu);
    load_builtins_locked();
    return providers;
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

namespace {

// The provider of `uri`'s scheme. Throws InvalidArgument (no scheme),
// NotFound (naming the drivers there are), Unavailable (the driver's reason).
std::shared_ptr<driver::Provider> provider_locked(Registry& r, std::string_view uri) {
  const auto colon = uri.find(':');
  if (colon == std::string_view::npos || colon == 0)
    throw Error(Status::InvalidArgument, "device URI '" + std::string(uri) + "' has no scheme; URIs look like sim:0");
  const std::string_view scheme = uri.substr(0, colon);
  r.load_builtins_locked();
  std::shared_ptr<driver::Provider> provider;
  std::string schemes;
  for (auto& p : r.providers) {
    schemes += (schemes.empty() ? "" : ", ") + std::string(p->scheme());
    if (p->scheme() == scheme) provider = p;
  }
  if (!provider) throw Error(Status::NotFound, "no driver for '" + std::string(uri) + "' (drivers: " + schemes + ")");
  if (auto why = provider->unavailable_reason(); !why.empty())
    throw Error(Status::Unavailable, std::string(uri) + ": " + why);
  return provider;
}

}  // namespace

std::shared_ptr<DeviceImpl> open_device(std::string_view uri) {
  Registry& r = registry();
  std::unique_lock lock(r.mu);
  r.load_builtins_locked();
  if (auto it = r.open.find(uri); it != r.open.end()) {
    if (auto dev = it->second.lock()) return dev;
  }
  auto provider = provider_locked(r, uri);
  // Opening is serialised: it is rare, and it keeps one device per URI.
  auto backend = provider->open(uri);
  auto dev = std::make_shared<DeviceImpl>(std::string(uri), std::move(backend));
  r.open[std::string(uri)] = dev;
  base::logger("hal")->debug("opened {}", uri);
  return dev;
}

}  // namespace detail

namespace driver {
void register_provider(std::shared_ptr<Provider> provider) {
  if (!provider) throw Error(Status::InvalidArgument, "register_provider: null provider");
  auto& r = detail::registry();
  std::lock_guard lock(r.mu);
  r.load_builtins_locked();
  r.add_locked(std::move(provider));
}
}  // namespace driver

std::vector<DeviceInfo> enumerate() {
  std::vector<DeviceInfo> all;
  for (auto& p : detail::registry().snapshot()) {
    try {
      auto found = p->enumerate();
      all.insert(all.end(), found.begin(), found.end());
    } catch (const std::exception& e) {
      base::logger("hal")->warn("driver '{}' failed to enumerate: {}", p->scheme(), e.what());
    }
  }
  if (const auto visible = base::visible_devices())
    std::erase_if(all, [&](const DeviceInfo& d) { return !visible->count(d.uri); });
  return all;
}

std::vector<std::pair<std::string, std::string>> unavailable_drivers() {
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& p : detail::registry().snapshot())
    if (auto why = p->unavailable_reason(); !why.empty()) out.emplace_back(p->scheme(), why);
  return out;
}

Device open(std::string_view uri) { return Device(detail::open_device(uri)); }

void upload_firmware(std::string_view uri, std::span<const std::byte> image, std::chrono::milliseconds timeout) {
  std::shared_ptr<driver::Provider> provider;
  {
    auto& r = detail::registry();
    std::lock_guard lock(r.mu);
    provider = detail::provider_locked(r, uri);
  }
  provider->upload_firmware(uri, image, timeout);  // unlocked: it waits for the board
}

bool observable(std::string_view uri) {
  std::shared_ptr<driver::Provider> provider;
  {
    auto& r = detail::registry();
    std::lock_guard lock(r.mu);
    try {
      provider = detail::provider_locked(r, uri);
    } catch (const Error&) {
      return false;
    }
  }
  return provider->observable(uri);
}

BoardView observe(std::string_view uri) {
  std::shared_ptr<driver::Provider> provider;
  {
    auto& r = detail::registry();
    std::lock_guard lock(r.mu);
    provider = detail::provider_locked(r, uri);
  }
  return provider->observe(uri);  // unlocked: it asks another process
}

const char* version() noexcept { return TPUHAL_VERSION_STRING; }

std::vector<std::pair<std::string, std::string>> protocol_versions() {
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& p : detail::registry().snapshot())
    if (auto protocol = p->protocol(); !protocol.empty()) out.emplace_back(p->scheme(), std::move(protocol));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace tpuhal
