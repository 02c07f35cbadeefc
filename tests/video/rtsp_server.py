#!/usr/bin/python3
"""An RTSP server for the live-video tests, on GStreamer's RTSP server
library (Debian's gir1.2-gst-rtsp-server-1.0 with python3-gi).

    rtsp_server.py --port PORT [--drop-every N] NAME=CLIP...

serves each CLIP (mp4 with H.264 or H.265, made at test time) at
rtsp://127.0.0.1:PORT/NAME, from its first frame for every client, and ends
the stream (RTCP BYE) when the clip ends. Prints "serving PORT" once it
listens; stops on SIGTERM or SIGINT. With --drop-every N, every Nth RTP
packet of every stream is dropped before it is sent (a lossy network).

Like a camera, it announces no stop time (Range: npt=0-): clients end the
stream on the BYE alone. A stop time would let GStreamer 1.22's
rtpjitterbuffer deadlock at the end of the stream when the client falls
behind the clip's own pace (a busy machine): it sets an end-of-stream timer
after its timer thread has gone idle, then waits at EOS for that thread to
clear it, and neither wakes (rtspsrc ! ... hangs with all frames but the
last few and no EOS).
"""
import argparse
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402


def launch_line(clip):
    codec = "h265" if "265" in clip or "hevc" in clip else "h264"
    # qtdemux gives access units with the parameter sets out of band; the
    # parser hands the payloader what it takes (rtph265pay needs it), and
    # config-interval=-1 sends the parameter sets before every keyframe.
    return f"( filesrc location={clip} ! qtdemux ! {codec}parse ! rtp{codec}pay name=pay0 pt=96 config-interval=-1 )"


def hide_stop_time(media):
    """No duration or segment stop upstream of the payloader, so the media's
    range is open (npt=0-), as a live camera's is."""
    pad = media.get_element().get_by_name("pay0").get_static_pad("src")

    def probe(_pad, info):
        kind = info.get_query().type
        return Gst.PadProbeReturn.DROP if kind in (Gst.QueryType.DURATION, Gst.QueryType.SEGMENT) \
            else Gst.PadProbeReturn.OK

    pad.add_probe(Gst.PadProbeType.QUERY_UPSTREAM, probe)


def configure(media, drop_every):
    hide_stop_time(media)
    if drop_every:
        drop_packets(media, drop_every)


def drop_packets(media, every):
    pad = media.get_element().get_by_name("pay0").get_static_pad("src")
    count = [0]

    def probe(_pad, _info):
        count[0] += 1
        return Gst.PadProbeReturn.DROP if count[0] % every == 0 else Gst.PadProbeReturn.OK

    pad.add_probe(Gst.PadProbeType.BUFFER, probe)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--drop-every", type=int, default=0, help="drop every Nth RTP packet")
    ap.add_argument("mounts", nargs="+", help="NAME=CLIP")
    args = ap.parse_args()
    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    for m in args.mounts:
        name, clip = m.split("=", 1)
        factory = GstRtspServer.RTSPMediaFactory()
        factory.set_launch(launch_line(clip))
        factory.set_shared(False)  # every client from the first frame
        factory.connect("media-configure", lambda f, media: configure(media, args.drop_every))
        server.get_mount_points().add_factory("/" + name, factory)
    if server.attach(None) == 0:
        print(f"cannot listen on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
        return 1
    loop = GLib.MainLoop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, sig, loop.quit)
    print(f"serving {args.port}", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
