"""Video decoding from Python against ffmpeg itself: clips made at test time
with Debian's ffmpeg (testsrc2), every frame's MD5 checked against ffmpeg's
framemd5; damaged packets, channel limits, threads, and a small pipeline
(decode, colour conversion on the device, compared with NumPy)."""
import gc
import hashlib
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import tpuhal
from tpuhal import ops

FFMPEG = shutil.which("ffmpeg")

# name -> (ffmpeg output options, size, frames)
CLIPS = {
    "h264.mp4": ("-c:v libx264 -pix_fmt yuv420p", "320x240", 20),
    "h264_bframes.mkv": ("-c:v libx264 -bf 3 -g 12 -pix_fmt yuv420p", "320x240", 30),
    "h265.mp4": ("-c:v libx265 -x265-params log-level=none -pix_fmt yuv420p", "320x240", 12),
    "h264_odd.h264": ("-c:v libx264 -bf 2 -pix_fmt yuv420p", "322x182", 10),
    "image.jpg": ("-pix_fmt yuvj420p", "320x240", 1),
    "camera.h264": ("-c:v libx264 -bf 0 -g 5 -pix_fmt yuv420p", "320x240", 5),  # no B frames
}


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """The clips above, made once for this module: {name: path}."""
    if FFMPEG is None:
        pytest.skip("ffmpeg is not installed (Debian: apt-get install ffmpeg); the video tests make their "
                    "clips with it and compare with its framemd5")
    d = tmp_path_factory.mktemp("clips")
    out = {}
    for name, (args, size, frames) in CLIPS.items():
        path = d / name
        cmd = [FFMPEG, "-v", "error", "-y", "-f", "lavfi", "-i", f"testsrc2=size={size}:rate=25",
               "-frames:v", str(frames), *args.split(), str(path)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"ffmpeg could not make {name} ({' '.join(cmd)}): {r.stderr.strip()}")
        out[name] = path
    return out


def ffmpeg_md5(path):
    """ffmpeg's MD5 of each decoded frame (planar YUV 4:2:0, rows packed), in display order."""
    r = subprocess.run([FFMPEG, "-v", "error", "-i", str(path), "-fps_mode", "passthrough", "-f", "framemd5", "-"],
                       capture_output=True, text=True, check=True)
    return [line.rsplit(",", 1)[1].strip() for line in r.stdout.splitlines() if line and not line.startswith("#")]


def frame_md5(frame):
    """The MD5 of a frame's Y, U and V planes packed tightly as I420, from to_numpy()."""
    planes = frame.to_numpy()
    if frame.format == tpuhal.PixelFormat.NV12:
        y, uv = planes
        planes = (y, uv[..., 0], uv[..., 1])
    h = hashlib.md5()
    for p in planes:
        h.update(np.ascontiguousarray(p).tobytes())
    return h.hexdigest()


def decode_md5(dev, path, fmt, **options):
    demux = tpuhal.Demuxer(path)
    with dev.open_decoder(demux.codec, format=fmt, **options) as dec:
        return [frame_md5(f) for f in dec.decode(demux)]


@pytest.fixture(scope="module")
def dev():
    with tpuhal.open("sim:0") as d:  # 256 decode channels
        yield d


# ---- Bitexact against ffmpeg --------------------------------------------------

@pytest.mark.parametrize("fmt", ["i420", "nv12"])
@pytest.mark.parametrize("name", ["h264.mp4", "h264_bframes.mkv", "h265.mp4", "h264_odd.h264", "image.jpg"])
def test_every_frame_matches_ffmpeg(dev, clips, name, fmt):
    want = ffmpeg_md5(clips[name])
    assert len(want) == CLIPS[name][2]
    assert decode_md5(dev, clips[name], fmt) == want


def test_demuxer_describes_the_file_and_gives_packets(clips):
    d = tpuhal.Demuxer(clips["h264.mp4"])
    assert (d.codec, d.width, d.height) == (tpuhal.Codec.H264, 320, 240)
    assert d.path == str(clips["h264.mp4"])
    packets = list(d)
    assert len(packets) == 20
    assert all(isinstance(p.data, bytes) and len(p) == len(p.data) > 0 for p in packets)
    assert packets[0].keyframe
    assert packets[0].data.startswith((b"\x00\x00\x00\x01", b"\x00\x00\x01"))  # Annex B
    assert list(d) == []  # read once
    assert tpuhal.Demuxer(clips["h265.mp4"]).codec == "h265"
    assert tpuhal.Demuxer(clips["image.jpg"]).codec == tpuhal.Codec.Jpeg


def test_frames_carry_pts_packet_index_and_planes(dev, clips):
    demux = tpuhal.Demuxer(clips["h264_bframes.mkv"])
    packets = list(demux)
    with dev.open_decoder(demux.codec, format="nv12", max_width=640, max_height=480) as dec:
        assert (dec.codec, dec.format, dec.max_width, dec.max_height, dec.frame_buffers) == ("h264", "nv12", 640,
                                                                                             480, 4)
        seen = []
        for i, f in enumerate(dec.decode(packets)):
            assert (f.width, f.height, f.format, f.channel, f.index) == (320, 240, "nv12", dec.channel, i)
            (yo, yp, yb, yr), (co, cp, cb, cr) = f.planes
            assert (yb, yr, cb, cr) == (320, 240, 320, 120)
            assert yp >= yb and cp >= cb and co >= yo + yp * yr
            assert co + cp * (cr - 1) + cb <= f.buffer.size
            assert f.buffer.memory == tpuhal.Memory.Device
            assert f.luma().shape == (240, 320) and f.luma().dtype == "u8"
            assert f.chroma().shape == (120, 160, 2)
            y, uv = f.to_numpy()
            assert (y.shape, uv.shape, y.dtype) == ((240, 320), (120, 160, 2), np.uint8)
            seen.append((f.pts, f.packet))
        assert dec.end_of_stream
        assert dec.packets_sent == 30 and dec.frames_received == 30
    # Display order: B-frames come out after the frames they refer to.
    pts = [p for p, _ in seen]
    assert pts == sorted(pts) and len(set(pts)) == 30
    assert sorted(p.pts for p in packets) == pts
    by_packet = {p.pts: i for i, p in enumerate(packets)}
    assert all(by_packet[p] == k for p, k in seen)
    assert [k for _, k in seen] != sorted(k for _, k in seen)  # reordered


def test_i420_views_and_arrays(dev, clips):
    demux = tpuhal.Demuxer(clips["h264_odd.h264"])  # 322x182: chroma 161x91
    with dev.open_decoder(demux.codec, format=tpuhal.PixelFormat.I420) as dec:
        f = next(iter(dec.decode(demux, flush=False)))
        assert len(f.planes) == 3
        assert f.u().shape == f.v().shape == (91, 161)
        y, u, v = f.to_numpy(queue=dev.queue("copy"))
        assert (y.shape, u.shape, v.shape) == ((182, 322), (91, 161), (91, 161))
        # The views and the arrays are the same bytes.
        assert np.array_equal(f.luma().buffer.download(np.uint8, f.buffer.size)[
            f.planes[0][0]:f.planes[0][0] + f.planes[0][1] * 182].reshape(182, -1)[:, :322], y)
        with pytest.raises(tpuhal.Error):
            f.chroma()


def test_try_receive_never_waits_and_gives_every_frame(dev, clips):
    packets = list(tpuhal.Demuxer(clips["h264.mp4"]))
    want = ffmpeg_md5(clips["h264.mp4"])
    got = []
    with dev.open_decoder("h264", format="i420") as dec:
        # All packets in flight at once; collect only what is ready.
        for p in packets:
            dec.send(p.data, pts=p.pts)
            if (f := dec.try_receive()) is not None:
                got.append(frame_md5(f))
                del f
        dec.flush()
        deadline = time.monotonic() + 60
        while not dec.end_of_stream and time.monotonic() < deadline:
            if (f := dec.try_receive()) is not None:
                got.append(frame_md5(f))
                del f
            else:
                time.sleep(0.001)
        assert dec.end_of_stream
        assert dec.try_receive() is None
        assert got == want


def test_send_and_receive_step_by_step(dev, clips):
    packets = list(tpuhal.Demuxer(clips["h264.mp4"]))
    want = ffmpeg_md5(clips["h264.mp4"])
    got = []
    with dev.open_decoder("h264", format="i420") as dec:
        for p in packets:
            dec.send(bytearray(p.data), pts=1000 + p.pts)  # any buffer-protocol object
            while (f := dec.receive(timeout=30)) is not None:
                got.append((f.pts, frame_md5(f)))
                del f
        assert not dec.end_of_stream
        dec.flush()
        with pytest.raises(tpuhal.FailedPrecondition):
            dec.send(packets[0].data)
        while (f := dec.receive()) is not None:
            got.append((f.pts, frame_md5(f)))
            del f
        assert dec.end_of_stream
        assert [m for _, m in got] == want
        assert [p for p, _ in got] == sorted(1000 + p.pts for p in packets)  # display order
        # reset() starts a new stream: the counters too.
        dec.reset()
        assert (dec.packets_sent, dec.frames_received, dec.end_of_stream) == (0, 0, False)
        frames = [frame_md5(f) for f in dec.decode([(np.frombuffer(p.data, np.uint8), 7) for p in packets])]
        assert frames == want
    assert dec.closed
    with pytest.raises(tpuhal.FailedPrecondition, match="closed"):
        dec.send(packets[0].data)


def test_frames_outlive_their_decoder(dev, clips):
    demux = tpuhal.Demuxer(clips["image.jpg"])
    with dev.open_decoder(demux.codec, format="i420") as dec:
        frame = next(dec.decode(demux))
    assert frame_md5(frame) == ffmpeg_md5(clips["image.jpg"])[0]


# ---- Errors -------------------------------------------------------------------

def test_truncated_packet_raises_naming_the_packet_and_the_stream_goes_on(dev, clips):
    packets = list(tpuhal.Demuxer(clips["h265.mp4"]))
    packets[3] = tpuhal.Packet(packets[3].data[:len(packets[3].data) // 2], packets[3].pts)
    with dev.open_decoder("h265") as dec:
        with pytest.raises(tpuhal.InvalidArgument) as err:
            for _ in dec.decode(packets):
                pass
        assert "packet 3" in str(err.value)
        assert "sim:0" in str(err.value) and f"channel {dec.channel}" in str(err.value)
        assert err.value.status == tpuhal.Status.InvalidArgument
        # The decoder keeps going: the packets after it still give frames.
        dec.reset()
        errors, frames = [], 0
        for p in packets:
            dec.send(p)
            while True:
                try:
                    f = dec.receive(timeout=30)
                except tpuhal.InvalidArgument as e:
                    errors.append(str(e))
                    continue
                if f is None:
                    break
                frames += 1
                del f
        dec.flush()
        while True:
            try:
                f = dec.receive(timeout=30)
            except tpuhal.InvalidArgument as e:
                errors.append(str(e))
                continue
            if f is None:
                break
            frames += 1
            del f
    assert errors and "packet 3" in errors[0]
    assert frames >= 6


def test_truncated_jpeg_raises_and_the_next_one_decodes(dev, clips):
    data = clips["image.jpg"].read_bytes()
    with dev.open_decoder("jpeg", format="i420", max_width=640, max_height=480) as dec:
        dec.send(data[:len(data) // 3], 1)
        dec.send(data, 2)
        with pytest.raises(tpuhal.InvalidArgument, match="packet 0"):
            dec.receive(timeout=30)
        f = dec.receive(timeout=30)
        assert f is not None and f.pts == 2 and f.packet == 1
        assert frame_md5(f) == ffmpeg_md5(clips["image.jpg"])[0]


def test_one_channel_too_many_raises_resource_exhausted():
    with tpuhal.open("sim:tiny") as tiny:
        gc.collect()  # decoders of earlier tests sitting in reference cycles
        n = tiny.properties.decode_channels
        assert n == 2
        decoders = [tiny.open_decoder("h264") for _ in range(n)]
        assert len({d.channel for d in decoders}) == n
        with pytest.raises(tpuhal.ResourceExhausted):
            tiny.open_decoder("h264")
        decoders[0].close()
        tiny.open_decoder("h264").close()  # the channel came back
        for d in decoders:
            d.close()


def test_bad_arguments(dev, clips, tmp_path):
    with pytest.raises(tpuhal.InvalidArgument, match="unknown codec 'vp9'"):
        dev.open_decoder("vp9")
    with pytest.raises(tpuhal.InvalidArgument, match="pixel format"):
        dev.open_decoder("h264", format="rgb")
    with pytest.raises(tpuhal.Error):
        dev.open_decoder("h264", frame_buffers=0)
    with pytest.raises(tpuhal.NotFound, match="missing.mp4"):
        tpuhal.Demuxer(tmp_path / "missing.mp4")
    (tmp_path / "text.mp4").write_text("not a video")
    with pytest.raises(tpuhal.InvalidArgument, match="text.mp4"):
        tpuhal.Demuxer(tmp_path / "text.mp4")
    with dev.open_decoder("h264") as dec:
        with pytest.raises(TypeError, match="buffer-protocol"):
            dec.send("a string")
        with pytest.raises(tpuhal.InvalidArgument, match="C-contiguous"):
            dec.send(np.zeros((8, 8), np.uint8)[:, ::2])


def test_holding_every_frame_buffer_raises_resource_exhausted(dev, clips):
    packets = list(tpuhal.Demuxer(clips["h264.mp4"]))
    with dev.open_decoder("h264", frame_buffers=2) as dec:
        held = []
        with pytest.raises(tpuhal.ResourceExhausted):
            for f in dec.decode(packets):
                held.append(f)
        assert 1 <= len(held) <= 2


def test_a_frame_buffer_wait_lets_another_thread_drop_a_frame_and_interrupt_ends_it(dev, clips):
    packets = list(tpuhal.Demuxer(clips["h264.mp4"]))
    with pytest.raises(tpuhal.InvalidArgument, match="frame_buffer_wait must be >= 0"):
        dev.open_decoder("h264", frame_buffer_wait=-1)
    with dev.open_decoder("h264", frame_buffers=2, frame_buffer_wait=0.2) as dec:
        assert dec.frame_buffer_wait == pytest.approx(0.2)
        for p in packets:
            dec.send(p)
        held = [dec.receive(30), dec.receive(30)]
        with pytest.raises(tpuhal.ResourceExhausted, match="none came back for 200 ms"):
            dec.receive(30)
        dec.interrupt()  # with no receive() in progress: the next one returns None at once
        assert dec.receive(30) is None and not dec.end_of_stream
        held.pop(0)
        assert dec.receive(30).index == 2
    with dev.open_decoder("h264", frame_buffers=2, frame_buffer_wait=60) as dec:
        for p in packets:
            dec.send(p)
        held = [dec.receive(30), dec.receive(30)]
        # Another thread drops one while receive() may be waiting for it.
        dropper = threading.Thread(target=held.pop, args=(0,))
        dropper.start()
        f = dec.receive(30)
        dropper.join()
        assert f.index == 2
        # And interrupt() from another thread ends a wait that nothing else would.
        held.append(f)
        stopper = threading.Thread(target=dec.interrupt)
        stopper.start()
        assert dec.receive(30) is None
        stopper.join()


# ---- Threads ------------------------------------------------------------------

def test_channels_decode_in_parallel_from_threads(dev, clips):
    names = ["h264.mp4", "h265.mp4", "h264_bframes.mkv", "image.jpg"] * 2
    want = {n: ffmpeg_md5(clips[n]) for n in set(names)}
    channels = set()

    def work(name):
        demux = tpuhal.Demuxer(clips[name])
        with dev.open_decoder(demux.codec, format="nv12") as dec:
            channels.add(dec.channel)
            return [frame_md5(f) for f in dec.decode(demux)]

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(work, names))
    assert got == [want[n] for n in names]
    assert len(channels) >= 2  # decoders open at the same time had channels of their own


def test_one_decoder_shared_by_a_sender_and_a_receiver_thread(dev, clips):
    packets = list(tpuhal.Demuxer(clips["h264.mp4"]))
    want = ffmpeg_md5(clips["h264.mp4"])
    got = []
    with dev.open_decoder("h264", format="i420", frame_buffers=8) as dec:
        sent = threading.Event()

        def sender():
            for p in packets:
                while True:
                    try:
                        dec.send(p)
                        break
                    except tpuhal.ResourceExhausted:
                        time.sleep(0.001)  # the receiver holds the buffers; try again
            sent.set()

        t = threading.Thread(target=sender)
        t.start()
        while not sent.is_set():
            f = dec.receive(timeout=30)
            if f is None:
                time.sleep(0.001)  # nothing until the sender sends more
                continue
            got.append(frame_md5(f))
            del f
        t.join()
        dec.flush()
        while (f := dec.receive(timeout=30)) is not None:
            got.append(frame_md5(f))
            del f
    assert got == want


# ---- A small pipeline ---------------------------------------------------------

def bt601(y, u, v):
    """docs/ops.md's BT.601 limited-range conversion, chroma per 2x2 block: [3, H, W] float32."""
    h, w = y.shape
    u = np.repeat(np.repeat(u.astype(np.float32), 2, 0), 2, 1)[:h, :w] - 128
    v = np.repeat(np.repeat(v.astype(np.float32), 2, 0), 2, 1)[:h, :w] - 128
    c = 1.164 * (y.astype(np.float32) - 16)
    rgb = np.stack([c + 1.596 * v, c - 0.813 * v - 0.391 * u, c + 2.018 * u])
    return np.clip(rgb, 0, 255)


@pytest.mark.parametrize("fmt", ["nv12", "i420"])
def test_pipeline_decode_convert_on_device_matches_numpy(dev, clips, fmt):
    demux = tpuhal.Demuxer(clips["h264.mp4"])
    q = dev.queue("compute")
    mean, scale = (0.485 * 255, 0.456 * 255, 0.406 * 255), (1 / 58.4, 1 / 57.1, 1 / 57.4)
    rgb = dev.tensor((3, demux.height, demux.width), "f32")
    pooled = dev.tensor((1, 3, demux.height // 2, demux.width // 2), "f32")
    checked = 0
    with dev.open_decoder(demux.codec, format=fmt) as dec:
        for frame in dec.decode(demux):
            if fmt == "nv12":
                op = ops.nv12_to_rgb(frame.luma(), frame.chroma(), rgb, mean=mean, scale=scale)
                y, uv = frame.to_numpy()
                u, v = uv[..., 0], uv[..., 1]
            else:
                op = ops.i420_to_rgb(frame.luma(), frame.u(), frame.v(), rgb, mean=mean, scale=scale)
                y, u, v = frame.to_numpy()
            pool = ops.max_pool2d(rgb.reshape(1, 3, demux.height, demux.width), pooled, kernel=2)
            q.batch().run(op).run(pool).submit().wait(timeout=30)
            want = (bt601(y, u, v) - np.array(mean, np.float32)[:, None, None]) * \
                np.array(scale, np.float32)[:, None, None]
            got = rgb.download()
            np.testing.assert_allclose(got, want, atol=0.02)
            want_pool = want.reshape(3, demux.height // 2, 2, demux.width // 2, 2).max(axis=(2, 4))
            np.testing.assert_allclose(pooled.download()[0], want_pool, atol=0.02)
            assert np.ptp(got) > 1  # a real picture, not a constant
            checked += 1
    assert checked == 20


# ---- The board's clock ------------------------------------------------------


def test_a_packet_timed_on_a_virtual_clock_is_done_its_modelled_decode_after_it_arrives(clips, monkeypatch):
    # TPUHAL_SIM_CLOCK=virtual: the board keeps the timing model's time alone,
    # so the frame's time is the model's to the nanosecond on any host.
    monkeypatch.setenv("TPUHAL_SIM_CLOCK", "virtual")
    with tpuhal.open("sim:bm1684x") as board:
        assert board.properties.caps.wait_time
        packet = next(iter(tpuhal.Demuxer(clips["camera.h264"])))
        at = board.board_time_ns() + 2_000_000_000  # two seconds ahead: nobody waits for them
        with board.open_decoder("h264", max_width=320, max_height=240) as dec:
            dec.send(packet, arrival_ns=at)
            frame = dec.receive(timeout=30)
            assert frame.decoded_ns == at + board.modelled_decode_ns("h264", "I", 320, 240)
            del frame
        # Work after it waits for its time too, and the board's now follows.
        q = board.queue()
        stamp = board.alloc(8, "host_pinned")
        q.batch().wait_until(at + 5_000_000).timestamp(stamp, 0).submit().wait()
        assert int(stamp.map(np.uint64)[0]) == at + 5_000_000
        assert board.board_time_ns() >= at + 5_000_000
        with pytest.raises(tpuhal.InvalidArgument, match="2\\^62"):
            q.batch().wait_until(2**62 + 1)
