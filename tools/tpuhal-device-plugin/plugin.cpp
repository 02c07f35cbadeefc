#include "plugin.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <string_view>
#include <tuple>
#include <unordered_set>

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

// The boards of `o`, numbered as `tpuhal cdi generate` numbers them: among
// the boards that can go into a container, in order.
std::vector<Board> advertise(const Options& o) {
  std::vector<std::string> uris = o.uris;
  if (uris.empty())
    for (const auto& d : enumerate()) uris.push_back(d.uri);
  std::vector<Board> boards;
  std::size_t next = 0;
  for (const std::string& uri : uris) {
    Board b;
    b.host = fleet::host_device(uri, std::to_string(next));
    if (!b.host.skipped.empty()) {
      std::fprintf(stderr, "tpuhal-device-plugin: left out %s: %s\n", uri.c_str(), b.host.skipped.c_str());
      continue;
    }
    ++next;
    if (auto it = o.numa.find(uri); it != o.numa.end()) b.host.numa_node = it->second;
    b.shared = observable(uri);
    boards.push_back(std::move(b));
  }
  return boards;
}

// Every device ID advertised ("0", or "0-0", "0-1", ... with shares), to
// the index of its board.
std::unordered_map<std::string, int> index_ids(const std::vector<Board>& boards, std::uint32_t shares) {
  std::unordered_map<std::string, int> ids;
  for (std::size_t i = 0; i < boards.size(); ++i) {
    const Board& b = boards[i];
    const std::uint32_t n = b.shared ? shares : 1;
    if (n == 1) ids.emplace(b.host.name, static_cast<int>(i));
    for (std::uint32_t k = 0; n > 1 && k < n; ++k)
      ids.emplace(b.host.name + "-" + std::to_string(k), static_cast<int>(i));
  }
  return ids;
}

grpc::Status invalid(std::string what) { return {grpc::StatusCode::INVALID_ARGUMENT, std::move(what)}; }

}  // namespace

DevicePlugin::DevicePlugin(Options options)
    : options_(std::move(options)),
      boards_(advertise(options_)),
      ids_(index_ids(boards_, options_.shares)),
      health_(boards_.size()) {}

std::size_t DevicePlugin::boards() const { return boards_.size(); }

void DevicePlugin::check_health() {
  std::set<std::string> present;
  bool listed = false;
  // Reads happen unlocked: they ask another process, which may be slow.
  std::vector<std::optional<Telemetry>> telemetry(boards_.size());
  std::vector<std::string> errors(boards_.size());
  for (std::size_t i = 0; i < boards_.size(); ++i) {
    const std::string& uri = boards_[i].host.uri;
    try {
      if (boards_[i].shared) {
        telemetry[i] = observe(uri).telemetry;
      } else {
        if (!listed) {
          for (auto& d : enumerate()) present.insert(d.uri);
          listed = true;
        }
        if (!present.count(uri)) errors[i] = "the board is no longer enumerated (removed, or its link is down)";
      }
    } catch (const Error& e) {
      errors[i] = e.what();
    }
  }
  std::lock_guard lock(mu_);
  bool changed = false;
  for (std::size_t i = 0; i < boards_.size(); ++i) {
    Health& b = health_[i];
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
                              : b.crashed ? "its firmware crashed; reset it (tpuhal reset " + boards_[i].host.uri + ")"
                                          : std::string();
      std::fprintf(stderr, "tpuhal-device-plugin: %s is %s%s%s\n", boards_[i].host.uri.c_str(),
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
  for (std::size_t i = 0; i < boards_.size(); ++i) {
    const Board& b = boards_[i];
    const std::uint32_t n = b.shared ? options_.shares : 1;
    for (std::uint32_t k = 0; k < n; ++k) {
      v1beta1::Device* d = r.add_devices();
      d->set_id(n == 1 ? b.host.name : b.host.name + "-" + std::to_string(k));
      d->set_health(health_[i].healthy() ? kHealthy : kUnhealthy);
      if (b.host.numa_node >= 0) d->mutable_topology()->add_nodes()->set_id(b.host.numa_node);
    }
  }
  return r;
}

int DevicePlugin::board_of(const std::string& id) const {
  const auto it = ids_.find(id);
  return it == ids_.end() ? -1 : it->second;
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

// Without the lock (it reads only boards_ and ids_) and in time linear in
// the request: a kubelet, or anything else that reaches the socket, cannot
// make a request that holds up Allocate or the health checks.
grpc::Status DevicePlugin::GetPreferredAllocation(grpc::ServerContext*, const v1beta1::PreferredAllocationRequest* req,
                                                  v1beta1::PreferredAllocationResponse* out) {
  for (const auto& c : req->container_requests()) {
    const auto& available = c.available_deviceids();
    const auto& must = c.must_include_deviceids();
    if (c.allocation_size() < 0 || c.allocation_size() > available.size())
      return invalid("allocation_size " + std::to_string(c.allocation_size()) + " with " +
                     std::to_string(available.size()) + " devices available");
    // Every ID known and listed once (the kubelet lists each device once;
    // a repeat is a broken caller, refused by name rather than guessed at).
    std::vector<int> board(static_cast<std::size_t>(available.size()));
    std::unordered_set<std::string_view> listed, chosen;
    listed.reserve(board.size());
    for (int i = 0; i < available.size(); ++i) {
      const std::string& id = available[i];
      if ((board[i] = board_of(id)) < 0) return invalid("unknown device ID '" + id + "'");
      if (!listed.insert(id).second) return invalid("device ID '" + id + "' is listed twice in available_deviceIDs");
    }
    auto* r = out->add_container_responses();
    std::vector<int> taken(boards_.size(), 0);  // devices chosen per board
    for (const auto& id : must) {
      const int b = board_of(id);
      if (b < 0) return invalid("unknown device ID '" + id + "'");
      if (!chosen.insert(id).second) return invalid("device ID '" + id + "' is listed twice in must_include_deviceIDs");
      ++taken[b];
      r->add_deviceids(id);
    }
    // The NUMA node: that of the devices it must include, else the one
    // with the most devices available (the lowest of equals).
    int node = -1;
    if (!must.empty()) {
      node = boards_[board_of(must[0])].host.numa_node;
    } else if (!available.empty()) {
      std::map<int, int> available_on;
      for (int b : board) ++available_on[boards_[b].host.numa_node];
      node = std::max_element(available_on.begin(), available_on.end(), [](auto& a, auto& b) {
               return a.second < b.second;
             })->first;
    }
    // Then, one device at a time: that node's devices before others', and
    // a board with fewer devices chosen before one with more; among equals
    // the one listed first. Each board's devices wait in a queue in the
    // order listed, and the boards in a heap by those keys.
    std::vector<std::vector<int>> waiting(boards_.size());
    for (int i = 0; i < available.size(); ++i)
      if (!chosen.count(available[i])) waiting[board[i]].push_back(i);
    using Key = std::tuple<bool, int, int, int>;  // off the node, chosen on the board, position, board
    std::priority_queue<Key, std::vector<Key>, std::greater<>> heap;
    std::vector<std::size_t> next(boards_.size(), 0);
    for (std::size_t b = 0; b < boards_.size(); ++b)
      if (!waiting[b].empty())
        heap.emplace(boards_[b].host.numa_node != node, taken[b], waiting[b][0], static_cast<int>(b));
    for (int n = must.size(); n < c.allocation_size() && !heap.empty(); ++n) {
      const auto [off, _, position, b] = heap.top();
      heap.pop();
      r->add_deviceids(available[position]);
      ++taken[b];
      if (++next[b] < waiting[b].size()) heap.emplace(off, taken[b], waiting[b][next[b]], b);
    }
  }
  return grpc::Status::OK;
}

// Without the lock too: a board's device nodes, mounts and environment are
// fixed (boards_).
grpc::Status DevicePlugin::Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* req,
                                    v1beta1::AllocateResponse* out) {
  for (const auto& c : req->container_requests()) {
    auto* r = out->add_container_responses();
    std::vector<bool> given(boards_.size(), false);
    std::set<std::string> mounted;
    for (const auto& id : c.devices_ids()) {
      const int i = board_of(id);
      if (i < 0) return invalid("unknown device ID '" + id + "'");
      if (given[i]) continue;  // a second share of a board already given
      given[i] = true;
      const Board* b = &boards_[i];
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
