#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then imports the installed
# package with the interpreter it was built for and checks that it runs on
# the installed libtpuhal. Arguments: BUILD_DIR PYTHON PYTHON_INSTALL_DIR
# (relative to the prefix; an absolute one is outside any prefix: skipped).
set -euo pipefail
build=$1
python=$2
pydir=$3
if [[ $pydir == /* ]]; then
  echo "install test: TPUHAL_PYTHON_INSTALL_DIR=$pydir is absolute; not installing there from a test"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >/dev/null
pkg="$work/prefix/$pydir/tpuhal"
for f in __init__.py _tpuhal.pyi ops.pyi py.typed; do
  test -f "$pkg/$f" || { echo "install test: $pkg/$f missing"; exit 1; }
done
ls "$pkg"/_tpuhal.*.so >/dev/null

cd "$work"
PYTHONPATH="$work/prefix/$pydir" "$python" - "$work/prefix" <<'PY'
import sys
import numpy as np
import tpuhal

prefix = sys.argv[1]
assert tpuhal.__file__.startswith(prefix), tpuhal.__file__
libs = {line.split()[-1] for line in open("/proc/self/maps") if "libtpuhal.so" in line}
assert libs and all(p.startswith(prefix) for p in libs), libs
with tpuhal.open("sim:tiny") as dev:
    a = np.arange(1000, dtype=np.float32)
    assert np.array_equal(dev.upload(a).download(), a)
print("install test: ok")
PY
