#!/usr/bin/python3
"""The detection benchmark (docs/runtime.md, "Detectors: boxes out"): a
YOLOv8s (scripts/timing/models.py, random weights) compiled with --detect,
its frames per second and the share of each frame spent in
post-processing, against PyTorch with torchvision's nms on the host.

    /usr/bin/python3 scripts/detect-bench.py [--size 640] [--frames 20]
        [--precision fp32,int8] [--device sim:0] [--json]

Per precision it prints, for tpuhal: frames per second on this host (one
instance, run() end to end, inputs and outputs copied), the Detect layer's
time and share of a run by `Instance.profile` on the host's clock
(TPUHAL_SIM_CLOCK=host), and where the device has a timing model (sim:0, the
BM1684X-class board) the modelled time per frame and the Detect layer's
share of it. For PyTorch (the same network, fp32, on the host's threads):
frames per second (on as many threads as the host has), and the share of
a frame in post-processing as
ultralytics' non_max_suppression does it (boxes to corners, best class,
score filter, torchvision's batched_nms). Host times depend on this
machine and its load; run it on a quiet one. `boxes` is the detections
of the timed frame and `found` the share of a reference's boxes found
again (same class): PyTorch's at IoU >= 0.99 for fp32, fp16 and bf16,
tpuhal fp32's at IoU >= 0.5 for int8 (calibrated on that frame). Needs python3-torch and
python3-torchvision (exit status 77 without them).
"""

import argparse
import io
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "timing"))
try:
    import torch
    import torchvision
except ImportError as e:  # pragma: no cover
    print(f"detect-bench: {e}: install python3-torch and python3-torchvision", file=sys.stderr)
    sys.exit(77)
import models  # noqa: E402  (scripts/timing/models.py)
import tpuhal  # noqa: E402

SCORE, IOU = 0.25, 0.45
MAX_BOXES = 100  # --max-boxes


def postprocess(head):
    """ultralytics' non_max_suppression (multi_label=False) on one image's
    [4 + C, A] head, with torchvision's batched_nms."""
    p = head.T
    boxes = torchvision.ops.box_convert(p[:, :4], "cxcywh", "xyxy")
    conf, cls = p[:, 4:].max(1)
    keep = conf > SCORE
    boxes, conf, cls = boxes[keep], conf[keep], cls[keep]
    kept = torchvision.ops.batched_nms(boxes, conf, cls, IOU)[:MAX_BOXES]
    return boxes[kept], conf[kept], cls[kept]


def rows(boxes, conf, cls):
    return np.concatenate([boxes.numpy(), conf[:, None].numpy(), cls[:, None].float().numpy()], 1)


def found_again(want, got, at_least):
    """The share of `want`'s boxes that `got` has: same class, IoU >= at_least."""
    if len(want) == 0:
        return 1.0
    if len(got) == 0:
        return 0.0
    overlap = torchvision.ops.box_iou(torch.as_tensor(want[:, :4]), torch.as_tensor(got[:, :4])).numpy()
    return float(np.mean((overlap * (want[:, None, 5] == got[None, :, 5])).max(1) >= at_least))


def median_s(fn, frames):
    fn()  # warm
    times = []
    for _ in range(frames):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_torch(model, x, frames):
    with torch.no_grad():
        whole = median_s(lambda: postprocess(model(x)[0]), frames)
        head = model(x)[0]
        post = median_s(lambda: postprocess(head), frames)
    return {"fps": 1 / whole, "post_share": post / whole, "frame_ms": whole * 1e3, "post_ms": post * 1e3}


def bench_tpuhal(dev, onnx_bytes, x, precision, frames, reference):
    compiled = tpuhal.compile(onnx_bytes, precision, calibration=x if precision == "int8" else None,
                              device=dev.uri, detect={"head": "yolov8", "score": SCORE, "iou": IOU,
                                                      "max_boxes": MAX_BOXES})
    instance = tpuhal.load_model(dev, compiled).instance()
    whole = median_s(lambda: instance.run([x]), frames)
    (det,) = instance.run([x])
    det = det[0][det[0][:, 5] >= 0]
    # fp32, fp16, bf16 against PyTorch's boxes at IoU 0.99; int8 against
    # tpuhal fp32's at IoU 0.5 (the first precision run is the reference
    # for the next).
    out = {"fps": 1 / whole, "frame_ms": whole * 1e3, "boxes": len(det),
           "found": found_again(reference, det, 0.5 if precision == "int8" else 0.99)}
    profile = instance.profile(max(4, frames // 2))
    detect = sum(layer["device_ns"] for layer in profile["layers"] if layer["node"].startswith("detect"))
    # TPUHAL_SIM_CLOCK=host: the profile's layers are the host's time.
    out["post_ms"] = detect / 1e6
    out["post_share"] = detect / profile["device_ns"]
    modelled = instance.modelled()
    out["detections"] = det
    if modelled:
        detect = sum(layer["ns"] for layer in modelled["layers"] if layer["node"].startswith("detect"))
        out["modelled_frame_ms"] = modelled["ns"] / 1e6
        out["modelled_post_ms"] = detect / 1e6
        out["modelled_post_share"] = detect / modelled["ns"]
    return out


def main(argv):
    global MAX_BOXES
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=640, help="input size (a multiple of 32)")
    ap.add_argument("--frames", type=int, default=20, help="frames timed per measurement (their median is used)")
    ap.add_argument("--precision", default="fp32,int8", help="comma-separated: fp32, fp16, bf16, int8")
    ap.add_argument("--device", default="sim:0")
    ap.add_argument("--max-boxes", type=int, default=MAX_BOXES,
                    help="detections per image (random weights leave about 600 at 640x640: give 1000 for the "
                    "agreement figures, which compare whole sets)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = ap.parse_args(argv)
    MAX_BOXES = a.max_boxes
    if a.size % 32 or a.size < 64:
        sys.exit("detect-bench: --size must be a multiple of 32, at least 64")
    torch.set_num_threads(os.cpu_count() or 1)  # as many as the simulated board's engine uses
    torch.manual_seed(0)
    model = models.fuse(models.unit_scale(models.YOLOv8s(size=a.size))).eval()
    x = torch.rand(1, 3, a.size, a.size)
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(model, x, buf, opset_version=13, input_names=["images"], output_names=["output0"])
    results = {"size": a.size, "pytorch_fp32": bench_torch(model, x, a.frames)}
    with torch.no_grad():
        pytorch_boxes = rows(*postprocess(model(x)[0]))
    results["pytorch_fp32"]["boxes"] = len(pytorch_boxes)
    # The simulator's own time per layer in profile(); modelled() still
    # gives the board's (docs/timing.md).
    os.environ["TPUHAL_SIM_CLOCK"] = "host"
    with tpuhal.open(a.device) as dev:
        for precision in a.precision.split(","):
            fp32 = results.get("tpuhal_fp32", {}).get("detections")
            reference = fp32 if precision == "int8" and fp32 is not None else pytorch_boxes
            results[f"tpuhal_{precision}"] = bench_tpuhal(dev, buf.getvalue(), x.numpy(), precision, a.frames,
                                                          reference)
    for r in results.values():
        if isinstance(r, dict):
            r.pop("detections", None)
    if a.json:
        print(json.dumps(results, indent=1))
        return
    print(f"YOLOv8s at {a.size}x{a.size}, batch 1, {a.frames} frames; post-processing: score > {SCORE}, "
          f"IoU {IOU}, at most {MAX_BOXES} boxes")
    print(f"{'':16}{'host: fps':>10}{'frame ms':>10}{'post ms':>9}{'post':>8}"
          f"{'board: ms':>11}{'post ms':>9}{'post':>8}{'boxes':>7}{'found':>8}")
    for name, r in results.items():
        if name == "size":
            continue
        board = (f"{r['modelled_frame_ms']:11.2f}{r['modelled_post_ms']:9.4f}{r['modelled_post_share']:8.2%}"
                 if "modelled_frame_ms" in r else f"{'-':>11}{'-':>9}{'-':>8}")
        found = f"{r['found']:8.1%}" if "found" in r else f"{'-':>8}"
        print(f"{name:16}{r['fps']:10.1f}{r['frame_ms']:10.1f}{r['post_ms']:9.2f}{r['post_share']:8.2%}{board}"
              f"{r['boxes']:7}{found}")


if __name__ == "__main__":
    main(sys.argv[1:])
