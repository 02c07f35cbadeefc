"""A video pipeline on the device: N channels, each decoding a file on its own
decoder channel and thread, converting every frame NV12 -> RGB (normalised)
on the device and max-pooling it 2x2 there, then printing frames per second
per channel and in total.

    /usr/bin/python3 examples/python/video_pipeline.py [FILE ...] [--channels N] [--seconds S] [--uri URI]

Each FILE is one channel (files loop until --seconds pass; --channels N
repeats them round-robin up to N channels). With no files it makes a 2-second
320x240 H.264 clip with ffmpeg in a temporary directory.
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


def channel(dev, path, seconds, result):
    """Decodes `path` over and over until `seconds` pass; result: [frames, seconds, last RGB mean]."""
    q = dev.queue("compute")
    width, height = tpuhal.Demuxer(path).width, tpuhal.Demuxer(path).height
    rgb = dev.tensor((3, height, width), "f32")
    pooled = dev.tensor((1, 3, height // 2, width // 2), "f32")
    pool = ops.max_pool2d(rgb.reshape(1, 3, height, width), pooled, kernel=2)
    frames, start = 0, time.perf_counter()
    demux = tpuhal.Demuxer(path)
    with dev.open_decoder(demux.codec, format="nv12", max_width=max(width, 16), max_height=max(height, 16)) as dec:
        while True:
            for frame in dec.decode(demux):
                convert = ops.nv12_to_rgb(frame.luma(), frame.chroma(), rgb, mean=MEAN, scale=SCALE)
                q.batch().run(convert).run(pool).submit().wait(timeout=60)
                frames += 1
            if time.perf_counter() - start >= seconds:
                break
            dec.reset()
            demux = tpuhal.Demuxer(path)  # loop the file
    result[:] = [frames, time.perf_counter() - start, float(pooled.download().mean())]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="video files, one channel each (default: a generated clip)")
    parser.add_argument("--channels", type=int, default=0, help="channels (default: one per file)")
    parser.add_argument("--seconds", type=float, default=2.0, help="how long each channel runs (default 2)")
    parser.add_argument("--uri", default="sim:0", help="the device (default sim:0)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        files = args.files or [make_clip(tmp)]
        n = args.channels or len(files)
        paths = [files[i % len(files)] for i in range(n)]
        with tpuhal.open(args.uri) as dev:
            results = [[] for _ in paths]
            threads = [threading.Thread(target=channel, args=(dev, p, args.seconds, r))
                       for p, r in zip(paths, results)]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - start
    if any(not r for r in results):
        sys.exit("video_pipeline.py: a channel failed (see the error above)")
    for i, (path, (frames, secs, mean)) in enumerate(zip(paths, results)):
        print(f"channel {i}: {os.path.basename(path)}: {frames} frames in {secs:.2f} s, "
              f"{frames / secs:.1f} fps (mean of the last pooled RGB frame {mean:+.3f})")
    total = sum(r[0] for r in results)
    print(f"total: {total} frames on {n} channel(s) in {elapsed:.2f} s, {total / elapsed:.1f} fps")


if __name__ == "__main__":
    main()
