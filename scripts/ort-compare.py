#!/usr/bin/env python3
"""fp32 on the simulated board against ONNX Runtime, model by model.

    /usr/bin/python3 scripts/ort-compare.py --ort DIR [--models resnet50,googlenet]
        [--batches 1,8] [--size 224] [--threads 2] [--iterations 10] [--seconds 2]

For each torchvision model (built as examples/model_zoo/zoo.py builds it:
random weights from seed 0, opset 13) and batch: the model is exported,
compiled in fp32 by `tpuhal compile` and timed by `tpuhal profile -n N`
(its "host time of a run": the median, submit to fence, on random inputs)
with TPUHAL_SIM_THREADS=--threads. Both run in processes of their own:
PyTorch's OpenMP threads, left in this one by the export, would slow the
simulated engine's. ONNX Runtime runs the same file on a standard normal
input with the same thread count under examples/model_zoo/ort_bench.mjs
(npm's onnxruntime-node installed in DIR; the script's header says how),
the better of IEEE arithmetic and flushed denormals. Prints a row per model
and batch: both times in ms and ONNX Runtime's time over ours (above 1: we
are faster). Exit status 77 without PyTorch or Node.js.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ZOO = os.path.join(HERE, "..", "examples", "model_zoo")
SKIP = 77


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--ort", required=True, metavar="DIR", help="where onnxruntime-node is installed (npm)")
    ap.add_argument("--models", default="resnet18,resnet50,mobilenet_v2,googlenet,densenet121,efficientnet_b0",
                    help="comma-separated torchvision models")
    ap.add_argument("--batches", default="1,8", help="comma-separated batch sizes (default 1,8)")
    ap.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads on both sides (default: every CPU)")
    ap.add_argument("--iterations", type=int, default=10, help="timed runs of ours (default 10)")
    ap.add_argument("--tpuhal", default=os.path.join(HERE, "..", "build", "bin", "tpuhal"),
                    help="the tpuhal CLI (default: build/bin/tpuhal)")
    ap.add_argument("--seconds", type=float, default=2.0, help="timed seconds of ONNX Runtime's (default 2)")
    args = ap.parse_args()
    if not os.path.isdir(os.path.join(args.ort, "node_modules", "onnxruntime-node")):
        ap.error(f"{args.ort} has no node_modules/onnxruntime-node (see examples/model_zoo/ort_bench.mjs)")
    if shutil.which("node") is None:
        print("ort-compare: skipped, no node on PATH (Debian: nodejs)", file=sys.stderr)
        return SKIP
    if not os.access(args.tpuhal, os.X_OK):
        ap.error(f"--tpuhal: {args.tpuhal} is not an executable (build it: bash scripts/demo.sh)")
    env = dict(os.environ, TPUHAL_SIM_THREADS=str(args.threads), TPUHAL_SIM_CLOCK="host", TPUHAL_LOG="error")
    try:
        import torch
    except ImportError as e:
        print(f"ort-compare: skipped, {e} (Debian: python3-torch python3-torchvision)", file=sys.stderr)
        return SKIP
    sys.path.insert(0, ZOO)
    import zoo  # noqa: E402 - the zoo's builders and export

    torch.set_num_threads(args.threads)
    models = zoo.zoo()
    batches = [int(b) for b in args.batches.split(",")]
    print(f"{'model':<28} {'batch':>5} {'tpuhal ms':>10} {'ORT ms':>8} {'ORT/ours':>9}", flush=True)
    with tempfile.TemporaryDirectory(prefix="tpuhal-ort-") as tmp:
        for name in args.models.split(","):
            if name not in models:
                ap.error(f"unknown model '{name}'")
            net = zoo.build(*models[name])
            for batch in batches:
                x = np.random.default_rng(0).standard_normal((batch, 3, args.size, args.size), dtype=np.float32)
                path, xin = os.path.join(tmp, f"{name}_{batch}.onnx"), os.path.join(tmp, "input.bin")
                tpm = os.path.join(tmp, "model.tpm")
                zoo.export(net, torch.from_numpy(x), path)
                subprocess.run([args.tpuhal, "compile", path, "-o", tpm, "--precision", "fp32"], env=env,
                               capture_output=True, text=True, check=True)
                done = subprocess.run([args.tpuhal, "profile", tpm, "-n", str(args.iterations), "--json"], env=env,
                                      capture_output=True, text=True, check=True)
                ours = json.loads(done.stdout)["run_ns"] / 1e6
                x.tofile(xin)
                done = subprocess.run(["node", os.path.join(ZOO, "ort_bench.mjs"), "--modules", args.ort,
                                       "--model", path, "--input", xin, "--shape", "x".join(map(str, x.shape)),
                                       "--threads", str(args.threads), "--seconds", str(args.seconds)],
                                      capture_output=True, text=True, check=True)
                ort = 1000.0 * batch / json.loads(done.stdout.strip().splitlines()[-1])["images_per_s"]
                print(f"{name:<28} {batch:>5} {ours:>10.1f} {ort:>8.1f} {ort / ours:>9.2f}", flush=True)
                os.remove(path)
                os.remove(tpm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
