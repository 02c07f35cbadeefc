#!/usr/bin/python3
"""Dependencies point down only (docs/architecture.md).

Each folder with code has a rule that lists what it may use: the project
headers it may include (by prefix: `tpuhal/fw/` is firmware_iface's,
`tpuhal/*` the public API's files) and the project targets it may link
(target_link_libraries, and other targets' include folders taken through
$<TARGET_PROPERTY:...>). Anything else fails, naming the file or the
CMakeLists.txt, what it used and the rule's reason. System and third-party
headers and libraries are free; so are a folder's own local headers, as
long as a relative path does not climb into another folder's.

  tests/layering_test.py ROOT              check the tree at ROOT
  tests/layering_test.py --self-test ROOT  in a scratch copy of ROOT, plant
                                           upward edges one at a time and
                                           check that each fails, named

A file is held to the rule of the deepest folder that has one; a target to
the rule of its sources' folders (else of its CMakeLists.txt's). tests/ and
fuzz/ may reach any layer: they test each one from below.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

# The headers of each layer, by include prefix.
BASE = "tpuhal/base/"  # base/: platform helpers
FW = "tpuhal/fw/"  # firmware_iface/: the host<->board contract
SIM = "tpuhal/sim/"  # simulator/
DRIVER = "tpuhal/driver/"  # hal/: the driver interface a backend implements
API = "tpuhal/*"  # hal/: the public API, the files directly under tpuhal/
TPU = "tpuhal/tpu/"  # drivers/tpu/ and its transports' providers
BUS = "tpuhal/bus/"  # drivers/bus/
SIMD = "tpuhal/simd/"  # the simulator daemon's wire protocol
CUDA = "tpuhal/cuda/"
SKELETON = "tpuhal/skeleton/"
RT = "tpuhal/rt/"  # runtime/
PIPELINE = "tpuhal/pipeline/"
BENCH = "tpuhal/bench/"
# The public types the driver interface is written in (what a backend may
# include of the public API besides tpuhal/driver/; not tpuhal.hpp, the
# API a backend serves).
API_TYPES = [
    "tpuhal/types.hpp",
    "tpuhal/error.hpp",
    "tpuhal/export.hpp",
    "tpuhal/status.inc",
    "tpuhal/ops.hpp",
    "tpuhal/op_enums.inc",
    "tpuhal/op_maps.inc",
    "tpuhal/monitor.hpp",
]

# The firmware interface's pure headers: header only, no dependencies, facts
# the board and the host must agree on (the window shape rule, the f16/bf16
# rounding, RoiAlign's sampling). The layers above that may not use the rest
# of the interface include these, through tpuhal_fw's include folder; none
# links its code.
FW_PURE = ["tpuhal/fw/window.h", "tpuhal/fw/planes.h", "tpuhal/fw/half.h", "tpuhal/fw/roi_align.h"]

# Targets every folder may link: build settings, not layers.
FREE_TARGETS = {"tpuhal_warnings"}

TRANSPORT_WHY = "a transport sees the TPU driver, its bus and the driver interface"
TRANSPORT_INCLUDES = [TPU, FW, DRIVER, BASE] + API_TYPES
TRANSPORT_LINKS = ["tpuhal_tpu", "tpuhal_api", "tpuhal_fw", "tpuhal_base"]
NOT_BUS = {BUS: "only the pcie transport stands on the PCI bus layer"}
NOT_SIM = {SIM: "only the sim and usb_sim transports meet the simulator; the others reach boards"}


@dataclass
class Rule:
    folder: str
    why: str
    includes: list
    links: list
    # Reasons more precise than `why` for some refused prefixes.
    why_not: dict = field(default_factory=dict)
    # Targets whose include folders it may take ($<TARGET_PROPERTY:T,
    # INTERFACE_INCLUDE_DIRECTORIES>) without linking them.
    include_targets: list = field(default_factory=list)


RULES = [
    Rule("firmware_iface", "firmware_iface depends on nothing", [FW], []),
    Rule("base", "base is below everything", [BASE], []),
    Rule("simulator", "the simulator never sees a driver or the HAL", [SIM, FW, BASE], ["tpuhal_fw", "tpuhal_base"]),
    Rule("hal", "the HAL knows drivers only through the driver interface", [API, DRIVER, BASE] + FW_PURE,
         ["tpuhal_headers", "tpuhal_api", "tpuhal_base", "tpuhal_providers"], include_targets=["tpuhal_fw"]),
    Rule("drivers/tpu", "the driver reaches the board only through a Transport", [TPU, FW, DRIVER, BASE, API],
         ["tpuhal_api", "tpuhal_fw", "tpuhal_base"]),
    # Every transport folder: the generic rule, or its own below.
    Rule("drivers/tpu/transports", TRANSPORT_WHY, TRANSPORT_INCLUDES, TRANSPORT_LINKS, NOT_BUS | NOT_SIM),
    Rule("drivers/tpu/transports/pcie", TRANSPORT_WHY, TRANSPORT_INCLUDES + [BUS], TRANSPORT_LINKS + ["tpuhal_bus_pci"],
         NOT_SIM),
    Rule("drivers/tpu/transports/sim", TRANSPORT_WHY, TRANSPORT_INCLUDES + [SIM], TRANSPORT_LINKS + ["tpuhal_sim"],
         NOT_BUS),
    Rule("drivers/tpu/transports/usb_sim", TRANSPORT_WHY, TRANSPORT_INCLUDES + [SIM],
         TRANSPORT_LINKS + ["tpuhal_sim", "tpuhal_tpu_usb", "tpuhal_tpu_sim"], NOT_BUS),
    Rule("drivers/tpu/transports/simd", TRANSPORT_WHY, TRANSPORT_INCLUDES + [SIMD],
         TRANSPORT_LINKS + ["tpuhal_simd_proto"], NOT_BUS | NOT_SIM),
    Rule("drivers/tpu/transports/simd/protocol",
         "the daemon's wire protocol, shared by the daemon and the simd transport, sees base only, and the "
         "list of statuses its error replies carry", [SIMD, BASE, "tpuhal/status.inc"], ["tpuhal_base", "tpuhal_headers"]),
    Rule("drivers/bus", "bus code knows no board and nothing above it", [BUS, BASE] + API_TYPES,
         ["tpuhal_api", "tpuhal_base"]),
    Rule("drivers/cuda", "the CUDA shim stands on the driver interface only", [CUDA, DRIVER, BASE] + API_TYPES,
         ["tpuhal_api", "tpuhal_base"]),
    Rule("drivers/skeleton", "the skeleton shows what a new driver stands on: the driver interface",
         [SKELETON, DRIVER, BASE] + API_TYPES, ["tpuhal_api", "tpuhal_base"]),
    Rule("runtime", "the runtime stands on the public API (and the firmware interface's pure headers) only",
         [RT, API] + FW_PURE, ["tpuhal_headers", "tpuhal"], include_targets=["tpuhal_fw"]),
    Rule("bench", "benchmarks measure through the public API", [BENCH, API, BASE], ["tpuhal", "tpuhal_base"]),
    Rule("examples", "examples use the public API, the runtime and the pipeline only", [API, RT, PIPELINE],
         ["tpuhal", "tpuhal_runtime", "tpuhal_pipeline"]),
    Rule("pipeline", "the video pipeline stands on the public API and the runtime", [PIPELINE, API, RT],
         ["tpuhal", "tpuhal_runtime"]),
    Rule("bindings", "the bindings wrap the public API and the runtime", [API, RT, BASE],
         ["tpuhal", "tpuhal_runtime", "tpuhal_base"]),
    Rule("tools/tpuhal",
         "the CLI uses the public API; it meets the simulator through sim: URIs and the daemon",
         [API, BASE, RT, BENCH, PIPELINE],
         ["tpuhal", "tpuhal_runtime", "tpuhal_bench", "tpuhal_base", "tpuhal_pipeline", "tpuhal_fleet"]),
    Rule("tools/tpuhal-simd",
         "the daemon serves simulated boards over the protocol; it never sees a driver or the HAL",
         [SIM, FW, BASE, SIMD], ["tpuhal_sim", "tpuhal_simd_proto", "tpuhal_base"]),
    Rule("tools/fleet", "what a container needs from the host is read from sysfs; it uses no tpuhal layer", [], []),
    Rule("gst", "the GStreamer elements use the public API and the runtime", [API, RT], ["tpuhal", "tpuhal_runtime"]),
    Rule("tools/tpuhal-device-plugin", "the device plugin uses the public API, as the CLI does", [API],
         ["tpuhal", "tpuhal_fleet", "tpuhal_deviceplugin_api"]),
    Rule("tools/tpuhal-usb-gadget", "the gadget is the board's side of the cable", [SIM, FW, BASE],
         ["tpuhal_sim", "tpuhal_base"]),
]

EXEMPT = ("tests", "fuzz", "build")
CODE = (".h", ".hpp", ".cpp", ".c", ".cc", ".inc")
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^">]+)[">]', re.M)


def rule_of(rel_dir):
    """The rule of the deepest folder at or above rel_dir that has one."""
    best = None
    for r in RULES:
        if rel_dir == r.folder or rel_dir.startswith(r.folder + "/"):
            if best is None or len(r.folder) > len(best.folder):
                best = r
    return best


def allowed(header, prefixes):
    for p in prefixes:
        if p == API:
            if header.count("/") == 1:
                return True
        elif p.endswith("/"):
            if header.startswith(p):
                return True
        elif header == p:
            return True
    return False


def layer_of(header):
    """The prefix a refused header is named by in messages."""
    parts = header.split("/")
    return parts[0] + "/" + parts[1] + "/" if len(parts) > 2 else header


def walk_code(root):
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        if rel == ".":
            dirs[:] = [x for x in dirs if x not in EXEMPT and not x.startswith(".")]
        dirs.sort()
        for f in sorted(files):
            if f.endswith(CODE):
                yield ("" if rel == "." else rel), f


def check_includes(root, problems):
    for rel_dir, name in walk_code(root):
        rule = rule_of(rel_dir)
        if rule is None:
            continue  # reported by check_coverage
        path = os.path.join(rel_dir, name)
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for m in INCLUDE.finditer(text):
            header = m.group(2)
            line = text.count("\n", 0, m.start()) + 1
            if header.startswith("tpuhal/"):
                if not allowed(header, rule.includes):
                    why = rule.why_not.get(layer_of(header), rule.why)
                    problems.append(f"layering: {path}:{line} includes {header}: {rule.folder} may not include "
                                    f"{layer_of(header)} ({why})")
            elif m.group(1) == '"' and ".." in header.split("/"):
                target = os.path.normpath(os.path.join(rel_dir, header))
                if rule_of(os.path.dirname(target)) is not rule:
                    problems.append(f"layering: {path}:{line} includes {header}: a relative path out of "
                                    f"{rule.folder} into another folder's sources ({rule.why})")


def check_coverage(root, problems):
    seen = set()
    for rel_dir, _ in walk_code(root):
        if rel_dir in seen:
            continue
        seen.add(rel_dir)
        if rule_of(rel_dir) is None:
            problems.append(f"layering: {rel_dir or '.'} has code and no rule here: add one to tests/layering_test.py")
    for r in RULES:
        if not os.path.isdir(os.path.join(root, r.folder)):
            problems.append(f"layering: there is no folder {r.folder}: update tests/layering_test.py where it moved")


# --- CMake ---------------------------------------------------------------

def cmake_commands(text):
    """(name, args, line) for each command call in a CMake file."""
    out = []
    i, n, line = 0, len(text), 1
    ident = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif c.isalpha() or c == "_":
            m = ident.match(text, i)
            j = m.end()
            while j < n and text[j] in " \t":
                j += 1
            if j < n and text[j] == "(":
                start_line = line
                depth, k, args, cur, quoted = 0, j, [], "", False
                while k < n:
                    ch = text[k]
                    if ch == "\n":
                        line += 1
                    if quoted:
                        if ch == "\\" and k + 1 < n:
                            cur += text[k:k + 2]
                            k += 2
                            continue
                        if ch == '"':
                            quoted = False
                        cur += ch
                    elif ch == '"':
                        quoted = True
                        cur += ch
                    elif ch == "#":
                        while k < n and text[k] != "\n":
                            k += 1
                        continue
                    elif ch == "(":
                        depth += 1
                        if depth > 1:
                            cur += ch
                    elif ch == ")":
                        depth -= 1
                        if depth == 0:
                            break
                        cur += ch
                    elif ch in " \t\n":
                        if cur:
                            args.append(cur)
                            cur = ""
                    else:
                        cur += ch
                    k += 1
                if cur:
                    args.append(cur)
                out.append((m.group(0).lower(), [a.strip('"') for a in args], start_line))
                i = k + 1
            else:
                i = m.end()
        else:
            i += 1
    return out


KEYWORDS = {"PUBLIC", "PRIVATE", "INTERFACE", "STATIC", "SHARED", "OBJECT", "MODULE", "ALIAS", "IMPORTED", "GLOBAL",
            "EXCLUDE_FROM_ALL", "BEFORE", "AFTER", "SYSTEM", "LINK_PUBLIC", "LINK_PRIVATE", "PROVIDER", "SOURCES",
            "LIBS", "WIN32", "MACOSX_BUNDLE"}
TARGET_PROPERTY = re.compile(r"\$<TARGET_PROPERTY:([A-Za-z0-9_:]+),")


@dataclass
class Target:
    name: str
    cmake: str  # the CMakeLists.txt (relative to the root) that defines it
    sources: list = field(default_factory=list)  # source folders, relative to the root
    uses: list = field(default_factory=list)  # (target, file, line)


def cmake_files(root):
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        if rel == ".":
            dirs[:] = [x for x in dirs if x != "build" and not x.startswith(".")]
        dirs.sort()
        for f in sorted(files):
            if f == "CMakeLists.txt" or (f.endswith(".cmake") and os.path.basename(d) == "cmake"):
                yield os.path.normpath(os.path.join(rel, f))


def source_dir(cmake_dir, token):
    """The folder (relative to the root) of a literal source argument, or None
    for one CMake makes or names through a variable."""
    for var in ("${PROJECT_SOURCE_DIR}/", "${CMAKE_SOURCE_DIR}/"):
        if token.startswith(var):
            cmake_dir, token = "", token[len(var):]
    token = token.replace("${CMAKE_CURRENT_SOURCE_DIR}/", "")
    if "${" in token or "$<" in token or not token.endswith(CODE):
        return None
    d = os.path.normpath(os.path.join(cmake_dir, os.path.dirname(token)))
    return "" if d == "." else d


def parse_targets(root):
    targets, aliases = {}, {}
    for cm in cmake_files(root):
        cmake_dir = os.path.dirname(cm)
        with open(os.path.join(root, cm), encoding="utf-8", errors="replace") as f:
            commands = cmake_commands(f.read())
        for name, args, line in commands:
            if not args:
                continue
            if "${" in args[0]:
                continue  # inside a CMake function: its calls name the real targets
            if name in ("add_library", "add_executable", "tpuhal_layer", "tpuhal_transport", "pybind11_add_module"):
                tname = "tpuhal_tpu_" + args[0] if name == "tpuhal_transport" else args[0]
                if len(args) > 2 and args[1] == "ALIAS":
                    aliases[tname] = args[2]
                    continue
                t = targets.setdefault(tname, Target(tname, cm))
                rest = args[1:]
                if name == "tpuhal_transport":
                    srcs, libs, mode = [], ["tpuhal_tpu"], None
                    for a in rest:
                        if a in ("SOURCES", "LIBS"):
                            mode = a
                        elif mode == "SOURCES":
                            srcs.append(a)
                        elif mode == "LIBS":
                            libs.append(a)
                    rest = srcs
                    t.uses += [(lib, cm, line, "links") for lib in libs if lib not in KEYWORDS]
                for a in rest:
                    d = source_dir(cmake_dir, a)
                    if d is not None and d not in t.sources:
                        t.sources.append(d)
            elif name == "target_sources":
                t = targets.setdefault(args[0], Target(args[0], cm))
                for a in args[1:]:
                    d = source_dir(cmake_dir, a)
                    if d is not None and d not in t.sources:
                        t.sources.append(d)
            elif name == "target_link_libraries":
                t = targets.setdefault(args[0], Target(args[0], cm))
                t.uses += [(a, cm, line, "links") for a in args[1:] if a not in KEYWORDS]
            elif name == "target_include_directories":
                t = targets.setdefault(args[0], Target(args[0], cm))
                for a in args[1:]:
                    t.uses += [(m, cm, line, "takes the include folders of") for m in TARGET_PROPERTY.findall(a)]
    return targets, aliases


def check_links(root, problems):
    targets, aliases = parse_targets(root)
    known = set(targets) | set(aliases)

    def rules_of(t):
        dirs = t.sources or [os.path.dirname(t.cmake)]
        out = []
        for d in dirs:
            r = rule_of(d)
            if r is not None and r not in out:
                out.append(r)
        return out

    for t in targets.values():
        if t.cmake.split("/")[0] in EXEMPT:
            continue
        for rule in rules_of(t):
            own = {o.name for o in targets.values() if rule in rules_of(o)}
            for used, cm, line, how in t.uses:
                used = aliases.get(used, used)
                if used not in known or used in FREE_TARGETS or used in own or used in rule.links:
                    continue
                if how != "links" and used in rule.include_targets:
                    continue
                problems.append(f"layering: {cm}:{line}: {t.name} {how} {used}: {rule.folder} may not link {used} "
                                f"({rule.why})")


def check(root):
    problems = []
    check_coverage(root, problems)
    check_includes(root, problems)
    check_links(root, problems)
    for p in problems:
        print(p)
    if not problems:
        print("layering: ok")
    return 1 if problems else 0


# --- self-test -------------------------------------------------------------

# Each plant: files to add or lines to append, and what the report must name.
PLANTS = [
    ("hal includes the runtime",
     {"hal/src/layering_probe.cpp": '#include "tpuhal/rt/model.hpp"\n'},
     ["hal/src/layering_probe.cpp:1 includes tpuhal/rt/model.hpp", "hal may not include tpuhal/rt/",
      "the HAL knows drivers only through the driver interface"]),
    ("hal includes the firmware interface beyond its pure headers",
     {"hal/src/layering_probe.cpp": '#include "tpuhal/fw/window.h"\n#include "tpuhal/fw/tensor.h"\n'},
     ["hal/src/layering_probe.cpp:2 includes tpuhal/fw/tensor.h", "hal may not include tpuhal/fw/"]),
    ("base includes the CUDA shim (from an .inc)",
     {"base/src/layering_probe.inc": '// a table\n#include <tpuhal/cuda/cuda_provider.h>\n'},
     ["base/src/layering_probe.inc:2 includes tpuhal/cuda/cuda_provider.h", "base may not include tpuhal/cuda/",
      "base is below everything"]),
    ("firmware_iface includes the daemon's protocol (from a .c file)",
     {"firmware_iface/src/layering_probe.c": '#include "tpuhal/simd/protocol.h"\n'},
     ["firmware_iface/src/layering_probe.c:1 includes tpuhal/simd/protocol.h",
      "firmware_iface may not include tpuhal/simd/", "firmware_iface depends on nothing"]),
    ("base links the public API",
     {"base/CMakeLists.txt": "target_link_libraries(tpuhal_base PRIVATE tpuhal_api)\n"},
     ["base/CMakeLists.txt:", "tpuhal_base links tpuhal_api", "base may not link tpuhal_api",
      "base is below everything"]),
    ("the HAL links the firmware interface, whose pure headers alone it may take",
     {"hal/CMakeLists.txt": "target_link_libraries(tpuhal_hal PRIVATE tpuhal_fw)\n"},
     ["tpuhal_hal links tpuhal_fw", "hal may not link tpuhal_fw"]),
    ("the simulator links a driver's transport",
     {"simulator/CMakeLists.txt": "target_link_libraries(tpuhal_sim PUBLIC\n  tpuhal_tpu_sim)\n"},
     ["tpuhal_sim links tpuhal_tpu_sim", "simulator may not link tpuhal_tpu_sim",
      "the simulator never sees a driver or the HAL"]),
    ("a transport other than sim meets the simulator",
     {"drivers/tpu/transports/usb/layering_probe.cpp": '#include "tpuhal/sim/board.h"\n'},
     ["drivers/tpu/transports/usb/layering_probe.cpp:1 includes tpuhal/sim/board.h",
      "only the sim and usb_sim transports meet the simulator"]),
    ("a folder with code and no rule",
     {"newlayer/x.cpp": "int x;\n"},
     ["newlayer has code and no rule here"]),
]


def copy_tree(src, dst):
    """The files the checker reads: sources and CMake files."""
    for d, dirs, files in os.walk(src):
        rel = os.path.relpath(d, src)
        if rel == ".":
            dirs[:] = [x for x in dirs if x != "build" and not x.startswith(".")]
        for f in files:
            if f.endswith(CODE) or f == "CMakeLists.txt" or f.endswith(".cmake"):
                os.makedirs(os.path.join(dst, rel), exist_ok=True)
                shutil.copy2(os.path.join(d, f), os.path.join(dst, rel, f))


def run_checker(root):
    r = subprocess.run([sys.executable, os.path.abspath(__file__), root], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def self_test(root):
    failures = 0
    with tempfile.TemporaryDirectory(prefix="tpuhal-layering-") as scratch:
        clean = os.path.join(scratch, "tree")
        copy_tree(root, clean)
        rc, out = run_checker(clean)
        ok = rc == 0 and "layering: ok" in out
        print(f"{'ok  ' if ok else 'FAIL'} the tree as it is passes")
        if not ok:
            print(out)
            failures += 1
        for what, files, expect in PLANTS:  # one at a time, each taken out again after
            saved = {}
            for path, text in files.items():
                full = os.path.join(clean, path)
                saved[full] = open(full, encoding="utf-8").read() if os.path.exists(full) else None
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "a", encoding="utf-8") as f:
                    f.write(("\n" if path.endswith("CMakeLists.txt") else "") + text)
            rc, out = run_checker(clean)
            for full, text in saved.items():
                if text is None:
                    os.remove(full)
                else:
                    with open(full, "w", encoding="utf-8") as f:
                        f.write(text)
            missing = [e for e in expect if e not in out]
            ok = rc == 1 and not missing and "layering: ok" not in out
            print(f"{'ok  ' if ok else 'FAIL'} planted: {what}")
            for line in out.splitlines():
                print(f"       {line}")
            if not ok:
                print(f"       expected exit status 1 and {missing or expect}")
                failures += 1
    print("layering self-test: " + ("ok" if failures == 0 else f"{failures} failed"))
    return 1 if failures else 0


def main(argv):
    if len(argv) == 3 and argv[1] == "--self-test":
        return self_test(argv[2])
    if len(argv) == 2 and not argv[1].startswith("-"):
        return check(argv[1])
    print(__doc__.strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
