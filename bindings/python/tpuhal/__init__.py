"""tpuhal: one API for every accelerator board, from Python.

    import numpy as np
    import tpuhal

    with tpuhal.open("sim:0") as dev:               # the simulated BM1684X-class card
        x = dev.upload(np.arange(1 << 20, dtype=np.float32))   # device memory
        y = dev.alloc(x.size)
        q = dev.queue("compute")
        q.copy(x, y).fill(x, 0).submit().wait(timeout=10)
        assert (y.download(np.float32) == np.arange(1 << 20)).all()

Objects mirror the C++ API (<tpuhal/tpuhal.hpp>): Device, Buffer, Queue,
Batch, Fence; Tensor, Op (built by tpuhal.ops) and Program for tensor work:

        a = tpuhal.Tensor(dev.upload(np.ones((64, 128), np.float32)))
        b = tpuhal.Tensor(dev.upload(np.ones((128, 32), np.float32)))
        y = dev.tensor((64, 32), "f32")
        q.run(tpuhal.ops.matmul(a, b, y)).submit().wait()
        y.download()                                 # a (64, 32) float32 array

Video decoding gives frames in device memory, ready for ops:

        demux = tpuhal.Demuxer("clip.mp4")
        with dev.open_decoder(demux.codec) as dec:
            for frame in dec.decode(demux):          # display order; flushed at the end
                y, uv = frame.to_numpy()             # or frame.luma(), frame.chroma() for ops

Compiled models (ONNX in; docs/runtime.md) run from NumPy arrays:

        cm = tpuhal.compile("net.onnx", "int8", shapes={"image": (64, 1, 28, 28)},
                            calibration=samples)         # or `tpuhal compile` on the command line
        model = dev.load_model(cm)                       # or a .tpm path
        logits, = model.instance().run(images)           # float32 in, float32 out

Errors are exceptions: tpuhal.Error and one subclass per
status (tpuhal.OutOfRange, tpuhal.Timeout, ...). Waits and transfers release
the GIL. Buffers exchange memory with NumPy and other frameworks through
DLPack without a copy where the host can see it. See docs/python.md.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence, Union
import sys as _sys
from datetime import timedelta as _timedelta

import numpy as _np

from ._tpuhal import (
    Activation,
    Batch,
    Buffer,
    Capabilities,
    ChannelTelemetry,
    Codec,
    CompiledModel,
    Demuxer,
    Device,
    DeviceFault,
    DeviceInfo,
    DeviceLost,
    DeviceStatus,
    DType,
    Engine,
    EngineInfo,
    EngineTelemetry,
    Error,
    FailedPrecondition,
    Fence,
    Frame,
    HeapInfo,
    HeapStats,
    Instance,
    Internal,
    InvalidArgument,
    LayerError,
    Memory,
    MemoryStats,
    Model,
    NotFound,
    Op,
    OutOfMemory,
    OutOfRange,
    Packet,
    PermissionDenied,
    PixelFormat,
    Program,
    Properties,
    Queue,
    QueueFull,
    QueueStatus,
    QueueTelemetry,
    ResourceExhausted,
    Status,
    Telemetry,
    Tensor,
    TensorSpec,
    Timeout,
    Unavailable,
    Unsupported,
    Utilisation,
    VersionMismatch,
    VideoDecoder,
    WaitMode,
    WaitPolicy,
    __version__,
    compile,
    devices,
    from_dlpack,
    load_model,
    open,
    ops,
    protocol_versions,
    trace,
    unavailable_drivers,
    utilisation,
    validation,
    version,
)

__all__ = [
    "Activation", "Batch", "Buffer", "Capabilities", "ChannelTelemetry", "Codec", "CompiledModel", "Demuxer",
    "Device", "DeviceFault", "DeviceInfo", "DeviceLost", "DeviceStatus", "DType", "Engine", "EngineInfo",
    "EngineTelemetry", "Error", "FailedPrecondition", "Fence", "Frame", "HeapInfo", "HeapStats", "Instance",
    "Internal", "InvalidArgument", "LayerError", "Memory", "MemoryStats", "Model", "NotFound", "Op", "OutOfMemory",
    "OutOfRange", "Packet", "PermissionDenied", "PixelFormat", "Program", "Properties", "Queue", "QueueFull",
    "QueueStatus", "QueueTelemetry", "ResourceExhausted", "Status", "Telemetry", "Tensor", "TensorSpec", "Timeout",
    "Unavailable", "Unsupported", "Utilisation", "VersionMismatch", "VideoDecoder", "WaitMode", "WaitPolicy",
    "__version__", "compile", "devices", "from_dlpack", "load_model", "open", "ops", "protocol_versions", "trace",
    "unavailable_drivers", "utilisation", "validation", "version", "wait_all",
]

_Seconds = Union[float, int, _timedelta]


def wait_all(fences: Iterable[Fence], timeout: Optional[_Seconds] = None) -> None:
    """Waits for every fence (each without the GIL); `timeout` applies to each
    wait, as in Fence.wait(). Raises the first error met."""
    for fence in fences:
        fence.wait(timeout)


def _fence_await(self: Fence):
    """`await fence`: waits in the event loop's default executor, so the loop
    runs on while the device works. Errors are raised as Fence.wait() raises them."""
    import asyncio

    return asyncio.get_running_loop().run_in_executor(None, self.wait).__await__()


Fence.__await__ = _fence_await  # type: ignore[attr-defined]


# `import tpuhal.ops` and `from tpuhal.ops import matmul` work as for a module.
_sys.modules[__name__ + ".ops"] = ops
_sys.modules[__name__ + ".validation"] = validation
_sys.modules[__name__ + ".trace"] = trace

# The NumPy dtype of each tensor element type; bf16, which NumPy lacks, comes
# and goes as its raw 16 bits (uint16).
_NUMPY_DTYPES = {
    "f32": _np.dtype(_np.float32),
    "f16": _np.dtype(_np.float16),
    "bf16": _np.dtype(_np.uint16),
    "i8": _np.dtype(_np.int8),
    "u8": _np.dtype(_np.uint8),
    "i32": _np.dtype(_np.int32),
}


def _numpy_dtype(self: Tensor) -> _np.dtype:
    """The NumPy dtype download() gives and upload() takes (bf16: uint16, its raw bits)."""
    return _NUMPY_DTYPES[str(self.dtype)]


def _tensor_download(self: Tensor, queue: Optional[Queue] = None) -> _np.ndarray:
    """Copies the tensor's elements into a new NumPy array of its shape (contiguous
    tensors only; bf16 as uint16 bits). Releases the GIL while the bytes move."""
    if not self.contiguous:
        raise InvalidArgument(f"Tensor.download: {self!r} is not contiguous; copy it with "
                              "tpuhal.ops.transpose or cast into a contiguous tensor first")
    return self.buffer.download(_numpy_dtype(self), self.shape, offset=self.offset, queue=queue)


def _tensor_upload(self: Tensor, array, queue: Optional[Queue] = None) -> None:
    """Copies a NumPy array of the tensor's shape and dtype into it (contiguous
    tensors only; bf16 from uint16 bits). Releases the GIL while the bytes move."""
    a = _np.asarray(array)
    want = _numpy_dtype(self)
    if a.dtype != want or tuple(a.shape) != tuple(self.shape):
        raise InvalidArgument(f"Tensor.upload: expected a {want} array of shape {tuple(self.shape)}, "
                              f"got {a.dtype} {tuple(a.shape)}")
    if not self.contiguous:
        raise InvalidArgument(f"Tensor.upload: {self!r} is not contiguous")
    self.buffer.upload(_np.ascontiguousarray(a), self.offset, queue=queue)


def _device_tensor(self: Device, shape: Union[int, Sequence[int]], dtype="f32",
                   memory="device") -> Tensor:
    """A new buffer of `memory` just large enough for `shape` elements of `dtype`,
    viewed as a contiguous Tensor (its contents are not initialised)."""
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    key = str(dtype).lower()
    itemsize = _NUMPY_DTYPES[key].itemsize if key in _NUMPY_DTYPES else _np.dtype(dtype).itemsize
    n = itemsize
    for d in dims:
        n *= d
    return Tensor(self.alloc(max(n, 1), memory), dtype, dims)


Tensor.numpy_dtype = property(_numpy_dtype)  # type: ignore[attr-defined]
Tensor.download = _tensor_download  # type: ignore[attr-defined]
Tensor.upload = _tensor_upload  # type: ignore[attr-defined]
Device.tensor = _device_tensor  # type: ignore[attr-defined]


def _device_load_model(self: Device, model) -> Model:
    """Loads a compiled model (a .tpm path or a CompiledModel) onto this device:
    tpuhal.load_model(self, model)."""
    return load_model(self, model)


Device.load_model = _device_load_model  # type: ignore[attr-defined]


def _decoder_decode(self: VideoDecoder, packets: Iterable, timeout: Optional[_Seconds] = None,
                    flush: bool = True):
    """Decodes a stream: a generator that sends each packet (a tpuhal.Packet, as
    a Demuxer gives them, a (data, pts) pair, or bytes-like data with pts 0) and
    yields every Frame as it comes out, in display order; at the end of
    `packets` it flushes the decoder and yields the frames still inside
    (flush=False leaves the stream open for more). Each wait releases the GIL;
    `timeout` is receive()'s.

    A packet that does not decode raises its tpuhal.Error (InvalidArgument for
    corrupt or truncated data, naming the device, the channel and "packet N",
    N counted from 0 in send order since open or reset()) out of the loop, which
    ends the generator; the decoder itself keeps going, so a caller that wants to
    skip bad packets drives send()/receive() and catches the error around
    receive(). Frames hold the channel's frame buffers: keep at most
    frame_buffers - 1 of them alive while decoding (tpuhal.ResourceExhausted
    otherwise)."""
    frame = None
    for packet in packets:
        if isinstance(packet, tuple):
            self.send(packet[0], packet[1])
        else:
            self.send(packet)
        while True:
            frame = self.receive(timeout)
            if frame is None:
                break
            yield frame
            frame = None  # not held while the next one is decoded
    if not flush:
        return
    self.flush()
    while True:
        frame = self.receive(timeout)
        if frame is None:
            break
        yield frame
        frame = None


VideoDecoder.decode = _decoder_decode  # type: ignore[attr-defined]
