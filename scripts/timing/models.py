#!/usr/bin/python3
"""The networks the BM1684X timing model is calibrated on, exported to ONNX
(docs/timing.md).

    /usr/bin/python3 scripts/timing/models.py OUT_DIR [--batch 1,4] [--models resnet50,yolov5s]

Writes OUT_DIR/MODEL_bN.onnx for each model and batch, at opset 13, with
random weights (torch.manual_seed(0)): time does not depend on weights.

  resnet50  torchvision's ResNet-50, 3x224x224, the 1000 logits out.
  yolov5s   YOLOv5s v6.1 at 3x640x640, written here from its published
            architecture (depth 0.33, width 0.50: the 6x6 stem, C3 blocks
            with 1, 2, 3, 1 bottlenecks, SPPF, the PAN neck), its Conv
            blocks (convolution, batch norm, SiLU) fused for inference, and
            its Detect head's three 1x1 convolutions with the sigmoid, the
            way SOPHGO's samples export it: the box decoding and NMS run
            after the network.

Needs Debian's python3-torch and python3-torchvision (exit status 77
without them).
"""

import argparse
import os
import sys

try:
    import torch
    import torch.nn as nn
    import torchvision
except ImportError as e:  # pragma: no cover
    print(f"models.py: {e}: install python3-torch and python3-torchvision", file=sys.stderr)
    sys.exit(77)


class Conv(nn.Module):
    """YOLOv5's Conv: convolution (no bias), batch norm, SiLU."""

    def __init__(self, c1, c2, k=1, s=1, p=None):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2 if p is None else p, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c, shortcut=True):
        super().__init__()
        self.cv1 = Conv(c, c, 1)
        self.cv2 = Conv(c, c, 3)
        self.add = shortcut

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    def __init__(self, c1, c2, n=1, shortcut=True):
        super().__init__()
        c = c2 // 2
        self.cv1 = Conv(c1, c, 1)
        self.cv2 = Conv(c1, c, 1)
        self.cv3 = Conv(2 * c, c2, 1)
        self.m = nn.Sequential(*(Bottleneck(c, shortcut) for _ in range(n)))

    def forward(self, x):
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class SPPF(nn.Module):
    def __init__(self, c1, c2, k=5):
        super().__init__()
        c = c1 // 2
        self.cv1 = Conv(c1, c, 1)
        self.cv2 = Conv(c * 4, c2, 1)
        self.m = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x):
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))


class YOLOv5s(nn.Module):
    """YOLOv5s v6.1 (yolov5s.yaml): 80 classes, 3 anchors per scale."""

    def __init__(self, classes=80, anchors=3):
        super().__init__()
        self.b0 = Conv(3, 32, 6, 2, 2)
        self.b1 = Conv(32, 64, 3, 2)
        self.b2 = C3(64, 64, 1)
        self.b3 = Conv(64, 128, 3, 2)
        self.b4 = C3(128, 128, 2)
        self.b5 = Conv(128, 256, 3, 2)
        self.b6 = C3(256, 256, 3)
        self.b7 = Conv(256, 512, 3, 2)
        self.b8 = C3(512, 512, 1)
        self.b9 = SPPF(512, 512, 5)
        self.h10 = Conv(512, 256, 1)
        self.h13 = C3(512, 256, 1, False)
        self.h14 = Conv(256, 128, 1)
        self.h17 = C3(256, 128, 1, False)
        self.h18 = Conv(128, 128, 3, 2)
        self.h20 = C3(256, 256, 1, False)
        self.h21 = Conv(256, 256, 3, 2)
        self.h23 = C3(512, 512, 1, False)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        no = anchors * (classes + 5)
        self.detect = nn.ModuleList(nn.Conv2d(c, no, 1) for c in (128, 256, 512))

    def forward(self, x):
        p4 = self.b4(self.b3(self.b2(self.b1(self.b0(x)))))
        p6 = self.b6(self.b5(p4))
        x = self.b9(self.b8(self.b7(p6)))
        h10 = self.h10(x)
        h14 = self.h14(self.h13(torch.cat((self.up(h10), p6), 1)))
        small = self.h17(torch.cat((self.up(h14), p4), 1))
        medium = self.h20(torch.cat((self.h18(small), h14), 1))
        large = self.h23(torch.cat((self.h21(medium), h10), 1))
        return tuple(torch.sigmoid(d(f)) for d, f in zip(self.detect, (small, medium, large)))


def fuse(model):
    """Folds each Conv block's batch norm into its convolution, as an
    inference export does."""
    for m in model.modules():
        if isinstance(m, Conv):
            conv, bn = m.conv, m.bn
            fused = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                              bias=True)
            scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
            fused.weight.data = conv.weight.data * scale.reshape(-1, 1, 1, 1)
            fused.bias.data = bn.bias - bn.running_mean * scale
            m.conv, m.bn = fused, nn.Identity()
    return model


MODELS = {
    "resnet50": (lambda: torchvision.models.resnet50(weights=None), 224, ["logits"]),
    "yolov5s": (lambda: fuse(YOLOv5s()), 640, ["p3", "p4", "p5"]),
}


def export(name, batch, out_dir):
    make, size, outputs = MODELS[name]
    torch.manual_seed(0)
    model = make().eval()
    x = torch.rand(batch, 3, size, size)
    path = os.path.join(out_dir, f"{name}_b{batch}.onnx")
    with torch.no_grad():
        torch.onnx.export(model, x, path, opset_version=13, input_names=["images"], output_names=outputs)
    return path


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--batch", default="1,4", help="batch sizes, comma-separated")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    a = ap.parse_args(argv)
    os.makedirs(a.out_dir, exist_ok=True)
    for name in a.models.split(","):
        if name not in MODELS:
            sys.exit(f"models.py: no model {name} ({', '.join(MODELS)})")
        for b in (int(x) for x in a.batch.split(",")):
            print(export(name, b, a.out_dir))


if __name__ == "__main__":
    main(sys.argv[1:])
