#include "server.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <system_error>

#include "tpuhal/base/hex.h"
#include "tpuhal/base/log.h"
#include "tpuhal/base/mapping.h"
#include "tpuhal/base/units.h"
#include "tpuhal/base/wait.h"
#include "tpuhal/fw/telemetry.h"
#include "tpuhal/sim/board.h"
#include "tpuhal/sim/power.h"
#include <spdlog/spdlog.h>

namespace tpuhal::simd {
namespace {

using namespace std::chrono_literals;

constexpr std::uint64_t kVfUnit = 64 << 10;
// Connections beyond one per VF: listings, statistics, clients waiting for
// a VF to come free.
constexpr std::size_t kSpareConnections = 64;
// Descriptors the daemon keeps for itself: a connection that would leave
// fewer free is refused, so that an attach (memfds, eventfds), a log line or
// a refusal still finds descriptors when clients hold the rest.
constexpr int kFdReserve = 16;
// Refused connections lingering at once; past that the oldest is closed
// without waiting for its client to read the answer.
constexpr std::size_t kMaxRefused = 64;

std::string errno_text(int err) { return std::strerror(err); }

// This host's physical memory: the default for the mapped-bytes quotas.
std::uint64_t physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(size) : 1ull << 40;
}

// The mappings the daemon may make for its clients: vm.max_map_count less
// a quarter (at least 4096) for its own boards, channels and threads.
std::uint64_t mapping_budget() {
  std::uint64_t limit = 65530;  // the kernel's default
  if (FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
    unsigned long long v = 0;
    if (std::fscanf(f, "%llu", &v) == 1 && v > 0) limit = v;
    std::fclose(f);
  }
  const std::uint64_t reserve = std::max<std::uint64_t>(4096, limit / 4);
  return limit > reserve ? limit - reserve : limit / 2;
}

// "quota NAME is LIMIT and WHO already holds USE" for a refused request.
std::string over_quota(const char* name, const char* option, std::uint64_t limit, const std::string& who,
                       const std::string& use) {
  return "refused: quota " + std::string(name) + " is " + std::to_string(limit) + " and " + who + " " + use +
         " (tpuhal-simd --" + option + ")";
}
std::string over_bytes_quota(const char* name, const char* option, std::uint64_t limit, const std::string& who,
                             std::uint64_t use, std::uint64_t asked) {
  return "refused: quota " + std::string(name) + " is " + base::format_bytes(limit) + " and " + who + " maps " +
         base::format_bytes(use) + " already, asking for " + base::format_bytes(asked) + " more (tpuhal-simd --" +
         option + ")";
}

// Drains one client's register channel into its VF's board: posted writes
// in order, reads answered in order behind them.
void drain(Channel& ch, sim::Board& board, const std::atomic<bool>& stop, std::uint64_t spin_ns,
           bool sleep_after_write) {
  std::uint32_t head = ch.head.load(std::memory_order_relaxed);
  std::uint64_t idle_since = base::monotonic_ns();
  while (!stop.load(std::memory_order_relaxed)) {
    const std::uint32_t tail = ch.tail.load(std::memory_order_acquire);
    if (tail != head) {
      if (tail - head > kRingEntries) {
        // The client wrote nonsense into its own channel: skip what it
        // claims, and so only its own registers suffer.
        head = tail;
        ch.head.store(head, std::memory_order_release);
        continue;
      }
      bool answered_read = false;
      while (head != tail) {
        const RegRequest r = ch.ring[head % kRingEntries];
        answered_read = false;
        if (r.op == static_cast<std::uint32_t>(RegOp::kWrite)) {
          board.mmio_write32(r.offset, r.value);
        } else if (r.op == static_cast<std::uint32_t>(RegOp::kRead)) {
          answered_read = true;
          ch.response_value.store(board.mmio_read32(r.offset), std::memory_order_relaxed);
          ch.response_seq.store(r.seq, std::memory_order_seq_cst);
          if (ch.client_waiting.load(std::memory_order_seq_cst)) shared_futex_wake(ch.response_seq);
        }
        ++head;
      }
      ch.head.store(head, std::memory_order_release);
      // Reads come in bursts (a register read is usually followed by more):
      // poll for the next one. On a host with few cores a posted write ends
      // the burst (the client goes on without an answer; a doorbell is
      // followed by a wait on a fence): sleep at once and leave the cores to
      // the client and the command processor the doorbell woke, since three
      // spinning threads on two cores starve one another.
      idle_since = answered_read || !sleep_after_write ? base::monotonic_ns() : base::monotonic_ns() - spin_ns;
      continue;
    }
    if (base::monotonic_ns() - idle_since < spin_ns) {
      // Poll. With few cores, give the core to any other runnable thread
      // on each turn: the VF's command processor may need it more.
      if (sleep_after_write)
        ::sched_yield();
      else
        base::cpu_relax();
      continue;
    }
    // Sleep; the client kicks the futex when it sees daemon_sleeping.
    ch.daemon_sleeping.store(1, std::memory_order_seq_cst);
    if (ch.tail.load(std::memory_order_seq_cst) == head) shared_futex_wait(ch.tail, head, 50ms);
    ch.daemon_sleeping.store(0, std::memory_order_relaxed);
    idle_since = base::monotonic_ns();
  }
}

// A telemetry block taken apart. The blocks come from the daemon's own
// boards, so they are trusted.
TelemetryBlock parse_block(const std::vector<std::byte>& bytes) {
  TelemetryBlock b;
  std::memcpy(&b.header, bytes.data(), sizeof b.header);
  const std::byte* at = bytes.data() + sizeof b.header;
  b.queues.resize(b.header.num_queues);
  for (auto& q : b.queues) std::memcpy(&q, at, sizeof q), at += sizeof q;
  b.channels.resize(b.header.num_channels);
  for (auto& c : b.channels) std::memcpy(&c, at, sizeof c), at += sizeof c;
  return b;
}

// Adds `from`'s counters to `into`'s (entries matched by place; sensors
// and times are left alone).
void add_counters(TelemetryBlock& into, const TelemetryBlock& from) {
  fw::TelemetryHeader& h = into.header;
  const fw::TelemetryHeader& f = from.header;
  h.resets += f.resets;
  for (int i = 0; i < 4; ++i) h.engine_busy_ns[i] += f.engine_busy_ns[i], h.dma_bytes[i] += f.dma_bytes[i];
  for (std::uint32_t k = 0; k < fw::kTelemetryFaultKinds; ++k) h.faults[k] += f.faults[k];
  h.firmware_crashes += f.firmware_crashes;
  if (into.queues.size() < from.queues.size()) into.queues.resize(from.queues.size());
  for (std::size_t i = 0; i < from.queues.size(); ++i) {
    into.queues[i].engine = from.queues[i].engine;
    into.queues[i].index = from.queues[i].index;
    into.queues[i].commands += from.queues[i].commands;
    into.queues[i].busy_ns += from.queues[i].busy_ns;
    into.queues[i].failures += from.queues[i].failures;
  }
  if (into.channels.size() < from.channels.size()) into.channels.resize(from.channels.size());
  for (std::size_t i = 0; i < from.channels.size(); ++i) {
    into.channels[i].packets += from.channels[i].packets;
    into.channels[i].frames += from.channels[i].frames;
    into.channels[i].errors += from.channels[i].errors;
    into.channels[i].busy_ns += from.channels[i].busy_ns;
  }
}

// The block as bytes, with as many entries as fit in one message.
std::vector<std::byte> serialise(TelemetryBlock b) {
  fw::TelemetryHeader& h = b.header;
  const std::size_t room = kMaxMessageBytes - sizeof(Header) - sizeof h;
  h.num_queues = static_cast<std::uint32_t>(std::min(b.queues.size(), room / sizeof(fw::TelemetryQueue)));
  h.num_channels = static_cast<std::uint32_t>(
      std::min(b.channels.size(), (room - h.num_queues * sizeof(fw::TelemetryQueue)) / sizeof(fw::TelemetryChannel)));
  h.total_bytes = static_cast<std::uint32_t>(fw::telemetry_bytes(h.num_queues, h.num_channels));
  std::vector<std::byte> out(h.total_bytes);
  std::memcpy(out.data(), &h, sizeof h);
  std::byte* at = out.data() + sizeof h;
  for (std::uint32_t i = 0; i < h.num_queues; ++i)
    std::memcpy(at, &b.queues[i], sizeof(fw::TelemetryQueue)), at += sizeof(fw::TelemetryQueue);
  for (std::uint32_t i = 0; i < h.num_channels; ++i)
    std::memcpy(at, &b.channels[i], sizeof(fw::TelemetryChannel)), at += sizeof(fw::TelemetryChannel);
  return out;
}

// The command name of a process, as ps shows it.
std::string process_name(pid_t pid) {
  std::string name;
  if (FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/comm").c_str(), "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f)) name = buf;
    std::fclose(f);
  }
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
  return name;
}

// A VF's entry in the statistics: what its board holds and has done.
void fill_vf_stats(sim::Board& board, VfStats& s) {
  s.dram_resident_bytes = board.dram_resident_bytes();
  s.dma_mappings = static_cast<std::uint32_t>(board.iommu().mapping_count());
  s.dma_mapped_bytes = board.iommu().mapped_bytes();
  s.queues_enabled = board.queues_enabled();
  const auto& regions = board.profile().regions;
  std::uint32_t n = 0;
  for (auto& region : regions) {
    if (region.reserved || n == kMaxVfRegions) continue;
    set_field(s.regions[n].name, region.name);
    s.regions[n++].resident_bytes = board.dram_resident_bytes(region.base, region.size);
  }
  const TelemetryBlock t = parse_block(board.telemetry());
  const fw::TelemetryHeader& h = t.header;
  s.uptime_ns = h.uptime_ns;
  std::copy(std::begin(h.engine_busy_ns), std::end(h.engine_busy_ns), s.engine_busy_ns);
  std::copy(std::begin(h.dma_bytes), std::end(h.dma_bytes), s.dma_bytes);
  s.energy_uj = h.energy_uj;
  s.power_mw = h.power_mw;
  s.temperature_mc = h.temperature_mc;
  for (auto& q : t.queues) s.commands += q.commands, s.failures += q.failures;
  for (auto& c : t.channels) s.frames += c.frames, s.decode_errors += c.errors;
}

}  // namespace

std::span<const BoundedResource> bounded_resources() noexcept {
  static constexpr BoundedResource kTable[] = {
      {"connections", "--max-connections-per-process --max-connections-per-user"},
      {"vfs", "--max-vfs-per-process --max-vfs-per-user --vfs"},
      {"codec-memory", "profile video.memory, divided by --vfs"},
      {"codec-packets", "64 per channel (fw::kMaxVideoPendingPackets)"},
      {"command-memory", "the command fails with kOutOfMemory"},
      {"dma-mappings", "--max-mappings-per-client --max-mappings-per-user"},
      {"dma-bytes", "--max-mapped-bytes-per-client --max-mapped-bytes-per-user"},
      {"idle-connections", "--idle-seconds --max-connections-per-user"},
      {"threads", "--max-threads"},
      {"requests", "--max-requests-per-second"},
      {"descriptors", "RLIMIT_NOFILE, less 16 kept by the daemon"},
  };
  return kTable;
}

sim::BoardProfile vf_profile(const sim::BoardProfile& board, std::uint32_t vfs) {
  if (vfs == 0) throw sim::ProfileError("--vfs must be at least 1");
  auto share = [&](std::uint64_t v) { return v / vfs / kVfUnit * kVfUnit; };
  sim::BoardProfile p = board;
  p.dram_bytes = share(board.dram_bytes);
  p.aperture_bytes = board.aperture_bytes == board.dram_bytes ? p.dram_bytes : share(board.aperture_bytes);
  p.decode_memory_bytes = share(sim::decode_memory_bytes(board));
  for (auto& r : p.regions) {
    r.base = share(r.base);
    r.size = share(r.size);
    if (r.size == 0)
      throw sim::ProfileError("board '" + board.name + "' divided into " + std::to_string(vfs) +
                              " VFs leaves memory region '" + r.name + "' empty; use fewer --vfs");
    if (r.host_visible && r.base + r.size > p.aperture_bytes) r.size = p.aperture_bytes - r.base;
  }
  // Rings need host-visible memory: one 4096-entry ring of 64-byte
  // descriptors per queue at least.
  if (p.aperture_bytes < std::uint64_t{p.total_queues()} * 4096 * 64)
    throw sim::ProfileError("board '" + board.name + "' divided into " + std::to_string(vfs) + " VFs leaves " +
                            base::format_bytes(p.aperture_bytes) + " of aperture per VF, too little for " +
                            std::to_string(p.total_queues()) + " queue rings; use fewer --vfs");
  return p;
}

struct Server::BoardSlot {
  sim::BoardProfile profile;  // the whole board
  sim::BoardProfile vf;       // one VF's share
  std::string tensor_isa;     // the level its VFs' tensor engines run at
  std::vector<bool> used;     // guarded by Server::mu_
  // The whole board's telemetry, guarded by Server::mu_: what the VFs given
  // back had counted, and one power model fed by every VF's engines.
  std::uint64_t started_ns = 0;
  TelemetryBlock retired;
  std::optional<sim::PowerModel> power;
};

struct Server::Client {
  base::UniqueFd sock;
  pid_t pid = 0;
  uid_t uid = 0;
  std::string name;  // /proc/PID/comm of the process it is charged to
  std::thread thread;
  std::atomic<bool> finished{false};
  std::uint64_t connected_ns = base::monotonic_ns();
  // Closed by the daemon to admit another connection of its user (set
  // under Server::mu_, with its read side shut down to wake its thread).
  std::atomic<bool> evicted{false};

  // Attached: set by the client's thread under Server::mu_, read by stats.
  std::uint32_t board_index = 0;
  std::uint32_t vf = 0;
  base::Mapping channel;  // before board: the board's shadow doorbells live in it
  std::unique_ptr<sim::Board> board;
  // The client holds BoardSlot::used[vf] of board_index: set and cleared
  // under Server::mu_ together with that flag. Stats lists exactly these
  // clients (with nothing resident while the board is being made or torn
  // down), so that a reply's VFs and the boards' vfs_in_use agree at every
  // moment.
  bool holds_vf = false;
  std::atomic<bool> drain_stop{false};
  std::thread drain;
  struct Dma {
    void* host;
    std::uint64_t size;
  };
  std::map<std::uint64_t, Dma> dma;  // by IOVA; changed by the client's thread under Server::mu_
  std::uint64_t dma_bytes = 0;       // the sum of dma's sizes, likewise
};

Server::Server(ServerOptions options) : options_(std::move(options)) {
  if (options_.boards.empty()) options_.boards.push_back("bm1684x");
  // An inherited socket's path and mode are read from it, before the quotas
  // that depend on who may connect.
  if (options_.listen_fd >= 0) adopt_socket();
  Quotas& q = options_.quotas;
  if (q.mapped_bytes_per_client == 0) q.mapped_bytes_per_client = physical_memory() / 4;
  if (q.mapped_bytes_per_user == 0) q.mapped_bytes_per_user = physical_memory();
  // All VFs but one: no one process, nor (where other users may connect)
  // one user, takes every VF. 0 stays "no limit".
  const std::uint32_t all_vfs =
      static_cast<std::uint32_t>(std::max<std::size_t>(options_.boards.size(), 1)) * options_.vfs;
  const std::uint32_t all_but_one = all_vfs > 1 ? all_vfs - 1 : 1;
  if (q.vfs_per_process == Quotas::kDefault) q.vfs_per_process = all_but_one;
  if (q.vfs_per_user == Quotas::kDefault) q.vfs_per_user = (options_.mode & 0066) ? all_but_one : 0;
  max_mappings_ = mapping_budget();
  if (options_.mode & ~0777u)
    throw std::runtime_error("--mode " + hex(options_.mode) + " is not a permission mode (0600, 0660, ...)");
  if (options_.listen_fd < 0 && (options_.mode & 0600) != 0600)
    throw std::runtime_error("--mode must let the daemon's owner read and write the socket (0600 at least)");
  gid_t gid = static_cast<gid_t>(-1);
  if (options_.listen_fd < 0 && !options_.group.empty()) {
    std::vector<char> buf(16384);
    group gr{};
    group* found = nullptr;
    if (::getgrnam_r(options_.group.c_str(), &gr, buf.data(), buf.size(), &found) != 0 || !found)
      throw std::runtime_error("--group " + options_.group + ": no such group");
    gid = found->gr_gid;
  }
  spare_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  rlimit nofile{};
  fd_limit_ = ::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY
                  ? static_cast<int>(std::min<rlim_t>(nofile.rlim_cur, 1 << 30))
                  : 1 << 30;
  if (options_.boards.size() > kMaxBoards)
    throw std::runtime_error("at most " + std::to_string(kMaxBoards) + " boards per daemon");
  for (const auto& name : options_.boards) {
    auto slot = std::make_unique<BoardSlot>();
    slot->profile = sim::load_profile(name);
    slot->vf = vf_profile(slot->profile, options_.vfs);
    slot->tensor_isa = sim::Board::tensor_isa_of(slot->vf);  // a bad TPUHAL_MAX_ISA stops the daemon here
    slot->used.assign(options_.vfs, false);
    slot->started_ns = base::monotonic_ns();
    boards_.push_back(std::move(slot));
  }
  // Said at start, not when the first client opens a board.
  if (std::any_of(boards_.begin(), boards_.end(), [](const auto& b) { return b->profile.decode_channels > 0; }))
    (void)sim::Board::video_unavailable();
  if (!options_.trace_path.empty()) trace_ = std::make_unique<BoardTrace>(options_.trace_path);
  stop_ = base::make_eventfd();

  if (options_.listen_fd < 0) bind_socket(gid);
}

void Server::adopt_socket() {
  listen_.reset(options_.listen_fd);
  const int fd = listen_.get();
  int type = 0, domain = 0, listening = 0;
  socklen_t len = sizeof type;
  const bool is_socket = ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0;
  len = sizeof domain;
  ::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len);
  len = sizeof listening;
  ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len);
  if (!is_socket || domain != AF_UNIX || type != SOCK_SEQPACKET || !listening)
    throw std::runtime_error("the inherited socket (descriptor " + std::to_string(fd) +
                             ") is not a listening Unix sequential-packet socket (a socket unit needs "
                             "ListenSequentialPacket=PATH)");
  sockaddr_un addr{};
  len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || len <= sizeof(sa_family_t) ||
      addr.sun_path[0] == '\0')
    throw std::runtime_error("the inherited socket has no path in the file system");
  const std::string path(addr.sun_path, ::strnlen(addr.sun_path, len - sizeof(sa_family_t)));
  if (!options_.socket_path.empty() && options_.socket_path != path)
    throw std::runtime_error("--socket " + options_.socket_path + ", but the inherited socket is " + path);
  options_.socket_path = path;
  // Who may connect is the socket's mode (the socket unit's SocketMode=).
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw std::runtime_error("stat " + path + ": " + errno_text(errno));
  options_.mode = st.st_mode & 0777;
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  const int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, sizeof on);
}

void Server::bind_socket(gid_t gid) {
  const std::string& path = options_.socket_path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path)
    throw std::runtime_error("socket path '" + path + "' is empty or longer than " +
                             std::to_string(sizeof addr.sun_path - 1) + " bytes");
  std::memcpy(addr.sun_path, path.data(), path.size());
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) throw std::runtime_error(path + " exists and is not a socket");
    base::UniqueFd probe(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (probe && ::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0)
      throw std::runtime_error("a daemon already serves " + path);
    ::unlink(path.c_str());  // left behind by one that died
  }
  listen_.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!listen_) throw std::runtime_error("socket(): " + errno_text(errno));
  // Owner-only from the first moment: no window in which another user
  // could connect.
  const mode_t old_mask = ::umask(0177);
  const int rc = ::bind(listen_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  const int bind_err = errno;
  ::umask(old_mask);
  if (rc != 0) throw std::runtime_error("bind " + path + ": " + errno_text(bind_err));
  // The group first, then the mode that may open the socket to it.
  if (gid != static_cast<gid_t>(-1) && ::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    throw std::runtime_error("cannot give " + path + " to group " + options_.group + ": " + errno_text(err));
  }
  if (::chmod(path.c_str(), options_.mode) != 0 || ::lstat(path.c_str(), &st) != 0 ||
      (st.st_mode & 0777) != options_.mode || st.st_uid != ::getuid()) {
    ::unlink(path.c_str());
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", options_.mode);
    throw std::runtime_error("cannot set " + path + " to mode " + mode);
  }
  // Accepted connections inherit SO_PASSCRED: every message the kernel
  // queues for them from then on names its sender (serve()).
  const int on = 1;
  ::setsockopt(listen_.get(), SOL_SOCKET, SO_PASSCRED, &on, sizeof on);
  if (::listen(listen_.get(), 64) != 0) {
    ::unlink(path.c_str());
    throw std::runtime_error("listen on " + path + ": " + errno_text(errno));
  }
}

Server::~Server() {
  stop();
  std::list<std::unique_ptr<Client>> clients;
  {
    std::lock_guard lock(mu_);
    clients.swap(clients_);
  }
  for (auto& c : clients) {
    // A thread blocked sending to a client that stopped reading returns.
    ::shutdown(c->sock.get(), SHUT_RDWR);
    if (c->thread.joinable()) c->thread.join();
  }
  // An inherited socket is its owner's (systemd keeps it for the next start).
  if (options_.listen_fd < 0) ::unlink(options_.socket_path.c_str());
  if (trace_) trace_->finish();
}

void Server::stop() noexcept { base::eventfd_signal(stop_.get()); }

std::chrono::nanoseconds Server::take_request(std::int32_t pid) {
  const double rate = options_.quotas.requests_per_second;
  if (rate == 0) return {};
  Bucket& b = buckets_[pid];
  const auto now = std::chrono::steady_clock::now();
  b.tokens = std::min(rate, b.tokens + rate * std::chrono::duration<double>(now - b.refilled).count());
  b.refilled = now;
  if (b.tokens >= 1) {
    b.tokens -= 1;
    return {};
  }
  return std::chrono::nanoseconds(static_cast<std::int64_t>((1 - b.tokens) / rate * 1e9) + 1);
}

bool Server::throttle(const Client& client) {
  for (;;) {
    std::chrono::nanoseconds wait;
    {
      std::lock_guard lock(mu_);
      wait = take_request(client.pid);
    }
    if (wait.count() == 0) return true;
    pollfd p{stop_.get(), POLLIN, 0};
    const timespec ts{static_cast<time_t>(wait.count() / 1000000000), static_cast<long>(wait.count() % 1000000000)};
    if (::ppoll(&p, 1, &ts, nullptr) > 0) return false;
  }
}

void Server::reap_finished() {
  std::list<std::unique_ptr<Client>> done;
  {
    std::lock_guard lock(mu_);
    // A bucket full again is the same as none.
    const double rate = options_.quotas.requests_per_second;
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(buckets_, [&](const auto& kv) {
      return kv.second.tokens + rate * std::chrono::duration<double>(now - kv.second.refilled).count() >= rate;
    });
    for (auto it = clients_.begin(); it != clients_.end();) {
      if ((*it)->finished.load()) {
        Client& c = **it;
        if (c.evicted.load()) --users_[c.uid].evicted;
        if (--users_[c.uid].connections == 0 && users_[c.uid].vfs == 0) users_.erase(c.uid);
        if (--processes_[c.pid].connections == 0 && processes_[c.pid].vfs == 0) processes_.erase(c.pid);
        done.push_back(std::move(*it));
        it = clients_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : done)
    if (c->thread.joinable()) c->thread.join();
}

std::thread Server::start_thread(std::function<void()> fn) {
  const std::uint32_t most = options_.quotas.threads;
  if (most && threads_.load() >= most)
    throw std::system_error(
        EAGAIN, std::generic_category(),
        "the daemon's " + std::to_string(most) + " threads (tpuhal-simd --max-threads) are all in use");
  threads_.fetch_add(1);
  try {
    return std::thread([this, fn = std::move(fn)] {
      fn();
      threads_.fetch_sub(1);
    });
  } catch (...) {
    threads_.fetch_sub(1);
    throw;
  }
}

void Server::run() {
  auto log = base::logger("simd");
  log->info("serving {} board(s) on {}, {} VF(s) each", boards_.size(), options_.socket_path, options_.vfs);
  pollfd p[2] = {{listen_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
  for (;;) {
    const int n = ::poll(p, 2, refused_.empty() ? 1000 : 50);
    reap_finished();
    drain_refused();
    if (n < 0 && errno != EINTR) throw std::runtime_error("poll: " + errno_text(errno));
    if (n <= 0) continue;
    if (p[1].revents) break;
    if (!(p[0].revents & POLLIN)) continue;
    try {
      accept_one();
    } catch (const std::exception& e) {
      // Whatever failed (memory, say) failed this connection only.
      log->warn("a connection failed: {}", e.what());
    }
  }
  log->info("stopping");
}

void Server::refuse(base::UniqueFd sock, ErrorStatus status, const std::string& message) {
  send_error(sock.get(), status, message);
  ::shutdown(sock.get(), SHUT_WR);
  if (refused_.size() >= kMaxRefused) refused_.erase(refused_.begin());
  refused_.push_back({std::move(sock), std::chrono::steady_clock::now() + 2s});
  drain_refused();
}

void Server::drain_refused() {
  const auto now = std::chrono::steady_clock::now();
  for (auto it = refused_.begin(); it != refused_.end();) {
    bool done = now >= it->until;
    char buf[256];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
    while (!done) {
      iovec iov{buf, sizeof buf};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      const ssize_t n = ::recvmsg(it->sock.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
      for (cmsghdr* c = n >= 0 ? CMSG_FIRSTHDR(&msg) : nullptr; c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        for (std::size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
          ::close(fd);
        }
      }
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) done = true;  // hung up, or gone
      if (n < 0 && errno == EAGAIN) break;
    }
    it = done ? refused_.erase(it) : std::next(it);
  }
}

void Server::accept_one() {
  auto log = base::logger("simd");
  base::UniqueFd sock(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!sock) {
    const int err = errno;
    if ((err == EMFILE || err == ENFILE) && spare_) {
      // Out of descriptors: free the spare one for as long as it takes to
      // take the connection and tell it why, rather than leave it queued
      // (and the listening socket readable, the loop spinning).
      spare_.reset();
      base::UniqueFd refused(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (refused) {
        // Answered and closed at once: lingering would hold the descriptor
        // the daemon lacks.
        send_error(refused.get(), ErrorStatus::ResourceExhausted,
                   "the simulator daemon is out of file descriptors (" + errno_text(err) + "); try again later");
        ::shutdown(refused.get(), SHUT_WR);
        char buf[256];
        while (::recv(refused.get(), buf, sizeof buf, MSG_DONTWAIT) > 0) {
        }
      }
      refused.reset();
      spare_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      log->warn("refused a connection: {}", errno_text(err));
    } else if (err == EMFILE || err == ENFILE) {
      std::this_thread::sleep_for(10ms);  // no spare either: let descriptors come back
    }
    return;
  }
  // Descriptors are numbered lowest free first: this one's number is how
  // many the daemon holds below it.
  if (sock.get() >= fd_limit_ - kFdReserve) {
    const std::string why = "the simulator daemon is out of file descriptors (" + std::to_string(sock.get() + 1) +
                            " of its limit of " + std::to_string(fd_limit_) + " in use); try again later";
    refuse(std::move(sock), ErrorStatus::ResourceExhausted, why);
    log->warn("refused a connection: {}", why);
    return;
  }
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    refuse(std::move(sock), ErrorStatus::PermissionDenied, "the simulator daemon cannot tell who is connecting");
    return;
  }
  // With an owner-only socket only the owner gets here, root apart: refuse
  // that too. With a group or wider mode, the mode says who may connect.
  if (cred.uid != ::getuid() && !(options_.mode & 0066)) {
    refuse(std::move(sock), ErrorStatus::PermissionDenied,
           "the simulator daemon serves only its own user (uid " + std::to_string(::getuid()) + ")");
    log->warn("refused a client of uid {}", cred.uid);
    return;
  }
  // One thread per connection, so a bound on connections: a client that
  // opens them without end must not exhaust the daemon's threads; and
  // shares, so that no process or user takes them all.
  const std::size_t most = boards_.size() * options_.vfs + kSpareConnections;
  const Quotas& q = options_.quotas;
  std::unique_lock lock(mu_);
  std::string refusal;
  Usage& user = users_[cred.uid];
  Usage& process = processes_[cred.pid];
  if (clients_.size() >= most)
    refusal = "the simulator daemon has " + std::to_string(most) + " connections open, its most";
  else if (take_request(cred.pid).count())
    refusal = over_quota("requests-per-second", "max-requests-per-second", q.requests_per_second,
                         "process " + std::to_string(cred.pid), "has made that many requests and connections");
  else if (q.connections_per_process && process.connections >= q.connections_per_process)
    refusal = over_quota("connections-per-process", "max-connections-per-process", q.connections_per_process,
                         "process " + std::to_string(cred.pid), "has " + std::to_string(process.connections) + " open");
  else if (q.connections_per_user && user.connections - user.evicted >= q.connections_per_user) {
    // The user's oldest connection without a VF makes way: an idle one
    // counts against its owner, but cannot keep the owner's others out.
    if (Client* idle = idle_connection_of(cred.uid)) {
      idle->evicted.store(true);
      ++user.evicted;
      ::shutdown(idle->sock.get(), SHUT_RD);  // wakes its thread, which says why and closes it
      log->info("closing an idle connection of pid {} to admit one of pid {}", idle->pid, cred.pid);
    } else {
      refusal = over_quota("connections-per-user", "max-connections-per-user", q.connections_per_user,
                           "uid " + std::to_string(cred.uid), "has " + std::to_string(user.connections) + " open");
    }
  }
  if (!refusal.empty()) {
    lock.unlock();
    refuse(std::move(sock), ErrorStatus::ResourceExhausted, refusal);
    log->warn("refused a connection from pid {}: {}", cred.pid, refusal);
    return;
  }
  auto client = std::make_unique<Client>();
  client->sock = std::move(sock);
  client->pid = cred.pid;
  client->name = process_name(cred.pid);
  client->uid = cred.uid;
  Client& c = *client;
  clients_.push_back(std::move(client));
  ++user.connections;
  ++process.connections;
  try {
    c.thread = start_thread([this, &c] {
      serve(c);
      c.finished.store(true);
    });
  } catch (const std::system_error& e) {
    // No thread to serve it: the connection is refused, the daemon goes on.
    auto gone = std::move(clients_.back());
    clients_.pop_back();
    --users_[gone->uid].connections;
    --processes_[gone->pid].connections;
    lock.unlock();
    refuse(std::move(gone->sock), ErrorStatus::ResourceExhausted,
           std::string("the simulator daemon cannot start a thread for the connection: ") + e.what());
    log->warn("refused a connection from pid {}: {}", cred.pid, e.what());
  }
}

Server::Client* Server::idle_connection_of(std::uint32_t uid) {
  Client* oldest = nullptr;
  for (auto& c : clients_)
    if (c->uid == uid && !c->holds_vf && !c->board && !c->evicted.load() && !c->finished.load() &&
        (!oldest || c->connected_ns < oldest->connected_ns))
      oldest = c.get();
  return oldest;
}

std::string Server::rehome(Client& client, std::int32_t pid, std::uint32_t uid) {
  if (uid != ::getuid() && !(options_.mode & 0066))
    return "this connection was handed to uid " + std::to_string(uid) +
           "; the simulator daemon serves only its own user (uid " + std::to_string(::getuid()) + ")";
  const Quotas& q = options_.quotas;
  std::lock_guard lock(mu_);
  Usage& from_process = processes_[client.pid];
  Usage& from_user = users_[client.uid];
  Usage& to_process = processes_[pid];
  Usage& to_user = users_[uid];
  const bool same_user = uid == client.uid;
  const std::uint32_t vfs = client.holds_vf ? 1 : 0;
  const std::uint64_t mappings = client.dma.size(), bytes = client.dma_bytes;
  const std::string process = "process " + std::to_string(pid), user = "uid " + std::to_string(uid);
  std::string refusal;
  if (q.connections_per_process && to_process.connections >= q.connections_per_process)
    refusal = over_quota("connections-per-process", "max-connections-per-process", q.connections_per_process, process,
                         "has " + std::to_string(to_process.connections) + " open");
  else if (vfs && q.vfs_per_process && to_process.vfs >= q.vfs_per_process)
    refusal = over_quota("vfs-per-process", "max-vfs-per-process", q.vfs_per_process, process,
                         "holds " + std::to_string(to_process.vfs));
  else if (!same_user && q.connections_per_user && to_user.connections >= q.connections_per_user)
    refusal = over_quota("connections-per-user", "max-connections-per-user", q.connections_per_user, user,
                         "has " + std::to_string(to_user.connections) + " open");
  else if (!same_user && vfs && q.vfs_per_user && to_user.vfs >= q.vfs_per_user)
    refusal =
        over_quota("vfs-per-user", "max-vfs-per-user", q.vfs_per_user, user, "holds " + std::to_string(to_user.vfs));
  else if (!same_user && q.mappings_per_user && to_user.mappings + mappings > q.mappings_per_user)
    refusal = over_quota("mappings-per-user", "max-mappings-per-user", q.mappings_per_user, user,
                         "holds " + std::to_string(to_user.mappings));
  else if (!same_user && to_user.mapped_bytes + bytes > q.mapped_bytes_per_user)
    refusal = over_bytes_quota("mapped-bytes-per-user", "max-mapped-bytes-per-user", q.mapped_bytes_per_user, user,
                               to_user.mapped_bytes, bytes);
  if (!refusal.empty()) {
    if (to_process.connections == 0 && to_process.vfs == 0) processes_.erase(pid);
    if (to_user.connections == 0 && to_user.vfs == 0) users_.erase(uid);
    return "the process that sent on this connection may not hold it: " + refusal;
  }
  --from_process.connections, ++to_process.connections;
  from_process.vfs -= vfs, to_process.vfs += vfs;
  if (!same_user) {
    --from_user.connections, ++to_user.connections;
    from_user.vfs -= vfs, to_user.vfs += vfs;
    from_user.mappings -= mappings, to_user.mappings += mappings;
    from_user.mapped_bytes -= bytes, to_user.mapped_bytes += bytes;
    if (client.evicted.load()) --from_user.evicted, ++to_user.evicted;
  }
  if (from_process.connections == 0 && from_process.vfs == 0) processes_.erase(client.pid);
  if (from_user.connections == 0 && from_user.vfs == 0) users_.erase(client.uid);
  client.pid = pid;
  client.uid = uid;
  client.name = process_name(pid);
  return {};
}

void Server::serve_socket(base::UniqueFd sock) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return;
  Client* c = nullptr;
  {
    std::lock_guard lock(mu_);
    auto client = std::make_unique<Client>();
    client->sock = std::move(sock);
    client->pid = cred.pid;
    client->name = process_name(cred.pid);
    client->uid = cred.uid;
    c = client.get();
    clients_.push_back(std::move(client));
    ++users_[cred.uid].connections;
    ++processes_[cred.pid].connections;
  }
  serve(*c);
  c->finished.store(true);
  reap_finished();
}

void Server::serve(Client& client) {
  auto log = base::logger("simd");
  // Each message then says which process sent it (Message::sender_pid).
  const int on = 1;
  ::setsockopt(client.sock.get(), SOL_SOCKET, SO_PASSCRED, &on, sizeof on);
  pollfd p[2] = {{client.sock.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
  const std::uint32_t idle = options_.quotas.idle_seconds;
  for (;;) {
    // A connection that holds no VF may stay silent only so long.
    const int timeout = client.board || idle == 0 ? -1 : static_cast<int>(idle) * 1000;
    const int n = ::poll(p, 2, timeout);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || p[1].revents) break;
    if (client.evicted.load()) {
      // Said without waiting: a client that reads nothing holds no thread.
      ::fcntl(client.sock.get(), F_SETFL, ::fcntl(client.sock.get(), F_GETFL) | O_NONBLOCK);
      send_error(client.sock.get(), ErrorStatus::ResourceExhausted,
                 "closed: uid " + std::to_string(client.uid) +
                     " reached its connection quota (tpuhal-simd --max-connections-per-user) and this connection, "
                     "its oldest without a VF, made way for a new one");
      break;
    }
    if (n == 0) {
      send_error(client.sock.get(), ErrorStatus::ResourceExhausted,
                 "closed: " + std::to_string(idle) + " s without a request or a VF (tpuhal-simd --idle-seconds)");
      log->info("closed an idle connection of pid {}", client.pid);
      break;
    }
    Message m;
    std::string why;
    const int err = receive_message(client.sock.get(), m, -1ms, &why);
    if (err == EPROTO) {
      protocol_errors_.fetch_add(1);
      log->warn("client pid {}: {}", client.pid, why);
      if (is_other_version(m))
        send_error(client.sock.get(), ErrorStatus::VersionMismatch, version_mismatch(m.header.version, true));
      else
        send_error(client.sock.get(), ErrorStatus::InvalidArgument, "the simulator daemon cannot read " + why);
      continue;
    }
    if (err) break;  // hung up, or died
    // A connection handed to another process (SCM_RIGHTS, or inherited) is
    // charged to whoever sends on it: quotas follow the holder.
    if (m.sender_pid > 0 && (m.sender_pid != client.pid || m.sender_uid != client.uid)) {
      const std::int32_t was = client.pid;
      if (const std::string refusal = rehome(client, m.sender_pid, m.sender_uid); !refusal.empty()) {
        send_error(client.sock.get(), ErrorStatus::ResourceExhausted, "closed: " + refusal);
        log->warn("closed a connection of pid {} that pid {} sent on: {}", was, m.sender_pid, refusal);
        break;
      }
      log->info("a connection of pid {} is now charged to pid {}", was, m.sender_pid);
    }
    if (!throttle(client)) break;
    try {
      handle(client, m);
    } catch (const std::exception& e) {
      // Out of memory, say: this request fails, nothing else.
      log->warn("client pid {}: {} failed: {}", client.pid, to_string(m.header.type), e.what());
      send_error(client.sock.get(), ErrorStatus::OutOfMemory,
                 to_string(m.header.type) + ": the simulator daemon could not serve it: " + e.what());
    }
  }
  detach(client);
}

void Server::handle(Client& client, Message& m) {
  const int sock = client.sock.get();
  switch (m.header.type) {
    case MsgType::kList: return reply_boards(client);
    case MsgType::kStats: return reply_stats(client, m);
    case MsgType::kTelemetry: return reply_telemetry(client, m);
    case MsgType::kAttach: return attach(client, m);
    case MsgType::kMapDma: return map_dma(client, m);
    case MsgType::kUnmapDma: return unmap_dma(client, m);
    case MsgType::kDetach:
      // The VF is free for the next attach when the reply goes: a process
      // that closes a device and opens one again finds its VF back.
      detach(client);
      send_message(sock, MsgType::kOk, {});
      return;
    default:
      protocol_errors_.fetch_add(1);
      send_error(sock, ErrorStatus::InvalidArgument,
                 "the simulator daemon does not take " + to_string(m.header.type) + " from a client");
  }
}

// Replies are built under mu_ and sent after it: a client that does not
// read its replies blocks only its own connection's thread.
void Server::reply_boards(Client& client) {
  BoardsReply r;
  std::unique_lock lock(mu_);
  r.count = static_cast<std::uint32_t>(boards_.size());
  for (std::size_t i = 0; i < boards_.size(); ++i) {
    const BoardSlot& b = *boards_[i];
    BoardInfo& info = r.boards[i];
    set_field(info.profile, b.profile.name);
    set_field(info.model, b.profile.model);
    set_field(info.bus, b.profile.bus);
    set_field(info.tensor_isa, b.tensor_isa);
    info.board_dram_bytes = b.profile.dram_bytes;
    info.vf_dram_bytes = b.vf.dram_bytes;
    info.vfs_total = static_cast<std::uint32_t>(b.used.size());
    for (bool u : b.used) info.vfs_in_use += u;
  }
  lock.unlock();
  send_struct(client.sock.get(), MsgType::kBoards, r);
}

// Other users' processes are shown to the daemon's owner only. A request
// names the first entry it wants; the reply holds as many as fit.
void Server::reply_stats(Client& client, const Message& m) {
  StatsReply r;
  const StatsRequest* req = m.as<StatsRequest>();
  if (!m.body.empty() && !req) {
    protocol_errors_.fetch_add(1);
    send_error(client.sock.get(), ErrorStatus::InvalidArgument,
               "stats: a body of " + std::to_string(m.body.size()) + " bytes, 0 or " +
                   std::to_string(sizeof(StatsRequest)) + " expected");
    return;
  }
  r.first = req ? req->first : 0;
  const bool owner = client.uid == ::getuid();
  std::unique_lock lock(mu_);
  r.boards = static_cast<std::uint32_t>(boards_.size());
  r.protocol_errors = protocol_errors_.load();
  for (const auto& b : boards_)
    for (bool u : b->used) r.vfs_in_use += u;
  for (auto& c : clients_) {
    if (!c->holds_vf || (!owner && c->uid != client.uid)) continue;
    const std::uint32_t at = r.total++;
    if (at < r.first || r.vfs >= kMaxVfStats) continue;
    VfStats& s = r.vf[r.vfs++];
    s.board = c->board_index;
    s.vf = c->vf;
    s.pid = c->pid;
    s.uid = c->uid;
    set_field(s.name, c->name);
    if (!c->board) continue;
    fill_vf_stats(*c->board, s);
  }
  lock.unlock();
  send_struct(client.sock.get(), MsgType::kStatsReply, r);
}

// The whole board's block: every VF's counters, those of VFs given back
// included, and the board's power model fed by their engines; mu_ held.
std::vector<std::byte> Server::whole_board_telemetry(BoardSlot& slot, std::uint32_t board) {
  TelemetryBlock sum = slot.retired;
  for (auto& c : clients_)
    if (c->board && c->board_index == board) add_counters(sum, parse_block(c->board->telemetry()));
  const std::uint64_t now = base::monotonic_ns();
  fw::TelemetryHeader& h = sum.header;
  h.magic = fw::kTelemetryMagic;
  h.version = fw::kTelemetryVersion;
  h.header_bytes = sizeof h;
  h.queue_bytes = sizeof(fw::TelemetryQueue);
  h.channel_bytes = sizeof(fw::TelemetryChannel);
  h.uptime_ns = h.board_time_ns = now - slot.started_ns;
  if (!slot.power) slot.power.emplace(slot.profile, slot.started_ns);
  slot.power->advance(now, h.engine_busy_ns);
  h.temperature_mc = static_cast<std::int32_t>(std::lround(slot.power->temperature_c() * 1000));
  h.power_mw = static_cast<std::uint32_t>(std::lround(slot.power->power_w() * 1000));
  h.energy_uj = static_cast<std::uint64_t>(slot.power->energy_j() * 1e6);
  h.clock_mhz = slot.profile.clock_mhz;
  h.power_limit_mw = static_cast<std::uint32_t>(std::lround(slot.profile.peak_power_w * 1000));
  return serialise(std::move(sum));
}

// One VF's block, or the whole board's (TelemetryRequest).
void Server::reply_telemetry(Client& client, const Message& m) {
  const int sock = client.sock.get();
  const auto* req = m.as<TelemetryRequest>();
  if (!req) {
    protocol_errors_.fetch_add(1);
    send_error(sock, ErrorStatus::InvalidArgument,
               "telemetry: a body of " + std::to_string(m.body.size()) + " bytes, " +
                   std::to_string(sizeof(TelemetryRequest)) + " expected");
    return;
  }
  // Built under mu_, sent after it, errors included.
  std::vector<std::byte> block;
  std::optional<ErrorStatus> status;
  std::string refusal;
  {
    std::lock_guard lock(mu_);
    const Client* vf = nullptr;
    if (req->board < boards_.size() && req->vf != kWholeBoard)
      for (auto& c : clients_)
        if (c->board && c->board_index == req->board && c->vf == req->vf) vf = c.get();
    if (req->board >= boards_.size()) {
      status = ErrorStatus::NotFound;
      refusal = "telemetry: board " + std::to_string(req->board) + " is not served (the daemon serves " +
                std::to_string(boards_.size()) + ")";
    } else if (req->vf == kWholeBoard) {
      block = whole_board_telemetry(*boards_[req->board], req->board);
    } else if (!vf) {
      status = ErrorStatus::NotFound;
      refusal =
          "telemetry: VF " + std::to_string(req->vf) + " of board " + std::to_string(req->board) + " is not in use";
    } else if (client.uid != ::getuid() && vf->uid != client.uid) {
      status = ErrorStatus::PermissionDenied;
      refusal = "telemetry: VF " + std::to_string(req->vf) + " of board " + std::to_string(req->board) +
                " belongs to another user";
    } else {
      block = serialise(parse_block(vf->board->telemetry()));
    }
  }
  if (status) {
    send_error(sock, *status, refusal);
    return;
  }
  send_message(sock, MsgType::kTelemetryReply, block);
}

void Server::attach(Client& client, const Message& m) {
  const int sock = client.sock.get();
  const auto* req = m.as<AttachRequest>();
  if (!req) {
    protocol_errors_.fetch_add(1);
    send_error(sock, ErrorStatus::InvalidArgument,
               "attach: a body of " + std::to_string(m.body.size()) + " bytes, " +
                   std::to_string(sizeof(AttachRequest)) + " expected");
    return;
  }
  if (client.board) {
    send_error(sock, ErrorStatus::FailedPrecondition,
               "attach: this connection already holds VF " + std::to_string(client.vf) + " of board " +
                   std::to_string(client.board_index));
    return;
  }
  if (req->board >= boards_.size()) {
    send_error(sock, ErrorStatus::NotFound,
               "no board " + std::to_string(req->board) + ": this daemon serves " + std::to_string(boards_.size()) +
                   " (#0.." + std::to_string(boards_.size() - 1) + ")");
    return;
  }
  BoardSlot& slot = *boards_[req->board];
  std::uint32_t vf = 0;
  {
    const Quotas& quota = options_.quotas;
    std::unique_lock lock(mu_);
    Usage& user = users_[client.uid];
    Usage& process = processes_[client.pid];
    std::string refusal;
    if (quota.vfs_per_process && process.vfs >= quota.vfs_per_process)
      refusal = over_quota("vfs-per-process", "max-vfs-per-process", quota.vfs_per_process,
                           "process " + std::to_string(client.pid), "holds " + std::to_string(process.vfs));
    else if (quota.vfs_per_user && user.vfs >= quota.vfs_per_user)
      refusal = over_quota("vfs-per-user", "max-vfs-per-user", quota.vfs_per_user, "uid " + std::to_string(client.uid),
                           "holds " + std::to_string(user.vfs));
    if (!refusal.empty()) {
      lock.unlock();
      send_error(sock, ErrorStatus::ResourceExhausted, "attach: " + refusal);
      return;
    }
    while (vf < slot.used.size() && slot.used[vf]) ++vf;
    if (vf == slot.used.size()) {
      lock.unlock();
      send_error(sock, ErrorStatus::ResourceExhausted,
                 "board " + std::to_string(req->board) + " (" + slot.profile.name + "): all " +
                     std::to_string(slot.used.size()) + " VFs are in use, its " +
                     base::format_bytes(slot.profile.dram_bytes) + " of DRAM granted " +
                     base::format_bytes(slot.vf.dram_bytes) + " each (tpuhal-simd --vfs sets how many)");
      return;
    }
    slot.used[vf] = true;
    client.holds_vf = true;
    client.board_index = req->board;
    client.vf = vf;
    ++user.vfs;
    ++process.vfs;
  }
  // Gives the VF back however the attach fails past this point (an
  // exception included) until the client holds it.
  struct ReleaseVf {
    Server& s;
    BoardSlot& slot;
    Client& client;
    std::uint32_t vf;
    bool armed = true;
    ~ReleaseVf() {
      if (!armed) return;
      std::lock_guard lock(s.mu_);
      slot.used[vf] = false;
      client.holds_vf = false;
      --s.users_[client.uid].vfs;
      --s.processes_[client.pid].vfs;
    }
  } release_vf{*this, slot, client, vf};
  std::unique_ptr<sim::Board> board;
  base::Mapping channel;
  try {
    channel = base::Mapping::memfd("tpuhal-simd-channel", sizeof(Channel));
    auto* shared = new (channel.data()) Channel();
    sim::BoardOptions options{.shared_dram = true, .doorbells = {}};
    const std::uint32_t queues = slot.vf.total_queues();
    if (queues > kShadowDoorbells)
      throw std::runtime_error(std::to_string(queues) + " queues, more than the channel's " +
                               std::to_string(kShadowDoorbells) + " shadow doorbells");
    for (std::uint32_t q = 0; q < queues; ++q)
      options.doorbells.push_back({&shared->doorbell[q].tail, &shared->doorbell[q].sleeping});
    board = std::make_unique<sim::Board>(slot.vf, std::move(options));
    if (trace_) board->set_command_observer(trace_->observe(client.pid, req->board, vf, slot.vf));
  } catch (const std::exception& e) {
    send_error(sock, ErrorStatus::OutOfMemory,
               "cannot create VF " + std::to_string(vf) + " of board " + std::to_string(req->board) + ": " + e.what());
    return;
  }
  AttachedReply r;
  {
    std::lock_guard lock(mu_);
    set_field(r.board.profile, slot.profile.name);
    set_field(r.board.model, slot.profile.model);
    set_field(r.board.bus, slot.profile.bus);
    set_field(r.board.tensor_isa, slot.tensor_isa);
    r.board.board_dram_bytes = slot.profile.dram_bytes;
    r.board.vf_dram_bytes = slot.vf.dram_bytes;
    r.board.vfs_total = static_cast<std::uint32_t>(slot.used.size());
    for (bool u : slot.used) r.board.vfs_in_use += u;
  }
  r.vf = vf;
  r.vectors = board->interrupt_vectors();
  r.dram_bytes = slot.vf.dram_bytes;
  r.aperture_bytes = slot.vf.aperture_bytes;
  r.channel_bytes = channel.size();
  std::vector<int> fds = {board->dram_fd(), channel.fd()};
  for (std::uint32_t v = 0; v < r.vectors; ++v) fds.push_back(board->interrupt_fd(v));

  // The VF's register thread, before anything is handed over: when no
  // thread can be started, the attach fails and the daemon goes on.
  auto* ch = reinterpret_cast<Channel*>(channel.data());
  sim::Board& b = *board;
  client.drain_stop.store(false);
  const std::uint64_t spin_ns = std::uint64_t{options_.spin_us} * 1000;
  // Polling after a doorbell pays where the client, this thread and the
  // command processor each have a core.
  const bool sleep_after_write = std::thread::hardware_concurrency() < 4;
  try {
    client.drain = start_thread([ch, &b, &client, spin_ns, sleep_after_write] {
      drain(*ch, b, client.drain_stop, spin_ns, sleep_after_write);
    });
  } catch (const std::system_error& e) {
    board.reset();
    send_error(sock, ErrorStatus::ResourceExhausted,
               "cannot start the register thread of VF " + std::to_string(vf) + " of board " +
                   std::to_string(req->board) + ": " + e.what());
    base::logger("simd")->warn("client pid {}: attach failed: {}", client.pid, e.what());
    return;
  }
  {
    std::lock_guard lock(mu_);
    client.board = std::move(board);
    client.channel = std::move(channel);
  }
  release_vf.armed = false;                                        // the client holds it: detach() gives it back
  if (send_struct(sock, MsgType::kAttached, r, fds) != 0) return;  // gone: serve() ends and detaches
  base::logger("simd")->info("client pid {} attached to VF {} of board {} ({})", client.pid, vf, req->board,
                             slot.profile.name);
}

void Server::map_dma(Client& client, Message& m) {
  const int sock = client.sock.get();
  auto bad = [&](ErrorStatus status, const std::string& msg) {
    protocol_errors_.fetch_add(status == ErrorStatus::InvalidArgument);
    send_error(sock, status, "map-dma: " + msg);
  };
  const auto* req = m.as<MapDmaRequest>();
  if (!req) return bad(ErrorStatus::InvalidArgument, "a body of " + std::to_string(m.body.size()) + " bytes");
  if (!client.board) return bad(ErrorStatus::FailedPrecondition, "the connection is not attached to a board");
  if (m.fds.size() != 1)
    return bad(ErrorStatus::InvalidArgument, std::to_string(m.fds.size()) + " descriptors sent, one memfd expected");
  const int fd = m.fds[0].get();
  // The seal first, then the size: a size read before the seal could be
  // shrunk (by the client, racing) before the seal went on, and the board
  // would fault past the end of the file.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) return bad(ErrorStatus::InvalidArgument, "the descriptor is not a memfd");
  if (!(seals & F_SEAL_SHRINK))
    return bad(ErrorStatus::InvalidArgument,
               "the memory's size is not sealed (F_SEAL_SHRINK); the board could fault on it");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return bad(ErrorStatus::InvalidArgument, "the descriptor is not a memfd");
  const auto page = base::page_size();
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  if (req->size == 0 || req->size % page || req->offset % page || req->size > file_size ||
      req->offset > file_size - req->size)
    return bad(ErrorStatus::InvalidArgument, "range offset " + hex(req->offset) + " size " + hex(req->size) +
                                                 " is not page-aligned inside the " + hex(file_size) + "-byte memfd");
  if (req->access == 0 || (req->access & ~std::uint32_t{kRead | kWrite}))
    return bad(ErrorStatus::InvalidArgument, "access bits " + hex(req->access) + " (read 1, write 2)");
  // Every mapping is an mmap in this process: the quotas keep one client's
  // (sparse memfds cost nothing to make) from filling its address space or
  // its map count, which every client needs.
  {
    const Quotas& q = options_.quotas;
    std::unique_lock lock(mu_);
    const Usage& user = users_[client.uid];
    const std::string me = "this client", uid = "uid " + std::to_string(client.uid);
    std::string refusal;
    if (q.mappings_per_client && client.dma.size() >= q.mappings_per_client)
      refusal = over_quota("mappings-per-client", "max-mappings-per-client", q.mappings_per_client, me,
                           "holds " + std::to_string(client.dma.size()));
    else if (q.mappings_per_user && user.mappings >= q.mappings_per_user)
      refusal = over_quota("mappings-per-user", "max-mappings-per-user", q.mappings_per_user, uid,
                           "holds " + std::to_string(user.mappings));
    else if (mappings_ >= max_mappings_)
      refusal = "refused: the daemon holds " + std::to_string(mappings_) + " mappings for its clients, its most (" +
                "vm.max_map_count less what it keeps for itself)";
    else if (req->size > q.mapped_bytes_per_client || client.dma_bytes > q.mapped_bytes_per_client - req->size)
      refusal = over_bytes_quota("mapped-bytes-per-client", "max-mapped-bytes-per-client", q.mapped_bytes_per_client,
                                 me, client.dma_bytes, req->size);
    else if (req->size > q.mapped_bytes_per_user || user.mapped_bytes > q.mapped_bytes_per_user - req->size)
      refusal = over_bytes_quota("mapped-bytes-per-user", "max-mapped-bytes-per-user", q.mapped_bytes_per_user, uid,
                                 user.mapped_bytes, req->size);
    if (!refusal.empty()) {
      lock.unlock();
      return bad(ErrorStatus::ResourceExhausted, refusal);
    }
  }
  void* host = ::mmap(nullptr, req->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(req->offset));
  if (host == MAP_FAILED) return bad(ErrorStatus::OutOfMemory, "cannot map the memory: " + errno_text(errno));
  const std::uint32_t access =
      ((req->access & kRead) ? sim::kIommuRead : 0u) | ((req->access & kWrite) ? sim::kIommuWrite : 0u);
  if (auto why = client.board->iommu().map(req->iova, host, req->size, access); !why.empty()) {
    ::munmap(host, req->size);
    return bad(ErrorStatus::InvalidArgument, why);
  }
  try {
    std::lock_guard lock(mu_);
    client.dma[req->iova] = {host, req->size};
    client.dma_bytes += req->size;
    Usage& user = users_[client.uid];
    ++user.mappings;
    user.mapped_bytes += req->size;
    ++mappings_;
  } catch (...) {
    client.board->iommu().unmap(req->iova, req->size);
    ::munmap(host, req->size);
    throw;
  }
  send_message(sock, MsgType::kOk, {});
}

void Server::unmap_dma(Client& client, const Message& m) {
  const int sock = client.sock.get();
  const auto* req = m.as<UnmapDmaRequest>();
  if (!req) {
    protocol_errors_.fetch_add(1);
    send_error(sock, ErrorStatus::InvalidArgument, "unmap-dma: a body of " + std::to_string(m.body.size()) + " bytes");
    return;
  }
  auto it = client.dma.find(req->iova);
  if (!client.board || it == client.dma.end() || it->second.size != req->size) {
    send_error(sock, ErrorStatus::NotFound,
               "unmap-dma: no DMA mapping at IOVA " + hex(req->iova) + " of size " + hex(req->size));
    return;
  }
  // Returns once no DMA in flight can still touch it.
  client.board->iommu().unmap(req->iova, req->size);
  ::munmap(it->second.host, it->second.size);
  {
    std::lock_guard lock(mu_);
    client.dma_bytes -= it->second.size;
    Usage& user = users_[client.uid];
    --user.mappings;
    user.mapped_bytes -= it->second.size;
    --mappings_;
    client.dma.erase(it);
  }
  send_message(sock, MsgType::kOk, {});
}

void Server::detach(Client& client) noexcept {
  if (!client.board) return;
  client.drain_stop.store(true);
  shared_futex_wake(reinterpret_cast<Channel*>(client.channel.data())->tail);
  client.drain.join();
  std::unique_ptr<sim::Board> board;
  base::Mapping channel;
  {
    std::lock_guard lock(mu_);
    // The whole board's counters keep what this VF counted (work still
    // running when its process died and retiring after this is not).
    try {
      add_counters(boards_[client.board_index]->retired, parse_block(client.board->telemetry()));
    } catch (const std::bad_alloc&) {
      base::logger("simd")->warn("VF {} of board {}: its telemetry is lost (out of memory)", client.vf,
                                 client.board_index);
    }
    board = std::move(client.board);
    channel = std::move(client.channel);
  }
  board.reset();  // stops its command processors: nothing reaches host memory now
  for (auto& [iova, d] : client.dma) ::munmap(d.host, d.size);
  std::lock_guard lock(mu_);
  Usage& user = users_[client.uid];
  user.mappings -= client.dma.size();
  user.mapped_bytes -= client.dma_bytes;
  mappings_ -= client.dma.size();
  client.dma.clear();
  client.dma_bytes = 0;
  --user.vfs;
  --processes_[client.pid].vfs;
  boards_[client.board_index]->used[client.vf] = false;
  client.holds_vf = false;
  base::logger("simd")->info("client pid {} left VF {} of board {}", client.pid, client.vf, client.board_index);
}

}  // namespace tpuhal::simd
