#!/usr/bin/env bash
# Builds the fuzz targets (clang's libFuzzer with AddressSanitizer and
# UndefinedBehaviorSanitizer, into build/fuzz/) and runs each on its
# committed corpus (docs/fuzzing.md).
#
#   scripts/fuzz.sh [--seconds N | --runs N] [--target NAME]... [--jobs N]
#                   [--parallel N] [--update-corpus] [--no-build] [--build DIR]
#                   [-- LIBFUZZER_FLAGS...]
#
#   --seconds N      fuzz each target for N seconds (default 30)
#   --runs N         instead, until N inputs have run; the long run is
#                    --runs 10000000
#   --target NAME    only this target (repeatable); default: every
#                    fuzz/*_fuzzer.cpp
#   --jobs N         N libFuzzer processes per target sharing its corpus
#                    (default 1); --runs is split between them
#   --parallel N     fuzz up to N targets at once (default 1; scripts/test.sh
#                    uses one per core)
#   --update-corpus  afterwards, merge the new inputs that add coverage into
#                    fuzz/corpus/NAME/ (to be committed)
#   --no-build       use build/fuzz/ (or --build's DIR) as it is
#   --build-only     build, and run nothing
#   --build DIR      build and work in DIR instead of build/fuzz/ (one
#                    fuzz.sh at a time per directory). With --no-build, DIR
#                    may be any tree configured with TPUHAL_FUZZ=ON:
#                    scripts/test.sh fuzzes in its sanitizer tree,
#                    build/sanitize/.
#
# New inputs go to build/fuzz/work/NAME/corpus/ (emptied first; DIR/work/
# with --build DIR), never into
# the committed corpus unless --update-corpus. A finding stops that target,
# leaves its input in build/fuzz/work/NAME/ (crash-*, timeout-*, ...) and
# makes the script fail; fix it and keep the input as a regression test in
# fuzz/regressions/NAME/.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

build="$root/build/fuzz"
seconds=30
runs=
jobs=1
parallel=1
update=0
build_it=1
run_it=1
targets=()
extra=()
while (($#)); do
  case $1 in
    --seconds) seconds=$2; runs=; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --target) targets+=("$2"); shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --parallel) parallel=$2; shift 2 ;;
    --update-corpus) update=1; shift ;;
    --no-build) build_it=0; shift ;;
    --build-only) run_it=0; shift ;;
    --build) build=$(realpath -m "$2"); shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "fuzz.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done

if ((${#targets[@]} == 0)); then
  for f in "$root"/fuzz/*_fuzzer.cpp; do
    f=${f##*/}
    targets+=("${f%_fuzzer.cpp}")
  done
fi

# Two runs in one directory would empty each other's work directories.
mkdir -p "$build"
exec 9>"$build/.fuzz.lock"
if ! flock -n 9; then
  echo "fuzz.sh: another fuzz.sh is using $build; wait for it, or use --build DIR" >&2
  exit 1
fi

if ((build_it)); then
  # A tree that builds the tests (scripts/test.sh's) keeps its own settings.
  if grep -q '^TPUHAL_BUILD_TESTS:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
    echo "fuzz.sh: $build builds the tests; configure the fuzz targets elsewhere (--build DIR), or run its own with --no-build" >&2
    exit 2
  fi
  "$root/scripts/setup.sh"
  start=$SECONDS
  # OSS-Fuzz's flags for sanitized fuzzing (-O1, line tables only): half
  # the compile time of -O2 -g and as exact a report. No ONNX front end:
  # no target reaches it, and it is a third of what there is to compile.
  CC=${FUZZ_CC:-clang} CXX=${FUZZ_CXX:-clang++} cmake -S "$root" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" -DCMAKE_DISABLE_FIND_PACKAGE_ONNX=ON \
    -DCMAKE_UNITY_BUILD=ON -DTPUHAL_FUZZ=ON -DTPUHAL_BUILD_TESTS=OFF >/dev/null
  cmake --build "$build" --target fuzz
  echo "fuzz.sh: built in $((SECONDS - start)) s"
fi
((run_it)) || exit 0

export TPUHAL_LOG=${TPUHAL_LOG:-error}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

final_stat() {  # final_stat NAME FILES...: the sum of libFuzzer's final stat::NAME over the logs
  awk -v k="stat::$1:" '$1 == k { s += $2 } END { printf "%d", s }' "${@:2}"
}

# Fuzzes one target; leaves its summary line in $build/work/NAME/summary
# (and the tail of its logs on stderr after a finding).
fuzz_one() {
  local t=$1
  local bin="$build/bin/${t}_fuzzer" corpus="$root/fuzz/corpus/$t" work="$build/work/$t"
  rm -rf "$work"
  mkdir -p "$work/corpus"
  local flags=(-print_final_stats=1 -timeout=30 "-artifact_prefix=$work/")
  if [[ -n $runs ]]; then
    flags+=("-runs=$(((runs + jobs - 1) / jobs))")
  else
    flags+=("-max_total_time=$seconds")
  fi
  [[ -f $root/fuzz/$t.dict ]] && flags+=("-dict=$root/fuzz/$t.dict")
  echo "== $t: $([[ -n $runs ]] && echo "$runs runs" || echo "$seconds s"), $jobs job(s), log in $work/"
  local rc=0 t_start=$SECONDS logs
  if ((jobs > 1)); then
    # Each job logs to fuzz-<i>.log in the current directory.
    (cd "$work" && "$bin" "${flags[@]}" -jobs="$jobs" -workers="$jobs" "${extra[@]}" \
      "$work/corpus" "$corpus" >"$work/fuzz.log" 2>&1) || rc=$?
    logs=("$work"/fuzz-*.log)
  else
    "$bin" "${flags[@]}" "${extra[@]}" "$work/corpus" "$corpus" >"$work/fuzz.log" 2>&1 || rc=$?
    logs=("$work/fuzz.log")
  fi
  local execs rate added line
  execs=$(final_stat number_of_executed_units "${logs[@]}")
  rate=$(final_stat average_exec_per_sec "${logs[@]}")
  added=$(final_stat new_units_added "${logs[@]}")
  line=$(printf '%-14s %12s runs in %6s s %9s exec/s %6s new inputs' "$t" "$execs" \
    "$((SECONDS - t_start))" "$rate" "$added")
  local findings=("$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* "$work"/slow-unit-*)
  local found=() f
  for f in "${findings[@]}"; do [[ -e $f ]] && found+=("$f"); done
  if ((rc == 72 && ${#found[@]} == 0)); then
    # libFuzzer's exit status when a signal (Ctrl-C, kill) stopped it.
    line+="  INTERRUPTED"
  elif ((rc != 0 || ${#found[@]} > 0)); then
    line+="  FINDING (exit $rc): ${found[*]:-see the log}"
    tail -n 60 "${logs[@]}" >&2
  elif ((update)); then
    "$bin" -merge=1 "$corpus" "$work/corpus" >"$work/merge.log" 2>&1
    line+="  merged into fuzz/corpus/$t"
  fi
  echo "$line"
  echo "$line" >"$work/summary"
}

for t in "${targets[@]}"; do
  [[ -x $build/bin/${t}_fuzzer ]] || { echo "fuzz.sh: no fuzz target $t ($build/bin/${t}_fuzzer)" >&2; exit 2; }
  [[ -d $root/fuzz/corpus/$t ]] || { echo "fuzz.sh: no seed corpus $root/fuzz/corpus/$t" >&2; exit 2; }
done
# Up to --parallel targets at once.
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n || true; done
  fuzz_one "$t" &
done
wait

failed=()
summary=()
for t in "${targets[@]}"; do
  line=$(cat "$build/work/$t/summary" 2>/dev/null || echo "$t: no result (the run did not finish)")
  summary+=("$line")
  [[ $line == *FINDING* || $line == *INTERRUPTED* || $line == *"no result"* ]] && failed+=("$t")
done

echo "== fuzz.sh summary"
printf '%s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "fuzz.sh: findings (or interruptions) in ${failed[*]}: copy a finding's input to fuzz/regressions/NAME/ once fixed" >&2
  exit 1
fi
