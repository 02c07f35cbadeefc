// What the video tests share: clips made at test time with Debian's ffmpeg
// (testsrc2), ffmpeg's own framemd5 of them, and the same hash of a decoded
// Frame pulled to the host. Used by tests/video and tests/faults.
#pragma once

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <cstdio>
#include <span>
#include <sstream>
#include <string>
#include <vector>

extern "C" {
#include <libavutil/md5.h>
#include <libavutil/mem.h>
}

#include "tpuhal/tpuhal.hpp"
#include "tpuhal/video.hpp"

namespace tpuhal::video_test {

// Runs a shell command; returns its standard output (and, in `rc`, its exit
// status).
inline std::string sh(const std::string& cmd, int* rc = nullptr) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  if (rc) *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

inline bool have_ffmpeg() {
  static const bool have = [] {
    int rc = 0;
    sh("ffmpeg -version >/dev/null 2>&1", &rc);
    return rc == 0;
  }();
  return have;
}

// Writes `frames` frames of testsrc2 at `size` (e.g. "320x240") to `path`,
// encoded with the ffmpeg output options `args`; a test failure if ffmpeg
// fails.
inline void make_clip(const std::string& path, const std::string& size, int frames, const std::string& args) {
  const std::string cmd = "ffmpeg -nostdin -loglevel error -y -f lavfi -i testsrc2=size=" + size +
                          ":rate=25 -frames:v " + std::to_string(frames) + " " + args + " " + path + " 2>&1";
  int rc = 0;
  const std::string out = sh(cmd, &rc);
  if (rc != 0) ADD_FAILURE() << cmd << " failed: " << out;
}

// ffmpeg's own hashes, in its output order.
inline std::vector<std::string> ffmpeg_md5(const std::string& path) {
  const std::string out =
      sh("ffmpeg -nostdin -loglevel error -i " + path + " -fps_mode passthrough -f framemd5 - 2>/dev/null");
  std::vector<std::string> md5;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto comma = line.rfind(',');
    std::string h = line.substr(comma + 1);
    h.erase(0, h.find_first_not_of(' '));
    md5.push_back(h);
  }
  return md5;
}

// The MD5 of a frame's planes packed tightly as I420, as framemd5 computes
// it; `host` holds the frame's buffer.
inline std::string md5_i420(const Frame& f, std::span<const std::byte> host) {
  AVMD5* ctx = av_md5_alloc();
  av_md5_init(ctx);
  const auto* base = reinterpret_cast<const std::uint8_t*>(host.data());
  auto planes = f.planes();
  auto add = [&](const Frame::Plane& p, int step, int phase) {
    std::vector<std::uint8_t> row(step == 1 ? p.row_bytes : p.row_bytes / 2);
    for (std::uint32_t r = 0; r < p.rows; ++r) {
      const std::uint8_t* in = base + p.offset + std::uint64_t{r} * p.pitch;
      for (std::size_t x = 0; x < row.size(); ++x) row[x] = in[step * x + phase];
      av_md5_update(ctx, row.data(), static_cast<int>(row.size()));
    }
  };
  add(planes[0], 1, 0);
  if (f.format() == PixelFormat::I420) {
    add(planes[1], 1, 0);
    add(planes[2], 1, 0);
  } else {
    add(planes[1], 2, 0);
    add(planes[1], 2, 1);
  }
  std::uint8_t d[16];
  av_md5_final(ctx, d);
  av_free(ctx);
  char hex[33];
  for (int i = 0; i < 16; ++i) std::snprintf(hex + 2 * i, 3, "%02x", d[i]);
  return hex;
}

// Pulls a frame to the host and hashes it.
struct Hasher {
  Device dev;
  Queue q;
  Buffer host;
  explicit Hasher(Device d) : dev(d), q(d.queue(Engine::Copy)) {}
  Hasher(Device d, Queue shared) : dev(d), q(shared) {}  // queues are thread-safe
  std::string operator()(const Frame& f) {
    const auto& last = f.planes().back();
    const std::uint64_t need = last.offset + std::uint64_t{last.pitch} * last.rows;
    if (!host.valid() || host.size() < need) host = dev.allocate(need, Memory::HostPinned);
    q.copy(f.buffer(), 0, host, 0, need).submit().wait();
    return md5_i420(f, host.map());
  }
};

// A directory of this process for clips made at test time, removed when
// the test program ends.
inline const std::filesystem::path& clip_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("tpuhal-test-clips-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}
struct ClipCleanUp : ::testing::Environment {
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(
        std::filesystem::temp_directory_path() / ("tpuhal-test-clips-" + std::to_string(::getpid())), ec);
  }
};
inline auto* const kClipCleanUp = ::testing::AddGlobalTestEnvironment(new ClipCleanUp);

}  // namespace tpuhal::video_test
