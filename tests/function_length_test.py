#!/usr/bin/python3
"""No function in runtime/src is longer than 80 lines.

The compiler's functions stay short enough to read at once: an ONNX op is a
handler of its own (runtime/src/onnx/), and a fusion a pass of its own. The
lengths come from Universal Ctags (each function definition's first and
last line, its signature included; lambdas count within their function).

  tests/function_length_test.py ROOT              check ROOT/runtime/src
  tests/function_length_test.py --self-test ROOT  check that a planted
                                                  function of 81 lines
                                                  fails, named, and one of
                                                  80 passes

Exits 77 (skipped) where universal-ctags is not installed.
"""

import os
import shutil
import subprocess
import sys
import tempfile

LIMIT = 80
FOLDER = os.path.join("runtime", "src")


def functions(folder):
    """(lines, file, name, first line) of each function defined under folder."""
    sources = sorted(os.path.join(d, f) for d, _, files in os.walk(folder) for f in files
                     if f.endswith((".cpp", ".hpp", ".inc")))
    out = subprocess.run(["ctags", "--languages=C++", "--language-force=C++", "--kinds-C++=f", "--fields=+ne",
                          "-o", "-", *sources], check=True, capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split("\t")
        fields = dict(p.split(":", 1) for p in parts[3:] if ":" in p)
        if "line" in fields and "end" in fields:
            first, last = int(fields["line"]), int(fields["end"])
            found.append((last - first + 1, os.path.relpath(parts[1], folder), parts[0], first))
    return found


def check(root):
    folder = os.path.join(root, FOLDER)
    found = functions(folder)
    if not found:
        print(f"function length: ctags found no functions in {folder}")
        return 1
    long = sorted((f for f in found if f[0] > LIMIT), reverse=True)
    for lines, path, name, first in long:
        print(f"{FOLDER}/{path}:{first}: {name} has {lines} lines; at most {LIMIT} (split it)")
    longest = max(found)
    print(f"function length: {len(found)} functions; the longest, {longest[2]} "
          f"({FOLDER}/{longest[1]}:{longest[3]}), has {longest[0]} lines")
    return 1 if long else 0


def planted(lines):
    body = "".join(f"  total += {i};\n" for i in range(lines - 4))
    return f"int planted_{lines}(int total) {{\n  total += 1;\n{body}  return total;\n}}\n"


def self_test(root):
    with tempfile.TemporaryDirectory(prefix="tpuhal-lengths-") as scratch:
        folder = os.path.join(scratch, FOLDER)
        shutil.copytree(os.path.join(root, FOLDER), folder)
        with open(os.path.join(folder, "planted.cpp"), "w", encoding="utf-8") as f:
            f.write(planted(LIMIT) + "\n" + planted(LIMIT + 1))
        out = subprocess.run([sys.executable, __file__, scratch], capture_output=True, text=True)
        print(out.stdout, end="")
        want = f"planted_{LIMIT + 1} has {LIMIT + 1} lines"
        ok = out.returncode == 1 and want in out.stdout and f"planted_{LIMIT} " not in out.stdout
        print(f"{'ok  ' if ok else 'FAIL'} a planted function of {LIMIT + 1} lines fails, one of {LIMIT} passes")
        return 0 if ok else 1


def main(argv):
    if not shutil.which("ctags"):
        print("function length: universal-ctags is not installed (scripts/setup.sh --test installs it); skipped")
        return 77
    if len(argv) == 2 and argv[0] == "--self-test":
        return self_test(argv[1])
    if len(argv) != 1:
        print(__doc__.strip())
        return 2
    return check(argv[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
