#!/usr/bin/python3
"""Live video and GStreamer throughput beside the board's own decode figure
(docs/benchmarks.md), in one run:

1. `tpuhaldec` in gst-launch-1.0 (filesrc ! parse ! tpuhaldec ! fakesink,
   one branch per channel, frames left in device memory) beside
   `tpuhal bench video` on the same clips (1080p30 H.264 and H.265, 60
   frames, made the same way) and channel counts, decoding as many frames;
2. real-time 1080p30 H.264 channels over RTSP on loopback: N clients of a
   real RTSP server (tests/video/rtsp_server.py, GStreamer's library, on the
   same machine) through rtspsrc ! depay ! parse ! tpuhaldec ! fakesink in
   one process, each counting its frames; N is sustained when every client
   decodes the clip (but for the last frames its B-frames hold back) within
   5 % of its duration. The largest N found beside the
   file-based figure `tpuhal bench video` prints (realtime_channels).

    scripts/gst-bench.py [--build BUILD_DIR] [--rounds N] [--skip-live | --skip-files]
"""
import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FFMPEG = shutil.which("ffmpeg")
LAUNCH = shutil.which("gst-launch-1.0")
ENCODE = {"h264": "-c:v libx264 -preset veryfast", "h265": "-c:v libx265 -preset veryfast -x265-params log-level=none"}


def ffmpeg(*args):
    subprocess.run([FFMPEG, "-nostdin", "-v", "error", "-y", *args], check=True)


def clip(directory, codec, frames, container):
    path = os.path.join(directory, f"{codec}-{frames}.{container}")
    fmt = [] if container == "mp4" else ["-f", codec if codec == "h264" else "hevc"]
    ffmpeg("-f", "lavfi", "-i", "testsrc2=size=1920x1080:rate=30", "-frames:v", str(frames), *ENCODE[codec].split(),
           "-g", "30", "-bf", "2", "-pix_fmt", "yuv420p", *fmt, path)
    return path


def elapsed(output):
    """gst-launch-1.0's 'Execution ended after H:MM:SS.nnnnnnnnn' (PLAYING to EOS), in seconds."""
    m = re.search(r"Execution ended after (\d+):(\d+):(\d+)\.(\d+)", output)
    if not m:
        raise RuntimeError(f"gst-launch-1.0 did not finish:\n{output[-3000:]}")
    h, mi, s, frac = m.groups()
    return int(h) * 3600 + int(mi) * 60 + int(s) + int(frac) / 10 ** len(frac)


def launch(env, branches, timeout=600):
    r = subprocess.run([LAUNCH, *" ".join(branches).split()], capture_output=True, text=True, env=env,
                       timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"gst-launch-1.0 failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return elapsed(r.stdout)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "rel"))
    ap.add_argument("--rounds", type=int, default=3, help="best of N rounds per figure (default 3)")
    ap.add_argument("--skip-live", action="store_true", help="only the file-based comparison")
    ap.add_argument("--skip-files", action="store_true", help="only the live channels (and the bench's figure)")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    tpuhal = os.path.join(build, "bin", "tpuhal")
    plugin = os.path.join(build, "gst", "libgsttpuhal.so")
    for need, what in ((FFMPEG, "ffmpeg"), (LAUNCH, "gst-launch-1.0"), (os.path.exists(tpuhal) or None, tpuhal),
                       (os.path.exists(plugin) or None, plugin)):
        if need is None:
            sys.exit(f"gst-bench: {what} is missing (build first; scripts/setup.sh installs the tools)")
    tmp = tempfile.mkdtemp(prefix="tpuhal-gst-bench-")
    env = dict(os.environ, GST_PLUGIN_PATH=os.path.dirname(plugin), GST_REGISTRY=os.path.join(tmp, "registry.bin"),
               TPUHAL_LOG="error")
    try:
        print(f"tpuhal bench video (sim:0), then tpuhaldec in gst-launch-1.0 on the same clips; best of "
              f"{args.rounds}", file=sys.stderr)
        bench = {}
        out = subprocess.run([tpuhal, "bench", "video", "--device", "sim:0", "--json"], capture_output=True,
                             text=True, env=env, check=True).stdout
        realtime = 0.0
        for line in out.splitlines():
            r = json.loads(line)
            if r["bench"] == "video_decode":
                bench[(r["clip"], int(r["channels"]))] = r["value"]
            elif r["bench"] == "realtime_channels":
                realtime = r["value"]
        if not args.skip_files:
            print(f"{'clip':<12} {'channels':>8} {'tpuhaldec fps':>14} {'bench fps':>10} {'ratio':>6}")
        for codec in () if args.skip_files else ("h264", "h265"):
            es = clip(tmp, codec, 60, "es")
            data = open(es, "rb").read()
            for channels in (1, 8, 32):
                # As many frames as the bench decodes: at least 360 in all.
                loops = max(1, -(-360 // (channels * 60)))
                looped = os.path.join(tmp, f"loop-{codec}-{loops}")
                with open(looped, "wb") as f:
                    f.write(data * loops)
                branch = f"filesrc location={looped} ! {codec}parse ! tpuhaldec device=sim:0 ! fakesink sync=false"
                best = min(launch(env, [branch] * channels) for _ in range(args.rounds))
                fps = channels * loops * 60 / best
                ref = bench.get((f"1080p {codec}", channels), 0)
                print(f"1080p {codec:<6} {channels:>8} {fps:>14.1f} {ref:>10.1f} {fps / ref if ref else 0:>6.2f}",
                      flush=True)
        if args.skip_live:
            return 0

        # Real-time channels over RTSP.
        seconds = 6
        mp4 = clip(tmp, "h264", 30 * seconds, "mp4")
        port = free_port()
        server = subprocess.Popen(["/usr/bin/python3", os.path.join(ROOT, "tests", "video", "rtsp_server.py"),
                                   "--port", str(port), f"cam={mp4}"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        try:
            if "serving" not in server.stdout.readline():
                sys.exit(f"gst-bench: the RTSP server did not start: {server.stderr.read()}")
            url = f"rtsp://127.0.0.1:{port}/cam"
            counter = os.path.join(ROOT, "scripts", "gst-live-count.py")
            # The clip's frames but the last three: with two B-frames, the
            # decoder gives those only at the end of the stream, and an
            # RTSP client that falls behind never sees the server's end.
            frames = 30 * seconds - 3

            def sustained(n):
                # Each client counts its frames (scripts/gst-live-count.py).
                # Real time: every client decodes the whole clip, its last
                # frame within 5 % (plus the 200 ms jitter buffer) of the
                # clip's duration after its first. A client that falls
                # behind holds its stream back on the server (TCP).
                try:
                    r = subprocess.run(["/usr/bin/python3", counter, url, str(n), str(frames), str(4 * seconds)],
                                       capture_output=True, text=True, env=env, timeout=60)
                except subprocess.TimeoutExpired:  # far behind: it did not even stop in time
                    print(f"  {n:>3} live channels: behind (no end within 60 s)", file=sys.stderr, flush=True)
                    return False
                rows = [tuple(float(v) for v in line.split()) for line in r.stdout.splitlines()]
                if r.returncode or len(rows) != n:
                    raise RuntimeError(f"gst-live-count failed:\n{r.stdout}\n{r.stderr[-2000:]}")
                worst = max(last - first for _, first, last in rows)
                ok = all(c >= frames for c, _, _ in rows) and worst <= (frames - 1) / 30 * 1.05 + 0.2
                print(f"  {n:>3} live channels: {min(c for c, _, _ in rows):.0f} of {frames} frames each at "
                      f"least, the slowest in {worst:.2f} s for {(frames - 1) / 30:.2f} s of video: "
                      f"{'real time' if ok else 'behind'}", file=sys.stderr, flush=True)
                return ok

            lo, hi = 0, max(2, int(realtime * 1.5) + 1)  # lo: sustained; hi: not (or untried bound)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if sustained(mid):
                    lo = mid
                else:
                    hi = mid
            print(f"real-time 1080p30 H.264 channels: {lo} over RTSP (server on the same machine), "
                  f"{realtime:.1f} from files (tpuhal bench video): ratio {lo / realtime if realtime else 0:.2f}")
        finally:
            server.kill()
            server.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
