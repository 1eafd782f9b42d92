"""`ninfer serve [MODEL]`: the OpenAI-compatible HTTP server (see ninfer/gateway/http/)."""
from __future__ import annotations

import argparse
import os

from ninfer.gateway.cli.common import add_engine_args, add_model_arg, engine_config, open_engine, resolve_model
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
    # NOTE: --force-accept-len too, for `ninfer bench serve` (a benchmarking aid: synthetic weights)
    add_engine_args(p, force_accept_len=True)


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


def check_model(path, config) -> None:
    """The model checks the Engine makes before loading, here before the server starts (it builds the
    Engine in the background, so a refusal there would leave a server that never becomes ready)."""
    from ninfer.engine.facade import check_model as engine_check
    try:
        engine_check(path, config)
    except (OSError, ValueError) as e:
        raise CLIError(f"cannot load {path or config.identity}: {e}") from None


def run(args: argparse.Namespace) -> int:
    from ninfer.gateway.http.server import serve

    if not (0 <= args.port <= 65535):
        raise CLIError(f"--port must be in 0..65535, got {args.port}")
    if args.max_body_bytes < 1024:
        raise CLIError(f"--max-body-bytes must be >= 1024, got {args.max_body_bytes}")
    if args.drain_timeout_s < 0:
        raise CLIError(f"--drain-timeout-s must be >= 0, got {args.drain_timeout_s}")
    _check_listen(args.host, args.port)
    config = engine_config(args)
    path, name, _ = resolve_model(args.model, config=config)
    check_model(path, config)
    return serve(lambda: open_engine(path, config), model_name=args.served_model_name or name,
                 host=args.host, port=args.port, api_key=args.api_key or None,
                 max_body_bytes=args.max_body_bytes, drain_timeout_s=args.drain_timeout_s,
                 log_level=args.log_level, synthetic=config.synthetic, warmup=args.warmup)
