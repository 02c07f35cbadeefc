#include "host_devices.h"

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>

namespace tpuhal::fleet {
namespace {

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

std::string link_basename(const std::string& path) {
  char buf[4096];
  const ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return {};
  const std::string target(buf, static_cast<std::size_t>(n));
  return target.substr(target.rfind('/') + 1);
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

std::string visibility_variable(const std::string& name) {
  std::string v = "TPUHAL_VISIBLE_DEVICE_";
  for (char c : name) v += std::isalnum(static_cast<unsigned char>(c)) ? static_cast<char>(std::toupper(c)) : '_';
  return v;
}

HostDevice host_device(const std::string& uri, const std::string& name, const HostRoots& roots) {
  HostDevice d;
  d.uri = uri;
  d.name = name;
  d.env.emplace_back(visibility_variable(name), uri);
  if (starts_with(uri, "simd:")) {
    std::string socket = uri.substr(5);
    socket = socket.substr(0, socket.rfind('#'));
    if (socket.empty() || socket[0] != '/') {
      d.skipped = "its daemon's socket '" + socket + "' is not an absolute path";
      return d;
    }
    // The HAL finds the daemon from the visible URI (no TPUHAL_SIMD, whose
    // one value two devices' edits could not share).
    d.mounts.push_back({socket, socket, {"bind"}});
  } else if (starts_with(uri, "pcie:")) {
    const std::string bdf = uri.substr(5);
    const std::string dir = roots.sysfs + "/bus/pci/devices/" + bdf;
    if (const std::string numa = read_line(dir + "/numa_node"); !numa.empty())
      d.numa_node = static_cast<int>(std::strtol(numa.c_str(), nullptr, 10));
    const std::string group = link_basename(dir + "/iommu_group");
    const std::string driver = link_basename(dir + "/driver");
    if (group.empty() || driver != "vfio-pci") {
      d.skipped = "it is not bound to vfio-pci with an IOMMU group (driver " +
                  (driver.empty() ? std::string("none") : driver) +
                  "); containers reach PCIe boards through VFIO only (docs/pcie.md)";
      return d;
    }
    d.device_nodes = {roots.dev + "/vfio/vfio", roots.dev + "/vfio/" + group};
  } else if (starts_with(uri, "usb:")) {
    const std::string port = uri.substr(4);
    const std::string dir = roots.sysfs + "/bus/usb/devices/" + port;
    const std::string bus = read_line(dir + "/busnum"), dev = read_line(dir + "/devnum");
    if (bus.empty() || dev.empty()) {
      d.skipped = "USB port " + port + " has no device in " + dir;
      return d;
    }
    char node[64];
    std::snprintf(node, sizeof node, "/bus/usb/%03d/%03d", std::atoi(bus.c_str()), std::atoi(dev.c_str()));
    d.device_nodes = {roots.dev + node};
  } else if (starts_with(uri, "cuda:")) {
    d.skipped = "NVIDIA's container toolkit equips containers for CUDA devices (nvidia-ctk cdi generate)";
  } else {
    d.skipped = "a simulated board lives in the process that opens it; a container opens its own";
  }
  return d;
}

nlohmann::json cdi_spec(const std::vector<HostDevice>& devices, const std::string& kind) {
  auto edits_of = [](const std::vector<const HostDevice*>& ds) {
    nlohmann::json nodes = nlohmann::json::array(), mounts = nlohmann::json::array(), env = nlohmann::json::array();
    std::set<std::string> seen_nodes, seen_mounts, seen_env;
    for (const HostDevice* d : ds) {
      for (auto& n : d->device_nodes)
        if (seen_nodes.insert(n).second) nodes.push_back({{"path", n}});
      for (auto& m : d->mounts)
        if (seen_mounts.insert(m.container_path).second)
          mounts.push_back({{"hostPath", m.host_path}, {"containerPath", m.container_path}, {"options", m.options}});
      for (auto& [k, v] : d->env)
        if (seen_env.insert(k).second) env.push_back(k + "=" + v);
    }
    nlohmann::json e = nlohmann::json::object();
    if (!nodes.empty()) e["deviceNodes"] = nodes;
    if (!mounts.empty()) e["mounts"] = mounts;
    if (!env.empty()) e["env"] = env;
    return e;
  };
  nlohmann::json spec = {{"cdiVersion", "0.5.0"}, {"kind", kind}, {"devices", nlohmann::json::array()}};
  std::vector<const HostDevice*> usable;
  for (const HostDevice& d : devices) {
    if (!d.skipped.empty()) continue;
    usable.push_back(&d);
    spec["devices"].push_back({{"name", d.name}, {"containerEdits", edits_of({&d})}});
  }
  if (!usable.empty()) spec["devices"].push_back({{"name", "all"}, {"containerEdits", edits_of(usable)}});
  return spec;
}

}  // namespace tpuhal::fleet
