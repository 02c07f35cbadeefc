// The video decoder against ffmpeg itself: clips made at test time with
// Debian's ffmpeg (testsrc2), every frame checked against its framemd5;
// damaged streams, channel limits, held buffers and threads.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <netinet/in.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "tpuhal/tpuhal.hpp"
#include "video_support.hpp"

namespace tpuhal {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using namespace video_test;

// The clips, made once per test program in a private directory.
struct Clip {
  std::string name, args;  // ffmpeg output options after the testsrc2 input
  std::string size;
  int frames;
};
const std::vector<Clip>& clips() {
  static const std::vector<Clip> all{
      {"h264_bframes.mp4", "-c:v libx264 -bf 3 -g 12 -pix_fmt yuv420p", "320x240", 30},
      {"h264_720p.mkv", "-c:v libx264 -bf 2 -pix_fmt yuv420p", "1280x720", 8},
      {"h264_odd.h264", "-c:v libx264 -bf 2 -pix_fmt yuv420p", "322x182", 25},
      {"h265.mkv", "-c:v libx265 -x265-params log-level=none -pix_fmt yuv420p", "352x288", 25},
      {"h265_odd.h265", "-c:v libx265 -x265-params log-level=none -pix_fmt yuv420p", "242x138", 20},
      {"jpeg.jpg", "-pix_fmt yuvj420p -frames:v 1", "640x480", 1},
      {"jpeg_odd.jpg", "-vf scale=321:241 -pix_fmt yuvj420p -frames:v 1", "320x240", 1},
      {"h264_360p.h264", "-c:v libx264 -preset veryfast -bf 2 -g 6 -pix_fmt yuv420p", "640x360", 8},
      {"h264_1080p.h264", "-c:v libx264 -preset veryfast -bf 2 -pix_fmt yuv420p", "1920x1080", 3},
      // A camera's: no B frames, an I frame every 5.
      {"h264_camera.h264", "-c:v libx264 -preset veryfast -bf 0 -g 5 -keyint_min 5 -sc_threshold 0 -pix_fmt yuv420p",
       "320x240", 12},
  };
  return all;
}

// The clip's path, made on first use in this process.
std::string path_of(const std::string& clip) {
  static std::mutex mu;
  std::lock_guard lock(mu);
  const fs::path path = clip_dir() / clip;
  if (fs::exists(path)) return path.string();
  for (const Clip& c : clips())
    if (c.name == clip) make_clip(path.string(), c.size, c.frames, c.args);
  return path.string();
}

struct Decoded {
  std::vector<std::string> md5;
  std::vector<std::int64_t> pts;
  std::vector<std::string> errors;
};

// Decodes a whole file on `dev`, hashing every frame.
Decoded decode_file(Device dev, const std::string& path, PixelFormat fmt,
                    const std::function<void(std::uint64_t, std::vector<std::byte>&)>& damage = {},
                    std::optional<Queue> copy = std::nullopt) {
  Demuxer in(path);
  VideoDecoderOptions o;
  o.codec = in.codec();
  o.format = fmt;
  o.max_width = std::max(16u, in.width());
  o.max_height = std::max(16u, in.height());
  VideoDecoder dec = dev.open_decoder(o);
  Hasher hash = copy ? Hasher(dev, *copy) : Hasher(dev);
  Decoded out;
  auto drain = [&] {
    for (;;) {
      try {
        auto f = dec.receive(std::chrono::seconds(30));
        if (!f) return;
        EXPECT_EQ(f->buffer().memory(), Memory::Device);
        EXPECT_EQ(f->width(), in.width());
        out.md5.push_back(hash(*f));
        out.pts.push_back(f->pts());
      } catch (const Error& e) {
        if (e.status() == Status::Timeout || e.status() == Status::DeviceFault) throw;
        out.errors.push_back(e.what());
      }
    }
  };
  std::uint64_t index = 0;
  while (auto p = in.next()) {
    if (damage) damage(index, p->data);
    ++index;
    if (p->data.empty()) continue;
    dec.send(p->data, p->pts);
    drain();
  }
  dec.flush();
  drain();
  EXPECT_TRUE(dec.end_of_stream());
  return out;
}

class VideoClip : public ::testing::TestWithParam<std::tuple<std::string, PixelFormat>> {
 protected:
  void SetUp() override {
    if (!have_ffmpeg()) GTEST_SKIP() << "ffmpeg is not installed (scripts/setup.sh installs it)";
  }
};

TEST_P(VideoClip, EveryFrameMatchesFfmpegFramemd5InDisplayOrder) {
  const auto& [clip, fmt] = GetParam();
  const std::string path = path_of(clip);
  const auto want = ffmpeg_md5(path);
  ASSERT_FALSE(want.empty()) << "ffmpeg gave no hashes for " << path;
  const Decoded got = decode_file(open("sim:0"), path, fmt);
  EXPECT_THAT(got.errors, ::testing::IsEmpty());
  EXPECT_EQ(got.md5, want) << clip << " as " << to_string(fmt);
}

INSTANTIATE_TEST_SUITE_P(Clips, VideoClip,
                         ::testing::Combine(::testing::Values("h264_bframes.mp4", "h264_720p.mkv", "h264_odd.h264",
                                                              "h265.mkv", "h265_odd.h265", "jpeg.jpg", "jpeg_odd.jpg"),
                                            ::testing::Values(PixelFormat::NV12, PixelFormat::I420)),
                         [](const auto& p) {
                           std::string n = std::get<0>(p.param) + "_" + to_string(std::get<1>(p.param));
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

class Video : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_ffmpeg()) GTEST_SKIP() << "ffmpeg is not installed (scripts/setup.sh installs it)";
  }
};

TEST_F(Video, CliMd5MatchesFfmpegOnEveryClip) {
  for (const Clip& c : clips()) {
    const std::string path = path_of(c.name);
    int rc = 0;
    const std::string out = sh(
        std::string("TPUHAL_LOG=error ") + TPUHAL_CLI + " decode --device sim:0 --md5 " + path + " 2>/dev/null", &rc);
    EXPECT_EQ(rc, 0) << c.name;
    std::vector<std::string> got;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) got.push_back(line.substr(line.rfind(' ') + 1));
    EXPECT_EQ(got, ffmpeg_md5(path)) << c.name;
  }
}

TEST_F(Video, PtsComesBackWithTheFramesInDisplayOrder) {
  const std::string path = path_of("h264_bframes.mp4");
  const Decoded got = decode_file(open("sim:0"), path, PixelFormat::NV12);
  ASSERT_EQ(got.pts.size(), 30u);
  // B-frames: decode order differs from display order, pts must ascend.
  EXPECT_TRUE(std::is_sorted(got.pts.begin(), got.pts.end()));
  EXPECT_LT(got.pts.front(), got.pts.back());
}

TEST_F(Video, CorruptPacketIsAnErrorNamingChannelAndPacketAndTheStreamGoesOn) {
  const std::string path = path_of("h264_bframes.mp4");
  const auto want = ffmpeg_md5(path);
  // Packet 5 (a P or B frame inside the first GOP of 12) gets garbage in its
  // slice data; the frames of the next GOP (from packet 12) must be exact.
  const Decoded got =
      decode_file(open("sim:0"), path, PixelFormat::I420, [](std::uint64_t i, std::vector<std::byte>& d) {
        if (i == 5)
          for (std::size_t k = d.size() / 3; k < d.size(); ++k) d[k] = std::byte{0xFF};
      });
  ASSERT_FALSE(got.errors.empty()) << "a damaged packet decoded without an error";
  EXPECT_THAT(got.errors.front(), HasSubstr("sim:0 video channel"));
  EXPECT_THAT(got.errors.front(), HasSubstr("packet 5"));
  EXPECT_THAT(got.errors.front(), HasSubstr("corrupt or truncated"));
  // Whatever came out: every frame from the second GOP on matches ffmpeg.
  ASSERT_GE(got.md5.size(), 18u);
  const std::vector<std::string> tail_got(got.md5.end() - 18, got.md5.end());
  const std::vector<std::string> tail_want(want.end() - 18, want.end());
  EXPECT_EQ(tail_got, tail_want);
}

// Telemetry (docs/telemetry.md): each frame decoded and each damaged
// packet counts on its channel.
TEST_F(Video, TelemetryCountsFramesAndErrorsPerChannel) {
  Device dev = open("sim:0");
  auto sum = [](const Telemetry& t, std::uint64_t ChannelTelemetry::*field) {
    std::uint64_t n = 0;
    for (const auto& c : t.channels) n += c.*field;
    return n;
  };
  const Telemetry t0 = dev.telemetry();
  ASSERT_EQ(t0.channels.size(), dev.properties().decode_channels);
  const Decoded clean = decode_file(dev, path_of("h264_bframes.mp4"), PixelFormat::NV12);
  const Telemetry t1 = dev.telemetry();
  EXPECT_EQ(sum(t1, &ChannelTelemetry::frames) - sum(t0, &ChannelTelemetry::frames), clean.md5.size());
  EXPECT_EQ(sum(t1, &ChannelTelemetry::errors), sum(t0, &ChannelTelemetry::errors));
  EXPECT_GE(sum(t1, &ChannelTelemetry::packets) - sum(t0, &ChannelTelemetry::packets), 30u);
  EXPECT_GT(sum(t1, &ChannelTelemetry::busy_ns), sum(t0, &ChannelTelemetry::busy_ns));
  EXPECT_NEAR(utilisation(t0, t1).frames_per_s * utilisation(t0, t1).interval_s, static_cast<double>(clean.md5.size()),
              1e-6);
  const Decoded damaged =
      decode_file(dev, path_of("h264_bframes.mp4"), PixelFormat::NV12, [](std::uint64_t i, std::vector<std::byte>& d) {
        if (i == 5)
          for (std::size_t k = d.size() / 3; k < d.size(); ++k) d[k] = std::byte{0xFF};
      });
  const Telemetry t2 = dev.telemetry();
  EXPECT_EQ(sum(t2, &ChannelTelemetry::errors) - sum(t1, &ChannelTelemetry::errors), damaged.errors.size());
  EXPECT_EQ(sum(t2, &ChannelTelemetry::frames) - sum(t1, &ChannelTelemetry::frames), damaged.md5.size());
}

TEST_F(Video, TruncatedPacketIsAnError) {
  const std::string path = path_of("h265.mkv");
  const Decoded got =
      decode_file(open("sim:0"), path, PixelFormat::NV12, [](std::uint64_t i, std::vector<std::byte>& d) {
        if (i == 3) d.resize(d.size() / 2);
      });
  ASSERT_FALSE(got.errors.empty());
  EXPECT_THAT(got.errors.front(), HasSubstr("packet 3"));
  EXPECT_GE(got.md5.size(), 10u);  // the rest of the stream still decodes
}

TEST_F(Video, TruncatedJpegIsAnErrorAndTheNextJpegDecodes) {
  Device dev = open("sim:0");
  std::ifstream f(path_of("jpeg.jpg"), std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto bytes = std::as_bytes(std::span(raw));
  VideoDecoder dec = dev.open_decoder({.codec = Codec::Jpeg, .max_width = 640, .max_height = 480});
  dec.send(bytes.first(bytes.size() / 3), 1);
  dec.send(bytes, 2);
  std::vector<std::int64_t> pts;
  std::vector<std::string> errors;
  for (;;) {
    try {
      auto fr = dec.receive(std::chrono::seconds(30));
      if (!fr) break;
      pts.push_back(fr->pts());
    } catch (const Error& e) {
      errors.push_back(e.what());
    }
  }
  ASSERT_EQ(errors.size(), 1u) << "frames with pts: " << ::testing::PrintToString(pts);
  EXPECT_THAT(errors[0], HasSubstr("packet 0"));
  EXPECT_EQ(pts, std::vector<std::int64_t>{2});
  // And the hash of the good one is ffmpeg's.
  Hasher hash(dev);
  dec.send(bytes, 3);
  auto fr = dec.receive(std::chrono::seconds(30));
  ASSERT_TRUE(fr);
  EXPECT_EQ(hash(*fr), ffmpeg_md5(path_of("jpeg.jpg")).at(0));
}

TEST_F(Video, OneChannelTooManyIsAClearErrorAndClosingFreesOne) {
  Device dev = open("sim:tiny");  // two channels
  ASSERT_EQ(dev.properties().decode_channels, 2u);
  std::optional<VideoDecoder> a = dev.open_decoder({.max_width = 320, .max_height = 240});
  VideoDecoder b = dev.open_decoder({.max_width = 320, .max_height = 240});
  EXPECT_NE(a->channel(), b.channel());
  try {
    dev.open_decoder({.max_width = 320, .max_height = 240});
    FAIL() << "a third channel opened on a board with two";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::ResourceExhausted);
    EXPECT_THAT(e.what(), HasSubstr("all 2 decoder channels are open"));
  }
  a.reset();
  VideoDecoder c = dev.open_decoder({.max_width = 320, .max_height = 240});
  // The reopened channel decodes correctly.
  const std::string path = path_of("h264_bframes.mp4");
  Demuxer in(path);
  Hasher hash(dev);
  std::vector<std::string> got;
  auto drain = [&] {
    while (auto f = c.receive(std::chrono::seconds(30))) got.push_back(hash(*f));
  };
  while (auto p = in.next()) {
    c.send(p->data, p->pts);
    drain();
  }
  c.flush();
  drain();
  EXPECT_EQ(got, ffmpeg_md5(path));
}

TEST_F(Video, GivenAVirtualClockWhenPacketsArriveAtTheirTimesThenEachFrameIsDoneItsModelledDecodeLater) {
  ::setenv("TPUHAL_SIM_CLOCK", "virtual", 1);
  Device dev = open("sim:bm1684x");
  ::unsetenv("TPUHAL_SIM_CLOCK");
  ASSERT_TRUE(dev.properties().caps.wait_time);
  const std::string path = path_of("h264_camera.h264");
  const auto cost = [&](std::uint64_t frame) {
    const FrameType type = frame % 5 == 0 ? FrameType::Intra : FrameType::Predicted;
    return dev.modelled_decode_ns(Codec::H264, type, 320, 240).value();
  };
  // One camera at 25 fps: each frame is done its decode after its packet
  // arrives (the unit is idle in between), on the model's clock alone.
  {
    VideoDecoder dec = dev.open_decoder({.max_width = 320, .max_height = 240});
    Demuxer in(path);
    const std::uint64_t t0 = dev.board_time_ns().value() + 1'000'000'000;
    std::uint64_t k = 0, frames = 0;
    auto drain = [&] {
      while (auto f = dec.receive(std::chrono::seconds(30))) {
        ASSERT_TRUE(f->decoded_ns());
        EXPECT_EQ(*f->decoded_ns(), t0 + f->packet() * 40'000'000 + cost(f->index())) << "frame " << f->index();
        ++frames;
      }
    };
    while (auto p = in.next()) {
      dec.send_at(t0 + k++ * 40'000'000, p->data, p->pts);
      drain();
    }
    dec.flush();
    drain();
    EXPECT_EQ(frames, 12u);
  }
  // Two cameras whose packets arrive at once share the unit: one frame is
  // done a decode after the other. Which goes first is the order the
  // unit's decode threads reach them; the second packet handed over
  // arrives a command later (the video queue's cost of the first), so the
  // first frame is done a decode after `at`, or after that command.
  VideoDecoder a = dev.open_decoder({.max_width = 320, .max_height = 240});
  VideoDecoder b = dev.open_decoder({.max_width = 320, .max_height = 240});
  Demuxer in(path);
  const auto first = in.next().value();
  const std::uint64_t at = dev.board_time_ns().value() + 1'000'000'000;
  a.send_at(at, first.data, 0);
  b.send_at(at, first.data, 0);
  const auto fa = a.receive(std::chrono::seconds(30)), fb = b.receive(std::chrono::seconds(30));
  ASSERT_TRUE(fa && fb);
  const std::uint64_t ta = fa->decoded_ns().value(), tb = fb->decoded_ns().value();
  const std::uint64_t command = dev.modelled_copy(1, Memory::HostPinned, Memory::Device).value().overhead_ns;
  const std::uint64_t sooner = std::min(ta, tb), later = std::max(ta, tb);
  EXPECT_TRUE(sooner == at + cost(0) || sooner == at + command + cost(0)) << sooner - at << " after arrival";
  EXPECT_EQ(later, sooner + cost(0));
  // Bad input: a time past 2^62 is refused, and the channel goes on.
  try {
    a.send_at((1ull << 62) + 1, first.data, 0);
    FAIL() << "a packet timed past 2^62 was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
  }
  a.send(first.data, 0);
  EXPECT_TRUE(a.receive(std::chrono::seconds(30)));
}

TEST_F(Video, BadOptionsAreRefused) {
  Device dev = open("sim:0");
  auto status_of = [&](VideoDecoderOptions o) {
    try {
      dev.open_decoder(o);
    } catch (const Error& e) {
      return e.status();
    }
    return Status::Ok;
  };
  EXPECT_EQ(status_of({.max_width = 8}), Status::InvalidArgument);
  EXPECT_EQ(status_of({.max_height = 10000}), Status::InvalidArgument);
  EXPECT_EQ(status_of({.frame_buffers = 0}), Status::InvalidArgument);
  EXPECT_EQ(status_of({.frame_buffers = 65}), Status::InvalidArgument);
  EXPECT_EQ(status_of({.codec = static_cast<Codec>(9)}), Status::Unsupported);
  VideoDecoder d = dev.open_decoder({});
  EXPECT_THROW(d.send(std::span<const std::byte>{}), Error);
}

TEST_F(Video, FrameLargerThanTheChannelIsOutOfRangeAndNamesThePacket) {
  Device dev = open("sim:0");
  Demuxer in(path_of("h264_720p.mkv"));
  VideoDecoder dec = dev.open_decoder({.codec = Codec::H264, .max_width = 640, .max_height = 480});
  std::vector<std::string> errors;
  int frames = 0;
  while (auto p = in.next()) dec.send(p->data, p->pts);
  dec.flush();
  for (;;) {
    try {
      auto f = dec.receive(std::chrono::seconds(30));
      if (!f) break;
      ++frames;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::OutOfRange) << e.what();
      errors.push_back(e.what());
    }
  }
  EXPECT_EQ(frames, 0);
  EXPECT_EQ(errors.size(), 8u);
  ASSERT_FALSE(errors.empty());
  EXPECT_THAT(errors[0], HasSubstr("larger than the channel's frame buffers"));
}

TEST_F(Video, HoldingEveryFrameBufferIsAClearErrorAndDroppingOneResumes) {
  Device dev = open("sim:0");
  Demuxer in(path_of("h264_bframes.mp4"));
  VideoDecoder dec = dev.open_decoder({.codec = Codec::H264, .max_width = 320, .max_height = 240, .frame_buffers = 2});
  std::vector<Demuxer::Packet> packets;
  while (auto p = in.next()) packets.push_back(std::move(*p));
  for (auto& p : packets) dec.send(p.data, p.pts);
  std::vector<Frame> held;
  held.push_back(*dec.receive(std::chrono::seconds(30)));
  held.push_back(*dec.receive(std::chrono::seconds(30)));
  try {
    dec.receive(std::chrono::seconds(30));
    FAIL() << "a third frame came out of two frame buffers";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::ResourceExhausted);
    EXPECT_THAT(e.what(), HasSubstr("holds all 2 frame buffers"));
  }
  held.erase(held.begin());
  auto next = dec.receive(std::chrono::seconds(30));
  ASSERT_TRUE(next);
  EXPECT_EQ(next->index(), 2u);
  held.clear();
  next.reset();
  dec.flush();
  int rest = 0;
  while (auto f = dec.receive(std::chrono::seconds(30))) ++rest;
  EXPECT_EQ(rest, 27);
}

// Finding: the codec unit copied every packet into a queue without bound,
// so a client that held its frames (the channel then stops draining) and
// sent large packets grew the board's (the daemon's) memory without end.
// Packets and the decoders' frames are now charged to the unit's working
// memory (the tiny profile's: 256 MiB); the packet past it is refused with
// an error naming that memory, and closing the decoder gives it all back.
TEST_F(Video, PacketsPastTheCodecUnitsMemoryAreRefusedAndClosingGivesItBack) {
  Device dev = open("sim:tiny");
  std::vector<Demuxer::Packet> packets;
  Demuxer in(path_of("h264_odd.h264"));
  while (auto p = in.next()) packets.push_back(std::move(*p));
  const VideoDecoderOptions o{.codec = Codec::H264, .max_width = 322, .max_height = 182, .frame_buffers = 2};
  std::string error;
  {
    VideoDecoder dec = dev.open_decoder(o);
    // Annex B allows zero bytes after a picture: each packet decodes as
    // before, and takes 8 MiB of the unit while it waits.
    constexpr std::size_t kPacket = 8 << 20;
    try {
      // Nothing is received: after two frames the channel waits for a
      // frame buffer and its packets pile up. 2 x 25 x 8 MiB is far past
      // 256 MiB.
      for (int round = 0; round < 2; ++round)
        for (const auto& p : packets) {
          std::vector<std::byte> big(kPacket);
          std::memcpy(big.data(), p.data.data(), p.data.size());
          dec.send(big, p.pts);
        }
      dec.receive(std::chrono::seconds(60));
      dec.receive(std::chrono::seconds(60));
      dec.receive(std::chrono::seconds(60));
      FAIL() << "50 packets of 8 MiB were all queued in the unit's 256 MiB";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::ResourceExhausted) << e.what();
      error = e.what();
    }
  }
  EXPECT_THAT(error, HasSubstr("the codec unit's working memory (256 MiB"));
  // The memory came back: a new decoder on the device decodes every frame.
  VideoDecoder dec = dev.open_decoder(o);
  for (const auto& p : packets) dec.send(p.data, p.pts);
  dec.flush();
  std::size_t frames = 0;
  while (auto f = dec.receive(std::chrono::seconds(60))) ++frames;
  EXPECT_EQ(frames, packets.size());
}

// A decoder of 2 frame buffers that waits `wait` for one, fed the 30 frames
// of h264_bframes.mp4.
VideoDecoder two_buffers_with_every_packet_sent(Device& dev, std::chrono::milliseconds wait) {
  VideoDecoder dec = dev.open_decoder(
      {.codec = Codec::H264, .max_width = 320, .max_height = 240, .frame_buffers = 2, .frame_buffer_wait = wait});
  Demuxer in(path_of("h264_bframes.mp4"));
  while (auto p = in.next()) dec.send(p->data, p->pts);
  return dec;
}

// A display or an encoder on another thread holds the frames for a while:
// with frame_buffer_wait, receive() waits for one to be dropped instead of
// failing, and every frame comes out.
TEST_F(Video, GivenAFrameBufferWaitWhenAnotherThreadHoldsEveryFrameThenReceiveWaitsForOne) {
  Device dev = open("sim:0");
  VideoDecoder dec = two_buffers_with_every_packet_sent(dev, std::chrono::seconds(60));
  dec.flush();
  // The consumer keeps the last frame it was given until the next one
  // arrives: with it and the frame on its way, both buffers are held, and
  // the decoder's next receive() mostly finds the board waiting for one.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Frame> handed;
  bool done = false;
  std::uint64_t consumed = 0;
  std::thread consumer([&] {
    std::optional<Frame> kept;
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return done || !handed.empty(); });
      if (handed.empty() && done) return;
      Frame f = std::move(handed.front());
      handed.pop_front();
      ++consumed;
      lock.unlock();
      kept = std::move(f);  // the one kept before is dropped here, on this thread
      lock.lock();
    }
  });
  std::vector<std::uint64_t> order;
  for (;;) {
    std::optional<Frame> f = dec.receive(std::chrono::seconds(30));
    if (!f) break;
    order.push_back(f->index());
    std::lock_guard lock(mu);
    handed.push_back(std::move(*f));
    cv.notify_one();
  }
  {
    std::lock_guard lock(mu);
    done = true;
  }
  cv.notify_one();
  consumer.join();
  EXPECT_EQ(order.size(), 30u);
  EXPECT_EQ(consumed, 30u);
  EXPECT_TRUE(dec.end_of_stream());
}

TEST_F(Video, GivenAFrameBufferWaitWhenNoFrameIsDroppedThenReceiveFailsAfterItAndInterruptEndsItEarly) {
  Device dev = open("sim:0");
  VideoDecoder dec = two_buffers_with_every_packet_sent(dev, std::chrono::milliseconds(200));
  std::vector<Frame> held;
  held.push_back(*dec.receive(std::chrono::seconds(30)));
  held.push_back(*dec.receive(std::chrono::seconds(30)));
  // try_receive() never waits: nothing now.
  EXPECT_FALSE(dec.try_receive());
  // Nobody drops one: after the wait, the same error as without it.
  try {
    dec.receive(std::chrono::seconds(30));
    FAIL() << "a third frame came out of two frame buffers";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::ResourceExhausted);
    EXPECT_THAT(e.what(), HasSubstr("holds all 2 frame buffers"));
    EXPECT_THAT(e.what(), HasSubstr("none came back for 200 ms"));
  }
  // interrupt() from another thread ends a wait at once: nullopt, and the
  // stream goes on (a wait of 60 s, which the test would notice).
  VideoDecoder patient = dec;
  std::atomic<bool> waiting{false};
  std::thread other([&] {
    while (!waiting) std::this_thread::yield();
    patient.interrupt();
  });
  waiting = true;
  // (The interrupt may come before or during the wait: either way it ends it.)
  const auto f = dec.receive(std::chrono::seconds(60));
  other.join();
  EXPECT_FALSE(f);
  EXPECT_FALSE(dec.end_of_stream());
  held.erase(held.begin());
  auto next = dec.receive(std::chrono::seconds(30));
  ASSERT_TRUE(next);
  EXPECT_EQ(next->index(), 2u);
  // An interrupt with no receive() in progress ends the next one; reset()
  // forgets it.
  dec.interrupt();
  EXPECT_FALSE(dec.receive(std::chrono::seconds(30)));
  dec.interrupt();
  held.clear();
  next.reset();
  dec.reset();
  Demuxer again(path_of("h264_bframes.mp4"));
  while (auto p = again.next()) dec.send(p->data, p->pts);
  dec.flush();
  int frames = 0;
  while (auto g = dec.receive(std::chrono::seconds(30))) ++frames;
  EXPECT_EQ(frames, 30);
  EXPECT_THROW(dev.open_decoder({.frame_buffer_wait = std::chrono::milliseconds(-1)}), Error);
}

TEST_F(Video, FlushEndsTheStreamAndResetStartsANewOne) {
  Device dev = open("sim:0");
  const std::string path = path_of("h265_odd.h265");
  const auto want = ffmpeg_md5(path);
  Demuxer in(path);
  std::vector<Demuxer::Packet> packets;
  while (auto p = in.next()) packets.push_back(std::move(*p));
  VideoDecoder dec = dev.open_decoder({.codec = Codec::H265, .max_width = 256, .max_height = 144});
  Hasher hash(dev);
  // Half the stream, then reset: what was inside is dropped.
  for (std::size_t i = 0; i < packets.size() / 2; ++i) dec.send(packets[i].data, packets[i].pts);
  std::optional<Frame> kept = dec.receive(std::chrono::seconds(30));
  ASSERT_TRUE(kept);
  const std::string kept_md5 = hash(*kept);
  dec.reset();
  EXPECT_EQ(dec.packets_sent(), 0u);
  // A whole stream after the reset decodes exactly; the frame kept from
  // before is untouched.
  std::vector<std::string> got;
  for (auto& p : packets) {
    dec.send(p.data, p.pts);
    while (auto f = dec.receive(std::chrono::seconds(30))) got.push_back(hash(*f));
  }
  dec.flush();
  while (auto f = dec.receive(std::chrono::seconds(30))) got.push_back(hash(*f));
  EXPECT_TRUE(dec.end_of_stream());
  EXPECT_FALSE(dec.receive(std::chrono::seconds(1)));
  EXPECT_EQ(got, want);
  EXPECT_EQ(hash(*kept), kept_md5);
  EXPECT_EQ(kept_md5, want.at(0));
  try {
    dec.send(packets[0].data, 0);
    FAIL() << "send() after flush() was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::FailedPrecondition);
  }
}

TEST_F(Video, ChannelsDrivenFromSeveralThreadsAllDecodeExactly) {
  Device dev = open("sim:0");
  const std::vector<std::string> files{"h264_bframes.mp4", "h265.mkv", "h264_odd.h264", "h265_odd.h265"};
  std::map<std::string, std::vector<std::string>> want;
  for (auto& f : files) want[f] = ffmpeg_md5(path_of(f));
  constexpr int kThreads = 8;
  std::vector<Decoded> got(kThreads);
  std::vector<std::thread> threads;
  Queue copy = dev.queue(Engine::Copy);
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      got[t] =
          decode_file(dev, path_of(files[t % files.size()]), t % 2 ? PixelFormat::I420 : PixelFormat::NV12, {}, copy);
    });
  for (auto& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_THAT(got[t].errors, ::testing::IsEmpty());
    EXPECT_EQ(got[t].md5, want[files[t % files.size()]]) << "thread " << t;
  }
}

TEST_F(Video, TryReceiveNeverWaitsAndEveryFrameComesOut) {
  Device dev = open("sim:0");
  const std::string path = path_of("h264_bframes.mp4");
  const auto want = ffmpeg_md5(path);
  Demuxer in(path);
  VideoDecoderOptions o;
  o.codec = in.codec();
  o.max_width = in.width();
  o.max_height = in.height();
  o.frame_buffers = 8;
  VideoDecoder dec = dev.open_decoder(o);
  Hasher hash(dev);
  std::vector<std::string> got;
  // Nothing sent: nothing to wait for, and no Timeout either.
  EXPECT_FALSE(dec.try_receive());
  while (auto p = in.next()) {
    dec.send(p->data, p->pts);
    if (auto f = dec.try_receive()) got.push_back(hash(*f));
  }
  dec.flush();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!dec.end_of_stream() && std::chrono::steady_clock::now() < deadline) {
    if (auto f = dec.try_receive())
      got.push_back(hash(*f));
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(dec.end_of_stream());
  EXPECT_FALSE(dec.try_receive());
  EXPECT_EQ(got, want);
}

// The load: 192 channels of 360p (and 32 of 1080p) decoding at once,
// driven as a pipelining application does (several packets in flight per
// channel, frames collected with try_receive), every frame of every channel
// hashed against ffmpeg's, and the memory the channels hold fixed when they
// open: nothing grows while they decode, and closing gives it all back.
class ManyChannels : public ::testing::TestWithParam<std::tuple<std::string, std::uint32_t>> {
 protected:
  void SetUp() override {
    if (!have_ffmpeg()) GTEST_SKIP() << "ffmpeg is not installed (scripts/setup.sh installs it)";
  }
};

TEST_P(ManyChannels, DecodeEveryFrameExactlyInBoundedMemory) {
  const std::string& clip = std::get<0>(GetParam());
  const std::uint32_t channels = std::get<1>(GetParam());  // a variable, which lambdas capture
  const std::string path = path_of(clip);
  const auto want = ffmpeg_md5(path);
  ASSERT_FALSE(want.empty());
  std::vector<Demuxer::Packet> packets;
  Demuxer in(path);
  while (auto p = in.next()) packets.push_back(std::move(*p));
  ASSERT_EQ(packets.size(), want.size());

  Device dev = open("sim:0");
  ASSERT_GE(dev.properties().decode_channels, channels);
  Queue copy = dev.queue(Engine::Copy);  // for the hashes; its ring is not the channels'
  const MemoryStats before = dev.memory_stats();
  VideoDecoderOptions o;
  o.codec = Codec::H264;
  o.format = PixelFormat::NV12;
  o.max_width = in.width();
  o.max_height = in.height();
  o.frame_buffers = 4;
  std::vector<VideoDecoder> dec;
  for (std::uint32_t c = 0; c < channels; ++c) dec.push_back(dev.open_decoder(o));
  const MemoryStats opened = dev.memory_stats();
  // What a channel may hold: its frame buffers in device memory (a few
  // pages of alignment each), its page and packet staging in host memory.
  const std::uint64_t frame_bytes = std::uint64_t{in.width()} * in.height() * 3 / 2;
  EXPECT_LE(opened.device_used - before.device_used, channels * o.frame_buffers * (frame_bytes + 16384));
  EXPECT_LE(opened.host_pinned_bytes - before.host_pinned_bytes,
            channels * (std::max<std::uint64_t>(2 * frame_bytes, 256 << 10) + (64 << 10)));

  constexpr std::uint32_t kThreads = 4;
  constexpr std::uint64_t kDepth = 4;
  std::vector<std::vector<std::string>> got(channels);
  std::vector<std::string> errors;
  std::mutex mu;
  std::atomic<bool> grew{false};
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      Hasher hash(dev, copy);
      try {
        auto take = [&](std::uint32_t c, const Frame& f) { got[c].push_back(hash(f)); };
        for (const auto& pkt : packets)
          for (std::uint32_t c = t; c < channels; c += kThreads) {
            while (dec[c].packets_sent() - dec[c].frames_received() >= kDepth)
              if (auto f = dec[c].receive(std::chrono::seconds(60)))
                take(c, *f);
              else
                break;
            dec[c].send(pkt.data, pkt.pts);
            while (auto f = dec[c].try_receive()) take(c, *f);
          }
        const MemoryStats during = dev.memory_stats();
        // Frames live in the pools allocated at open; the hashers' host
        // buffers are the only new memory.
        if (during.device_used != opened.device_used ||
            during.host_pinned_bytes > opened.host_pinned_bytes + kThreads * (frame_bytes + (64 << 10)) + (1 << 20))
          grew = true;
        for (std::uint32_t c = t; c < channels; c += kThreads) dec[c].flush();
        for (std::uint32_t c = t; c < channels; c += kThreads)
          while (auto f = dec[c].receive(std::chrono::seconds(60))) take(c, *f);
      } catch (const std::exception& e) {
        std::lock_guard lock(mu);
        errors.push_back(e.what());
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_THAT(errors, ::testing::IsEmpty());
  EXPECT_FALSE(grew) << "memory grew while the channels decoded";
  for (std::uint32_t c = 0; c < channels; ++c) {
    EXPECT_TRUE(dec[c].end_of_stream()) << "channel " << c;
    ASSERT_EQ(got[c], want) << "channel " << dec[c].channel();
  }
  dec.clear();
  const MemoryStats after = dev.memory_stats();
  EXPECT_EQ(after.device_used, before.device_used);
  EXPECT_LE(after.host_pinned_bytes, before.host_pinned_bytes + (1 << 20));
}

INSTANTIATE_TEST_SUITE_P(Load, ManyChannels,
                         ::testing::Values(std::make_tuple("h264_360p.h264", 192u),
                                           std::make_tuple("h264_1080p.h264", 32u)),
                         [](const auto& p) {
                           return std::to_string(std::get<1>(p.param)) + "_channels_" +
                                  (std::get<0>(p.param).find("1080") != std::string::npos ? "1080p" : "360p");
                         });

TEST_F(Video, FramesFeedTensorOpsWithoutLeavingTheDevice) {
  Device dev = open("sim:0");
  Demuxer in(path_of("jpeg.jpg"));
  VideoDecoder dec = dev.open_decoder({.codec = Codec::Jpeg, .max_width = 640, .max_height = 480});
  dec.send(in.next()->data, 0);
  auto f = dec.receive(std::chrono::seconds(30));
  ASSERT_TRUE(f);
  Buffer rgb = dev.allocate(3ull * 480 * 640 * 4);
  Tensor y(rgb, DType::F32, {3, 480, 640});
  Queue q = dev.queue(Engine::Compute);
  q.run(ops::nv12_to_rgb(f->luma(), f->chroma(), y)).submit().wait();
  // The same conversion on the host from the downloaded planes.
  Hasher h(dev);
  h(*f);
  Buffer out = dev.allocate(rgb.size(), Memory::HostPinned);
  q.copy(rgb, out).submit().wait();
  const auto* px = reinterpret_cast<const float*>(out.map().data());
  const auto* host = reinterpret_cast<const std::uint8_t*>(h.host.map().data());
  const auto planes = f->planes();
  for (int yy : {0, 100, 479})
    for (int xx : {0, 333, 639}) {
      const float Y = host[planes[0].offset + yy * planes[0].pitch + xx];
      const float U = host[planes[1].offset + (yy / 2) * planes[1].pitch + (xx / 2) * 2];
      const float V = host[planes[1].offset + (yy / 2) * planes[1].pitch + (xx / 2) * 2 + 1];
      const float c = 1.164f * (Y - 16);
      const float r = std::clamp(c + 1.596f * (V - 128), 0.0f, 255.0f);
      const float b = std::clamp(c + 2.018f * (U - 128), 0.0f, 255.0f);
      EXPECT_NEAR(px[(0 * 480 + yy) * 640 + xx], r, 1.0f) << yy << "," << xx;
      EXPECT_NEAR(px[(2 * 480 + yy) * 640 + xx], b, 1.0f) << yy << "," << xx;
    }
}

TEST(Demuxer, SaysWhatIsWrongWithAFile) {
  try {
    Demuxer d("/nonexistent/clip.mp4");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::NotFound);
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/clip.mp4"));
  }
  const fs::path junk = fs::temp_directory_path() / ("tpuhal-junk-" + std::to_string(::getpid()) + ".mp4");
  std::ofstream(junk) << "this is not a video";
  try {
    Demuxer d(junk.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr(junk.string()));
  }
  fs::remove(junk);
}

TEST(Demuxer, AUrlThatDoesNotAnswerIsUnavailableWithinItsTimeoutAndBadOptionsAreRefused) {
  // A port nobody listens on: refused at once. A listener that never
  // answers: the timeout ends the wait.
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string silent = "rtsp://127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + "/cam";
  DemuxerOptions o;
  o.timeout = std::chrono::milliseconds(300);
  o.transport = DemuxerOptions::Transport::Tcp;
  const auto started = std::chrono::steady_clock::now();
  try {
    Demuxer d(silent, o);
    FAIL() << "opened a server that never answers";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::Unavailable);
    EXPECT_THAT(e.what(), HasSubstr(silent));
    EXPECT_THAT(e.what(), HasSubstr("no answer within 300 ms"));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(20));
  ::close(listener);

  DemuxerOptions bad;
  bad.max_backoff = std::chrono::milliseconds(10);  // below initial_backoff
  try {
    Demuxer d(silent, bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("max_backoff"));
  }
}

TEST(VideoCaps, BoardsReportTheirCodecUnit) {
  Device dev = open("sim:0");
  EXPECT_TRUE(dev.properties().caps.video_decode);
  EXPECT_GE(dev.properties().decode_channels, 192u);
  EXPECT_EQ(dev.properties().codecs, (std::vector<Codec>{Codec::H264, Codec::H265, Codec::Jpeg}));
}

// FFmpeg is loaded at run time (base/src/ffmpeg.cpp). Without it (here:
// TPUHAL_FFMPEG_DIR names an empty folder to load it from) a simulated
// board offers no decoder and the log says why; reading a file names the
// library and the packages to install; the rest of the board works.
TEST_F(Video, WithoutFfmpegTheBoardHasNoDecoderAndReadingAFileNamesWhatToInstall) {
  const fs::path empty = fs::temp_directory_path() / ("tpuhal-no-ffmpeg-" + std::to_string(::getpid()));
  fs::create_directories(empty);
  const std::string env = "TPUHAL_FFMPEG_DIR=" + empty.string() + " ";
  int rc = -1;
  std::string out = sh(env + "TPUHAL_LOG=warn " + TPUHAL_CLI + " info --json sim:0 2>&1", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_THAT(out, testing::ContainsRegex("\"video_decode\": *false"));
  EXPECT_THAT(out, testing::ContainsRegex("simulated boards have no video decoder: libavutil\\.so\\.[0-9]+ could "
                                          "not be loaded \\(.*\\); install FFmpeg's libavutil[0-9]+ "
                                          "libavcodec[0-9]+"));
  out = sh(
      env + "TPUHAL_LOG=error " + TPUHAL_CLI + " decode --device sim:0 --md5 " + path_of("h264_bframes.mp4") + " 2>&1",
      &rc);
  EXPECT_NE(rc, 0) << out;
  EXPECT_THAT(out, testing::ContainsRegex("h264_bframes\\.mp4: reading video needs FFmpeg: libavutil\\.so\\.[0-9]+ "
                                          "could not be loaded .*; install FFmpeg's libavutil[0-9]+ "
                                          "libavcodec[0-9]+ libavformat[0-9]+"));
  // The board still copies and computes.
  out = sh(env + "TPUHAL_LOG=error " + TPUHAL_CLI + " demo --device sim:0 --size 1MiB --channels 1 2>&1", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_THAT(out, HasSubstr("skipped: sim:0 has no video decoder"));
  fs::remove_all(empty);
  // In this process, with FFmpeg, the same board decodes.
  EXPECT_TRUE(open("sim:0").properties().caps.video_decode);
}

}  // namespace
}  // namespace tpuhal
