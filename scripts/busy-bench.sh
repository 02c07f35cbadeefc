#!/usr/bin/env bash
# The tensor engine on a busy machine (docs/benchmarks.md): ResNet-50 at
# batch 1 or another compiled model (`tpuhal profile`, host time of a run)
# and `tpuhal bench conv`, alone, beside one busy process at normal
# priority, beside one at nice 19, and beside one busy process per core;
# each with the engine's team
# following the CPU it gets (the default) and with it fixed
# (TPUHAL_SIM_FIXED_THREADS=1). Prints each figure and its ratio to the
# quiet one.
#
#   scripts/busy-bench.sh [--build DIR] [--runs N] [--model FILE.tpm]
#
# Needs a release build (default build/rel: cmake -B build/rel -G Ninja
# -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPUHAL_BUILD_TESTS=OFF, then
# `cmake --build build/rel --target tpuhal_cli`) and /usr/bin/python3 with
# torch and torchvision (scripts/setup.sh installs them) for ResNet-50,
# exported once into build/busy-bench/ where --model does not name one.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build/rel
runs=20
model_file=
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --model) model_file=$2; shift 2 ;;
    -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "busy-bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
tpuhal=$build/bin/tpuhal
[[ -x $tpuhal ]] || { echo "busy-bench: no $tpuhal (build it first: see --help)" >&2; exit 1; }
work=$root/build/busy-bench
mkdir -p "$work"
if [[ -n $model_file ]]; then
  [[ -f $model_file ]] || { echo "busy-bench: no model file $model_file" >&2; exit 1; }
elif [[ ! -f $work/resnet50.tpm ]]; then
  /usr/bin/python3 - "$work/resnet50.onnx" <<'EOF'
import sys, torch, torchvision
m = torchvision.models.resnet50().eval()
torch.onnx.export(m, torch.randn(1, 3, 224, 224), sys.argv[1], opset_version=13, input_names=["x"],
                  output_names=["y"])
EOF
  TPUHAL_LOG=error "$tpuhal" compile "$work/resnet50.onnx" -o "$work/resnet50.tpm" >/dev/null
fi
model_file=${model_file:-$work/resnet50.tpm}

hogs=()
start_hogs() {  # N NICE
  for ((i = 0; i < $1; ++i)); do
    nice -n "$2" bash -c 'while :; do :; done' &
    hogs+=($!)
  done
}
stop_hogs() {
  if ((${#hogs[@]})); then
    kill "${hogs[@]}" 2>/dev/null || true
    wait "${hogs[@]}" 2>/dev/null || true
  fi
  hogs=()
}
trap stop_hogs EXIT

model() {  # env...: the host time of a run, ms
  env "$@" TPUHAL_LOG=error "$tpuhal" profile "$model_file" --device sim:0 -n "$runs" |
    sed -n 's/.*host time of a run *\([0-9.]*\) ms.*/\1/p'
}
conv() {  # env...: the f32 conv's GFLOPS
  env "$@" TPUHAL_LOG=error "$tpuhal" bench conv --device sim:0 --quick --json |
    sed -n 's/.*"dtype":"f32".*"value":\([0-9.]*\).*/\1/p' | head -1
}

printf '%-26s %-10s %12s %8s %14s %8s\n' load team model_ms ratio conv_f32_GFLOPS ratio
declare -A quiet
for team in adaptive fixed; do
  envs=()
  [[ $team == fixed ]] && envs=(TPUHAL_SIM_FIXED_THREADS=1)
  for load in quiet "1 busy, nice 0" "1 busy, nice 19" "$(nproc) busy, nice 0"; do
    case $load in
      quiet) ;;
      "1 busy, nice 0") start_hogs 1 0 ;;
      "1 busy, nice 19") start_hogs 1 19 ;;
      *) start_hogs "$(nproc)" 0 ;;
    esac
    m=$(model "${envs[@]}")
    c=$(conv "${envs[@]}")
    stop_hogs
    if [[ $load == quiet ]]; then
      quiet[$team.m]=$m
      quiet[$team.c]=$c
    fi
    printf '%-26s %-10s %12s %8.2f %14s %8.2f\n' "$load" "$team" "$m" "$(echo "$m / ${quiet[$team.m]}" | bc -l)" \
      "$c" "$(echo "$c / ${quiet[$team.c]}" | bc -l)"
  done
done
