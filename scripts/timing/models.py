#!/usr/bin/python3
"""The networks the BM1684X timing model is calibrated on, exported to ONNX
(docs/timing.md).

    /usr/bin/python3 scripts/timing/models.py OUT_DIR [--batch 1,4] [--models resnet50,yolov5s]

Writes OUT_DIR/MODEL_bN.onnx for each model and batch, at opset 13, with
random weights (torch.manual_seed(0)): time does not depend on weights,
though which layers an int8 compile keeps in fp32 does (unit_scale and
unit_variance).

  resnet50  torchvision's ResNet-50, 3x224x224, the 1000 logits out.
  yolov5s   YOLOv5s v6.1 at 3x640x640, written here from its published
            architecture (depth 0.33, width 0.50: the 6x6 stem, C3 blocks
            with 1, 2, 3, 1 bottlenecks, SPPF, the PAN neck), its Conv
            blocks (convolution, batch norm, SiLU) fused for inference, and
            its Detect head's three 1x1 convolutions, each output viewed as
            [N, 3, H, W, 85], the way SOPHGO's samples export it ("3output",
            docs/YOLOv5_Export_Guide.md there): the sigmoid, the box
            decoding and NMS run after the network.
  yolov8s   YOLOv8s (ultralytics) at 3x640x640, written here the same way,
            its head decoding the boxes into [N, 84, 8400]: NMS after it.
  yoloxs    YOLOX-s at 3x640x640, its decoupled head's sigmoids applied
            and the boxes not decoded, [N, 8400, 85], as YOLOX's own ONNX
            export gives it.
  yolo11s   YOLO11s (ultralytics) at 3x640x640, written here the same way
            (C3k2 blocks, C2PSA attention at 20x20), its head decoding the
            boxes into [N, 84, 8400] as yolov8s's does.

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
    """YOLOv5's Conv: convolution (no bias), batch norm, SiLU (none with
    act=False); g groups (g = channels: YOLO11's depthwise DWConv)."""

    def __init__(self, c1, c2, k=1, s=1, p=None, g=1, act=True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2 if p is None else p, groups=g, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.SiLU() if act else nn.Identity()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    """YOLOv5's bottleneck (a 1x1 then a 3x3 convolution); YOLOv8's has two
    3x3 ones (k1=3); YOLO11's C3k2 halves the channels between them (e)."""

    def __init__(self, c, shortcut=True, k1=1, e=1.0):
        super().__init__()
        self.cv1 = Conv(c, int(c * e), k1)
        self.cv2 = Conv(int(c * e), c, 3)
        self.add = shortcut

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    """YOLOv5's C3; with k1=3 YOLO11's C3k, whose bottlenecks are two 3x3
    convolutions."""

    def __init__(self, c1, c2, n=1, shortcut=True, k1=1):
        super().__init__()
        c = c2 // 2
        self.cv1 = Conv(c1, c, 1)
        self.cv2 = Conv(c1, c, 1)
        self.cv3 = Conv(2 * c, c2, 1)
        self.m = nn.Sequential(*(Bottleneck(c, shortcut, k1) for _ in range(n)))

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


class PAN(nn.Module):
    """The neck YOLOv5 and YOLOX share (a PAFPN of C3 blocks): top-down from
    the deepest feature, then bottom-up; the three scales out, finest first."""

    def __init__(self):
        super().__init__()
        self.lateral = Conv(512, 256, 1)
        self.top4 = C3(512, 256, 1, False)
        self.reduce = Conv(256, 128, 1)
        self.top3 = C3(256, 128, 1, False)
        self.down3 = Conv(128, 128, 3, 2)
        self.out4 = C3(256, 256, 1, False)
        self.down4 = Conv(256, 256, 3, 2)
        self.out5 = C3(512, 512, 1, False)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")

    def forward(self, p3, p4, p5):
        f0 = self.lateral(p5)
        f1 = self.reduce(self.top4(torch.cat((self.up(f0), p4), 1)))
        small = self.top3(torch.cat((self.up(f1), p3), 1))
        medium = self.out4(torch.cat((self.down3(small), f1), 1))
        large = self.out5(torch.cat((self.down4(medium), f0), 1))
        return small, medium, large


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
        self.neck = PAN()
        self.anchors = anchors
        no = anchors * (classes + 5)
        self.detect = nn.ModuleList(nn.Conv2d(c, no, 1) for c in (128, 256, 512))

    def forward(self, x):
        p4 = self.b4(self.b3(self.b2(self.b1(self.b0(x)))))
        p6 = self.b6(self.b5(p4))
        small, medium, large = self.neck(p4, p6, self.b9(self.b8(self.b7(p6))))
        # SOPHGO's "3output" export: each head's outputs as [N, 3, H, W, 85],
        # the sigmoid and box decoding left to the host.
        outs = []
        for d, f in zip(self.detect, (small, medium, large)):
            y = d(f)
            n, _, h, w = y.shape
            outs.append(y.view(n, self.anchors, -1, h, w).permute(0, 1, 3, 4, 2).contiguous())
        return tuple(outs)


class C2f(nn.Module):
    """YOLOv8's C2f: a 1x1 convolution split in two halves, n bottlenecks
    on the second, every part concatenated into a 1x1 convolution."""

    def __init__(self, c1, c2, n=1, shortcut=False):
        super().__init__()
        self.c = c2 // 2
        self.cv1 = Conv(c1, 2 * self.c, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, shortcut, k1=3) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).split((self.c, self.c), 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class Decode(nn.Module):
    """YOLOv8's and YOLO11's Detect head after its branches: per scale, the
    box branch's 4 x reg_max distribution and the class branch's scores
    concatenated, then the boxes decoded (distribution focal loss integral,
    anchor points, strides) into [N, 4 + classes, anchors] as the exported
    model does, so only NMS runs after it."""

    def __init__(self, box, cls, classes=80, size=640, reg_max=16):
        super().__init__()
        self.box, self.cls = box, cls
        self.classes, self.reg_max = classes, reg_max
        self.dfl = nn.Conv2d(reg_max, 1, 1, bias=False)
        self.dfl.weight.data[:] = torch.arange(reg_max, dtype=torch.float32).view(1, reg_max, 1, 1)
        points, strides = [], []
        for stride in (8, 16, 32):
            n = size // stride
            ys, xs = torch.meshgrid(torch.arange(n) + 0.5, torch.arange(n) + 0.5, indexing="ij")
            points.append(torch.stack((xs, ys), 0).reshape(2, -1))
            strides.append(torch.full((1, n * n), float(stride)))
        self.register_buffer("anchors", torch.cat(points, 1).unsqueeze(0))
        self.register_buffer("strides", torch.cat(strides, 1).unsqueeze(0))

    def forward(self, small, medium, large):
        n = small.shape[0]
        feats = [torch.cat((b(f), c(f)), 1).view(n, 4 * self.reg_max + self.classes, -1)
                 for b, c, f in zip(self.box, self.cls, (small, medium, large))]
        box, cls = torch.cat(feats, 2).split((4 * self.reg_max, self.classes), 1)
        a = box.shape[2]
        dist = self.dfl(box.view(n, 4, self.reg_max, a).transpose(2, 1).softmax(1)).view(n, 4, a)
        lt, rb = dist.chunk(2, 1)
        x1y1, x2y2 = self.anchors - lt, self.anchors + rb
        boxes = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * self.strides
        return torch.cat((boxes, cls.sigmoid()), 1)


class YOLOv8s(nn.Module):
    """YOLOv8s (ultralytics yolov8s.yaml, depth 0.33, width 0.50): 80
    classes; its Detect head decodes the boxes into [N, 84, 8400]."""

    def __init__(self, classes=80, size=640, reg_max=16):
        super().__init__()
        self.b0 = Conv(3, 32, 3, 2)
        self.b1 = Conv(32, 64, 3, 2)
        self.b2 = C2f(64, 64, 1, True)
        self.b3 = Conv(64, 128, 3, 2)
        self.b4 = C2f(128, 128, 2, True)
        self.b5 = Conv(128, 256, 3, 2)
        self.b6 = C2f(256, 256, 2, True)
        self.b7 = Conv(256, 512, 3, 2)
        self.b8 = C2f(512, 512, 1, True)
        self.b9 = SPPF(512, 512, 5)
        self.h12 = C2f(768, 256)
        self.h15 = C2f(384, 128)
        self.h16 = Conv(128, 128, 3, 2)
        self.h18 = C2f(384, 256)
        self.h19 = Conv(256, 256, 3, 2)
        self.h21 = C2f(768, 512)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        c2, c3 = max(16, 128 // 4, reg_max * 4), max(128, min(classes, 100))
        box = nn.ModuleList(
            nn.Sequential(Conv(c, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * reg_max, 1)) for c in (128, 256, 512))
        cls = nn.ModuleList(
            nn.Sequential(Conv(c, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, classes, 1)) for c in (128, 256, 512))
        self.detect = Decode(box, cls, classes, size, reg_max)

    def forward(self, x):
        p4 = self.b4(self.b3(self.b2(self.b1(self.b0(x)))))
        p6 = self.b6(self.b5(p4))
        p9 = self.b9(self.b8(self.b7(p6)))
        h12 = self.h12(torch.cat((self.up(p9), p6), 1))
        small = self.h15(torch.cat((self.up(h12), p4), 1))
        medium = self.h18(torch.cat((self.h16(small), h12), 1))
        large = self.h21(torch.cat((self.h19(medium), p9), 1))
        return self.detect(small, medium, large)


class C3k2(nn.Module):
    """YOLO11's C3k2: YOLOv8's C2f with hidden channels c2 * e, its blocks
    C3k (c3k) or bottlenecks that halve the channels between their two 3x3
    convolutions."""

    def __init__(self, c1, c2, n=1, c3k=False, e=0.5, shortcut=True):
        super().__init__()
        self.c = int(c2 * e)
        self.cv1 = Conv(c1, 2 * self.c, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(C3(self.c, self.c, 2, shortcut, k1=3) if c3k else Bottleneck(self.c, shortcut, 3, 0.5)
                               for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).split((self.c, self.c), 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class Attention(nn.Module):
    """YOLO11's position-sensitive attention over the H x W positions: q, k
    and v from one 1x1 convolution, heads of 64 channels with keys of 32, a
    depthwise 3x3 convolution of v added as the position encoding."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.key_dim = self.head_dim // 2
        self.scale = self.key_dim**-0.5
        self.qkv = Conv(dim, dim + 2 * self.key_dim * heads, 1, act=False)
        self.proj = Conv(dim, dim, 1, act=False)
        self.pe = Conv(dim, dim, 3, 1, g=dim, act=False)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.qkv(x).view(b, self.heads, 2 * self.key_dim + self.head_dim, h * w).split(
            (self.key_dim, self.key_dim, self.head_dim), 2)
        attn = ((q.transpose(-2, -1) @ k) * self.scale).softmax(-1)
        x = (v @ attn.transpose(-2, -1)).view(b, c, h, w) + self.pe(v.reshape(b, c, h, w))
        return self.proj(x)


class C2PSA(nn.Module):
    """YOLO11's C2PSA: half the channels through an attention block and a
    feed-forward pair of 1x1 convolutions, each added to its input."""

    def __init__(self, c1):
        super().__init__()
        self.c = c1 // 2
        self.cv1 = Conv(c1, 2 * self.c, 1)
        self.cv2 = Conv(2 * self.c, c1, 1)
        self.attn = Attention(self.c, self.c // 64)
        self.ffn = nn.Sequential(Conv(self.c, 2 * self.c, 1), Conv(2 * self.c, self.c, 1, act=False))

    def forward(self, x):
        a, b = self.cv1(x).split((self.c, self.c), 1)
        b = b + self.attn(b)
        b = b + self.ffn(b)
        return self.cv2(torch.cat((a, b), 1))


class YOLO11s(nn.Module):
    """YOLO11s (ultralytics yolo11.yaml, depth 0.50, width 0.50): C3k2
    blocks, SPPF and C2PSA, the PAN neck of C3k2 blocks, and the Detect
    head whose class branch starts with depthwise convolutions; the boxes
    decoded into [N, 84, 8400] as for YOLOv8s."""

    def __init__(self, classes=80, size=640, reg_max=16):
        super().__init__()
        self.backbone = nn.Sequential(Conv(3, 32, 3, 2), Conv(32, 64, 3, 2), C3k2(64, 128, 1, False, 0.25),
                                      Conv(128, 128, 3, 2), C3k2(128, 256, 1, False, 0.25))
        self.b5 = nn.Sequential(Conv(256, 256, 3, 2), C3k2(256, 256, 1, True))
        self.b7 = nn.Sequential(Conv(256, 512, 3, 2), C3k2(512, 512, 1, True), SPPF(512, 512, 5), C2PSA(512))
        self.h13 = C3k2(768, 256, 1, False)
        self.h16 = C3k2(512, 128, 1, False)
        self.h17 = Conv(128, 128, 3, 2)
        self.h19 = C3k2(384, 256, 1, False)
        self.h20 = Conv(256, 256, 3, 2)
        self.h22 = C3k2(768, 512, 1, True)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        c2, c3 = max(16, 128 // 4, reg_max * 4), max(128, min(classes, 100))
        box = nn.ModuleList(
            nn.Sequential(Conv(c, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * reg_max, 1)) for c in (128, 256, 512))
        cls = nn.ModuleList(
            nn.Sequential(Conv(c, c, 3, g=c), Conv(c, c3, 1), Conv(c3, c3, 3, g=c3), Conv(c3, c3, 1),
                          nn.Conv2d(c3, classes, 1)) for c in (128, 256, 512))
        self.detect = Decode(box, cls, classes, size, reg_max)

    def forward(self, x):
        p4 = self.backbone(x)
        p6 = self.b5(p4)
        p10 = self.b7(p6)
        h13 = self.h13(torch.cat((self.up(p10), p6), 1))
        small = self.h16(torch.cat((self.up(h13), p4), 1))
        medium = self.h19(torch.cat((self.h17(small), h13), 1))
        large = self.h22(torch.cat((self.h20(medium), p10), 1))
        return self.detect(small, medium, large)


class Focus(nn.Module):
    """YOLOX's stem: space to depth by slicing, then a 3x3 convolution."""

    def __init__(self, c1, c2):
        super().__init__()
        self.conv = Conv(4 * c1, c2, 3)

    def forward(self, x):
        return self.conv(torch.cat((x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]), 1))


class SPP(nn.Module):
    """YOLOX's SPP bottleneck: max pools of 5, 9 and 13 side by side."""

    def __init__(self, c1, c2):
        super().__init__()
        c = c1 // 2
        self.cv1 = Conv(c1, c, 1)
        self.cv2 = Conv(c * 4, c2, 1)
        self.m = nn.ModuleList(nn.MaxPool2d(k, 1, k // 2) for k in (5, 9, 13))

    def forward(self, x):
        x = self.cv1(x)
        return self.cv2(torch.cat([x] + [m(x) for m in self.m], 1))


class YOLOXs(nn.Module):
    """YOLOX-s (depth 0.33, width 0.50): CSPDarknet with the Focus stem and
    SPP, the PAFPN neck of C3 blocks ("CSPLayer"), and the decoupled head
    (a 1x1 stem, two 3x3 convolutions each for classes and for boxes, the
    objectness beside the boxes), exported as the official ONNX export
    does: sigmoids applied, boxes not decoded, [N, 8400, 85]."""

    def __init__(self, classes=80):
        super().__init__()
        self.stem = Focus(3, 32)
        self.d2 = nn.Sequential(Conv(32, 64, 3, 2), C3(64, 64, 1))
        self.d3 = nn.Sequential(Conv(64, 128, 3, 2), C3(128, 128, 3))
        self.d4 = nn.Sequential(Conv(128, 256, 3, 2), C3(256, 256, 3))
        self.d5 = nn.Sequential(Conv(256, 512, 3, 2), SPP(512, 512), C3(512, 512, 1, False))
        self.neck = PAN()
        self.stems = nn.ModuleList(Conv(c, 128, 1) for c in (128, 256, 512))
        self.cls_convs = nn.ModuleList(nn.Sequential(Conv(128, 128, 3), Conv(128, 128, 3)) for _ in range(3))
        self.reg_convs = nn.ModuleList(nn.Sequential(Conv(128, 128, 3), Conv(128, 128, 3)) for _ in range(3))
        self.cls_preds = nn.ModuleList(nn.Conv2d(128, classes, 1) for _ in range(3))
        self.reg_preds = nn.ModuleList(nn.Conv2d(128, 4, 1) for _ in range(3))
        self.obj_preds = nn.ModuleList(nn.Conv2d(128, 1, 1) for _ in range(3))

    def forward(self, x):
        x3 = self.d3(self.d2(self.stem(x)))
        x4 = self.d4(x3)
        outs = []
        for i, f in enumerate(self.neck(x3, x4, self.d5(x4))):
            f = self.stems[i](f)
            c, r = self.cls_convs[i](f), self.reg_convs[i](f)
            y = torch.cat((self.reg_preds[i](r), self.obj_preds[i](r).sigmoid(), self.cls_preds[i](c).sigmoid()), 1)
            outs.append(y.flatten(2))
        return torch.cat(outs, 2).permute(0, 2, 1)


def unit_scale(model):
    """Random weights that keep activations from collapsing through the
    network's depth: He-normal convolutions in the Conv blocks. PyTorch's
    default initialisation shrinks activations by about half a layer after
    layer, until after fifty layers an int8 layer's bias no longer fits
    int32 in units of its tiny input scale and the compiler runs it in
    fp32, which a trained network never needs. They still drift:
    unit_variance holds them at the scale trained weights give."""
    for m in model.modules():
        if isinstance(m, Conv):
            nn.init.kaiming_normal_(m.conv.weight, nonlinearity="relu")
    return model


def unit_variance(model, size):
    """Divides each Conv block's weights by the standard deviation of its
    convolution's output on one random image, in the order the network runs
    them (layer-sequential unit variance, Mishkin and Matas, 2015). With
    He-normal weights alone YOLOX-s's head at 40x40 and 20x20 ended below
    0.02, under the least largest value the compiler lets fp16 hold (2^-6),
    so it ran the layers an int8 model keeps in fp16 (SOPHGO's mixed
    precision YOLOX) in fp32; with trained weights, and here, their largest
    values are 2 to 17."""

    def normalise(conv, _, out):
        std = out.std().clamp_min(1e-12)
        conv.weight.div_(std)
        return out / std

    hooks = [m.conv.register_forward_hook(normalise) for m in model.modules() if isinstance(m, Conv)]
    image = torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.eval()(image)
    for h in hooks:
        h.remove()
    return model


def fuse(model):
    """Folds each Conv block's batch norm into its convolution, as an
    inference export does."""
    for m in model.modules():
        if isinstance(m, Conv):
            conv, bn = m.conv, m.bn
            fused = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                              groups=conv.groups, bias=True)
            scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
            fused.weight.data = conv.weight.data * scale.reshape(-1, 1, 1, 1)
            fused.bias.data = bn.bias - bn.running_mean * scale
            m.conv, m.bn = fused, nn.Identity()
    return model


MODELS = {
    "resnet50": (lambda: torchvision.models.resnet50(weights=None), 224, ["logits"]),
    "yolov5s": (lambda: fuse(unit_variance(unit_scale(YOLOv5s()), 640)), 640, ["p3", "p4", "p5"]),
    "yolov8s": (lambda: fuse(unit_variance(unit_scale(YOLOv8s()), 640)), 640, ["output0"]),
    "yoloxs": (lambda: fuse(unit_variance(unit_scale(YOLOXs()), 640)), 640, ["output"]),
    "yolo11s": (lambda: fuse(unit_variance(unit_scale(YOLO11s()), 640)), 640, ["output0"]),
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
