// tpuhal-device-plugin: advertises tpuhal boards to the kubelet through the
// device plugin API v1beta1 (docs/operations.md).
//
// The life cycle the kubelet's documentation asks of a plugin: serve the
// DevicePlugin service on a Unix socket in the kubelet's device-plugins
// directory, register with the kubelet on kubelet.sock, and when the
// kubelet restarts (it recreates kubelet.sock and removes the plugins'
// sockets) serve again and register again.
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <boost/program_options.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <thread>

#include "plugin.h"
#include "tpuhal/tpuhal.hpp"

namespace po = boost::program_options;
using namespace std::chrono_literals;

namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop.store(true); }

// The inode of a socket file, 0 when there is none.
ino_t inode_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) ? st.st_ino : 0;
}

bool register_with_kubelet(const std::string& kubelet_socket, const std::string& endpoint,
                           const tpuhal::plugin::Options& o, std::string& why) {
  auto channel = grpc::CreateChannel("unix://" + kubelet_socket, grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  v1beta1::RegisterRequest req;
  req.set_version("v1beta1");
  req.set_endpoint(endpoint);
  req.set_resource_name(o.resource);
  req.mutable_options()->set_get_preferred_allocation_available(true);
  v1beta1::Empty empty;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 5s);
  const grpc::Status s = stub->Register(&ctx, req, &empty);
  if (!s.ok()) why = s.error_message();
  return s.ok();
}

}  // namespace

int main(int argc, char** argv) {
  tpuhal::plugin::Options o;
  std::string dir = "/var/lib/kubelet/device-plugins", socket_name = "tpuhal.sock";
  unsigned health_ms = 500;
  std::vector<std::string> numa;
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help")(
      "resource", po::value<std::string>(&o.resource)->default_value(o.resource), "the resource name to register")(
      "cdi-kind", po::value<std::string>(&o.cdi_kind)->default_value(o.cdi_kind),
      "the kind of the CDI spec `tpuhal cdi generate` wrote (Allocate names its devices)")(
      "shares", po::value<std::uint32_t>(&o.shares)->default_value(1),
      "devices to advertise per board the simulator daemon shares (each a VF of its own)")(
      "device,d", po::value<std::vector<std::string>>(&o.uris), "a board to advertise (repeat; default: every board)")(
      "numa", po::value<std::vector<std::string>>(&numa),
      "URI=NODE: the NUMA node of a board whose sysfs does not say (a daemon's board, a VM)")(
      "plugin-dir", po::value<std::string>(&dir)->default_value(dir), "the kubelet's device-plugins directory")(
      "socket", po::value<std::string>(&socket_name)->default_value(socket_name), "this plugin's socket in it")(
      "health-interval-ms", po::value<unsigned>(&health_ms)->default_value(health_ms),
      "how often every board's health is checked");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "tpuhal-device-plugin: " << e.what() << "\n";
    return 2;
  }
  if (vm.count("help")) {
    std::cout << "Usage: tpuhal-device-plugin [--resource NAME] [--shares N] [--device URI]... [--plugin-dir DIR]\n\n"
                 "Advertises tpuhal boards to the kubelet (device plugin API v1beta1): one device per\n"
                 "board (N per board the simulator daemon shares, with --shares N), healthy until a\n"
                 "board faults and again after it is reset; Allocate answers with the CDI devices of\n"
                 "`tpuhal cdi generate`'s spec and the same device nodes, mounts and environment;\n"
                 "GetPreferredAllocation keeps a request on one NUMA node (an ID listed twice is\n"
                 "refused). Registers again when the kubelet restarts. Details: docs/operations.md.\n\n"
              << opts << "\n";
    return 0;
  }
  if (o.shares == 0 || o.shares > 1024 || health_ms == 0 || socket_name.find('/') != std::string::npos) {
    std::cerr << "tpuhal-device-plugin: --shares takes 1 to 1024, --health-interval-ms a positive number, "
                 "--socket a file name\n";
    return 2;
  }
  for (const std::string& item : numa) {
    const auto eq = item.rfind('=');
    char* end = nullptr;
    const long node = eq == std::string::npos ? -1 : std::strtol(item.c_str() + eq + 1, &end, 10);
    if (eq == std::string::npos || node < 0 || !end || *end) {
      std::cerr << "tpuhal-device-plugin: --numa takes URI=NODE (simd:/run/tpuhal.sock#0=1), got '" << item << "'\n";
      return 2;
    }
    o.numa[item.substr(0, eq)] = static_cast<int>(node);
  }

  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  tpuhal::plugin::DevicePlugin plugin(o);
  if (plugin.boards() == 0) std::fprintf(stderr, "tpuhal-device-plugin: no board to advertise\n");
  plugin.check_health();
  std::thread health([&] {
    while (!g_stop.load()) {
      plugin.check_health();
      std::this_thread::sleep_for(std::chrono::milliseconds(health_ms));
    }
  });

  const std::string kubelet = dir + "/kubelet.sock", mine = dir + "/" + socket_name;
  int rc = 0;
  while (!g_stop.load()) {
    // Serve on a fresh socket.
    ::unlink(mine.c_str());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix://" + mine, grpc::InsecureServerCredentials());
    builder.RegisterService(&plugin);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    if (!server) {
      std::fprintf(stderr, "tpuhal-device-plugin: cannot serve on %s\n", mine.c_str());
      rc = 1;
      break;
    }
    // Register, retrying until the kubelet answers.
    std::string why, last_why;
    ino_t kubelet_inode = 0;
    while (!g_stop.load()) {
      kubelet_inode = inode_of(kubelet);
      if (kubelet_inode && register_with_kubelet(kubelet, socket_name, o, why)) break;
      if (!kubelet_inode) why = "no kubelet socket at " + kubelet;
      if (why != last_why) std::fprintf(stderr, "tpuhal-device-plugin: not registered yet: %s\n", why.c_str());
      last_why = why;
      std::this_thread::sleep_for(1s);
    }
    if (!g_stop.load()) {
      std::printf("registered %s with the kubelet (%zu board(s)) on %s\n", o.resource.c_str(), plugin.boards(),
                  mine.c_str());
      std::fflush(stdout);
    }
    // Until the kubelet restarts: it recreates its socket and removes ours.
    while (!g_stop.load() && inode_of(kubelet) == kubelet_inode && inode_of(mine) != 0)
      std::this_thread::sleep_for(200ms);
    if (!g_stop.load()) std::fprintf(stderr, "tpuhal-device-plugin: the kubelet restarted; registering again\n");
    server->Shutdown(std::chrono::system_clock::now() + 1s);
  }
  plugin.stop();
  health.join();
  ::unlink(mine.c_str());
  return rc;
}
