#!/usr/bin/env python3
"""Fashion-MNIST end to end: compile the trained CNN in fp32, fp16, bf16 and
calibrated int8, run the 10,000 test images on the simulated board (and on
every cuda:N device present), and print accuracy,
agreement with fp32 and images per second beside PyTorch running the same
network on the same CPU with the same thread count, in this run.

    /usr/bin/python3 examples/fashion_mnist/run.py [--data build/fashion_mnist] [--device URI]...

Trains the network first (train.py, a few minutes) when --data holds no
trained model yet. Needs the tpuhal package on PYTHONPATH (build/<dir>/python)
and Debian's python3-torch, python3-onnx and dataset-fashion-mnist.
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def evaluate(instance, images, batch):
    """Top-1 predictions for every image, and images per second (a warm-up batch first)."""
    n = len(images)
    padded = np.zeros((batch,) + images.shape[1:], np.float32)
    logits = np.empty((batch, 10), np.float32)
    instance.run(images[:batch], outputs=[logits])
    predictions = np.empty(n, np.int64)
    start = time.perf_counter()
    for i in range(0, n, batch):
        chunk = images[i:i + batch]
        if len(chunk) < batch:
            padded[:len(chunk)] = chunk
            chunk = padded
        instance.run(chunk, outputs=[logits])
        predictions[i:i + batch] = logits[:min(batch, n - i)].argmax(axis=1)
    return predictions, n / (time.perf_counter() - start)


def pytorch_reference(data, images, batch, threads):
    """The trained network in PyTorch on this CPU: predictions and images per second."""
    import torch

    sys.path.insert(0, HERE)
    from train import model  # the same architecture train.py trained

    torch.set_num_threads(threads)
    net = model()
    net.load_state_dict(torch.load(os.path.join(data, "model.pt")))
    net.eval()
    x = torch.from_numpy(images)
    predictions = np.empty(len(images), np.int64)
    with torch.no_grad():
        net(x[:batch])
        start = time.perf_counter()
        for i in range(0, len(images), batch):
            predictions[i:i + batch] = net(x[i:i + batch]).argmax(1).numpy()
        rate = len(images) / (time.perf_counter() - start)
    return predictions, rate


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="build/fashion_mnist", help="train.py's output directory")
    ap.add_argument("--device", action="append",
                    help="a device to run on (repeatable); default sim:0 and every cuda:N present")
    ap.add_argument("--batch", type=int, default=64, help="the compiled batch size")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="threads for the simulated tensor engine and for PyTorch alike")
    ap.add_argument("--percentile", type=float, default=99.99, help="int8 calibration percentile")
    args = ap.parse_args()

    # The simulated board's tensor engine takes its thread count from here,
    # so set it before tpuhal opens the device.
    os.environ["TPUHAL_SIM_THREADS"] = str(args.threads)
    import tpuhal

    if not os.path.exists(os.path.join(args.data, "model.pt")):
        print(f"no trained model in {args.data}: training one first (train.py)", flush=True)
        sys.path.insert(0, HERE)
        import train
        sys.argv = [sys.argv[0], "--out", args.data, "--threads", str(args.threads)]
        train.main()

    onnx_path = os.path.join(args.data, "model.onnx")
    images = np.load(os.path.join(args.data, "test_images.npy"))
    labels = np.load(os.path.join(args.data, "test_labels.npy"))
    calibration = np.load(os.path.join(args.data, "calibration.npy"))
    shapes = {"image": (args.batch, 1, 28, 28)}

    devices = args.device or ["sim:0"] + [d.uri for d in tpuhal.devices() if d.uri.startswith("cuda:")]
    compiled = {}
    for precision in ("fp32", "fp16", "bf16", "int8"):
        start = time.perf_counter()
        if precision == "int8":
            cm = tpuhal.compile(onnx_path, precision, shapes=shapes, calibration=calibration,
                                percentile=args.percentile, device=devices[0])
            label = f"int8 (percentile {args.percentile:g}, {len(calibration)} images)"
        else:
            cm = tpuhal.compile(onnx_path, precision, shapes=shapes, device=devices[0])
            label = precision
        cm.save(os.path.join(args.data, f"model_{precision}.tpm"))
        compiled[precision] = (label, cm)
        print(f"compiled {label} in {time.perf_counter() - start:.1f} s", flush=True)

    rows = []
    boards = []
    for uri in devices:
        reference = None
        with tpuhal.open(uri) as dev:
            boards.append(f"{uri}: {dev.properties.board}")
            for label, cm in compiled.values():
                predictions, rate = evaluate(dev.load_model(cm).instance(), images, args.batch)
                if reference is None:
                    reference = predictions
                rows.append((f"{uri} {label}", (predictions == labels).mean(), (predictions == reference).mean(), rate))
                print(f"{uri} {label}: {rate:.0f} images/s", flush=True)
        if uri == devices[0]:
            fp32_predictions = reference

    torch_predictions, torch_rate = pytorch_reference(args.data, images, args.batch, args.threads)

    print()
    print(f"Fashion-MNIST test set ({len(images)} images), batch {args.batch}, {args.threads} thread(s)")
    print(f"{'model':<50} {'accuracy':>9} {'agrees with fp32':>17} {'images/s':>9}")
    for label, accuracy, agreement, rate in rows:
        print(f"{label:<50} {100 * accuracy:>8.2f}% {100 * agreement:>16.2f}% {rate:>9.0f}")
    torch_label = f"PyTorch fp32 (CPU, {args.threads} threads)"
    print(f"{torch_label:<50} {100 * (torch_predictions == labels).mean():>8.2f}% "
          f"{100 * (torch_predictions == fp32_predictions).mean():>16.2f}% {torch_rate:>9.0f}")
    print("(" + "; ".join(boards) + ". A simulated board computes on this CPU, so its images/s compares "
          "the two implementations on the same cores, not the board's silicon.)")


if __name__ == "__main__":
    main()
