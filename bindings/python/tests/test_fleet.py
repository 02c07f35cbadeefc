"""Fleet operations end to end (docs/operations.md), with the real pieces:
the simulator daemon shares a board; this process and `tpuhal decode` use it
while `tpuhal smi` and `tpuhal exporter` watch it without taking a share;
`promtool check metrics` accepts the exporter's output, and a real
Prometheus server (Debian's prometheus) scrapes it, so that queries to its
HTTP API return the bytes moved, the frames decoded and the fault injected
during the run."""
import json
import os
import resource
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

import tpuhal

BIN = os.environ.get("TPUHAL_BIN_DIR", "")
TPUHAL = os.path.join(BIN, "tpuhal")
SIMD = os.path.join(BIN, "tpuhal-simd")
MIB = 1 << 20


def plain_env():
    """The environment without the sanitizer runtimes the Python tests
    preload: for programs that are not ours (Prometheus, promtool)."""
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "ASAN_OPTIONS"):
        env.pop(k, None)
    return env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class Process:
    """A program the test starts and stops; its first line of output says it
    is ready."""

    def __init__(self, argv, env=None, ready=None):
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.first_line = self.p.stdout.readline().strip() if ready else ""
        if ready and ready not in self.first_line:
            self.stop()
            raise RuntimeError(f"{argv[0]} did not start: said {self.first_line!r}, {self.p.stderr.read()!r}")

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.p.stdout.close()
        self.p.stderr.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A daemon sharing a tiny board whose second compute queue fails its
    third command on the bus (in every VF), and an exporter watching it."""
    if not os.path.exists(TPUHAL) or not os.path.exists(SIMD):
        pytest.fail(f"TPUHAL_BIN_DIR={BIN!r} holds no tpuhal and tpuhal-simd")
    d = tmp_path_factory.mktemp("fleet")
    sock = str(d / "simd.sock")
    env = dict(os.environ, TPUHAL_SIM_FAULTS="dma-error:queue=1:after=2")
    daemon = Process([SIMD, "--socket", sock, "--board", "tiny", "--vfs", "4"], env=env, ready="serving")
    uri = f"simd:{sock}#0"
    try:
        exporter = Process([TPUHAL, "exporter", "--listen", "127.0.0.1:0", "--device", uri], ready="listening on")
    except Exception:
        daemon.stop()
        raise
    port = int(exporter.first_line.split()[2].rsplit(":", 1)[1])
    yield {"dir": d, "uri": uri, "metrics": f"http://127.0.0.1:{port}/metrics", "port": port}
    exporter.stop()
    daemon.stop()


def series(text, name, **labels):
    """The value of the series `name` with (at least) `labels` in
    Prometheus text `text`, or None."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name + "{"):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


def test_the_exporter_passes_promtool_and_names_every_family_by_the_conventions(fleet):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing (Debian: apt-get install prometheus; scripts/setup.sh installs it)")
    text = http_get(fleet["metrics"])
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, env=plain_env())
    assert r.returncode == 0, r.stdout + r.stderr
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name.startswith("tpuhal_"), line
            assert name.endswith("_total") == (kind == "counter"), line
    assert series(text, "tpuhal_up", device=fleet["uri"]) == 1
    assert series(text, "tpuhal_power_limit_watts", device=fleet["uri"]) == 5  # tiny.json
    assert series(text, "tpuhal_clock_hertz", device=fleet["uri"]) == 500e6


def test_a_board_that_cannot_be_reached_is_down_and_the_rest_are_served(fleet):
    gone = f"simd:{fleet['dir']}/nobody.sock#0"
    r = subprocess.run([TPUHAL, "exporter", "--once", "--device", gone, "--device", fleet["uri"]],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert series(r.stdout, "tpuhal_up", device=gone) == 0
    assert series(r.stdout, "tpuhal_up", device=fleet["uri"]) == 1
    assert "nobody.sock" in r.stderr
    r = subprocess.run([TPUHAL, "exporter", "--listen", "nowhere"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--listen takes ADDRESS:PORT" in r.stderr
    busy = subprocess.run([TPUHAL, "exporter", "--listen", f"127.0.0.1:{fleet['port']}", "--device", fleet["uri"]],
                          capture_output=True, text=True, timeout=60)
    assert busy.returncode == 1 and "cannot listen on" in busy.stderr


def make_clip(path, frames):
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        pytest.fail("ffmpeg is missing (Debian: apt-get install ffmpeg; scripts/setup.sh installs it)")
    subprocess.run([ffmpeg, "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=size=320x240:rate=25",
                    "-frames:v", str(frames), "-c:v", "libx264", "-pix_fmt", "yuv420p", str(path)], check=True)


def test_prometheus_scrapes_the_work_of_a_run_and_smi_lists_its_processes(fleet):
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.fail("prometheus is missing (Debian: apt-get install prometheus; scripts/setup.sh installs it)")
    d = fleet["dir"]
    (d / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        f"scrape_configs:\n  - job_name: tpuhal\n    static_configs:\n      - targets: ['127.0.0.1:{fleet['port']}']\n")
    web = free_port()
    server = subprocess.Popen([prometheus, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{web}", "--log.level=warn"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=plain_env())
    api = f"http://127.0.0.1:{web}"

    def query(q):
        body = json.loads(http_get(f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": q})))
        assert body["status"] == "success", body
        return [float(r["value"][1]) for r in body["data"]["result"]]

    def wait_for(q, want, within=60):
        """Until Prometheus has scraped a value of `want` for `q` (None: no series)."""
        deadline = time.monotonic() + within
        got = None
        while time.monotonic() < deadline:
            got = query(q)
            if got == ([] if want is None else [want]):
                return
            time.sleep(0.25)
        pytest.fail(f"Prometheus answers {q} with {got}, {want} expected")

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if http_get(f"{api}/-/ready", timeout=2).strip():
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"prometheus did not start: {server.stderr.read() if server.poll() is not None else ''}")
                time.sleep(0.2)

        # The workload: 1 MiB in and out on compute queue 1, whose third
        # command then fails on the bus; 20 frames decoded by another process.
        clip = d / "clip.mp4"
        make_clip(clip, 20)
        dev = tpuhal.open(fleet["uri"])
        q0, q1 = dev.queue("compute"), dev.queue("compute")
        assert q1.index == 1
        host, buf = dev.alloc(MIB, "host-pinned"), dev.alloc(MIB)
        q1.copy(host, buf).submit().wait()
        q1.copy(buf, host).submit().wait()
        with pytest.raises(tpuhal.DeviceFault, match="DMA fault"):
            q1.copy(host, buf).submit().wait()
        decode = subprocess.run([TPUHAL, "decode", "--device", fleet["uri"], str(clip)], capture_output=True,
                                text=True, timeout=120)
        assert decode.returncode == 0 and "20 frames" in decode.stderr + decode.stdout, decode.stderr

        # While this process holds its VF: its own series, and smi's table.
        me = str(os.getpid())
        wait_for(f'tpuhal_process_dma_bytes_total{{direction="h2d",pid="{me}"}}', MIB)
        wait_for(f'tpuhal_process_failures_total{{pid="{me}"}}', 1)
        wait_for(f'tpuhal_process_queues{{pid="{me}"}}', 2)
        smi = subprocess.run([TPUHAL, "smi", "--json", "--device", fleet["uri"]], capture_output=True, text=True,
                             timeout=60)
        assert smi.returncode == 0, smi.stderr
        board = json.loads(smi.stdout)[0]
        assert board["observed"] is True and board["board"] == "Small test board (simulated)"
        mine = [p for p in board["processes"] if p["pid"] == os.getpid()]
        assert len(mine) == 1 and mine[0]["queues"] == 2 and mine[0]["h2d_bytes"] == MIB
        assert mine[0]["name"] == open(f"/proc/{me}/comm").read().strip()
        assert any(h["bytes"] >= MIB for h in mine[0]["heaps"])
        assert board["telemetry"]["faults"] == [{"kind": "DMA fault", "count": 1}]
        table = subprocess.run([TPUHAL, "smi", "--device", fleet["uri"]], capture_output=True, text=True, timeout=60)
        assert "Processes:" in table.stdout and f" {me} " in table.stdout

        del q0, q1, host, buf
        dev.close()
        # The whole board keeps what its processes did after they leave.
        dev_label = f'device="{fleet["uri"]}"'
        wait_for(f'tpuhal_dma_bytes_total{{{dev_label},direction="h2d"}}', MIB)
        wait_for(f'tpuhal_dma_bytes_total{{{dev_label},direction="d2h"}}', MIB)
        wait_for(f'sum(tpuhal_decode_frames_total{{{dev_label}}})', 20)
        wait_for(f'tpuhal_faults_total{{{dev_label},kind="DMA fault"}}', 1)
        wait_for(f'tpuhal_process_memory_bytes{{pid="{me}"}}', None)  # its series went stale
        assert query(f'tpuhal_up{{{dev_label}}}') == [1]
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        server.stderr.close()


def test_a_malformed_scrape_and_a_dead_daemon_leave_the_exporter_serving(tmp_path):
    sock = str(tmp_path / "simd.sock")
    daemon = Process([SIMD, "--socket", sock, "--board", "tiny", "--vfs", "2"], ready="serving")
    uri = f"simd:{sock}#0"
    exporter = Process([TPUHAL, "exporter", "--listen", "127.0.0.1:0", "--device", uri], ready="listening on")
    try:
        port = int(exporter.first_line.split()[2].rsplit(":", 1)[1])
        metrics = f"http://127.0.0.1:{port}/metrics"
        # Garbage instead of HTTP, a request cut short, and a path it does not serve.
        for junk in (b"\x00\xff garbage\r\n\r\n", b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99"):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(junk)
                s.shutdown(socket.SHUT_WR)
                s.settimeout(5)
                try:
                    while s.recv(4096):
                        pass
                except OSError:
                    pass
        with pytest.raises(urllib.error.HTTPError) as e:
            http_get(f"http://127.0.0.1:{port}/nothing-here")
        assert e.value.code == 404
        assert series(http_get(metrics), "tpuhal_up", device=uri) == 1
        # The daemon dies: the next scrape answers at once, the board down.
        daemon.p.kill()
        daemon.p.wait()
        started = time.monotonic()
        text = http_get(metrics, timeout=30)
        assert series(text, "tpuhal_up", device=uri) == 0
        assert series(text, "tpuhal_temperature_celsius", device=uri) is None
        print(f"scrape with the daemon dead: {time.monotonic() - started:.3f} s")
        assert exporter.p.poll() is None
    finally:
        exporter.stop()
        daemon.stop()


def dropped(text, reason):
    return series(text, "tpuhal_exporter_connections_dropped_total", reason=reason)


def unlabelled(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_slow_and_idle_connections_do_not_starve_a_scrape():
    """Thousands of idle connections (as many as this test's descriptor
    limit allows, up to 4096) and some that send their request a byte a
    second (slowloris): a scrape still gets its whole answer, and the
    trickling connections are cut off although bytes keep coming. The
    deadlines here end a hang; they measure nothing."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    exporter = Process([TPUHAL, "exporter", "--listen", "127.0.0.1:0", "--device", "sim:tiny"], ready="listening on")
    idle, slow = [], []
    stop = threading.Event()
    slow_closed = threading.Event()
    try:
        port = int(exporter.first_line.split()[2].rsplit(":", 1)[1])
        in_use = len(os.listdir("/proc/self/fd"))
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        for _ in range(max(0, min(limit, 4096) - in_use - 64)):
            try:
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=30))
            except TimeoutError:
                break  # the server no longer takes connections: the scrape below says what that costs
        slow = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(16)]
        for s in slow:
            s.setblocking(False)
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Padding: " + b"y" * 64 + b"\r\n"

        def trickle():
            """One byte of the request per connection per second, until the server closes it."""
            open_ = {s: 0 for s in slow}
            while open_ and not stop.is_set():
                for s in list(open_):
                    try:
                        try:
                            if not s.recv(4096):  # the server closed it
                                raise ConnectionResetError
                        except BlockingIOError:
                            pass
                        s.send(request[open_[s] % len(request):][:1])
                        open_[s] += 1
                    except OSError:
                        del open_[s]
                stop.wait(1.0)  # the attack's pace
            if not open_:
                slow_closed.set()
        t = threading.Thread(target=trickle, daemon=True)
        t.start()

        text = http_get(f"http://127.0.0.1:{port}/metrics", timeout=60)
        assert series(text, "tpuhal_up", device="sim:tiny") == 1
        assert unlabelled(text, "tpuhal_exporter_scrapes_total") == 1
        # At most 512 connections stay open: every idle one beyond them was
        # pushed out by newcomers or timed out before the scrape was accepted.
        assert dropped(text, "evicted") + dropped(text, "request_timeout") >= len(idle) - 512
        assert slow_closed.wait(60), "the server kept connections that trickle their request forever"
        text = http_get(f"http://127.0.0.1:{port}/metrics", timeout=60)
        print(f"{len(idle)} idle and {len(slow)} trickling connections; closed early: " +
              ", ".join(f"{r} {dropped(text, r):.0f}" for r in ("evicted", "request_timeout")))
        assert dropped(text, "request_timeout") >= 1
        assert unlabelled(text, "tpuhal_exporter_scrapes_total") == 2
        assert exporter.p.poll() is None
        # HEAD is a scrape without the body; other methods and paths are refused.
        for req, status, body in ((b"HEAD", b"200", False), (b"POST", b"405", True)):
            with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
                s.sendall(req + b" /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = b""
                while chunk := s.recv(65536):
                    answer += chunk
            head, _, rest = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 " + status + b" "), answer
            assert bool(rest) == body, answer
    finally:
        stop.set()
        for s in idle + slow:
            s.close()
        exporter.stop()
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
