"""Shared fixtures: a small simulated board per test module."""
import gc

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
