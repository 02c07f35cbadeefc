"""A camera that breaks off where a test says: a minimal RTSP server
(RFC 2326, RTP interleaved on the RTSP connection) sending an H.264 stream
(RFC 6184: single NAL unit packets, FU-A fragments) from a list of access
units. Each connection gets the whole stream, then either an RTCP BYE (the
stream ended) or, with `cut_inside`, only the first fragment of that unit
before the connection closes (the camera went away mid-frame).

GStreamer's RTSP server (rtsp_server.py) is the server for every other
live test; it cannot stop at a chosen RTP packet, so a test of a cut at a
known point needs this stand-in. It answers OPTIONS, DESCRIBE, SETUP, PLAY
and TEARDOWN, and nothing of RTSP it does not need.
"""
import socket
import struct
import threading

SSRC = 0x7470_7568
MTU = 400  # RTP payload bytes; larger NAL units go in FU-A fragments


def split_nal_units(annexb):
    """The NAL units of an Annex B byte stream, without start codes."""
    starts, i = [], 0
    while (i := annexb.find(b"\x00\x00\x01", i)) >= 0:
        starts.append(i + 3)
        i += 3
    units = []
    for k, s in enumerate(starts):
        end = starts[k + 1] - 3 if k + 1 < len(starts) else len(annexb)
        units.append(annexb[s:end].rstrip(b"\x00") if k + 1 < len(starts) else annexb[s:end])
    return units


def access_units(annexb):
    """Groups NAL units into access units: each ends with its frame's slice
    (the stream must have one slice per frame)."""
    out, unit = [], []
    for nal in split_nal_units(annexb):
        unit.append(nal)
        if nal[0] & 0x1F in (1, 5):
            out.append(unit)
            unit = []
    return out


def payloads(unit):
    """The RTP payloads of one access unit (a list of NAL units)."""
    out = []
    for nal in unit:
        if len(nal) <= MTU:
            out.append(nal)
            continue
        body = nal[1:]
        chunks = [body[i:i + MTU] for i in range(0, len(body), MTU)]
        for i, chunk in enumerate(chunks):
            start, end = 0x80 if i == 0 else 0, 0x40 if i == len(chunks) - 1 else 0
            out.append(bytes([(nal[0] & 0xE0) | 28, start | end | (nal[0] & 0x1F)]) + chunk)
    return out


def interleaved(channel, packet):
    return b"$" + bytes([channel]) + struct.pack("!H", len(packet)) + packet


class Camera:
    def __init__(self, units, cut_inside=None):
        self.units, self.cut_inside = units, cut_inside
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"rtsp://127.0.0.1:{self.sock.getsockname()[1]}/cam"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self.sock.close()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _stream(self, conn):
        seq = 0
        for n, unit in enumerate(self.units):
            parts = payloads(unit)
            if n == self.cut_inside:
                parts = parts[:1]
            for i, part in enumerate(parts):
                marker = 0x80 if i == len(parts) - 1 and n != self.cut_inside else 0
                conn.sendall(interleaved(0, struct.pack("!BBHII", 0x80, marker | 96, seq, n * 3600, SSRC) + part))
                seq += 1
            if n == self.cut_inside:
                return False
        # RTCP BYE (PT 203) for our source, with the reason "end".
        conn.sendall(interleaved(1, struct.pack("!BBHI", 0x81, 203, 2, SSRC) + b"\x03end"))
        return True

    def _session(self, conn):
        try:
            self._serve(conn)
        except OSError:
            pass  # the client went away
        finally:
            conn.close()

    def _serve(self, conn):
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                more = conn.recv(4096)
                if not more:
                    return
                buf += more
            head, buf = buf.split(b"\r\n\r\n", 1)
            lines = head.decode().split("\r\n")
            method = lines[0].split()[0]
            cseq = next(l.split(":", 1)[1].strip() for l in lines if l.lower().startswith("cseq"))
            extra, body = "", ""
            if method == "OPTIONS":
                extra = "Public: OPTIONS, DESCRIBE, SETUP, PLAY, TEARDOWN\r\n"
            elif method == "DESCRIBE":
                body = ("v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=stand-in\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
                        "m=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\na=fmtp:96 packetization-mode=1\r\n"
                        "a=control:track0\r\n")
                extra = f"Content-Base: {self.url}/\r\nContent-Type: application/sdp\r\n"
            elif method == "SETUP":
                extra = "Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\nSession: 1\r\n"
            elif method == "PLAY":
                extra = "Session: 1\r\nRange: npt=0.000-\r\n"
            reply = f"RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\n{extra}Content-Length: {len(body)}\r\n\r\n{body}"
            conn.sendall(reply.encode())
            if method == "PLAY" and not self._stream(conn):
                return  # cut: the connection closes inside a unit
