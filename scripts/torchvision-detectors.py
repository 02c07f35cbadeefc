#!/usr/bin/python3
"""Compiles torchvision's whole detection models (SSDlite320, RetinaNet-R50,
Faster R-CNN MobileNetV3-320), runs each on sim:0 and compares its
detections with PyTorch's on the same image (docs/runtime.md, "The host
stage").

    PYTHONPATH=build/package/python scripts/torchvision-detectors.py [--models ssdlite,retinanet,fasterrcnn]
                                                                       [--runs 5] [--keep DIR]

Random weights, set so that the scores differ from box to box (with
torchvision's own initialisation most scores are equal, and equal scores
may go in either order) and, for Faster R-CNN, so that its RPN proposes
regions and its classes score above the threshold. A detection of
PyTorch's is found again when one of ours has its label, its score to
within 1e-4 and its box (IoU >= 0.99, or for an empty box on the image's
edge its corners to within 0.05 pixel). Prints a table: the detections,
how many were found again, the largest score and box differences in
order, and the median time of a whole run (the program and its host
stage) against the program's alone (`tpuhal profile`'s host time).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

EXPORT = r"""
import sys, numpy as np, torch
from torchvision.models import detection
name, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
if name == "ssdlite":
    net, size = detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None), 320
elif name == "retinanet":
    net, size = detection.retinanet_resnet50_fpn(weights=None, weights_backbone=None), 512
else:
    net, size = detection.fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None), 320
net.eval()
if name == "fasterrcnn":
    for m in net.backbone.modules():
        if isinstance(m, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
    with torch.no_grad():
        for p in net.rpn.parameters():
            p.add_(torch.randn_like(p) * 0.02)
        net.rpn.head.cls_logits.bias.add_(3.0)
        net.rpn.head.bbox_pred.weight.mul_(0.01)
        net.roi_heads.box_predictor.cls_score.bias.add_(torch.randn(91) * 3.0)
        net.roi_heads.box_predictor.bbox_pred.weight.mul_(0.01)
        net.roi_heads.box_predictor.cls_score.weight.mul_(0.01)
else:
    gain = 1.0 if name == "ssdlite" else 0.35
    for m in net.modules():
        if isinstance(m, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            m.weight.data *= gain
    with torch.no_grad():
        for p in net.head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
image = torch.rand(3, size, size)
with torch.no_grad():
    want = net([image])[0]
np.savez(out + "/want.npz", image=image.numpy(), **{k: v.numpy() for k, v in want.items()})
torch.onnx.export(net, ([image],), out + "/model.onnx", opset_version=11, input_names=["image"],
                  output_names=["boxes", "scores", "labels"] if name != "fasterrcnn" else ["boxes", "labels", "scores"])
"""


def iou(a, b):
    lt = np.maximum(a[:2], b[:, :2])
    rb = np.minimum(a[2:], b[:, 2:])
    wh = np.clip(rb - lt, 0, None)
    inter = wh[:, 0] * wh[:, 1]
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0)


def check(name, work, runs, tpuhal):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
    subprocess.run(["/usr/bin/python3", "-c", EXPORT, name, work], env=env, check=True, capture_output=True)
    want = np.load(os.path.join(work, "want.npz"))
    cm = tpuhal.compile(os.path.join(work, "model.onnx"))
    path = os.path.join(work, "model.tpm")
    cm.save(path)
    dev = tpuhal.open("sim:0")
    model = dev.load_model(cm)
    inst = model.instance()
    got = dict(zip(model.host_stage["outputs"], inst.run(want["image"])))
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        inst.run(want["image"])
        times.append(time.perf_counter() - t)
    boxes, scores, labels = got["boxes"], got["scores"], got["labels"]
    wb, ws, wl = want["boxes"], want["scores"], want["labels"]
    found = 0
    for b, s, label in zip(wb, ws, wl):
        same = (labels == label) & (np.abs(scores - s) <= 1e-4)
        near = (iou(b, boxes) >= 0.99) | (np.abs(boxes - b).max(axis=1) <= 0.05)
        found += bool((same & near).any())
    n = min(len(wb), len(boxes))
    prof = subprocess.run([os.path.join(os.environ.get("TPUHAL_BIN_DIR", "build/package/bin"), "tpuhal"), "profile",
                           path, "-n", str(runs)], env=dict(env, TPUHAL_SIM_CLOCK="host"), capture_output=True,
                          text=True)
    program = next((line.split()[5] for line in prof.stdout.splitlines() if "host time of a run" in line), "?")
    return (f"| {name} | {model.host_stage['nodes']} | {len(wb)} / {len(boxes)} | {found} | "
            f"{np.abs(ws[:n] - scores[:n]).max() if n else 0:.2g} | {np.abs(wb[:n] - boxes[:n]).max() if n else 0:.2g} | "
            f"{1000 * sorted(times)[len(times) // 2]:.1f} ms | {program} ms |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="ssdlite,retinanet,fasterrcnn")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--keep", help="keep the exported and compiled models in this folder")
    args = ap.parse_args()
    import tpuhal
    print("| model | host stage nodes | detections (PyTorch / ours) | found again | score diff in order | "
          "box diff in order | whole run | program |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.models.split(","):
        work = args.keep and os.path.join(args.keep, name)
        if work:
            os.makedirs(work, exist_ok=True)
            print(check(name, work, args.runs, tpuhal), flush=True)
        else:
            with tempfile.TemporaryDirectory() as d:
                print(check(name, d, args.runs, tpuhal), flush=True)


if __name__ == "__main__":
    sys.exit(main())
