#!/usr/bin/env python3
"""Trains a small CNN on Fashion-MNIST with PyTorch (CPU) and exports it for
`tpuhal compile`.

    /usr/bin/python3 examples/fashion_mnist/train.py [--out build/fashion_mnist] [--epochs 4]

Reads Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist) and
writes into --out:
    model.onnx          opset 13, input "image" [N, 1, 28, 28] (N symbolic),
                        output "logits" [N, 10]
    model.pt            the trained weights (PyTorch state_dict), for run.py's
                        PyTorch comparison
    calibration.npy     float32 [S, 1, 28, 28]: training images for int8
                        calibration, normalised as the model expects
    test_images.npy     float32 [10000, 1, 28, 28], the same normalisation
    test_labels.npy     int64 [10000]
Seeds are fixed, so a run on the same machine gives the same model.
"""
import argparse
import gzip
import os
import time

import numpy as np
import torch
from torch import nn

DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # of the training images, in [0, 1]


def read_idx(name):
    with gzip.open(os.path.join(DATA, name), "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def images(name):
    x = read_idx(name).astype(np.float32) / 255.0
    return ((x - MEAN) / STD)[:, None, :, :].astype(np.float32)


def model():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.25),
        nn.Linear(128, 10))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="build/fashion_mnist")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--calibration", type=int, default=500, help="training images kept for int8 calibration")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)

    x_train, y_train = images("train-images-idx3-ubyte.gz"), read_idx("train-labels-idx1-ubyte.gz").astype(np.int64)
    x_test, y_test = images("t10k-images-idx3-ubyte.gz"), read_idx("t10k-labels-idx1-ubyte.gz").astype(np.int64)
    net = model()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs * (len(x_train) // args.batch))
    loss_fn = nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
    start = time.monotonic()
    for epoch in range(args.epochs):
        net.train()
        perm = torch.randperm(len(xt))
        for i in range(0, len(xt) - args.batch + 1, args.batch):
            idx = perm[i:i + args.batch]
            opt.zero_grad()
            loss = loss_fn(net(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            sched.step()
        net.eval()
        with torch.no_grad():
            pred = torch.cat([net(torch.from_numpy(x_test[i:i + 1000])).argmax(1) for i in range(0, len(x_test), 1000)])
        acc = (pred.numpy() == y_test).mean()
        print(f"epoch {epoch + 1}/{args.epochs}: loss {loss.item():.3f}, test accuracy {100 * acc:.2f}% "
              f"({time.monotonic() - start:.0f} s)", flush=True)

    net.eval()
    torch.onnx.export(net, torch.zeros(1, 1, 28, 28), os.path.join(args.out, "model.onnx"), opset_version=13,
                      input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "N"}, "logits": {0: "N"}}, do_constant_folding=True)
    torch.save(net.state_dict(), os.path.join(args.out, "model.pt"))
    rng = np.random.default_rng(0)
    calib = x_train[rng.choice(len(x_train), args.calibration, replace=False)]
    np.save(os.path.join(args.out, "calibration.npy"), calib)
    np.save(os.path.join(args.out, "test_images.npy"), x_test)
    np.save(os.path.join(args.out, "test_labels.npy"), y_test)
    print(f"wrote {args.out}/model.onnx and model.pt (test accuracy {100 * acc:.2f}%), calibration.npy "
          f"({args.calibration} images), test_images.npy, test_labels.npy")


if __name__ == "__main__":
    main()
