#include "tpuhal/base/hex.h"
#include "tpuhal/bus/pci_device.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/vfio.h>
#include <sys/syscall.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

extern "C" {
#include <pci/pci.h>
}

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csetjmp>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>

#include "tpuhal/base/fd.h"
#include "tpuhal/base/units.h"
#include "tpuhal/error.hpp"

namespace tpuhal::bus {
namespace {

using base::UniqueFd;

std::string errno_text(int err) { return std::strerror(err); }

std::string devices_dir(const PciRoots& r) { return r.sysfs + "/bus/pci/devices"; }
std::string device_dir(const PciRoots& r, std::string_view bdf) { return devices_dir(r) + "/" + std::string(bdf); }

// The first line of a sysfs attribute, without the newline; nullopt if absent.
std::optional<std::string> read_attr(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line;
}

// The last path component of a symlink's target; empty if `path` is no link.
std::string link_basename(const std::string& path) {
  char buf[4096];
  const ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return {};
  const std::string target(buf, static_cast<std::size_t>(n));
  const auto slash = target.rfind('/');
  return slash == std::string::npos ? target : target.substr(slash + 1);
}

// Whether this process may lock memory beyond RLIMIT_MEMLOCK.
bool has_ipc_lock() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (::syscall(SYS_capget, &header, data) != 0) return false;
  return (data[CAP_IPC_LOCK / 32].effective & (1u << (CAP_IPC_LOCK % 32))) != 0;
}

// ---- libpci --------------------------------------------------------------
// libpci reports fatal errors through a callback that must not return. The
// callback jumps back to the guarded call below; only libpci's C frames and
// the callback (which owns no objects) are skipped.
thread_local std::jmp_buf* t_libpci_jump = nullptr;
thread_local char t_libpci_error[512];

extern "C" __attribute__((noreturn, format(printf, 1, 2))) void libpci_error(char* msg, ...) {
  va_list ap;
  va_start(ap, msg);
  std::vsnprintf(t_libpci_error, sizeof t_libpci_error, msg, ap);
  va_end(ap);
  if (t_libpci_jump) std::longjmp(*t_libpci_jump, 1);
  std::abort();  // unreachable: every libpci call below is guarded
}
extern "C" void libpci_quiet(char*, ...) {}

// Runs libpci's scan and fill; returns false (t_libpci_error says why) if
// libpci gave up. `out` lives in the caller's frame.
bool libpci_scan(pci_access* a, std::vector<pci_dev*>* out) {
  std::jmp_buf jump;
  t_libpci_jump = &jump;
  if (setjmp(jump) != 0) {
    t_libpci_jump = nullptr;
    return false;
  }
  pci_init(a);
  pci_scan_bus(a);
  for (pci_dev* d = a->devices; d; d = d->next) {
    pci_fill_info(
        d, PCI_FILL_IDENT | PCI_FILL_CLASS | PCI_FILL_BASES | PCI_FILL_SIZES | PCI_FILL_IO_FLAGS | PCI_FILL_NUMA_NODE);
    out->push_back(d);
  }
  t_libpci_jump = nullptr;
  return true;
}

struct LibpciAccess {
  pci_access* a = pci_alloc();
  ~LibpciAccess() {
    if (a) pci_cleanup(a);
  }
};

BarInfo bar_of(const pci_dev* d, std::uint32_t i) {
  BarInfo b;
  b.index = i;
  const pciaddr_t base = d->base_addr[i];
  const pciaddr_t flags = d->flags[i];
  b.size = d->size[i];
  b.io = (flags & PCI_IORESOURCE_IO) != 0 || (base & PCI_BASE_ADDRESS_SPACE_IO);
  b.prefetchable = (flags & PCI_IORESOURCE_PREFETCH) != 0 || (base & PCI_BASE_ADDRESS_MEM_PREFETCH);
  b.is64 = (flags & PCI_IORESOURCE_MEM_64) != 0 || (base & PCI_BASE_ADDRESS_MEM_TYPE_64);
  b.address = b.io ? (base & PCI_BASE_ADDRESS_IO_MASK) : (base & PCI_BASE_ADDRESS_MEM_MASK);
  return b;
}

PciInfo info_of(pci_dev* d, const PciRoots& roots) {
  PciInfo info;
  char bdf[32];
  std::snprintf(bdf, sizeof bdf, "%04x:%02x:%02x.%x", static_cast<unsigned>(d->domain), d->bus, d->dev, d->func);
  info.bdf = bdf;
  info.id = {d->vendor_id, d->device_id};
  info.class_code = static_cast<std::uint32_t>(d->device_class) << 8;
  if (auto cls = read_attr(device_dir(roots, info.bdf) + "/class"))
    info.class_code = static_cast<std::uint32_t>(std::strtoul(cls->c_str(), nullptr, 16));
  for (std::uint32_t i = 0; i < 6; ++i) info.bars.push_back(bar_of(d, i));
  info.numa_node = (d->known_fields & PCI_FILL_NUMA_NODE) ? d->numa_node : -1;
  const std::string dir = device_dir(roots, info.bdf);
  if (auto s = read_attr(dir + "/current_link_speed"); s && *s != "Unknown") info.link_speed = *s;
  if (auto w = read_attr(dir + "/current_link_width"))
    info.link_width = static_cast<int>(std::strtol(w->c_str(), nullptr, 10));
  // The bound driver and the IOMMU group are symlinks next to the attributes.
  info.driver = link_basename(dir + "/driver");
  if (const std::string grp = link_basename(dir + "/iommu_group"); !grp.empty())
    info.iommu_group = static_cast<int>(std::strtol(grp.c_str(), nullptr, 10));
  return info;
}

}  // namespace

// ---- PciInfo ---------------------------------------------------------------

const BarInfo* PciInfo::bar(std::uint32_t index) const noexcept {
  for (auto& b : bars)
    if (b.index == index && b.size) return &b;
  return nullptr;
}

std::string PciInfo::summary() const {
  char head[64];
  std::snprintf(head, sizeof head, "%s %04x:%04x class %06x", bdf.c_str(), id.vendor, id.device, class_code);
  std::string s = head;
  bool first = true;
  for (auto& b : bars) {
    if (!b.size) continue;
    s += first ? " " : ", ";
    first = false;
    s += "BAR" + std::to_string(b.index) + " " + base::format_bytes(b.size) + (b.io ? " io" : "");
  }
  s += " NUMA " + (numa_node >= 0 ? std::to_string(numa_node) : std::string("none"));
  if (!link_speed.empty() || link_width)
    s += " link " + (link_speed.empty() ? std::string("?") : link_speed) + " x" + std::to_string(link_width);
  s += " driver " + (driver.empty() ? std::string("none") : driver);
  s += iommu_group ? " IOMMU group " + std::to_string(*iommu_group) : std::string(" no IOMMU group");
  return s;
}

std::optional<std::string> canonical_bdf(std::string_view text) {
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  int used = 0;
  const std::string t(text);
  if (t.find_first_not_of("0123456789abcdefABCDEF:.") != std::string::npos) return std::nullopt;
  if (std::sscanf(t.c_str(), "%4x:%2x:%2x.%1x%n", &domain, &bus, &dev, &fn, &used) == 4 &&
      used == static_cast<int>(t.size())) {
  } else if (domain = 0, used = 0; std::sscanf(t.c_str(), "%2x:%2x.%1x%n", &bus, &dev, &fn, &used) == 3 &&
                                   used == static_cast<int>(t.size())) {
  } else {
    return std::nullopt;
  }
  if (dev > 0x1f || fn > 7) return std::nullopt;
  char out[32];
  std::snprintf(out, sizeof out, "%04x:%02x:%02x.%x", domain, bus, dev, fn);
  return std::string(out);
}

std::vector<PciInfo> discover(std::span<const PciId> ids, const PciRoots& roots) {
  const std::string dir = devices_dir(roots);
  if (DIR* d = ::opendir(dir.c_str())) {
    ::closedir(d);
  } else {
    return {};  // no PCI bus here (a container, a SoC): nothing to find
  }
  LibpciAccess acc;
  if (!acc.a) throw Error(Status::OutOfMemory, "libpci: cannot allocate an access handle");
  acc.a->method = PCI_ACCESS_SYS_BUS_PCI;
  acc.a->error = libpci_error;
  acc.a->warning = libpci_quiet;
  acc.a->debug = libpci_quiet;
  const std::string sysfs_path = roots.sysfs + "/bus/pci";
  pci_set_param(acc.a, const_cast<char*>("sysfs.path"), const_cast<char*>(sysfs_path.c_str()));
  std::vector<pci_dev*> devs;
  if (!libpci_scan(acc.a, &devs))
    throw Error(Status::Unavailable, "libpci cannot read " + sysfs_path + ": " + t_libpci_error);
  std::vector<PciInfo> out;
  for (pci_dev* d : devs) {
    const PciId id{d->vendor_id, d->device_id};
    if (!ids.empty() && std::find(ids.begin(), ids.end(), id) == ids.end()) continue;
    out.push_back(info_of(d, roots));
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.bdf < b.bdf; });
  return out;
}

PciInfo describe(std::string_view bdf, const PciRoots& roots) {
  const auto canon = canonical_bdf(bdf);
  if (!canon)
    throw Error(Status::InvalidArgument,
                "'" + std::string(bdf) + "' is not a PCI address (expected DDDD:BB:DD.F, e.g. 0000:03:00.0)");
  for (auto& info : discover({}, roots))
    if (info.bdf == *canon) return info;
  throw Error(Status::NotFound, "no PCI function " + *canon + " under " + devices_dir(roots));
}

const char* to_string(Access access) noexcept {
  switch (access) {
    case Access::Auto: return "auto";
    case Access::Vfio: return "vfio";
    case Access::Sysfs: return "sysfs";
  }
  return "?";
}

void check_memlock(std::string_view what, std::uint64_t locked, std::uint64_t size, std::uint64_t limit) {
  if (limit == RLIM_INFINITY) return;
  if (size > limit || locked > limit - size)
    throw Error(Status::OutOfMemory,
                std::string(what) + ": mapping " + base::format_bytes(size) + " for DMA would pin " +
                    base::format_bytes(locked + size) + " but the memlock limit (RLIMIT_MEMLOCK) is " +
                    base::format_bytes(limit) +
                    "; raise it (ulimit -l, /etc/security/limits.conf, LimitMEMLOCK= for a service)");
}

// ---- PciDevice -------------------------------------------------------------

struct MappedBar {
  std::byte* data = nullptr;
  std::uint64_t size = 0;
};

struct PciDevice::Impl {
  std::string bdf;
  std::string dev_root;  // PciRoots::dev
  // VFIO
  UniqueFd container, group, device;
  // sysfs: the resourceN files stay open while mapped
  std::vector<UniqueFd> resource_fds;
  std::map<std::uint32_t, MappedBar> bars;
  // DMA
  mutable std::mutex mu;
  std::map<std::uint64_t, std::uint64_t> dma;  // iova -> size
  std::atomic<std::uint64_t> dma_bytes{0};
  // interrupts
  enum class Irq : std::uint8_t { None, MsiX, Msi, IntxVfio, IntxUio } irq = Irq::None;
  std::vector<UniqueFd> irq_fds;
  UniqueFd uio;  // the /dev/uioN fd (its own interrupt descriptor)
  std::string uio_name;

  std::string config_path;  // the sysfs config file (UIO: INTx is unmasked there)

  // uio_pci_generic masks INTx in the command register when it fires; the
  // user unmasks it by clearing PCI_COMMAND_INTX_DISABLE in config space.
  void unmask_intx_config(const std::string& what) const {
    const int fd = ::open(config_path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0)
      throw Error(Status::Unavailable, what + ": cannot open " + config_path + " to unmask INTx: " + errno_text(errno));
    UniqueFd owner(fd);
    std::uint16_t command = 0;
    if (::pread(fd, &command, sizeof command, PCI_COMMAND) != sizeof command)
      throw Error(Status::Unavailable, what + ": cannot read the command register from " + config_path);
    command = static_cast<std::uint16_t>(command & ~PCI_COMMAND_DISABLE_INTx);
    if (::pwrite(fd, &command, sizeof command, PCI_COMMAND) != sizeof command)
      throw Error(Status::Unavailable, what + ": cannot unmask INTx through " + config_path + ": " + errno_text(errno));
  }

  ~Impl() {
    if (device && irq != Irq::None && irq != Irq::IntxUio) disable_vfio_irqs();
    for (auto& [iova, size] : dma) unmap_vfio(iova, size);
    for (auto& [i, b] : bars) ::munmap(b.data, b.size);
  }

  std::uint32_t vfio_irq_index() const {
    return irq == Irq::MsiX  ? VFIO_PCI_MSIX_IRQ_INDEX
           : irq == Irq::Msi ? VFIO_PCI_MSI_IRQ_INDEX
                             : VFIO_PCI_INTX_IRQ_INDEX;
  }
  void disable_vfio_irqs() noexcept {
    vfio_irq_set set{};
    set.argsz = sizeof set;
    set.flags = VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER;
    set.index = vfio_irq_index();
    set.count = 0;
    ::ioctl(device.get(), VFIO_DEVICE_SET_IRQS, &set);
  }
  bool unmap_vfio(std::uint64_t iova, std::uint64_t size) noexcept {
    vfio_iommu_type1_dma_unmap u{};
    u.argsz = sizeof u;
    u.iova = iova;
    u.size = size;
    return ::ioctl(container.get(), VFIO_IOMMU_UNMAP_DMA, &u) == 0;
  }
};

namespace {

[[noreturn]] void fail_open(Status s, const std::string& bdf, const std::string& why) {
  throw Error(s, "PCI " + bdf + ": " + why);
}

void check_bar_sizes(const PciInfo& info, const OpenOptions& options,
                     const std::map<std::uint32_t, std::uint64_t>& actual) {
  for (auto [index, need] : options.min_bar_sizes) {
    const auto it = actual.find(index);
    const std::uint64_t have = it == actual.end() ? 0 : it->second;
    if (have < need)
      fail_open(Status::Unsupported, info.bdf,
                "BAR" + std::to_string(index) + " is " +
                    (have ? base::format_bytes(have) : std::string("not implemented")) + " but at least " +
                    base::format_bytes(need) + " is needed (" + hex(need) +
                    " bytes); is this the right device, or is its BAR resized?");
  }
}

std::vector<std::uint32_t> bars_to_map(const PciInfo& info, const OpenOptions& options) {
  if (!options.bars.empty()) return options.bars;
  std::vector<std::uint32_t> out;
  for (auto& b : info.bars)
    if (b.size && !b.io) out.push_back(b.index);
  return out;
}

UniqueFd open_or_fail(const std::string& path, int flags, const std::string& bdf, const std::string& what,
                      const std::string& hint) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd >= 0) return UniqueFd(fd);
  const int err = errno;
  if (err == EACCES || err == EPERM)
    fail_open(Status::PermissionDenied, bdf,
              "permission denied opening " + what + " " + path + " (" + errno_text(err) + "); " + hint);
  if (err == ENOENT) fail_open(Status::Unavailable, bdf, what + " " + path + " does not exist; " + hint);
  fail_open(Status::Unavailable, bdf, "cannot open " + what + " " + path + ": " + errno_text(err));
}

void open_vfio(PciDevice::Impl& im, const PciInfo& info, const OpenOptions& options, const PciRoots& roots) {
  const std::string& bdf = info.bdf;
  if (info.driver != "vfio-pci")
    fail_open(Status::FailedPrecondition, bdf,
              info.driver.empty()
                  ? "not bound to vfio-pci (no driver is bound); bind it: see docs/pcie.md"
                  : "bound to driver '" + info.driver +
                        "', not vfio-pci; unbind it and bind vfio-pci (driver_override), see docs/pcie.md");
  if (!info.iommu_group)
    fail_open(Status::FailedPrecondition, bdf,
              "has no IOMMU group (" + device_dir(roots, bdf) +
                  "/iommu_group is missing): the IOMMU is off; enable it (intel_iommu=on or "
                  "amd_iommu=on on the kernel command line) or use the sysfs access without DMA");
  const std::string group_path = roots.dev + "/vfio/" + std::to_string(*info.iommu_group);
  im.group = open_or_fail(group_path, O_RDWR, bdf, "the VFIO group",
                          "give this user access to it (chown, or a udev rule), see docs/pcie.md");
  im.container = open_or_fail(roots.dev + "/vfio/vfio", O_RDWR, bdf, "the VFIO container",
                              "load the vfio module (modprobe vfio-pci)");
  const int api = ::ioctl(im.container.get(), VFIO_GET_API_VERSION);
  if (api != VFIO_API_VERSION)
    fail_open(Status::Unavailable, bdf,
              roots.dev + "/vfio/vfio is not a VFIO container of API version " + std::to_string(VFIO_API_VERSION) +
                  " (VFIO_GET_API_VERSION: " + (api < 0 ? errno_text(errno) : std::to_string(api)) + ")");
  const bool v2 = ::ioctl(im.container.get(), VFIO_CHECK_EXTENSION, VFIO_TYPE1v2_IOMMU) > 0;
  if (!v2 && ::ioctl(im.container.get(), VFIO_CHECK_EXTENSION, VFIO_TYPE1_IOMMU) <= 0)
    fail_open(Status::Unavailable, bdf, "the VFIO container offers no type-1 IOMMU (load vfio_iommu_type1)");
  vfio_group_status status{};
  status.argsz = sizeof status;
  if (::ioctl(im.group.get(), VFIO_GROUP_GET_STATUS, &status) != 0)
    fail_open(Status::Unavailable, bdf,
              group_path + " is not a VFIO group (VFIO_GROUP_GET_STATUS: " + errno_text(errno) + ")");
  if (!(status.flags & VFIO_GROUP_FLAGS_VIABLE))
    fail_open(Status::FailedPrecondition, bdf,
              "IOMMU group " + std::to_string(*info.iommu_group) +
                  " is not viable: another device in it is bound to a host driver; bind every device in " +
                  device_dir(roots, bdf) + "/iommu_group/devices to vfio-pci (or unbind it)");
  int container_fd = im.container.get();
  if (::ioctl(im.group.get(), VFIO_GROUP_SET_CONTAINER, &container_fd) != 0)
    fail_open(Status::Unavailable, bdf,
              "cannot attach IOMMU group " + std::to_string(*info.iommu_group) +
                  " to a VFIO container: " + errno_text(errno) + " (is another process using it?)");
  if (::ioctl(im.container.get(), VFIO_SET_IOMMU, v2 ? VFIO_TYPE1v2_IOMMU : VFIO_TYPE1_IOMMU) != 0)
    fail_open(Status::Unavailable, bdf, std::string("VFIO_SET_IOMMU failed: ") + errno_text(errno));
  const int dfd = ::ioctl(im.group.get(), VFIO_GROUP_GET_DEVICE_FD, bdf.c_str());
  if (dfd < 0)
    fail_open(Status::Unavailable, bdf,
              "VFIO_GROUP_GET_DEVICE_FD failed: " + errno_text(errno) + " (is the device open elsewhere?)");
  im.device.reset(dfd);
  ::fcntl(dfd, F_SETFD, FD_CLOEXEC);

  // The device may master the bus (DMA, and MSI, which is a memory write):
  // set the command register's bus-master bit through the config region.
  vfio_region_info cfg{};
  cfg.argsz = sizeof cfg;
  cfg.index = VFIO_PCI_CONFIG_REGION_INDEX;
  std::uint16_t command = 0;
  if (::ioctl(dfd, VFIO_DEVICE_GET_REGION_INFO, &cfg) != 0 ||
      ::pread(dfd, &command, sizeof command, static_cast<off_t>(cfg.offset + PCI_COMMAND)) != sizeof command)
    fail_open(Status::Unavailable, bdf, "cannot read the command register through VFIO: " + errno_text(errno));
  if (!(command & PCI_COMMAND_MASTER)) {
    command = static_cast<std::uint16_t>(command | PCI_COMMAND_MASTER);
    if (::pwrite(dfd, &command, sizeof command, static_cast<off_t>(cfg.offset + PCI_COMMAND)) != sizeof command)
      fail_open(Status::Unavailable, bdf, "cannot enable bus mastering through VFIO: " + errno_text(errno));
  }

  std::map<std::uint32_t, std::uint64_t> sizes;
  std::map<std::uint32_t, vfio_region_info> regions;
  for (std::uint32_t i = VFIO_PCI_BAR0_REGION_INDEX; i <= VFIO_PCI_BAR5_REGION_INDEX; ++i) {
    vfio_region_info r{};
    r.argsz = sizeof r;
    r.index = i;
    if (::ioctl(dfd, VFIO_DEVICE_GET_REGION_INFO, &r) != 0)
      fail_open(Status::Unavailable, bdf,
                "VFIO_DEVICE_GET_REGION_INFO for BAR" + std::to_string(i) + ": " + errno_text(errno));
    sizes[i] = r.size;
    regions[i] = r;
  }
  check_bar_sizes(info, options, sizes);
  for (std::uint32_t i : bars_to_map(info, options)) {
    if (i > 5) fail_open(Status::InvalidArgument, bdf, "BAR index " + std::to_string(i) + " (0..5)");
    const vfio_region_info& r = regions[i];
    if (!r.size) fail_open(Status::Unsupported, bdf, "BAR" + std::to_string(i) + " is not implemented");
    if (!(r.flags & VFIO_REGION_INFO_FLAG_MMAP))
      fail_open(Status::Unsupported, bdf,
                "VFIO cannot mmap BAR" + std::to_string(i) + " (" + base::format_bytes(r.size) + ", region flags " +
                    hex(r.flags) + ")");
    void* p = ::mmap(nullptr, r.size, PROT_READ | PROT_WRITE, MAP_SHARED, dfd, static_cast<off_t>(r.offset));
    if (p == MAP_FAILED)
      fail_open(Status::Unavailable, bdf,
                "mmap of BAR" + std::to_string(i) + " (" + base::format_bytes(r.size) +
                    ") through VFIO failed: " + errno_text(errno));
    im.bars[i] = {static_cast<std::byte*>(p), r.size};
  }
}

void open_sysfs(PciDevice::Impl& im, const PciInfo& info, const OpenOptions& options, const PciRoots& roots) {
  const std::string& bdf = info.bdf;
  if (!info.driver.empty() && info.driver != "uio_pci_generic")
    fail_open(Status::FailedPrecondition, bdf,
              "bound to driver '" + info.driver +
                  "'; mapping its BARs beside that driver is unsafe: unbind it, or bind vfio-pci "
                  "(DMA, MSI) or uio_pci_generic (interrupts), see docs/pcie.md");
  const std::string dir = device_dir(roots, bdf);
  std::map<std::uint32_t, std::uint64_t> sizes;
  for (auto& b : info.bars) sizes[b.index] = b.size;
  check_bar_sizes(info, options, sizes);
  if (info.driver.empty()) {
    // Unbound: memory decoding may be off. Enabling is best effort (root only).
    if (auto en = read_attr(dir + "/enable"); en && *en == "0") {
      const int fd = ::open((dir + "/enable").c_str(), O_WRONLY | O_CLOEXEC);
      if (fd >= 0) {
        [[maybe_unused]] auto n = ::write(fd, "1", 1);
        ::close(fd);
      }
    }
  }
  for (std::uint32_t i : bars_to_map(info, options)) {
    const BarInfo* b = info.bar(i);
    if (!b) fail_open(Status::Unsupported, bdf, "BAR" + std::to_string(i) + " is not implemented");
    if (b->io) fail_open(Status::Unsupported, bdf, "BAR" + std::to_string(i) + " is an I/O-port BAR");
    const std::string path = dir + "/resource" + std::to_string(i);
    UniqueFd fd = open_or_fail(path, O_RDWR | O_SYNC, bdf, "the BAR file",
                               "mapping BARs through sysfs needs root (CAP_SYS_ADMIN) or VFIO, see docs/pcie.md");
    struct stat st {};
    if (::fstat(fd.get(), &st) == 0 && static_cast<std::uint64_t>(st.st_size) < b->size)
      fail_open(Status::Unsupported, bdf,
                path + " is " + base::format_bytes(static_cast<std::uint64_t>(st.st_size)) + " but BAR" +
                    std::to_string(i) + " is " + base::format_bytes(b->size));
    void* p = ::mmap(nullptr, b->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) fail_open(Status::Unavailable, bdf, "mmap of " + path + " failed: " + errno_text(errno));
    im.bars[i] = {static_cast<std::byte*>(p), b->size};
    im.resource_fds.push_back(std::move(fd));
  }
  if (info.driver == "uio_pci_generic") {
    const std::string uio_dir = dir + "/uio";
    if (DIR* d = ::opendir(uio_dir.c_str())) {
      while (dirent* e = ::readdir(d))
        if (std::strncmp(e->d_name, "uio", 3) == 0) im.uio_name = e->d_name;
      ::closedir(d);
    }
  }
}

}  // namespace

PciDevice::PciDevice(PciInfo info, std::unique_ptr<Impl> impl, Access access)
    : info_(std::move(info)), impl_(std::move(impl)), access_(access) {}
PciDevice::~PciDevice() = default;

std::unique_ptr<PciDevice> PciDevice::open(std::string_view bdf, const OpenOptions& options, const PciRoots& roots) {
  PciInfo info = describe(bdf, roots);
  auto im = std::make_unique<Impl>();
  im->bdf = info.bdf;
  im->dev_root = roots.dev;
  im->config_path = device_dir(roots, info.bdf) + "/config";
  Access access = options.access;
  if (access == Access::Auto) {
    if (info.driver == "vfio-pci") {
      access = Access::Vfio;
    } else if (info.driver.empty() || info.driver == "uio_pci_generic") {
      access = Access::Sysfs;
    } else {
      fail_open(Status::FailedPrecondition, info.bdf,
                "bound to driver '" + info.driver +
                    "'; tpuhal needs it bound to vfio-pci (or uio_pci_generic, without DMA): "
                    "echo vfio-pci > " +
                    device_dir(roots, info.bdf) + "/driver_override, unbind, then bind; see docs/pcie.md");
    }
  }
  if (access == Access::Vfio) {
    open_vfio(*im, info, options, roots);
  } else {
    open_sysfs(*im, info, options, roots);
  }
  return std::unique_ptr<PciDevice>(new PciDevice(std::move(info), std::move(im), access));
}

std::span<std::byte> PciDevice::bar(std::uint32_t index) const noexcept {
  const auto it = impl_->bars.find(index);
  return it == impl_->bars.end() ? std::span<std::byte>{} : std::span(it->second.data, it->second.size);
}

namespace {
volatile std::byte* reg_at(const PciDevice& d, std::uint32_t index, std::uint64_t offset, unsigned width) {
  const auto b = d.bar(index);
  if (b.empty())
    throw Error(Status::OutOfRange, "PCI " + d.info().bdf + ": BAR" + std::to_string(index) + " is not mapped");
  if (offset % width || offset > b.size() || b.size() - offset < width)
    throw Error(Status::OutOfRange, "PCI " + d.info().bdf + ": " + std::to_string(width * 8) + "-bit access at " +
                                        hex(offset) + " of BAR" + std::to_string(index) + " (" + hex(b.size()) +
                                        " bytes) is unaligned or out of range");
  return b.data() + offset;
}
// Before a posted MMIO write (a doorbell): every earlier store to memory the
// device reads (descriptors, also write-combined or non-temporal ones)
// reaches it first. On x86 stores to ordinary memory are already ordered
// before an uncached store; sfence orders write-combined and streaming
// stores too, and its "memory" clobber keeps the compiler from moving
// stores across. (Not std::atomic_thread_fence: ThreadSanitizer cannot
// model fences, and this orders stores against a device, not a thread.)
inline void store_barrier() {
#if defined(__x86_64__)
  __asm__ __volatile__("sfence" ::: "memory");
#elif defined(__aarch64__)
  __asm__ __volatile__("dmb oshst" ::: "memory");
#else
  __sync_synchronize();
#endif
}

}  // namespace

std::uint32_t PciDevice::read32(std::uint32_t index, std::uint64_t offset) const {
  return *reinterpret_cast<volatile std::uint32_t*>(reg_at(*this, index, offset, 4));
}
void PciDevice::write32(std::uint32_t index, std::uint64_t offset, std::uint32_t value) const {
  auto* p = reinterpret_cast<volatile std::uint32_t*>(reg_at(*this, index, offset, 4));
  store_barrier();
  *p = value;
}
std::uint64_t PciDevice::read64(std::uint32_t index, std::uint64_t offset) const {
  return *reinterpret_cast<volatile std::uint64_t*>(reg_at(*this, index, offset, 8));
}
void PciDevice::write64(std::uint32_t index, std::uint64_t offset, std::uint64_t value) const {
  auto* p = reinterpret_cast<volatile std::uint64_t*>(reg_at(*this, index, offset, 8));
  store_barrier();
  *p = value;
}

std::uint64_t PciDevice::dma_mapped_bytes() const noexcept { return impl_->dma_bytes.load(); }

void PciDevice::map_dma(std::uint64_t iova, void* host, std::uint64_t size, bool device_writes) {
  const std::string what = "PCI " + info_.bdf;
  if (access_ != Access::Vfio)
    throw Error(Status::Unsupported,
                what + ": DMA needs VFIO and an IOMMU, but the device is reached through sysfs (driver '" +
                    (info_.driver.empty() ? std::string("none") : info_.driver) + "'" +
                    (info_.iommu_group ? "" : ", no IOMMU group") +
                    "); bind it to vfio-pci with the IOMMU on, see docs/pcie.md");
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  if (!size || iova % page || size % page || reinterpret_cast<std::uintptr_t>(host) % page)
    throw Error(Status::InvalidArgument, what + ": DMA mapping of " + hex(size) + " bytes at IOVA " + hex(iova) +
                                             " from host " + hex(reinterpret_cast<std::uintptr_t>(host)) +
                                             " is not page-aligned (page " + std::to_string(page) + ")");
  std::lock_guard lock(impl_->mu);
  rlimit lim{};
  ::getrlimit(RLIMIT_MEMLOCK, &lim);
  // VFIO pins the pages and counts them against RLIMIT_MEMLOCK unless the
  // process has CAP_IPC_LOCK. Checking first turns the kernel's bare ENOMEM
  // into a message naming the limit (the kernel also counts other locked
  // memory of the process, so its own check below can still refuse).
  if (!has_ipc_lock()) check_memlock(what, impl_->dma_bytes.load(), size, lim.rlim_cur);
  vfio_iommu_type1_dma_map m{};
  m.argsz = sizeof m;
  m.flags = VFIO_DMA_MAP_FLAG_READ | (device_writes ? VFIO_DMA_MAP_FLAG_WRITE : 0);
  m.vaddr = reinterpret_cast<std::uintptr_t>(host);
  m.iova = iova;
  m.size = size;
  if (::ioctl(impl_->container.get(), VFIO_IOMMU_MAP_DMA, &m) != 0) {
    const int err = errno;
    if (err == ENOMEM)
      throw Error(Status::OutOfMemory,
                  what + ": VFIO_IOMMU_MAP_DMA of " + base::format_bytes(size) + " at IOVA " + hex(iova) +
                      " failed: " + errno_text(err) + " (the memlock limit, " +
                      (lim.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : base::format_bytes(lim.rlim_cur)) +
                      ", or the IOMMU's mapping count)");
    throw Error(err == EEXIST || err == EINVAL ? Status::InvalidArgument : Status::DeviceFault,
                what + ": VFIO_IOMMU_MAP_DMA of " + base::format_bytes(size) + " at IOVA " + hex(iova) +
                    " failed: " + errno_text(err) + (err == EEXIST ? " (overlaps an existing mapping)" : ""));
  }
  impl_->dma[iova] = size;
  impl_->dma_bytes += size;
}

void PciDevice::unmap_dma(std::uint64_t iova, std::uint64_t size) noexcept {
  if (access_ != Access::Vfio) return;
  std::lock_guard lock(impl_->mu);
  const auto it = impl_->dma.find(iova);
  if (it == impl_->dma.end() || it->second != size) return;
  impl_->unmap_vfio(iova, size);
  impl_->dma_bytes -= size;
  impl_->dma.erase(it);
}

std::uint32_t PciDevice::enable_interrupts(std::uint32_t wanted) {
  std::lock_guard lock(impl_->mu);
  auto& im = *impl_;
  const std::string what = "PCI " + info_.bdf;
  if (im.irq != Impl::Irq::None)
    throw Error(Status::FailedPrecondition, what + ": interrupts are already enabled (" + interrupt_kind() + ")");
  if (wanted == 0) throw Error(Status::InvalidArgument, what + ": asked for 0 interrupt vectors");
  if (access_ == Access::Sysfs) {
    if (im.uio_name.empty())
      throw Error(Status::Unsupported,
                  what +
                      ": no interrupts through sysfs; bind the device to uio_pci_generic (INTx) or "
                      "vfio-pci (MSI), see docs/pcie.md");
    im.uio = open_or_fail(im.dev_root + "/" + im.uio_name, O_RDWR, info_.bdf, "the UIO device",
                          "give this user access to it (udev rule)");
    im.irq = Impl::Irq::IntxUio;
    try {
      im.unmask_intx_config(what);
    } catch (...) {
      im.irq = Impl::Irq::None;
      im.uio.reset();
      throw;
    }
    return 1;
  }
  const std::pair<std::uint32_t, Impl::Irq> order[] = {{VFIO_PCI_MSIX_IRQ_INDEX, Impl::Irq::MsiX},
                                                       {VFIO_PCI_MSI_IRQ_INDEX, Impl::Irq::Msi},
                                                       {VFIO_PCI_INTX_IRQ_INDEX, Impl::Irq::IntxVfio}};
  for (auto [index, kind] : order) {
    vfio_irq_info ii{};
    ii.argsz = sizeof ii;
    ii.index = index;
    if (::ioctl(im.device.get(), VFIO_DEVICE_GET_IRQ_INFO, &ii) != 0 || ii.count == 0) continue;
    if (!(ii.flags & VFIO_IRQ_INFO_EVENTFD)) continue;
    const std::uint32_t n = std::min(wanted, ii.count);
    std::vector<UniqueFd> fds;
    std::vector<std::byte> buf(sizeof(vfio_irq_set) + n * sizeof(std::int32_t));
    auto* set = reinterpret_cast<vfio_irq_set*>(buf.data());
    set->argsz = static_cast<std::uint32_t>(buf.size());
    set->flags = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    set->index = index;
    set->start = 0;
    set->count = n;
    for (std::uint32_t v = 0; v < n; ++v) {
      fds.push_back(base::make_eventfd());
      const std::int32_t fd = fds.back().get();
      std::memcpy(buf.data() + sizeof(vfio_irq_set) + v * sizeof fd, &fd, sizeof fd);
    }
    if (::ioctl(im.device.get(), VFIO_DEVICE_SET_IRQS, set) != 0) continue;
    im.irq_fds = std::move(fds);
    im.irq = kind;
    return n;
  }
  throw Error(Status::Unsupported, what + ": VFIO offers no MSI-X, MSI or INTx vector with eventfd signalling");
}

std::uint32_t PciDevice::interrupt_vectors() const noexcept {
  if (impl_->irq == Impl::Irq::IntxUio) return 1;
  return static_cast<std::uint32_t>(impl_->irq_fds.size());
}

std::string PciDevice::interrupt_kind() const {
  switch (impl_->irq) {
    case Impl::Irq::None: return "none";
    case Impl::Irq::MsiX: return "msi-x";
    case Impl::Irq::Msi: return "msi";
    case Impl::Irq::IntxVfio: return "intx (vfio)";
    case Impl::Irq::IntxUio: return "intx (uio)";
  }
  return "none";
}

int PciDevice::interrupt_fd(std::uint32_t vector) const {
  if (vector >= interrupt_vectors())
    throw Error(Status::OutOfRange, "PCI " + info_.bdf + ": interrupt vector " + std::to_string(vector) + " of " +
                                        std::to_string(interrupt_vectors()) + " enabled (" + interrupt_kind() + ")");
  return impl_->irq == Impl::Irq::IntxUio ? impl_->uio.get() : impl_->irq_fds[vector].get();
}

std::uint64_t PciDevice::wait_interrupt(std::uint32_t vector, std::chrono::milliseconds timeout) {
  const int fd = interrupt_fd(vector);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 1 << 30)));
    if (r > 0) break;
    if (r == 0 || errno != EINTR) return 0;  // timed out (or the fd failed: no interrupt)
  }
  if (impl_->irq == Impl::Irq::IntxUio) {
    std::int32_t count = 0;  // UIO: the total number of interrupts so far
    return ::read(fd, &count, sizeof count) == sizeof count ? 1 : 0;
  }
  return base::eventfd_drain(fd);
}

void PciDevice::rearm_intx() {
  auto& im = *impl_;
  if (im.irq == Impl::Irq::IntxUio) {
    im.unmask_intx_config("PCI " + info_.bdf);
  } else if (im.irq == Impl::Irq::IntxVfio) {
    vfio_irq_set set{};
    set.argsz = sizeof set;
    set.flags = VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_UNMASK;
    set.index = VFIO_PCI_INTX_IRQ_INDEX;
    set.count = 1;
    if (::ioctl(im.device.get(), VFIO_DEVICE_SET_IRQS, &set) != 0)
      throw Error(Status::Unavailable, "PCI " + info_.bdf + ": unmasking INTx through VFIO: " + errno_text(errno));
  }
}

}  // namespace tpuhal::bus
