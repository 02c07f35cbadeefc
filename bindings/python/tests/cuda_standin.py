"""The Python API on cuda:N, run against the stand-in CUDA driver
(tests/cuda/fake_driver.cpp) by ctest as Python.CudaStandIn: DLPack device
types, transfers and imports through the shim. On a machine with a GPU the
same calls reach real device memory; exchanging it with a CUDA build of
PyTorch needs that machine."""
import mmap

import numpy as np
import pytest

import tpuhal

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST = 1, 2, 3


def test_the_stand_in_devices_are_listed():
    uris = [d.uri for d in tpuhal.devices()]
    assert "cuda:0" in uris and "cuda:1" in uris
    info = tpuhal.devices()[uris.index("cuda:1")]
    assert info.driver == "cuda"


def test_dlpack_device_types_are_cudas():
    with tpuhal.open("cuda:1") as dev:
        on_gpu = dev.upload(np.arange(16, dtype=np.float32))
        assert on_gpu.__dlpack_device__() == (KDL_CUDA, 1)
        pinned = dev.upload(np.arange(16, dtype=np.float32), "host_pinned")
        assert pinned.__dlpack_device__() == (KDL_CUDA_HOST, 0)


def test_transfers_round_trip_through_device_memory():
    a = np.random.default_rng(5).standard_normal((64, 33)).astype(np.float32)
    with tpuhal.open("cuda:0") as dev:
        buf = dev.upload(a)
        assert buf.memory == "device"
        np.testing.assert_array_equal(buf.download(), a)


def test_pinned_cuda_memory_is_host_memory_to_an_importer():
    # kDLCUDAHost is host memory: another device imports it like kDLCPU.
    with tpuhal.open("cuda:0") as gpu:
        pinned = gpu.upload(np.arange(1024, dtype=np.int32), "host_pinned")
        copy = tpuhal.from_dlpack(pinned, "sim:0", copy=True)
        np.testing.assert_array_equal(copy.download(), np.arange(1024, dtype=np.int32))


def test_gpu_memory_is_refused_by_a_host_importer():
    with tpuhal.open("cuda:0") as gpu:
        on_gpu = gpu.upload(np.zeros(16, np.float32))
        with pytest.raises(tpuhal.Unsupported, match="device type 2"):
            tpuhal.from_dlpack(on_gpu, "sim:0")


def test_numpy_memory_is_registered_with_the_driver_without_a_copy():
    m = mmap.mmap(-1, 1 << 16)
    a = np.frombuffer(m, np.float32)
    a[:] = 3.0
    with tpuhal.open("cuda:0") as dev:
        buf = tpuhal.from_dlpack(a, dev, copy=False)  # cuMemHostRegister
        assert buf.memory == "host_pinned"
        a[5] = 7.0  # the same memory
        assert buf.download()[5] == 7.0
        del buf
