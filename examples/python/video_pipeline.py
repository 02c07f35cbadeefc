"""A video pipeline on the device: N channels, each decoding a file or a live
stream on its own decoder channel and thread, converting every frame NV12 ->
RGB (normalised) on the device and max-pooling it 2x2 there, then printing
each channel's statistics (frames per second, packets lost, reconnections,
latency from packet arrival to decoded frame) and the total.

    /usr/bin/python3 examples/python/video_pipeline.py [SOURCE ...] [--channels N] [--seconds S] [--frames F]
                                                       [--uri URI] [--transport auto|tcp|udp]

Each SOURCE (a file, or an rtsp://, http:// or udp:// URL) is one channel;
files loop and live streams run until --seconds pass, or until each channel
has F frames with --frames (a stream that stalls, drops or ends is opened
again); --channels N repeats the sources round-robin up to N channels. With no sources it makes a 2-second 320x240 H.264 clip
with ffmpeg in a temporary directory.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import tpuhal
from tpuhal import ops

MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
SCALE = (1 / (0.229 * 255), 1 / (0.224 * 255), 1 / (0.225 * 255))


def make_clip(directory):
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        print("video_pipeline.py: no files given and ffmpeg is not installed to make a clip "
              "(Debian: apt-get install ffmpeg)", file=sys.stderr)
        sys.exit(77)
    path = os.path.join(directory, "clip.mp4")
    subprocess.run([ffmpeg, "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=size=320x240:rate=25",
                    "-frames:v", "50", "-c:v", "libx264", "-pix_fmt", "yuv420p", path], check=True)
    return path


def channel(dev, source, seconds, frames_wanted, transport, result):
    """Decodes `source` until `seconds` pass or it has `frames_wanted` frames (0: no count);
    result: a dict of statistics."""
    q = dev.queue("compute")
    start = time.perf_counter()
    demux = tpuhal.Demuxer(source, transport=transport)
    width, height = max(demux.width, 16), max(demux.height, 16)
    frames, latency, worst, reconnects, lost, rgb, pool, mean = 0, 0.0, 0.0, 0, 0, None, None, 0.0
    done = threading.Event()  # the time is up, or the frames are in

    def enough():
        return done.is_set() or time.perf_counter() - start >= seconds or 0 < frames_wanted <= frames
    arrival = {}  # packet index since the decoder's last reset -> when it was read
    with dev.open_decoder(demux.codec, format="nv12", max_width=max(width, 1920 if demux.live else 16),
                          max_height=max(height, 1088 if demux.live else 16)) as dec:
        def take():
            nonlocal frames, latency, worst, rgb, pool
            while (frame := dec.receive(30)) is not None:
                waited = (time.clock_gettime_ns(time.CLOCK_MONOTONIC) - arrival.pop(frame.packet, 0)) / 1e6
                latency, worst = latency + waited, max(worst, waited)
                if rgb is None or tuple(rgb.shape[1:]) != (frame.height, frame.width):
                    rgb = dev.tensor((3, frame.height, frame.width), "f32")
                    pooled = dev.tensor((1, 3, frame.height // 2, frame.width // 2), "f32")
                    pool = (ops.max_pool2d(rgb.reshape(1, 3, frame.height, frame.width), pooled, kernel=2), pooled)
                convert = ops.nv12_to_rgb(frame.luma(), frame.chroma(), rgb, mean=MEAN, scale=SCALE)
                q.batch().run(convert).run(pool[0]).submit().wait(timeout=60)
                frames += 1
                if 0 < frames_wanted <= frames:
                    done.set()
                    demux.interrupt()  # the next read returns at once

        def timer():
            if not done.wait(seconds):
                done.set()
                demux.interrupt()  # ends a read that waits on a live source
        if demux.live:
            threading.Thread(target=timer, daemon=True).start()
        while not enough():
            for packet in demux:
                if packet.new_stream:  # reconnected: the old stream's frames, then a fresh one
                    dec.flush()
                    take()
                    dec.reset()
                    arrival.clear()
                arrival[dec.packets_sent] = packet.arrival_ns
                dec.send(packet)
                take()
                if enough():
                    break
            dec.flush()
            take()
            dec.reset()
            arrival.clear()
            reconnects, lost = reconnects + demux.reconnects, lost + demux.packets_lost
            if demux.live or enough():
                break
            demux = tpuhal.Demuxer(source)  # loop the file
        if pool is not None:
            mean = float(pool[1].download().mean())
    elapsed = time.perf_counter() - start
    result.update(frames=frames, seconds=elapsed, mean=mean, reconnects=reconnects, lost=lost,
                  latency=latency / max(frames, 1), worst=worst)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", metavar="SOURCE",
                        help="video files or URLs, one channel each (default: a generated clip)")
    parser.add_argument("--channels", type=int, default=0, help="channels (default: one per file)")
    parser.add_argument("--seconds", type=float, default=2.0, help="how long each channel runs (default 2)")
    parser.add_argument("--frames", type=int, default=0,
                        help="each channel stops once it has this many frames (default 0: only --seconds counts)")
    parser.add_argument("--uri", default="sim:0", help="the device (default sim:0)")
    parser.add_argument("--transport", default="auto", choices=["auto", "tcp", "udp"],
                        help="RTSP's transport for rtsp:// sources (default auto)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        files = args.files or [make_clip(tmp)]
        n = args.channels or len(files)
        paths = [files[i % len(files)] for i in range(n)]
        with tpuhal.open(args.uri) as dev:
            results = [{} for _ in paths]
            threads = [threading.Thread(target=channel, args=(dev, p, args.seconds, args.frames, args.transport, r))
                       for p, r in zip(paths, results)]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - start
    if any(not r for r in results):
        sys.exit("video_pipeline.py: a channel failed (see the error above)")
    for i, (path, r) in enumerate(zip(paths, results)):
        name = path if "://" in path else os.path.basename(path)
        print(f"channel {i}: {name}: {r['frames']} frames in {r['seconds']:.2f} s, "
              f"{r['frames'] / r['seconds']:.1f} fps, {r['lost']} lost, {r['reconnects']} reconnects, "
              f"latency {r['latency']:.1f} ms mean / {r['worst']:.1f} ms max "
              f"(mean of the last pooled RGB frame {r['mean']:+.3f})")
    total = sum(r["frames"] for r in results)
    print(f"total: {total} frames on {n} channel(s) in {elapsed:.2f} s, {total / elapsed:.1f} fps")


if __name__ == "__main__":
    main()
