"""The public NInfer Engine: one model, one worker thread, requests in FIFO order.

    engine = Engine("model.ninfer", EngineConfig(max_concurrency=4))
    engine.wait_ready()
    prompt = engine.frontend.prepare_chat([{"role": "user", "content": "Hi"}])
    for event in engine.submit(prompt, SamplingParams(temperature=0), max_tokens=64):
        ...   # GenerationStart, GenerationDelta..., then GenerationResult | GenerationError
    engine.close()

Errors. `submit` raises EngineRequestError for the three rejections that happen before a request
is accepted: OVERLOADED (outstanding capacity full: HTTP 429), NOT_READY (starting, failed or
closing: 503), INVALID_REQUEST (empty prompt, max_tokens < 1, prompt + max_tokens > max_model_len
(+ the speculative lookahead K with `EngineConfig.speculative`), bad output options: 400). Everything
after acceptance arrives as the request's final event: GenerationError(QUEUE_TIMEOUT) when its
deadline passed in the queue, (INVALID_REQUEST) when Program finds it infeasible even on an empty
engine, (ENGINE_FAILED) on engine-wide failure; a cancelled request ends with
GenerationResult(finish_reason=CANCELLED) and its partial output.
`handle.result()` and `generate()` raise EngineRequestError for a GenerationError.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import math
import os
import threading
import time
from typing import Any, Callable, Sequence

from ninfer.contract.program import Program, SamplingParams
from ninfer.engine.causal_score_core import CausalScoreCore
from ninfer.engine.context_cache import CacheConfig
from ninfer.engine.engine_core import DECODE_STEPS, EngineCore, Trace
from ninfer.engine.handle import GenerationHandle
from ninfer.engine.start_plan import (MAX_MODEL_LEN, InsufficientMemoryError, ModelFacts, StartPlan,
                                      plan_start)
from ninfer.engine.startup import (BUDGET_ENV, CountingWeights, StartProgress, budget_override,
                                   host_available_bytes, progress_line)
from ninfer.contract.frontend import OutputOptions, PreparedPrompt
from ninfer.config import (Availability, EngineConfig, EngineMetrics, EngineRequestError, ErrorKind,
                          GenerationResult, Purpose, ScoreInput, ScoreResult)

WARMUP_LOG_EVERY_S = 10.0      # a log line of the warmup's progress at most this often

__all__ = ["Engine", "GenerationHandle", "EngineRequestError", "check_model", "check_device", "StartPlan",
           "InsufficientMemoryError", "DeviceUnavailableError"]
_log = logging.getLogger(__name__)


class Engine:
    """Construct from a `.ninfer` artifact path; the worker starts at once and loads the model.

    `Engine.from_config(EngineConfig(load_format="dummy", identity="qwen3_6-27b"))` instead runs a
    registered identity with seeded random weights generated on the device (benchmarks only; every
    GenerationResult.extra then has "synthetic_weights": True and `engine.synthetic` is True).

    `availability` is STARTING while Program loads, then READY (or FAILED with the reason).
    Use `wait_ready()` to block until it is decided; `progress()` says how far the load is.

    Before anything is loaded, the constructor plans the start (`start_plan`, engine/start_plan.py): it decides
    max_model_len (config 0: the model's native length when the KV pool holds one sequence of it, else
    the longest it holds; `max_model_len_note` says which and why) and compares the weights, KV pool,
    state and workspace with the device's memory, raising InsufficientMemoryError (a ValueError, one
    line with both figures and what to change) when they do not fit, and DeviceUnavailableError for a
    CUDA device this process cannot use.
    """

    def __init__(self, artifact_path: str | os.PathLike | None = None, config: EngineConfig = EngineConfig(), *,
                 trace: Trace | None = None):
        model = _open_model(artifact_path, config)
        try:
            plan = _plan(model, model.config)
        except ValueError:
            model.close()
            raise
        self.start_plan = plan
        progress = StartProgress(plan.estimate.weights)
        try:
            frontend = model.frontend
        except BaseException:
            model.close()
            raise
        program_config = plan.program_config
        if plan.config.purpose is Purpose.GENERATION:
            program_config = dataclasses.replace(program_config, sampleable_vocab_size=frontend.vocab_size)
        size_of = _loaded_size(program_config)

        def load() -> Program:
            weights = CountingWeights(model.weights(), progress, size_of)
            return model.package_module.create_program(weights, program_config)
        self._start(frontend, plan.config, model.identity, load, trace, progress=progress)

    @classmethod
    def from_config(cls, config: EngineConfig, *, trace: Trace | None = None) -> "Engine":
        """An Engine whose model the config names alone: `EngineConfig(load_format="dummy", identity=...)`."""
        return cls(None, config, trace=trace)

    @property
    def synthetic(self) -> bool:
        """True when the weights are synthetic (load_format dummy): outputs are meaningless."""
        return self.config.synthetic

    @classmethod
    def from_program(cls, program: Program | Callable[[], Program], frontend: Any, config: EngineConfig, *,
                     identity: str = "program", trace: Trace | None = None,
                     clock: Callable[[], float] | None = None) -> "Engine":
        """An Engine over an already built Program (or a loader of one) and Frontend: tests, benchmarks."""
        self = cls.__new__(cls)
        load = program if callable(program) and not hasattr(program, "decode") else (lambda: program)
        self._start(frontend, config, identity, load, trace, clock)
        return self

    def _start(self, frontend: Any, config: EngineConfig, identity: str, load: Callable[[], Program],
               trace: Trace | None, clock: Callable[[], float] | None = None,
               progress: StartProgress | None = None) -> None:
        if config.max_model_len == 0:
            # NOTE: auto over a Program built elsewhere (from_program): the Program's own limit, taken at attach.
            config = dataclasses.replace(config, max_model_len=MAX_MODEL_LEN)
        self.config = config
        self._progress = progress
        if not hasattr(self, "start_plan"):
            self.start_plan = None
        self.identity = identity
        self.frontend = frontend
        self.warmup_plans: tuple[int, int, float] | None = None    # `warm_up`'s attention plans
        kwargs = {} if clock is None else {"clock": clock}
        if config.purpose is Purpose.CAUSAL_SCORING:
            self._core = CausalScoreCore(frontend, max_model_len=config.max_model_len)
        else:
            self._core = EngineCore(frontend, max_concurrency=config.max_concurrency,
                                    queue_size=config.queue_size, request_timeout_s=config.request_timeout_s,
                                    prefill_chunk_tokens=config.prefill_chunk_tokens,
                                    max_model_len=config.max_model_len, trace=trace,
                                    cache=_cache_config(config), **kwargs)
        if config.synthetic:
            self._core.result_extra = {"synthetic_weights": True}
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._worker_main, args=(load,), name="ninfer-engine-worker",
                                        daemon=True)
        self._thread.start()

    def _worker_main(self, load: Callable[[], Program]) -> None:
        core = self._core
        try:
            try:
                program = load()
                core.attach_program(program)
            except Exception as e:  # noqa: BLE001 - any load failure is a startup failure with its reason
                core.fail_startup(f"loading the model failed: {type(e).__name__}: {e}")
                return
            finally:
                if self._progress is not None:
                    self._progress.finished()
            self._ready.set()
            try:
                core.run()
            except BaseException as e:  # noqa: BLE001 - the worker never dies silently
                fail = getattr(core, "fail", None) or core.fail_startup
                fail(f"engine worker crashed: {type(e).__name__}: {e}")
                raise
        finally:
            self._ready.set()

    # ---- readiness -------------------------------------------------------------------------
    @property
    def availability(self) -> Availability:
        return self._core.availability

    def wait_ready(self, timeout: float | None = None) -> Availability:
        """Block until the model is loaded (READY) or loading failed (FAILED); return availability."""
        self._ready.wait(timeout)
        return self._core.availability

    def progress(self) -> dict | None:
        """While the model loads and while `warm_up` runs: {"phase": "loading" | "initializing" | "warming_up",
        "done", "total", "unit": "bytes" | "prompts", "fraction", "elapsed_s", "eta_s"} (`ninfer.engine.startup`);
        None otherwise (and for an Engine over a Program built elsewhere)."""
        p = self._progress
        if p is None or p.phase == "ready":
            return None
        return p.snapshot()

    @property
    def max_model_len(self) -> int:
        """prompt + max_tokens (+ `lookahead`) limit of one request."""
        return self._core.max_model_len

    @property
    def max_model_len_note(self) -> str:
        """max_model_len and why it is that figure, for a start-up line ("" for an Engine over a Program
        built elsewhere). Once ready, the figure is the Engine's own (the Program may have lowered it)."""
        plan = self.start_plan
        if plan is None:
            return ""
        return plan.note(self.max_model_len if self.availability.ready else plan.config.max_model_len)

    @property
    def lookahead(self) -> int:
        """Positions every request reserves past its output for speculative decoding (K with
        `EngineConfig.speculative`, else 0): a request needs prompt + max_tokens + lookahead <=
        max_model_len. Known once the model is loaded (0 before)."""
        return getattr(self._core, "lookahead", 0)

    # ---- requests ----------------------------------------------------------------------------
    def submit(self, prompt: PreparedPrompt, sampling: SamplingParams, *, max_tokens: int,
               output: OutputOptions = OutputOptions(), request_id: str | None = None,
               deadline_s: float | None = None, prompt_logprobs: int | None = None,
               session_id: str | None = None, context_cache: bool = True) -> GenerationHandle:
        """Accept a request (see the module docstring for what raises and what arrives as an event).

        deadline_s: how long the request may wait in the queue before it is admitted
        (default `config.request_timeout_s`); it ends with GenerationError(QUEUE_TIMEOUT) after that.
        prompt_logprobs: None, or k in 0..20: the result carries the log-prob (and top-k) of every
        prompt token (`GenerationResult.prompt_logprobs`, first entry None); the prompt is then always
        computed, never taken from a reused prefix.
        session_id: the conversation this request continues (a context-cache lookup hint; the cache
        also finds shared prefixes without it). context_cache=False: the request neither reuses nor
        publishes checkpoints (serve warmup). GenerationStart.num_reused_tokens and
        usage.cached_tokens report the prompt tokens taken from a checkpoint.
        A CausalScoring engine refuses every submit (INVALID_REQUEST): use `score`.
        """
        kw = {} if prompt_logprobs is None else {"prompt_logprobs": prompt_logprobs}
        if session_id is not None:
            kw["session_id"] = session_id
        if not context_cache:
            kw["context_cache"] = False
        return self._core.submit(prompt, sampling, max_tokens=max_tokens, output=output,
                                 request_id=request_id, deadline_s=deadline_s, **kw)

    def score(self, inputs: str | ScoreInput | list, *, window: int | None = None, stride: int | None = None,
              per_token: bool = False, top_k: int = 0, add_bos: bool = False,
              progress: Callable[[int], None] | None = None) -> list[ScoreResult]:
        """CausalScoring engines only: log-likelihood and perplexity of texts (blocking; serial).

        inputs: a text, a list of token ids, a ScoreInput (with `context` for continuation scoring)
        or a list of these; returns one ScoreResult per input. Long inputs are scored over windows
        of `window` tokens (default and maximum: max_model_len) moved by `stride` (default: window),
        the standard sliding-window perplexity recipe (see engine/causal_score_core.py).
        per_token: also each token's log-prob (and `top_k` alternatives, 0..20). add_bos: prepend
        <|endoftext|> so the first token is scored too (off by default: the family has no BOS).
        progress: called with the number of tokens the recipe moved past, after every window.
        """
        if self.config.purpose is not Purpose.CAUSAL_SCORING:
            raise EngineRequestError(ErrorKind.INVALID_REQUEST,
                                     "score needs an engine started for purpose 'causal_scoring' "
                                     "(EngineConfig(purpose='causal_scoring')); this one is for generation")
        return self._core.score(_score_inputs(inputs), window=window, stride=stride, per_token=per_token,
                                top_k=top_k, add_bos=add_bos, progress=progress)

    def generate(self, prompt: PreparedPrompt, sampling: SamplingParams, *, max_tokens: int,
                 output: OutputOptions = OutputOptions(), request_id: str | None = None,
                 deadline_s: float | None = None, timeout: float | None = None,
                 prompt_logprobs: int | None = None, session_id: str | None = None,
                 context_cache: bool = True) -> GenerationResult:
        """Submit and wait for the final result; raises EngineRequestError for errors."""
        with self.submit(prompt, sampling, max_tokens=max_tokens, output=output, request_id=request_id,
                         deadline_s=deadline_s, prompt_logprobs=prompt_logprobs, session_id=session_id,
                         context_cache=context_cache) as handle:
            return handle.result(timeout)

    def warm_up(self, lengths: Sequence[int] | None = None, *, timeout: float | None = None,
                plans: bool = True) -> list[tuple[int, float]]:
        """Serve warmup: one greedy request of 2 output tokens per prompt length, then two drawn ones at
        the shortest length (top-k + top-p; top-p + min-p), one after another, through `submit` with
        the context cache off (no checkpoint published or reused, nothing left that a later request
        could continue). lengths None: the Program's `warmup_prompt_lengths` for this engine's prefill
        stage size and max_model_len, read once when the Program attached (the lengths whose first
        prefill compiles kernels or captures graphs; none on the CPU reference ops). Returns (length,
        seconds) per request; a request's error is raised (EngineRequestError), ending the warmup.
        The prompts are fixed ordinary token ids (outputs are discarded). Afterwards the request counters
        and histograms of `metrics()` are zeroed (gauges stay live): the warmup is not traffic, and its
        first-use latencies would skew the TTFT histogram. Meant for startup, before other requests.
        plans: then, on the worker thread, the Program's `warmup_attention_plans` where it has one (the
        cuDNN plans of prompts longer than one stage, which no one-stage request reaches); its
        (shapes run, shapes in all, seconds) is kept in `warmup_plans` and logged."""
        if self.config.purpose is Purpose.CAUSAL_SCORING:
            if lengths:
                raise ValueError("warm_up runs generation requests; this engine is for causal scoring")
            return []
        limit = self.max_model_len - 2 - self.lookahead
        if lengths is None:
            lengths = self._core.warmup_lengths
        bad = [n for n in lengths if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= limit]
        if bad:
            raise ValueError(f"warmup prompt lengths must be integers in 1..{limit} (max_model_len - 2"
                             f"{' - the speculative lookahead' if self.lookahead else ''}), got {bad[0]!r}")
        vocab = min(int(self.frontend.tokenizer.vocab_size), 10000)    # ordinary ids: no special token
        # NOTE: greedy at every length; then, at the shortest, the drawn forms a server meets first (a top-k
        #       cut with top-p, top-p alone with min-p): the sampler's kernels compile on first use too.
        drawn = (SamplingParams(temperature=0.8, top_p=0.95, top_k=20, seed=0),
                 SamplingParams(temperature=0.8, top_p=0.95, min_p=0.05, seed=0))
        runs = [(n, SamplingParams(temperature=0.0)) for n in lengths]
        runs += [(min(lengths), sp) for sp in drawn] if lengths else []
        done = []
        progress = self._progress
        if progress is not None and runs:
            progress.warming(len(runs))
        logged = time.perf_counter()
        try:
            for n, sp in runs:
                prompt = self.frontend.prepare_tokens([(7919 * i + 11) % vocab for i in range(n)])
                t0 = time.perf_counter()
                self.generate(prompt, sp, max_tokens=2, timeout=timeout, context_cache=False)
                done.append((n, time.perf_counter() - t0))
                if progress is not None:
                    progress.add(1)
                    if time.perf_counter() - logged >= WARMUP_LOG_EVERY_S and len(done) < len(runs):
                        _log.info("%s", progress_line(progress.snapshot()))
                        logged = time.perf_counter()
        finally:
            if progress is not None:
                progress.finished()
        if plans:
            t0 = time.perf_counter()
            ran, total = self._core.plan_attention().result(timeout)
            self.warmup_plans = (ran, total, time.perf_counter() - t0)
            if total:
                _log.info("warm-up: planned the attention of %d of %d stage shapes of prompts over one stage "
                          "(%d tokens) in %.1f s", ran, total, self._core.prefill_chunk_tokens, self.warmup_plans[2])
        if done:
            self._core.reset_request_metrics()
        return done

    def metrics(self) -> EngineMetrics:
        return self._core.metrics()

    # ---- shutdown ----------------------------------------------------------------------------
    def close(self, timeout: float = 30.0) -> None:
        """Stop accepting; let outstanding requests finish for up to `timeout` seconds, cancel the
        rest (they end with finish_reason CANCELLED), and join the worker."""
        self._core.request_close(timeout)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout + 30.0)

    @property
    def closed(self) -> bool:
        return not self._thread.is_alive()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        a = self.availability
        return f"Engine({self.identity!r}, {a.state.value}{': ' + a.reason if a.reason else ''})"


def _score_inputs(inputs: Any) -> list[ScoreInput]:
    def one(x: Any) -> ScoreInput:
        if isinstance(x, ScoreInput):
            return x
        if isinstance(x, str):
            return ScoreInput(text=x)
        if isinstance(x, (list, tuple)) and all(isinstance(t, int) for t in x):
            return ScoreInput(token_ids=tuple(x))
        raise EngineRequestError(ErrorKind.INVALID_REQUEST,
                                 f"score inputs must be texts, token-id lists or ScoreInputs, got {type(x).__name__}")
    if isinstance(inputs, (str, ScoreInput)):
        return [one(inputs)]
    if isinstance(inputs, (list, tuple)) and inputs and all(isinstance(t, int) for t in inputs):
        return [one(inputs)]
    return [one(x) for x in inputs]


# ---- the model: a package's Frontend, its weights and the plan of its start -----------------------
@dataclasses.dataclass
class _Model:
    """What the Engine starts from: the config with device and dtype resolved, the package's Frontend (built
    on first use: the memory plan needs none), and the weights its Program loads (opened, not read)."""
    config: EngineConfig
    make_frontend: Callable[[], Any]
    identity: str
    package: Any                       # the TargetPackage
    package_module: Any
    groups: tuple[str, ...]            # the weight groups the model stores
    weights: Callable[[], Any]
    close: Callable[[], None]

    @functools.cached_property
    def frontend(self) -> Any:
        return self.make_frontend()


def _open_model(path: str | os.PathLike | None, config: EngineConfig) -> _Model:
    cfg = _resolve_device(config)
    if cfg.load_format == "dummy":
        if path is not None:
            raise ValueError("load_format 'dummy' takes no artifact path (the model is config.identity)")
        return _dummy_model(cfg)
    if path is None:
        raise ValueError("Engine needs a .ninfer artifact path (or EngineConfig(load_format='dummy', identity=...))")
    return _artifact_model(path, cfg)


class DeviceUnavailableError(ValueError):
    """The configured device does not exist in this process (a CPU-only PyTorch build, no visible GPU)."""


def _resolve_device(config: EngineConfig) -> EngineConfig:
    """config.resolved(), after refusing a CUDA device this process cannot use, in plain words."""
    import torch

    if config.device.startswith("cuda"):
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            raise DeviceUnavailableError(
                f"device {config.device!r}: this PyTorch build has no CUDA (torch {torch.__version__} is built for "
                f"the CPU only): use device cpu, or install a CUDA build of PyTorch")
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                f"device {config.device!r}: no CUDA device is visible (this PyTorch is built for CUDA "
                f"{torch.version.cuda}; check the driver and CUDA_VISIBLE_DEVICES): use device cpu")
        index = int(config.device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise DeviceUnavailableError(f"device {config.device!r}: this machine has {torch.cuda.device_count()} "
                                         f"CUDA device(s), numbered from 0")
    return config.resolved(torch.cuda.is_available())


def check_device(config: EngineConfig) -> None:
    """Raise DeviceUnavailableError (a ValueError) when `config.device` names a CUDA device this process cannot
    use; a gateway calls it before it resolves or loads anything."""
    _resolve_device(config)


def _artifact_model(path: str | os.PathLike, cfg: EngineConfig) -> _Model:
    """A `.ninfer` artifact: its package builds the Frontend and the Program."""
    from ninfer.artifact import open_artifact
    artifact = open_artifact(path)
    try:
        _check_speculative_weights(artifact, path, cfg)
        package_module = importlib.import_module(artifact.package.module)
    except BaseException:
        artifact.close()
        raise
    return _Model(cfg, lambda: _create_frontend(package_module, artifact), artifact.identity, artifact.package,
                  package_module, artifact.groups,
                  lambda: artifact, artifact.close)


def check_model(path: str | os.PathLike | None, cfg: EngineConfig) -> "StartPlan":
    """What `Engine` checks before any weight is read, for a gateway that builds the Engine in the background
    (serve) to fail at once: the device (DeviceUnavailableError), speculation asked of a model without MTP
    weights, and the memory (`StartPlan`: InsufficientMemoryError when the model does not fit; a ValueError
    each). Returns the plan (its max_model_len and `note`). path None: the dummy identity of `cfg`."""
    model = _open_model(path, cfg)
    try:
        return _plan(model, model.config)
    finally:
        model.close()


def _check_speculative_weights(artifact: Any, path: str | os.PathLike, cfg: EngineConfig) -> None:
    if cfg.speculative is not None and not artifact.has_group("mtp"):
        raise ValueError(f"speculative method {cfg.speculative.method!r} needs the checkpoint's MTP weights, and "
                         f"{os.fspath(path)} stores none (convert a checkpoint that has mtp.* tensors, or run "
                         f"without --speculative-method)")


def _dummy_model(cfg: EngineConfig) -> _Model:
    """load_format "dummy": a benchmarking aid, the package's Program over seeded random weights generated
    on the device, with the built-in Frontend; every result carries extra["synthetic_weights"] = True."""
    import torch

    from ninfer.targets.dummy_weights import DummyWeights
    from ninfer.targets.qwen3_6.frontend import Qwen36Frontend
    from ninfer.targets.registry import lookup
    package = lookup(cfg.identity)
    if cfg.speculative is not None and getattr(package.dims, "mtp_num_hidden_layers", 0) < 1:
        raise ValueError(f"speculative method {cfg.speculative.method!r} needs MTP weights, and identity "
                         f"{package.identity} has no MTP layer")
    package_module = importlib.import_module(package.module)
    dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
    dims = package.dims
    groups = (("embedding", "gdn", "attention", "ffn", "head") + (("mtp",) if dims.mtp_num_hidden_layers else ())
              + (("vision",) if dims.vision is not None else ()))
    return _Model(cfg, Qwen36Frontend.builtin, package.identity, package, package_module, groups,
                  lambda: DummyWeights(package.identity, device=cfg.device, dtype=dtype, seed=cfg.seed), lambda: None)


def _create_frontend(package_module: Any, artifact: Any) -> Any:
    resources = artifact.frontend_resources()
    factory = getattr(package_module, "create_frontend", None)
    if factory is not None:
        return factory(resources)
    from ninfer.targets.qwen3_6.frontend import Qwen36Frontend
    return Qwen36Frontend.from_resources(resources)


# ---- the plan of the start (start_plan.py) and the device's memory --------------------------------
def _plan(model: _Model, cfg: EngineConfig) -> StartPlan:
    """`plan_start` over this model's facts, its family's sizing and the device's memory."""
    budget, what = memory_budget(cfg.device)
    sizing = importlib.import_module(f"ninfer.targets.{model.package.family}.program.sizing")
    # NOTE: the sampleable vocabulary changes no size; the Engine sets it (the plan builds no Frontend).
    facts = ModelFacts(model.identity, model.package.dims, model.groups, sizing,
                       lambda c: _program_config(model.package_module, c, 0))
    return plan_start(facts, cfg, budget, what)


def _loaded_size(program_config: Any) -> Callable[[str, int], int]:
    """(tensor name, numel) -> its bytes once loaded by this Program (the family's sizing)."""
    from ninfer.targets.qwen3_6.program import sizing
    dtype = program_config.torch_dtype
    return lambda name, numel: sizing.loaded_bytes(dtype, name, numel)


def memory_budget(device: str) -> tuple[int, str]:
    """(bytes, whose) the memory check compares with: NINFER_MEMORY_BUDGET when set, else on CUDA the free
    device memory, on the CPU the host's available memory."""
    override = budget_override()
    if override is not None:
        return override, f"({BUDGET_ENV})"
    if device.startswith("cuda"):
        import torch
        return int(torch.cuda.mem_get_info(torch.device(device))[0]), f"free on {device}"
    return host_available_bytes(), "of available host memory"


# ---- EngineConfig -> the package's ProgramConfig and the context cache's CacheConfig -------------
# NOTE: EngineConfig validated every user-facing value; these only derive the Program's fixed resources.
def _num_slots(cfg: EngineConfig) -> int:
    """One StateImage slot per lane; with the context cache one more per lane (its publication
    slot, held from activation) and the slots of inactive checkpoints."""
    if not cfg.prefix_cache:
        return cfg.max_concurrency
    return 2 * cfg.max_concurrency + cfg.num_cache_slots


# NOTE: the Program's provisional depth for the Engine's control units (a forced suffix of one row; the
#       Qwen3.6 frontend forces 3 tokens) and the bound on its decode rounds' steps per row.
PROGRAM_MAX_STEPS = 8


def _num_scratch(cfg: EngineConfig) -> int:
    """Scratch entries of the Engine's open batch (it consumes each unit's PendingBatch before the next):
    a decode round's DECODE_STEPS per row (a speculative round's K+1 produced positions per row), a
    control unit's forced suffix (one row, up to PROGRAM_MAX_STEPS), a final prefill stage's one. The
    Program adds what its own graphs hold (`ninfer.targets.qwen3_6.program.sizing.num_scratch`).
    Program's default, max_batch x max_steps, would hold PROGRAM_MAX_STEPS entries per lane, taken from
    the KV budget (a large model's entry is tens of MiB: docs/performance.md, "Decision log")."""
    per_row = DECODE_STEPS if cfg.speculative is None else cfg.speculative.num_speculative_tokens + 1
    return max(cfg.max_concurrency * per_row, PROGRAM_MAX_STEPS)


def _max_steps(cfg: EngineConfig) -> int:
    """The Program's bound on the tokens one unit produces per row: a control unit's forced suffix, a
    speculative round's K+1."""
    spec = cfg.speculative
    return PROGRAM_MAX_STEPS if spec is None else max(PROGRAM_MAX_STEPS, spec.num_speculative_tokens + 1)


def _cache_config(cfg: EngineConfig) -> CacheConfig:
    return CacheConfig(enabled=cfg.prefix_cache, device_bytes=cfg.cache_device_bytes, host_bytes=cfg.cache_host_bytes,
                       capture_stride=cfg.cache_capture_stride)


def _program_config(package_module: Any, cfg: EngineConfig, sampleable_vocab_size: int) -> Any:
    program_config_cls = getattr(package_module, "ProgramConfig", None)
    if program_config_cls is None:
        from ninfer.targets.qwen3_6.program.config import ProgramConfig as program_config_cls
    if not cfg.max_model_len:       # NOTE: auto is decided by `_plan`; alone, the longest EngineConfig allows
        cfg = dataclasses.replace(cfg, max_model_len=MAX_MODEL_LEN)
    # NOTE: num_pages == 0 sizes the pool for every lane at full length (each Active request holds its
    # complete growth reservation, so this is the most max_concurrency requests can ever need).
    if cfg.purpose is Purpose.CAUSAL_SCORING:
        # NOTE: scoring uses only its own window staging; the Generation pools are left at their minimum.
        return program_config_cls(device=cfg.device, dtype=cfg.dtype, page_size=cfg.page_size, num_pages=1,
                                  num_slots=1, max_model_len=cfg.max_model_len, max_batch=1, max_steps=1,
                                  purpose="causal_scoring", scoring_window=cfg.max_model_len)
    num_pages = cfg.num_pages or cfg.max_concurrency * math.ceil(cfg.max_model_len / cfg.page_size)
    spec = cfg.speculative
    speculative = {} if spec is None else dict(speculative_method=spec.method,
                                               num_speculative_tokens=spec.num_speculative_tokens,
                                               force_accept_len=spec.force_accept_len,
                                               draft_vocab_size=spec.draft_vocab_size)
    return program_config_cls(device=cfg.device, dtype=cfg.dtype, page_size=cfg.page_size, num_pages=num_pages,
                              num_slots=_num_slots(cfg), num_scratch=_num_scratch(cfg), max_model_len=cfg.max_model_len,
                              max_batch=cfg.max_concurrency, max_steps=_max_steps(cfg), **speculative,
                              sampleable_vocab_size=sampleable_vocab_size,
                              enforce_eager=cfg.enforce_eager, decode_step_ahead=cfg.decode_step_ahead, seed=cfg.seed,
                              kv_memory_fraction=0.0 if cfg.num_pages else cfg.kv_memory_fraction)

