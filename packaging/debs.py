#!/usr/bin/python3
"""Debian packages of tpuhal from a build tree configured for /usr.

  packaging/debs.py --build DIR --out DIR [--maintainer 'NAME <ADDRESS>']

scripts/package.sh configures and builds the tree, then runs this. Each
package is one or more of the build's install components (`cmake --install
--component`, cmake/TpuhalInstall.cmake) plus what packaging/ holds for it
(systemd units, /etc/default files, maintainer scripts), split the way
Debian splits a library: libtpuhal0 (the shared library, its SONAME from
the project's version), libtpuhal-dev, tpuhal-tools, tpuhal-simd,
tpuhal-exporter, python3-tpuhal, gstreamer1.0-tpuhal and, where the build
has it, tpuhal-device-plugin. Every package's library dependencies come
from dpkg-shlibdeps; the package version is the project's (CMakeLists.txt's
project(VERSION)), the one place the SONAME comes from too. libtpuhal0
recommends the FFmpeg libraries it loads at run time for video, so that an
image without video can leave them out (--no-install-recommends).
"""

import argparse
import gzip
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent
DEFAULT_MAINTAINER = "tpuhal maintainers <maintainers@tpuhal.example>"


@dataclass
class Package:
    name: str
    components: list  # cmake install components
    section: str
    summary: str
    description: str
    depends: list = field(default_factory=list)  # beyond dpkg-shlibdeps'; "{v}": this version
    recommends: list = field(default_factory=list)
    suggests: list = field(default_factory=list)
    units: list = field(default_factory=list)  # packaging/systemd/ files, into /lib/systemd/system
    defaults: str = ""  # packaging/default/NAME into /etc/default (a conffile)
    scripts: list = field(default_factory=list)  # packaging/maintscripts/NAME.SCRIPT
    manpages: list = field(default_factory=list)  # (program, section, what it is) made by help2man from --help
    multi_arch: str = ""
    optional: bool = False  # made only where the build has its files


PACKAGES = [
    Package("libtpuhal0", ["runtime"], "libs", "tpuhal: hardware abstraction layer for AI accelerator boards",
            "The shared library of tpuhal, one API for TPU cards over PCIe, TPU SoCs,\n"
            "USB sticks, the built-in simulated boards (sim:), the simulator daemon's\n"
            "boards (simd:) and NVIDIA GPUs through CUDA (cuda:, loaded at run time).",
            multi_arch="same"),
    Package("libtpuhal-dev", ["dev"], "libdevel", "tpuhal: development files",
            "Headers of tpuhal's C and C++ API, the libtpuhal.so link, a CMake package\n"
            "(find_package(tpuhal) gives tpuhal::tpuhal) and a pkg-config file\n"
            "(tpuhal.pc).",
            depends=["libtpuhal0 (= {v})"], multi_arch="same"),
    Package("tpuhal-tools", ["tools"], "utils", "tpuhal: command-line tool for accelerator boards",
            "`tpuhal` lists, describes, monitors (smi), benchmarks and stresses boards;\n"
            "compiles ONNX models for them, profiles and plans capacity; decodes\n"
            "video; writes Container Device Interface specs; and serves Prometheus\n"
            "metrics. Also tpuhal-usb-gadget, a simulated board on a USB device port,\n"
            "and the board profiles in /usr/share/tpuhal/profiles.",
            depends=["libtpuhal0 (= {v})"],
            manpages=[("tpuhal", 1, "command-line tool for accelerator boards"),
                      ("tpuhal-usb-gadget", 8, "a simulated board on a USB device port")]),
    Package("tpuhal-simd", ["simd"], "utils", "tpuhal: simulator daemon sharing simulated boards",
            "tpuhal-simd serves simulated accelerator boards to other processes over a\n"
            "Unix socket, each process on a virtual function of its own, under per-user\n"
            "and per-process quotas. The socket unit listens on /run/tpuhal/simd.sock\n"
            "for members of the group tpuhal and starts the daemon with the first\n"
            "client: TPUHAL_SIMD=/run/tpuhal/simd.sock tpuhal list",
            depends=["adduser"], recommends=["libtpuhal0 (= {v})"],
            units=["tpuhal-simd.socket", "tpuhal-simd.service"], defaults="tpuhal-simd",
            scripts=["postinst", "prerm", "postrm"],
            manpages=[("tpuhal-simd", 8, "simulator daemon sharing simulated boards over a socket")]),
    Package("tpuhal-exporter", [], "utils", "tpuhal: Prometheus exporter service",
            "A systemd service that runs `tpuhal exporter` on 127.0.0.1:9841: every\n"
            "board's telemetry (engine and queue time, DMA, decoded frames, faults,\n"
            "temperature, power, memory) and the simulator daemon's clients.",
            depends=["tpuhal-tools (= {v})", "adduser"], units=["tpuhal-exporter.service"],
            defaults="tpuhal-exporter", scripts=["postinst", "prerm", "postrm"]),
    Package("python3-tpuhal", ["python"], "python", "tpuhal: Python 3 bindings",
            "The tpuhal package for Python 3: devices, buffers as NumPy arrays and\n"
            "DLPack, queues, ops, compiled models and video decode.",
            depends=["python3 (>= 3.11~)", "python3 (<< 3.12)", "python3-numpy", "libtpuhal0 (= {v})"],
            scripts=["postinst", "prerm"]),
    Package("gstreamer1.0-tpuhal", ["gst"], "libs", "tpuhal: GStreamer elements",
            "tpuhaldec, tpuhalconvert and tpuhalinfer: video decode, colour conversion\n"
            "and inference on tpuhal boards in GStreamer pipelines.",
            depends=["libtpuhal0 (= {v})"], multi_arch="same"),
    Package("tpuhal-device-plugin", ["device-plugin"], "admin", "tpuhal: Kubernetes device plugin",
            "tpuhal-device-plugin advertises a node's tpuhal boards to the kubelet\n"
            "(device plugin API v1beta1) and hands them to containers.",
            depends=["libtpuhal0 (= {v})"],
            manpages=[("tpuhal-device-plugin", 8, "Kubernetes device plugin for tpuhal boards")], optional=True),
]


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, **kw)


def cache_value(build, key):
    for line in (build / "CMakeCache.txt").read_text().splitlines():
        if line.startswith(key + ":"):
            return line.split("=", 1)[1]
    sys.exit(f"debs: {build}/CMakeCache.txt has no {key}")


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def stage_package(pkg, build, root):
    """Installs the package's components into root, with its extra files."""
    for component in pkg.components:
        env = dict(os.environ, DESTDIR=str(root))
        run(["cmake", "--install", str(build), "--component", component], env=env, stdout=subprocess.DEVNULL)
    for unit in pkg.units:
        dest = root / "lib/systemd/system"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(HERE / "systemd" / unit, dest / unit)
    if pkg.defaults:
        dest = root / "etc/default"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(HERE / "default" / pkg.defaults, dest / pkg.defaults)


def make_manpages(pkg, root, version):
    """Manual pages from the programs' --help and --version (help2man)."""
    for program, section, name in pkg.manpages:
        binary = root / "usr/bin" / program
        dest = root / f"usr/share/man/man{section}"
        dest.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, LD_LIBRARY_PATH=os.environ.get("TPUHAL_STAGED_LIBDIR", ""), TPUHAL_LOG="error")
        page = run(["help2man", "--no-info", f"--section={section}", f"--version-string={version}",
                    f"--name={name}", str(binary)], env=env,
                   capture_output=True).stdout
        # help2man names the program by the path it ran.
        page = page.replace(str(binary), program)
        with gzip.GzipFile(dest / f"{program}.{section}.gz", "wb", mtime=0, compresslevel=9) as f:
            f.write(page.encode())


def add_docs(pkg, root, version, maintainer, date):
    doc = root / "usr/share/doc" / pkg.name
    doc.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "copyright", doc / "copyright")
    changelog = (f"tpuhal ({version}) unstable; urgency=medium\n\n"
                 f"  * Built from the tpuhal tree by scripts/package.sh.\n\n"
                 f" -- {maintainer}  {date}\n")
    # A native package: its changelog is changelog.gz.
    with gzip.GzipFile(doc / "changelog.gz", "wb", mtime=0, compresslevel=9) as f:
        f.write(changelog.encode())
    if pkg.units:
        shutil.copy(HERE / "README.service.md", doc / "README.md")


def strip_and_set_modes(root):
    """As dh_strip and dh_fixperms do: debug symbols out, 0644 for files
    (shared objects too), 0755 for programs and directories."""
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            continue
        if path.is_dir():
            path.chmod(0o755)
            continue
        rel = path.relative_to(root).as_posix()
        program = rel.startswith("usr/bin/") or rel.startswith("usr/sbin/")
        if is_elf(path):
            run(["strip", "--remove-section=.comment", "--remove-section=.note",
                 *([] if program else ["--strip-unneeded"]), str(path)])
        path.chmod(0o755 if program else 0o644)


def shlib_depends(pkg, root, libdir, version):
    """dpkg-shlibdeps over the package's ELF files: the libraries they load,
    libtpuhal0 among them (from its staged tree and shlibs)."""
    elfs = [str(p) for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink() and is_elf(p)]
    if not elfs:
        return []
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        (work / "debian").mkdir()
        (work / "debian/control").write_text(f"Source: tpuhal\n\nPackage: {pkg.name}\nArchitecture: any\n")
        (work / "debian/shlibs.local").write_text(f"libtpuhal 0 libtpuhal0 (= {version})\n")
        out = run(["dpkg-shlibdeps", "-O", f"-l{libdir}", *[f"-e{e}" for e in elfs]],
                  cwd=work, capture_output=True).stdout
    m = re.search(r"^shlibs:Depends=(.*)$", out, re.M)
    return [d.strip() for d in m.group(1).split(",")] if m else []


def loaded_libraries(build, multiarch):
    """What libtpuhal loads at run time rather than links (FFmpeg, for video:
    base/src/ffmpeg.cpp), named as dpkg-shlibdeps names a linked library:
    from the shlibs file of the package that ships each soname. The build
    says which sonames (TPUHAL_FFMPEG_SONAMES, from the headers' majors)."""
    out = []
    for soname in cache_value(build, "TPUHAL_FFMPEG_SONAMES").split(";"):
        name, major = soname.split(".so.")
        owner = run(["dpkg-query", "-S", f"/usr/lib/{multiarch}/{soname}"], capture_output=True).stdout.split(": ")[0]
        shlibs = run(["dpkg-query", "--control-show", owner, "shlibs"], capture_output=True).stdout
        lines = [line.split(None, 2) for line in shlibs.splitlines()]
        found = [f[2] for f in lines if len(f) == 3 and f[:2] == [name, major]]
        if not found:
            sys.exit(f"debs: {owner}'s shlibs name no {name} {major}")
        out.append(found[0])
    return out


def shlibs_line(version):
    """What a program built against this libtpuhal0 depends on. While the
    major version is 0 the SONAME stays libtpuhal.so.0 and the ABI may
    change with the minor, so a program asks for this minor series: at
    least this version, below the next minor."""
    major, minor = (int(x) for x in version.split(".")[:2])
    upper = f"{major}.{minor + 1}~" if major == 0 else f"{major + 1}~"
    return f"libtpuhal {major} libtpuhal{major} (>= {version}), libtpuhal{major} (<< {upper})\n"


def md5sums(root):
    lines = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink() and not path.relative_to(root).as_posix().startswith("DEBIAN/"):
            lines.append(f"{hashlib.md5(path.read_bytes()).hexdigest()}  {path.relative_to(root).as_posix()}\n")
    return "".join(lines)


def installed_kib(root):
    total = 0
    for path in root.rglob("*"):
        if path.relative_to(root).as_posix().startswith("DEBIAN"):
            continue
        total += 1 if path.is_dir() or path.is_symlink() else (path.stat().st_size + 1023) // 1024
    return total


def merge_depends(*lists):
    seen, out = set(), []
    for d in (d for lst in lists for d in lst):
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def control(pkg, root, version, arch, maintainer, libdir, loaded):
    fields = {
        "Package": pkg.name,
        "Source": "tpuhal",
        "Version": version,
        "Architecture": arch,
        "Maintainer": maintainer,
        "Installed-Size": str(installed_kib(root)),
    }
    if pkg.multi_arch:
        fields["Multi-Arch"] = pkg.multi_arch
    depends = merge_depends(shlib_depends(pkg, root, libdir, version), [d.format(v=version) for d in pkg.depends])
    if pkg.name == "libtpuhal0":
        depends = [d for d in depends if not d.startswith("libtpuhal0")]
    if depends:
        fields["Depends"] = ", ".join(depends)
    recommends = [r.format(v=version) for r in pkg.recommends] + loaded
    if recommends:
        fields["Recommends"] = ", ".join(recommends)
    if pkg.suggests:
        fields["Suggests"] = ", ".join(pkg.suggests)
    fields["Section"] = pkg.section
    fields["Priority"] = "optional"
    fields["Description"] = pkg.summary + "\n" + "\n".join(" " + (line or ".") for line in pkg.description.split("\n"))
    return "".join(f"{k}: {v}\n" for k, v in fields.items())


def build_package(pkg, build, out, version, arch, maintainer, date, libdir_of, loaded):
    root = out / "stage" / pkg.name
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    stage_package(pkg, build, root)
    if pkg.optional and not any(p.is_file() for p in root.rglob("*")):
        shutil.rmtree(root)
        print(f"debs: {pkg.name}: not built (the build has no {', '.join(pkg.components)} component)")
        return None
    make_manpages(pkg, root, version)
    add_docs(pkg, root, version, maintainer, date)
    strip_and_set_modes(root)
    debian = root / "DEBIAN"
    debian.mkdir()
    (debian / "control").write_text(control(pkg, root, version, arch, maintainer, libdir_of, loaded))
    (debian / "md5sums").write_text(md5sums(root))
    if pkg.name == "libtpuhal0":
        (debian / "shlibs").write_text(shlibs_line(version))
        (debian / "triggers").write_text("activate-noawait ldconfig\n")
    if pkg.defaults:
        (debian / "conffiles").write_text(f"/etc/default/{pkg.defaults}\n")
    for script in pkg.scripts:
        shutil.copy(HERE / "maintscripts" / f"{pkg.name}.{script}", debian / script)
    for path in debian.iterdir():
        path.chmod(0o755 if path.name in ("postinst", "prerm", "postrm", "preinst") else 0o644)
    deb = out / f"{pkg.name}_{version}_{arch}.deb"
    run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(deb)], stdout=subprocess.DEVNULL)
    return deb


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", type=Path, required=True, help="a build tree configured with CMAKE_INSTALL_PREFIX=/usr")
    ap.add_argument("--out", type=Path, required=True, help="where the .deb files go")
    ap.add_argument("--maintainer", default=os.environ.get("TPUHAL_MAINTAINER", DEFAULT_MAINTAINER))
    args = ap.parse_args()
    build = args.build.resolve()
    if cache_value(build, "CMAKE_INSTALL_PREFIX") != "/usr":
        sys.exit(f"debs: {build} installs into {cache_value(build, 'CMAKE_INSTALL_PREFIX')}, not /usr "
                 "(scripts/package.sh configures one that does)")
    version = cache_value(build, "CMAKE_PROJECT_VERSION")
    arch = run(["dpkg", "--print-architecture"], capture_output=True).stdout.strip()
    multiarch = run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"], capture_output=True).stdout.strip()
    # A reproducible date: the last commit's, else now.
    date = subprocess.run(["git", "-C", str(SOURCE), "log", "-1", "--format=%aD"], text=True,
                          capture_output=True).stdout.strip() or run(["date", "-R"], capture_output=True).stdout.strip()
    # The same date in the manual pages and the archives' file times
    # (help2man and dpkg-deb read it).
    os.environ.setdefault("SOURCE_DATE_EPOCH", run(["date", "-d", date, "+%s"], capture_output=True).stdout.strip())
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.deb"):
        old.unlink()
    # The library first: the others' dependencies and manual pages need it.
    libdir = out / "stage/libtpuhal0/usr/lib" / multiarch
    os.environ["TPUHAL_STAGED_LIBDIR"] = str(libdir)
    made = []
    for pkg in PACKAGES:
        loaded = loaded_libraries(build, multiarch) if pkg.name == "libtpuhal0" else []
        deb = build_package(pkg, build, out, version, arch, args.maintainer, date, libdir, loaded)
        if deb:
            made.append(deb)
            print(f"debs: {deb.name}")
    shutil.rmtree(out / "stage")
    return 0 if made else 1


if __name__ == "__main__":
    sys.exit(main())
