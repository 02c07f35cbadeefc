#include "tpuhal/pcie/pcie_provider.h"

#include <cstdio>
#include <cstdlib>

#include "tpuhal/base/env.h"
#include "tpuhal/error.hpp"
#include "tpuhal/fw/regs.h"
#include "tpuhal/tpu/device.h"

namespace tpuhal::pcie {
namespace {

// The PCI IDs of the board profiles (simulator/profiles/*.json, "pci");
// tests/tpu/pcie_test.cpp checks that the two agree.
const KnownBoard kBuiltinBoards[] = {
    {{0x1f1c, 0x1686}, "bm1684x"},
    {{0x1f1c, 0x0001}, "tiny"},
};

constexpr std::uint32_t kWantedVectors = 64;

class PcieTransport final : public tpu::Transport {
 public:
  explicit PcieTransport(std::unique_ptr<PciDevice> dev) : dev_(std::move(dev)) {
    const std::string& bdf = dev_->info().bdf;
    if (!dev_->dma_available())
      throw Error(Status::Unsupported,
                  "PCI " + bdf + ": the TPU driver needs DMA, which needs VFIO, but the device is reached through " +
                      to_string(dev_->access()) + "; bind it to vfio-pci with the IOMMU on (see docs/pcie.md)");
    if (dev_->bar(0).size() < fw::kBar0Size)
      throw Error(Status::Unsupported, "PCI " + bdf + ": BAR0 is " + std::to_string(dev_->bar(0).size()) +
                                           " bytes mapped, the register file needs " +
                                           std::to_string(fw::kBar0Size));
    dev_->enable_interrupts(kWantedVectors);
  }

  std::string bus() const override {
    return "pcie " + dev_->info().summary() + ", " + to_string(dev_->access()) + ", " +
           std::to_string(dev_->interrupt_vectors()) + " " + dev_->interrupt_kind() + " vector(s)";
  }
  std::uint32_t read32(std::uint32_t offset) override { return dev_->read32(0, offset); }
  void write32(std::uint32_t offset, std::uint32_t value) override { dev_->write32(0, offset, value); }
  std::span<std::byte> aperture() override { return dev_->bar(2); }
  void map_dma(std::uint64_t iova, void* host, std::uint64_t size, bool device_writes) override {
    dev_->map_dma(iova, host, size, device_writes);
  }
  void unmap_dma(std::uint64_t iova, std::uint64_t size) noexcept override { dev_->unmap_dma(iova, size); }
  std::uint32_t interrupt_vectors() const override { return dev_->interrupt_vectors(); }
  int interrupt_fd(std::uint32_t vector) const override { return dev_->interrupt_fd(vector); }

 private:
  std::unique_ptr<PciDevice> dev_;
};

std::string id_text(PciId id) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04x:%04x", id.vendor, id.device);
  return buf;
}

class PcieProvider final : public driver::Provider {
 public:
  explicit PcieProvider(PciRoots roots) : roots_(std::move(roots)) {}
  std::string_view scheme() const override { return "pcie"; }

  std::vector<DeviceInfo> enumerate() override {
    const auto boards = known_boards();
    std::vector<PciId> ids;
    for (auto& b : boards) ids.push_back(b.id);
    std::vector<DeviceInfo> out;
    for (auto& info : discover(ids, roots_)) {
      const BarInfo* bar2 = info.bar(2);
      out.push_back({"pcie:" + info.bdf, "tpu-pcie", board_name(boards, info.id) + " (" + info.summary() + ")",
                     bar2 ? bar2->size : 0});
    }
    return out;
  }

  std::string unavailable_reason() const override {
    try {
      known_boards();
    } catch (const Error& e) {
      return e.what();  // a malformed TPUHAL_PCIE_IDS
    }
    return {};
  }

  std::shared_ptr<driver::DeviceBackend> open(std::string_view uri) override {
    const std::string_view rest = uri.substr(uri.find(':') + 1);
    const auto bdf = canonical_bdf(rest);
    if (!bdf)
      throw Error(Status::InvalidArgument, "device URI '" + std::string(uri) +
                                               "' names no PCI address; use pcie:DDDD:BB:DD.F (e.g. pcie:0000:03:00.0)");
    const PciInfo info = describe(*bdf, roots_);
    const auto boards = known_boards();
    bool known = false;
    for (auto& b : boards) known = known || b.id == info.id;
    if (!known) {
      std::string list;
      for (auto& b : boards) list += (list.empty() ? "" : ", ") + id_text(b.id) + " " + b.name;
      throw Error(Status::Unsupported, std::string(uri) + ": PCI function " + info.bdf + " is " + id_text(info.id) +
                                           ", not a known board (" + list +
                                           "; TPUHAL_PCIE_IDS adds IDs for boards under bring-up)");
    }
    OpenOptions opts;
    opts.access = Access::Vfio;  // the driver needs DMA: refuse other bindings before touching the card
    opts.min_bar_sizes = {{0, fw::kBar0Size}};
    opts.bars = {0};
    if (info.bar(2)) opts.bars.push_back(2);
    auto transport = make_pcie_transport(PciDevice::open(*bdf, opts, roots_));
    return tpu::open_device(std::move(transport), std::string(uri), "tpu-pcie");
  }

 private:
  static std::string board_name(const std::vector<KnownBoard>& boards, PciId id) {
    for (auto& b : boards)
      if (b.id == id) return b.name;
    return id_text(id);
  }
  PciRoots roots_;
};

}  // namespace

std::vector<KnownBoard> known_boards() {
  std::vector<KnownBoard> out(std::begin(kBuiltinBoards), std::end(kBuiltinBoards));
  for (const std::string& item : base::env_list("TPUHAL_PCIE_IDS")) {
    unsigned v = 0, d = 0;
    int used = 0;
    if (std::sscanf(item.c_str(), "%4x:%4x%n", &v, &d, &used) != 2 || used != static_cast<int>(item.size()))
      throw Error(Status::InvalidArgument,
                  "TPUHAL_PCIE_IDS: '" + item + "' is not a vendor:device pair of hex IDs (e.g. 1f1c:1686)");
    out.push_back({{static_cast<std::uint16_t>(v), static_cast<std::uint16_t>(d)}, "board under bring-up (TPUHAL_PCIE_IDS)"});
  }
  return out;
}

std::unique_ptr<tpu::Transport> make_pcie_transport(std::unique_ptr<PciDevice> device) {
  return std::make_unique<PcieTransport>(std::move(device));
}

std::shared_ptr<driver::Provider> make_pcie_provider(PciRoots roots) {
  return std::make_shared<PcieProvider>(std::move(roots));
}

}  // namespace tpuhal::pcie
