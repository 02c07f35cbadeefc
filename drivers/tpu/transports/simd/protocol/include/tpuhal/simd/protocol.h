// The wire protocol between the simulator daemon (tpuhal-simd) and the
// simd: transport (docs/simd.md). Shared by both; sees base only, and the
// list of statuses an error reply carries (tpuhal/status.inc).
//
// Control messages travel over a SOCK_SEQPACKET Unix socket, one request
// and one reply at a time, file descriptors riding along as SCM_RIGHTS.
// Register accesses travel through a shared-memory channel (a memfd the
// daemon creates per client): posted writes and non-posted reads in one
// single-producer, single-consumer ring, so a read never passes an earlier
// write, as on PCIe.
//
// The daemon trusts nothing a client writes, in a message or in the
// channel: every field is checked, ring indices are masked, register
// offsets are checked by the board.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tpuhal/base/fd.h"

namespace tpuhal::simd {

inline constexpr std::uint32_t kMagic = 0x44534854;  // "THSD"
// 2: shadow doorbells in the channel; 3: BoardInfo::tensor_isa, VfStats::uid;
// 4: StatsRequest pages, VfStats' process name, queues, regions and
//    telemetry; kTelemetry
// Header and ErrorReply keep their layout in every version, so that each
// side can tell a peer of another version why they cannot talk
// (version_mismatch below).
inline constexpr std::uint16_t kVersion = 5;
inline constexpr std::size_t kMaxMessageBytes = 4096;
inline constexpr std::size_t kMaxFds = 64;

enum class MsgType : std::uint16_t {
  // client -> daemon
  kList = 1,       // the boards served; reply kBoards
  kAttach = 2,     // AttachRequest: become a VF of a board; reply kAttached + fds
  kMapDma = 3,     // MapDmaRequest + one memfd; reply kOk
  kUnmapDma = 4,   // UnmapDmaRequest; reply kOk once the board can no longer reach it
  kStats = 5,      // StatsRequest (or no body: from the first VF); reply kStatsReply
  kTelemetry = 6,  // TelemetryRequest; reply kTelemetryReply
  kDetach = 7,     // give the VF back; reply kOk once another attach may take it
  // daemon -> client
  kOk = 100,
  kError = 101,           // ErrorReply
  kBoards = 102,          // BoardsReply
  kAttached = 103,        // AttachedReply; fds: DRAM memfd, channel memfd, one eventfd per vector
  kStatsReply = 104,      // StatsReply
  kTelemetryReply = 105,  // a telemetry block (fw/telemetry.h) as the body
};

struct Header {
  std::uint32_t magic = kMagic;
  std::uint16_t version = kVersion;
  MsgType type{};
  std::uint32_t body_bytes = 0;
  std::uint32_t reserved = 0;
};
static_assert(sizeof(Header) == 16);

// The status an error reply carries: tpuhal::Status's values, expanded from
// the one list, so that the daemon, which links no HAL, and the transport,
// which throws it as a tpuhal::Error, speak the same numbers.
enum class ErrorStatus : std::uint32_t {
#define TPUHAL_STATUS(name, c_name, value, text, python, doc) name = value,
#include "tpuhal/status.inc"
#undef TPUHAL_STATUS
};
// The status `value` is, or nullopt for one not in the list (from a daemon
// of a later version, or garbage).
std::optional<ErrorStatus> error_status(std::uint32_t value) noexcept;

struct ErrorReply {
  std::uint32_t status = 0;  // an ErrorStatus
  char message[1020] = {};
};

struct BoardInfo {
  char profile[32] = {};
  char model[96] = {};
  char bus[16] = {};
  std::uint64_t board_dram_bytes = 0;  // the whole board
  std::uint64_t vf_dram_bytes = 0;     // each VF's share
  std::uint32_t vfs_total = 0;
  std::uint32_t vfs_in_use = 0;
  char tensor_isa[16] = {};  // the level the daemon's tensor engine runs at ("avx2"), or empty
};
static_assert(sizeof(BoardInfo) == 184);
inline constexpr std::uint32_t kMaxBoards = (kMaxMessageBytes - sizeof(Header) - 8) / sizeof(BoardInfo);

struct BoardsReply {
  std::uint32_t count = 0;
  std::uint32_t reserved = 0;
  BoardInfo boards[kMaxBoards];
};

struct AttachRequest {
  std::uint32_t board = 0;
  std::uint32_t reserved = 0;
};

struct AttachedReply {
  BoardInfo board;
  std::uint32_t vf = 0;              // this client's VF number on the board
  std::uint32_t vectors = 0;         // eventfds that follow the two memfds
  std::uint64_t dram_bytes = 0;      // size of the DRAM memfd
  std::uint64_t aperture_bytes = 0;  // the host-visible window at its start
  std::uint64_t channel_bytes = 0;   // size of the channel memfd
};

enum Access : std::uint32_t { kRead = 1, kWrite = 2 };

struct MapDmaRequest {
  std::uint64_t iova = 0;
  std::uint64_t offset = 0;  // into the memfd, page-aligned
  std::uint64_t size = 0;    // page-aligned
  std::uint32_t access = 0;  // Access bits
  std::uint32_t reserved = 0;
};

struct UnmapDmaRequest {
  std::uint64_t iova = 0;
  std::uint64_t size = 0;
};

// Statistics are sent a page at a time: the client asks from `first` on
// until it has `total` entries.
struct StatsRequest {
  std::uint32_t first = 0;  // the first VF entry wanted
  std::uint32_t reserved = 0;
};

inline constexpr std::uint32_t kMaxVfRegions = 4;

// One VF in use and the process that holds it.
struct VfStats {
  std::uint32_t board = 0;
  std::uint32_t vf = 0;
  std::int32_t pid = 0;            // the client's process
  std::uint32_t dma_mappings = 0;  // host memory the VF's IOMMU maps
  std::uint64_t dram_resident_bytes = 0;
  std::uint64_t dma_mapped_bytes = 0;
  std::uint32_t uid = 0;             // the client's user
  std::uint32_t queues_enabled = 0;  // queues the client's driver enabled
  char name[16] = {};                // the client's command name (/proc/PID/comm)
  // DRAM resident per memory region of the VF (the driver's heaps), in the
  // profile's order; unused entries have an empty name.
  struct Region {
    char name[16] = {};
    std::uint64_t resident_bytes = 0;
  } regions[kMaxVfRegions];
  // The VF's telemetry (fw/telemetry.h), counted since the VF was attached.
  std::uint64_t uptime_ns = 0;
  std::uint64_t engine_busy_ns[4] = {};  // by fw::EngineType
  std::uint64_t dma_bytes[4] = {};       // by fw::DmaDirection
  std::uint64_t commands = 0;            // retired, all queues
  std::uint64_t failures = 0;            // failed, all queues
  std::uint64_t frames = 0;              // decoded, all channels
  std::uint64_t decode_errors = 0;
  std::uint64_t energy_uj = 0;
  std::uint32_t power_mw = 0;
  std::int32_t temperature_mc = 0;
};
static_assert(sizeof(VfStats) == 272);
inline constexpr std::uint32_t kMaxVfStats = (kMaxMessageBytes - sizeof(Header) - 32) / sizeof(VfStats);

struct StatsReply {
  std::uint32_t boards = 0;
  std::uint32_t vfs = 0;              // entries in vf[]
  std::uint64_t protocol_errors = 0;  // bad messages answered with kError since start
  std::uint32_t first = 0;            // vf[0]'s place among all entries
  std::uint32_t total = 0;            // entries in all (the VFs in use this caller may see)
  // The VFs in use on every board, every user's: the sum of BoardInfo::
  // vfs_in_use, counted at the same moment as the entries, so that for the
  // daemon's owner it always equals `total`.
  std::uint32_t vfs_in_use = 0;
  std::uint32_t reserved = 0;
  VfStats vf[kMaxVfStats];
};
static_assert(offsetof(StatsReply, vf) == 32);

// A telemetry block (fw/telemetry.h) read by the daemon, which takes no VF
// and no queue. For one VF in use: that VF's counters since it was
// attached (its owner's user, or the daemon's, may ask). For the whole
// board (vf = kWholeBoard): every VF's counters summed since the daemon
// started, those of VFs since given back included, so that each counter
// only grows; sensors from one power model of the whole board.
inline constexpr std::uint32_t kWholeBoard = 0xFFFFFFFFu;
struct TelemetryRequest {
  std::uint32_t board = 0;
  std::uint32_t vf = kWholeBoard;
};

// ---- The register channel ----------------------------------------------------

enum class RegOp : std::uint32_t { kWrite = 1, kRead = 2 };

struct RegRequest {
  std::uint32_t op;
  std::uint32_t offset;
  std::uint32_t value;
  std::uint32_t seq;  // kRead: echoed in Channel::response_seq
};

inline constexpr std::uint32_t kRingEntries = 1024;    // a power of two
inline constexpr std::uint32_t kShadowDoorbells = 32;  // >= the firmware interface's kMaxQueues

// A hardware queue's shadow doorbell (docs/simd.md): the board's TAIL
// register for the queue lives here. The client stores TAIL here directly
// when nothing it posted to the ring is still pending, then rings the
// register through the ring only if the queue's command processor says it
// sleeps: a submission then reaches the processor without the daemon's
// channel thread.
struct ShadowDoorbell {
  alignas(64) std::atomic<std::uint32_t> tail{0};      // written by the client (and the board)
  alignas(64) std::atomic<std::uint32_t> sleeping{0};  // written by the command processor
};

// Laid out in the channel memfd; every field is shared by the two processes.
struct Channel {
  // The client (producer).
  alignas(64) std::atomic<std::uint32_t> tail{0};
  std::atomic<std::uint32_t> client_waiting{0};  // 1: asleep on response_seq
  // The daemon (consumer).
  alignas(64) std::atomic<std::uint32_t> head{0};
  std::atomic<std::uint32_t> daemon_sleeping{0};  // 1: asleep on `tail`; kick it
  std::atomic<std::uint32_t> response_seq{0};
  std::atomic<std::uint32_t> response_value{0};
  alignas(64) RegRequest ring[kRingEntries];
  ShadowDoorbell doorbell[kShadowDoorbells];
};
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

// Futex operations on memory shared between processes (not private).
void shared_futex_wait(const std::atomic<std::uint32_t>& word, std::uint32_t expected,
                       std::chrono::nanoseconds timeout) noexcept;
void shared_futex_wake(const std::atomic<std::uint32_t>& word) noexcept;

// ---- Messages --------------------------------------------------------------------

struct Message {
  Header header;
  std::vector<std::byte> body;
  std::vector<base::UniqueFd> fds;
  // Who sent it, as the kernel says (SCM_CREDENTIALS), on a socket with
  // SO_PASSCRED set: the process that sent this message, which need not be
  // the one that connected. sender_pid 0: not known (no SO_PASSCRED, or a
  // sender in a pid namespace the receiver cannot see).
  std::int32_t sender_pid = 0;
  std::uint32_t sender_uid = ~0u;

  template <class T>
  const T* as() const noexcept {  // the body as T, or null if it is too short
    return body.size() >= sizeof(T) ? reinterpret_cast<const T*>(body.data()) : nullptr;
  }
};

// Sends one message (header, `body`, `fds`). Returns 0 or an errno value.
int send_message(int sock, MsgType type, std::span<const std::byte> body, std::span<const int> fds = {});
template <class T>
int send_struct(int sock, MsgType type, const T& body, std::span<const int> fds = {}) {
  return send_message(sock, type, {reinterpret_cast<const std::byte*>(&body), sizeof body}, fds);
}
int send_error(int sock, ErrorStatus status, const std::string& message);

// Receives one message, waiting up to `timeout` (negative: forever).
// Returns 0, ETIMEDOUT, ECONNRESET when the peer closed, EPROTO for a
// message that is not one of ours (wrong size, magic or version; `why`
// says which), or another errno value.
// A message of another protocol version (right magic, its size as its
// header says) is EPROTO too, with its header and body left in `out`:
// is_other_version(out) tells, and an error reply in it can be read.
int receive_message(int sock, Message& out, std::chrono::milliseconds timeout, std::string* why = nullptr);
bool is_other_version(const Message& m) noexcept;
// What a side tells a user whose peer speaks protocol `theirs`: both
// versions and the packages to bring to one version. `daemon`: this side
// is the daemon (its peer the client library), else the client.
std::string version_mismatch(std::uint16_t theirs, bool daemon);

std::string to_string(MsgType type);

// Copies `s` into a fixed, NUL-terminated field.
template <std::size_t N>
void set_field(char (&field)[N], std::string_view s) noexcept {
  const std::size_t n = s.size() < N - 1 ? s.size() : N - 1;
  for (std::size_t i = 0; i < n; ++i) field[i] = s[i];
  for (std::size_t i = n; i < N; ++i) field[i] = '\0';
}
// Reads a fixed field that the peer may not have terminated.
template <std::size_t N>
std::string get_field(const char (&field)[N]) {
  std::size_t n = 0;
  while (n < N && field[n]) ++n;
  return std::string(field, n);
}

}  // namespace tpuhal::simd
