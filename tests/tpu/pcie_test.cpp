// The PCI bus layer and the "pcie" provider against a fake sysfs and /dev
// tree: discovery through libpci, BAR mapping through sysfs resource files,
// and every error a user meets (wrong driver, no IOMMU group, permission
// denied, BAR too small, memlock limit too low, not a VFIO node).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tpuhal/error.hpp"
#include "tpuhal/base/hex.h"
#include "tpuhal/bus/pci_device.h"
#include "tpuhal/tpu/pcie_provider.h"
#include "tpuhal/sim/profile.h"
#include "support/error_of.hpp"

namespace fs = std::filesystem;
using namespace tpuhal;
using namespace tpuhal::bus;
using namespace tpuhal::tpu;
using ::testing::HasSubstr;

namespace {

struct FakeBar {
  std::uint64_t start = 0, size = 0, flags = 0;
};

constexpr std::uint64_t kMem = 0x200, kPrefetch = 0x2000, kMem64 = 0x100000;

class FakeTree {
 public:
  FakeTree() {
    char tmpl[] = "/tmp/tpuhal_pcie_XXXXXX";
    root_ = ::mkdtemp(tmpl);
    ::chmod(root_.c_str(), 0755);  // readable by the unprivileged child below
    fs::create_directories(root_ / "sys/bus/pci/devices");
    fs::create_directories(root_ / "sys/bus/pci/drivers");
    fs::create_directories(root_ / "sys/kernel/iommu_groups");
    fs::create_directories(root_ / "dev/vfio");
  }
  ~FakeTree() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  PciRoots roots() const { return {(root_ / "sys").string(), (root_ / "dev").string()}; }
  fs::path dev_dir(const std::string& bdf) const { return root_ / "sys/bus/pci/devices" / bdf; }

  // A function with `bars` (index = position), `driver` ("" for none) and
  // IOMMU `group` (-1 for none).
  void add(const std::string& bdf, std::uint16_t vendor, std::uint16_t device, std::uint32_t cls,
           std::vector<FakeBar> bars, const std::string& driver, int group, int numa = 0) {
    const fs::path d = dev_dir(bdf);
    fs::create_directories(d);
    write(d / "vendor", hex(vendor, 4));
    write(d / "device", hex(device, 4));
    write(d / "class", hex(cls, 6));
    write(d / "subsystem_vendor", "0x0000");
    write(d / "subsystem_device", "0x0000");
    write(d / "irq", "11");
    write(d / "numa_node", std::to_string(numa));
    write(d / "current_link_speed", "8.0 GT/s PCIe");
    write(d / "current_link_width", "4");
    write(d / "enable", "1");
    std::string res;
    for (std::size_t i = 0; i < 13; ++i) {
      const FakeBar b = i < bars.size() ? bars[i] : FakeBar{};
      char line[80];
      std::snprintf(line, sizeof line, "0x%016llx 0x%016llx 0x%016llx\n", static_cast<unsigned long long>(b.start),
                    static_cast<unsigned long long>(b.size ? b.start + b.size - 1 : 0),
                    static_cast<unsigned long long>(b.flags));
      res += line;
    }
    write(d / "resource", res);
    for (std::size_t i = 0; i < bars.size(); ++i) {
      if (!bars[i].size) continue;
      std::ofstream(d / ("resource" + std::to_string(i))).close();
      fs::resize_file(d / ("resource" + std::to_string(i)), bars[i].size);
    }
    // A type-0 config header with the IDs (libpci may read it).
    std::string cfg(64, '\0');
    cfg[0] = static_cast<char>(vendor & 0xff);
    cfg[1] = static_cast<char>(vendor >> 8);
    cfg[2] = static_cast<char>(device & 0xff);
    cfg[3] = static_cast<char>(device >> 8);
    cfg[4] = 0x06;  // memory space, bus master
    cfg[5] = 0x04;  // INTx disabled (as uio_pci_generic leaves it after an interrupt)
    cfg[9] = static_cast<char>(cls & 0xff);
    cfg[10] = static_cast<char>((cls >> 8) & 0xff);
    cfg[11] = static_cast<char>(cls >> 16);
    write(d / "config", cfg);
    if (!driver.empty()) {
      fs::create_directories(root_ / "sys/bus/pci/drivers" / driver);
      fs::create_directory_symlink(root_ / "sys/bus/pci/drivers" / driver, d / "driver");
    }
    if (group >= 0) {
      const fs::path g = root_ / "sys/kernel/iommu_groups" / std::to_string(group);
      fs::create_directories(g);
      fs::create_directory_symlink(g, d / "iommu_group");
    }
  }
  void add_board(const std::string& bdf, const std::string& driver, int group, std::uint64_t bar0 = 64 << 10) {
    add(bdf, 0x1f1c, 0x1686, 0x120000,
        {{0xfe000000, bar0, kMem}, {}, {0x4000000000, 1 << 20, kMem | kPrefetch | kMem64}}, driver, group);
  }
  // A /dev node stand-in (a plain file) with `mode`.
  void add_dev(const std::string& rel, mode_t mode) {
    write(root_ / "dev" / rel, "");
    ::chmod((root_ / "dev" / rel).c_str(), mode);
  }
  std::string read_bytes(const fs::path& p, std::size_t offset, std::size_t n) const {
    std::ifstream in(p, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(offset));
    std::string s(n, '\0');
    in.read(s.data(), static_cast<std::streamsize>(n));
    return s;
  }

 private:
  static void write(const fs::path& p, const std::string& text) {
    std::ofstream out(p, std::ios::binary);
    out << text;
  }
  fs::path root_;
};

// Runs `fn` as an unprivileged user (root bypasses file permissions) and
// returns the Error it threw: status and message.
std::pair<Status, std::string> error_as_nobody(const std::function<void()>& fn) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(3);
    std::string out = "none";
    int st = 0;
    try {
      fn();
    } catch (const Error& e) {
      st = static_cast<int>(e.status());
      out = e.what();
    }
    out = std::to_string(st) + "|" + out;
    [[maybe_unused]] auto n = ::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string text;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int wst = 0;
  ::waitpid(pid, &wst, 0);
  const auto bar = text.find('|');
  if (bar == std::string::npos) return {Status::Ok, "child produced no result: " + text};
  return {static_cast<Status>(std::stoi(text.substr(0, bar))), text.substr(bar + 1)};
}

OpenOptions with_access(Access a) {
  OpenOptions o;
  o.access = a;
  return o;
}

using test::error_of;

}  // namespace

TEST(PciDiscovery, GivenAFakeTreeWhenDiscoveringThenEveryFieldComesFromSysfs) {
  FakeTree t;
  t.add_board("0000:03:00.0", "vfio-pci", 7);
  t.add("0000:00:1f.2", 0x8086, 0x2922, 0x010601, {{0xfebd0000, 4096, kMem}}, "ahci", 2, 1);
  const auto all = discover({}, t.roots());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].bdf, "0000:00:1f.2");  // sorted by address

  const PciId ids[] = {{0x1f1c, 0x1686}};
  const auto boards = discover(ids, t.roots());
  ASSERT_EQ(boards.size(), 1u);
  const PciInfo& b = boards[0];
  EXPECT_EQ(b.bdf, "0000:03:00.0");
  EXPECT_EQ(b.id, (PciId{0x1f1c, 0x1686}));
  EXPECT_EQ(b.class_code, 0x120000u);
  ASSERT_NE(b.bar(0), nullptr);
  EXPECT_EQ(b.bar(0)->size, 64u << 10);
  EXPECT_EQ(b.bar(0)->address, 0xfe000000u);
  EXPECT_FALSE(b.bar(0)->prefetchable);
  EXPECT_EQ(b.bar(1), nullptr);
  ASSERT_NE(b.bar(2), nullptr);
  EXPECT_EQ(b.bar(2)->size, 1u << 20);
  EXPECT_TRUE(b.bar(2)->prefetchable);
  EXPECT_TRUE(b.bar(2)->is64);
  EXPECT_EQ(b.numa_node, 0);
  EXPECT_EQ(b.link_speed, "8.0 GT/s PCIe");
  EXPECT_EQ(b.link_width, 4);
  EXPECT_EQ(b.driver, "vfio-pci");
  ASSERT_TRUE(b.iommu_group.has_value());
  EXPECT_EQ(*b.iommu_group, 7);
  EXPECT_EQ(b.summary(),
            "0000:03:00.0 1f1c:1686 class 120000 BAR0 64 KiB, BAR2 1 MiB NUMA 0 link 8.0 GT/s PCIe x4 "
            "driver vfio-pci IOMMU group 7");
  EXPECT_EQ(all[0].numa_node, 1);
  EXPECT_EQ(all[0].driver, "ahci");
}

TEST(PciDiscovery, GivenNoPciBusWhenDiscoveringThenTheListIsEmpty) {
  EXPECT_TRUE(discover({}, {"/nonexistent-sysfs", "/nonexistent-dev"}).empty());
}

TEST(PciDiscovery, GivenThisMachineWhenDiscoveringKnownBoardsThenItFinishesWithoutError) {
  std::vector<PciId> ids;
  for (auto& b : known_boards()) ids.push_back(b.id);
  const auto found = discover(ids);
  for (auto& f : found) EXPECT_TRUE(std::find(ids.begin(), ids.end(), f.id) != ids.end()) << f.summary();
}

TEST(PciDiscovery, GivenATreeLibpciCannotReadWhenDiscoveringThenTheErrorCarriesLibpcisMessage) {
  FakeTree t;
  t.add_board("0000:03:00.0", "", -1);
  fs::remove(t.dev_dir("0000:03:00.0") / "resource");
  const Error e = error_of([&] { discover({}, t.roots()); });
  EXPECT_EQ(e.status(), Status::Unavailable);
  EXPECT_THAT(e.what(), HasSubstr("libpci cannot read " + t.roots().sysfs + "/bus/pci"));
  EXPECT_THAT(e.what(), HasSubstr("resource"));
  // The failure leaves nothing behind: the next scan of a good tree works.
  FakeTree good;
  good.add_board("0000:03:00.0", "", -1);
  EXPECT_EQ(discover({}, good.roots()).size(), 1u);
}

TEST(PciDiscovery, GivenBadOrAbsentAddressesWhenDescribingThenTheErrorNamesThem) {
  FakeTree t;
  t.add_board("0000:03:00.0", "", -1);
  EXPECT_EQ(describe("03:00.0", t.roots()).bdf, "0000:03:00.0");
  const Error bad = error_of([&] { describe("03:00", t.roots()); });
  EXPECT_EQ(bad.status(), Status::InvalidArgument);
  EXPECT_THAT(bad.what(), HasSubstr("'03:00' is not a PCI address"));
  const Error absent = error_of([&] { describe("0000:04:00.0", t.roots()); });
  EXPECT_EQ(absent.status(), Status::NotFound);
  EXPECT_THAT(absent.what(), HasSubstr("0000:04:00.0"));
}

TEST(PciDiscovery, CanonicalBdfAcceptsBothFormsAndRejectsTheRest) {
  EXPECT_EQ(canonical_bdf("0000:03:00.0"), "0000:03:00.0");
  EXPECT_EQ(canonical_bdf("3:0.1"), "0000:03:00.1");
  EXPECT_EQ(canonical_bdf("0001:A0:1f.7"), "0001:a0:1f.7");
  EXPECT_FALSE(canonical_bdf("0000:03:20.0"));  // device > 31
  EXPECT_FALSE(canonical_bdf("0000:03:00.8"));  // function > 7
  EXPECT_FALSE(canonical_bdf("0000:03:00.0x"));
  EXPECT_FALSE(canonical_bdf(""));
  EXPECT_FALSE(canonical_bdf(" 03:00.0"));
  EXPECT_FALSE(canonical_bdf("0x3:00.0"));
  EXPECT_FALSE(canonical_bdf("-3:00.0"));
}

TEST(PciOpen, GivenADeviceBoundToAnotherDriverWhenOpeningThenTheErrorNamesTheDriver) {
  FakeTree t;
  t.add_board("0000:03:00.0", "nvme", 7);
  for (Access a : {Access::Auto, Access::Vfio, Access::Sysfs}) {
    const Error e = error_of([&] { PciDevice::open("0000:03:00.0", with_access(a), t.roots()); });
    EXPECT_EQ(e.status(), Status::FailedPrecondition) << to_string(a);
    EXPECT_THAT(e.what(), HasSubstr("bound to driver 'nvme'"));
    EXPECT_THAT(e.what(), HasSubstr("docs/pcie.md"));
  }
}

TEST(PciOpen, GivenNoIommuGroupWhenOpeningThroughVfioThenTheErrorSaysTheIommuIsOff) {
  FakeTree t;
  t.add_board("0000:03:00.0", "vfio-pci", -1);
  const Error e = error_of([&] { PciDevice::open("0000:03:00.0", with_access(Access::Vfio), t.roots()); });
  EXPECT_EQ(e.status(), Status::FailedPrecondition);
  EXPECT_THAT(e.what(), HasSubstr("has no IOMMU group"));
  EXPECT_THAT(e.what(), HasSubstr("intel_iommu=on"));
}

TEST(PciOpen, GivenAGroupFileTheUserCannotOpenWhenOpeningThenPermissionDenied) {
  FakeTree t;
  t.add_board("0000:03:00.0", "vfio-pci", 7);
  t.add_dev("vfio/7", 0600);
  t.add_dev("vfio/vfio", 0666);
  const auto roots = t.roots();
  const auto [status, message] = error_as_nobody([&] { PciDevice::open("0000:03:00.0", {}, roots); });
  EXPECT_EQ(status, Status::PermissionDenied) << message;
  EXPECT_THAT(message, HasSubstr("permission denied opening the VFIO group"));
  EXPECT_THAT(message, HasSubstr(roots.dev + "/vfio/7"));
}

TEST(PciOpen, GivenNoVfioGroupNodeWhenOpeningThenTheErrorNamesThePath) {
  FakeTree t;
  t.add_board("0000:03:00.0", "vfio-pci", 9);
  const Error e = error_of([&] { PciDevice::open("0000:03:00.0", {}, t.roots()); });
  EXPECT_EQ(e.status(), Status::Unavailable);
  EXPECT_THAT(e.what(), HasSubstr(t.roots().dev + "/vfio/9 does not exist"));
}

TEST(PciOpen, GivenFilesThatAreNotVfioNodesWhenOpeningThenTheErrorSaysSo) {
  FakeTree t;
  t.add_board("0000:03:00.0", "vfio-pci", 7);
  t.add_dev("vfio/7", 0666);
  t.add_dev("vfio/vfio", 0666);
  const Error e = error_of([&] { PciDevice::open("0000:03:00.0", {}, t.roots()); });
  EXPECT_EQ(e.status(), Status::Unavailable);
  EXPECT_THAT(e.what(), HasSubstr("is not a VFIO container"));
}

TEST(PciOpen, GivenABarSmallerThanNeededWhenOpeningThenTheErrorGivesBothSizes) {
  FakeTree t;
  t.add_board("0000:03:00.0", "", -1, 4096);
  OpenOptions o;
  o.min_bar_sizes = {{0, 64 << 10}};
  const Error e = error_of([&] { PciDevice::open("0000:03:00.0", o, t.roots()); });
  EXPECT_EQ(e.status(), Status::Unsupported);
  EXPECT_THAT(e.what(), HasSubstr("BAR0 is 4 KiB but at least 64 KiB is needed"));
  o.min_bar_sizes = {{4, 4096}};
  const Error missing = error_of([&] { PciDevice::open("0000:03:00.0", o, t.roots()); });
  EXPECT_THAT(missing.what(), HasSubstr("BAR4 is not implemented"));
}

TEST(PciOpen, GivenAnUnboundDeviceWhenOpeningThenBarsMapThroughSysfsResourceFiles) {
  FakeTree t;
  t.add_board("0000:03:00.0", "", -1);
  auto dev = PciDevice::open("0000:03:00.0", {}, t.roots());
  EXPECT_EQ(dev->access(), Access::Sysfs);
  ASSERT_EQ(dev->bar(0).size(), 64u << 10);
  ASSERT_EQ(dev->bar(2).size(), 1u << 20);
  EXPECT_TRUE(dev->bar(1).empty());
  dev->write32(0, 0x100, 0xdeadbeef);
  dev->write64(2, 0x800, 0x0123456789abcdefull);
  EXPECT_EQ(dev->read32(0, 0x100), 0xdeadbeefu);
  EXPECT_EQ(dev->read64(2, 0x800), 0x0123456789abcdefull);
  // The writes went to the resource files, i.e. to the device.
  EXPECT_EQ(t.read_bytes(t.dev_dir("0000:03:00.0") / "resource0", 0x100, 4), std::string("\xef\xbe\xad\xde", 4));

  const Error range = error_of([&] { dev->read32(0, 64 << 10); });
  EXPECT_EQ(range.status(), Status::OutOfRange);
  EXPECT_THAT(range.what(), HasSubstr("BAR0"));
  EXPECT_EQ(error_of([&] { dev->write32(0, 2, 1); }).status(), Status::OutOfRange);
  EXPECT_EQ(error_of([&] { dev->read32(1, 0); }).status(), Status::OutOfRange);

  alignas(4096) static std::byte page[4096];
  const Error dma = error_of([&] { dev->map_dma(0x10000, page, sizeof page, true); });
  EXPECT_EQ(dma.status(), Status::Unsupported);
  EXPECT_THAT(dma.what(), HasSubstr("DMA needs VFIO"));
  EXPECT_FALSE(dev->dma_available());

  const Error irq = error_of([&] { dev->enable_interrupts(1); });
  EXPECT_EQ(irq.status(), Status::Unsupported);
  EXPECT_THAT(irq.what(), HasSubstr("uio_pci_generic"));
  EXPECT_EQ(dev->interrupt_vectors(), 0u);
  EXPECT_EQ(error_of([&] { dev->interrupt_fd(0); }).status(), Status::OutOfRange);
}

TEST(PciOpen, GivenUioWhenEnablingInterruptsThenTheUioNodeIsUsedOrNamed) {
  FakeTree t;
  t.add_board("0000:03:00.0", "uio_pci_generic", -1);
  fs::create_directories(t.dev_dir("0000:03:00.0") / "uio/uio3");
  auto dev = PciDevice::open("0000:03:00.0", {}, t.roots());
  EXPECT_EQ(dev->access(), Access::Sysfs);
  const Error missing = error_of([&] { dev->enable_interrupts(1); });
  EXPECT_EQ(missing.status(), Status::Unavailable);
  EXPECT_THAT(missing.what(), HasSubstr(t.roots().dev + "/uio3 does not exist"));

  t.add_dev("uio3", 0666);
  const fs::path config = t.dev_dir("0000:03:00.0") / "config";
  EXPECT_EQ(t.read_bytes(config, 4, 2), std::string("\x06\x04", 2));
  EXPECT_EQ(dev->enable_interrupts(4), 1u);
  // INTx unmasked in the command register, the other bits kept.
  EXPECT_EQ(t.read_bytes(config, 4, 2), std::string("\x06\x00", 2));
  EXPECT_EQ(dev->interrupt_kind(), "intx (uio)");
  EXPECT_GE(dev->interrupt_fd(0), 0);
  EXPECT_EQ(error_of([&] { dev->enable_interrupts(1); }).status(), Status::FailedPrecondition);
}

TEST(PciDma, GivenAMemlockLimitBelowAMappingThenTheErrorNamesTheLimit) {
  EXPECT_NO_THROW(check_memlock("PCI x", 0, 64 << 10, 64 << 10));
  EXPECT_NO_THROW(check_memlock("PCI x", 1ull << 40, 1ull << 40, RLIM_INFINITY));
  const Error e = error_of([&] { check_memlock("PCI 0000:03:00.0", 60 << 10, 8 << 10, 64 << 10); });
  EXPECT_EQ(e.status(), Status::OutOfMemory);
  EXPECT_THAT(e.what(), HasSubstr("PCI 0000:03:00.0: mapping 8 KiB for DMA would pin 68 KiB"));
  EXPECT_THAT(e.what(), HasSubstr("memlock limit (RLIMIT_MEMLOCK) is 64 KiB"));
  EXPECT_EQ(error_of([&] { check_memlock("x", 0, 1ull << 62, 1 << 20); }).status(), Status::OutOfMemory);
}

// ---- the "pcie" provider ----

TEST(PcieProvider, GivenAFakeTreeWhenEnumeratingThenOnlyKnownBoardsAreListed) {
  FakeTree t;
  t.add_board("0000:03:00.0", "vfio-pci", 7);
  t.add("0000:00:1f.2", 0x8086, 0x2922, 0x010601, {{0xfebd0000, 4096, kMem}}, "ahci", 2);
  auto p = make_pcie_provider(t.roots());
  EXPECT_EQ(p->scheme(), "pcie");
  const auto devs = p->enumerate();
  ASSERT_EQ(devs.size(), 1u);
  EXPECT_EQ(devs[0].uri, "pcie:0000:03:00.0");
  EXPECT_EQ(devs[0].driver, "tpu-pcie");
  EXPECT_THAT(devs[0].board, HasSubstr("bm1684x"));
  EXPECT_THAT(devs[0].board, HasSubstr("link 8.0 GT/s PCIe x4"));
  EXPECT_EQ(devs[0].memory_bytes, 1u << 20);
}

TEST(PcieProvider, GivenThisMachineWhenEnumeratingThenItListsOnlyBoardsWithoutError) {
  auto p = make_pcie_provider();
  for (auto& d : p->enumerate()) EXPECT_EQ(d.driver, "tpu-pcie");
}

TEST(PcieProvider, GivenBadUrisWhenOpeningThenErrorsSayWhy) {
  FakeTree t;
  t.add_board("0000:03:00.0", "", -1);
  t.add("0000:00:1f.2", 0x8086, 0x2922, 0x010601, {{0xfebd0000, 4096, kMem}}, "", -1);
  auto p = make_pcie_provider(t.roots());
  const Error bad = error_of([&] { p->open("pcie:three"); });
  EXPECT_EQ(bad.status(), Status::InvalidArgument);
  EXPECT_THAT(bad.what(), HasSubstr("pcie:DDDD:BB:DD.F"));
  EXPECT_EQ(error_of([&] { p->open("pcie:0000:09:00.0"); }).status(), Status::NotFound);
  const Error other = error_of([&] { p->open("pcie:0000:00:1f.2"); });
  EXPECT_EQ(other.status(), Status::Unsupported);
  EXPECT_THAT(other.what(), HasSubstr("is 8086:2922, not a known board (1f1c:1686 bm1684x"));
  const Error unbound = error_of([&] { p->open("pcie:0000:03:00.0"); });
  EXPECT_EQ(unbound.status(), Status::FailedPrecondition);
  EXPECT_THAT(unbound.what(), HasSubstr("not bound to vfio-pci (no driver is bound)"));
}

TEST(PcieProvider, GivenADeviceReachedThroughSysfsWhenMakingATransportThenItNeedsDma) {
  FakeTree t;
  t.add_board("0000:03:00.0", "uio_pci_generic", -1);
  auto dev = PciDevice::open("0000:03:00.0", {}, t.roots());
  ASSERT_EQ(dev->access(), Access::Sysfs);
  const Error e = error_of([&] { make_pcie_transport(std::move(dev)); });
  EXPECT_EQ(e.status(), Status::Unsupported);
  EXPECT_THAT(e.what(), HasSubstr("the TPU driver needs DMA, which needs VFIO"));
}

TEST(PcieProvider, KnownBoardsAreTheBoardProfilesWithPciIds) {
  // Every built-in profile with PCI IDs, and nothing else: the list is
  // generated from the profiles (cmake/TpuhalBoards.cmake).
  const auto known = known_boards();
  std::size_t with_ids = 0;
  for (const std::string& name : sim::builtin_profile_names()) {
    const sim::BoardProfile prof = sim::load_profile(name);
    if (prof.pci_vendor == 0 && prof.pci_device == 0) continue;
    ++with_ids;
    const PciId id{prof.pci_vendor, prof.pci_device};
    const auto it = std::find_if(known.begin(), known.end(), [&](auto& k) { return k.id == id; });
    ASSERT_NE(it, known.end()) << name;
    EXPECT_EQ(it->name, name);
    EXPECT_EQ(prof.bus, "pcie") << name << " has PCI IDs but is not on the pcie bus";
  }
  EXPECT_GE(with_ids, 1u);
  EXPECT_EQ(known.size(), with_ids);
}

TEST(PcieProvider, GivenTpuhalPcieIdsThenTheyAreParsedOrRejected) {
  ::setenv("TPUHAL_PCIE_IDS", "abcd:0001,1234:11e8", 1);
  const auto known = known_boards();
  EXPECT_EQ(known.back().id, (PciId{0x1234, 0x11e8}));
  ::setenv("TPUHAL_PCIE_IDS", "abcd", 1);
  const Error e = error_of([] { known_boards(); });
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("'abcd' is not a vendor:device pair"));
  EXPECT_THAT(make_pcie_provider()->unavailable_reason(), HasSubstr("TPUHAL_PCIE_IDS: 'abcd'"));
  ::setenv("TPUHAL_PCIE_IDS", "", 1);
  EXPECT_EQ(make_pcie_provider()->unavailable_reason(), "");
  ::unsetenv("TPUHAL_PCIE_IDS");
}
