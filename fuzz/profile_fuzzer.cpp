// sim::parse_profile: a board profile, JSON from a file the user names or a
// directory in TPUHAL_PROFILE_PATH (docs/board-profiles.md).
//
// Input: the document's text. Properties:
//   - the only way to refuse a document is a ProfileError that names the
//     source (no other exception, no crash);
//   - an accepted profile obeys every rule of docs/board-profiles.md,
//     checked here independently of the validator;
//   - a board built from it shows the profile in its registers.
#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstring>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "tpuhal/fw/command.h"
#include "tpuhal/fw/regs.h"
#include "tpuhal/sim/board.h"
#include "tpuhal/sim/profile.h"

namespace fw = tpuhal::fw;
namespace sim = tpuhal::sim;

namespace {

constexpr std::string_view kSource = "fuzz.json";
constexpr std::uint64_t kPage = 4096;

bool valid_name(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isalnum(c) || c == '-' || c == '_'; });
}

void check_rules(const sim::BoardProfile& p) {
  FUZZ_CHECK(valid_name(p.name) && p.name.size() <= 32, "name \"%s\"", p.name.c_str());
  FUZZ_CHECK(p.model.size() <= 63 && (p.model.empty() || tpuhal::fuzz::printable(p.model)), "model \"%s\"",
             p.model.c_str());
  FUZZ_CHECK(p.bus == "pcie" || p.bus == "soc" || p.bus == "usb", "bus \"%s\"", p.bus.c_str());
  FUZZ_CHECK(p.dram_bytes >= (1u << 20) && p.dram_bytes <= (1ull << 40) && p.dram_bytes % kPage == 0, "dram %" PRIu64,
             p.dram_bytes);
  FUZZ_CHECK(p.aperture_bytes <= p.dram_bytes && p.aperture_bytes % kPage == 0, "aperture %" PRIu64, p.aperture_bytes);
  FUZZ_CHECK(!p.regions.empty() && p.regions.size() <= fw::kMaxMemRegions, "%zu regions", p.regions.size());
  int defaults = 0;
  for (std::size_t i = 0; i < p.regions.size(); ++i) {
    const auto& r = p.regions[i];
    FUZZ_CHECK(!r.name.empty() && r.name.size() <= 15 && tpuhal::fuzz::printable(r.name), "region %zu name \"%s\"", i,
               r.name.c_str());
    FUZZ_CHECK(r.size > 0 && r.base % kPage == 0 && r.size % kPage == 0, "region %zu base %#" PRIx64 " size %#" PRIx64,
               i, r.base, r.size);
    FUZZ_CHECK(r.base < p.dram_bytes && r.size <= p.dram_bytes - r.base,
               "region %zu [%#" PRIx64 ", +%#" PRIx64 ") outside DRAM", i, r.base, r.size);
    FUZZ_CHECK(!r.host_visible || r.base + r.size <= p.aperture_bytes, "host-visible region %zu outside the aperture",
               i);
    FUZZ_CHECK(!(r.is_default && r.reserved), "region %zu default and reserved", i);
    defaults += r.is_default;
    for (std::size_t j = 0; j < i; ++j) {
      const auto& o = p.regions[j];
      FUZZ_CHECK(r.base + r.size <= o.base || o.base + o.size <= r.base, "regions %zu and %zu overlap", j, i);
      FUZZ_CHECK(r.name != o.name, "regions %zu and %zu share a name", j, i);
    }
  }
  FUZZ_CHECK(defaults == 1, "%d default regions", defaults);
  const std::uint32_t queues = p.total_queues();
  FUZZ_CHECK(queues >= 1 && queues <= fw::kMaxQueues, "%u queues", queues);
  for (std::uint32_t q = 0; q < queues; ++q)
    FUZZ_CHECK(p.engine_of_queue(q) != fw::EngineType::kNone, "queue %u has no engine", q);
  FUZZ_CHECK(p.engine_of_queue(queues) == fw::EngineType::kNone, "queue past the last has an engine");
  const std::uint32_t m = p.max_ring_entries;
  FUZZ_CHECK(m >= fw::kMinRingEntries && m <= (1u << 20) && (m & (m - 1)) == 0, "max_ring_entries %u", m);
  FUZZ_CHECK(p.idle_spin_us <= 10'000, "idle_spin_us %u", p.idle_spin_us);
  // firmware_version: major << 16 | minor << 8 | patch with a 16-bit major,
  // so every 32-bit value is one; nothing to check.
}

// The board a profile makes: its identity registers show the profile.
void check_board(const sim::BoardProfile& p) {
  sim::Board board(p);
  namespace reg = fw::reg;
  auto r64 = [&](std::uint32_t lo) {
    const std::uint64_t l = board.mmio_read32(lo);
    return std::uint64_t{board.mmio_read32(lo + 4)} << 32 | l;
  };
  FUZZ_CHECK(board.mmio_read32(reg::kIdMagic) == fw::kIdMagic, "ID_MAGIC");
  FUZZ_CHECK(r64(reg::kDramSizeLo) == p.dram_bytes, "DRAM_SIZE");
  FUZZ_CHECK(r64(reg::kApertureLo) == p.aperture_bytes, "APERTURE");
  FUZZ_CHECK(r64(reg::kSerialLo) == p.serial, "SERIAL");
  FUZZ_CHECK(board.mmio_read32(reg::kFirmwareVersion) == p.firmware_version, "FIRMWARE_VERSION");
  FUZZ_CHECK(board.mmio_read32(reg::kMaxRingEntries) == p.max_ring_entries, "MAX_RING_ENTRIES");
  const std::uint32_t nq = board.mmio_read32(reg::kNumQueues);
  FUZZ_CHECK(nq == p.total_queues() && board.mmio_read32(reg::kNumVectors) == nq + 1, "NUM_QUEUES %u NUM_VECTORS", nq);
  for (std::uint32_t q = 0; q < fw::kMaxQueues; ++q) {
    const std::uint32_t engine = board.mmio_read32(reg::queue_reg(q, reg::queue::kEngine));
    FUZZ_CHECK(q < nq ? engine == static_cast<std::uint32_t>(p.engine_of_queue(q)) : engine == 0xFFFFFFFF,
               "queue %u ENGINE %#x", q, engine);
  }
  const std::uint32_t nr = board.mmio_read32(reg::kNumMemRegions);
  FUZZ_CHECK(nr == p.regions.size(), "NUM_MEM_REGIONS %u", nr);
  for (std::uint32_t i = 0; i < fw::kMaxMemRegions; ++i) {
    char name[16];
    for (std::uint32_t w = 0; w < 16; w += 4) {
      const std::uint32_t v = board.mmio_read32(reg::region_reg(i, reg::region::kName + w));
      std::memcpy(name + w, &v, 4);
    }
    const std::uint64_t base = r64(reg::region_reg(i, reg::region::kBaseLo));
    const std::uint64_t size = r64(reg::region_reg(i, reg::region::kSizeLo));
    if (i >= nr) {
      FUZZ_CHECK(base == 0 && size == 0 && name[0] == 0, "region %u past the last", i);
      continue;
    }
    const auto& region = p.regions[i];
    FUZZ_CHECK(base == region.base && size == region.size, "region %u BASE/SIZE", i);
    FUZZ_CHECK(name[15] == 0 && region.name == name, "region %u NAME", i);
  }
  char model[fw::reg::kBoardNameBytes];
  for (std::uint32_t w = 0; w < sizeof model; w += 4) {
    const std::uint32_t v = board.mmio_read32(reg::kBoardName + w);
    std::memcpy(model + w, &v, 4);
  }
  FUZZ_CHECK(model[sizeof model - 1] == 0 && p.model == model, "BOARD_NAME");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  sim::BoardProfile profile;
  try {
    profile = sim::parse_profile(text, kSource);
  } catch (const sim::ProfileError& e) {
    const std::string_view what = e.what();
    FUZZ_CHECK(what.starts_with("board profile 'fuzz.json': ") && what.size() > 27, "error \"%s\"", e.what());
    return 0;
  }
  check_rules(profile);
  check_board(profile);
  return 0;
}
