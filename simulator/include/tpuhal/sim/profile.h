// Board profiles: the data that makes a simulated board a particular board.
//
// A profile is a JSON document (simulator/profiles/*.json, see
// docs/board-profiles.md). The built-in ones are compiled in; others are read
// from a path or from the directories in TPUHAL_PROFILE_PATH (colon-separated).
// Every field is validated; a bad profile is a ProfileError naming the source,
// the field and the value.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "tpuhal/fw/regs.h"
#include "tpuhal/fw/timing.h"

namespace tpuhal::sim {

class ProfileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct MemRegionProfile {
  std::string name;  // at most 15 characters
  std::uint64_t base = 0;
  std::uint64_t size = 0;
  bool host_visible = false;  // inside the BAR2 aperture
  bool is_default = false;    // the heap device allocations use by default
  bool reserved = false;      // the firmware's own; never handed out
};

struct QueueGroupProfile {
  fw::EngineType engine = fw::EngineType::kNone;
  std::uint32_t count = 0;
};

struct BoardProfile {
  std::string name;   // short identifier: "bm1684x"
  std::string model;  // what a person reads: "SOPHON BM1684X-class ..."
  std::string bus;    // "pcie", "soc" or "usb"
  std::uint16_t pci_vendor = 0;
  std::uint16_t pci_device = 0;
  // A board on a USB cable: its IDs running firmware and in its loader (0:
  // none). The usb provider recognises them (cmake/TpuhalBoards.cmake).
  std::uint16_t usb_vendor = 0;
  std::uint16_t usb_product = 0;
  std::uint16_t usb_loader_product = 0;
  std::uint32_t board_id = 0;
  std::uint32_t revision = 0;
  std::uint64_t serial = 0;
  std::uint32_t firmware_version = 0;  // major << 16 | minor << 8 | patch

  std::uint64_t dram_bytes = 0;
  std::uint64_t aperture_bytes = 0;  // host-visible window onto DRAM (SoC: all of it)
  std::vector<MemRegionProfile> regions;

  std::vector<QueueGroupProfile> queues;  // in hardware queue order
  std::uint32_t max_ring_entries = 4096;

  std::uint32_t tensor_cores = 0;
  double int8_tops = 0;
  double fp16_tflops = 0;
  double fp32_tflops = 0;
  std::uint32_t decode_channels = 0;
  std::uint32_t decode_threads = 0;  // decode threads shared by the channels (0: host cores)
  // The codec unit's working memory: packets queued for the decoders and
  // the decoders' own frames (references, reordering), charged as they are
  // taken; past it a packet or a frame is refused with kOutOfMemory. 0: 64
  // MiB per channel. A VF of the daemon gets its share.
  std::uint64_t decode_memory_bytes = 0;
  std::vector<std::string> codecs;

  // Model timing: how long an idle command processor spins before sleeping.
  std::uint32_t idle_spin_us = 20;
  // The board's timing model (timing.model, docs/timing.md): with one, the
  // board keeps modelled time (fence timestamps, kTimestamp, the TIME
  // registers); without one, or with TPUHAL_SIM_CLOCK=host, the host's.
  std::optional<fw::TimingModel> timing;

  // The power and thermal model behind the board's telemetry
  // (docs/simulator.md): power grows linearly from idle to peak with the
  // engines' utilisation; the die follows the power through one thermal
  // resistance and time constant.
  double idle_power_w = 10;
  double peak_power_w = 50;
  double ambient_c = 35;
  double thermal_c_per_w = 0.5;  // die temperature rise per watt, steady state
  double thermal_time_s = 20;    // the die's thermal time constant
  std::uint32_t clock_mhz = 1000;

  std::uint32_t total_queues() const noexcept;
  fw::EngineType engine_of_queue(std::uint32_t q) const noexcept;
};

// The codec unit's working memory: the profile's, or its default.
inline std::uint64_t decode_memory_bytes(const BoardProfile& p) noexcept {
  return p.decode_memory_bytes ? p.decode_memory_bytes : std::uint64_t{p.decode_channels} << 26;
}

// Parses and validates a profile document. `source` names it in errors.
BoardProfile parse_profile(std::string_view json_text, std::string_view source);

// A built-in profile by name, a file path (anything containing '/' or ending
// in .json), or a name found as NAME.json in TPUHAL_PROFILE_PATH.
BoardProfile load_profile(std::string_view name_or_path);

// Names of the profiles compiled into the library.
std::vector<std::string> builtin_profile_names();

}  // namespace tpuhal::sim
