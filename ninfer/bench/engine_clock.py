"""Timing through the public Engine for `ninfer bench decode|prefill`: an Engine over synthetic weights,
a trace callback that stamps its model units, and the two measurements built on the stamps.

The Engine calls its trace (`Engine.from_config(..., trace=...)`) on the worker thread: "unit" before a
model execution unit runs (its kind and rows), "program_commit" once the unit's batch is committed to
the Program (the sampled tokens are on the host by then). `UnitClock` stamps these two with
time.perf_counter while a measurement is open and ignores every event otherwise.

- TTFT (`ttft_ms`): one greedy request on an idle engine, from just before `submit` to the commit of
  the prefill stage that sampled its first token; the event's delivery to the caller is not counted.
- Decode round (`decode_rounds`): B requests of the same prompt length submitted together, greedy,
  `ignore_eos`, each with a budget that keeps all B rows decoding for the rounds measured. A round's
  time is the time between the commits of two consecutive decode units that both held all B rows
  (no prefill stage or control unit between them): what a client sees between two tokens of one
  stream while B streams decode (TPOT). The first `warmup` such intervals are dropped.
"""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

TOKEN_RANGE = (1000, 150000)      # ordinary text tokens of the Qwen3.6 vocabulary (no special ids)


@dataclass
class Unit:
    kind: str                     # "prefill" | "decode" | "control"
    rows: int
    commit_s: float | None = None     # perf_counter at its program_commit (None: ended without one)


@dataclass
class UnitClock:
    """The Engine trace callback: records the model units of an open measurement (`start` .. `stop`)."""
    units: list[Unit] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, what: str, info: dict) -> None:
        units = self.units
        if units is None:
            return
        if what == "unit":
            kind = info["kind"]
            units.append(Unit(getattr(kind, "value", str(kind)), len(info["rows"])))
        elif what == "program_commit" and units:
            units[-1].commit_s = time.perf_counter()

    def start(self) -> None:
        with self._lock:
            self.units = []

    def stop(self) -> list[Unit]:
        with self._lock:
            units, self.units = self.units or [], None
        return units


def start_engine(identity: str, device: str, clock: UnitClock, *, max_concurrency: int, max_model_len: int,
                 timeout: float | None = None, **config):
    """A ready Engine over the identity's synthetic weights (load_format dummy) with `clock` as its trace;
    the caller closes it. Returns (engine, seconds to ready)."""
    from ninfer.config import EngineConfig
    from ninfer.engine.facade import Engine

    cfg = EngineConfig(load_format="dummy", identity=identity, device=device,
                       max_concurrency=max_concurrency, max_model_len=max_model_len, **config)
    t0 = time.perf_counter()
    engine = Engine.from_config(cfg, trace=clock)
    avail = engine.wait_ready(timeout)
    if not avail.ready:
        engine.close()
        raise RuntimeError(f"engine not ready: {avail.reason or avail.state.value}")
    return engine, time.perf_counter() - t0


def tokens_per_round(spec) -> int:
    """The most tokens one decode round gives a row: 1 without speculation (`spec` None), the forced
    acceptance length L, else K+1."""
    if spec is None:
        return 1
    return spec.force_accept_len or spec.num_speculative_tokens + 1


def spec_fields(spec) -> dict:
    """A result row's speculative settings (method "" and K = L = 0 without speculation)."""
    if spec is None:
        return dict(speculative_method="", num_speculative_tokens=0, force_accept_len=0, draft_vocab_size=0)
    return dict(speculative_method=spec.method, num_speculative_tokens=spec.num_speculative_tokens,
                force_accept_len=spec.force_accept_len, draft_vocab_size=spec.draft_vocab_size)


def spec_header(specs: list) -> dict:
    """The run's speculative settings for the JSON header: method and K, the forced lengths of its engines
    (0: the model's own acceptance) and whether plain decoding ran too."""
    on = [s for s in specs if s is not None]
    return dict(speculative_method=on[0].method if on else "",
                num_speculative_tokens=on[0].num_speculative_tokens if on else 0,
                force_accept_lens=[s.force_accept_len for s in on], with_plain=bool(on) and None in specs)


def spec_label(spec) -> str:
    if spec is None:
        return ""
    return f" {spec.method} K={spec.num_speculative_tokens}" + (f" L={spec.force_accept_len}"
                                                                 if spec.force_accept_len else "")


def acceptance_length(before, after) -> float | None:
    """Mean tokens per speculative round between two `EngineMetrics` snapshots (1 + accepted drafts per
    round); None without speculation or without a round between them."""
    drafts = after.num_spec_drafts - before.num_spec_drafts
    if not after.num_speculative_tokens or drafts <= 0:
        return None
    return 1.0 + (after.num_spec_accepted_tokens - before.num_spec_accepted_tokens) / drafts


def random_prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*TOKEN_RANGE) for _ in range(n)]


def _prepare(engine, prompt: list[int]):
    return engine.frontend.prepare_tokens(prompt)


def _submit(engine, prepared, max_tokens: int, constraint=None):
    from ninfer.contract.frontend import OutputOptions
    from ninfer.contract.program import SamplingParams

    return engine.submit(prepared, SamplingParams(temperature=0.0), max_tokens=max_tokens,
                         output=OutputOptions(ignore_eos=True, constraint=constraint))


def _drain(handle) -> tuple[int, ...]:
    """Wait for the request's final result; returns its output token ids (EngineRequestError on an error)."""
    with handle:
        return tuple(handle.result().token_ids)


def ttft_ms(engine, clock: UnitClock, prompt: list[int], sync=lambda: None) -> float:
    """ms from `submit` to the commit of the first token of one request on an idle engine (max_tokens 1)."""
    prepared = _prepare(engine, prompt)
    sync()
    clock.start()
    try:
        t0 = time.perf_counter()
        handle = _submit(engine, prepared, 1)
        _drain(handle)
    finally:
        units = clock.stop()
    first = next((u.commit_s for u in units if u.kind == "prefill" and u.commit_s is not None), None)
    if first is None:
        raise RuntimeError(f"a prompt of {len(prompt)} tokens committed no first token")
    return (first - t0) * 1e3


def round_intervals(units: list[Unit], batch: int) -> list[float]:
    """Seconds between the commits of consecutive decode units that both held `batch` rows."""
    out = []
    for prev, cur in zip(units, units[1:]):
        full = all(u.kind == "decode" and u.rows == batch and u.commit_s is not None for u in (prev, cur))
        if full:
            out.append(cur.commit_s - prev.commit_s)
    return out


def decode_budget(batch: int, rounds: int) -> int:
    """Output tokens per request so that `rounds` rounds hold all `batch` rows: the first token comes from the
    prefill, and decode rounds run while the later requests are admitted (the Scheduler runs at most one
    between two prefill stages, more when a submission reaches the worker late): 2 x (batch - 1) + 4 spare."""
    return 1 + rounds + 2 * (batch - 1) + 4


def decode_rounds(engine, clock: UnitClock, batch: int, prompt_len: int, reps: int, warmup: int,
                  rng: random.Random, max_tokens: int, constraint=None) -> dict:
    """B concurrent requests of `max_tokens` each (see the module docstring); returns the round times in ms
    (`reps` of them after `warmup`, fewer when the budget held fewer) and the number of full rounds seen.
    constraint: an OutputConstraint on every request (it must not complete within max_tokens)."""
    prompts = [_prepare(engine, random_prompt(rng, prompt_len)) for _ in range(batch)]
    clock.start()
    try:
        handles = [_submit(engine, p, max_tokens, constraint) for p in prompts]
        outputs = [_drain(h) for h in handles]
    finally:
        units = clock.stop()
    short = [len(o) for o in outputs if len(o) != max_tokens]
    if short:
        raise RuntimeError(f"a request ended after {short[0]} of {max_tokens} tokens")
    gaps = round_intervals(units, batch)
    timed = gaps[warmup:warmup + reps] if len(gaps) > warmup else gaps
    if not timed:
        raise RuntimeError(f"no two consecutive decode rounds held all {batch} rows")
    return {"times_ms": [g * 1e3 for g in timed], "full_rounds": len(gaps) + 1 if gaps else 0,
            "units": len(units)}
