// The simulator daemon's side of its socket (tools/tpuhal-simd/server.cpp):
// what a hostile client can send it, messages of any bytes with file
// descriptors of any kind riding along.
//
// Properties, for every input:
//   - the daemon neither crashes nor leaks (AddressSanitizer, and a file
//     descriptor count that comes back to where it was);
//   - every message gets exactly one reply, of a type a reply may have;
//   - once the client hangs up, it holds nothing: no VF, no mapping (a
//     stats request on a fresh connection lists no VF);
//   - the daemon goes on serving: that fresh connection's list request is
//     answered with the boards.
//
// One daemon per process (its socket is never served: Server::serve_socket
// is handed one end of a socketpair per input, and serves it on this
// thread until the other end is shut), serving the "tiny" board in two VFs
// with small DMA quotas, so that inputs reach them.
//
// Input layout (fuzz/make_seeds.py writes seeds in it): records of
//   byte 0    kind: 0 = raw bytes sent as they are; 1 = a message: the
//             header built (magic, version, body size) around type and body;
//             2 = a message carrying a memfd; 3 = a message carrying another
//             kind of descriptor
//   bytes 1-2 length L of what follows (little endian), cut to the input
//   then      kind 0: the bytes; kind 1: type (2 bytes), body; kind 2: type
//             (2), memfd size in pages (2), seals (1: bit 0 shrink, 1 grow,
//             2 write, 3 seal), body; kind 3: type (2), descriptor (1: 0 a
//             pipe, 1 an eventfd, 2 /dev/null, 3 a socket, 4 two memfds),
//             body
// At most 32 records; the rest is ignored.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <vector>

#include "fuzz_util.h"
#include "server.h"
#include "tpuhal/simd/protocol.h"

namespace {

using namespace tpuhal;
using namespace std::chrono_literals;

simd::Server& server() {
  static simd::Server* s = [] {
    // The socket is made (the daemon binds one) but never served.
    char dir[] = "/tmp/tpuhal-simd-fuzz-XXXXXX";
    if (!::mkdtemp(dir)) std::abort();
    ::setenv("TPUHAL_LOG", "off", 0);
    simd::ServerOptions o;
    o.socket_path = std::string(dir) + "/s";
    o.boards = {"tiny"};
    o.vfs = 2;
    o.spin_us = 0;
    o.quotas.mappings_per_client = 4;
    o.quotas.mappings_per_user = 6;
    o.quotas.mapped_bytes_per_client = 64 << 20;
    o.quotas.mapped_bytes_per_user = 96 << 20;
    o.quotas.idle_seconds = 0;
    o.quotas.requests_per_second = 0;  // every input comes from this process
    return new simd::Server(o);        // kept for the process's life
  }();
  return *s;
}

int open_fds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d)) ++n;
    ::closedir(d);
  }
  return n;
}

// A memfd of `pages` pages with `seals`.
int make_memfd(std::uint16_t pages, std::uint8_t seals) {
  const int fd = ::memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (::ftruncate(fd, static_cast<off_t>(pages) * 4096) != 0) {
    ::close(fd);
    return -1;
  }
  int s = 0;
  if (seals & 1) s |= F_SEAL_SHRINK;
  if (seals & 2) s |= F_SEAL_GROW;
  if (seals & 4) s |= F_SEAL_WRITE;
  if (seals & 8) s |= F_SEAL_SEAL;
  if (s) ::fcntl(fd, F_ADD_SEALS, s);
  return fd;
}

bool is_reply(simd::MsgType t) {
  using simd::MsgType;
  return t == MsgType::kOk || t == MsgType::kError || t == MsgType::kBoards || t == MsgType::kAttached ||
         t == MsgType::kStatsReply || t == MsgType::kTelemetryReply;
}

// Sends `body` as a message of `type` with `fds` (closed after); false if
// it could not be sent (too long, say).
bool send_with(int sock, std::uint16_t type, const std::uint8_t* body, std::size_t n, std::vector<int> fds) {
  std::vector<int> live;
  for (int fd : fds)
    if (fd >= 0) live.push_back(fd);
  const int err =
      simd::send_message(sock, static_cast<simd::MsgType>(type), {reinterpret_cast<const std::byte*>(body), n}, live);
  for (int fd : live) ::close(fd);
  return err == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  simd::Server& daemon = server();
  // Counted per input: between inputs libFuzzer may start a symbolizer
  // (two pipes, kept) to name a newly covered function.
  const int fds_at_start = open_fds();
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) return 0;
  const int client = pair[0];
  // Big enough for every request and every reply of one input.
  const int buf = 1 << 20;
  ::setsockopt(client, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  ::setsockopt(pair[1], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);

  std::size_t at = 0, sent = 0;
  while (at + 3 <= size && sent < 32) {
    const std::uint8_t kind = data[at] % 4;
    std::size_t n = fuzz::load<std::uint16_t>(data + at + 1);
    at += 3;
    n = std::min(n, size - at);
    const std::uint8_t* p = data + at;
    at += n;
    if (kind == 0) {
      if (n == 0) continue;  // an empty record reads as the peer hanging up
      if (::send(client, p, n, MSG_NOSIGNAL) != static_cast<ssize_t>(n)) continue;
    } else {
      const std::size_t head = kind == 1 ? 2 : kind == 2 ? 5 : 3;
      if (n < head) continue;
      const auto type = fuzz::load<std::uint16_t>(p);
      std::vector<int> fds;
      if (kind == 2) {
        fds.push_back(make_memfd(fuzz::load<std::uint16_t>(p + 2), p[4]));
      } else if (kind == 3) {
        int two[2] = {-1, -1};
        switch (p[2] % 5) {
          case 0:
            if (::pipe2(two, O_CLOEXEC) == 0) {
              fds.push_back(two[0]);
              ::close(two[1]);
            }
            break;
          case 1: fds.push_back(::eventfd(0, EFD_CLOEXEC)); break;
          case 2: fds.push_back(::open("/dev/null", O_RDWR | O_CLOEXEC)); break;
          case 3:
            if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, two) == 0) {
              fds.push_back(two[0]);
              ::close(two[1]);
            }
            break;
          default:
            fds.push_back(make_memfd(16, 1));
            fds.push_back(make_memfd(16, 1));
            break;
        }
      }
      if (!send_with(client, type, p + head, n - head, std::move(fds))) continue;
    }
    ++sent;
  }
  ::shutdown(client, SHUT_WR);
  daemon.serve_socket(base::UniqueFd(pair[1]));

  // One reply per message, each a reply's type; descriptors that came with
  // an attach are ours to close (the Message does).
  std::size_t replies = 0;
  for (;;) {
    simd::Message m;
    const int err = simd::receive_message(client, m, 0ms);
    if (err) break;
    FUZZ_CHECK(is_reply(m.header.type), "the daemon sent %s", simd::to_string(m.header.type).c_str());
    ++replies;
  }
  ::close(client);
  FUZZ_CHECK(replies == sent, "%zu messages sent, %zu replies", sent, replies);

  // The daemon serves a fresh connection, and the last one left nothing.
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) return 0;
  simd::send_message(pair[0], simd::MsgType::kList, {});
  simd::send_message(pair[0], simd::MsgType::kStats, {});
  ::shutdown(pair[0], SHUT_WR);
  daemon.serve_socket(base::UniqueFd(pair[1]));
  simd::Message boards, stats;
  FUZZ_CHECK(simd::receive_message(pair[0], boards, 0ms) == 0 && boards.header.type == simd::MsgType::kBoards,
             "the daemon did not list its boards after the input");
  FUZZ_CHECK(simd::receive_message(pair[0], stats, 0ms) == 0 && stats.header.type == simd::MsgType::kStatsReply,
             "the daemon did not answer a stats request after the input");
  const auto* st = stats.as<simd::StatsReply>();
  FUZZ_CHECK(st && st->vfs == 0, "a client that hung up still holds %u VF(s)", st ? st->vfs : 0u);
  ::close(pair[0]);
  FUZZ_CHECK(open_fds() == fds_at_start, "%d descriptors open, %d at the start", open_fds(), fds_at_start);
  return 0;
}
