// Replays inputs through a fuzz target's LLVMFuzzerTestOneInput without
// libFuzzer: the regression test of the ordinary (g++, sanitized) build.
//
//   fuzz_replay_<name> PATH...
//
// Each PATH is a file or a directory whose regular files (recursively, in
// name order) are replayed. A missing directory counts as empty (a target
// without regressions yet); at least one input must be replayed in all. A
// finding aborts, as under libFuzzer, naming the input first. An input that
// takes longer than 10 s (libFuzzer's slow-unit limit) fails the replay too:
// a decoder that can be made to spin is a finding.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace fs = std::filesystem;

constexpr double kSlowSeconds = 10;

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg = argv[i];
    std::error_code ec;
    if (fs::is_regular_file(arg, ec)) {
      inputs.push_back(arg);
    } else if (fs::is_directory(arg, ec)) {
      std::vector<fs::path> found;
      for (const auto& e : fs::recursive_directory_iterator(arg))
        if (e.is_regular_file() && e.path().filename().string()[0] != '.') found.push_back(e.path());
      std::sort(found.begin(), found.end());
      inputs.insert(inputs.end(), found.begin(), found.end());
    } else {
      std::printf("%s: not there (no inputs)\n", arg.c_str());
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "no inputs to replay\n");
    return 1;
  }
  for (const auto& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "%s: cannot read\n", path.c_str());
      return 1;
    }
    const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::fprintf(stderr, "replaying %s (%zu bytes)\n", path.c_str(), bytes.size());
    const auto start = std::chrono::steady_clock::now();
    // A copy of exactly the input's size (never a null pointer, even when
    // empty), as libFuzzer passes it, so that AddressSanitizer sees a read
    // past the end.
    std::unique_ptr<std::uint8_t[]> data(new std::uint8_t[bytes.size()]);
    std::copy(bytes.begin(), bytes.end(), data.get());
    LLVMFuzzerTestOneInput(data.get(), bytes.size());
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    if (took.count() > kSlowSeconds) {
      std::fprintf(stderr, "%s: took %.1f s (more than %.0f s): a slow input\n", path.c_str(), took.count(),
                   kSlowSeconds);
      return 1;
    }
  }
  std::printf("replayed %zu inputs\n", inputs.size());
  return 0;
}
