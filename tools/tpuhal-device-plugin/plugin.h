// The kubelet device plugin's service (docs/operations.md): the boards it
// advertises, their health, and what a container given some of them gets.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "deviceplugin.grpc.pb.h"
#include "host_devices.h"

namespace tpuhal::plugin {

struct Options {
  std::string resource = "tpuhal.dev/board";  // the resource name the kubelet schedules
  std::string cdi_kind = "tpuhal.dev/board";  // the kind of `tpuhal cdi generate`'s spec
  std::uint32_t shares = 1;                   // devices advertised per daemon-shared board
  std::vector<std::string> uris;              // the boards (default: every board)
  std::map<std::string, int> numa;            // NUMA nodes the operator sets, by URI
};

// One board the plugin advertises: fixed once the plugin is made, so that
// what a request asks about it is answered without the lock.
struct Board {
  fleet::HostDevice host;
  bool shared = false;  // served by the daemon: advertised as Options::shares devices
};

// A board's health, which check_health() changes (under the lock).
struct Health {
  // Healthy: reachable and not crashed. `error` says why it is not
  // reachable; `crashed`: its firmware crashed since its last reset.
  std::string error;
  bool crashed = false;
  bool healthy() const { return error.empty() && !crashed; }
  // The telemetry counters last read, while reachable.
  std::uint64_t crashes = 0, resets = 0;
  bool seen = false;
};

class DevicePlugin final : public v1beta1::DevicePlugin::Service {
 public:
  explicit DevicePlugin(Options options);

  // Checks every board once: a board that cannot be watched or reached, or
  // whose firmware crashed (or that was lost) since its last reset, is
  // unhealthy; a reset after that makes it healthy again. Wakes the
  // ListAndWatch streams when anything changed.
  void check_health();
  // Ends every ListAndWatch stream (the server is going away).
  void stop();

  std::size_t boards() const;
  const Options& options() const { return options_; }

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* out) override;
  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override;
  grpc::Status GetPreferredAllocation(grpc::ServerContext*, const v1beta1::PreferredAllocationRequest* req,
                                      v1beta1::PreferredAllocationResponse* out) override;
  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* req,
                        v1beta1::AllocateResponse* out) override;
  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest*,
                                 v1beta1::PreStartContainerResponse*) override;

 private:
  // The board behind a device ID ("0", or "0-1" for share 1 of board 0):
  // its index in boards_; -1 for an ID the plugin never advertised.
  int board_of(const std::string& id) const;
  v1beta1::ListAndWatchResponse list_locked() const;

  const Options options_;
  // Fixed at construction; read without the lock. Requests are answered
  // from these alone, so that no request, however long, holds mu_.
  const std::vector<Board> boards_;
  const std::unordered_map<std::string, int> ids_;  // device ID -> index in boards_

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::vector<Health> health_;  // guarded by mu_, one per board
  std::uint64_t generation_ = 0;
  bool stopping_ = false;
};

}  // namespace tpuhal::plugin
