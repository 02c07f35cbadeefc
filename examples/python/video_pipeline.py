"""A video pipeline on the device: N channels, each decoding a file or a live
stream on its own decoder channel and thread, converting every frame NV12 ->
RGB (normalised) on the device and max-pooling it 2x2 there, or with
--model resizing it to a compiled model's input and running the model (a
classifier, or a detector compiled with `tpuhal compile --detect`) in the
same batch, then printing each channel's statistics (frames per second,
packets lost, reconnections, latency from packet arrival to decoded frame)
and the total.

    /usr/bin/python3 examples/python/video_pipeline.py [SOURCE ...] [--channels N] [--seconds S] [--frames F]
                                                       [--uri URI] [--transport auto|tcp|udp]
                                                       [--model M.tpm [--mean R,G,B] [--scale R,G,B] [--letterbox]
                                                        [--print]]

Each SOURCE (a file, or an rtsp://, http:// or udp:// URL) is one channel;
files loop and live streams run until --seconds pass, or until each channel
has F frames with --frames (a stream that stalls, drops or ends is opened
again); --channels N repeats the sources round-robin up to N channels. With no sources it makes a 2-second 320x240 H.264 clip
with ffmpeg in a temporary directory. --mean and --scale normalise what the
model sees, (rgb - mean) * scale, three values or one (ImageNet's by
default; a YOLO takes --mean 0 --scale 0.00392157); --letterbox keeps the
frame's aspect, padded with grey 114, as YOLO's training does; --print prints each
frame's class or boxes (in the frame's pixels), as
"channel C frame F: class K (score)" or "channel C frame F: [class K score at x1,y1-x2,y2] ...".
"""
import argparse
import os
import shutil
import struct
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


class Network:
    """A compiled model run on each frame of one channel: its own instance,
    the frame resized into its input in the same batch, and its first output
    read back as a classifier's best class or a detector's boxes."""

    def __init__(self, model, mean, scale, letterbox=False, pad=114):
        self.instance = model.instance()
        self.input = self.instance.input_tensors[0]
        self.output = self.instance.output_tensors[0]
        spec, out = model.inputs[0], model.outputs[0]
        if len(model.inputs) != 1:
            sys.exit(f"video_pipeline.py: a frame is a model's one input; the model has {len(model.inputs)}")
        if spec.dtype != "f32" or len(spec.shape) != 4 or tuple(spec.shape[:2]) != (1, 3):
            sys.exit(f"video_pipeline.py: a frame goes into a first input of f32[1, 3, H, W]; the model's is "
                     f"{spec.dtype}{list(spec.shape)}")
        self.detector = out.name == "detections" and len(out.shape) == 3 and tuple(out.shape[::2]) == (1, 6)
        if not self.detector and (len(out.shape) != 2 or out.shape[0] != 1):
            sys.exit(f"video_pipeline.py: the model's first output {out.dtype}{list(out.shape)} is neither a "
                     "classifier's [1, K] nor a detector's detections [1, M, 6] (tpuhal compile --detect)")
        self.mean, self.scale, self.letterbox, self.pad = mean, scale, letterbox, pad

    def place(self, w, h):
        """Where a w x h frame goes in the input: x, y, width, height (the
        whole input when stretched; letterboxed, scaled by the one factor
        that fits and centred, offsets rounded down)."""
        ih, iw = self.input.shape[2:]
        if not self.letterbox:
            return 0, 0, iw, ih
        fit = min(iw / w, ih / h)
        pw, ph = min(max(int(w * fit + 0.5), 1), iw), min(max(int(h * fit + 0.5), 1), ih)  # halves up, as C++
        return (iw - pw) // 2, (ih - ph) // 2, pw, ph

    def run(self, q, frame, rgb):
        """The frame (in `rgb`'s buffer, converted on the device), resized and run; its class or boxes."""
        convert = ops.nv12_to_rgb(frame.luma(), frame.chroma(), rgb, mean=self.mean, scale=self.scale)
        b = q.batch().run(convert)
        x, y, pw, ph = self.place(frame.width, frame.height)
        target = self.input
        if self.letterbox:
            ih, iw = self.input.shape[2:]
            plane = iw * ih * 4
            for c in range(3):
                value = np.float32((self.pad - self.mean[c]) * self.scale[c])
                b.fill(self.input.buffer, struct.unpack("<I", value.tobytes())[0], offset=self.input.offset + c * plane,
                       size=plane, width=4)
            target = tpuhal.Tensor(self.input.buffer, "f32", (1, 3, ph, pw), (3 * iw * ih, iw * ih, iw, 1),
                                   self.input.offset + (y * iw + x) * 4)
        b.run(ops.resize(rgb.reshape(1, 3, frame.height, frame.width), target, mode="linear"))
        self.instance.record(b).submit().wait(timeout=60)
        out = self.output.download()
        if not self.detector:
            return int(out[0].argmax()), float(out[0].max())
        sx, sy = np.float32(frame.width) / np.float32(pw), np.float32(frame.height) / np.float32(ph)
        boxes = []
        for x1, y1, x2, y2, score, cls in out[0]:
            if not cls >= 0:
                break  # the rows after the last box have class -1
            x1, x2 = (float(np.clip((v - np.float32(x)) * sx, 0, frame.width)) for v in (x1, x2))
            y1, y2 = (float(np.clip((v - np.float32(y)) * sy, 0, frame.height)) for v in (y1, y2))
            boxes.append((int(cls), float(score), x1, y1, max(x1, x2), max(y1, y2)))
        return boxes


def describe(result):
    """A frame's result as --print prints it."""
    if isinstance(result, tuple):
        return f"class {result[0]} ({result[1]:.4g})"
    return " ".join(f"[class {c} {s:.3f} at {x1:.1f},{y1:.1f}-{x2:.1f},{y2:.1f}]" for c, s, x1, y1, x2, y2 in result)


def channel(dev, source, seconds, frames_wanted, transport, result, net=None, print_frames=None):
    """Decodes `source` until `seconds` pass or it has `frames_wanted` frames (0: no count);
    result: a dict of statistics. `net`: a Network run on each frame, whose
    results go to `print_frames(frame number, result)` when given."""
    q = dev.queue("compute")
    start = time.perf_counter()
    demux = tpuhal.Demuxer(source, transport=transport)
    width, height = max(demux.width, 16), max(demux.height, 16)
    frames, latency, worst, reconnects, lost, rgb, pool, mean = 0, 0.0, 0.0, 0, 0, None, None, 0.0
    boxes, last = 0, None
    done = threading.Event()  # the time is up, or the frames are in

    def enough():
        return done.is_set() or time.perf_counter() - start >= seconds or 0 < frames_wanted <= frames
    arrival = {}  # packet index since the decoder's last reset -> when it was read
    with dev.open_decoder(demux.codec, format="nv12", max_width=max(width, 1920 if demux.live else 16),
                          max_height=max(height, 1088 if demux.live else 16)) as dec:
        def take():
            nonlocal frames, latency, worst, rgb, pool, boxes, last
            while (frame := dec.receive(30)) is not None:
                waited = (time.clock_gettime_ns(time.CLOCK_MONOTONIC) - arrival.pop(frame.packet, 0)) / 1e6
                latency, worst = latency + waited, max(worst, waited)
                if rgb is None or tuple(rgb.shape[1:]) != (frame.height, frame.width):
                    rgb = dev.tensor((3, frame.height, frame.width), "f32")
                    pooled = dev.tensor((1, 3, frame.height // 2, frame.width // 2), "f32")
                    pool = (ops.max_pool2d(rgb.reshape(1, 3, frame.height, frame.width), pooled, kernel=2), pooled)
                if net is not None:
                    last = net.run(q, frame, rgb)
                    boxes += 0 if isinstance(last, tuple) else len(last)
                    if print_frames:
                        print_frames(frames, last)
                else:
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
        if pool is not None and net is None:
            mean = float(pool[1].download().mean())
    elapsed = time.perf_counter() - start
    result.update(frames=frames, seconds=elapsed, mean=mean, reconnects=reconnects, lost=lost,
                  latency=latency / max(frames, 1), worst=worst, boxes=boxes, last=last)


def triple(text):
    """ "R,G,B", or one value for all three."""
    values = [float(v) for v in text.split(",")]
    if len(values) not in (1, 3):
        raise argparse.ArgumentTypeError(f"R,G,B or one value, not {text!r}")
    return tuple(values * 3 if len(values) == 1 else values)


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
    parser.add_argument("--model", help="a compiled model (.tpm) to run on every frame: a classifier or a detector")
    parser.add_argument("--mean", type=triple, default=MEAN, help="R,G,B or one value: subtracted (default ImageNet's)")
    parser.add_argument("--scale", type=triple, default=SCALE, help="R,G,B or one value: then multiplied")
    parser.add_argument("--letterbox", action="store_true",
                        help="keep the frame's aspect, padded with grey 114, as YOLO's training does (with --model)")
    parser.add_argument("--print", action="store_true", help="print each frame's class or boxes (with --model)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        files = args.files or [make_clip(tmp)]
        n = args.channels or len(files)
        paths = [files[i % len(files)] for i in range(n)]
        with tpuhal.open(args.uri) as dev:
            results = [{} for _ in paths]
            model = dev.load_model(args.model) if args.model else None
            lock = threading.Lock()

            def printer(c):
                def print_frame(frame, result):
                    with lock:
                        print(f"channel {c} frame {frame}: {describe(result)}", flush=True)
                return print_frame if args.print else None
            threads = [threading.Thread(target=channel, args=(dev, p, args.seconds, args.frames, args.transport, r,
                                                              model and Network(model, args.mean, args.scale,
                                                                                args.letterbox),
                                                              printer(c)))
                       for c, (p, r) in enumerate(zip(paths, results))]
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
        if not args.model:
            what = f"mean of the last pooled RGB frame {r['mean']:+.3f}"
        elif isinstance(r["last"], tuple):
            what = f"last frame: {describe(r['last'])}"
        else:
            what = f"{r['boxes']} boxes"
        print(f"channel {i}: {name}: {r['frames']} frames in {r['seconds']:.2f} s, "
              f"{r['frames'] / r['seconds']:.1f} fps, {r['lost']} lost, {r['reconnects']} reconnects, "
              f"latency {r['latency']:.1f} ms mean / {r['worst']:.1f} ms max ({what})")
    total = sum(r["frames"] for r in results)
    print(f"total: {total} frames on {n} channel(s) in {elapsed:.2f} s, {total / elapsed:.1f} fps")


if __name__ == "__main__":
    main()
