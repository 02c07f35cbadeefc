#!/usr/bin/python3
"""Helper of scripts/gst-bench.py: N clients of one RTSP URL in one GStreamer
pipeline (rtspsrc ! rtph264depay ! h264parse ! tpuhaldec ! fakesink), each
counting its frames. Prints one line per client: frames, seconds from the
pipeline's start to its first and to its last frame. Stops once every client
has FRAMES frames, or after LIMIT seconds.

    gst-live-count.py URL N FRAMES LIMIT
"""
import os
import sys
import threading
import time

import gi

gi.require_version("Gst", "1.0")
from gi.repository import GLib, Gst  # noqa: E402


def main():
    url, n, frames, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    Gst.init(None)
    branch = (f"rtspsrc location={url} protocols=tcp latency=200 ! rtph264depay ! h264parse ! "
              f"tpuhaldec device=sim:0 ! fakesink name=sink{{}} sync=false signal-handoffs=true")
    pipeline = Gst.parse_launch(" ".join(branch.format(i) for i in range(n)))
    counts, first, last = [0] * n, [0.0] * n, [0.0] * n
    lock = threading.Lock()
    loop = GLib.MainLoop()
    start = time.monotonic()

    def handoff(_sink, _buffer, _pad, i):
        now = time.monotonic() - start
        with lock:
            if counts[i] == 0:
                first[i] = now
            counts[i] += 1
            last[i] = now
            if all(c >= frames for c in counts):
                GLib.idle_add(loop.quit)

    for i in range(n):
        pipeline.get_by_name(f"sink{i}").connect("handoff", handoff, i)
    bus = pipeline.get_bus()
    bus.add_signal_watch()
    bus.connect("message::error", lambda _b, m: (print("error:", m.parse_error()[0].message, file=sys.stderr),
                                                 loop.quit()))
    GLib.timeout_add(int(limit * 1000), loop.quit)
    pipeline.set_state(Gst.State.PLAYING)
    loop.run()
    with lock:
        for i in range(n):
            print(f"{counts[i]} {first[i]:.3f} {last[i]:.3f}", flush=True)
    # rtspsrc's teardown of many sessions can wait on the server for a long
    # time (RTSP TEARDOWN over connections it is behind on); the counts are
    # out, so the process ends here rather than wait for it.
    os._exit(0)


if __name__ == "__main__":
    main()
