"""Shared pieces of the benchmarks (`ninfer bench ...` and the bench/*.py scripts): environment
record, ceilings re-measured in every run, floors from the dimension facts, timing, per-step
timeouts, table output, one JSON line and a JSON file under --out.

Ceilings are re-measured in every run (the machines are shared and vary): device-to-device copy
bandwidth (bytes read + written), a 52k x 5120 bf16 GEMV at batch 1, an 8192^3 bf16 matmul
(on the CPU: small fp32 sizes, only so the CPU runs of the benches have a floor to print).
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import torch

from ninfer.targets.qwen3_6.schema import active_matrix_params

# the reference ceilings of docs/performance.md (PyTorch), printed beside the ones measured in this run
DOC_COPY_TBS = 4.26
DOC_GEMV_TBS = 3.98
DOC_MATMUL_TFLOPS = 793.0


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def env_record() -> dict:
    # NOTE: NINFER_COMMIT, when set, names the tree: a copy of the work tree (e.g. on a remote machine) may
    #       carry a .git of another commit.
    commit, dirty = os.environ.get("NINFER_COMMIT", "") or "unknown", False
    if commit == "unknown":
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    timeout=10).stdout.strip() or "unknown"
            dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                        capture_output=True, text=True, timeout=10).stdout.strip())
        except Exception:
            commit, dirty = "unknown", False
    try:
        import triton
        tv = triton.__version__
    except Exception:
        tv = None
    try:
        from importlib.metadata import version
        fla = version("fla-core")
    except Exception:
        fla = None
    try:
        import transformers
        hf = transformers.__version__
    except Exception:
        hf = None
    return {"machine": platform.node(), "cpu_count": os.cpu_count(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "triton": tv, "fla_core": fla, "transformers": hf, "cuda": torch.version.cuda,
            "python": platform.python_version(), "commit": commit + ("+dirty" if dirty else "")}


def sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def bench_ms(fn: Callable[[], object], warmup_ms: int = 25, rep_ms: int = 100, device: str = "cuda") -> float:
    """Median time of fn in ms (CUDA: triton.testing.do_bench with CUDA events; CPU: wall clock)."""
    if str(device).startswith("cuda"):
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    fn()
    times = []
    t_end = time.perf_counter() + rep_ms / 1e3
    while len(times) < 3 or (time.perf_counter() < t_end and len(times) < 50):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def graph_replay_ms(graph, n: int = 30, skip: int = 5) -> float:
    """Median GPU time (CUDA events around each replay, synchronized) of a captured torch.cuda.CUDAGraph,
    over n replays after `skip` untimed ones."""
    ts = []
    for i in range(skip + n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        if i >= skip:
            ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def measure_ceilings(device: str = "cuda") -> dict:
    if not str(device).startswith("cuda"):
        a = torch.randn(1 << 24)
        b = torch.empty_like(a)
        ms = bench_ms(lambda: b.copy_(a), device="cpu")
        copy = 2 * a.numel() * 4 / (ms * 1e-3) / 1e12
        A, B = torch.randn(512, 512), torch.randn(512, 512)
        ms = bench_ms(lambda: A @ B, device="cpu")
        mm = 2 * 512 ** 3 / (ms * 1e-3) / 1e12
        return {"copy_TBps": round(copy, 4), "gemv_52kx5120_TBps": None, "matmul_8192_TFLOPs": round(mm, 4),
                "device": "cpu (fp32, small sizes)"}
    dev = device
    n = 1 << 30                                                        # 2 GiB of bf16
    a = torch.randn(n, dtype=torch.bfloat16, device=dev)
    b = torch.empty_like(a)
    ms = bench_ms(lambda: b.copy_(a))
    copy_tbs = 2 * a.numel() * 2 / (ms * 1e-3) / 1e12
    del a, b
    W = torch.randn(52 * 1024, 5120, dtype=torch.bfloat16, device=dev)
    x = torch.randn(1, 5120, dtype=torch.bfloat16, device=dev)
    ms = bench_ms(lambda: torch.nn.functional.linear(x, W))
    gemv_tbs = W.numel() * 2 / (ms * 1e-3) / 1e12
    del W
    A = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    B = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    ms = bench_ms(lambda: A @ B)
    mm = 2 * 8192 ** 3 / (ms * 1e-3) / 1e12
    sustained = _sustained_matmul_tflops(A, B)
    del A, B
    torch.cuda.empty_cache()
    return {"copy_TBps": round(copy_tbs, 3), "gemv_52kx5120_TBps": round(gemv_tbs, 3),
            "matmul_8192_TFLOPs": round(mm, 1), "matmul_sustained_TFLOPs": round(sustained, 1)}


def _sustained_matmul_tflops(A: torch.Tensor, B: torch.Tensor, n: int = 400) -> float:
    """The 8192^3 product's rate once the card has run it back to back (n products, the last half timed): a long
    prefill's GEMMs run at this rate, not at the burst rate of a short bench_ms, once the board's power limit
    holds the clocks down."""
    C = torch.empty(A.shape[0], B.shape[1], dtype=A.dtype, device=A.device)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(n):
        if i == n // 2:
            s.record()
        torch.mm(A, B, out=C)
    e.record()
    e.synchronize()
    return 2 * A.shape[0] * A.shape[1] * B.shape[1] * (n - n // 2) / (s.elapsed_time(e) * 1e-3) / 1e12


def measure_ceilings_apart(device: str = "cuda") -> dict:
    """`measure_ceilings` in a child process: the ceiling runs' large buffers stay out of this process, where
    an Engine is timed next."""
    import concurrent.futures
    import multiprocessing
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(measure_ceilings, device).result()


def print_ceilings(c: dict) -> None:
    gemv = f"{c['gemv_52kx5120_TBps']:.2f}" if c.get("gemv_52kx5120_TBps") is not None else "-"
    print(f"ceilings (this run): copy {c['copy_TBps']:.3g} TB/s (doc {DOC_COPY_TBS}), "
          f"GEMV 52kx5120 {gemv} TB/s (doc {DOC_GEMV_TBS}), "
          f"matmul 8192^3 {c['matmul_8192_TFLOPs']:.4g} TFLOP/s (doc {DOC_MATMUL_TFLOPS:.0f})"
          + (f", sustained {c['matmul_sustained_TFLOPs']:.4g}" if c.get("matmul_sustained_TFLOPs") else ""),
          flush=True)


def print_table(headers: list[str], rows: list[list]) -> None:
    def cell(v) -> str:
        if v is None:
            return "-"
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    cells = [[str(h) for h in headers]] + [[cell(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for j, r in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
        if j == 0:
            print("  ".join("-" * w for w in widths))
    sys.stdout.flush()


def start_run(measure) -> tuple[dict, dict]:
    """A bench's opening lines: the environment record and the ceilings `measure()` returns, both printed.
    Returns (env, ceilings)."""
    env = env_record()
    print(f"env: {env}", flush=True)
    ceil = measure()
    print_ceilings(ceil)
    return env, ceil


def print_prefill_rows(results: list[dict], peak: float) -> None:
    """The decode benches' prefill table: each prompt's first and median time against the GEMM floor at
    the matmul rate `peak` (FLOP/s)."""
    rows = [[r["identity"], r["ctx"], r["first_ms"], r["median_ms"], r["gemm_flops"] / peak * 1e3,
             r["median_ms"] / (r["gemm_flops"] / peak * 1e3)] for r in results if r["kind"] == "prefill"]
    print_table(["identity", "prompt", "prefill_first_ms", "prefill_median_ms", "floor_ms", "x_floor"], rows)


def json_line(name: str, payload: dict) -> None:
    print("JSON " + json.dumps({"bench": name, **payload}, sort_keys=True, default=str))
    sys.stdout.flush()


# ---------------------------------------------------------------------------------------------
# The transformers baseline's model (decode and prefill benches)
# ---------------------------------------------------------------------------------------------
def build_hf(model_cls, cfg, dtype: torch.dtype, device) -> torch.nn.Module:
    """transformers' `model_cls(cfg)` built directly on `device` in `dtype` (sdpa attention, eval mode)."""
    cfg._attn_implementation = "sdpa"
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return model_cls(cfg).eval()
    finally:
        torch.set_default_dtype(old)


def hf_model(identity: str, device: str):
    """Hugging Face `Qwen3_5(Moe)ForCausalLM` built from the identity's dims with HF's own random init,
    directly on the device, in the bench dtype (bf16 on CUDA, fp32 on the CPU), sdpa attention, eval mode.
    Returns (model, dims, dtype, transformers version). The 27B in bf16 is ~54 GB: build it only after
    the bench's own Program is freed."""
    import transformers as tf

    from ninfer.targets.registry import lookup
    from ninfer.testing.tiny_hf import hf_text_config_kwargs

    dims = lookup(identity).dims
    dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    cfg_cls = tf.Qwen3_5MoeTextConfig if dims.is_moe else tf.Qwen3_5TextConfig
    model_cls = tf.Qwen3_5MoeForCausalLM if dims.is_moe else tf.Qwen3_5ForCausalLM
    cfg = cfg_cls(**hf_text_config_kwargs(dims))
    t0 = time.perf_counter()
    model = build_hf(model_cls, cfg, dtype, device)
    sync(device)
    mem = torch.cuda.memory_allocated() / 2**30 if str(device).startswith("cuda") else 0.0
    print(f"[hf {identity}] transformers {tf.__version__} model built in {time.perf_counter() - t0:.1f} s; "
          f"GPU memory {mem:.1f} GiB", flush=True)
    return model, dims, dtype, tf.__version__


def free_model(device: str) -> None:
    """After a bench step that held a model returns (or fails): collect its frames and give the cached blocks
    back, since the next model needs the memory. The benches' `run` loops call it after every such step."""
    import gc
    gc.collect()
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Partial results and per-step timeouts (a device run must keep what it measured so far)
# ---------------------------------------------------------------------------------------------
class Recorder:
    """Collects result rows; rewrites `<out>/<name>.json` after every `add` (partial: true until
    `finish`), so a run killed by its outer timeout still leaves what it measured."""

    def __init__(self, name: str, out_dir: str | None, header: dict):
        self.name = name
        self.header = header
        self.results: list[dict] = []
        self.errors: list[str] = []
        self.path = None
        if out_dir:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            self.path = Path(out_dir) / f"{name}.json"
        self._write(partial=True)

    def add(self, rows: list[dict] | dict) -> None:
        self.results += [rows] if isinstance(rows, dict) else list(rows)
        self._write(partial=True)

    def error(self, message: str) -> None:
        print(f"[{self.name}] {message}", flush=True)
        self.errors.append(message)
        self._write(partial=True)

    def _payload(self, partial: bool) -> dict:
        return {**self.header, "partial": partial, "errors": self.errors, "results": self.results}

    def _write(self, partial: bool) -> None:
        if self.path is not None:
            tmp = self.path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps({"bench": self.name, **self._payload(partial)}, indent=1, sort_keys=True,
                                      default=str))
            os.replace(tmp, self.path)

    def finish(self) -> None:
        self._write(partial=False)
        json_line(self.name, self._payload(False))


class StepTimeout(Exception):
    pass


@contextlib.contextmanager
def step_timeout(seconds: float | None, what: str) -> Iterator[None]:
    """Raise StepTimeout in the main thread after `seconds` (SIGALRM; no-op elsewhere or for None/0).
    The exception arrives when the interpreter next runs Python code (after a blocking CUDA call)."""
    if not seconds or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def fire(signum, frame):
        raise StepTimeout(f"{what}: timed out after {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_step(rec: Recorder, seconds: float | None, what: str, fn: Callable[[], object]) -> object:
    """fn() under a step timeout; a timeout or failure is recorded and the bench goes on (returns None)."""
    try:
        with step_timeout(seconds, what):
            return fn()
    except StepTimeout as e:
        rec.error(str(e))
    except Exception as e:  # noqa: BLE001 - one failing step must not lose the others' results
        rec.error(f"{what}: failed: {type(e).__name__}: {e}")
    return None


# ---------------------------------------------------------------------------------------------
# Floors from the dimension facts (performance.md: decode bytes / bandwidth; prefill FLOPs / matmul rate)
# ---------------------------------------------------------------------------------------------
def _main_specs(dims):
    from ninfer.targets.qwen3_6.schema import REQUIRED_GROUPS, tensor_specs
    return [s for s in tensor_specs(dims) if s.group in REQUIRED_GROUPS]


def _numel(shape) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


def decode_weight_bytes(dims, batch: int, dtype_bytes: int = 2) -> int:
    """Weight bytes one decode step reads at `batch` rows: everything once, one embedding row per row,
    MoE experts the distinct ones `batch` rows can touch (at most min(E, k*B) per layer)."""
    total = 0
    for s in _main_specs(dims):
        n = _numel(s.shape)
        if s.name == "embed_tokens.weight":
            n = batch * dims.hidden_size
        elif ".mlp.experts." in s.name:
            n = n * min(dims.num_experts, dims.num_experts_per_tok * batch) // dims.num_experts
        total += n * dtype_bytes
    return total


def per_row_decode_bytes(dims, ctx: int, dtype_bytes: int = 2) -> int:
    """Per sequence and step: KV of its context, GDN recurrent + conv state read and written and
    copied slot -> provisional (read + write)."""
    kv = len(dims.attention_layers) * ctx * dims.num_key_value_heads * dims.head_dim * 2 * dtype_bytes
    rec = len(dims.gdn_layers) * dims.linear_num_value_heads * dims.linear_key_head_dim * dims.linear_value_head_dim * 4
    conv = len(dims.gdn_layers) * dims.conv_dim * (dims.linear_conv_kernel_dim - 1) * dtype_bytes
    return kv + 4 * (rec + conv)


def prefill_flops(dims, tokens: int) -> float:
    """2 x active params x tokens (lm_head only for the last token) + causal attention
    (QK^T and PV: 2 x 2 x T^2/2 x heads x head_dim per attention layer)."""
    lm_head = dims.vocab_size * dims.hidden_size
    gemm = 2.0 * (active_matrix_params(dims) - lm_head) * tokens + 2.0 * lm_head
    attn = len(dims.attention_layers) * 2.0 * tokens * tokens * dims.num_attention_heads * dims.head_dim
    return gemm + attn


def decode_floor_ms(dims, batch: int, ctx: int, copy_tbps: float, dtype_bytes: int = 2) -> float:
    nbytes = decode_weight_bytes(dims, batch, dtype_bytes) + batch * per_row_decode_bytes(dims, ctx, dtype_bytes)
    return nbytes / (copy_tbps * 1e12) * 1e3


def prefill_floor_ms(dims, tokens: int, matmul_tflops: float) -> float:
    return prefill_flops(dims, tokens) / (matmul_tflops * 1e12) * 1e3
