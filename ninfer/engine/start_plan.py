"""The plan of an Engine's start, made before anything is loaded: max_model_len, the KV pool, and the
check of both and the weights against the device's memory.

    budget          the device's memory (the facade: free CUDA memory, the host's available memory, or
                    NINFER_MEMORY_BUDGET)
    estimate        the family's sizing of the Program (weights, KV pool, StateImage entries, workspace)
    KV pool         num_pages 0: the smaller of max_concurrency full-length sequences and what
                    kv_memory_fraction of the memory left after the weights holds beside the entries and the
                    workspace (on CUDA the Program sizes it again from the memory free once the weights are
                    loaded); num_pages N: N pages
    max_model_len   0 (auto): the model's native length (max_position_embeddings, at most MAX_MODEL_LEN) when
                    the pool holds one sequence of it, else the longest it holds (on CUDA the Program may
                    lower it once more: ProgramConfig.fit_max_model_len); N: kept, refused when the pool
                    cannot hold one sequence of it
    causal scoring  the scoring window's staging instead of a pool: auto is the longest window that fits

Package-neutral: the facade hands in the model's facts, its family's sizing and the device's budget.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ninfer.config import EngineConfig, Purpose
from ninfer.engine.startup import gib

MAX_MODEL_LEN = 262144       # EngineConfig.max_model_len's upper bound


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What the plan reads of a model: its identity, dimension facts (max_position_embeddings), the weight
    groups it stores, its family's sizing module (estimate_memory, media_workspace_bytes, kv_budget_pages,
    num_scratch) and its package's ProgramConfig of an EngineConfig whose max_model_len is decided."""
    identity: str
    dims: Any
    groups: tuple[str, ...]
    sizing: Any
    program_config: Callable[[EngineConfig], Any]


class InsufficientMemoryError(ValueError):
    """The model with this configuration needs more memory than the device offers: `facts` (both figures),
    `advice` (what to change); str() is the one line "facts: advice"."""

    def __init__(self, facts: str, advice: str) -> None:
        super().__init__(f"{facts}: {advice}")
        self.facts, self.advice = facts, advice


@dataclasses.dataclass(frozen=True)
class StartPlan:
    """How an Engine starts, decided before anything is loaded (`plan_start`).

    config          the EngineConfig with device, dtype and max_model_len decided
    program_config  the package's ProgramConfig
    estimate        the family's MemoryEstimate of that Program (weights, KV pool, state, workspace)
    budget          the memory it is compared with, in bytes; budget_what says whose
    native          the model's native length (its max_position_embeddings, at most MAX_MODEL_LEN)
    auto            max_model_len was chosen here (EngineConfig.max_model_len 0)
    pool_tokens     the tokens the KV pool holds (for causal scoring: the longest window)
    """
    config: EngineConfig
    program_config: Any
    estimate: Any
    budget: int
    budget_what: str
    native: int
    auto: bool
    pool_tokens: int

    def note(self, max_model_len: int | None = None) -> str:
        """'max_model_len N: why' for a start-up line."""
        n = self.config.max_model_len if max_model_len is None else max_model_len
        if not self.auto:
            return f"max_model_len {n} (as configured)"
        if n >= self.native:
            if self.config.purpose is Purpose.CAUSAL_SCORING:
                return f"max_model_len {n}: the model's native length (--max-model-len sets another)"
            k = self.pool_tokens // n
            return (f"max_model_len {n}: the model's native length; the KV pool holds {k} sequence{'s' * (k != 1)} "
                    f"of it (--max-model-len sets another)")
        return (f"max_model_len {n}: the longest sequence that fits in {gib(self.budget)} {self.budget_what} "
                f"(the model's native length is {self.native}; for more, raise --kv-memory-fraction or lower "
                f"--max-concurrency, --cache-slots or --prefill-chunk-tokens)")


def plan_start(model: ModelFacts, cfg: EngineConfig, budget: int, what: str) -> StartPlan:
    """Decide max_model_len and the KV pool of `cfg` (device and dtype resolved) and check them and the
    weights against `budget` bytes of memory (`what`: whose, for the messages); InsufficientMemoryError
    when they do not fit, ValueError for a num_pages pool shorter than max_model_len (module docstring)."""
    sizing, dims = model.sizing, model.dims
    native = min(int(dims.max_position_embeddings), MAX_MODEL_LEN)
    auto = cfg.max_model_len == 0

    def estimate(length: int, num_pages: int | None = None) -> tuple[Any, Any]:
        pc = model.program_config(dataclasses.replace(cfg, max_model_len=length))
        if num_pages is not None:
            pc = dataclasses.replace(pc, num_pages=max(1, num_pages))
        media = sizing.media_workspace_bytes(dims, pc, model.groups)
        return pc, sizing.estimate_memory(dims, pc, model.groups, prefill_tokens=cfg.prefill_chunk_tokens,
                                          media_workspace=media)

    def refuse_weights(est: Any) -> InsufficientMemoryError:
        fixed = est.weights + est.state + est.workspace
        advice = [] if "tiny" in model.identity else [
            "a smaller model" if cfg.load_format != "dummy" else "a smaller --identity (qwen3_6-tiny-dense)"]
        if cfg.dtype == "fp32":
            advice.insert(0, "--dtype bf16 (half the weights)")
        if not cfg.device.startswith("cuda"):
            advice.append("a CUDA device")
        return InsufficientMemoryError(
            f"not enough memory for {model.identity} on {cfg.device}: its weights take {gib(est.weights)} in "
            f"{cfg.dtype}, with the recurrent state ({gib(est.state)}) and workspace ({gib(est.workspace)}) "
            f"{gib(fixed)} before any KV cache, and there are {gib(budget)} {what}",
            f"use {', '.join(advice)} or more memory")

    if cfg.purpose is Purpose.CAUSAL_SCORING:
        length = native if auto else cfg.max_model_len
        pc, est = estimate(length)
        if est.total > budget and auto:
            lo, hi = 2, length                  # the longest window whose staging fits
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if estimate(mid)[1].total <= budget else (lo, mid - 1)
            length = lo
            pc, est = estimate(length)
        if est.total > budget:
            if est.weights + est.state > budget or auto:
                raise refuse_weights(est)
            raise InsufficientMemoryError(
                f"not enough memory for {model.identity} on {cfg.device}: scoring windows of --max-model-len "
                f"{length} tokens need {gib(est.total)} with the weights, and there are {gib(budget)} {what}",
                "lower --max-model-len")
        return StartPlan(dataclasses.replace(cfg, max_model_len=length), pc, est, budget, what, native, auto, length)

    cuda = cfg.device.startswith("cuda")
    want = native if auto else cfg.max_model_len
    pc, est = estimate(want)
    ps = cfg.page_size
    if cfg.num_pages:
        if not auto and cfg.num_pages * ps < want:
            raise ValueError(f"num_pages {cfg.num_pages} ({cfg.num_pages * ps} tokens of page_size {ps}) cannot hold "
                             f"one sequence of max_model_len {want}: raise --num-pages (0: sized from the memory) or "
                             f"lower --max-model-len")
        length = min(want, cfg.num_pages * ps) if auto else want
        pages = cfg.num_pages
        pc, est = estimate(length)
    else:
        spare = est.page_bytes                  # the prefill graphs' page beside the pool
        entries = pc.num_slots + sizing.num_scratch(pc)
        cap = sizing.kv_budget_pages(dims, pc, budget - est.weights, entries, est.workspace + spare)
        length = min(want, cap * ps) if auto else want
        if est.weights + est.state + est.workspace + spare > budget:
            raise refuse_weights(est)
        least = min(native, 2 * ps) if auto else length
        if cap * ps < least:
            fits = cap * ps
            raise InsufficientMemoryError(
                f"not enough memory for the KV cache of {model.identity} on {cfg.device}: a sequence of "
                f"{least} tokens needs {gib(-(-length // ps) * est.page_bytes)} of KV, and "
                f"--kv-memory-fraction {cfg.kv_memory_fraction} of the {gib(max(0, budget - est.weights))} left "
                f"after the weights ({gib(budget)} {what}) holds {fits} tokens beside {entries} state entries "
                f"({gib(est.state)}) and the workspace ({gib(est.workspace)})",
                f"lower --max-model-len (at most {fits} fits) or --max-concurrency / --cache-slots, or raise "
                f"--kv-memory-fraction")
        full = cfg.max_concurrency * -(-length // ps)
        pages = min(full, cap)
        pc, est = estimate(length, pages)
        pc = (dataclasses.replace(pc, num_pages=full, fit_max_model_len=auto) if cuda
              else dataclasses.replace(pc, kv_memory_fraction=0.0))
    if est.total > budget:
        raise refuse_weights(est) if est.weights + est.state + est.workspace > budget else InsufficientMemoryError(
            f"not enough memory for {model.identity} on {cfg.device}: {pages} KV pages (--num-pages) take "
            f"{gib(pages * est.page_bytes)}, {gib(est.total)} with the weights, state and workspace, and there "
            f"are {gib(budget)} {what}", "lower --num-pages")
    return StartPlan(dataclasses.replace(cfg, max_model_len=length), pc, est, budget, what, native, auto, pages * ps)
