#!/usr/bin/python3
"""A Python wheel of tpuhal from a build tree (the one scripts/package.sh makes).

  packaging/wheel.py --build DIR --out DIR

The wheel is for the interpreter the tree was built for (Debian 12's
/usr/bin/python3, tag cp311-cp311-linux_x86_64): the `tpuhal` package of
the build's `python` install component, with libtpuhal.so.0 beside the
extension module, which finds it through an RPATH of $ORIGIN. NumPy, and
the system libraries libtpuhal loads (oneDNN, FFmpeg's, spdlog: the
Depends of the libtpuhal0 package), come from the system:

  python3 -m venv --system-site-packages ENV
  ENV/bin/pip install --no-deps tpuhal-*.whl

python3-wheel's `wheel pack` writes the archive and its RECORD.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def cache_value(build, key):
    for line in (build / "CMakeCache.txt").read_text().splitlines():
        if line.startswith(key + ":"):
            return line.split("=", 1)[1]
    sys.exit(f"wheel: {build}/CMakeCache.txt has no {key}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    build = args.build.resolve()
    version = cache_value(build, "CMAKE_PROJECT_VERSION")
    python = cache_value(build, "TPUHAL_PYTHON")
    # The interpreter's tags: what pip on it accepts.
    tag = subprocess.run([python, "-c", "import sys, sysconfig; v = '%d%d' % sys.version_info[:2]; "
                          "print(f'cp{v}-cp{v}-' + sysconfig.get_platform().replace('-', '_').replace('.', '_'))"],
                         check=True, capture_output=True, text=True).stdout.strip()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("tpuhal-*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        stage = work / "stage"
        subprocess.run(["cmake", "--install", str(build), "--component", "python"], check=True,
                       env=dict(os.environ, DESTDIR=str(stage)), stdout=subprocess.DEVNULL)
        found = [p for p in stage.rglob("tpuhal") if p.is_dir() and (p / "__init__.py").exists()]
        if len(found) != 1:
            sys.exit(f"wheel: the python component of {build} holds no tpuhal package")
        tree = work / f"tpuhal-{version}"
        shutil.copytree(found[0], tree / "tpuhal")
        library = (build / "lib" / "libtpuhal.so.0").resolve()
        shutil.copy(library, tree / "tpuhal" / "libtpuhal.so.0")
        modules = list((tree / "tpuhal").glob("_tpuhal*.so"))
        if len(modules) != 1:
            sys.exit("wheel: no extension module _tpuhal*.so in the python component")
        subprocess.run(["patchelf", "--set-rpath", "$ORIGIN", str(modules[0])], check=True)
        for elf in (modules[0], tree / "tpuhal" / "libtpuhal.so.0"):
            subprocess.run(["strip", "--strip-unneeded", str(elf)], check=True)
        info = tree / f"tpuhal-{version}.dist-info"
        info.mkdir()
        python_version = f"{tag[2]}.{tag[3:tag.index('-')]}"
        (info / "METADATA").write_text(
            "Metadata-Version: 2.1\n"
            "Name: tpuhal\n"
            f"Version: {version}\n"
            "Summary: Hardware abstraction layer and driver SDK for AI accelerator boards\n"
            f"Requires-Python: =={python_version}.*\n"
            "Requires-Dist: numpy\n"
            "\n"
            "The tpuhal Python package. Built for Debian 12: libtpuhal.so.0 inside the wheel loads the\n"
            "system libraries that the libtpuhal0 Debian package depends on.\n")
        (info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: tpuhal packaging/wheel.py\n"
                                    f"Root-Is-Purelib: false\nTag: {tag}\n")
        subprocess.run([sys.executable, "-m", "wheel", "pack", "--dest-dir", str(out), str(tree)], check=True,
                       stdout=subprocess.DEVNULL)
    made = list(out.glob("tpuhal-*.whl"))
    print(f"wheel: {made[0].name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
