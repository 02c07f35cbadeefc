#!/usr/bin/env bash
# Formats the project's C and C++ sources with clang-format and the
# .clang-format at the root (Google's style, 120 columns).
#
#   scripts/format.sh            rewrite every tracked source in place
#   scripts/format.sh --check    list the sources that differ; exit 1 if any
#   scripts/format.sh FILE...    rewrite only these
#
# Tests run --check (Format.TreeIsFormatted). X-macro tables (*.inc) are
# left as written: one entry per line reads better than any wrapping.
# Exits 77 (a skip, for ctest) where clang-format is not installed
# (scripts/setup.sh installs it) or outside a git checkout.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
format=${CLANG_FORMAT:-clang-format}
if ! command -v "$format" >/dev/null; then
  echo "format.sh: $format is not installed (apt-get install clang-format)" >&2
  exit 77
fi
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "format.sh: not a git checkout: it formats the files git tracks" >&2
  exit 77
fi
check=0
files=()
for a in "$@"; do
  case $a in
    --check) check=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) files+=("$a") ;;
  esac
done
if ((${#files[@]} == 0)); then
  # Tracked and new (not ignored) sources that exist in the work tree.
  while IFS= read -r f; do
    [[ -f $f ]] && files+=("$f")
  done < <(git ls-files --cached --others --exclude-standard '*.c' '*.cpp' '*.h' '*.hpp' | sort -u)
fi
if ((check)); then
  # One clang-format for every file (a process per file took CI a minute):
  # --dry-run names each place that differs; the files are what it names.
  bad=()
  while IFS= read -r f; do
    bad+=("$f")
  done < <("$format" --style=file --dry-run "${files[@]}" 2>&1 |
    sed -n 's/^\(.*\):[0-9]*:[0-9]*: warning: code should be clang-formatted.*/\1/p' | sort -u)
  if ((${#bad[@]})); then
    echo "format.sh: ${#bad[@]} file(s) differ from .clang-format; run scripts/format.sh:" >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format.sh: ${#files[@]} files formatted"
else
  "$format" --style=file -i "${files[@]}"
fi
