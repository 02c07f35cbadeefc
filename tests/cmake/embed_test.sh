#!/usr/bin/env bash
# cmake/TpuhalEmbed.cmake's output compiles, links and holds the bytes it
# was given (read by the assembler's .incbin), 64-byte aligned, with every
# C++ compiler here: GCC builds the demo's tree and clang the test trees,
# and the CUDA kernels' fatbin is embedded this way in both.
#
#   tests/cmake/embed_test.sh SOURCE_DIR
set -euo pipefail
src=${1:?usage: embed_test.sh SOURCE_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

printf '\x00\x01\x7f\x80\xff%s' "$(head -c 100 /dev/zero | tr '\0' 'a')" >"$work/in.bin"
cmake -DIN="$work/in.bin" -DOUT="$work/embedded.cpp" -DNAME=tpuhal_test_bytes -P "$src/cmake/TpuhalEmbed.cmake"
cmake -DOUT="$work/empty.cpp" -DNAME=tpuhal_test_empty -P "$src/cmake/TpuhalEmbed.cmake"
# A file that is not there is named, not embedded as nothing.
if cmake -DIN="$work/missing.bin" -DOUT="$work/missing.cpp" -DNAME=x -P "$src/cmake/TpuhalEmbed.cmake" 2>"$work/err"; then
  echo "an embed of a missing file succeeded"; exit 1
fi
grep -q "missing.bin does not exist" "$work/err" || { cat "$work/err"; echo "the error does not name the file"; exit 1; }
cat >"$work/main.cpp" <<'CPP'
#include <cstdint>
#include <cstdio>
#include <cstring>
extern "C" const unsigned char tpuhal_test_bytes[];
extern "C" const unsigned long long tpuhal_test_bytes_size;
extern "C" const unsigned long long tpuhal_test_empty_size;
int main() {
  unsigned char want[105] = {0x00, 0x01, 0x7f, 0x80, 0xff};
  std::memset(want + 5, 'a', 100);
  if (tpuhal_test_bytes_size != sizeof want || std::memcmp(tpuhal_test_bytes, want, sizeof want) != 0)
    return std::puts("embedded bytes differ from the file"), 1;
  if (reinterpret_cast<std::uintptr_t>(tpuhal_test_bytes) % 64 != 0) return std::puts("not 64-byte aligned"), 1;
  if (tpuhal_test_empty_size != 0) return std::puts("an embed without IN is not empty"), 1;
  return 0;
}
CPP
ran=0
for cxx in g++ clang++; do
  command -v "$cxx" >/dev/null || continue
  "$cxx" -std=c++2b -Wall -Werror "$work/main.cpp" "$work/embedded.cpp" "$work/empty.cpp" -o "$work/t-$cxx"
  "$work/t-$cxx"
  echo "$cxx: ok"
  ran=1
done
[[ $ran == 1 ]] || { echo "no C++ compiler (g++, clang++) found"; exit 77; }
