// What a container needs from the host to use a board: its device nodes,
// mounts and environment, and its NUMA node. Shared by `tpuhal cdi
// generate` and tpuhal-device-plugin (docs/operations.md).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace tpuhal::fleet {

struct Mount {
  std::string host_path;
  std::string container_path;
  std::vector<std::string> options;  // "bind", "ro", ...
};

struct HostDevice {
  std::string uri;                        // as the host enumerates it
  std::string name;                       // the CDI device name ("0", "1", ...)
  std::vector<std::string> device_nodes;  // host paths, the same inside the container
  std::vector<Mount> mounts;
  std::vector<std::pair<std::string, std::string>> env;
  int numa_node = -1;   // -1: none or unknown
  std::string skipped;  // why it cannot go into a container, when it cannot
};

// Where the host's sysfs and /dev are (tests point them at a fake tree).
struct HostRoots {
  std::string sysfs = "/sys";
  std::string dev = "/dev";
};

// The environment variable that makes `uri` visible in a container
// (TPUHAL_VISIBLE_DEVICE_<NAME>; the HAL lists only the boards such
// variables name when any is set).
std::string visibility_variable(const std::string& name);

// What the board `uri` needs, named `name`:
//   simd:PATH#N   the daemon's socket, mounted at the same path
//   pcie:BDF      /dev/vfio/vfio and /dev/vfio/<IOMMU group> (vfio-pci bound)
//   usb:BUS-PORT  /dev/bus/usb/BBB/DDD
// Boards that live in a process (sim:, usb-sim:) and CUDA devices (whose
// containers NVIDIA's toolkit equips) are returned with `skipped` saying so.
HostDevice host_device(const std::string& uri, const std::string& name, const HostRoots& roots = {});

// A Container Device Interface spec (cdiVersion 0.5.0) of `kind`
// ("vendor/class") with one device per usable board and "all".
nlohmann::json cdi_spec(const std::vector<HostDevice>& devices, const std::string& kind);

}  // namespace tpuhal::fleet
