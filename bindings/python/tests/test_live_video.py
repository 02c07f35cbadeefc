"""Live video (docs/video.md): `tpuhal decode` reading RTSP from a real
server, GStreamer's RTSP server library (tests/video/rtsp_server.py, on
Debian's gir1.2-gst-rtsp-server-1.0), serving H.264 and H.265 clips made at
test time with ffmpeg. Every frame is checked against `ffmpeg -f framemd5`
of the clip; a stream that ends, and a server that stops and comes back,
are reconnected; a server that never comes back makes the decode give up
after the attempts it was given."""
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

BIN = os.environ.get("TPUHAL_BIN_DIR", "")
TPUHAL = os.path.join(BIN, "tpuhal")
SERVER = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "video", "rtsp_server.py")
FFMPEG = shutil.which("ffmpeg")

# name -> (ffmpeg output options, frames)
CLIPS = {
    "h264": ("-c:v libx264 -g 10 -pix_fmt yuv420p", 50),
    "h265": ("-c:v libx265 -x265-params log-level=none:keyint=10 -pix_fmt yuv420p", 30),
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rtsp_server_usable():
    r = subprocess.run(["/usr/bin/python3", "-c", "import gi; gi.require_version('GstRtspServer', '1.0');"
                        "from gi.repository import GstRtspServer"], capture_output=True, text=True)
    return r.returncode == 0, r.stderr.strip()


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    if FFMPEG is None:
        pytest.fail("ffmpeg is missing (scripts/setup.sh installs it)")
    ok, why = rtsp_server_usable()
    if not ok:
        pytest.fail(f"GStreamer's RTSP server is missing (Debian: gir1.2-gst-rtsp-server-1.0 "
                    f"gstreamer1.0-plugins-good gstreamer1.0-plugins-bad; scripts/setup.sh installs them): {why}")
    d = tmp_path_factory.mktemp("live")
    out = {}
    for name, (args, frames) in CLIPS.items():
        path = d / f"{name}.mp4"
        subprocess.run([FFMPEG, "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=size=320x240:rate=25",
                        "-frames:v", str(frames), *args.split(), str(path)], check=True)
        md5 = subprocess.run([FFMPEG, "-v", "error", "-i", str(path), "-fps_mode", "passthrough", "-f", "framemd5",
                              "-"], capture_output=True, text=True, check=True).stdout
        out[name] = (path, [l.rsplit(",", 1)[1].strip() for l in md5.splitlines() if l and not l.startswith("#")])
    return out


class Server:
    def __init__(self, clips, port=None):
        self.port = port or free_port()
        self.clips = clips
        self.start()

    def start(self):
        mounts = [f"{n}={p}" for n, (p, _) in self.clips.items()]
        for attempt in range(50):  # the port may still be held by the last one
            self.p = subprocess.Popen(["/usr/bin/python3", SERVER, "--port", str(self.port), *mounts],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env={k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")})
            line = self.p.stdout.readline()
            if "serving" in line:
                return
            self.p.wait()
            time.sleep(0.1)
        raise RuntimeError(f"the RTSP server did not start: {self.p.stderr.read()}")

    def url(self, name):
        return f"rtsp://127.0.0.1:{self.port}/{name}"

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            self.p.wait(10)
        self.p.stdout.close()
        self.p.stderr.close()


def decode(url, *args, timeout=120):
    r = subprocess.run([TPUHAL, "decode", "--device", "sim:0", url, "--md5", *args], capture_output=True, text=True,
                       timeout=timeout)
    hashes = [l.rsplit(",", 1)[1].strip() for l in r.stdout.splitlines() if l.count(",") == 3]
    return r, hashes


@pytest.mark.parametrize("name", ["h264", "h265"])
@pytest.mark.parametrize("transport", ["tcp", "udp"])
def test_every_frame_of_an_rtsp_stream_matches_ffmpeg(clips, name, transport):
    server = Server(clips)
    try:
        path, want = clips[name]
        r, got = decode(server.url(name), "--transport", transport, "--frames", str(len(want)))
        assert r.returncode == 0, r.stderr
        if transport == "udp" and got != want:
            # Loopback UDP may drop a datagram under load; TCP may not.
            pytest.xfail(f"UDP lost packets on loopback: {sum(a != b for a, b in zip(got, want))} frames differ")
        assert got == want
    finally:
        server.stop()


def test_a_stream_that_ends_is_opened_again_and_decoding_goes_on(clips):
    server = Server(clips)
    try:
        path, want = clips["h264"]
        r, got = decode(server.url("h264"), "--transport", "tcp", "--frames", str(2 * len(want) + 5))
        assert r.returncode == 0, r.stderr
        assert "reconnected (h264 320x240)" in r.stderr
        assert got[:len(want)] == want and got[len(want):2 * len(want)] == want, "each connection from frame 0"
        assert " 2 reconnect(s)" in r.stderr
    finally:
        server.stop()


def test_a_server_that_stops_and_comes_back_is_reconnected_within_the_backoff(clips):
    server = Server(clips)
    _, want = clips["h264"]
    p = subprocess.Popen([TPUHAL, "decode", "--device", "sim:0", server.url("h264"), "--md5", "--transport", "tcp",
                          "--frames", str(len(want) + 10), "--timeout-ms", "1000", "--backoff-ms", "100:400"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Some frames in (the server sends in real time, 25 fps), then the
        # server dies, and comes back a second later.
        first = [p.stdout.readline() for _ in range(5)]
        server.p.send_signal(signal.SIGKILL)
        server.p.wait()
        time.sleep(1.0)
        restarted = time.monotonic()
        server.start()
        # (communicate() would miss what readline() buffered.)
        out = p.stdout.read()
        err = p.stderr.read()
        p.wait(60)
        back = time.monotonic() - restarted
        assert p.returncode == 0, err
        assert "reconnected (h264 320x240)" in err
        got = [l.rsplit(",", 1)[1].strip() for l in "".join(first + [out]).splitlines() if l.count(",") == 3]
        assert len(got) == len(want) + 10
        # What came before the drop is the clip's start; after the restart,
        # a whole new stream from its first frame.
        assert got[:5] == want[:5]
        assert any(got[i:i + 10] == want[:10] for i in range(1, len(got) - 9))
        print(f"finished {back:.2f} s after the server came back")
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        server.stop()


def test_a_server_that_never_comes_back_makes_decode_give_up_after_its_attempts(clips):
    dead = f"rtsp://127.0.0.1:{free_port()}/h264"
    started = time.monotonic()
    r = subprocess.run([TPUHAL, "decode", "--device", "sim:0", dead, "--timeout-ms", "500"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and "cannot open the stream" in r.stderr
    server = Server(clips)
    p = subprocess.Popen([TPUHAL, "decode", "--device", "sim:0", server.url("h264"), "--md5", "--transport", "tcp",
                          "--timeout-ms", "500", "--backoff-ms", "50:200", "--reconnect-max", "3"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().count(",") == 3  # decoding
        server.stop()  # for good
        lost = time.monotonic()
        p.stdout.read()
        err = p.stderr.read()
        p.wait(60)
        assert p.returncode != 0
        assert "gave up after 3 attempt(s)" in err, err
        # 50 + 100 + 200 ms of backoff, and three refused connections.
        assert time.monotonic() - lost < 30
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert time.monotonic() - started < 60


def test_python_reads_a_live_stream_sees_new_streams_and_interrupts_a_blocked_read(clips):
    import threading
    import tpuhal
    server = Server(clips)
    try:
        _, want = clips["h264"]
        d = tpuhal.Demuxer(server.url("h264"), transport="tcp", timeout=2.0, initial_backoff=0.05)
        assert d.live and d.codec == tpuhal.Codec.H264 and (d.width, d.height) == (320, 240)
        packets = []
        for p in d:
            packets.append(p)
            if sum(q.new_stream for q in packets) == 1 and len(packets) > len(want) + 3:
                break
        firsts = [i for i, p in enumerate(packets) if p.new_stream]
        assert firsts == [len(want)], "the stream ended after its packets and came back"
        assert packets[len(want)].keyframe and d.reconnects == 1
        assert all(b.arrival_ns >= a.arrival_ns > 0 for a, b in zip(packets, packets[1:]))
        # interrupt() from another thread ends a read that waits on the server.
        server.p.send_signal(signal.SIGSTOP)
        threading.Timer(0.3, d.interrupt).start()
        started = time.monotonic()
        with pytest.raises(StopIteration):
            while True:
                next(d)
        assert time.monotonic() - started < 1.5
        server.p.send_signal(signal.SIGCONT)
        with pytest.raises(tpuhal.InvalidArgument, match="transport"):
            tpuhal.Demuxer(server.url("h264"), transport="quic")
    finally:
        server.p.send_signal(signal.SIGCONT)
        server.stop()
