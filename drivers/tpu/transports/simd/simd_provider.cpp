// The simd: transport: a Transport onto a virtual function of a board served
// by the simulator daemon (docs/simd.md). Registers go through the shared
// register channel, DRAM is the daemon's memfd mapped here, interrupts are
// the board's eventfds, host memory for DMA is memfds the daemon maps into
// the VF's IOMMU domain.
#include "tpuhal/tpu/simd_provider.h"
#include "tpuhal/tpu/telemetry.h"

#include <poll.h>
#include <pwd.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "tpuhal/base/env.h"
#include "tpuhal/base/log.h"
#include "tpuhal/base/mapping.h"
#include "tpuhal/base/units.h"
#include "tpuhal/base/wait.h"
#include "tpuhal/fw/regs.h"
#include "tpuhal/fw/telemetry.h"
#include "tpuhal/tpu/device.h"

namespace tpuhal::tpu {
namespace {

using namespace std::chrono_literals;

// How long a register read or a control request may take before the daemon
// is declared gone. A board reset (stopping every queue) is the slowest
// thing the daemon does in answer; this bounds it generously.
constexpr auto kReplyTimeout = 10s;
// Spinning before sleeping, for register reads: a read's answer usually
// comes within a few microseconds.
constexpr std::uint64_t kReadSpinNs = 20'000;

std::string errno_text(int err) { return std::strerror(err); }

std::string uid_name(std::uint32_t uid) {
  std::string s = "uid " + std::to_string(uid);
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found) s += std::string(" (") + pw.pw_name + ")";
  return s;
}

// TPUHAL_SIMD_UID: the uid (or user name) the daemon must run as; none if
// unset.
std::optional<std::uint32_t> expected_daemon_uid(const std::string& who) {
  const char* v = std::getenv("TPUHAL_SIMD_UID");
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  const unsigned long n = std::strtoul(v, &end, 10);
  if (*end == '\0' && n <= 0xFFFFFFFFul) return static_cast<std::uint32_t>(n);
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (::getpwnam_r(v, &pw, buf.data(), buf.size(), &found) == 0 && found) return pw.pw_uid;
  throw Error(Status::InvalidArgument, who + ": TPUHAL_SIMD_UID=" + v + " is neither a uid nor a user of this host");
}

// Refuses a daemon this process has no reason to trust with its memory: a
// process that binds a socket where this one looks for the daemon (a
// shared directory, say) could relay to a daemon of its own and read what
// this process maps for DMA. Trusted: the uid TPUHAL_SIMD_UID names, if
// set; else root, this process's own user, or the owner of the socket file
// where that owner alone could have put it there (its directory writable
// by no one else: a service's runtime directory, not /tmp).
void check_daemon(int sock, const std::string& path, const std::string& who) {
  ucred peer{};
  socklen_t len = sizeof peer;
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0)
    throw Error(Status::PermissionDenied, who + ": cannot tell which user serves " + path + ": " + errno_text(errno));
  const std::uint32_t me = ::geteuid();
  if (const auto want = expected_daemon_uid(who)) {
    if (peer.uid == *want) return;
    throw Error(Status::PermissionDenied, who + ": " + path + " is served by " + uid_name(peer.uid) +
                                              ", and TPUHAL_SIMD_UID asks for " + uid_name(*want) +
                                              "; refusing it (this process is " + uid_name(me) + ")");
  }
  if (peer.uid == 0 || peer.uid == me) return;
  struct stat s {
  }, d{};
  const std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/') + 1);
  const bool owner_placed = ::stat(path.c_str(), &s) == 0 && s.st_uid == peer.uid && ::stat(dir.c_str(), &d) == 0 &&
                            (d.st_uid == 0 || d.st_uid == peer.uid) && !(d.st_mode & (S_IWGRP | S_IWOTH));
  if (owner_placed) return;
  throw Error(
      Status::PermissionDenied,
      who + ": " + path + " is served by " + uid_name(peer.uid) + ", which is neither this process's " + uid_name(me) +
          " nor root, in a directory others may write to; refusing it, since it would see "
          "this process's memory (set TPUHAL_SIMD_UID=" +
          std::to_string(peer.uid) + " to trust it, or serve the socket from a directory only its user can write)");
}

base::UniqueFd connect_to(const std::string& path, const std::string& who) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path)
    throw Error(Status::InvalidArgument, who + ": socket path '" + path + "' is empty or longer than " +
                                             std::to_string(sizeof addr.sun_path - 1) + " bytes");
  std::memcpy(addr.sun_path, path.data(), path.size());
  base::UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd) throw Error(Status::Internal, who + ": socket(): " + errno_text(errno));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    throw Error(err == EACCES ? Status::PermissionDenied : Status::NotFound,
                who + ": no simulator daemon answers on " + path + " (" + errno_text(err) +
                    "); start one with `tpuhal-simd --socket " + path + "`");
  }
  check_daemon(fd.get(), path, who);
  return fd;
}

// One request, one reply. Throws Error for a reply of kError (with its
// status) or when the daemon does not answer.
simd::Message request(int sock, simd::MsgType type, std::span<const std::byte> body, std::span<const int> fds,
                      simd::MsgType expect, const std::string& who) {
  simd::Message reply;
  std::string why;
  int err = simd::send_message(sock, type, body, fds);
  if (err) {
    // A daemon that refused the connection (a quota, say) may have answered
    // and closed it before this request went out: its answer says why.
    if (simd::receive_message(sock, reply, std::chrono::milliseconds(0), &why) != 0 ||
        reply.header.type != simd::MsgType::kError)
      throw Error(Status::DeviceLost,
                  who + ": cannot send " + simd::to_string(type) + " to the simulator daemon: " + errno_text(err));
  } else {
    err =
        simd::receive_message(sock, reply, std::chrono::duration_cast<std::chrono::milliseconds>(kReplyTimeout), &why);
    // A connection closed with this request unread reports ECONNRESET once,
    // before the answer that may still be waiting.
    if (err == ECONNRESET && simd::receive_message(sock, reply, std::chrono::milliseconds(0), &why) == 0) err = 0;
  }
  if (err == ECONNRESET)
    throw Error(Status::DeviceLost, who + ": the simulator daemon closed the connection (it exited or was killed)");
  if (err == ETIMEDOUT)
    throw Error(Status::DeviceLost, who + ": the simulator daemon did not answer " + simd::to_string(type) +
                                        " within " + std::to_string(kReplyTimeout.count()) + " s");
  if (err == EPROTO && simd::is_other_version(reply)) {
    // An error reply keeps its layout in every version: the daemon's words
    // say what it could not read.
    const auto* e = reply.header.type == simd::MsgType::kError ? reply.as<simd::ErrorReply>() : nullptr;
    throw Error(Status::VersionMismatch, who + ": " + simd::version_mismatch(reply.header.version, false) +
                                             (e ? " (the daemon says: " + simd::get_field(e->message) + ")" : ""));
  }
  if (err == EPROTO) throw Error(Status::DeviceLost, who + ": the simulator daemon sent " + why);
  if (err) throw Error(Status::DeviceLost, who + ": receiving from the simulator daemon: " + errno_text(err));
  if (reply.header.type == simd::MsgType::kError) {
    const auto* e = reply.as<simd::ErrorReply>();
    if (!e) throw Error(Status::DeviceLost, who + ": the simulator daemon sent a truncated error");
    // Both sides expand the one list of statuses; one this build does not
    // know (a later daemon's) is reported as Internal.
    const auto status = simd::error_status(e->status);
    throw Error(status ? static_cast<Status>(*status) : Status::Internal, who + ": " + simd::get_field(e->message));
  }
  if (reply.header.type != expect)
    throw Error(Status::DeviceLost, who + ": the simulator daemon answered " + simd::to_string(type) + " with " +
                                        simd::to_string(reply.header.type));
  return reply;
}

template <class T>
const T& reply_body(const simd::Message& m, const std::string& who) {
  const T* p = m.as<T>();
  if (!p)
    throw Error(Status::DeviceLost, who + ": the simulator daemon's " + simd::to_string(m.header.type) + " reply is " +
                                        std::to_string(m.body.size()) + " bytes, " + std::to_string(sizeof(T)) +
                                        " expected");
  return *p;
}

class SimdTransport final : public Transport {
 public:
  SimdTransport(std::string uri, std::string path, std::uint32_t board)
      : log_(base::logger("tpu")), uri_(std::move(uri)), path_(std::move(path)), stop_(base::make_eventfd()) {
    sock_ = connect_to(path_, uri_);
    simd::AttachRequest req;
    req.board = board;
    simd::Message m =
        request(sock_.get(), simd::MsgType::kAttach, {reinterpret_cast<const std::byte*>(&req), sizeof req}, {},
                simd::MsgType::kAttached, uri_);
    const auto& a = reply_body<simd::AttachedReply>(m, uri_);
    if (m.fds.size() != 2 + std::size_t{a.vectors} || a.vectors == 0)
      throw Error(Status::DeviceLost, uri_ + ": the simulator daemon sent " + std::to_string(m.fds.size()) +
                                          " descriptors for " + std::to_string(a.vectors) + " vectors");
    if (a.aperture_bytes > a.dram_bytes || a.channel_bytes < sizeof(simd::Channel))
      throw Error(Status::DeviceLost, uri_ + ": the simulator daemon describes an inconsistent VF");
    info_ = a.board;
    vf_ = a.vf;
    if (a.aperture_bytes) {
      void* p = ::mmap(nullptr, a.aperture_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, m.fds[0].get(), 0);
      if (p == MAP_FAILED)
        throw Error(Status::OutOfMemory, uri_ + ": cannot map the " + base::format_bytes(a.aperture_bytes) +
                                             " aperture: " + errno_text(errno));
      aperture_ = {static_cast<std::byte*>(p), a.aperture_bytes};
    }
    void* c = ::mmap(nullptr, sizeof(simd::Channel), PROT_READ | PROT_WRITE, MAP_SHARED, m.fds[1].get(), 0);
    if (c == MAP_FAILED) {
      const int err = errno;
      unmap_aperture();
      throw Error(Status::OutOfMemory, uri_ + ": cannot map the register channel: " + errno_text(err));
    }
    channel_ = static_cast<simd::Channel*>(c);
    tail_ = channel_->tail.load(std::memory_order_relaxed);
    barrier_ = tail_;
    for (std::size_t i = 2; i < m.fds.size(); ++i) vectors_.push_back(std::move(m.fds[i]));
    watcher_ = std::thread([this] { watch(); });
  }

  ~SimdTransport() override {
    base::eventfd_signal(stop_.get());
    watcher_.join();
    ::munmap(channel_, sizeof(simd::Channel));
    unmap_aperture();
    // The VF goes back before this returns, so that the next open finds it
    // free (closing the socket alone would detach too, but later).
    if (!lost_.load(std::memory_order_acquire)) {
      try {
        request(sock_.get(), simd::MsgType::kDetach, {}, {}, simd::MsgType::kOk, uri_);
      } catch (const Error& e) {
        log_->debug("{}: detach: {}", uri_, e.what());
      }
    }
  }

  std::string tensor_isa() const override { return simd::get_field(info_.tensor_isa); }
  std::string bus() const override {
    return "simd " + simd::get_field(info_.bus) + " (" + simd::get_field(info_.profile) + ", VF " +
           std::to_string(vf_) + " of " + std::to_string(info_.vfs_total) + ", " +
           base::format_bytes(info_.vf_dram_bytes) + " of " + base::format_bytes(info_.board_dram_bytes) +
           " DRAM) via " + path_;
  }

  std::uint32_t read32(std::uint32_t offset) override {
    std::lock_guard lock(reg_mu_);
    if (lost_.load(std::memory_order_acquire)) return 0xFFFFFFFF;
    const std::uint32_t seq = ++read_seq_;
    if (!push({static_cast<std::uint32_t>(simd::RegOp::kRead), offset, 0, seq})) return 0xFFFFFFFF;
    auto& ch = *channel_;
    auto answered = [&] { return ch.response_seq.load(std::memory_order_acquire) == seq; };
    const std::uint64_t start = base::monotonic_ns();
    while (!answered()) {
      const std::uint64_t now = base::monotonic_ns();
      if (now - start < kReadSpinNs) {
        base::cpu_relax();
        continue;
      }
      if (lost_.load(std::memory_order_acquire)) return 0xFFFFFFFF;
      if (now - start > static_cast<std::uint64_t>(std::chrono::nanoseconds(kReplyTimeout).count())) {
        mark_lost("a register read (offset " + std::to_string(offset) + ") was not answered within " +
                  std::to_string(kReplyTimeout.count()) + " s");
        return 0xFFFFFFFF;
      }
      const std::uint32_t seen = ch.response_seq.load(std::memory_order_seq_cst);
      ch.client_waiting.store(1, std::memory_order_seq_cst);
      if (seen != seq && ch.response_seq.load(std::memory_order_seq_cst) == seen)
        simd::shared_futex_wait(ch.response_seq, seen, 1ms);
      ch.client_waiting.store(0, std::memory_order_relaxed);
    }
    return ch.response_value.load(std::memory_order_relaxed);
  }

  void write32(std::uint32_t offset, std::uint32_t value) override {
    std::lock_guard lock(reg_mu_);
    if (lost_.load(std::memory_order_acquire)) return;
    if (auto q = doorbell_queue(offset)) {
      // A queue's doorbell goes to its shadow doorbell, where the command
      // processor polls; the register write through the ring only wakes a
      // processor that sleeps (the board takes TAIL from the shadow). It
      // must not pass an earlier posted write (the queue's configuration,
      // an enable that zeroes TAIL): wait until the daemon has applied the
      // last one (rare: queues are set up once). The sequentially
      // consistent store orders every earlier store to the aperture before
      // it, as the Transport contract asks.
      if (!drained(barrier_)) return;
      auto& db = channel_->doorbell[*q];
      db.tail.store(value, std::memory_order_seq_cst);
      if (db.sleeping.load(std::memory_order_seq_cst))
        push({static_cast<std::uint32_t>(simd::RegOp::kWrite), offset, value, 0});
      return;
    }
    // The release store of the ring's tail orders every earlier store to
    // the aperture before the write, as the Transport contract asks.
    // Interrupt masking and acknowledgement do not change what a doorbell
    // does (a completion may always come before an unmask: the driver
    // re-checks its fence), so doorbells need not wait for them.
    if (push({static_cast<std::uint32_t>(simd::RegOp::kWrite), offset, value, 0}) && offset != fw::reg::kIntMask &&
        offset != fw::reg::kIntAck)
      barrier_ = tail_;
  }

  std::span<std::byte> aperture() override { return aperture_; }

  base::Mapping allocate_host(std::uint64_t bytes) override {
    // Shared with the daemon, which maps it for the board's DMA.
    return base::Mapping::memfd("tpuhal-simd-host", bytes, {.populate = true, .lock = true});
  }

  void map_dma_memory(std::uint64_t iova, const base::Mapping& memory, std::uint64_t offset, std::uint64_t size,
                      bool device_writes) override {
    if (memory.fd() < 0)
      throw Error(Status::Internal, uri_ + ": DMA mapping of memory not allocated by this transport");
    if (lost_.load(std::memory_order_acquire))
      throw Error(Status::DeviceLost, uri_ + ": the simulator daemon is gone (" + lost_reason() + ")");
    simd::MapDmaRequest req;
    req.iova = iova;
    req.offset = offset;
    req.size = size;
    req.access = simd::kRead | (device_writes ? simd::kWrite : 0u);
    const int fd = memory.fd();
    try {
      std::lock_guard lock(sock_mu_);
      request(sock_.get(), simd::MsgType::kMapDma, {reinterpret_cast<const std::byte*>(&req), sizeof req}, {&fd, 1},
              simd::MsgType::kOk, uri_);
    } catch (const Error& e) {
      if (e.status() == Status::DeviceLost) mark_lost(e.what());
      throw;
    }
  }

  void map_dma(std::uint64_t iova, void* host, std::uint64_t size, bool) override {
    (void)iova;
    (void)host;
    throw Error(Status::Unsupported,
                uri_ +
                    ": the board lives in the simulator daemon and can reach only host memory shared "
                    "with it; " +
                    base::format_bytes(size) + " of caller memory cannot be mapped");
  }
  bool can_map_any_memory() const override { return false; }

  void unmap_dma(std::uint64_t iova, std::uint64_t size) noexcept override {
    if (lost_.load(std::memory_order_acquire)) return;  // the board is gone: it reaches nothing
    simd::UnmapDmaRequest req{iova, size};
    try {
      std::lock_guard lock(sock_mu_);
      request(sock_.get(), simd::MsgType::kUnmapDma, {reinterpret_cast<const std::byte*>(&req), sizeof req}, {},
              simd::MsgType::kOk, uri_);
    } catch (const Error& e) {
      log_->error("{}: unmapping DMA {:#x}+{:#x}: {}", uri_, iova, size, e.what());
      if (e.status() == Status::DeviceLost) mark_lost(e.what());
    }
  }

  std::uint32_t interrupt_vectors() const override { return static_cast<std::uint32_t>(vectors_.size()); }
  int interrupt_fd(std::uint32_t vector) const override {
    return vector < vectors_.size() ? vectors_[vector].get() : -1;
  }

 private:
  // The queue whose TAIL register `offset` is, if it has a shadow doorbell.
  static std::optional<std::uint32_t> doorbell_queue(std::uint32_t offset) {
    if (offset < fw::reg::kQueueBase) return std::nullopt;
    const std::uint32_t q = (offset - fw::reg::kQueueBase) / fw::reg::kQueueStride;
    if (q >= fw::kMaxQueues || q >= simd::kShadowDoorbells || offset != fw::reg::queue_reg(q, fw::reg::queue::kTail))
      return std::nullopt;
    return q;
  }

  // Waits until the daemon has applied every request up to ring position
  // `position`; false if the daemon is gone. Caller holds reg_mu_.
  bool drained(std::uint32_t position) {
    auto& ch = *channel_;
    const std::uint64_t start = base::monotonic_ns();
    while (static_cast<std::int32_t>(ch.head.load(std::memory_order_acquire) - position) < 0) {
      if (lost_.load(std::memory_order_acquire)) return false;
      if (base::monotonic_ns() - start > static_cast<std::uint64_t>(std::chrono::nanoseconds(kReplyTimeout).count())) {
        mark_lost("the daemon applied no register write for " + std::to_string(kReplyTimeout.count()) + " s");
        return false;
      }
      kick();
      std::this_thread::yield();
    }
    return !lost_.load(std::memory_order_acquire);
  }

  // Appends a request to the channel; false if the daemon is gone. Caller
  // holds reg_mu_.
  bool push(const simd::RegRequest& r) {
    auto& ch = *channel_;
    const std::uint64_t start = base::monotonic_ns();
    while (tail_ - ch.head.load(std::memory_order_acquire) >= simd::kRingEntries) {
      if (lost_.load(std::memory_order_acquire)) return false;
      if (base::monotonic_ns() - start > static_cast<std::uint64_t>(std::chrono::nanoseconds(kReplyTimeout).count())) {
        mark_lost("the register channel stayed full for " + std::to_string(kReplyTimeout.count()) + " s");
        return false;
      }
      kick();
      std::this_thread::yield();
    }
    ch.ring[tail_ % simd::kRingEntries] = r;
    ++tail_;
    ch.tail.store(tail_, std::memory_order_seq_cst);
    kick();
    return true;
  }

  // Wakes the daemon's drain thread if it said it sleeps (its store of
  // daemon_sleeping and our store of tail are both seq_cst: one of the two
  // sides sees the other).
  void kick() {
    if (channel_->daemon_sleeping.load(std::memory_order_seq_cst)) simd::shared_futex_wake(channel_->tail);
  }

  // Watches the socket: when the daemon goes away the board is lost.
  void watch() {
    pollfd p[2] = {{sock_.get(), POLLRDHUP, 0}, {stop_.get(), POLLIN, 0}};
    for (;;) {
      const int n = ::poll(p, 2, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        mark_lost("poll on the daemon's socket failed: " + errno_text(errno));
        return;
      }
      if (p[1].revents) return;
      if (p[0].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
        mark_lost("the simulator daemon closed the connection (it exited or was killed)");
        return;
      }
    }
  }

  void mark_lost(const std::string& why) noexcept {
    {
      std::lock_guard lock(lost_mu_);
      if (lost_.load()) return;
      lost_reason_ = why;
      lost_.store(true, std::memory_order_release);
    }
    log_->error("{}: {}: the board is lost", uri_, why);
    // Waiters blocked on an interrupt wake up, read all ones and report
    // the device lost.
    for (auto& v : vectors_) base::eventfd_signal(v.get());
  }
  std::string lost_reason() const {
    std::lock_guard lock(lost_mu_);
    return lost_reason_;
  }

  void unmap_aperture() noexcept {
    if (!aperture_.empty()) ::munmap(aperture_.data(), aperture_.size());
    aperture_ = {};
  }

  std::shared_ptr<spdlog::logger> log_;
  std::string uri_, path_;
  base::UniqueFd stop_;  // ends the watcher
  simd::BoardInfo info_{};
  std::uint32_t vf_ = 0;
  base::UniqueFd sock_;
  std::mutex sock_mu_;  // one control request at a time
  std::span<std::byte> aperture_;
  simd::Channel* channel_ = nullptr;
  std::mutex reg_mu_;           // the channel has one producer
  std::uint32_t tail_ = 0;      // guarded by reg_mu_
  std::uint32_t read_seq_ = 0;  // guarded by reg_mu_
  std::uint32_t barrier_ = 0;   // ring position after the last posted write that is not a doorbell; reg_mu_
  std::vector<base::UniqueFd> vectors_;
  std::atomic<bool> lost_{false};
  mutable std::mutex lost_mu_;
  std::string lost_reason_;  // guarded by lost_mu_
  std::thread watcher_;
};

// TPUHAL_SIMD's daemons, and those of the simd: boards made visible by
// name (a container's, docs/operations.md), each once.
std::vector<std::string> configured_daemons() {
  std::vector<std::string> out = base::env_list("TPUHAL_SIMD");
  if (const auto visible = base::visible_devices())
    for (const std::string& uri : *visible) {
      if (uri.rfind("simd:", 0) != 0) continue;
      const std::string socket =
          uri.substr(5, uri.rfind('#') == std::string::npos ? std::string::npos : uri.rfind('#') - 5);
      if (!socket.empty() && std::find(out.begin(), out.end(), socket) == out.end()) out.push_back(socket);
    }
  return out;
}

class SimdProvider final : public driver::Provider {
 public:
  std::string_view scheme() const override { return "simd"; }
  std::string protocol() const override {
    return "simulator daemon protocol " + std::to_string(simd::kVersion) + ", " + interface_protocol();
  }

  std::vector<DeviceInfo> enumerate() override {
    std::vector<DeviceInfo> out;
    for (const auto& path : configured_daemons()) {
      try {
        const auto boards = simd_boards(path);
        for (std::size_t i = 0; i < boards.size(); ++i)
          out.push_back({"simd:" + path + "#" + std::to_string(i), "tpu-simd", simd::get_field(boards[i].model),
                         boards[i].vf_dram_bytes});
      } catch (const Error& e) {
        base::logger("tpu")->warn("TPUHAL_SIMD names {}: {}", path, e.what());
      }
    }
    return out;
  }

  std::shared_ptr<driver::DeviceBackend> open(std::string_view uri) override {
    const auto [socket, board] = parse_uri(uri);
    return open_device(std::make_unique<SimdTransport>(std::string(uri), socket, board), std::string(uri), "tpu-simd");
  }

  bool observable(std::string_view) const override { return true; }

  BoardView observe(std::string_view uri) override {
    const auto [socket, board] = parse_uri(uri);
    const auto boards = simd_boards(socket);
    if (board >= boards.size())
      throw Error(Status::NotFound, std::string(uri) + ": the daemon serves " + std::to_string(boards.size()) +
                                        " board(s), numbered from 0");
    BoardView v;
    v.uri = std::string(uri);
    v.board = simd::get_field(boards[board].model);
    v.driver = "tpu-simd";
    v.memory_bytes = boards[board].board_dram_bytes;
    v.telemetry = simd_telemetry(socket, board);
    for (const simd::VfStats& s : simd_stats(socket).vfs) {
      if (s.board != board) continue;
      ProcessUsage p;
      p.pid = s.pid;
      p.uid = s.uid;
      p.name = simd::get_field(s.name);
      p.vf = s.vf;
      p.queues = s.queues_enabled;
      p.memory_bytes = s.dram_resident_bytes;
      for (const auto& r : s.regions)
        if (r.name[0]) p.heaps.push_back({simd::get_field(r.name), r.resident_bytes});
      p.dma_mappings = s.dma_mappings;
      p.dma_mapped_bytes = s.dma_mapped_bytes;
      p.attached_ns = s.uptime_ns;
      for (const auto& e : v.telemetry.engines) {
        const auto fw_engine = e.engine == Engine::Copy    ? fw::EngineType::kCopy
                               : e.engine == Engine::Video ? fw::EngineType::kVideo
                                                           : fw::EngineType::kCompute;
        p.engines.push_back({e.engine, s.engine_busy_ns[static_cast<std::uint32_t>(fw_engine)]});
      }
      p.h2d_bytes = s.dma_bytes[static_cast<std::uint32_t>(fw::DmaDirection::kHostToDevice)];
      p.d2h_bytes = s.dma_bytes[static_cast<std::uint32_t>(fw::DmaDirection::kDeviceToHost)];
      p.d2d_bytes = s.dma_bytes[static_cast<std::uint32_t>(fw::DmaDirection::kDeviceToDevice)];
      p.h2h_bytes = s.dma_bytes[static_cast<std::uint32_t>(fw::DmaDirection::kHostToHost)];
      p.commands = s.commands;
      p.failures = s.failures;
      p.frames = s.frames;
      p.decode_errors = s.decode_errors;
      v.memory_used_bytes += p.memory_bytes;
      v.processes.push_back(std::move(p));
    }
    return v;
  }

 private:
  // simd:/path/to/socket#N
  static std::pair<std::string, std::uint32_t> parse_uri(std::string_view uri) {
    std::string_view rest = uri.substr(uri.find(':') + 1);
    std::uint32_t board = 0;
    if (const auto hash = rest.rfind('#'); hash != std::string_view::npos) {
      const std::string_view n = rest.substr(hash + 1);
      if (n.empty() || n.size() > 6 || n.find_first_not_of("0123456789") != std::string_view::npos)
        throw Error(Status::InvalidArgument, "device URI '" + std::string(uri) + "': board '" + std::string(n) +
                                                 "' after '#' is not a number (simd:/path/to/socket#N)");
      board = static_cast<std::uint32_t>(std::strtoul(std::string(n).c_str(), nullptr, 10));
      rest = rest.substr(0, hash);
    }
    if (rest.empty())
      throw Error(Status::InvalidArgument,
                  "device URI '" + std::string(uri) + "' names no socket; use simd:/path/to/socket#N");
    return {std::string(rest), board};
  }
};

}  // namespace

std::shared_ptr<driver::Provider> make_simd_provider() { return std::make_shared<SimdProvider>(); }

SimdStats simd_stats(const std::string& socket_path) {
  const std::string who = "simd:" + socket_path;
  auto sock = connect_to(socket_path, who);
  SimdStats out;
  // A page at a time; VFs that come and go between pages may be missed or
  // seen twice, as with any listing of processes.
  for (;;) {
    simd::StatsRequest req;
    req.first = static_cast<std::uint32_t>(out.vfs.size());
    simd::Message m = request(sock.get(), simd::MsgType::kStats, {reinterpret_cast<const std::byte*>(&req), sizeof req},
                              {}, simd::MsgType::kStatsReply, who);
    const auto& r = reply_body<simd::StatsReply>(m, who);
    if (r.vfs > simd::kMaxVfStats || r.first != req.first)
      throw Error(Status::DeviceLost, who + ": a malformed statistics reply");
    out.boards = r.boards;
    out.protocol_errors = r.protocol_errors;
    if (req.first == 0) out.vfs_in_use = r.vfs_in_use;
    out.vfs.insert(out.vfs.end(), r.vf, r.vf + r.vfs);
    if (r.vfs == 0 || out.vfs.size() >= r.total) break;
  }
  return out;
}

Telemetry simd_telemetry(const std::string& socket_path, std::uint32_t board, std::uint32_t vf) {
  const std::string who = "simd:" + socket_path + "#" + std::to_string(board);
  auto sock = connect_to(socket_path, who);
  const simd::TelemetryRequest req{board, vf};
  simd::Message m =
      request(sock.get(), simd::MsgType::kTelemetry, {reinterpret_cast<const std::byte*>(&req), sizeof req}, {},
              simd::MsgType::kTelemetryReply, who);
  return decode_telemetry(m.body, {}, who);
}

std::vector<simd::BoardInfo> simd_boards(const std::string& socket_path) {
  const std::string who = "simd:" + socket_path;
  auto sock = connect_to(socket_path, who);
  simd::Message m = request(sock.get(), simd::MsgType::kList, {}, {}, simd::MsgType::kBoards, who);
  const auto& r = reply_body<simd::BoardsReply>(m, who);
  if (r.count > simd::kMaxBoards)
    throw Error(Status::DeviceLost, who + ": the daemon lists " + std::to_string(r.count) + " boards");
  return {r.boards, r.boards + r.count};
}

}  // namespace tpuhal::tpu
