#!/usr/bin/env bash
# The ctest step under load, as a shared CI runner gives it: busy processes
# at normal priority (one per core by default) beside ctest run at twice
# the cores. The families that are most sensitive to timing and scheduling
# (video, GStreamer and live streams in Python, the simulator daemon, the
# conformance suite, traces, the fleet tools) run --repeat until-fail:3.
# A few slow tests that do not depend on timing are left out (below).
# Repeats the whole step --runs times and prints, per test, how many runs
# it failed in. Exits 1 if any test failed.
#
#   scripts/load-test.sh [--build DIR] [--runs N] [--hogs N] [--jobs N] [--repeat N] [--only REGEX]
#                        [--alongside CMD] [--then CMD]
#
#   --build DIR   a configured and built tree (default build/sanitize, what
#                 scripts/test.sh builds)
#   --runs N      whole runs (default 1; an overnight hunt: 10 or more)
#   --hogs N      busy processes at nice 0 (default: one per core)
#   --jobs N      ctest -j (default: twice the cores)
#   --repeat N    until-fail count of the sensitive families (default 3)
#   --only REGEX  only the tests ctest -R selects, each until it fails
#   --alongside CMD  in the first run, the busy work is CMD (a shell
#                 command that keeps about as many processes busy, such as
#                 a build at -j cores) until it ends, and the busy
#                 processes only after; the run waits for CMD, whose
#                 output goes to DIR/load-test/alongside.log, and fails if
#                 it fails. scripts/test.sh builds and runs its
#                 ThreadSanitizer, fuzzing and arm64 steps so, in place of
#                 spinning.
#   --then CMD    in the first run, after the tests, run this one (a shell
#                 command; its output goes to stderr and to
#                 DIR/load-test/then.log) beside what still runs
#                 --alongside, whose busy processes stop as soon as that is
#                 done, and fail if it fails: work that does not depend on
#                 timing fills the time the alongside work still needs.
#                 scripts/test.sh runs the tensor tests at every
#                 instruction-set level so.
#   --skipped     print the regular expression of the tests a run leaves
#                 out (below) and exit
#
# Run by scripts/test.sh (CI) once: its main pass, with the left-out tests
# run quietly before it. Logs of failed runs stay in DIR/load-test/; a
# failed single run prints its log, and then, last, why it failed: the
# tail of what failed alongside or after it and every line there that
# names a failure.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build/sanitize
runs=1
hogs=$(nproc)
jobs=$((2 * $(nproc)))
repeat=3
only=
print_skipped=
alongside=
then=
while (($#)); do
  case $1 in
    --build) build=$(cd "$2" && pwd); shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --hogs) hogs=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --skipped) print_skipped=1; shift ;;
    --alongside) alongside=$2; shift 2 ;;
    --then) then=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "load-test: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
[[ -f $build/CTestTestfile.cmake ]] || { echo "load-test: $build is not a built tree (scripts/test.sh builds one)" >&2; exit 2; }

# Left out of the busy pass (they run in the quiet one): checks of the tree
# (formatting, an installed consumer build), numerics that do not depend on
# timing (the model zoo and the speed table's script, the integer kernels
# at every level, which scripts/test.sh also runs once per level), and the
# QEMU guests, which emulate a whole machine and would take 5 minutes here
# alone.
skip='^(Format\.|Install\.|Python\.Install$|ModelZoo\.|Python\.model_zoo$|Python\.model_bench$|TensorIsa\.|Qemu\.)'
if [[ -n $print_skipped ]]; then
  echo "$skip"
  exit 0
fi
# The families run again until they fail (ctest -R).
families='^(Python\.(video|gstreamer|live_video|fleet|trace|Examples\.VideoPipeline)|Simd\.|Devices/Conformance|Devices/ConformanceErrors|Trace\.|Cli\.Trace|Examples\.VideoPipeline)'

busy=()
start_hogs() {
  for ((i = 0; i < hogs; ++i)); do
    bash -c 'while :; do :; done' &
    busy+=($!)
  done
}
stop_hogs() {
  if ((${#busy[@]})); then
    kill "${busy[@]}" 2>/dev/null || true
    wait "${busy[@]}" 2>/dev/null || true
  fi
  busy=()
}
# --alongside: CMD, then busy processes until the run ends, in a session of
# their own (so that an interrupted run stops the whole of it).
along_pid=
start_alongside() {
  rm -f "$logs/alongside.status"
  setsid bash -c '
    st=0
    bash -c "$1" || st=$?
    echo "$st" >"$2.status"
    for ((i = 0; i < $3; ++i)); do bash -c "while :; do :; done" & done
    wait' alongside "$alongside" "$logs/alongside" "$hogs" >"$logs/alongside.log" 2>&1 &
  along_pid=$!
}
# Waits for CMD (not for the busy processes after it), then stops the
# session; returns CMD's status.
stop_alongside() {
  [[ -n $along_pid ]] || return 0
  while [[ ! -f $logs/alongside.status ]] && kill -0 "$along_pid" 2>/dev/null; do sleep 1; done
  kill -- -"$along_pid" 2>/dev/null || true
  wait "$along_pid" 2>/dev/null || true
  along_pid=
  local st
  st=$(cat "$logs/alongside.status" 2>/dev/null || echo 1)
  return "$st"
}
then_pid=
trap 'stop_hogs; [[ -z $along_pid ]] || kill -- -"$along_pid" 2>/dev/null || true; [[ -z $then_pid ]] || kill "$then_pid" 2>/dev/null || true' EXIT

# The sanitizers' settings scripts/test.sh runs with.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
logs=$build/load-test
mkdir -p "$logs"
declare -A failed=()
all_causes=()
any_failed=0
started=$(date +%s)
# The lines of a log that name a failure, and the steps' own headings,
# which say where: ctest's failed, timed-out and crashed tests, gtest's
# failed tests and assertions, and the tools' errors, each once, in order.
failure_lines() {
  grep -E '^tpuhal test: |\*\*\*(Failed|Timeout|Exception|Not Run)|^\[  FAILED  \]|: Failure$|Errors while running|ERROR|[Ff]atal error|error:|Killed' "$1" |
    awk '!seen[$0]++' | tail -n 40 | sed 's/^/  ! /' || true
}
# One ctest pass; its failed tests are appended to `fails`.
pass() {
  local st=0
  (cd "$build" && ctest --output-on-failure -j "$jobs" "$@") >>"$log" 2>&1 || st=1
  if ((st)) && [[ -f $build/Testing/Temporary/LastTestsFailed.log ]]; then
    local more
    mapfile -t more < <(sed 's/^[0-9]*://' "$build/Testing/Temporary/LastTestsFailed.log")
    fails+=("${more[@]}")
  fi
  return $st
}
for ((run = 1; run <= runs; ++run)); do
  echo "load-test: run $run of $runs: $hogs busy process(es), ctest -j $jobs" >&2
  log=$logs/run-$run.log
  : >"$log"
  fails=()
  causes=()
  cause_logs=()
  status=0
  ctest_failed=0
  if [[ -n $alongside ]] && ((run == 1)); then start_alongside; else start_hogs; fi
  if [[ -n $only ]]; then
    pass --repeat until-fail:"$repeat" -R "$only" || ctest_failed=1
  else
    # Everything else once, the families until they fail.
    pass -E "$families|$skip" || ctest_failed=1
    pass --repeat until-fail:"$repeat" -R "$families" || ctest_failed=1
  fi
  stop_hogs
  ((!ctest_failed)) || status=1
  # --then's CMD beside what still runs alongside, whose busy processes are
  # stopped as soon as it is done (below), so that CMD finishes quietly.
  then_pid=
  if [[ -n $then ]] && ((run == 1)); then
    echo "load-test: then: $then" >&2
    # Its status goes to a file, as CMD's alongside does: `wait PID` alone
    # loses it where the PID is reused after the job ended (pid_max is
    # 32768 here, and a CI run starts more processes than that), and says
    # "not a child of this shell".
    # Its output goes to then.log too (through tee, which the status waits
    # for): on a failure its failed tests are
    # printed again at the end, where a CI log's tail shows them.
    rm -f "$logs/then.status"
    bash -c 'bash -c "$1" 2>&1 | tee "$3" >&2; echo "${PIPESTATUS[0]}" >"$2"' \
      then "$then" "$logs/then.status" "$logs/then.log" &
    then_pid=$!
  fi
  if [[ -n $along_pid ]]; then
    echo "load-test: waiting for what ran alongside (log: $logs/alongside.log)" >&2
    if ! stop_alongside; then
      causes+=("what ran alongside failed: $alongside (log: $logs/alongside.log)")
      cause_logs+=("$logs/alongside.log")
      any_failed=1
    fi
  fi
  if [[ -n $then_pid ]]; then
    wait "$then_pid" 2>/dev/null || true
    if [[ $(cat "$logs/then.status" 2>/dev/null || echo 1) != 0 ]]; then
      causes+=("failed: $then (log: $logs/then.log)")
      cause_logs+=("$logs/then.log")
      any_failed=1
      status=1
    fi
    then_pid=
  fi
  all_causes+=("${causes[@]}")
  for t in "${fails[@]}"; do
    failed[$t]=$((${failed[$t]:-0} + 1))
    any_failed=1
  done
  if ((status)) || ((${#causes[@]})); then
    # The run's own log first, then what failed beside it: the last lines
    # say why the run failed, which is all a CI log's tail may show.
    echo "load-test: run $run: ${#fails[@]} failed (log: $log)" >&2
    if ((runs == 1 && ctest_failed)); then cat "$log" >&2; fi
    for ((i = 0; i < ${#causes[@]}; ++i)); do
      echo "load-test: ${causes[i]}; its last lines and each line that names a failure:" >&2
      tail -n 60 "${cause_logs[i]}" | sed 's/^/  | /' >&2
      failure_lines "${cause_logs[i]}" >&2
    done
    ((!ctest_failed)) || failure_lines "$log" >&2
  else
    echo "load-test: run $run: every test passed" >&2
    rm -f "$log"
  fi
done
echo "load-test: $runs run(s) in $(($(date +%s) - started)) s under $hogs busy process(es), ctest -j $jobs" >&2
if ((!any_failed)); then
  echo "load-test: no test failed" >&2
  exit 0
fi
if ((${#failed[@]})); then
  echo "load-test: failures per test (runs failed of $runs):" >&2
  for t in "${!failed[@]}"; do printf '  %3d  %s\n' "${failed[$t]}" "$t"; done | sort -rn >&2
fi
for c in "${all_causes[@]}"; do echo "load-test: $c" >&2; done
exit 1
