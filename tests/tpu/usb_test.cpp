// The USB transport and the simulator's USB function (docs/usb.md).
//
// Three parts. The transport against a scripted board: this test plays the
// board's end of a UsbLink and checks what the host does with what a board
// may send (reads and writes of memory it was not given, interrupts ahead
// of their data, a stream out of step, a board that stops taking
// messages). The simulator's USB function with the test as the host (the
// loader, a queue reset while the board waits for host memory). Then whole
// devices on the in-process cable (usb-sim:): pulling the cable
// mid-transfer ends every pending and later call with device-lost,
// promptly, and a board that comes back opens again. The conformance and op suites run on usb-sim:tiny too.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "support/error_of.hpp"
#include "support/firmware_image.hpp"
#include "tpuhal/base/fd.h"
#include "tpuhal/base/mapping.h"
#include "tpuhal/fw/command.h"
#include "tpuhal/fw/image.h"
#include "tpuhal/fw/regs.h"
#include "tpuhal/fw/usb.h"
#include "tpuhal/fw/version.h"
#include "tpuhal/sim/profile.h"
#include "tpuhal/sim/usb_function.h"
#include "tpuhal/tpuhal.hpp"
#include "tpuhal/tpu/usb_provider.h"
#include "tpuhal/tpu/usb_sim_provider.h"
#include "tpuhal/tpu/usb_transport.h"

namespace tpuhal {
namespace {

using namespace std::chrono_literals;
using test::error_of;
using ::testing::HasSubstr;

constexpr std::uint64_t kIova = fw::kHostWindowBase + (1ull << 20);

// A cable of socket pairs: a stream for the bulk pipes, packets for the
// interrupt pipe; `c` has host_bulk, board_bulk, host_irq and board_irq.
template <class Cable>
void plug(Cable& c) {
  int b[2], i[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, b), 0);
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, i), 0);
  c.host_bulk.reset(b[0]);
  c.board_bulk.reset(b[1]);
  c.host_irq.reset(i[0]);
  c.board_irq.reset(i[1]);
}

// ---- A scripted board --------------------------------------------------------------------------

// The board's end of the cable is the test's: it reads what the host sends
// and writes what a board would.
struct ScriptedBoard {
  base::UniqueFd host_bulk, board_bulk, host_irq, board_irq;
  fw::UsbIdentity identity{fw::kUsbMagic, static_cast<std::uint32_t>(fw::UsbMode::kApplication), 1, 0, 0, 4096, {}};
  std::uint32_t sequence = 0;
  std::vector<std::byte> pending;  // bytes read from the host, not yet taken

  ScriptedBoard() { plug(*this); }

  // The next host message, or nullopt if none arrives within `timeout`.
  std::optional<std::pair<fw::UsbMessage, std::vector<std::byte>>> next(std::chrono::milliseconds timeout = 5s) {
    for (;;) {
      if (pending.size() >= sizeof(fw::UsbHeader)) {
        auto len = fw::usb_message_bytes(pending, fw::UsbDirection::kToBoard);
        EXPECT_TRUE(len.ok());
        if (!len) return std::nullopt;
        if (pending.size() >= *len) {
          std::vector<std::byte> raw(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(*len));
          pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(*len));
          auto m = fw::decode_usb_message(raw, fw::UsbDirection::kToBoard, fw::kBar0Size);
          EXPECT_TRUE(m.ok()) << fw::describe_usb_problem(m.problem());
          if (!m) return std::nullopt;
          return std::pair{*m, std::move(raw)};
        }
      }
      pollfd p{board_bulk.get(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return std::nullopt;
      std::byte buf[65536];
      const ssize_t n = ::recv(board_bulk.get(), buf, sizeof buf, 0);
      if (n <= 0) return std::nullopt;
      pending.insert(pending.end(), buf, buf + n);
    }
  }

  // The next message of `type`, answering register reads on the way (a
  // board of one queue and a 64 KiB aperture).
  std::optional<fw::UsbMessage> until(fw::UsbType type) {
    while (auto m = next()) {
      if (m->first.type == type) return m->first;
      if (m->first.type == fw::UsbType::kRegRead) answer_register(m->first);
    }
    return std::nullopt;
  }

  void answer_register(const fw::UsbMessage& m) {
    std::uint64_t value = 0;
    if (m.arg[0] == fw::reg::kNumQueues) value = 1;
    if (m.arg[0] == fw::reg::kApertureLo) value = 65536;
    send(fw::UsbType::kRegValue, m.tag, m.arg[0], value);
  }

  void send(fw::UsbType type, std::uint64_t tag, std::uint64_t a0, std::uint64_t a1 = 0,
            std::span<const std::byte> data = {}, std::optional<std::uint32_t> seq = std::nullopt) {
    std::vector<std::byte> m;
    fw::append_usb_message(m, type, tag, a0, a1, data, seq ? *seq : ++sequence);
    ASSERT_EQ(::send(board_bulk.get(), m.data(), m.size(), MSG_NOSIGNAL), static_cast<ssize_t>(m.size()));
  }

  void interrupt(std::uint32_t vectors, std::uint64_t after) {
    fw::UsbInterrupt irq{fw::kUsbMagic, vectors, after};
    ASSERT_EQ(::send(board_irq.get(), &irq, sizeof irq, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof irq));
  }
};

class ScriptLink final : public tpu::UsbLink {
 public:
  // `max_read`: the most one bulk IN read returns, to cut the board's
  // messages anywhere.
  explicit ScriptLink(ScriptedBoard& b, std::size_t max_read = SIZE_MAX) : b_(b), max_read_(max_read) {}
  std::string bus() const override { return "usb test"; }
  std::size_t control_in(std::uint8_t, std::span<std::byte> out) override {
    std::memcpy(out.data(), &b_.identity, sizeof b_.identity);
    return sizeof b_.identity;
  }
  void control_out(std::uint8_t) override {}
  bool bulk_out(std::span<const std::byte> data) override {
    return ::send(b_.host_bulk.get(), data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }
  std::size_t bulk_in(std::span<std::byte> out) override {
    const ssize_t n = ::recv(b_.host_bulk.get(), out.data(), std::min(out.size(), max_read_), 0);
    return n > 0 ? static_cast<std::size_t>(n) : 0;
  }
  std::size_t interrupt_in(std::span<std::byte> out) override {
    const ssize_t n = ::recv(b_.host_irq.get(), out.data(), out.size(), 0);
    return n > 0 ? static_cast<std::size_t>(n) : 0;
  }
  void shutdown() noexcept override {
    ::shutdown(b_.host_bulk.get(), SHUT_RDWR);
    ::shutdown(b_.host_irq.get(), SHUT_RDWR);
  }

 private:
  ScriptedBoard& b_;
  std::size_t max_read_;
};

// Opens a transport on the scripted board, answering its bring-up reads.
std::unique_ptr<tpu::Transport> open_on(ScriptedBoard& board, std::size_t max_read = SIZE_MAX) {
  auto opened = std::async(std::launch::async,
                           [&] { return tpu::make_usb_transport(std::make_unique<ScriptLink>(board, max_read)); });
  for (int answered = 0; answered < 3; ++answered) {
    auto m = board.next();
    if (!m) break;
    EXPECT_EQ(m->first.type, fw::UsbType::kRegRead);
    board.answer_register(m->first);
  }
  return opened.get();
}

// The driver reads the queue-count register and the board answers it (1):
// the answer is applied after every board message sent before it.
std::uint32_t read_queues(tpu::Transport& t, ScriptedBoard& board) {
  auto r = std::async(std::launch::async, [&] { return t.read32(fw::reg::kNumQueues); });
  auto m = board.until(fw::UsbType::kRegRead);
  if (m) board.answer_register(*m);
  return r.get();
}

bool readable(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(timeout.count())) == 1;
}

TEST(UsbTransport, AnswersBoardReadsOnlyFromMemoryItMappedAndAppliesWritesOnlyWhereAllowed) {
  ScriptedBoard board;
  auto t = open_on(board);
  auto mem = base::Mapping::anonymous(8192, {});
  std::memset(mem.data(), 0x11, 8192);
  t->map_dma(kIova, mem.data(), 4096, /*device_writes=*/false);
  t->map_dma(kIova + 4096, mem.data() + 4096, 4096, /*device_writes=*/true);
  auto map = board.until(fw::UsbType::kMapDma);
  ASSERT_TRUE(map);
  EXPECT_EQ(map->arg[0], kIova);
  EXPECT_EQ(map->flags, 0);
  map = board.until(fw::UsbType::kMapDma);
  ASSERT_TRUE(map);
  EXPECT_EQ(map->flags, fw::kUsbFlagDeviceWrites);

  // A read inside a mapping gets the bytes; one reaching past it a fault.
  board.send(fw::UsbType::kHostRead, 7, kIova + 4000, 96);
  auto data = board.until(fw::UsbType::kHostData);
  ASSERT_TRUE(data);
  EXPECT_EQ(data->tag, 7u);
  EXPECT_EQ(data->flags, 0);
  ASSERT_EQ(data->data.size(), 96u);
  board.send(fw::UsbType::kHostRead, 8, kIova + 8192 - 16, 32);
  data = board.until(fw::UsbType::kHostData);
  ASSERT_TRUE(data);
  EXPECT_EQ(data->tag, 8u);
  EXPECT_EQ(data->flags, fw::kUsbFlagFault);
  EXPECT_TRUE(data->data.empty());

  // Writes: the read-only page and unmapped memory stay as they were; the
  // writable page takes the bytes.
  const std::vector<std::byte> ones(64, std::byte{0xEE});
  board.send(fw::UsbType::kHostWrite, 0, kIova, 0, ones);
  board.send(fw::UsbType::kHostWrite, 0, kIova + 8192, 0, ones);
  board.send(fw::UsbType::kHostWrite, 0, kIova + 4096, 0, ones);
  // A register read after them: its answer is applied after the writes.
  EXPECT_EQ(read_queues(*t, board), 1u);
  EXPECT_EQ(mem.data()[0], std::byte{0x11});
  EXPECT_EQ(mem.data()[4096], std::byte{0xEE});
  EXPECT_EQ(mem.data()[4096 + 64], std::byte{0x11});

  // After unmap the board's reads of the page fault.
  t->unmap_dma(kIova, 4096);
  ASSERT_TRUE(board.until(fw::UsbType::kUnmapDma));
  board.send(fw::UsbType::kHostRead, 9, kIova, 8);
  data = board.until(fw::UsbType::kHostData);
  ASSERT_TRUE(data);
  EXPECT_EQ(data->flags, fw::kUsbFlagFault);
  t->unmap_dma(kIova + 4096, 4096);
}

// Bulk IN transfers end where the board's writes end, which need not be
// where its messages do: a header or a payload cut anywhere, several
// messages in one transfer, or one message over many.
class UsbTransportCut : public ::testing::TestWithParam<std::size_t> {};

TEST_P(UsbTransportCut, MessagesCutAnywhereAreAppliedWholeAndInOrder) {
  ScriptedBoard board;
  auto t = open_on(board, GetParam());
  auto mem = base::Mapping::anonymous(8192, {});
  std::memset(mem.data(), 0x11, 8192);
  t->map_dma(kIova, mem.data(), 8192, /*device_writes=*/true);
  ASSERT_TRUE(board.until(fw::UsbType::kMapDma));

  // Writes of 1, 40 and 4000 bytes, then a second write over part of the
  // first: only applying them whole and in order leaves these bytes.
  std::vector<std::byte> big(4000);  // the scripted board's largest payload is 4096
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::byte>(i * 7 + 3);
  board.send(fw::UsbType::kHostWrite, 0, kIova, 0, std::vector<std::byte>(1, std::byte{0xA1}));
  board.send(fw::UsbType::kHostWrite, 0, kIova + 8, 0, std::vector<std::byte>(40, std::byte{0xB2}));
  board.send(fw::UsbType::kHostWrite, 0, kIova + 100, 0, big);
  board.send(fw::UsbType::kHostWrite, 0, kIova + 16, 0, std::vector<std::byte>(8, std::byte{0xC3}));
  // A read between them is answered with the bytes written before it.
  board.send(fw::UsbType::kHostRead, 21, kIova + 100, 64);
  auto data = board.next();  // kept whole: the message's data points into it
  ASSERT_TRUE(data);
  EXPECT_EQ(data->first.type, fw::UsbType::kHostData);
  EXPECT_EQ(data->first.tag, 21u);
  ASSERT_EQ(data->first.data.size(), 64u);
  EXPECT_TRUE(std::equal(data->first.data.begin(), data->first.data.end(), big.begin()));
  // A register value last: once it is read, everything before is applied.
  EXPECT_EQ(read_queues(*t, board), 1u);
  const std::byte* m = mem.data();
  EXPECT_EQ(m[0], std::byte{0xA1});
  EXPECT_EQ(m[1], std::byte{0x11});
  EXPECT_EQ(m[8], std::byte{0xB2});
  EXPECT_EQ(m[15], std::byte{0xB2});
  EXPECT_EQ(m[16], std::byte{0xC3});
  EXPECT_EQ(m[23], std::byte{0xC3});
  EXPECT_EQ(m[24], std::byte{0xB2});
  EXPECT_EQ(m[47], std::byte{0xB2});
  EXPECT_EQ(m[48], std::byte{0x11});
  EXPECT_EQ(std::memcmp(m + 100, big.data(), big.size()), 0);
  EXPECT_EQ(m[4100], std::byte{0x11});
  t->unmap_dma(kIova, 8192);
}

// 1 and 7 bytes cut every header; 40 is exactly one header; 4096 cuts a
// large payload; unbounded takes what the socket has (several messages).
INSTANTIATE_TEST_SUITE_P(Reads, UsbTransportCut, ::testing::Values(1, 7, 40, 4096, SIZE_MAX), [](const auto& p) {
  return p.param == SIZE_MAX ? std::string("unbounded") : "at_most_" + std::to_string(p.param);
});

TEST(UsbTransport, AnInterruptWaitsForTheMessagesBeforeIt) {
  ScriptedBoard board;
  auto t = open_on(board);
  auto mem = base::Mapping::anonymous(4096, {});
  t->map_dma(kIova, mem.data(), 4096, true);
  ASSERT_TRUE(board.until(fw::UsbType::kMapDma));
  // The interrupt names message 4, which the board has not sent yet: the
  // pipes are independent and the notification may overtake the data.
  const std::uint32_t before = board.sequence;
  board.interrupt(1u << 0, before + 1);
  EXPECT_FALSE(readable(t->interrupt_fd(0), 200ms)) << "delivered before the write it announces";
  const std::uint64_t fence = 42;
  board.send(fw::UsbType::kHostWrite, 0, kIova, 0, {reinterpret_cast<const std::byte*>(&fence), 8});
  ASSERT_TRUE(readable(t->interrupt_fd(0), 5s));
  EXPECT_EQ(std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(mem.data())).load(), 42u);
  t->unmap_dma(kIova, 4096);
}

TEST(UsbTransport, ABoardOutOfStepIsLostAndItsRegistersReadAllOnes) {
  ScriptedBoard board;
  auto t = open_on(board);
  // Message 5 after message 3: something was dropped.
  board.send(fw::UsbType::kHostWrite, 0, kIova, 0, std::vector<std::byte>(8), board.sequence + 2);
  // Every vector fires so that waiters look, and registers read all ones.
  ASSERT_TRUE(readable(t->interrupt_fd(0), 5s));
  EXPECT_EQ(t->read32(fw::reg::kIdMagic), 0xFFFFFFFFu);
}

// A board that stops taking bulk OUT (wedged firmware) must not hold a
// close forever: closing waits a while for its last messages, then shuts
// the link down.
TEST(UsbTransport, ClosingEndsWhenTheBoardStopsTakingMessages) {
  ScriptedBoard board;
  auto t = open_on(board);
  ASSERT_TRUE(t);
  // Far more than the cable buffers, which the board never reads.
  for (int i = 0; i < 400; ++i) t->flush_aperture(0, 65536);
  std::this_thread::sleep_for(100ms);  // the sender is blocked by now
  auto closed = std::async(std::launch::async, [&] { t.reset(); });
  const bool in_time = closed.wait_for(10s) == std::future_status::ready;
  EXPECT_TRUE(in_time) << "closing hung on a board that takes no more messages";
  if (!in_time) board.board_bulk.reset();  // let the close end, so the test can
  closed.get();
}

TEST(UsbTransport, ALoaderModeBoardIsRefusedWithTheStepToTake) {
  ScriptedBoard board;
  board.identity.mode = static_cast<std::uint32_t>(fw::UsbMode::kLoader);
  const Error e = error_of([&] { tpu::make_usb_transport(std::make_unique<ScriptLink>(board)); });
  EXPECT_EQ(e.status(), Status::Unsupported);
  EXPECT_THAT(e.what(), HasSubstr("loader mode"));
  board.identity.mode = static_cast<std::uint32_t>(fw::UsbMode::kApplication);
  board.identity.magic = 0;
  EXPECT_THAT(error_of([&] { tpu::make_usb_transport(std::make_unique<ScriptLink>(board)); }).what(),
              HasSubstr("identity is malformed"));
}

// ---- The simulator's function, the test playing the host ---------------------------------------

// The function's endpoints on socket pairs; the test plays the host.
struct HostCable final : sim::FunctionEndpoints {
  base::UniqueFd host_bulk, board_bulk, host_irq, board_irq;
  HostCable() { plug(*this); }
  std::size_t read_out(std::span<std::byte> out) override {
    const ssize_t n = ::recv(board_bulk.get(), out.data(), out.size(), 0);
    return n > 0 ? static_cast<std::size_t>(n) : 0;
  }
  bool write_in(std::span<const std::byte> data) override {
    in_bytes += data.size();
    return ::send(board_bulk.get(), data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }
  bool write_irq(std::span<const std::byte> data) override {
    return ::send(board_irq.get(), data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }
  // A socket's send returns once the bytes are queued, as FunctionFS's AIO
  // does: this notes how much had been written at the last flush.
  bool flush_in() override {
    flushed = in_bytes.load();
    return true;
  }
  std::atomic<std::uint64_t> in_bytes{0}, flushed{0};
  void unplug() {
    ::shutdown(board_bulk.get(), SHUT_RDWR);
    ::shutdown(board_irq.get(), SHUT_RDWR);
  }

  void send(const std::vector<std::byte>& m) {
    ASSERT_EQ(::send(host_bulk.get(), m.data(), m.size(), MSG_NOSIGNAL), static_cast<ssize_t>(m.size()));
  }
  // The board's next message (within 5 s).
  std::optional<fw::UsbMessage> next_message() {
    for (;;) {
      if (inbox.size() >= sizeof(fw::UsbHeader)) {
        auto len = fw::usb_message_bytes(inbox, fw::UsbDirection::kToHost);
        EXPECT_TRUE(len.ok());
        if (!len) return std::nullopt;
        if (inbox.size() >= *len) {
          answered.assign(inbox.begin(), inbox.begin() + static_cast<std::ptrdiff_t>(*len));  // keeps its data alive
          inbox.erase(inbox.begin(), inbox.begin() + static_cast<std::ptrdiff_t>(*len));
          auto m = fw::decode_usb_message(answered, fw::UsbDirection::kToHost, fw::kBar0Size);
          EXPECT_TRUE(m.ok()) << fw::describe_usb_problem(m.problem());
          return m ? std::optional(*m) : std::nullopt;
        }
      }
      if (!readable(host_bulk.get(), 5s)) return std::nullopt;
      std::byte buf[65536];
      const ssize_t n = ::recv(host_bulk.get(), buf, sizeof buf, 0);
      if (n <= 0) return std::nullopt;
      inbox.insert(inbox.end(), buf, buf + n);
    }
  }
  // The board's answer to what was sent: its one next message.
  std::optional<fw::UsbMessage> answer() {
    auto m = next_message();
    EXPECT_TRUE(inbox.empty()) << "one answer expected";
    return m;
  }
  // The board's next message of `type`, skipping the others.
  std::optional<fw::UsbMessage> next_of(fw::UsbType type) {
    while (auto m = next_message())
      if (m->type == type) return m;
    return std::nullopt;
  }
  std::vector<std::byte> answered, inbox;
};

std::vector<std::byte> firmware_for(std::uint32_t board_id) { return test::firmware_image(board_id, 10000); }

// Sends fw-begin, the image in pieces of `piece` bytes and fw-commit with
// `crc`; returns the board's answer.
std::optional<fw::UsbMessage> upload(HostCable& cable, std::span<const std::byte> image, std::uint32_t crc,
                                     std::size_t piece = 4096) {
  std::vector<std::byte> m;
  fw::append_usb_message(m, fw::UsbType::kFwBegin, 7, image.size());
  for (std::size_t off = 0; off < image.size(); off += piece)
    fw::append_usb_message(m, fw::UsbType::kFwData, 7, off, 0, image.subspan(off, std::min(piece, image.size() - off)));
  fw::append_usb_message(m, fw::UsbType::kFwCommit, 7, crc);
  cable.send(m);
  return cable.answer();
}

TEST(UsbLoader, TakesOnlyAnImageForItsBoardAndHandsItOnAfterAnsweringOk) {
  HostCable cable;
  std::promise<std::vector<std::byte>> handed;
  auto future = handed.get_future();
  sim::UsbFunctionOptions o;
  o.loader = true;
  // What the host had been sent, and what flushed, when the image was
  // handed on: a front end detaches then, so the verdict must be out.
  std::uint64_t written_at_handoff = 0, flushed_at_handoff = 0;
  o.on_firmware = [&](std::vector<std::byte> image) {
    written_at_handoff = cable.in_bytes.load();
    flushed_at_handoff = cable.flushed.load();
    handed.set_value(std::move(image));
  };
  auto fn = std::make_unique<sim::UsbFunction>(sim::load_profile("tiny"), cable, o);
  const fw::UsbIdentity id = fn->identity();
  EXPECT_EQ(id.mode, static_cast<std::uint32_t>(fw::UsbMode::kLoader));
  EXPECT_EQ(id.firmware_version, 0u);
  EXPECT_NE(id.board_id, 0u);

  // Another board's image: refused, naming the board field.
  auto other = firmware_for(id.board_id ^ 1);
  auto a = upload(cable, other, fw::crc32c(other));
  ASSERT_TRUE(a);
  EXPECT_EQ(a->type, fw::UsbType::kFwStatus);
  EXPECT_EQ(static_cast<fw::CmdStatus>(a->arg[0] & 0xFFFFFFFF), fw::CmdStatus::kBadArgument);
  EXPECT_EQ(a->arg[0] >> 32, fw::kFieldImageBoard);
  EXPECT_EQ(a->arg[1], id.board_id ^ 1);

  // Its own image, but the commit names another checksum.
  auto good = firmware_for(id.board_id);
  auto decoded = fw::decode_image(good);
  ASSERT_TRUE(decoded.ok());
  a = upload(cable, good, decoded->crc32c + 1);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->arg[0] >> 32, fw::kFieldImageChecksum);

  // A register read is not for a loader.
  std::vector<std::byte> m;
  fw::append_usb_message(m, fw::UsbType::kRegRead, 9, fw::reg::kNumQueues);
  cable.send(m);
  a = cable.answer();
  ASSERT_TRUE(a);
  EXPECT_EQ(a->type, fw::UsbType::kError);
  EXPECT_EQ(a->tag, 9u);
  EXPECT_EQ(a->arg[1], static_cast<std::uint64_t>(fw::UsbType::kRegRead));
  // Data with no upload begun, or past the announced size.
  m.clear();
  fw::append_usb_message(m, fw::UsbType::kFwBegin, 10, 100);
  fw::append_usb_message(m, fw::UsbType::kFwData, 10, 96, 0, std::vector<std::byte>(8));
  cable.send(m);
  a = cable.answer();
  ASSERT_TRUE(a);
  EXPECT_EQ(a->type, fw::UsbType::kError);
  EXPECT_EQ(future.wait_for(0s), std::future_status::timeout);
  EXPECT_EQ(fn->stats().refused, 2u);

  // The good image, in pieces of odd size: accepted, then handed on whole.
  a = upload(cable, good, decoded->crc32c, 999);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->type, fw::UsbType::kFwStatus);
  EXPECT_EQ(a->arg[0], 0u);
  ASSERT_EQ(future.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(future.get(), good);
  EXPECT_EQ(written_at_handoff, cable.in_bytes.load()) << "the verdict was written before the hand-off";
  EXPECT_EQ(flushed_at_handoff, written_at_handoff) << "and flushed to the host";
  cable.unplug();
  fn.reset();
}

// A queue reset arrives on the same pipe as the answers to the board's reads
// of host memory, and the board's message thread executes it: a reset that
// waited for the queue's command processor, itself waiting for an answer
// only that thread could deliver, would stop the board for good.
TEST(UsbFunction, AQueueResetEndsACopyWaitingForHostMemoryAndItsLateAnswerIsDropped) {
  HostCable cable;  // the test is the host
  auto fn = std::make_unique<sim::UsbFunction>(sim::load_profile("tiny"), cable, sim::UsbFunctionOptions{});
  namespace q = fw::reg::queue;
  constexpr std::uint64_t kRing = 0x10000, kDst = 0x100000, kBytes = 64 << 10;
  std::vector<std::byte> m;
  auto reg_write = [&](std::uint32_t offset, std::uint32_t value) {
    fw::append_usb_message(m, fw::UsbType::kRegWrite, 0, offset, value);
  };
  reg_write(fw::reg::kDriverVersion, fw::kInterfaceVersion.packed());
  // Host memory the board may read and write: the copy's source and the
  // queue's status page.
  fw::append_usb_message(m, fw::UsbType::kMapDma, 0, kIova, 1 << 20, {}, 0, fw::kUsbFlagDeviceWrites);
  fw::CommandDescriptor d{};
  d.opcode = static_cast<std::uint16_t>(fw::Opcode::kCopy);
  d.args[0] = kIova;
  d.args[1] = kDst;
  d.args[2] = kBytes;
  fw::append_usb_message(m, fw::UsbType::kMemWrite, 0, kRing, 0, std::as_bytes(std::span(&d, 1)));
  const std::uint64_t page = kIova + (512 << 10);
  reg_write(fw::reg::queue_reg(0, q::kRingSize), 16);
  reg_write(fw::reg::queue_reg(0, q::kRingBaseLo), static_cast<std::uint32_t>(kRing));
  reg_write(fw::reg::queue_reg(0, q::kRingBaseHi), 0);
  reg_write(fw::reg::queue_reg(0, q::kFenceLo), static_cast<std::uint32_t>(page));
  reg_write(fw::reg::queue_reg(0, q::kFenceHi), static_cast<std::uint32_t>(page >> 32));
  reg_write(fw::reg::queue_reg(0, q::kControl), fw::kQueueControlEnable);
  reg_write(fw::reg::queue_reg(0, q::kTail), 1);
  cable.send(m);
  auto read = cable.next_of(fw::UsbType::kHostRead);
  ASSERT_TRUE(read) << "the copy should ask for its source";
  EXPECT_EQ(read->arg[0], kIova);
  EXPECT_EQ(read->arg[1], kBytes);

  // Instead of answering, the host resets the queue, then reads its status:
  // the answer proves the board went on executing host messages.
  m.clear();
  reg_write(fw::reg::queue_reg(0, q::kControl), fw::kQueueControlReset);
  fw::append_usb_message(m, fw::UsbType::kRegRead, 77, fw::reg::queue_reg(0, q::kStatus));
  cable.send(m);
  auto status = cable.next_of(fw::UsbType::kRegValue);
  ASSERT_TRUE(status) << "the board stopped executing host messages after the reset";
  EXPECT_EQ(status->tag, 77u);
  EXPECT_EQ(status->arg[1], 0u) << "the queue should be reset";

  // The answer comes after all: dropped without complaint, and the board
  // goes on answering.
  m.clear();
  fw::append_usb_message(m, fw::UsbType::kHostData, read->tag, kIova, 0, std::vector<std::byte>(kBytes, std::byte{7}));
  fw::append_usb_message(m, fw::UsbType::kRegRead, 78, fw::reg::kNumQueues);
  cable.send(m);
  auto after = cable.next_of(fw::UsbType::kRegValue);
  ASSERT_TRUE(after);
  EXPECT_EQ(after->tag, 78u);
  EXPECT_EQ(fn->stats().refused, 0u);
  cable.unplug();
  fn.reset();
}

// ---- Boards named in TPUHAL_USB_IDS --------------------------------------------------------------

TEST(UsbIds, KnownBoardsAreTheBoardProfilesWithUsbIdsThenTheSimulatedGadget) {
  // Generated from the profiles (cmake/TpuhalBoards.cmake), in the order
  // builtin_profile_names() gives; the gadget presents any profile.
  const auto boards = tpu::known_usb_boards();
  std::vector<std::string> want;
  for (const std::string& name : sim::builtin_profile_names()) {
    const sim::BoardProfile prof = sim::load_profile(name);
    if (prof.usb_vendor == 0 && prof.usb_product == 0) continue;
    want.push_back(name);
    const auto it = std::find_if(boards.begin(), boards.end(), [&](auto& b) { return b.name == name; });
    ASSERT_NE(it, boards.end()) << name;
    EXPECT_EQ(it->vendor, prof.usb_vendor);
    EXPECT_EQ(it->product, prof.usb_product);
    EXPECT_EQ(it->loader_product, prof.usb_loader_product);
  }
  ASSERT_EQ(boards.size(), want.size() + 1);
  EXPECT_EQ(boards.back().vendor, fw::kUsbSimVendor);
  EXPECT_EQ(boards.back().product, fw::kUsbSimProduct);
  EXPECT_EQ(boards.back().loader_product, fw::kUsbSimLoaderProduct);
}

TEST(UsbIds, BoardsUnderBringUpAreAddedWithTheirLoaderAndAMalformedEntryIsNamed) {
  ::setenv("TPUHAL_USB_IDS", "abcd:00aa/00ab,,1234:0001", 1);
  const auto boards = tpu::known_usb_boards();
  ::unsetenv("TPUHAL_USB_IDS");
  ASSERT_GE(boards.size(), 3u);
  const auto& a = boards[boards.size() - 2];
  const auto& b = boards.back();
  EXPECT_EQ(a.vendor, 0xabcd);
  EXPECT_EQ(a.product, 0x00aa);
  EXPECT_EQ(a.loader_product, 0x00ab);
  EXPECT_EQ(b.vendor, 0x1234);
  EXPECT_EQ(b.loader_product, 0);
  for (const char* bad : {"abcd", "abcd:00aa/", "abcd:00aa/0000", "abcd:00aax"}) {
    ::setenv("TPUHAL_USB_IDS", bad, 1);
    const Error e = error_of([] { tpu::known_usb_boards(); });
    EXPECT_EQ(e.status(), Status::InvalidArgument) << bad;
    EXPECT_THAT(e.what(), HasSubstr(std::string("'") + bad + "'"));
  }
  ::unsetenv("TPUHAL_USB_IDS");
}

// ---- Whole devices on the in-process cable ------------------------------------------------------

TEST(UsbSim, DataCrossesTheCableBothWays) {
  Device dev = open("usb-sim:tiny");
  EXPECT_THAT(dev.properties().bus, HasSubstr("usb-sim"));
  const std::uint64_t n = 3 * fw::kUsbMaxData + 4100;  // several messages, a ragged end
  Buffer src = dev.allocate(n, Memory::HostPinned), dram = dev.allocate(n), dst = dev.allocate(n, Memory::HostPinned);
  auto s = src.map();
  for (std::uint64_t i = 0; i < n; ++i) s[i] = static_cast<std::byte>(i * 7 + i / 4096);
  dev.queue(Engine::Copy).copy(src, dram).copy(dram, dst).submit().wait(30s);
  EXPECT_EQ(std::memcmp(dst.map().data(), s.data(), n), 0);
  auto fn = tpu::usb_sim_function_of("usb-sim:tiny");
  ASSERT_TRUE(fn);
  EXPECT_GE(fn->stats().host_reads, 4u);  // the board asked for the source in pieces
  EXPECT_EQ(fn->stats().refused, 0u);
}

TEST(UsbSim, PullingTheCableEndsPendingAndLaterCallsWithDeviceLostAndTheBoardOpensAgain) {
  {
    Device dev = open("usb-sim:tiny");
    const std::uint64_t n = 32ull << 20;
    Buffer host = dev.allocate(n, Memory::HostPinned), dram = dev.allocate(n), word = dev.allocate(4096);
    Queue q = dev.queue(Engine::Copy);
    // Transfers, then a wait for a word nothing writes: the batch is still
    // in flight when the cable goes, however late this thread gets there
    // (most often the transfers still are).
    Batch b = q.fill(word, 0, 8, 0);
    b.copy(host, dram);
    for (int i = 0; i < 15; ++i) b.copy(dram, host).copy(host, dram);
    Fence f = b.wait_value(word, 0, 1).submit();
    std::this_thread::sleep_for(20ms);
    const auto pulled = std::chrono::steady_clock::now();
    ASSERT_TRUE(tpu::usb_sim_unplug("usb-sim:tiny"));
    const Error e = error_of([&] { f.wait(10s); });
    const auto took = std::chrono::steady_clock::now() - pulled;
    // The batch cannot complete (its last command waits for a word nothing
    // writes): a wait the pulled cable did not end fails with Timeout.
    EXPECT_EQ(e.status(), Status::DeviceLost) << e.what();
    std::printf("device-lost after the cable was pulled: %.1f ms\n",
                std::chrono::duration<double, std::milli>(took).count());
    // Later calls fail the same way, without hanging.
    EXPECT_EQ(error_of([&] { q.copy(host, dram).submit().wait(10s); }).status(), Status::DeviceLost);
  }
  // Plugged in again: a fresh board.
  Device again = open("usb-sim:tiny");
  Buffer a = again.allocate(4096, Memory::HostPinned), d = again.allocate(4096);
  again.queue(Engine::Copy).copy(a, d).submit().wait(10s);
}

}  // namespace
}  // namespace tpuhal
