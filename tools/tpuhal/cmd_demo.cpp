// tpuhal demo: data through a board's DMA engine and command queues, checked
// byte for byte.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include <filesystem>

#include "cli.h"
#include "tpuhal/base/units.h"
#include "tpuhal/base/wait.h"
#include "tpuhal/pipeline/pipeline.hpp"

namespace tpuhal::cli {
namespace {

// A reproducible byte pattern (xorshift64), so that every byte is checked
// against an independent expectation.
void pattern(std::span<std::byte> out, std::uint64_t seed) {
  std::uint64_t x = seed | 1;
  for (std::size_t i = 0; i < out.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out.data() + i, &x, std::min<std::size_t>(8, out.size() - i));
  }
}

// The video-analytics pipeline (pipeline/): camera clips decoded on
// the board, converted, resized and classified there.
int video_pipeline(Device& dev, unsigned channels) {
  if (channels == 0) return 0;
  const Properties& p = dev.properties();
  std::printf("\n== Video analytics: %u camera streams decoded, preprocessed and classified on the board\n", channels);
  if (!p.caps.video_decode || !p.caps.tensor) {
    std::printf("  skipped: %s has no %s\n", dev.uri().c_str(),
                p.caps.video_decode ? "tensor engine" : "video decoder");
    return 0;
  }
  const auto dir = std::filesystem::temp_directory_path() / ("tpuhal-demo-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string clip = pipeline::make_test_clip(dir.string(), "640x360", 90);
  if (clip.empty()) {
    std::printf("  skipped: making the test clip needs ffmpeg (scripts/setup.sh installs it)\n");
    std::filesystem::remove_all(dir);
    return 0;
  }
  std::printf(
      "  each: 640x360 H.264 (3 s at 30 fps) -> decode -> NV12 to RGB, normalise -> resize 64x64\n"
      "        -> classifier (2 convolutions, pool, fully connected, softmax; one recorded Program)\n");
  const auto r = pipeline::run_pipeline(dev, std::vector<std::string>(channels, clip));
  std::filesystem::remove_all(dir);
  std::uint64_t total = 0;
  for (unsigned c = 0; c < channels; ++c) {
    const auto& ch = r.channels[c];
    std::printf("  channel %u: %3llu frames  %7.1f fps  latency %5.1f ms  (last frame: class %d)%s%s\n", c,
                static_cast<unsigned long long>(ch.frames), ch.fps, ch.latency_mean_ms, ch.last_class,
                ch.error.empty() ? "" : "  error: ", ch.error.c_str());
    total += ch.frames;
  }
  std::printf("  total: %llu frames, %.1f fps over %u channels\n", static_cast<unsigned long long>(total), r.total_fps,
              channels);
  if (total != 90ull * channels) {
    std::printf("\nFAILED: %llu frames of %llu came through\n", static_cast<unsigned long long>(total),
                90ull * channels);
    return 1;
  }
  return 0;
}

double gbps(std::uint64_t bytes, std::uint64_t ns) {
  return ns ? static_cast<double>(bytes) / static_cast<double>(ns) : 0.0;
}

}  // namespace

int cmd_demo(const std::vector<std::string>& args) {
  po::options_description opts("Options");
  opts.add_options()("device,d", po::value<std::string>(), "device URI (default: the first device)")(
      "size", po::value<std::string>()->default_value("64MiB"), "bytes to move (e.g. 4MiB)")(
      "channels", po::value<unsigned>()->default_value(4), "camera streams in the video pipeline (0: skip it)");
  po::variables_map vm;
  int rc = 0;
  if (!parse(args, opts, {}, vm,
             "Usage: tpuhal demo [--device URI] [--size BYTES] [--channels N]\n\n"
             "Lists the devices, then on one: fills host memory with a pattern, moves it to device\n"
             "memory on a copy queue, copies and patches it on the device on a compute queue that\n"
             "waits for the copy queue's fence, brings it back, and checks every byte. Then runs the\n"
             "video-analytics pipeline (pipeline/, as examples/video_pipeline runs it) on N camera streams (a test\n"
             "clip made with ffmpeg): decode, NV12 to RGB, resize and classify, all on the board,\n"
             "and prints frames per second per stream and in total.",
             &rc))
    return rc;
  const auto size_arg = vm["size"].as<std::string>();
  const auto parsed = base::parse_bytes(size_arg);
  if (!parsed || *parsed < 4096 || *parsed % 4096) {
    std::fprintf(stderr, "tpuhal demo: --size '%s' must be a multiple of 4 KiB (e.g. 64MiB)\n", size_arg.c_str());
    return 2;
  }
  const std::uint64_t n = *parsed;

  std::printf("== Devices\n");
  for (auto& d : enumerate())
    std::printf("  %-10s %-9s %s, %s\n", d.uri.c_str(), d.driver.c_str(), d.board.c_str(),
                bytes(d.memory_bytes).c_str());

  Device dev = open(pick_device(vm));
  const Properties& p = dev.properties();
  std::printf("\n== Opened %s: %s\n", dev.uri().c_str(), p.board.c_str());
  std::printf("  bus %s, firmware %s, interface %s\n", p.bus.c_str(), p.firmware_version.c_str(),
              p.interface_version.c_str());
  for (auto& h : p.heaps)
    std::printf("  heap %-14s %10s  %s%s\n", h.name.c_str(), bytes(h.size).c_str(), to_string(h.memory),
                h.is_default ? " (default)" : "");

  std::printf("\n== Moving %s through the board\n", bytes(n).c_str());
  Buffer src = dev.allocate(n, Memory::HostPinned);
  Buffer dst = dev.allocate(n, Memory::HostPinned);
  Buffer a = dev.allocate(n);  // device DRAM, default heap
  Buffer b = dev.allocate(n);
  Buffer stamps = dev.allocate(4096, Memory::HostPinned);  // board timestamps
  pattern(src.map(), 0x74707568616cull);
  std::memset(dst.map().data(), 0, n);

  Queue copy = dev.queue(Engine::Copy);
  Queue compute = dev.queue(Engine::Compute);
  const std::uint64_t patch = std::min<std::uint64_t>(n, 4096);
  const std::uint32_t patch_word = 0xC0FFEE00;

  const auto host_start = base::monotonic_ns();
  // Copy queue: host -> device.
  Fence uploaded = copy.batch().timestamp(stamps, 0).copy(src, a).timestamp(stamps, 8).submit();
  // Compute queue: wait for the upload on the device, copy device -> device,
  // patch the tail with a fill, bring it back.
  Fence done = compute.wait(uploaded)
                   .timestamp(stamps, 16)
                   .copy(a, b)
                   .timestamp(stamps, 24)
                   .fill(b, n - patch, patch, patch_word, 4)
                   .copy(b, dst)
                   .timestamp(stamps, 32)
                   .submit();
  done.wait();
  const auto host_ns = base::monotonic_ns() - host_start;

  const auto* t = reinterpret_cast<const std::uint64_t*>(stamps.map().data());
  std::printf("  copy queue %u:    host -> device  %8.2f GB/s   (fence %llu)\n", copy.index(), gbps(n, t[1] - t[0]),
              static_cast<unsigned long long>(uploaded.value()));
  std::printf("  compute queue %u: device -> device %7.2f GB/s   (after waiting on the copy queue's fence)\n",
              compute.index(), gbps(n, t[3] - t[2]));
  std::printf("  compute queue %u: fill + device -> host %.2f GB/s (fence %llu)\n", compute.index(),
              gbps(n + patch, t[4] - t[3]), static_cast<unsigned long long>(done.value()));
  std::printf("  end to end on the host: %.3f ms\n", static_cast<double>(host_ns) / 1e6);

  // Check every byte against an independent copy of the expectation.
  std::vector<std::byte> expect(n);
  pattern(expect, 0x74707568616cull);
  for (std::uint64_t i = n - patch; i < n; i += 4) std::memcpy(&expect[i], &patch_word, 4);
  const auto got = dst.map();
  std::uint64_t wrong = 0, first = n;
  for (std::uint64_t i = 0; i < n; ++i) {
    if (got[i] != expect[i]) {
      if (!wrong) first = i;
      ++wrong;
    }
  }

  std::printf("\n== Memory in use\n");
  for (auto& h : dev.memory_stats().heaps)
    if (h.allocations)
      std::printf("  heap %-14s %s in %llu allocation(s), largest free block %s\n", h.name.c_str(),
                  bytes(h.used).c_str(), static_cast<unsigned long long>(h.allocations), bytes(h.largest_free).c_str());

  std::printf("\n== Bad input is refused with a precise error; the device carries on\n");
  try {
    compute.copy(src, 0, a, n - 16, 32);
  } catch (const Error& e) {
    std::printf("  %s: %s\n", to_string(e.status()), e.what());
  }
  const auto rt0 = base::monotonic_ns();
  const int kTrips = 1000;
  for (int i = 0; i < kTrips; ++i) compute.submit().wait();
  std::printf("  then %d empty commands, each submitted and waited for: %.2f us per round trip\n", kTrips,
              static_cast<double>(base::monotonic_ns() - rt0) / kTrips / 1e3);

  if (wrong) {
    std::printf("\nFAILED: %llu of %llu bytes differ, first at offset %llu\n", static_cast<unsigned long long>(wrong),
                static_cast<unsigned long long>(n), static_cast<unsigned long long>(first));
    return 1;
  }
  std::printf("\nOK: %llu bytes verified after host -> device -> device -> host\n", static_cast<unsigned long long>(n));
  return video_pipeline(dev, vm["channels"].as<unsigned>());
}

}  // namespace tpuhal::cli
