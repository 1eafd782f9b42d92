"""Read-only HBM bandwidth of the card: what a decode GEMV (a weight stream: every byte read once,
almost nothing written) can reach at best. The copy ceiling of performance.md counts read + write;
a pure read may run faster or slower than it, so the decode floor should be taken against this.

Per size (bf16 buffers, L2 flushed by do_bench before every rep; median):
    torch.sum                                     the framework's reduction
    triton stream  BLOCK x ITERS per program      16-byte loads, fp32 partial sums, one store per program
    F.linear (cuBLAS) and the Triton GEMV (ninfer.ops.triton.gemv) at M=1 on [N, 5120] = the same bytes,
                                                  for the gap between a weight stream and a pure read

    PYTHONPATH=$PWD python3 bench/read_bw.py [--mb 50 180 2048]       (needs CUDA and Triton)
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def _stream_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in tl.static_range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_first").to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


def stream(x: torch.Tensor, out: torch.Tensor, block: int, iters: int, warps: int) -> None:
    n = x.numel()
    _stream_kernel[(triton.cdiv(n, block * iters),)](x, out, n, BLOCK=block, ITERS=iters, num_warps=warps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", nargs="+", type=float, default=[50, 180, 356, 2048])
    a = ap.parse_args(argv)
    from ninfer.ops.triton import gemv
    rows = []
    for mb in a.mb:
        n = int(mb * 1e6) // 2 // 5120 * 5120
        x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(triton.cdiv(n, 1024), device="cuda", dtype=torch.float32)
        ref = x.float().sum().item()
        tb = n * 2 / 1e12                     # TB read; TB / (ms * 1e-3) = TB/s
        row = {"MB": round(n * 2 / 1e6, 1)}
        row["torch.sum"] = tb / (do_bench(lambda: x.sum(), warmup=10, rep=60, return_mode="median") * 1e-3)
        best = (0.0, None)
        for block, iters, warps in ((1024, 4, 4), (2048, 4, 4), (2048, 8, 8), (4096, 4, 8), (4096, 8, 8),
                                    (8192, 2, 8), (1024, 16, 4)):
            stream(x, out, block, iters, warps)
            s = out[:triton.cdiv(n, block * iters)].sum().item()
            assert abs(s - ref) <= 1e-3 * (abs(ref) + n ** 0.5), (s, ref)
            rate = tb / (do_bench(lambda: stream(x, out, block, iters, warps), warmup=10, rep=60,
                                  return_mode="median") * 1e-3)
            if rate > best[0]:
                best = (rate, (block, iters, warps))
        row["triton stream"], row["stream config"] = best
        K = 5120
        w = x.view(n // K, K)
        v = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        row["F.linear M=1"] = tb / (do_bench(lambda: torch.nn.functional.linear(v, w), warmup=10, rep=60,
                                             return_mode="median") * 1e-3)
        row["gemv M=1"] = tb / (do_bench(lambda: gemv.gemv(v, w), warmup=10, rep=60, return_mode="median") * 1e-3)
        rows.append(row)
        print(f"{row['MB']:8.1f} MB  torch.sum {row['torch.sum']:.3f} TB/s  triton stream {best[0]:.3f} TB/s "
              f"{best[1]}  [{n // K} x {K}] M=1: F.linear {row['F.linear M=1']:.3f}, gemv {row['gemv M=1']:.3f} TB/s",
              flush=True)
        del x, out, w
        torch.cuda.empty_cache()
    print("JSON " + json.dumps({"bench": "read_bw", "gpu": torch.cuda.get_device_name(), "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
