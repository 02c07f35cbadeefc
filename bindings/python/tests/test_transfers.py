"""Upload and download of NumPy arrays: every dtype, every memory kind, the
staged and the zero-copy paths, and the errors."""
import numpy as np
import pytest

import tpuhal

DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
          np.float16, np.float32, np.float64, np.complex64, np.complex128]
MEMORIES = ["device", "device_host_visible", "host_pinned"]


def sample(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(dt).reshape(shape)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True).reshape(shape)
    if dt.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt).reshape(shape)
    return rng.standard_normal(n).astype(dt).reshape(shape)


@pytest.mark.parametrize("memory", MEMORIES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trip_every_dtype(dev, dtype, memory):
    a = sample(dtype, (3, 5, 7))
    buf = dev.upload(a, memory)
    assert buf.memory == memory
    assert buf.size == a.nbytes
    assert buf.dtype == a.dtype and buf.shape == a.shape
    back = buf.download()
    assert back.dtype == a.dtype and back.shape == a.shape
    np.testing.assert_array_equal(back, a)


@pytest.mark.parametrize("nbytes, offset", [(5 << 20, 0), (9 << 20, 3), (4 << 20, 4096)])
def test_large_transfers_through_both_paths(dev, nbytes, offset):
    # A slice at `offset` bytes into a larger array: unaligned head and tail
    # around an imported interior; > 4 MiB, so staging takes several chunks.
    whole = np.frombuffer(np.random.default_rng(1).bytes(nbytes + offset + 7), np.uint8).copy()
    a = whole[offset:offset + nbytes]
    buf = dev.upload(a)
    assert buf.memory == "device"
    np.testing.assert_array_equal(buf.download(), a)
    out = np.zeros_like(whole)
    buf.download(out=out[offset:offset + nbytes])
    np.testing.assert_array_equal(out[offset:offset + nbytes], a)
    assert not out[:offset].any() and not out[offset + nbytes:].any()


def test_upload_into_part_of_a_buffer_and_reinterpret(dev):
    buf = dev.alloc(64)
    buf.upload(np.zeros(64, np.uint8))
    buf.upload(np.arange(4, dtype=np.uint32), 16)
    assert buf.dtype is None
    words = buf.download(np.uint32)
    assert words.shape == (16,)
    np.testing.assert_array_equal(words[4:8], [0, 1, 2, 3])
    assert not words[:4].any() and not words[8:].any()
    np.testing.assert_array_equal(buf.download(np.uint32, (2, 2), offset=16), [[0, 1], [2, 3]])


def test_map_views_host_memory_without_copy(dev):
    buf = dev.alloc(1024, "host_pinned")
    view = buf.map(np.float32, (16, 16))
    view[:] = 3.5
    np.testing.assert_array_equal(buf.download(np.float32), np.full(256, 3.5, np.float32))
    with pytest.raises(tpuhal.Unsupported, match="map"):
        dev.alloc(1024).map()


def test_unsupported_arrays_are_refused_clearly(dev):
    with pytest.raises(tpuhal.InvalidArgument, match="dtype object"):
        dev.upload(np.array([1, "a"], dtype=object))
    with pytest.raises(tpuhal.InvalidArgument, match="not numeric"):
        dev.upload(np.array(["abc"]))
    with pytest.raises(tpuhal.InvalidArgument, match="not C-contiguous"):
        dev.upload(np.zeros((8, 8), np.float32)[:, ::2])
    with pytest.raises(tpuhal.InvalidArgument, match="not numeric"):
        dev.alloc(64).download("U4")


def test_out_of_range_transfers_raise(dev):
    buf = dev.alloc(64)
    with pytest.raises(tpuhal.OutOfRange) as info:
        buf.upload(np.zeros(65, np.uint8))
    assert isinstance(info.value, IndexError)
    assert "65 bytes" in str(info.value)
    with pytest.raises(tpuhal.OutOfRange):
        buf.upload(np.zeros(8, np.uint8), 60)
    with pytest.raises(tpuhal.OutOfRange):
        buf.download(np.uint8, 65)
    with pytest.raises(tpuhal.InvalidArgument, match="whole number"):
        buf.download(np.float64, offset=4)


def test_freed_buffer_raises(dev):
    buf = dev.upload(np.arange(10, dtype=np.int32))
    buf.free()
    assert not buf.valid
    buf.free()  # harmless
    with pytest.raises(tpuhal.FailedPrecondition, match="freed"):
        buf.download()


def test_transfers_on_a_queue_of_yours(dev):
    q = dev.queue("compute")  # the device's transfer queue holds its one copy queue
    a = np.arange(1 << 20, dtype=np.int32)
    buf = dev.upload(a, queue=q)
    np.testing.assert_array_equal(buf.download(queue=q), a)
    assert q.completed_value > 0
