"""`ninfer serve [MODEL]`: the OpenAI-compatible HTTP server (see ninfer/gateway/http/)."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading

from ninfer.gateway.cli.common import (add_engine_args, add_model_arg, engine_config, resolve_model,
                                       wait_ready_reporting)
from ninfer.gateway.cli.main import CLIError


def add_parser(p: argparse.ArgumentParser) -> None:
    add_model_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--api-key", default=os.environ.get("NINFER_API_KEY"),
                   help="require `Authorization: Bearer KEY` on the API routes (default: $NINFER_API_KEY)")
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients use (default: the file name without .ninfer; ninfer-demo for the demo)")
    p.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024,
                   help="largest accepted request body (HTTP 413 above it)")
    p.add_argument("--drain-timeout-s", type=float, default=30.0,
                   help="on SIGTERM, how long in-flight requests may finish before they are cancelled")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the serve warmup (a few requests at start, so that the first prompts do not wait "
                        "for kernel compiles and graph captures; none run on the CPU)")
    p.add_argument("--no-ui", dest="ui", action="store_false",
                   help="do not serve the browser playground at / (the API routes only)")
    add_media_args(p)
    # NOTE: --force-accept-len too, for `ninfer bench serve` (a benchmarking aid: synthetic weights)
    add_engine_args(p, force_accept_len=True)


def add_media_args(p: argparse.ArgumentParser) -> None:
    from ninfer.gateway import media as M

    g = p.add_argument_group("media (image_url / video_url parts; by default only data: URLs)")
    g.add_argument("--allowed-media-domains", nargs="+", default=[], metavar="DOMAIN",
                   help="fetch http(s) media from these hosts (exact names); their addresses must be public")
    g.add_argument("--allow-remote-media", action="store_true",
                   help="fetch http(s) media from any host with a public address")
    g.add_argument("--allowed-local-media-path", default=None, metavar="DIR",
                   help="read file:// media under DIR only (default: no local files)")
    g.add_argument("--limit-mm-per-prompt", default=None, metavar="JSON",
                   help=f"most images/videos per prompt, e.g. '{{\"image\": 4, \"video\": 1}}' "
                        f"(default: {json.dumps(M.DEFAULT_LIMIT_PER_PROMPT)})")
    g.add_argument("--max-image-pixels", default=str(M.DEFAULT_MAX_IMAGE_PIXELS), metavar="N",
                   help=f"largest image (and video frame) in pixels, from its header (default: {M.DEFAULT_MAX_IMAGE_PIXELS})")
    g.add_argument("--max-video-frames", default=str(M.DEFAULT_MAX_VIDEO_FRAMES), metavar="N",
                   help=f"most frames sampled from one video (default: {M.DEFAULT_MAX_VIDEO_FRAMES})")
    g.add_argument("--video-fps", default=str(M.DEFAULT_VIDEO_FPS), metavar="FPS",
                   help=f"frames sampled per second of video (default: {M.DEFAULT_VIDEO_FPS:g})")
    g.add_argument("--media-fetch-timeout-s", default=str(M.DEFAULT_TIMEOUT_S), metavar="S",
                   help=f"time limit of one media fetch (default: {M.DEFAULT_TIMEOUT_S:g})")
    g.add_argument("--max-media-bytes", default=str(M.DEFAULT_MAX_BYTES), metavar="N",
                   help=f"largest fetched or read media file (default: {M.DEFAULT_MAX_BYTES})")
    g.add_argument("--max-media-redirects", default=str(M.DEFAULT_MAX_REDIRECTS), metavar="N",
                   help=f"most redirects of one media fetch, each checked again (default: {M.DEFAULT_MAX_REDIRECTS})")


def _number(flag: str, text: str, kind, lo) -> int | float:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise CLIError(f"{flag} must be {'an integer' if kind is int else 'a number'} >= {lo}, got {text!r}") from None
    if not value >= lo:
        raise CLIError(f"{flag} must be {'an integer' if kind is int else 'a number'} >= {lo}, got {text!r}")
    return value


def media_policy(args: argparse.Namespace):
    """The media flags as a MediaPolicy; CLIError names the flag at fault."""
    from ninfer.gateway import media as M

    per_prompt = dict(M.DEFAULT_LIMIT_PER_PROMPT)
    if args.limit_mm_per_prompt is not None:
        try:
            per_prompt = M.parse_limit_mm_per_prompt(args.limit_mm_per_prompt)
        except ValueError as e:
            raise CLIError(f"--limit-mm-per-prompt: {e}") from None
    fps = _number("--video-fps", args.video_fps, float, 0)
    if not 0 < fps <= 120:
        raise CLIError(f"--video-fps must be in (0, 120], got {args.video_fps!r}")
    limits = M.MediaLimits(per_prompt=per_prompt,
                           max_image_pixels=_number("--max-image-pixels", args.max_image_pixels, int, 1),
                           max_video_frames=_number("--max-video-frames", args.max_video_frames, int, 1),
                           video_fps=fps)
    timeout = _number("--media-fetch-timeout-s", args.media_fetch_timeout_s, float, 0)
    if timeout <= 0:
        raise CLIError(f"--media-fetch-timeout-s must be > 0, got {args.media_fetch_timeout_s!r}")
    local = args.allowed_local_media_path
    if local is not None and not os.path.isdir(os.path.expanduser(local)):
        raise CLIError(f"--allowed-local-media-path {local!r} is not a directory")
    for d in args.allowed_media_domains:
        if not d.strip() or "/" in d or ":" in d or " " in d.strip():
            raise CLIError(f"--allowed-media-domains takes host names (e.g. images.example.com), got {d!r}")
    return M.MediaPolicy(limits=limits, allowed_domains=tuple(args.allowed_media_domains),
                         allow_remote=args.allow_remote_media, allowed_local_path=local,
                         timeout_s=timeout, max_bytes=_number("--max-media-bytes", args.max_media_bytes, int, 1),
                         max_redirects=_number("--max-media-redirects", args.max_media_redirects, int, 0))


def _check_listen(host: str, port: int) -> None:
    """Fail at once, in one line, when the address cannot be bound (before any model is loaded)."""
    import socket

    if port == 0:
        return
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise CLIError(f"cannot resolve --host {host!r}: {e.strerror}") from None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn binds
        try:
            s.bind(addr)
        except OSError as e:
            raise CLIError(f"cannot listen on {host}:{port}: {e.strerror}") from None


def check_model(path, config):
    """The checks the Engine makes before loading (device, weights, memory: `facade.check_model`), here
    before the server starts (it builds the Engine in the background, so a refusal there would leave a
    server that never becomes ready). Returns the start plan."""
    from ninfer.engine.facade import DeviceUnavailableError, InsufficientMemoryError
    from ninfer.engine.facade import check_model as engine_check
    try:
        return engine_check(path, config)
    except (DeviceUnavailableError, InsufficientMemoryError) as e:
        raise CLIError(str(e)) from None
    except (OSError, ValueError) as e:
        raise CLIError(f"cannot load {path or config.identity}: {e}") from None


class _LogLines:
    """A text stream whose lines go to the server's log (the load's progress)."""

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> None:
        if text.strip():
            logging.getLogger("ninfer.gateway.http").info("%s", text.strip())

    def flush(self) -> None:
        pass


def start_engine(path, config):
    """The Engine, returned while it loads (so that /health reports the load's progress); its progress goes
    to the log. The serve build waits for it to be ready."""
    from ninfer import Engine

    engine = Engine(path, config)
    threading.Thread(target=wait_ready_reporting, args=(engine, _LogLines()), name="ninfer-load-progress",
                     daemon=True).start()
    return engine


def run(args: argparse.Namespace) -> int:
    from ninfer.gateway.http.server import serve

    if not (0 <= args.port <= 65535):
        raise CLIError(f"--port must be in 0..65535, got {args.port}")
    if args.max_body_bytes < 1024:
        raise CLIError(f"--max-body-bytes must be >= 1024, got {args.max_body_bytes}")
    if args.drain_timeout_s < 0:
        raise CLIError(f"--drain-timeout-s must be >= 0, got {args.drain_timeout_s}")
    media = media_policy(args)
    _check_listen(args.host, args.port)
    config = engine_config(args)
    path, name, is_demo = resolve_model(args.model, config=config)
    plan = check_model(path, config)
    if config.max_model_len == 0:
        print(plan.note(), file=sys.stderr, flush=True)
    return serve(lambda: start_engine(path, config), model_name=args.served_model_name or name,
                 host=args.host, port=args.port, api_key=args.api_key or None,
                 max_body_bytes=args.max_body_bytes, drain_timeout_s=args.drain_timeout_s,
                 log_level=args.log_level, synthetic=config.synthetic, warmup=args.warmup, media=media,
                 demo=is_demo, ui=args.ui)
