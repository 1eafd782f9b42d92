"""Media for the acquisition tests: small images and videos made here (Pillow, PyAV), data: URLs,
a PNG whose header claims a huge size, and a loopback HTTP server that records every request."""
from __future__ import annotations

import base64
import io
import struct
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import numpy as np


def image_bytes(fmt: str = "PNG", size: tuple[int, int] = (32, 24), color=(200, 30, 40), mode: str = "RGB") -> bytes:
    from PIL import Image

    im = Image.new(mode, size, color)
    buf = io.BytesIO()
    if fmt == "GIF":
        second = Image.new(mode, size, (0, 0, 255))
        im.save(buf, format="GIF", save_all=True, append_images=[second], duration=100)
    else:
        im.save(buf, format=fmt)
    return buf.getvalue()


def video_bytes(fmt: str = "mp4", codec: str = "libx264", frames: int = 30, size: tuple[int, int] = (64, 48),
                fps: int = 10) -> bytes:
    """A video whose frame i is a flat gray of level 8*i (frame order can be read back)."""
    import av

    w, h = size
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as c:
        s = c.add_stream(codec, rate=fps)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        for i in range(frames):
            a = np.full((h, w, 3), (8 * i) % 256, np.uint8)
            for p in s.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def png_claiming(width: int, height: int) -> bytes:
    """A valid PNG signature and IHDR that claim width x height, then a tiny IDAT (a decompression bomb's header)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
            + chunk(b"IEND", b""))


class RecordingServer:
    """An HTTP server on 127.0.0.1 that records each request path; `routes` maps a path to a
    handler(request) that writes the answer. Use as a context manager (it shuts down on exit)."""

    def __init__(self, routes: dict[str, Callable] | None = None):
        self.requests: list[str] = []
        self.routes = dict(routes or {})
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests.append(self.path)
                route = outer.routes.get(self.path.split("?")[0])
                if route is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                try:
                    route(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def __enter__(self) -> "RecordingServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)


def send_body(data: bytes, content_type: str = "application/octet-stream", length: int | None = None):
    def route(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data) if length is None else length))
        h.end_headers()
        h.wfile.write(data)
    return route


def send_unsized(data: bytes, chunk: int = 65536):
    """A body without Content-Length (read until the connection closes)."""
    def route(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Connection", "close")
        h.end_headers()
        for i in range(0, len(data), chunk):
            h.wfile.write(data[i:i + chunk])
        h.close_connection = True
    return route


def redirect(location: str, status: int = 302):
    def route(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Location", location)
        h.send_header("Content-Length", "0")
        h.end_headers()
    return route


def stall(seconds: float):
    def route(h: BaseHTTPRequestHandler) -> None:
        time.sleep(seconds)
    return route
