#!/usr/bin/python3
"""roi_align's benchmark: a two-stage detector's box-head pooling on a
simulated board against torchvision's CPU roi_align, the same input on the
same number of threads, and the largest difference between the two.

    /usr/bin/python3 scripts/roi-align-bench.py [--regions 1000] [--channels 256]
        [--threads 2] [--device sim:0] [--json]

The input is Faster R-CNN's: a stride-16 feature map of an 800x1088 image
(50x68), regions anywhere on the image, pooled to 7x7 with sampling_ratio 2,
not aligned (torchvision's default for the box head). Both sides are timed
best of 5, the board's from submit to completion (the op alone: no copies).
Host times depend on this machine and its load; run it on a quiet one.
Needs python3-torch and python3-torchvision (exit status 77 without them).
"""

import argparse
import json
import sys
import time

import numpy as np

try:
    import torch
    import torchvision
except ImportError as e:
    print(f"roi-align-bench: {e}: install python3-torch and python3-torchvision", file=sys.stderr)
    sys.exit(77)

import tpuhal
from tpuhal import ops


def best_s(fn, runs=5):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--regions", type=int, default=1000)
    ap.add_argument("--channels", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2, help="torchvision's threads (the board uses its own)")
    ap.add_argument("--device", default="sim:0")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, args.channels, 50, 68)).astype(np.float32)
    corners = rng.uniform(0, 1088, (args.regions, 4)).astype(np.float32)
    rois = np.concatenate([np.minimum(corners[:, :2], corners[:, 2:]), np.maximum(corners[:, :2], corners[:, 2:])], 1)
    idx = np.zeros(args.regions, np.int32)
    with tpuhal.open(args.device) as dev:
        queue = dev.queue("compute")
        tx, tr, ti = (tpuhal.Tensor(dev.upload(a)) for a in (x, rois, idx))
        y = dev.tensor((args.regions, args.channels, 7, 7), "f32")
        op = ops.roi_align(tx, tr, ti, y, sampling_ratio=2, spatial_scale=1 / 16, half_pixel=False)
        board = best_s(lambda: queue.run(op).submit().wait())
        got = y.download()
    boxes = torch.from_numpy(np.concatenate([idx[:, None].astype(np.float32), rois], 1))
    feature = torch.from_numpy(x)
    host = best_s(lambda: torchvision.ops.roi_align(feature, boxes, (7, 7), 1 / 16, 2, False))
    want = torchvision.ops.roi_align(feature, boxes, (7, 7), 1 / 16, 2, False).numpy()
    figures = {"device": args.device, "regions": args.regions, "channels": args.channels,
               "device_ms": round(board * 1e3, 2), "torchvision_ms": round(host * 1e3, 2),
               "torchvision_over_device": round(host / board, 2),
               "max_abs_difference": float(np.abs(got - want).max())}
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"roi_align, {args.regions} regions x {args.channels} channels to 7x7: {args.device} "
              f"{figures['device_ms']} ms, torchvision ({args.threads} threads) {figures['torchvision_ms']} ms, "
              f"{figures['torchvision_over_device']}x; largest difference {figures['max_abs_difference']:.1e}")


if __name__ == "__main__":
    main(sys.argv[1:])
