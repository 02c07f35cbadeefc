"""Queues, batches and fences: ordering, waits with timeouts, errors, and the
GIL released while a wait blocks."""
import gc
import threading
import time

import numpy as np
import pytest

import tpuhal


def test_batch_chains_and_runs_in_order(dev, queue):
    src = dev.upload(np.arange(256, dtype=np.uint8))
    dst = dev.alloc(256)
    b = queue.batch().copy(src, dst).fill(dst, 0xEE, offset=16, size=16)
    assert len(b) == 2
    fence = b.submit()
    assert len(b) == 0
    fence.wait(timeout=10)
    assert fence.is_complete() and fence.value >= 1 and fence.queue is not None
    want = np.arange(256, dtype=np.uint8)
    want[16:32] = 0xEE
    np.testing.assert_array_equal(dst.download(), want)


def test_queue_shortcuts_offsets_and_wide_fill(dev, queue):
    buf = dev.alloc(64)
    queue.fill(buf, 0).submit().wait()
    queue.fill(buf, 0x11223344, offset=8, size=8, width=4).submit().wait()
    words = buf.download(np.uint32)
    np.testing.assert_array_equal(words[2:4], [0x11223344] * 2)
    assert not words[:2].any() and not words[4:].any()
    other = dev.alloc(64)
    queue.copy(buf, other, src_offset=8, dst_offset=0, size=8).submit().wait()
    np.testing.assert_array_equal(other.download(np.uint32)[:2], [0x11223344] * 2)


def test_fences_order_work_across_queues(dev):
    gc.collect()  # queues of earlier tests still in reference cycles
    a, b = dev.queue("compute"), dev.queue("compute")
    src = dev.upload(np.full(1 << 16, 7, np.uint8))
    mid, out = dev.alloc(1 << 16), dev.alloc(1 << 16)
    f = a.copy(src, mid).submit()
    b.wait(f).copy(mid, out).submit().wait(timeout=10)
    assert (out.download() == 7).all()


def test_recording_errors_are_raised_at_once(dev, queue):
    small, big = dev.alloc(64), dev.alloc(128)
    with pytest.raises(tpuhal.Error) as info:
        queue.copy(big, small)  # sizes differ
    assert info.value.status in (tpuhal.Status.InvalidArgument, tpuhal.Status.OutOfRange)
    with pytest.raises(tpuhal.OutOfRange):
        queue.fill(small, 0, offset=32, size=64)
    with pytest.raises(tpuhal.InvalidArgument, match="does not fit"):
        queue.fill(small, 256)
    with pytest.raises(tpuhal.InvalidArgument, match="not None"):
        queue.copy(None, small)


def test_wait_times_out_and_releases_the_gil(dev, queue):
    flag = dev.alloc(8, "host_pinned")
    flag.map(np.uint64)[0] = 0
    fence = queue.wait_value(flag, 0, 1).submit()
    assert not fence.is_complete()
    t0 = time.monotonic()
    with pytest.raises(tpuhal.Timeout) as info:
        fence.wait(timeout=0.2)
    assert isinstance(info.value, TimeoutError)
    assert time.monotonic() - t0 >= 0.15

    # A Python thread writes the flag while this thread waits: possible only
    # if wait() let go of the GIL.
    def release():
        time.sleep(0.1)
        flag.map(np.uint64)[0] = 1

    t = threading.Thread(target=release)
    t.start()
    fence.wait(timeout=5)
    t.join()
    assert fence.is_complete()


def test_empty_fence_and_submit(dev, queue):
    empty = tpuhal.Fence()
    assert empty.empty and empty.queue is None
    empty.wait(timeout=0)
    f = queue.submit()
    f.wait()
    assert queue.last_fence.value == f.value
    assert queue.completed_value >= f.value


def test_timestamps_and_write_value(dev, queue):
    page = dev.alloc(64, "host_pinned")
    queue.batch().write_value(page, 0, 42).timestamp(page, 8).submit().wait()
    words = page.map(np.uint64)
    assert words[0] == 42
    assert words[1] > 0
    f = queue.submit()
    f.wait()
    assert f.timestamp_ns is not None and f.timestamp_ns >= words[1]


def test_negative_timeout_is_refused(dev, queue):
    f = queue.submit()
    with pytest.raises(tpuhal.InvalidArgument, match=">= 0"):
        f.wait(timeout=-1)
    with pytest.raises(TypeError):
        f.wait(timeout="soon")
