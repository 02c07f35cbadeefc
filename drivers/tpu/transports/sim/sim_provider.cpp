#include "tpuhal/tpu/sim_provider.h"

#include <cstdlib>
#include <map>
#include <mutex>

#include "tpuhal/base/env.h"
#include "tpuhal/base/units.h"
#include "tpuhal/sim/board.h"
#include "tpuhal/tpu/device.h"

namespace tpuhal::tpu {
namespace {

class SimTransport final : public Transport {
 public:
  explicit SimTransport(std::shared_ptr<sim::Board> board) : board_(std::move(board)) {}

  std::string bus() const override { return "simulated " + board_->profile().bus; }
  std::string tensor_isa() const override { return board_->tensor_isa(); }
  std::uint32_t read32(std::uint32_t offset) override { return board_->mmio_read32(offset); }
  void write32(std::uint32_t offset, std::uint32_t value) override {
    // The board's register file is the other side of a function call; its
    // atomics order the earlier aperture stores (release on TAIL).
    board_->mmio_write32(offset, value);
  }
  std::span<std::byte> aperture() override { return board_->aperture(); }
  void map_dma(std::uint64_t iova, void* host, std::uint64_t size, bool device_writes) override {
    const std::uint32_t access = sim::kIommuRead | (device_writes ? sim::kIommuWrite : 0);
    if (auto why = board_->iommu().map(iova, host, size, access); !why.empty())
      throw Error(Status::Internal, "DMA mapping failed: " + why);
  }
  void unmap_dma(std::uint64_t iova, std::uint64_t size) noexcept override { board_->iommu().unmap(iova, size); }
  void prefault(std::uint64_t address, std::uint64_t size) noexcept override { board_->prefault(address, size); }
  std::uint32_t interrupt_vectors() const override { return board_->interrupt_vectors(); }
  int interrupt_fd(std::uint32_t vector) const override { return board_->interrupt_fd(vector); }

 private:
  std::shared_ptr<sim::Board> board_;
};

std::vector<std::string> configured_boards() { return base::env_list("TPUHAL_SIM_BOARDS", "bm1684x"); }

struct OpenBoards {
  std::mutex mu;
  std::map<std::string, std::weak_ptr<sim::Board>, std::less<>> by_uri;
};
OpenBoards& open_boards() {
  static OpenBoards b;
  return b;
}

class SimProvider final : public driver::Provider {
 public:
  std::string_view scheme() const override { return "sim"; }
  std::string protocol() const override { return interface_protocol(); }

  std::vector<DeviceInfo> enumerate() override {
    std::vector<DeviceInfo> out;
    const auto boards = configured_boards();
    for (std::size_t i = 0; i < boards.size(); ++i) {
      sim::BoardProfile p = sim::load_profile(boards[i]);
      out.push_back({"sim:" + std::to_string(i), "tpu-sim", p.model, p.dram_bytes});
    }
    return out;
  }

  std::shared_ptr<driver::DeviceBackend> open(std::string_view uri) override {
    const std::string_view rest = uri.substr(uri.find(':') + 1);
    std::string spec;
    if (!rest.empty() && rest.find_first_not_of("0123456789") == std::string_view::npos) {
      const auto boards = configured_boards();
      const auto index = std::strtoull(std::string(rest).c_str(), nullptr, 10);
      if (index >= boards.size()) {
        std::string list;
        for (std::size_t i = 0; i < boards.size(); ++i) list += (i ? ", sim:" : "sim:") + std::to_string(i);
        throw Error(Status::NotFound, "no device '" + std::string(uri) + "': " + std::to_string(boards.size()) +
                                          " simulated board(s) configured (" + (list.empty() ? "none" : list) +
                                          "; TPUHAL_SIM_BOARDS lists their profiles)");
      }
      spec = boards[index];
    } else if (!rest.empty()) {
      spec = std::string(rest);
    } else {
      throw Error(Status::InvalidArgument,
                  "device URI '" + std::string(uri) + "' names no board; use sim:0 or sim:PROFILE");
    }
    sim::BoardProfile profile;
    try {
      profile = sim::load_profile(spec);
    } catch (const sim::ProfileError& e) {
      throw Error(Status::NotFound, std::string(uri) + ": " + e.what());
    }
    std::shared_ptr<sim::Board> board;
    try {
      board = std::make_shared<sim::Board>(std::move(profile));
    } catch (const std::system_error& e) {
      throw Error(Status::OutOfMemory, std::string(uri) + ": cannot create the simulated board: " + e.what());
    } catch (const sim::ProfileError& e) {
      throw Error(Status::InvalidArgument, std::string(uri) + ": " + e.what());
    }
    {
      auto& ob = open_boards();
      std::lock_guard lock(ob.mu);
      ob.by_uri[std::string(uri)] = board;
    }
    return open_device(make_sim_transport(board), std::string(uri), "tpu-sim");
  }
};

}  // namespace

std::unique_ptr<Transport> make_sim_transport(std::shared_ptr<sim::Board> board) {
  return std::make_unique<SimTransport>(std::move(board));
}

std::shared_ptr<driver::Provider> make_sim_provider() { return std::make_shared<SimProvider>(); }

std::shared_ptr<sim::Board> sim_board_of(std::string_view uri) {
  auto& ob = open_boards();
  std::lock_guard lock(ob.mu);
  auto it = ob.by_uri.find(uri);
  return it == ob.by_uri.end() ? nullptr : it->second.lock();
}

}  // namespace tpuhal::tpu
