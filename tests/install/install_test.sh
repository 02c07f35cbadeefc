#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then builds and runs a
# consumer project against it twice: with find_package(tpuhal) and with
# pkg-config. Arguments: BUILD_DIR SOURCE_DIR [extra compiler/linker flags].
set -euo pipefail
build=$1
source=$2
flags=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -x "$work/prefix/bin/tpuhal"
test -f "$work/prefix/include/tpuhal/tpuhal.hpp"
test -f "$work/prefix/include/tpuhal/tpuhal.h"

# CMake package.
cmake -S "$source/consumer" -B "$work/cmake-build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >/dev/null
cmake --build "$work/cmake-build" >/dev/null
"$work/cmake-build/consumer"
"$work/cmake-build/consumer_c"

# pkg-config.
pcdir=$(dirname "$(find "$work/prefix" -name tpuhal.pc | head -n1)")
export PKG_CONFIG_PATH="$pcdir"
libdir=$(pkg-config --variable=libdir tpuhal)
# shellcheck disable=SC2046,SC2086
"${CXX:-c++}" -std=c++20 $flags "$source/consumer/main.cpp" $(pkg-config --cflags --libs tpuhal) -Wl,-rpath,"$libdir" -o "$work/pc-consumer"
"$work/pc-consumer"

# The installed CLI runs from its prefix.
"$work/prefix/bin/tpuhal" list | grep -q '^sim:0'

# The GStreamer plugin, where it was built: loads from its installed folder
# (finding libtpuhal beside it) and lists its elements.
plugin=$(find "$work/prefix" -name libgsttpuhal.so | head -n1)
if [[ -f $build/gst/libgsttpuhal.so ]]; then
  [[ -n $plugin && $(basename "$(dirname "$plugin")") == gstreamer-1.0 ]] || {
    echo "install test: libgsttpuhal.so is not installed in a gstreamer-1.0 folder" >&2
    exit 1
  }
  # (A sanitized plugin needs its runtime preloaded into gst-inspect-1.0;
  # Python.gstreamer runs it that way.)
  if [[ -z $flags ]] && command -v gst-inspect-1.0 >/dev/null; then
    GST_PLUGIN_PATH=$(dirname "$plugin") GST_REGISTRY="$work/registry.bin" gst-inspect-1.0 tpuhal >"$work/inspect.txt"
    grep tpuhalinfer "$work/inspect.txt" >/dev/null
  fi
fi
echo "install test: ok"
