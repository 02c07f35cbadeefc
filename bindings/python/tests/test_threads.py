"""Several Python threads calling into one device at once."""
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import tpuhal
from tpuhal import ops

THREADS = 4


def test_parallel_transfers_and_ops_on_one_device():
    with tpuhal.open("sim:0") as dev:  # four compute queues
        def work(i):
            rng = np.random.default_rng(i)
            q = dev.queue("compute")
            results = []
            for round_ in range(5):
                a = rng.standard_normal((32, 16)).astype(np.float32)
                b = rng.standard_normal((16, 8)).astype(np.float32)
                y = dev.tensor((32, 8), "f32")
                q.run(ops.matmul(tpuhal.Tensor(dev.upload(a)), tpuhal.Tensor(dev.upload(b)), y)).submit().wait()
                big = rng.integers(0, 255, 3 << 20, dtype=np.uint8)
                back = dev.upload(big).download()
                results.append(np.allclose(y.download(), a @ b, rtol=1e-4, atol=1e-4)
                               and np.array_equal(back, big))
            return results

        with ThreadPoolExecutor(THREADS) as pool:
            outcomes = list(pool.map(work, range(THREADS)))
    assert outcomes == [[True] * 5] * THREADS


def test_shared_queue_from_many_threads_keeps_every_submission():
    with tpuhal.open("sim:tiny") as dev:
        q = dev.queue("compute")
        bufs = [dev.alloc(4096) for _ in range(THREADS)]

        def work(i):
            fences = [q.fill(bufs[i], (i * 16 + k) & 0xFF).submit() for k in range(50)]
            tpuhal.wait_all(fences, timeout=10)
            return fences[-1].value

        with ThreadPoolExecutor(THREADS) as pool:
            values = list(pool.map(work, range(THREADS)))
        assert len(set(values)) == THREADS  # distinct points on one timeline
        assert q.completed_value >= max(values) >= 50 * THREADS
        for i, b in enumerate(bufs):
            assert (b.download() == (i * 16 + 49) & 0xFF).all()


def test_transfers_let_other_threads_run():
    # With a switch interval too long to ever force a switch, a thread holds
    # the GIL until it gives it up: the counter gives it up at every tick
    # (sleep(0)), a transfer only if it releases it. So the counter moves
    # while this thread is inside a download only if downloads release the
    # GIL; held, it cannot move at all (no timing in the test).
    with tpuhal.open("sim:tiny") as dev:
        data = np.ones(24 << 20, np.uint8)
        buf = dev.upload(data)
        ticks = 0
        stop = threading.Event()

        def count():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                time.sleep(0)

        interval = sys.getswitchinterval()
        sys.setswitchinterval(1000.0)
        t = threading.Thread(target=count)
        t.start()
        moved = 0
        try:
            for _ in range(200):  # until the counter has run inside a download
                before = ticks
                buf.download(out=data)
                moved += ticks - before
                if moved:
                    break
        finally:
            stop.set()
            t.join()
            sys.setswitchinterval(interval)
        assert moved > 0, "the counter never ran while a download was in progress: downloads hold the GIL"
