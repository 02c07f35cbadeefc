#!/usr/bin/env bash
# The Python wheel as a user meets it (docs/packages.md): a fresh venv that
# uses the system's site packages for NumPy, `pip install --no-deps` of the
# wheel, then tpuhal imported from the venv (not from a build tree) and an
# array round-tripped through sim:0; `pip uninstall` leaves nothing of it.
#
#   tests/packages/wheel_test.sh WHEEL
set -euo pipefail
wheel=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "wheel test: FAILED: $*" >&2
  exit 1
}
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install -q --no-deps --no-index "$wheel" || fail "pip install --no-deps $wheel"
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
(cd / && env -u PYTHONPATH -u LD_LIBRARY_PATH "$work/venv/bin/python" - "$site" <<'PY') || fail "import tpuhal from the venv"
import sys
import numpy as np
import tpuhal
assert tpuhal.__file__.startswith(sys.argv[1]), tpuhal.__file__
with tpuhal.open("sim:0") as dev:
    a = np.arange(4096, dtype=np.float32)
    assert (dev.upload(a).download() == a).all()
print("wheel test: tpuhal", tpuhal.__version__, "from", tpuhal.__file__)
PY
"$work/venv/bin/pip" uninstall -q -y tpuhal || fail "pip uninstall"
left=$(find "$site" -maxdepth 1 -name 'tpuhal*')
[[ -z $left ]] || fail "left after pip uninstall: $left"
echo "wheel test: ok ($(basename "$wheel"))"
