"""DLPack: zero-copy export of host-visible buffers, import of host tensors,
and lifetimes in both directions."""
import gc
import mmap
import weakref

import numpy as np
import pytest

import tpuhal

from conftest import URI


def page_aligned(n, dtype=np.float32):
    m = mmap.mmap(-1, n * np.dtype(dtype).itemsize)
    return np.frombuffer(m, dtype)


@pytest.mark.parametrize("memory", ["host_pinned", "device_host_visible"])
def test_numpy_from_dlpack_shares_memory(dev, memory):
    a = np.arange(24, dtype=np.int16).reshape(4, 6)
    buf = dev.upload(a, memory)
    assert buf.__dlpack_device__() == (1, 0)
    view = np.from_dlpack(buf)
    assert view.dtype == np.int16 and view.shape == (4, 6)
    np.testing.assert_array_equal(view, a)
    # The buffer's own memory, no copy (NumPy 1.x marks DLPack arrays read-only).
    buf.upload(np.array([-5], np.int16), offset=2 * (6 + 2))
    assert view[1, 2] == -5


def test_device_memory_export_is_unsupported(dev):
    buf = dev.upload(np.zeros(16, np.float32))
    with pytest.raises(tpuhal.Unsupported, match="host_pinned"):
        buf.__dlpack__()
    with pytest.raises(tpuhal.Unsupported):
        np.from_dlpack(buf)


def test_consumer_keeps_buffer_alive_after_device_is_dropped():
    a = np.arange(1 << 16, dtype=np.float32)
    dev = tpuhal.open(URI)
    buf = dev.upload(a, "host_pinned")
    view = np.from_dlpack(buf)
    with pytest.raises(tpuhal.FailedPrecondition, match="host view"):
        buf.free()
    dev.close()
    del dev, buf
    gc.collect()
    # The pinned memory is still allocated and holds the data ...
    np.testing.assert_array_equal(view, a)
    with tpuhal.open(URI) as probe:
        alive = probe.memory_stats().host_pinned_bytes
    # ... until the consumer lets go.
    del view
    gc.collect()
    with tpuhal.open(URI) as probe:
        assert alive - probe.memory_stats().host_pinned_bytes >= a.nbytes


def test_from_dlpack_imports_without_copy_and_keeps_the_array(dev):
    a = page_aligned(4096)
    a[:] = np.arange(4096)
    ref = weakref.ref(a)
    buf = tpuhal.from_dlpack(a, dev, copy=False)
    assert buf.memory == "host_pinned"
    assert buf.dtype == np.float32 and buf.shape == (4096,)
    a[7] = 123.0  # the same memory
    assert buf.download()[7] == 123.0
    del a
    gc.collect()
    assert ref() is not None  # kept by the buffer
    np.testing.assert_array_equal(buf.download()[:4], [0, 1, 2, 3])
    del buf
    gc.collect()
    assert ref() is None


def test_from_dlpack_copies_unaligned_memory_unless_told_not_to(dev):
    a = np.arange(10, dtype=np.int64)[1:]
    with pytest.raises(tpuhal.InvalidArgument, match="page"):
        tpuhal.from_dlpack(a, dev, copy=False)
    buf = tpuhal.from_dlpack(a, URI)
    np.testing.assert_array_equal(buf.download(), a)
    a[0] = -1
    assert buf.download()[0] == 1  # a copy


def test_from_dlpack_refuses_non_contiguous_and_round_trips_through_numpy(dev):
    with pytest.raises((tpuhal.InvalidArgument, BufferError)):
        tpuhal.from_dlpack(np.zeros((4, 4), np.float32)[:, ::2], dev)
    buf = dev.upload(np.linspace(0, 1, 12, dtype=np.float64).reshape(3, 4), "host_pinned")
    again = tpuhal.from_dlpack(buf, dev, copy=True)  # one tpuhal buffer from another
    np.testing.assert_array_equal(again.download(), buf.download())


def test_work_on_imported_memory_keeps_it_alive(dev, queue):
    a = page_aligned(1 << 16)
    a[:] = 2.0
    src = tpuhal.from_dlpack(a, dev, copy=False)
    dst = dev.alloc(a.nbytes)
    fence = queue.copy(src, dst).submit()
    del a, src
    gc.collect()
    fence.wait(timeout=10)
    assert (dst.download(np.float32) == 2.0).all()
