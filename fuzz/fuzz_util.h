// Helpers shared by the fuzz targets (docs/fuzzing.md).
//
// Each target is one <name>_fuzzer.cpp defining LLVMFuzzerTestOneInput. It
// feeds bytes from "the other side" to a decoder and checks properties of
// what comes back; a property that does not hold is a finding, reported
// through FUZZ_CHECK, which prints it and aborts (libFuzzer then saves the
// input). The same files run under libFuzzer (clang: build/fuzz/, and the
// sanitizer tree scripts/test.sh builds) and under replay_main.cpp in the
// ordinary sanitized test build.
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace tpuhal::fuzz {

[[noreturn]] inline void check_failed(const char* file, int line, const char* expr, const char* format, ...)
    __attribute__((format(printf, 4, 5)));

[[noreturn]] inline void check_failed(const char* file, int line, const char* expr, const char* format, ...) {
  std::fprintf(stderr, "\n%s:%d: fuzz property violated: %s\n  ", file, line, expr);
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::abort();
}

// Reads a T from the first sizeof(T) bytes at p (callers check the length).
template <class T>
T load(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Copies up to sizeof(T) bytes of the input into a zeroed T: short inputs
// leave the tail zero, longer ones are cut.
template <class T>
T load_padded(const std::uint8_t* data, std::size_t size) {
  T v{};
  std::memcpy(&v, data, size < sizeof v ? size : sizeof v);
  return v;
}

// Messages go to people: printable ASCII, no control characters.
inline bool printable(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (c < 0x20 || c > 0x7e) return false;
  return true;
}

}  // namespace tpuhal::fuzz

// Checks a property of the decoded result; on failure prints it with the
// formatted context and aborts.
#define FUZZ_CHECK(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond)) ::tpuhal::fuzz::check_failed(__FILE__, __LINE__, #cond, __VA_ARGS__); \
  } while (0)
