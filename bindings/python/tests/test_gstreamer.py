"""The GStreamer plugin (gst/, docs/video.md): gst-inspect-1.0 and
gst-launch-1.0 from Debian's gstreamer1.0-tools run libgsttpuhal.so from
the build tree (GST_PLUGIN_PATH, a registry of the test's own).

- tpuhaldec's frames are byte for byte ffmpeg's for H.264, H.265 and JPEG,
  in I420 and NV12, copied to system memory or read from device memory;
- rtspsrc from a real RTSP server (tests/video/rtsp_server.py) through
  tpuhaldec ! tpuhalconvert ! tpuhalinfer classifies every frame as the
  same steps through the Python API do, frame by frame;
- a funnel of two streams into one tpuhalinfer runs them in batches of two,
  with the same results;
- a detector compiled with --detect gives each frame the boxes the Python
  API gives, as messages and as region-of-interest metas;
- a corrupt stream and a bad model are errors naming the element (and the
  channel); the pipeline stops cleanly;
- GStreamer's leaks tracer finds no buffer, memory, caps or element left
  alive at exit.
In the sanitizer build the tools run with the sanitizer runtimes preloaded
(the test environment's LD_PRELOAD), so the plugin runs under them."""
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

import tpuhal
from tpuhal import ops

PLUGIN_DIR = os.environ.get("TPUHAL_GST_PLUGIN_DIR", "")
LAUNCH = shutil.which("gst-launch-1.0")
INSPECT = shutil.which("gst-inspect-1.0")
FFMPEG = shutil.which("ffmpeg")
SERVER = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "video", "rtsp_server.py")
MEAN = "123.7,116.3,103.5"
SCALE = "0.0171,0.0175,0.0174"

if not PLUGIN_DIR:
    pytest.skip("libgsttpuhal.so is not built (GStreamer's development files are missing; scripts/setup.sh "
                "installs them)", allow_module_level=True)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    if LAUNCH is None or INSPECT is None:
        pytest.fail("gst-launch-1.0 / gst-inspect-1.0 are missing (Debian: gstreamer1.0-tools)")
    if FFMPEG is None:
        pytest.fail("ffmpeg is missing (scripts/setup.sh installs it)")
    d = tmp_path_factory.mktemp("gst")
    e = dict(os.environ)
    e["GST_PLUGIN_PATH"] = PLUGIN_DIR
    e["GST_REGISTRY"] = str(d / "registry.bin")
    e["TPUHAL_LOG"] = "error"
    return e


def launch(env, pipeline, *flags, check=True, tracer=False, timeout=120):
    e = dict(env)
    if tracer:
        e["GST_TRACERS"] = "leaks"
        e["GST_DEBUG"] = "GST_TRACER:7"
        e["GST_DEBUG_NO_COLOR"] = "1"
    r = subprocess.run([LAUNCH, *flags, *pipeline.split()], capture_output=True, text=True, env=e, timeout=timeout)
    if check:
        assert r.returncode == 0, f"gst-launch-1.0 {pipeline}\n{r.stdout}\n{r.stderr}"
    return r


def ffmpeg(*args):
    subprocess.run([FFMPEG, "-nostdin", "-v", "error", "-y", *args], check=True)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("clips")
    out = {}
    for name, args in {"h264": "-c:v libx264 -g 10 -bf 2 -pix_fmt yuv420p",
                       "h265": "-c:v libx265 -x265-params log-level=none:keyint=10 -pix_fmt yuv420p"}.items():
        path = d / f"{name}.mp4"
        ffmpeg("-f", "lavfi", "-i", "testsrc2=size=320x240:rate=25", "-frames:v", "30", *args.split(), str(path))
        out[name] = path
    out["jpeg"] = d / "pic.jpg"
    ffmpeg("-f", "lavfi", "-i", "testsrc2=size=320x240", "-frames:v", "1", "-pix_fmt", "yuvj420p", str(out["jpeg"]))
    out["mjpeg"] = d / "mjpeg.avi"
    ffmpeg("-f", "lavfi", "-i", "testsrc2=size=320x240:rate=25", "-frames:v", "10", "-c:v", "mjpeg", "-pix_fmt",
           "yuvj420p", str(out["mjpeg"]))
    return out


def raw(path, tmp_path, pix_fmt=None):
    """ffmpeg's decode of `path` as raw planes (its own pixel format, or pix_fmt)."""
    out = tmp_path / f"ref-{path.stem}-{pix_fmt}.yuv"
    ffmpeg("-i", str(path), *(["-pix_fmt", pix_fmt] if pix_fmt else []), "-f", "rawvideo", str(out))
    return out.read_bytes()


def test_inspect_lists_the_elements_and_their_properties(env):
    r = subprocess.run([INSPECT, "tpuhal"], capture_output=True, text=True, env=env, check=True)
    for element in ("tpuhaldec", "tpuhalconvert", "tpuhalinfer"):
        assert element in r.stdout, r.stdout
    r = subprocess.run([INSPECT, "tpuhaldec"], capture_output=True, text=True, env=env, check=True)
    assert "memory:TpuhalDevice" in r.stdout and "video/x-h265" in r.stdout and "image/jpeg" in r.stdout
    for prop in ("device", "frame-buffers", "in-flight", "channel", "corrupt-packets", "frame-buffer-timeout",
                 "exhausted-waits"):
        assert re.search(rf"^\s+{prop}\s*:", r.stdout, re.M), (prop, r.stdout)
    r = subprocess.run([INSPECT, "tpuhalinfer"], capture_output=True, text=True, env=env, check=True)
    for prop in ("model", "batch-size", "top-k", "messages"):
        assert re.search(rf"^\s+{prop}\s", r.stdout, re.M), (prop, r.stdout)


PARSE = {"h264": "qtdemux ! h264parse", "h265": "qtdemux ! h265parse", "jpeg": "jpegparse",
         "mjpeg": "avidemux ! jpegparse"}


@pytest.mark.parametrize("name", ["h264", "h265", "jpeg", "mjpeg"])
@pytest.mark.parametrize("fmt", ["I420", "NV12"])
def test_decoded_frames_are_ffmpegs(env, clips, tmp_path, name, fmt):
    if name in ("jpeg", "mjpeg") and fmt == "NV12":
        pytest.skip("JPEG is 4:2:0 planar in ffmpeg; I420 covers it")
    out = tmp_path / "out.yuv"
    launch(env, f"filesrc location={clips[name]} ! {PARSE[name]} ! tpuhaldec device=sim:0 ! "
                f"video/x-raw,format={fmt} ! filesink location={out}")
    # JPEG is full range: compare with ffmpeg's own planes, no conversion.
    want = raw(clips[name], tmp_path, None if "jpeg" in name else {"I420": "yuv420p", "NV12": "nv12"}[fmt])
    got = out.read_bytes()
    assert len(got) == len(want)
    assert got == want


def test_device_memory_reads_back_as_the_same_frames(env, clips, tmp_path):
    # filesink takes any caps: tpuhaldec prefers device memory, and reading
    # that memory copies it from the board.
    out = tmp_path / "out.yuv"
    r = launch(env, f"filesrc location={clips['h264']} ! qtdemux ! h264parse ! tpuhaldec ! filesink location={out}",
               "-v")
    assert "video/x-raw(memory:TpuhalDevice), format=(string)NV12" in r.stdout
    assert out.read_bytes() == raw(clips["h264"], tmp_path, "nv12")


def alive(stderr):
    """What the leaks tracer found alive at exit."""
    return re.findall(r"object-alive, type-name=\(string\)(\w+)", stderr)


def test_nothing_is_left_alive(env, clips, tmp_path, model_path):
    for tail in ("queue ! fakesink", "video/x-raw,format=I420 ! fakesink",
                 f"tpuhalconvert ! tpuhalinfer model={model_path[2]} ! fakesink"):
        r = launch(env, f"filesrc location={clips['h264']} ! qtdemux ! h264parse ! tpuhaldec ! {tail}",
                   tracer=True)
        assert "leaks" in r.stderr  # the tracer ran
        assert alive(r.stderr) == [], tail


def chains(stdout):
    """Buffers a `fakesink silent=false` took, as gst-launch-1.0 -v prints them."""
    return len(re.findall(r"last-message = chain", stdout))


@pytest.fixture(scope="module")
def long_clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("long") / "h264-3s.mp4"
    ffmpeg("-f", "lavfi", "-i", "testsrc2=size=320x240:rate=25", "-frames:v", "75", "-c:v", "libx264", "-g", "10",
           "-bf", "2", "-pix_fmt", "yuv420p", str(path))
    return path


def test_a_downstream_that_holds_frames_gets_every_one(env, long_clip):
    # A clock-synchronised sink behind a queue: downstream holds the 4 frame
    # buffers most of the time, and the decoder waits for each to come back
    # (a frame every 40 ms: never long enough to warn).
    r = launch(env, f"filesrc location={long_clip} ! qtdemux ! h264parse ! tpuhaldec frame-buffers=4 ! queue ! "
                    "fakesink sync=true silent=false", "-v")
    assert chains(r.stdout) == 75, r.stdout[-2000:]
    assert "frame buffers" not in r.stdout + r.stderr
    # 30 frames held downstream at once, with room for them.
    r = launch(env, f"filesrc location={long_clip} ! qtdemux ! h264parse ! tpuhaldec frame-buffers=36 ! "
                    "queue min-threshold-buffers=30 max-size-buffers=40 ! fakesink silent=false", "-v")
    assert chains(r.stdout) == 75, r.stdout[-2000:]


def test_a_pool_held_downstream_is_a_warning_then_a_bounded_error(env, long_clip):
    # The queue holds 30 before it lets one go; the decoder has 4.
    r = launch(env, f"filesrc location={long_clip} ! qtdemux ! h264parse ! tpuhaldec frame-buffers=4 "
                    "frame-buffer-timeout=2500 ! queue min-threshold-buffers=30 ! fakesink", check=False)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert re.search(r"WARNING: from element .*tpuhaldec0.*channel \d+: downstream holds all 4 frame buffers; "
                     r"waiting for one \(raise frame-buffers", out), out
    assert re.search(r"ERROR: from element .*tpuhaldec0.*", out), out
    assert "frame-buffer-timeout" in out, out


def test_stopping_ends_a_wait_for_a_frame_buffer(env, long_clip):
    # No bound: the decoder would wait for ever; stopping the pipeline
    # (gst-launch-1.0 on SIGINT goes to NULL) ends the wait.
    p = subprocess.Popen([LAUNCH, *f"filesrc location={long_clip} ! qtdemux ! h264parse ! tpuhaldec frame-buffers=4 ! "
                                   "queue min-threshold-buffers=30 ! fakesink".split()],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        seen = ""
        for line in p.stdout:
            seen += line
            if "downstream holds all 4 frame buffers" in line:
                break
        assert "downstream holds all 4 frame buffers" in seen, seen
        p.send_signal(signal.SIGINT)
        rest, _ = p.communicate(timeout=60)
        assert p.returncode is not None, seen + rest
        assert "Freeing pipeline" in seen + rest, seen + rest
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def corrupt_annexb(data):
    """The 6th slice NAL's last two thirds overwritten with 0xFF."""
    starts = [m.start() for m in re.finditer(b"\x00\x00\x01", data)]
    slices = [s for s in starts if data[s + 3] & 0x1F in (1, 5)]
    s = slices[5]
    end = next((x for x in starts if x > s), len(data))
    a = s + 3 + (end - s) // 3
    return data[:a] + b"\xff" * (end - a) + data[end:]


def test_a_corrupt_stream_is_an_error_naming_element_and_channel(env, clips, tmp_path):
    es = tmp_path / "clip.h264"
    ffmpeg("-i", str(clips["h264"]), "-c", "copy", "-f", "h264", str(es))
    bad = tmp_path / "bad.h264"
    bad.write_bytes(corrupt_annexb(es.read_bytes()))
    r = launch(env, f"filesrc location={bad} ! h264parse ! tpuhaldec ! fakesink", check=False)
    assert r.returncode != 0
    assert re.search(r"ERROR: from element .*tpuhaldec0: channel \d+: corrupt stream", r.stdout + r.stderr), \
        r.stdout + r.stderr
    # The same stream, with errors tolerated (max-errors=-1), plays to the end.
    r = launch(env, f"filesrc location={bad} ! h264parse ! tpuhaldec max-errors=-1 ! fakesink", check=False)
    assert r.returncode == 0, r.stdout + r.stderr


# -- inference ---------------------------------------------------------------

SIZE = 64


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    onnx = pytest.importorskip("onnx", reason="python3-onnx is not installed (scripts/setup.sh installs it)")
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(11)
    wc = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    bc = (rng.standard_normal(8) * 0.1).astype(np.float32)
    wf = (rng.standard_normal((10, 8)) * 0.5).astype(np.float32)
    bf = (rng.standard_normal(10) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "wc", "bc"], ["c"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
        helper.make_node("Softmax", ["y"], ["probs"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "classifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(a, n) for a, n in ((wc, "wc"), (bc, "bc"), (wf, "wf"), (bf, "bf"))])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    d = tmp_path_factory.mktemp("model")
    paths = {}
    for batch in (1, 2):
        paths[batch] = d / f"net{batch}.tpm"
        tpuhal.compile(m.SerializeToString(), "fp32", shapes={"x": (batch, 3, SIZE, SIZE)},
                       device="sim:0").save(paths[batch])
    return paths


def reference(path, model):
    """Per frame of `path`: the classes and scores the Python API gives for
    decode -> nv12_to_rgb -> resize (linear) -> the model."""
    mean = [float(v) for v in MEAN.split(",")]
    scale = [float(v) for v in SCALE.split(",")]
    with tpuhal.open("sim:0") as dev:
        m = dev.load_model(str(model))
        inst = m.instance()
        demux = tpuhal.Demuxer(str(path))
        w, h = demux.width, demux.height
        q = dev.queue("compute")
        rgb = dev.tensor((3, h, w), "f32")
        small = dev.tensor((1, 3, SIZE, SIZE), "f32")
        out = []
        with dev.open_decoder(demux.codec, format="nv12", max_width=w, max_height=h) as dec:
            for frame in dec.decode(demux):
                q.batch().run(ops.nv12_to_rgb(frame.luma(), frame.chroma(), rgb, mean=mean, scale=scale)) \
                    .run(ops.resize(rgb.reshape(1, 3, h, w), small, mode="linear")).submit().wait(timeout=60)
                (probs,) = inst.run(small.download())
                out.append(probs[0])
    return out


def inference_messages(output):
    """frame -> (class, score, top-k text) from gst-launch-1.0 -m."""
    got = {}
    for line in output.splitlines():
        if "tpuhal-inference" not in line:
            continue
        frame = int(re.search(r"frame=\(guint64\)(\d+)", line).group(1))
        cls = int(re.search(r"class=\(int\)(-?\d+)", line).group(1))
        score = float(re.search(r"score=\(double\)([-0-9.e+]+)", line).group(1))
        channel = int(re.search(r"channel=\(uint\)(\d+)", line).group(1))
        got.setdefault(channel, {})[frame] = (cls, score)
    return got


def check_against(ref, got):
    assert sorted(got) == list(range(len(ref))), f"frames with results: {sorted(got)}"
    for i, probs in enumerate(ref):
        cls, score = got[i]
        best = int(np.argmax(probs))
        assert cls == best, (i, cls, best, probs)
        assert score == pytest.approx(float(probs[best]), rel=1e-5), (i, score, probs)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def rtsp(clips):
    r = subprocess.run(["/usr/bin/python3", "-c", "import gi; gi.require_version('GstRtspServer', '1.0');"
                        "from gi.repository import GstRtspServer"], capture_output=True, text=True)
    if r.returncode:
        pytest.fail(f"GStreamer's RTSP server is missing (Debian: gir1.2-gst-rtsp-server-1.0; scripts/setup.sh "
                    f"installs it): {r.stderr.strip()}")
    port = free_port()
    p = subprocess.Popen(["/usr/bin/python3", SERVER, "--port", str(port), f"h264={clips['h264']}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")})
    assert "serving" in p.stdout.readline(), p.stderr.read()
    yield f"rtsp://127.0.0.1:{port}"
    p.kill()
    p.wait()


def test_rtsp_to_inference_classifies_each_frame_as_the_api_does(env, clips, model_path, rtsp):
    ref = reference(clips["h264"], model_path[1])
    r = launch(env, f"rtspsrc location={rtsp}/h264 protocols=tcp ! rtph264depay ! h264parse ! "
                    f"tpuhaldec device=sim:0 ! tpuhalconvert mean={MEAN} scale={SCALE} ! "
                    f"tpuhalinfer device=sim:0 model={model_path[1]} ! fakesink", "-m")
    got = inference_messages(r.stdout)
    assert len(got) == 1, got
    check_against(ref, next(iter(got.values())))


DETECT_CLASSES = 3


@pytest.fixture(scope="module")
def detector_path(tmp_path_factory):
    """A small YOLOv8-style detector over the SIZE x SIZE input, compiled
    with --detect: [1, 4 + classes, 64] boxes in the input's pixels."""
    torch = pytest.importorskip("torch")

    class Detector(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4 + DETECT_CLASSES, 3, stride=8, padding=1)

        def forward(self, x):
            y = torch.flatten(self.conv(x), 2)
            return torch.cat((y[:, :2].sigmoid() * SIZE, y[:, 2:4].sigmoid() * (SIZE / 3), y[:, 4:].sigmoid()), 1)

    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.onnx.export(Detector().eval(), torch.rand(1, 3, SIZE, SIZE), buf, opset_version=13,
                      input_names=["x"], output_names=["head"])
    path = tmp_path_factory.mktemp("detector") / "det.tpm"
    tpuhal.compile(buf.getvalue(), device="sim:0", detect={"head": "yolov8", "score": 0.3, "max_boxes": 20}).save(path)
    return path


def detection_messages(output):
    """channel -> frame -> [(class, score, x1, y1, x2, y2)] from gst-launch-1.0 -m."""
    got = {}
    for line in output.splitlines():
        if "tpuhal-detection" not in line:
            continue
        frame = int(re.search(r"frame=\(guint64\)(\d+)", line).group(1))
        channel = int(re.search(r"channel=\(uint\)(\d+)", line).group(1))
        count = int(re.search(r"count=\(uint\)(\d+)", line).group(1))
        text = re.search(r'boxes=\(string\)"([^"]*)"', line).group(1).replace("\\", "")
        boxes = []
        for item in filter(None, text.split(";")):
            cls, score, corners = item.split(":")
            boxes.append((int(cls), float(score), *(float(v) for v in corners.split(","))))
        assert len(boxes) == count, line
        got.setdefault(channel, {})[frame] = boxes
    return got


def test_a_detector_gives_each_frames_boxes_as_the_api_does(env, clips, detector_path):
    ref = reference(clips["h264"], detector_path)
    r = launch(env, f"filesrc location={clips['h264']} ! qtdemux ! h264parse ! tpuhaldec ! "
                    f"tpuhalconvert mean={MEAN} scale={SCALE} ! tpuhalinfer model={detector_path} ! fakesink", "-m")
    got = detection_messages(r.stdout)
    assert list(got) == [0], got
    assert sorted(got[0]) == list(range(len(ref)))
    boxes = 0
    for i, rows in enumerate(ref):
        want = [(int(d[5]), *(float(np.float32(v)) for v in (d[4], *d[:4]))) for d in rows if d[5] >= 0]
        assert [(c, np.float32(s), *np.float32(b)) for c, s, *b in got[0][i]] == \
            [(c, np.float32(s), *np.float32(b)) for c, s, *b in want], f"frame {i}"
        boxes += len(want)
    assert boxes > len(ref), "the test's frames have boxes"
    # The region-of-interest metas, read by a pad probe in a process of its own.
    script = f"""
import gi, json
gi.require_version("Gst", "1.0"); gi.require_version("GstVideo", "1.0")
from gi.repository import GLib, Gst, GstVideo
Gst.init(None)
p = Gst.parse_launch("filesrc location={clips['h264']} ! qtdemux ! h264parse ! tpuhaldec ! "
                     "tpuhalconvert mean={MEAN} scale={SCALE} ! tpuhalinfer model={detector_path} messages=false ! "
                     "fakesink name=sink signal-handoffs=true")
frames = []
def handoff(sink, buf, pad):
    rois, k = [], 0
    while True:
        m = GstVideo.buffer_get_video_region_of_interest_meta_id(buf, k)
        if m is None:
            break
        d = m.get_param("detection")
        rois.append([GLib.quark_to_string(m.roi_type), m.x, m.y, m.w, m.h, d.get_value("class"),
                     d.get_value("score")])
        k += 1
    frames.append(rois)
p.get_by_name("sink").connect("handoff", handoff)
p.set_state(Gst.State.PLAYING)
msg = p.get_bus().timed_pop_filtered(120 * Gst.SECOND, Gst.MessageType.EOS | Gst.MessageType.ERROR)
p.set_state(Gst.State.NULL)
assert msg and msg.type == Gst.MessageType.EOS, msg and msg.parse_error()
print(json.dumps(frames))
"""
    out = subprocess.run(["/usr/bin/python3", "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    metas = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(metas) == len(ref)
    for i, rows in enumerate(ref):
        want = []
        for d in (d for d in rows if d[5] >= 0):
            x1, y1 = (int(min(max(v, 0), SIZE)) for v in d[:2])
            x2, y2 = (int(min(max(v, 0), SIZE)) for v in d[2:4])
            want.append([f"class-{int(d[5])}", x1, y1, max(x2, x1) - x1, max(y2, y1) - y1, int(d[5]),
                         pytest.approx(float(d[4]), rel=1e-7)])
        assert metas[i] == want, f"frame {i}"


def test_two_streams_batched_in_one_infer(env, clips, model_path):
    ref = reference(clips["h264"], model_path[1])
    branch = (f"filesrc location={clips['h264']} ! qtdemux ! h264parse ! tpuhaldec ! "
              f"tpuhalconvert mean={MEAN} scale={SCALE} ! f.")
    r = launch(env, f"funnel name=f ! tpuhalinfer model={model_path[2]} ! fakesink {branch} {branch}", "-m")
    got = inference_messages(r.stdout)
    assert len(got) == 2, f"channels: {sorted(got)}"
    for frames in got.values():
        check_against(ref, frames)


def test_a_bad_model_is_an_error_naming_the_element(env, clips, tmp_path):
    bad = tmp_path / "bad.tpm"
    bad.write_bytes(b"not a model")
    r = launch(env, f"filesrc location={clips['h264']} ! qtdemux ! h264parse ! tpuhaldec ! tpuhalconvert ! "
                    f"tpuhalinfer model={bad} ! fakesink", check=False)
    assert r.returncode != 0
    assert re.search(r"ERROR: from element .*tpuhalinfer0: cannot load the model", r.stdout + r.stderr), \
        r.stdout + r.stderr
    r = launch(env, f"filesrc location={clips['h264']} ! qtdemux ! h264parse ! tpuhaldec ! tpuhalconvert ! "
                    f"tpuhalinfer ! fakesink", check=False)
    assert r.returncode != 0 and "no model" in r.stdout + r.stderr
