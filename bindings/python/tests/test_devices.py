"""Devices, properties and errors as exceptions."""
import gc
import re

import pytest

import tpuhal

from conftest import URI


def test_devices_lists_the_simulated_board():
    infos = tpuhal.devices()
    uris = [d.uri for d in infos]
    assert "sim:0" in uris
    sim0 = infos[uris.index("sim:0")]
    assert sim0.driver == "tpu-sim"
    assert sim0.memory_bytes > 0
    assert "sim:0" in repr(infos)


def test_open_is_a_context_manager_that_closes():
    with tpuhal.open(URI) as dev:
        assert dev.uri == URI
        assert not dev.closed
        props = dev.properties
    assert dev.closed
    with pytest.raises(tpuhal.FailedPrecondition) as info:
        dev.alloc(64)
    assert URI in str(info.value) and "closed" in str(info.value)
    assert props.memory_bytes == 64 << 20  # plain data, still readable


def test_properties_are_attributes(dev):
    p = dev.properties
    assert p.uri == URI
    assert p.driver == "tpu-sim"
    assert p.caps.tensor is True
    assert p.queues("compute") >= 1
    assert tpuhal.DType.F32 in p.dtypes and "f32" in p.dtypes
    assert any(h.is_default for h in p.heaps)
    assert dev.memory_stats().device_total == p.memory_bytes
    assert len(dev.status().queues) == sum(e.queues for e in p.engines)


def test_unknown_uri_raises_not_found_with_status_code():
    with pytest.raises(tpuhal.NotFound) as info:
        tpuhal.open("sim:no-such-profile")
    e = info.value
    assert isinstance(e, tpuhal.Error) and isinstance(e, LookupError)
    assert e.status == tpuhal.Status.NotFound
    assert e.code == 3
    assert "no-such-profile" in str(e)


def test_error_classes_carry_their_status():
    for status in tpuhal.Status:
        if status == tpuhal.Status.Ok:
            continue
        cls = getattr(tpuhal, status.name)
        assert issubclass(cls, tpuhal.Error)
        assert cls.status == status and cls.code == int(status)


def test_the_stubs_list_the_statuses_and_error_classes_the_module_has():
    # Both come from hal/include/tpuhal/status.inc: the stubs at build time,
    # the module when it loads.
    import ast
    import builtins
    import pathlib

    stubs = ast.parse((pathlib.Path(tpuhal.__file__).parent / "_tpuhal.pyi").read_text())
    classes = {n.name: n for n in stubs.body if isinstance(n, ast.ClassDef)}
    members = {
        t.targets[0].id: t.value.value
        for t in classes["Status"].body
        if isinstance(t, ast.Assign)
    }
    assert members == {s.name: int(s) for s in tpuhal.Status}
    for status in tpuhal.Status:
        if status == tpuhal.Status.Ok:
            continue
        bases = [b.id for b in classes[status.name].bases]
        assert bases[0] == "Error"
        cls = getattr(tpuhal, status.name)
        assert [c.__name__ for c in cls.__bases__] == bases, status.name
        for extra in bases[1:]:
            assert issubclass(cls, getattr(builtins, extra))


def test_out_of_memory_names_the_heap(dev):
    with pytest.raises(tpuhal.OutOfMemory) as info:
        dev.alloc(1 << 40)
    assert info.value.code == int(tpuhal.Status.OutOfMemory)
    assert "free" in str(info.value)


def test_bad_arguments_are_clear(dev):
    with pytest.raises(tpuhal.InvalidArgument, match="unknown memory kind 'vram'"):
        dev.alloc(64, "vram")
    with pytest.raises(tpuhal.InvalidArgument, match="unknown engine"):
        dev.queue("gpu")
    with pytest.raises(TypeError):
        dev.alloc(64, 3)


def test_wait_policy_round_trips(dev):
    old = dev.wait_policy
    try:
        dev.wait_policy = tpuhal.WaitPolicy(mode="spin", timeout=2.5)
        p = dev.wait_policy
        assert p.mode == tpuhal.WaitMode.Spin and p.timeout == pytest.approx(2.5)
        with pytest.raises(tpuhal.InvalidArgument):
            tpuhal.WaitPolicy(timeout=-1)
    finally:
        dev.wait_policy = old
    assert dev.wait_policy == old


def test_version():
    assert tpuhal.version() == tpuhal.__version__
    assert tpuhal.__version__.count(".") == 2


def test_protocol_versions_name_what_each_driver_speaks():
    versions = dict(tpuhal.protocol_versions())
    assert re.fullmatch(r"firmware interface \d+\.\d+", versions["sim"]), versions
    assert versions["pcie"] == versions["sim"]
    assert re.fullmatch(r"simulator daemon protocol \d+, " + re.escape(versions["sim"]), versions["simd"]), versions
    # Only drivers with something of ours on the other side: not cuda.
    assert "cuda" not in versions


def test_telemetry_counts_a_known_workload_and_gives_utilisation(dev, queue):
    assert dev.properties.caps.telemetry is True
    before = dev.telemetry()
    host = dev.alloc(4096, "host-pinned")
    buf = dev.alloc(4096)
    queue.copy(host, buf).fill(buf, 7, size=1024).copy(buf, host).submit().wait()
    after = dev.telemetry()
    assert after.h2d_bytes - before.h2d_bytes == 4096
    assert after.d2h_bytes - before.d2h_bytes == 4096
    assert after.d2d_bytes - before.d2d_bytes == 1024
    q = [t for t in after.queues if t.index == queue.index][0]
    q0 = [t for t in before.queues if t.index == queue.index][0]
    assert q.commands - q0.commands == 3 and q.failures == q0.failures
    assert after.faults == {}
    assert after.power_limit_w == 5.0 and after.clock_mhz == 500  # tiny.json
    assert len(after.channels) == dev.properties.decode_channels
    u = tpuhal.utilisation(before, after)
    assert 0 < u.compute <= 1 and u.copy == 0 and u.video == 0
    assert u.commands_per_s * u.interval_s == pytest.approx(3)
    assert "Telemetry(" in repr(after) and "Utilisation(" in repr(u)
    with pytest.raises(tpuhal.InvalidArgument, match="oldest first"):
        tpuhal.utilisation(after, before)


def test_reset_fails_the_queues_claimed_before_and_the_board_works_after():
    with tpuhal.open("sim:edge-soc") as d:
        before = d.telemetry().resets
        old = d.queue("compute")
        buf = d.alloc(4096)
        d.reset()
        with pytest.raises(tpuhal.DeviceFault, match="reset"):
            old.fill(buf, 3).submit().wait()
        del old  # a queue reset stays failed: release it, claim a new one
        gc.collect()
        new = d.queue("compute")
        new.fill(buf, 3).submit().wait()
        assert d.telemetry().resets == before + 1
