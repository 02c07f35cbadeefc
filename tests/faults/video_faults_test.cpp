// Faults on demand (docs/faults.md) while a VideoDecoder decodes: for each
// kind, inject it into the simulated board in the middle of a clip made at
// test time, check that the channel's caller gets an error naming the device,
// the channel and what failed within a bounded time, that another channel or
// queue keeps working where the fault allows, then reset the device and check
// that a new decoder decodes the clip exactly (ffmpeg's framemd5) and that no
// memory leaked once every decoder and frame is released.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "../video/video_support.hpp"
#include "fault_support.hpp"
#include "tpuhal/sim/board.h"
#include "tpuhal/tpu/sim_provider.h"
#include "tpuhal/tpuhal.hpp"
#include "tpuhal/video.hpp"

namespace tpuhal {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace video_test;
using ::testing::HasSubstr;
using namespace fault_test;

constexpr const char* kUri = "sim:tiny";  // two decoder channels, one video queue
constexpr std::uint32_t kWidth = 320, kHeight = 240;

// The clip, its packets and ffmpeg's hashes of its frames: made once per
// test program in a private directory.
struct Clip {
  std::string path;
  std::vector<Demuxer::Packet> packets;
  std::vector<std::string> md5;
};

const Clip& clip() {
  static const Clip c = [] {
    Clip out;
    out.path = (clip_dir() / "h264_bframes.mp4").string();
    make_clip(out.path, std::to_string(kWidth) + "x" + std::to_string(kHeight), 30,
              "-c:v libx264 -bf 2 -g 10 -pix_fmt yuv420p");
    Demuxer in(out.path);
    while (auto p = in.next()) out.packets.push_back(std::move(*p));
    out.md5 = ffmpeg_md5(out.path);
    return out;
  }();
  return c;
}

class VideoFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_ffmpeg()) GTEST_SKIP() << "ffmpeg is not installed (scripts/setup.sh installs it)";
    ASSERT_GE(clip().packets.size(), 20u);
    ASSERT_EQ(clip().md5.size(), clip().packets.size());
    dev = open(kUri);
    board = tpu::sim_board_of(kUri);
    ASSERT_NE(board, nullptr);
    WaitPolicy p = dev.wait_policy();
    p.timeout = 500ms;  // a hang is declared after half a second without progress
    dev.set_wait_policy(p);
    for (const QueueStatus& q : dev.status().queues)
      if (q.engine == Engine::Video) video_queue = q.index;
    ASSERT_NE(video_queue, ~0u) << kUri << " has no video queue";
    baseline = dev.memory_stats();
  }

  VideoDecoder open_decoder() {
    return dev.open_decoder({.codec = Codec::H264, .max_width = kWidth, .max_height = kHeight});
  }

  static std::string channel_name(const VideoDecoder& dec) {
    return std::string(kUri) + " video channel " + std::to_string(dec.channel());
  }
  std::string video_queue_name() const { return std::string(kUri) + " video queue " + std::to_string(video_queue); }

  // Sends packets [from, to) and hashes every frame they give (all of them
  // after the last packet, which also flushes). Nothing may fail.
  std::vector<std::string> decode(VideoDecoder& dec, Hasher& hash, std::size_t from, std::size_t to) {
    std::vector<std::string> md5;
    auto drain = [&] {
      while (auto f = dec.receive(10s)) md5.push_back(hash(*f));
    };
    for (std::size_t i = from; i < to; ++i) {
      dec.send(clip().packets[i].data, clip().packets[i].pts);
      drain();
    }
    if (to == clip().packets.size()) {
      dec.flush();
      drain();
      EXPECT_TRUE(dec.end_of_stream());
    }
    return md5;
  }

  // Goes on from packet `from` (sending, and receiving with the device's wait
  // timeout) until a call fails; returns that error, or nullopt if the whole
  // clip went through. `held` keeps the frames that came out.
  std::optional<Error> run_into_error(VideoDecoder& dec, std::size_t from, std::vector<Frame>& held) {
    try {
      for (std::size_t i = from; i < clip().packets.size(); ++i) {
        dec.send(clip().packets[i].data, clip().packets[i].pts);
        while (auto f = dec.receive()) {
          held.push_back(std::move(*f));
          if (held.size() > 2) held.erase(held.begin());  // the channel has 4 frame buffers
        }
      }
      dec.flush();
      while (auto f = dec.receive()) held.push_back(std::move(*f));
    } catch (const Error& e) {
      return e;
    }
    return std::nullopt;
  }

  // Copies a pattern host -> device -> host on `q` and checks every byte.
  void round_trip(Queue& q, std::uint8_t seed) {
    constexpr std::uint64_t kBytes = 64 * 1024;
    Buffer in = dev.allocate(kBytes, Memory::HostPinned);
    Buffer out = dev.allocate(kBytes, Memory::HostPinned);
    Buffer dram = dev.allocate(kBytes);
    auto src = in.map();
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = std::byte(static_cast<std::uint8_t>(i * 7 + seed));
    std::memset(out.map().data(), 0, kBytes);
    q.copy(in, dram).copy(dram, out).submit().wait(5s);
    EXPECT_EQ(std::memcmp(in.map().data(), out.map().data(), kBytes), 0);
  }

  // A new decoder decodes the whole clip exactly, beside a compute queue that
  // works; both are released before it returns.
  void check_decoding_works() {
    VideoDecoder dec = open_decoder();
    Hasher hash(dev);
    EXPECT_EQ(decode(dec, hash, 0, clip().packets.size()), clip().md5) << "channel " << dec.channel();
    Queue compute = dev.queue(Engine::Compute);
    round_trip(compute, 11);
  }

  void reset_and_check() {
    dev.reset();
    check_decoding_works();
  }

  // After every decoder, frame, queue and buffer is released: the device
  // holds exactly what it held when the test opened it.
  void expect_no_leaks() {
    const MemoryStats now = dev.memory_stats();
    EXPECT_EQ(now.device_used, baseline.device_used);
    EXPECT_EQ(now.host_pinned_bytes, baseline.host_pinned_bytes);
    EXPECT_EQ(now.host_pinned_allocations, baseline.host_pinned_allocations);
    ASSERT_EQ(now.heaps.size(), baseline.heaps.size());
    for (std::size_t i = 0; i < now.heaps.size(); ++i)
      EXPECT_EQ(now.heaps[i].allocations, baseline.heaps[i].allocations) << now.heaps[i].name;
  }

  Device dev;
  std::shared_ptr<sim::Board> board;
  std::uint32_t video_queue = ~0u;
  MemoryStats baseline;
};

constexpr std::size_t kBefore = 6;  // packets decoded before the fault is armed

TEST_F(VideoFaults, GivenFirmwareCrashWhenDecodingThenEveryChannelGetsDeviceLostUntilReset) {
  std::optional<Frame> kept;  // a frame received before the crash, held across the reset
  {
    VideoDecoder a = open_decoder();
    VideoDecoder b = open_decoder();
    ASSERT_NE(a.channel(), b.channel());
    {
      Hasher hash(dev);
      const std::vector<std::string> md5 = decode(a, hash, 0, kBefore);
      EXPECT_EQ(md5, std::vector<std::string>(clip().md5.begin(), clip().md5.begin() + md5.size()));
    }
    // The next packet of `a` is taken; the one after it finds the firmware dead.
    board->inject({.kind = sim::FaultKind::kFirmwareCrash, .queue = video_queue, .after_commands = 1});
    std::vector<Frame> held;
    const std::optional<Error> e = run_into_error(a, kBefore, held);
    ASSERT_TRUE(e) << "the whole clip decoded on a board whose firmware crashed";
    EXPECT_EQ(e->status(), Status::DeviceLost) << e->what();
    EXPECT_THAT(e->what(), HasSubstr(channel_name(a) + ": "));
    EXPECT_THAT(e->what(), HasSubstr(video_queue_name()));
    EXPECT_THAT(e->what(), HasSubstr("firmware fault"));
    EXPECT_THAT(e->what(), HasSubstr("reset the device"));
    if (!held.empty()) kept = held.front();
    // The firmware runs nothing: the other channel fails, every call of it.
    const std::string other = expect_error([&] { b.send(clip().packets[0].data, 0); }, Status::DeviceLost);
    EXPECT_THAT(other, HasSubstr(channel_name(b) + ": "));
    EXPECT_THAT(other, HasSubstr("firmware fault"));
    expect_error([&] { b.try_receive(); }, Status::DeviceLost);
    expect_error([&] { b.receive(); }, Status::DeviceLost);
    expect_error([&] { a.send(clip().packets[0].data, 0); }, Status::DeviceLost);
    // As does a new queue.
    expect_error([&] { dev.queue(Engine::Compute); }, Status::DeviceLost);
    // The reset discards the channels: their callers are told so.
    dev.reset();
    const std::string after = expect_error([&] { a.receive(); }, Status::DeviceFault);
    EXPECT_THAT(after, HasSubstr(channel_name(a) + ": "));
    EXPECT_THAT(after, HasSubstr("queue reset"));
    expect_error([&] { b.send(clip().packets[0].data, 0); }, Status::DeviceFault);
  }
  check_decoding_works();
  // A frame received before the crash is still a valid buffer of the right size.
  if (kept) {
    EXPECT_GE(kept->buffer().size(), std::uint64_t{kWidth} * kHeight * 3 / 2);
  }
  kept.reset();
  expect_no_leaks();
}

TEST_F(VideoFaults, GivenDeviceLostWhenDecodingThenDeviceLostWithinBoundedTimeAndReleasingBeforeResetLeaksNothing) {
  {
    VideoDecoder a = open_decoder();
    VideoDecoder b = open_decoder();
    {
      Hasher hash(dev);
      decode(a, hash, 0, kBefore);
    }
    board->inject({.kind = sim::FaultKind::kDeviceLost, .queue = video_queue, .after_commands = 1});
    std::vector<Frame> held;
    const std::optional<Error> e = run_into_error(a, kBefore, held);
    // The board sends no interrupt: the channel's bounded sleeps look at it.
    ASSERT_TRUE(e) << "the whole clip decoded on a board that went away";
    EXPECT_EQ(e->status(), Status::DeviceLost) << e->what();
    EXPECT_THAT(e->what(), HasSubstr(channel_name(a) + ": "));
    EXPECT_THAT(e->what(), HasSubstr(video_queue_name()));
    EXPECT_THAT(e->what(), HasSubstr("does not answer"));
    const std::string other = expect_error([&] { b.send(clip().packets[0].data, 0); }, Status::DeviceLost);
    EXPECT_THAT(other, HasSubstr(channel_name(b) + ": "));
    expect_error([&] { b.receive(); }, Status::DeviceLost);
    expect_error([&] { dev.queue(Engine::Copy); }, Status::DeviceLost);
    // Frames, then channels, released while the board is still gone.
  }
  // Nothing the channels held is kept once they are gone, before any reset.
  expect_no_leaks();
  reset_and_check();
  expect_no_leaks();
}

TEST_F(VideoFaults, GivenHangOnTheVideoQueueWhenDecodingThenTimeoutNamesChannelQueueAndCommand) {
  {
    VideoDecoder a = open_decoder();
    VideoDecoder b = open_decoder();
    {
      Hasher hash(dev);
      decode(a, hash, 0, kBefore);
    }
    board->inject({.kind = sim::FaultKind::kHang, .queue = video_queue, .after_commands = 1});
    std::vector<Frame> held;
    const auto start = Clock::now();
    const std::optional<Error> e = run_into_error(a, kBefore, held);
    EXPECT_GE(since(start), 400ms);
    ASSERT_TRUE(e) << "the whole clip decoded on a hung video queue";
    EXPECT_EQ(e->status(), Status::Timeout) << e->what();
    EXPECT_THAT(e->what(), HasSubstr(channel_name(a) + ": no progress for 500 ms"));
    EXPECT_THAT(e->what(), HasSubstr(video_queue_name()));
    EXPECT_THAT(e->what(), HasSubstr("of submission"));  // the command it is stuck at
    // Every channel shares the hung queue: the other one's packets wait too.
    b.send(clip().packets[0].data, clip().packets[0].pts);
    const std::string other = expect_error([&] { b.receive(); }, Status::Timeout);
    EXPECT_THAT(other, HasSubstr(channel_name(b) + ": no progress"));
    // Other engines run on.
    Queue compute = dev.queue(Engine::Compute);
    round_trip(compute, 2);
    // A reset ends the hang and discards the channels.
    dev.reset();
    const std::string after = expect_error([&] { a.receive(); }, Status::DeviceFault);
    EXPECT_THAT(after, HasSubstr(channel_name(a) + ": "));
    EXPECT_THAT(after, HasSubstr("queue reset"));
    expect_error([&] { a.send(clip().packets[0].data, 0); }, Status::DeviceFault);
    expect_error([&] { compute.submit().wait(5s); }, Status::DeviceFault);
  }
  check_decoding_works();
  expect_no_leaks();
}

TEST_F(VideoFaults, GivenHangWhenChannelsAreReleasedWithoutResetThenTheyGoInBoundedTimeAndLeakNothing) {
  {
    std::optional<VideoDecoder> a = open_decoder();
    std::optional<VideoDecoder> b = open_decoder();
    board->inject({.kind = sim::FaultKind::kHang, .queue = video_queue});
    a->send(clip().packets[0].data, clip().packets[0].pts);
    expect_error([&] { a->receive(); }, Status::Timeout);
    // The first close waits for the board (a few seconds) and gives up; the
    // second does not wait again. The channels' memory stays with the hung
    // queue, whose reset, when the last of them goes, closes them on the
    // board and lets it go. That both closes end is the test (one that
    // waited on the hung board for good would hang it); how long they took
    // depends on the machine's load, and is printed, not asserted.
    const auto start = Clock::now();
    a.reset();
    b.reset();
    std::printf("two channels of a hung queue closed in %.0f ms\n",
                std::chrono::duration<double, std::milli>(since(start)).count());
  }
  expect_no_leaks();
  check_decoding_works();  // on a new video queue: no Device::reset needed
  expect_no_leaks();
}

TEST_F(VideoFaults, GivenDmaErrorOnAPacketThenDeviceFaultNamesChannelAndPacketAndReleasingRecovers) {
  {
    VideoDecoder a = open_decoder();
    VideoDecoder b = open_decoder();
    {
      Hasher hash(dev);
      decode(a, hash, 0, kBefore);
    }
    // Packet kBefore is read; reading packet kBefore + 1 fails on the bus.
    board->inject({.kind = sim::FaultKind::kDmaError, .queue = video_queue, .after_commands = 1});
    std::vector<Frame> held;
    const std::optional<Error> e = run_into_error(a, kBefore, held);
    ASSERT_TRUE(e) << "the whole clip decoded through a DMA error";
    EXPECT_EQ(e->status(), Status::DeviceFault) << e->what();
    EXPECT_THAT(e->what(), HasSubstr(channel_name(a) + ": packet " + std::to_string(kBefore + 1)));
    EXPECT_THAT(e->what(), HasSubstr(video_queue_name()));
    EXPECT_THAT(e->what(), HasSubstr("video_decode"));
    EXPECT_THAT(e->what(), HasSubstr("DMA error"));
    // The channels share the failed queue; the other one is told whose it was.
    const std::string other = expect_error(
        [&] {
          b.send(clip().packets[0].data, 0);
          b.receive();
        },
        Status::DeviceFault);
    EXPECT_THAT(other, HasSubstr(channel_name(b) + ": "));
    EXPECT_THAT(other, HasSubstr("DMA error"));
    // Copies and compute do not use it.
    Queue compute = dev.queue(Engine::Compute);
    round_trip(compute, 3);
  }
  // Without a reset: once the failed channels are released, a new one
  // decodes exactly, and nothing they held is kept.
  check_decoding_works();
  expect_no_leaks();
  reset_and_check();
  expect_no_leaks();
}

TEST_F(VideoFaults, GivenEccErrorInAFrameBufferThenItsReaderFailsAndDecodingGoesOn) {
  {
    VideoDecoder a = open_decoder();
    VideoDecoder b = open_decoder();
    Queue compute = dev.queue(Engine::Compute);
    Buffer host = dev.allocate(std::uint64_t{kWidth} * kHeight * 2, Memory::HostPinned);
    a.send(clip().packets[0].data, clip().packets[0].pts);
    std::optional<Frame> first = a.receive(10s);
    for (std::size_t i = 1; !first && i < clip().packets.size(); ++i) {
      a.send(clip().packets[i].data, clip().packets[i].pts);
      first = a.receive(10s);
    }
    ASSERT_TRUE(first);
    const std::uint64_t sent = a.packets_sent();
    const std::uint64_t poisoned = first->buffer().device_address() + 4096;
    board->inject({.kind = sim::FaultKind::kEccError, .address = poisoned, .size = 64});
    // The board reads the poisoned frame buffer for the copy: the copy fails.
    Fence f = compute.copy(first->buffer(), 0, host, 0, first->buffer().size()).submit();
    const std::string msg = expect_error([&] { f.wait(5s); }, Status::DeviceFault);
    char hex[32];
    std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(poisoned));
    EXPECT_THAT(msg, HasSubstr(std::string(kUri) + " compute queue " + std::to_string(compute.index())));
    EXPECT_THAT(msg, HasSubstr(std::string("ECC error at device address ") + hex));
    // The codec unit only writes frame buffers (packets come from host
    // memory): the channel decodes the rest of the clip, into the poisoned
    // buffer too, and the other channel decodes exactly.
    first.reset();
    std::size_t frames = 1;
    for (std::size_t i = sent; i < clip().packets.size(); ++i) {
      a.send(clip().packets[i].data, clip().packets[i].pts);
      while (auto fr = a.receive(10s)) ++frames;
    }
    a.flush();
    while (auto fr = a.receive(10s)) ++frames;
    EXPECT_EQ(frames, clip().md5.size());
    Hasher hash(dev);
    EXPECT_EQ(decode(b, hash, 0, clip().packets.size()), clip().md5);
  }
  reset_and_check();
  expect_no_leaks();
}

TEST_F(VideoFaults, GivenInterruptsLostOnTheVideoQueueThenEveryFrameStillComesOut) {
  board->inject({.kind = sim::FaultKind::kInterruptLost, .queue = video_queue});
  {
    // Every interrupt of the video queue is lost: the channel's bounded
    // sleeps notice frames and completions anyway, and nothing times out.
    VideoDecoder a = open_decoder();
    VideoDecoder b = open_decoder();
    Hasher hash(dev);
    EXPECT_EQ(decode(a, hash, 0, clip().packets.size()), clip().md5);
    EXPECT_EQ(decode(b, hash, 0, clip().packets.size()), clip().md5);
  }
  expect_no_leaks();
  reset_and_check();
  expect_no_leaks();
}

TEST_F(VideoFaults, GivenDmaErrorOnAComputeQueueWhenDecodingThenTheChannelsAreUntouched) {
  {
    VideoDecoder a = open_decoder();
    Hasher hash(dev);
    std::vector<std::string> md5 = decode(a, hash, 0, kBefore);
    Queue compute = dev.queue(Engine::Compute);
    Buffer b = dev.allocate(4096);
    board->inject({.kind = sim::FaultKind::kDmaError, .queue = compute.index()});
    expect_error([&] { compute.fill(b, 0, 64, 1).submit().wait(5s); }, Status::DeviceFault);
    const std::vector<std::string> rest = decode(a, hash, kBefore, clip().packets.size());
    md5.insert(md5.end(), rest.begin(), rest.end());
    EXPECT_EQ(md5, clip().md5);
  }
  expect_no_leaks();
}

TEST_F(VideoFaults, GivenChannelsOfAFailedQueueStillOpenWhenOpeningAnotherThenTheErrorSaysToReleaseThem) {
  VideoDecoder a = open_decoder();
  board->inject({.kind = sim::FaultKind::kHang, .queue = video_queue});
  a.send(clip().packets[0].data, clip().packets[0].pts);
  expect_error([&] { a.receive(); }, Status::Timeout);
  dev.reset();
  // The board has one video queue, and `a` still holds it.
  const std::string msg = expect_error([&] { open_decoder(); }, Status::DeviceFault);
  EXPECT_THAT(msg, HasSubstr(kUri));
  EXPECT_THAT(msg, HasSubstr("queue reset"));
  EXPECT_THAT(msg, HasSubstr("release"));
  a = VideoDecoder();
  check_decoding_works();
  expect_no_leaks();
}

}  // namespace
}  // namespace tpuhal
