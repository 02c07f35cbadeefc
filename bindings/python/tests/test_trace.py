"""Tracing from Python (docs/tracing.md): tpuhal.trace.start/stop, the
caller's own scopes and marks, and what a copy and an op look like."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tpuhal
from tpuhal import trace


def events(path, ph, name):
    with open(path) as f:
        data = json.load(f)
    return [e for e in data["traceEvents"] if e["ph"] == ph and e["name"] == name]


def test_a_traced_copy_and_op_show_on_the_boards_clock(dev, queue, tmp_path):
    path = str(tmp_path / "py.json")
    trace.start(path)
    assert trace.active()
    x = dev.upload(np.arange(64 * 32, dtype=np.float32).reshape(64, 32))
    w = dev.upload(np.ones((32, 16), np.float32))
    y = dev.tensor((64, 16), "f32")
    with trace.scope("inference"):
        trace.mark("inputs ready")
        queue.run(tpuhal.ops.matmul(tpuhal.Tensor(x, "f32", (64, 32)), tpuhal.Tensor(w, "f32", (32, 16)), y)).submit().wait()
    summary = trace.stop()
    assert not trace.active()
    assert summary["path"] == path and summary["dropped"] == 0 and summary["error"] == ""
    assert summary["events"] > 0
    assert len(events(path, "B", "inference")) == 1
    assert len(events(path, "i", "inputs ready")) == 1
    mm = events(path, "X", "matmul")
    assert len(mm) == 1
    assert mm[0]["args"]["flops"] == 2 * 64 * 16 * 32
    assert mm[0]["args"]["tensors"] == "64x32 f32, 32x16 f32, 64x16 f32"
    # The upload's copy host -> device, with its bytes.
    copies = events(path, "X", "copy")
    assert any(c["args"]["bytes"] == 64 * 32 * 4 and c["args"]["direction"] == "h2d" for c in copies)


def test_mistakes_are_clear_errors(tmp_path):
    with pytest.raises(tpuhal.NotFound, match="cannot create /nonexistent-directory/t.json"):
        trace.start("/nonexistent-directory/t.json")
    trace.start(str(tmp_path / "a.json"))
    with pytest.raises(tpuhal.FailedPrecondition, match="already being written"):
        trace.start(str(tmp_path / "b.json"))
    s = trace.scope("once")
    with s:
        with pytest.raises(tpuhal.FailedPrecondition, match="already entered"):
            s.__enter__()
    trace.stop()
    assert trace.stop()["events"] == 0  # none on: harmless


def test_tpuhal_trace_in_the_environment_traces_a_whole_script(tmp_path):
    path = str(tmp_path / "env.json")
    script = "import numpy, tpuhal\nwith tpuhal.open('sim:tiny') as d:\n    d.upload(numpy.zeros(1024, numpy.float32))\n"
    env = dict(os.environ, TPUHAL_TRACE=path, TPUHAL_LOG="error")
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    with open(path) as f:
        data = json.load(f)
    assert data["otherData"]["devices"]["sim:tiny"]["board_timestamps"] is True
    assert any(e["name"] == "copy" and e["args"]["bytes"] == 4096 for e in data["traceEvents"] if e["ph"] == "X")
