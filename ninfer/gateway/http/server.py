"""Run the HTTP Gateway: one process, uvicorn in front, the Engine worker inside.

Lifecycle:
  start     the socket opens at once; the Engine is built in a background thread, and until it
            is ready `/health` answers 503 "starting" (or "failed" with the reason). Then the serve
            warmup (`Engine.warm_up`, on unless warmup=False): a few requests through the public
            Engine path with the context cache off, so that the first prompts of each length class
            do not wait for kernel compiles, autotuning or graph captures; `/health` says
            "starting" (warming up) until it is done.
  SIGTERM   drain: uvicorn stops accepting connections and `Engine.close(drain_timeout_s)` lets
            in-flight requests finish, cancelling what still runs at the timeout (streams end
            with finish_reason "abort"); then the process exits 0. A second SIGINT forces the exit.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
import time
from typing import Callable

import uvicorn

from ninfer.gateway.http.app import GatewayState, create_app

log = logging.getLogger("ninfer.gateway.http")

class _Server(uvicorn.Server):
    """uvicorn that drains the Engine on the first signal and does not re-raise the signal at exit."""

    def __init__(self, config: uvicorn.Config, state: GatewayState, drain_timeout_s: float):
        super().__init__(config)
        self.state = state
        self.drain_timeout_s = drain_timeout_s

    def handle_exit(self, sig: int, frame) -> None:
        if not self.state.draining:
            self.state.draining = True
            engine = self.state.engine
            log.info("signal %d: draining (no new requests; in-flight ones get %.0fs)", sig, self.drain_timeout_s)
            if engine is not None:
                threading.Thread(target=engine.close, args=(self.drain_timeout_s,), name="ninfer-drain",
                                 daemon=True).start()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        # NOTE: uvicorn re-raises the captured signal after a graceful shutdown, which makes the
        # process die "by SIGTERM"; a drained server should exit 0 instead.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        sigs = (signal.SIGINT, signal.SIGTERM)
        original = {s: signal.signal(s, self.handle_exit) for s in sigs}
        try:
            yield
        finally:
            for s, h in original.items():
                signal.signal(s, h)


def configure_logging(level: str = "info") -> None:
    logger = logging.getLogger("ninfer")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


def warm_up(engine) -> None:
    """The serve warmup (`Engine.warm_up`); a failure is logged and serving goes on without it (the
    requests it would have warmed then pay their first-use costs themselves)."""
    t0 = time.perf_counter()
    try:
        done = engine.warm_up()
    except Exception as e:  # noqa: BLE001 - a failed warmup must not stop a working engine from serving
        log.warning("warm-up failed after %.1f s (serving without it): %s: %s", time.perf_counter() - t0,
                    type(e).__name__, e)
        return
    if done:
        log.info("warm-up: %d prompts (%s tokens) in %.1f s", len(done), ", ".join(str(n) for n, _ in done),
                 time.perf_counter() - t0)


def serve(engine_factory: Callable[[], object], *, model_name: str, host: str = "127.0.0.1",
          port: int = 8000, api_key: str | None = None, max_body_bytes: int | None = None,
          drain_timeout_s: float = 30.0, log_level: str = "info", synthetic: bool = False,
          warmup: bool = True, media=None, demo: bool = False, ui: bool = True) -> int:
    """Serve until SIGINT/SIGTERM; return the exit code (0 after a drain).

    NOTE: a port that cannot be bound ends the process inside uvicorn (`SystemExit(3)`, the error
    on stderr) before this returns."""
    configure_logging(log_level)
    state = GatewayState(model_name=model_name, api_key=api_key, synthetic=synthetic, demo=demo, ui=ui)
    if media is not None:                    # a MediaPolicy (default: data: URLs only)
        state.media = media
    if max_body_bytes:
        state.max_body_bytes = max_body_bytes

    def build() -> None:
        try:
            engine = engine_factory()
        except Exception as e:  # noqa: BLE001 - reported by /health and the log, not raised
            state.startup_error = f"{type(e).__name__}: {e}"
            log.error("engine failed to start: %s", state.startup_error)
            return
        state.attach(engine)
        if state.draining:                       # a signal arrived while the engine was built
            engine.close(0.0)
            return
        state.warming = warmup
        try:
            a = engine.wait_ready()
            if not a.ready:
                log.error("engine failed to start: %s", a.reason)
                return
            if warmup and not state.draining:
                warm_up(engine)
            spec = getattr(getattr(engine, "config", None), "speculative", None)
            log.info("engine ready: model %s, max_model_len %d%s", model_name, engine.max_model_len,
                     "" if spec is None else f", speculative {spec.method} K={spec.num_speculative_tokens}"
                     + (f" forced acceptance length {spec.force_accept_len}" if spec.force_accept_len else ""))
        finally:
            state.warming = False

    @contextlib.asynccontextmanager
    async def lifespan(app):
        threading.Thread(target=build, name="ninfer-engine-start", daemon=True).start()
        yield
        # NOTE: uvicorn gets here after the in-flight connections finished (or were cancelled).
        for h in list(state.inflight):
            h.close()
        if state.engine is not None:
            await asyncio.get_running_loop().run_in_executor(None, state.engine.close, drain_timeout_s)
        log.info("shut down")

    app = create_app(state, lifespan=lifespan)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=drain_timeout_s + 10.0, lifespan="on")
    server = _Server(config, state, drain_timeout_s)
    server.run()
    return 0 if server.started else 1
