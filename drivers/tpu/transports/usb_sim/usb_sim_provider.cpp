#include "tpuhal/tpu/usb_sim_provider.h"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <system_error>

#include "tpuhal/base/env.h"
#include "tpuhal/base/fd.h"
#include "tpuhal/sim/usb_function.h"
#include "tpuhal/tpu/device.h"
#include "tpuhal/tpu/usb_transport.h"

namespace tpuhal::tpu {
namespace {

std::pair<base::UniqueFd, base::UniqueFd> socket_pair(int type) {
  int fds[2];
  if (::socketpair(AF_UNIX, type | SOCK_CLOEXEC, 0, fds) != 0)
    throw std::system_error(errno, std::generic_category(), "socketpair");
  return {base::UniqueFd(fds[0]), base::UniqueFd(fds[1])};
}

bool send_all(int fd, std::span<const std::byte> data) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

std::size_t receive(int fd, std::span<std::byte> out) {
  for (;;) {
    const ssize_t n = ::recv(fd, out.data(), out.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    return n > 0 ? static_cast<std::size_t>(n) : 0;
  }
}

// The cable: a stream pair for the bulk pipes, a packet pair for the
// interrupt pipe, and the board's function on its far end.
class Cable final : public sim::FunctionEndpoints {
 public:
  explicit Cable(sim::BoardProfile profile) {
    std::tie(host_bulk_, board_bulk_) = socket_pair(SOCK_STREAM);
    std::tie(host_irq_, board_irq_) = socket_pair(SOCK_SEQPACKET);
    function_ = std::make_shared<sim::UsbFunction>(std::move(profile), *this);
  }
  ~Cable() override {
    unplug();
    function_.reset();  // its threads end: the host side is gone
  }

  void unplug() noexcept {
    ::shutdown(board_bulk_.get(), SHUT_RDWR);
    ::shutdown(board_irq_.get(), SHUT_RDWR);
  }

  // The board's end.
  std::size_t read_out(std::span<std::byte> out) override { return receive(board_bulk_.get(), out); }
  bool write_in(std::span<const std::byte> data) override { return send_all(board_bulk_.get(), data); }
  bool write_irq(std::span<const std::byte> data) override {
    return ::send(board_irq_.get(), data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }

  int host_bulk() const noexcept { return host_bulk_.get(); }
  int host_irq() const noexcept { return host_irq_.get(); }
  const std::shared_ptr<sim::UsbFunction>& function() const noexcept { return function_; }

 private:
  base::UniqueFd host_bulk_, board_bulk_, host_irq_, board_irq_;
  std::shared_ptr<sim::UsbFunction> function_;
};

class CableLink final : public UsbLink {
 public:
  CableLink(std::shared_ptr<Cable> cable, std::string name) : cable_(std::move(cable)), name_(std::move(name)) {}

  std::string bus() const override { return "usb-sim " + name_; }
  std::size_t control_in(std::uint8_t request, std::span<std::byte> out) override {
    if (request != fw::kUsbGetIdentity)
      throw Error(Status::Unsupported, bus() + ": no control request " + std::to_string(request));
    const fw::UsbIdentity id = cable_->function()->identity();
    const std::size_t n = std::min(out.size(), sizeof id);
    std::memcpy(out.data(), &id, n);
    return n;
  }
  void control_out(std::uint8_t request) override {
    if (request == fw::kUsbResetLink) cable_->function()->reset_link();
  }
  bool bulk_out(std::span<const std::byte> data) override { return send_all(cable_->host_bulk(), data); }
  std::size_t bulk_in(std::span<std::byte> out) override { return receive(cable_->host_bulk(), out); }
  std::size_t interrupt_in(std::span<std::byte> out) override { return receive(cable_->host_irq(), out); }
  void shutdown() noexcept override {
    ::shutdown(cable_->host_bulk(), SHUT_RDWR);
    ::shutdown(cable_->host_irq(), SHUT_RDWR);
  }

 private:
  std::shared_ptr<Cable> cable_;
  std::string name_;
};

std::vector<std::string> configured_boards() { return base::env_list("TPUHAL_USB_SIM_BOARDS", ""); }

struct OpenCables {
  std::mutex mu;
  std::map<std::string, std::weak_ptr<Cable>, std::less<>> by_uri;
};
OpenCables& open_cables() {
  static OpenCables c;
  return c;
}

std::shared_ptr<Cable> cable_of(std::string_view uri) {
  auto& oc = open_cables();
  std::lock_guard lock(oc.mu);
  auto it = oc.by_uri.find(uri);
  return it == oc.by_uri.end() ? nullptr : it->second.lock();
}

class UsbSimProvider final : public driver::Provider {
 public:
  std::string_view scheme() const override { return "usb-sim"; }
  std::string protocol() const override { return interface_protocol(); }

  std::vector<DeviceInfo> enumerate() override {
    std::vector<DeviceInfo> out;
    const auto boards = configured_boards();
    for (std::size_t i = 0; i < boards.size(); ++i) {
      sim::BoardProfile p = sim::load_profile(boards[i]);
      out.push_back({"usb-sim:" + std::to_string(i), "tpu-usb-sim", p.model, p.dram_bytes});
    }
    return out;
  }

  std::shared_ptr<driver::DeviceBackend> open(std::string_view uri) override {
    const std::string_view rest = uri.substr(uri.find(':') + 1);
    std::string spec(rest);
    if (rest.empty())
      throw Error(Status::InvalidArgument, "device URI '" + std::string(uri) + "' names no board; use usb-sim:PROFILE");
    if (rest.find_first_not_of("0123456789") == std::string_view::npos) {
      const auto boards = configured_boards();
      const auto index = std::strtoull(spec.c_str(), nullptr, 10);
      if (index >= boards.size())
        throw Error(Status::NotFound, "no device '" + std::string(uri) + "': " + std::to_string(boards.size()) +
                                          " usb-sim board(s) configured (TPUHAL_USB_SIM_BOARDS lists their profiles)");
      spec = boards[index];
    }
    sim::BoardProfile profile;
    try {
      profile = sim::load_profile(spec);
    } catch (const sim::ProfileError& e) {
      throw Error(Status::NotFound, std::string(uri) + ": " + e.what());
    }
    std::shared_ptr<Cable> cable;
    try {
      cable = std::make_shared<Cable>(std::move(profile));
    } catch (const std::system_error& e) {
      throw Error(Status::OutOfMemory, std::string(uri) + ": cannot create the simulated board: " + e.what());
    } catch (const sim::ProfileError& e) {
      throw Error(Status::InvalidArgument, std::string(uri) + ": " + e.what());
    }
    {
      auto& oc = open_cables();
      std::lock_guard lock(oc.mu);
      oc.by_uri[std::string(uri)] = cable;
    }
    return open_device(make_usb_transport(std::make_unique<CableLink>(cable, spec)), std::string(uri), "tpu-usb-sim");
  }
};

}  // namespace

std::shared_ptr<driver::Provider> make_usb_sim_provider() { return std::make_shared<UsbSimProvider>(); }

std::shared_ptr<sim::UsbFunction> usb_sim_function_of(std::string_view uri) {
  auto cable = cable_of(uri);
  return cable ? cable->function() : nullptr;
}

bool usb_sim_unplug(std::string_view uri) {
  auto cable = cable_of(uri);
  if (!cable) return false;
  cable->unplug();
  return true;
}

}  // namespace tpuhal::tpu
