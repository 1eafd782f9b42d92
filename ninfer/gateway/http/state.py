"""GatewayState: what the HTTP routes share (the Engine once built, its readiness, limits, in-flight handles)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ninfer.gateway.http import responses as R
from ninfer.gateway.http.convert import ModelLimits
from ninfer.gateway.http.errors import not_ready
from ninfer.gateway.media import MediaPolicy

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
SYNTHETIC_FINGERPRINT = "ninfer-synthetic-weights"


@dataclass
class GatewayState:
    """What the routes share. `engine` is None until it is built (health says "starting")."""
    model_name: str
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    engine: object | None = None
    pieces: R.TokenPieces | None = None
    startup_error: str | None = None
    draining: bool = False
    created: int = field(default_factory=R.now)
    inflight: set = field(default_factory=set)       # open GenerationHandles (drain cancels them)
    synthetic: bool = False                          # dummy weights: every response says so
    warming: bool = False                            # the serve warmup runs (health: starting)
    media: MediaPolicy = field(default_factory=MediaPolicy)   # where images/videos may come from, limits
    demo: bool = False                               # the built-in demo model (random text): /v1/models says so
    ui: bool = True                                  # serve the browser playground at `/`

    @property
    def fingerprint(self) -> str | None:
        """`system_fingerprint` of every completion: set only for synthetic (dummy) weights."""
        return SYNTHETIC_FINGERPRINT if self.synthetic else None

    def attach(self, engine) -> None:
        self.pieces = R.TokenPieces(engine.frontend.tokenizer)
        self.engine = engine

    @property
    def limits(self) -> ModelLimits | None:
        # NOTE: read each time: the Engine lowers max_model_len to Program's limit once it is ready.
        if self.engine is None:
            return None
        frontend = self.engine.frontend
        return ModelLimits(max_model_len=int(self.engine.max_model_len),
                           vocab_size=int(frontend.tokenizer.vocab_size),
                           sampling_defaults=getattr(frontend, "sampling_defaults", {}),
                           lookahead=int(getattr(self.engine, "lookahead", 0)))

    def availability(self) -> tuple[str, bool, str]:
        """(state, ready, reason) as the Gateway reports it."""
        if self.draining:
            return "shutting_down", False, "the server is draining (SIGTERM)"
        if self.engine is None:
            if self.startup_error:
                return "failed", False, self.startup_error
            return "starting", False, "the engine is loading the model"
        a = self.engine.availability
        if a.ready and self.warming:
            return "starting", False, "warming up (first compiles and graph captures)"
        return a.state.value, a.ready, a.reason or a.state.value

    def ready_engine(self):
        state, ready, reason = self.availability()
        if not ready:
            raise not_ready(f"{state} ({reason})" if reason != state else state)
        return self.engine
