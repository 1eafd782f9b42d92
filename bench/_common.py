"""Shared helpers of the GPU benchmarks: environment record, ceilings, timing, table output.

Ceilings are re-measured in every run (the machines are shared and vary): device-to-device copy
bandwidth (bytes read + written), a 52k x 5120 bf16 GEMV at batch 1, an 8192^3 bf16 matmul.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from typing import Callable

import torch

# performance.md reference ceilings (H200, PyTorch)
DOC_COPY_TBS = 4.26
DOC_GEMV_TBS = 3.98
DOC_MATMUL_TFLOPS = 793.0


def env_record() -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or "unknown"
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                    text=True, timeout=10).stdout.strip())
    except Exception:
        commit, dirty = "unknown", False
    if commit == "unknown":                    # NOTE: the device copy of the tree has no .git
        commit, dirty = os.environ.get("NINFER_COMMIT", "unknown"), False
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
    return {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "triton": tv, "fla_core": fla, "cuda": torch.version.cuda,
            "python": platform.python_version(), "commit": commit + ("+dirty" if dirty else "")}


def bench_ms(fn: Callable[[], object], warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median time of fn in ms (CUDA events, through triton.testing.do_bench)."""
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def measure_ceilings() -> dict:
    dev = "cuda"
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
    del A, B
    torch.cuda.empty_cache()
    return {"copy_TBps": round(copy_tbs, 3), "gemv_52kx5120_TBps": round(gemv_tbs, 3),
            "matmul_8192_TFLOPs": round(mm, 1)}


def print_ceilings(c: dict) -> None:
    print(f"ceilings (this run): copy {c['copy_TBps']:.2f} TB/s (doc {DOC_COPY_TBS}), "
          f"GEMV 52kx5120 {c['gemv_52kx5120_TBps']:.2f} TB/s (doc {DOC_GEMV_TBS}), "
          f"matmul 8192^3 {c['matmul_8192_TFLOPs']:.0f} TFLOP/s (doc {DOC_MATMUL_TFLOPS:.0f})")


def print_table(headers: list[str], rows: list[list]) -> None:
    cells = [[str(h) for h in headers]] + [[f"{v:.4g}" if isinstance(v, float) else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for j, r in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
        if j == 0:
            print("  ".join("-" * w for w in widths))
    sys.stdout.flush()


def json_line(name: str, payload: dict) -> None:
    print("JSON " + json.dumps({"bench": name, **payload}, sort_keys=True))
    sys.stdout.flush()
