#!/usr/bin/env python3
"""Python's cost over C++ for the same tpuhal calls, measured in one process.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/python_overhead.py [--device sim:0]

Per-call overhead: a small op (an 8x8 f32 matmul) submitted and waited,
q.run(op).submit().wait(), from Python and from a C++ loop inside the module
(tpuhal._tpuhal._bench_run_wait) on the same queue and op. The target is
Python <= 2 x C++ + 5 us.

Transfers: 64 MiB between a NumPy array and device memory (Device buffer
upload()/download(out=)), beside C++ moving the same bytes between
page-aligned heap memory and device memory on the same queue (import_host +
copy + wait, the best C++ can do from ordinary memory), and the pinned-memory
DMA alone for reference. The target is Python >= 0.9 x C++.

Medians of the rounds; build the module without sanitizers
(-DCMAKE_BUILD_TYPE=Release) for meaningful figures.
"""
import argparse
import statistics
import time

import numpy as np

import tpuhal
from tpuhal import _tpuhal


def median_us(f, iterations):
    out = []
    for _ in range(iterations):
        t0 = time.perf_counter_ns()
        f()
        out.append((time.perf_counter_ns() - t0) / 1000.0)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="sim:0")
    ap.add_argument("--calls", type=int, default=2000, help="op round trips per side")
    ap.add_argument("--rounds", type=int, default=9, help="64 MiB transfers per figure")
    args = ap.parse_args()

    with tpuhal.open(args.device) as dev:
        print(f"{dev.uri}: {dev.properties.board}; tpuhal {tpuhal.__version__}")
        q = dev.queue("compute")

        a = tpuhal.Tensor(dev.upload(np.ones((8, 8), np.float32)))
        b = tpuhal.Tensor(dev.upload(np.ones((8, 8), np.float32)))
        y = dev.tensor((8, 8), "f32")
        op = tpuhal.ops.matmul(a, b, y)
        run = lambda: q.run(op).submit().wait()  # noqa: E731
        for _ in range(200):  # warm up both paths
            run()
        _tpuhal._bench_run_wait(q, op, 200)
        assert (y.download() == 8).all()
        # Interleave the two sides so that drift affects both alike.
        py, cpp = [], []
        for _ in range(5):
            py.append(median_us(run, args.calls // 5))
            cpp.append(statistics.median(_tpuhal._bench_run_wait(q, op, args.calls // 5)))
        py_us, cpp_us = statistics.median(py), statistics.median(cpp)
        limit = 2 * cpp_us + 5
        print("\nper call: q.run(matmul 8x8 f32).submit().wait()")
        print(f"  C++     {cpp_us:8.2f} us")
        print(f"  Python  {py_us:8.2f} us   (+{py_us - cpp_us:.2f} us; target <= 2 x C++ + 5 us = {limit:.2f} us: "
              f"{'met' if py_us <= limit else 'MISSED'})")

        n = 64 << 20
        host = np.full(n, 0x5A, np.uint8)
        back = np.empty_like(host)
        dram = dev.alloc(n)
        dram.upload(host, queue=q)
        dram.download(out=back, queue=q)  # warm up: staging buffers, first touch
        assert np.array_equal(back, host)
        # Blocks of C++ and Python rounds in turn, so that the machine's
        # other load affects both alike.
        up, down, down_new = [], [], []
        c = {"upload": [], "download": [], "upload_pinned": [], "download_pinned": []}
        blocks = 3
        for _ in range(blocks):
            for key, seconds in _tpuhal._bench_transfers(q, n, args.rounds // blocks).items():
                c[key] += seconds
            for _ in range(args.rounds // blocks):
                up.append(median_us(lambda: dram.upload(host, queue=q), 1) * 1e-6)
                down.append(median_us(lambda: dram.download(out=back, queue=q), 1) * 1e-6)
                down_new.append(median_us(lambda: dram.download(queue=q), 1) * 1e-6)
        gib = n / (1 << 30)

        def rate(seconds):
            return gib / statistics.median(seconds)

        print("\n64 MiB transfers, GiB/s (median of %d)" % len(up))
        print(f"  upload    C++ {rate(c['upload']):6.2f}   Python {rate(up):6.2f}   "
              f"ratio {rate(up) / rate(c['upload']):.2f} (target >= 0.9)")
        print(f"  download  C++ {rate(c['download']):6.2f}   Python {rate(down):6.2f}   "
              f"ratio {rate(down) / rate(c['download']):.2f} (target >= 0.9; into out=)")
        print(f"  download into a new array: Python {rate(down_new):6.2f}")
        print(f"  pinned <-> device DMA alone (C++): up {rate(c['upload_pinned']):6.2f}, "
              f"down {rate(c['download_pinned']):6.2f}")


if __name__ == "__main__":
    main()
