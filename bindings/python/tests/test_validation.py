"""The validation layer from Python: reports go to a Python handler and
point at the Python line that misused the API."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tpuhal
from tpuhal import validation


@pytest.fixture
def reports():
    was_on = validation.enabled()
    got = []
    validation.enable()
    validation.set_handler(got.append)
    yield got
    validation.set_handler(None)
    validation.enable(was_on)


def test_mapping_a_buffer_a_queue_still_writes_names_the_python_line(dev, queue, reports):
    gate = dev.alloc(8, "host_pinned")
    gate.map(np.uint64)[0] = 0
    src = dev.alloc(4096, "host_pinned")
    dst = dev.alloc(4096, "host_pinned")
    fence = queue.batch().wait_value(gate, 0, 1).copy(src, dst).submit()
    before = validation.report_count()
    dst.map()  # the copy into dst has not run yet: the misuse
    line = sys._getframe().f_lineno - 1
    gate.map(np.uint64)[0] = 1
    fence.wait(timeout=10)

    assert len(reports) == 1, reports
    r = reports[0]
    assert r.check == "buffer in flight"
    assert "map() of the 4096-byte host-pinned buffer" in r.message
    assert r.call_site[0].startswith("test_mapping_a_buffer_a_queue_still_writes_names_the_python_line at ")
    assert r.call_site[0].endswith(f"test_validation.py:{line}"), r.call_site
    assert validation.report_count() == before + 1
    assert "Report buffer in flight" in repr(r)


def test_a_handler_that_raises_does_not_break_the_call(dev, queue, reports, monkeypatch):
    def bad(_report):
        raise RuntimeError("handler failed")

    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    validation.set_handler(bad)
    words = dev.alloc(64, "host_pinned")
    queue.batch().write_value(words, 0, 5).submit().wait(timeout=10)
    assert unraisable == []
    # Reported (value backwards), the handler raised, the call went on.
    queue.batch().write_value(words, 0, 4).submit().wait(timeout=10)
    assert words.map(np.uint64)[0] == 4
    assert len(unraisable) == 1
    assert isinstance(unraisable[0].exc_value, RuntimeError)


def test_off_means_no_reports(dev, queue, reports):
    validation.enable(False)
    words = dev.alloc(64, "host_pinned")
    queue.batch().write_value(words, 0, 5).submit().wait(timeout=10)
    queue.batch().write_value(words, 0, 4).submit().wait(timeout=10)
    assert reports == []


def test_the_default_handler_logs_the_python_line(tmp_path):
    script = tmp_path / "misuse.py"
    script.write_text(textwrap.dedent("""\
        import numpy as np
        import tpuhal

        def main():
            with tpuhal.open("sim:tiny") as dev:
                q = dev.queue("compute")
                words = dev.alloc(64, "host_pinned")
                q.batch().write_value(words, 0, 5).submit().wait(timeout=10)
                q.batch().write_value(words, 0, 4).submit().wait(timeout=10)

        main()
        """))
    env = dict(os.environ, TPUHAL_VALIDATE="1", TPUHAL_LOG="error")
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "value backwards" in out.stderr, out.stderr
    assert f"at main at {script}:9" in out.stderr, out.stderr
    assert f"<module> at {script}:11" in out.stderr, out.stderr


def test_a_leak_report_names_the_python_line_that_allocated_the_buffer(dev, reports):
    validation.enable(True)
    leaked = dev.alloc(12288)  # allocated with the GIL released: the kept frames name this line
    line = sys._getframe().f_lineno - 1
    assert validation.report_leaks() >= 1
    leaks = [r for r in reports if r.check == "leak" and "12288-byte" in r.message]
    assert len(leaks) == 1, [r.message for r in reports]
    assert f"allocated by test_a_leak_report_names_the_python_line_that_allocated_the_buffer at {__file__}:{line}" \
        in leaks[0].message, leaks[0].message
    leaked.free()
    reports.clear()
    validation.report_leaks()
    assert not [r for r in reports if "12288-byte" in r.message]
