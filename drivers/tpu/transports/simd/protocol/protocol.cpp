#include "tpuhal/simd/protocol.h"

#include <linux/futex.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

namespace tpuhal::simd {

void shared_futex_wait(const std::atomic<std::uint32_t>& word, std::uint32_t expected,
                       std::chrono::nanoseconds timeout) noexcept {
  const auto ns = timeout.count() < 0 ? 0 : timeout.count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  ::syscall(SYS_futex, const_cast<std::atomic<std::uint32_t>*>(&word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void shared_futex_wake(const std::atomic<std::uint32_t>& word) noexcept {
  ::syscall(SYS_futex, const_cast<std::atomic<std::uint32_t>*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

int send_message(int sock, MsgType type, std::span<const std::byte> body, std::span<const int> fds) {
  if (sizeof(Header) + body.size() > kMaxMessageBytes || fds.size() > kMaxFds) return EMSGSIZE;
  Header h;
  h.type = type;
  h.body_bytes = static_cast<std::uint32_t>(body.size());
  iovec iov[2] = {{&h, sizeof h}, {const_cast<std::byte*>(body.data()), body.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = body.empty() ? 1 : 2;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    if (::sendmsg(sock, &msg, MSG_NOSIGNAL) >= 0) return 0;
    if (errno != EINTR) return errno;
  }
}

std::optional<ErrorStatus> error_status(std::uint32_t value) noexcept {
  switch (value) {
#define TPUHAL_STATUS(name, c_name, v, text, python, doc) \
  case v:                                                 \
    return ErrorStatus::name;
#include "tpuhal/status.inc"
#undef TPUHAL_STATUS
  }
  return std::nullopt;
}

int send_error(int sock, ErrorStatus status, const std::string& message) {
  ErrorReply e;
  e.status = static_cast<std::uint32_t>(status);
  set_field(e.message, message);
  return send_struct(sock, MsgType::kError, e);
}

int receive_message(int sock, Message& out, std::chrono::milliseconds timeout, std::string* why) {
  out = Message{};
  if (timeout.count() >= 0) {
    pollfd p{sock, POLLIN, 0};
    for (;;) {
      const int n = ::poll(&p, 1, static_cast<int>(timeout.count()));
      if (n > 0) break;
      if (n == 0) return ETIMEDOUT;
      if (errno != EINTR) return errno;
    }
  }
  alignas(Header) std::byte buf[kMaxMessageBytes];
  iovec iov{buf, sizeof buf};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds) + CMSG_SPACE(sizeof(ucred))];
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  for (;;) {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n >= 0 || errno != EINTR) break;
  }
  if (n < 0) return errno == EPIPE ? ECONNRESET : errno;
  // Whatever else is wrong, the descriptors that came are ours to close.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len >= CMSG_LEN(sizeof(ucred))) {
      ucred cred;
      std::memcpy(&cred, CMSG_DATA(c), sizeof cred);
      out.sender_pid = cred.pid;
      out.sender_uid = cred.uid;
      continue;
    }
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      out.fds.emplace_back(fd);
    }
  }
  if (n == 0) return ECONNRESET;
  auto fail = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return EPROTO;
  };
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
    return fail("a message larger than " + std::to_string(kMaxMessageBytes) + " bytes or with more than " +
                std::to_string(kMaxFds) + " descriptors");
  if (static_cast<std::size_t>(n) < sizeof(Header))
    return fail("a message of " + std::to_string(n) + " bytes, shorter than the " + std::to_string(sizeof(Header)) +
                "-byte header");
  std::memcpy(&out.header, buf, sizeof(Header));
  if (out.header.magic != kMagic) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%08x", out.header.magic);
    return fail(std::string("a message with magic ") + hex + " (not a tpuhal-simd message)");
  }
  if (out.header.body_bytes != static_cast<std::size_t>(n) - sizeof(Header))
    return fail("a header announcing " + std::to_string(out.header.body_bytes) + " body bytes, with " +
                std::to_string(static_cast<std::size_t>(n) - sizeof(Header)) + " sent");
  out.body.assign(buf + sizeof(Header), buf + n);
  if (out.header.version != kVersion)
    return fail("protocol version " + std::to_string(out.header.version) + " (this side speaks " +
                std::to_string(kVersion) + ")");
  return 0;
}

bool is_other_version(const Message& m) noexcept {
  return m.header.magic == kMagic && m.header.version != kVersion && m.header.body_bytes == m.body.size();
}

std::string version_mismatch(std::uint16_t theirs, bool daemon) {
  const std::string mine = std::to_string(kVersion), other = std::to_string(theirs);
  const std::string versions =
      daemon ? "the client speaks simulator daemon protocol " + other + " and this daemon (tpuhal-simd) speaks " + mine
             : "the simulator daemon (tpuhal-simd) speaks protocol " + other + " and this library (libtpuhal) speaks " +
                   mine;
  // The older side is the one to upgrade: the peer if it is older, else this side.
  const bool upgrade_daemon = (theirs < kVersion) != daemon;
  return versions + ": install the packages libtpuhal0 and tpuhal-simd of one version (upgrade the " +
         (upgrade_daemon ? "daemon's tpuhal-simd" : "client's libtpuhal0") + ")";
}

std::string to_string(MsgType type) {
  switch (type) {
    case MsgType::kList: return "list";
    case MsgType::kAttach: return "attach";
    case MsgType::kMapDma: return "map-dma";
    case MsgType::kUnmapDma: return "unmap-dma";
    case MsgType::kStats: return "stats";
    case MsgType::kTelemetry: return "telemetry";
    case MsgType::kDetach: return "detach";
    case MsgType::kOk: return "ok";
    case MsgType::kError: return "error";
    case MsgType::kBoards: return "boards";
    case MsgType::kAttached: return "attached";
    case MsgType::kStatsReply: return "stats-reply";
    case MsgType::kTelemetryReply: return "telemetry-reply";
  }
  return "message type " + std::to_string(static_cast<unsigned>(type));
}

}  // namespace tpuhal::simd
