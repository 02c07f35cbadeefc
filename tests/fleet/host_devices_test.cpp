// fleet::host_device and fleet::cdi_spec on a fake sysfs tree: the device
// nodes of a VFIO-bound PCIe board and of a USB board, the refusals, and
// how a spec merges devices into "all".
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "host_devices.h"

namespace tpuhal::fleet {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class HostDevices : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tpuhal-fleet-test-XXXXXX";
    root_ = ::mkdtemp(tmpl);
    roots_ = {(root_ / "sys").string(), (root_ / "dev").string()};
    // A board bound to vfio-pci in IOMMU group 17 on NUMA node 1, one bound
    // to no driver, and a USB board at bus 1 device 5.
    pci("0000:03:00.0", "1", "17", "vfio-pci");
    pci("0000:04:00.0", "0", "", "");
    const fs::path usb = fs::path(roots_.sysfs) / "bus/usb/devices/1-1";
    fs::create_directories(usb);
    write(usb / "busnum", "1\n");
    write(usb / "devnum", "5\n");
  }
  void TearDown() override { fs::remove_all(root_); }

  static void write(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }
  void pci(const std::string& bdf, const std::string& numa, const std::string& group, const std::string& driver) {
    const fs::path dir = fs::path(roots_.sysfs) / "bus/pci/devices" / bdf;
    fs::create_directories(dir);
    write(dir / "numa_node", numa + "\n");
    if (!group.empty()) fs::create_directory_symlink("../../../kernel/iommu_groups/" + group, dir / "iommu_group");
    if (!driver.empty()) fs::create_directory_symlink("../../../bus/pci/drivers/" + driver, dir / "driver");
  }

  fs::path root_;
  HostRoots roots_;
};

TEST_F(HostDevices, AVfioBoundPcieBoardNeedsTheContainerAndGroupNodes) {
  const HostDevice d = host_device("pcie:0000:03:00.0", "0", roots_);
  EXPECT_EQ(d.skipped, "");
  EXPECT_THAT(d.device_nodes, ElementsAre(roots_.dev + "/vfio/vfio", roots_.dev + "/vfio/17"));
  EXPECT_EQ(d.numa_node, 1);
  EXPECT_THAT(d.env, ElementsAre(std::pair<std::string, std::string>{"TPUHAL_VISIBLE_DEVICE_0", "pcie:0000:03:00.0"}));
}

TEST_F(HostDevices, APcieBoardWithoutVfioIsLeftOutSayingWhy) {
  const HostDevice d = host_device("pcie:0000:04:00.0", "1", roots_);
  EXPECT_THAT(d.skipped, HasSubstr("not bound to vfio-pci"));
  EXPECT_THAT(d.skipped, HasSubstr("driver none"));
  EXPECT_EQ(d.numa_node, 0);  // still known: the device plugin's topology needs it
}

TEST_F(HostDevices, AUsbBoardNeedsItsUsbfsNode) {
  const HostDevice d = host_device("usb:1-1", "2", roots_);
  EXPECT_EQ(d.skipped, "");
  EXPECT_THAT(d.device_nodes, ElementsAre(roots_.dev + "/bus/usb/001/005"));
  EXPECT_THAT(host_device("usb:2-9", "3", roots_).skipped, HasSubstr("no device"));
}

TEST_F(HostDevices, InProcessBoardsAndCudaDevicesAreLeftOut) {
  EXPECT_THAT(host_device("sim:0", "0", roots_).skipped, HasSubstr("lives in the process"));
  EXPECT_THAT(host_device("usb-sim:tiny", "0", roots_).skipped, HasSubstr("lives in the process"));
  EXPECT_THAT(host_device("cuda:0", "0", roots_).skipped, HasSubstr("NVIDIA's container toolkit"));
  EXPECT_THAT(host_device("simd:relative.sock#0", "0", roots_).skipped, HasSubstr("not an absolute path"));
}

TEST_F(HostDevices, TheSpecHasEachUsableDeviceAndAllWithoutDuplicates) {
  const std::vector<HostDevice> ds = {
      host_device("pcie:0000:03:00.0", "0", roots_), host_device("pcie:0000:04:00.0", "x", roots_),
      host_device("simd:/run/a.sock#0", "1", roots_), host_device("simd:/run/a.sock#1", "2", roots_)};
  const nlohmann::json spec = cdi_spec(ds, "tpuhal.dev/board");
  EXPECT_EQ(spec["cdiVersion"], "0.5.0");
  EXPECT_EQ(spec["kind"], "tpuhal.dev/board");
  std::vector<std::string> names;
  for (auto& d : spec["devices"]) names.push_back(d["name"]);
  EXPECT_THAT(names, ElementsAre("0", "1", "2", "all"));
  const auto& all = spec["devices"][3]["containerEdits"];
  EXPECT_EQ(all["deviceNodes"].size(), 2u);
  EXPECT_EQ(all["mounts"].size(), 1u) << "one socket, mounted once";
  EXPECT_EQ(all["env"].size(), 3u);
  EXPECT_EQ(visibility_variable("a.b-c"), "TPUHAL_VISIBLE_DEVICE_A_B_C");
  EXPECT_EQ(cdi_spec({}, "tpuhal.dev/board")["devices"].size(), 0u) << "no 'all' of nothing";
}

}  // namespace
}  // namespace tpuhal::fleet
