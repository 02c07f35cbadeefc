#include "plugin.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <set>

#include "tpuhal/monitor.hpp"
#include "tpuhal/tpuhal.hpp"

namespace tpuhal::plugin {
namespace {

constexpr const char* kHealthy = "Healthy";
constexpr const char* kUnhealthy = "Unhealthy";

std::uint64_t crashes_of(const Telemetry& t) {
  for (const auto& f : t.faults)
    if (f.kind == "firmware crash") return f.count;
  return 0;
}

}  // namespace

DevicePlugin::DevicePlugin(Options options) : options_(std::move(options)) {
  std::vector<std::string> uris = options_.uris;
  if (uris.empty())
    for (const auto& d : enumerate()) uris.push_back(d.uri);
  // Numbered as `tpuhal cdi generate` numbers them: among the boards that
  // can go into a container, in order.
  std::size_t next = 0;
  for (const std::string& uri : uris) {
    Board b;
    b.host = fleet::host_device(uri, std::to_string(next));
    if (!b.host.skipped.empty()) {
      std::fprintf(stderr, "tpuhal-device-plugin: left out %s: %s\n", uri.c_str(), b.host.skipped.c_str());
      continue;
    }
    ++next;
    if (auto it = options_.numa.find(uri); it != options_.numa.end()) b.host.numa_node = it->second;
    b.shared = observable(uri);
    boards_.push_back(std::move(b));
  }
}

std::size_t DevicePlugin::boards() const {
  std::lock_guard lock(mu_);
  return boards_.size();
}

void DevicePlugin::check_health() {
  std::vector<std::pair<std::string, bool>> uris;
  {
    std::lock_guard lock(mu_);
    for (auto& b : boards_) uris.emplace_back(b.host.uri, b.shared);
  }
  std::set<std::string> present;
  bool listed = false;
  // Reads happen unlocked: they ask another process, which may be slow.
  std::vector<std::optional<Telemetry>> telemetry(uris.size());
  std::vector<std::string> errors(uris.size());
  for (std::size_t i = 0; i < uris.size(); ++i) {
    try {
      if (uris[i].second) {
        telemetry[i] = observe(uris[i].first).telemetry;
      } else {
        if (!listed) {
          for (auto& d : enumerate()) present.insert(d.uri);
          listed = true;
        }
        if (!present.count(uris[i].first))
          errors[i] = "the board is no longer enumerated (removed, or its link is down)";
      }
    } catch (const Error& e) {
      errors[i] = e.what();
    }
  }
  std::lock_guard lock(mu_);
  bool changed = false;
  for (std::size_t i = 0; i < boards_.size() && i < uris.size(); ++i) {
    Board& b = boards_[i];
    const bool was = b.healthy();
    if (telemetry[i]) {
      const std::uint64_t crashes = crashes_of(*telemetry[i]), resets = telemetry[i]->resets;
      if (!b.seen || !b.error.empty())
        b.crashed = false;  // first sight, or back after being unreachable: judged from now on
      else if (crashes > b.crashes)
        b.crashed = true;
      else if (resets > b.resets)
        b.crashed = false;
      b.crashes = crashes;
      b.resets = resets;
      b.seen = true;
    }
    b.error = errors[i];
    if (b.healthy() != was) {
      const std::string why = !b.error.empty() ? b.error
                              : b.crashed      ? "its firmware crashed; reset it (tpuhal reset " + b.host.uri + ")"
                                               : std::string();
      std::fprintf(stderr, "tpuhal-device-plugin: %s is %s%s%s\n", b.host.uri.c_str(),
                   b.healthy() ? kHealthy : kUnhealthy, why.empty() ? "" : ": ", why.c_str());
      changed = true;
    }
  }
  if (changed) {
    ++generation_;
    changed_.notify_all();
  }
}

void DevicePlugin::stop() {
  std::lock_guard lock(mu_);
  stopping_ = true;
  changed_.notify_all();
}

v1beta1::ListAndWatchResponse DevicePlugin::list_locked() const {
  v1beta1::ListAndWatchResponse r;
  for (const Board& b : boards_) {
    const std::uint32_t n = b.shared ? options_.shares : 1;
    for (std::uint32_t k = 0; k < n; ++k) {
      v1beta1::Device* d = r.add_devices();
      d->set_id(n == 1 ? b.host.name : b.host.name + "-" + std::to_string(k));
      d->set_health(b.healthy() ? kHealthy : kUnhealthy);
      if (b.host.numa_node >= 0) d->mutable_topology()->add_nodes()->set_id(b.host.numa_node);
    }
  }
  return r;
}

const Board* DevicePlugin::board_of(const std::string& id) const {
  for (const Board& b : boards_) {
    const std::uint32_t n = b.shared ? options_.shares : 1;
    if (n == 1 && id == b.host.name) return &b;
    for (std::uint32_t k = 0; n > 1 && k < n; ++k)
      if (id == b.host.name + "-" + std::to_string(k)) return &b;
  }
  return nullptr;
}

grpc::Status DevicePlugin::GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                                  v1beta1::DevicePluginOptions* out) {
  out->set_pre_start_required(false);
  out->set_get_preferred_allocation_available(true);
  return grpc::Status::OK;
}

grpc::Status DevicePlugin::ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                                        grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) {
  std::unique_lock lock(mu_);
  for (;;) {
    const std::uint64_t sent = generation_;
    const v1beta1::ListAndWatchResponse list = list_locked();
    lock.unlock();
    if (!writer->Write(list)) return grpc::Status::OK;  // the kubelet went away
    lock.lock();
    // Until something changes; the slice notices a cancelled stream.
    while (generation_ == sent && !stopping_ && !ctx->IsCancelled())
      changed_.wait_for(lock, std::chrono::milliseconds(200));
    if (stopping_ || ctx->IsCancelled()) return grpc::Status::OK;
  }
}

grpc::Status DevicePlugin::GetPreferredAllocation(grpc::ServerContext*, const v1beta1::PreferredAllocationRequest* req,
                                                  v1beta1::PreferredAllocationResponse* out) {
  std::lock_guard lock(mu_);
  for (const auto& c : req->container_requests()) {
    if (c.allocation_size() < 0 || c.allocation_size() > c.available_deviceids_size())
      return {grpc::StatusCode::INVALID_ARGUMENT, "allocation_size " + std::to_string(c.allocation_size()) + " with " +
                                                      std::to_string(c.available_deviceids_size()) +
                                                      " devices available"};
    for (const auto& id : c.available_deviceids())
      if (!board_of(id)) return {grpc::StatusCode::INVALID_ARGUMENT, "unknown device ID '" + id + "'"};
    std::vector<std::string> chosen(c.must_include_deviceids().begin(), c.must_include_deviceids().end());
    auto numa_of = [&](const std::string& id) { return board_of(id)->host.numa_node; };
    // The NUMA node: that of the devices it must include, else the one
    // with the most devices available.
    std::map<int, int> available_on;
    for (const auto& id : c.available_deviceids()) ++available_on[numa_of(id)];
    int node = -1;
    if (!chosen.empty() && board_of(chosen.front())) {
      node = numa_of(chosen.front());
    } else if (!available_on.empty()) {
      node = std::max_element(available_on.begin(), available_on.end(), [](auto& a, auto& b) {
               return a.second < b.second;
             })->first;
    }
    // Then: that node's devices before others', and within a node a board
    // not yet chosen before a second share of one that is.
    std::vector<std::string> rest;
    for (const auto& id : c.available_deviceids())
      if (std::find(chosen.begin(), chosen.end(), id) == chosen.end()) rest.push_back(id);
    auto boards_chosen = [&](const std::string& id) {
      return std::count_if(chosen.begin(), chosen.end(),
                           [&](const std::string& x) { return board_of(x) == board_of(id); });
    };
    while (static_cast<int>(chosen.size()) < c.allocation_size() && !rest.empty()) {
      auto best = std::min_element(rest.begin(), rest.end(), [&](const std::string& a, const std::string& b) {
        const auto ka = std::make_pair(numa_of(a) != node, boards_chosen(a));
        const auto kb = std::make_pair(numa_of(b) != node, boards_chosen(b));
        return ka < kb;
      });
      chosen.push_back(*best);
      rest.erase(best);
    }
    auto* r = out->add_container_responses();
    for (const auto& id : chosen) r->add_deviceids(id);
  }
  return grpc::Status::OK;
}

grpc::Status DevicePlugin::Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* req,
                                    v1beta1::AllocateResponse* out) {
  std::lock_guard lock(mu_);
  for (const auto& c : req->container_requests()) {
    auto* r = out->add_container_responses();
    std::set<const Board*> given;
    std::set<std::string> mounted;
    for (const auto& id : c.devices_ids()) {
      const Board* b = board_of(id);
      if (!b) return {grpc::StatusCode::INVALID_ARGUMENT, "unknown device ID '" + id + "'"};
      if (!given.insert(b).second) continue;  // a second share of a board already given
      // The CDI device, and the same edits spelt out for runtimes without CDI.
      r->add_cdi_devices()->set_name(options_.cdi_kind + "=" + b->host.name);
      for (const auto& [k, v] : b->host.env) (*r->mutable_envs())[k] = v;
      for (const auto& m : b->host.mounts) {
        if (!mounted.insert(m.container_path).second) continue;  // boards of one daemon share its socket
        auto* mount = r->add_mounts();
        mount->set_container_path(m.container_path);
        mount->set_host_path(m.host_path);
        mount->set_read_only(std::find(m.options.begin(), m.options.end(), "ro") != m.options.end());
      }
      for (const auto& node : b->host.device_nodes) {
        auto* d = r->add_devices();
        d->set_container_path(node);
        d->set_host_path(node);
        d->set_permissions("rw");
      }
    }
  }
  return grpc::Status::OK;
}

grpc::Status DevicePlugin::PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest*,
                                             v1beta1::PreStartContainerResponse*) {
  return grpc::Status::OK;
}

}  // namespace tpuhal::plugin
