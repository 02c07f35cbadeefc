"""Shared fixtures: a small simulated board per test module; a plain
interpreter for the PyTorch work a test prepares."""
import gc
import os
import subprocess
import sys

import pytest

import tpuhal

URI = "sim:tiny"  # 64 MiB of device memory, every capability the tests use


@pytest.fixture(scope="module")
def dev():
    with tpuhal.open(URI) as d:
        yield d


@pytest.fixture
def queue(dev):
    # The board has two compute queues; a queue is released when its last
    # reference goes, and an earlier test's may sit in a reference cycle
    # (an exception's traceback) until the collector runs.
    gc.collect()
    return dev.queue("compute")


def run_plain(code, *args):
    """Runs `code` (with `args` as sys.argv[1:]) in a fresh interpreter
    without the sanitizer runtime that a sanitized build's tests preload:
    PyTorch exports there in half the time. For work that does not use this
    package, such as building and exporting a model; fails with its stderr."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
    done = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
