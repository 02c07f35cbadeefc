// The "pcie" provider: TPU boards on the PCI bus, driven by the TPU driver
// through a PcieTransport (BAR0 registers, BAR2 aperture, DMA through the
// VFIO IOMMU, MSI/MSI-X eventfds).
//
//   pcie:0000:03:00.0   the board at that PCI address (pcie:03:00.0 also works)
//
// enumerate() lists the functions whose vendor:device ID is a known board
// (known_boards()) or is named in TPUHAL_PCIE_IDS ("vvvv:dddd,..."), for
// boards under bring-up. See docs/pcie.md for binding a board to vfio-pci.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tpuhal/driver/driver.hpp"
#include "tpuhal/bus/pci_device.h"
#include "tpuhal/tpu/transport.h"

namespace tpuhal::tpu {

struct KnownBoard {
  bus::PciId id;
  std::string name;  // the board profile's name ("bm1684x")
};

// The boards this driver recognises, and those added by TPUHAL_PCIE_IDS
// (named "board under bring-up (TPUHAL_PCIE_IDS)"). Throws Status::InvalidArgument naming the
// entry if TPUHAL_PCIE_IDS is malformed.
std::vector<KnownBoard> known_boards();

// A Transport on an opened PCI function (BAR0 mapped, at least fw::kBar0Size;
// BAR2, if any, is the aperture; VFIO access, since the driver needs DMA).
std::unique_ptr<Transport> make_pcie_transport(std::unique_ptr<bus::PciDevice> device);

// `roots` point discovery and opening elsewhere than /sys and /dev (tests).
std::shared_ptr<driver::Provider> make_pcie_provider(bus::PciRoots roots = {});

}  // namespace tpuhal::tpu
