"""The prefill graphs' attention (`ninfer.ops.triton.attention.prefix_attention_rows`, Triton) against the eager
path's (`chunk_paged_attention`: paged gather + PyTorch SDPA) on the same stage, and a sweep of its tiles.

    python3 bench/prefix_attention.py [--shapes 16x2 24x4] [--cases 0:2048 20000:2000 7000:1000 100:20 ...]

Per head shape (Hq x Hkv, D 256, page 64, bf16) and case R:N (a stage of N real rows, padded to its prefill
bucket, over a prefix of R): the median of do_bench (ms) for each tile (block_t, block_n, num_warps,
num_stages) and for the eager op, with the attention FLOPs (4 x N x (R + N/2) x D x Hq) over the time.
Each tile's output is checked against the eager op's (rel. RMS < 1e-2) before it is timed.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import triton

from ninfer.bench.args import prefix_turn
from ninfer.ops.triton import attention as fa
from ninfer.targets.qwen3_6.program.prefill_graphs import BUCKETS

TILES = [(8, 32, 8, 2), (8, 64, 8, 2), (16, 32, 8, 2), (16, 64, 8, 2), (8, 32, 4, 2), (16, 32, 8, 3), (8, 64, 8, 3),
         (32, 32, 8, 2), (16, 64, 4, 2)]


def case(Hq, Hkv, R, N, D=256, page=64):
    Nb = next(b for b in BUCKETS if b >= N) if N <= BUCKETS[-1] else N
    g = torch.Generator(device="cuda").manual_seed(R + N)
    W = -(-(R + Nb) // page) + 1
    kc = torch.randn(W + 1, page, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    vc = torch.randn_like(kc)
    table = torch.stack([torch.randperm(W, device="cuda"), torch.full((W,), W, device="cuda")])
    q = torch.randn(Nb, Hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
    t = lambda x: torch.tensor([x], device="cuda")  # noqa: E731
    return q, kc, vc, table, t(R), t(N)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["16x2", "24x4"])
    ap.add_argument("--cases", nargs="+", type=prefix_turn,
                    default=[(1, 2047), (20000, 2000), (7000, 1000), (2000, 1000), (1000, 300), (100, 20), (30000, 8)])
    a = ap.parse_args(argv)
    rows = []
    for shape in a.shapes:
        Hq, Hkv = (int(x) for x in shape.split("x"))
        for R, N in a.cases:
            q, kc, vc, table, st, ln = case(Hq, Hkv, R, N)
            ctx = torch.tensor([R + N])
            eager = lambda: fa.chunk_paged_attention(q[:N], kc, vc, table[:1], ctx)  # noqa: E731
            want = eager()
            flops = 4 * N * (R + N / 2) * q.shape[-1] * Hq
            t_e = triton.testing.do_bench(eager, warmup=5, rep=40)
            line = {"shape": shape, "R": R, "N": N, "rows": q.shape[0], "eager_ms": t_e}
            best = None
            for tile in TILES:
                bt_, bn, nw, ns = tile
                f = lambda: fa.prefix_attention_rows(q, kc, vc, table, st, ln, block_t=bt_, block_n=bn,  # noqa: E731
                                                     num_warps=nw, num_stages=ns)
                try:
                    o = f()
                    err = ((o[:N].float() - want.float()).norm() / want.float().norm()).item()
                    if not err < 1e-2:
                        raise AssertionError(f"rel err {err:.3g}")
                    t = triton.testing.do_bench(f, warmup=5, rep=40)
                except Exception as exc:          # out of resources, a wrong tile
                    line[str(tile)] = f"failed: {type(exc).__name__}: {str(exc)[:80]}"
                    continue
                line[str(tile)] = t
                if best is None or t < best[1]:
                    best = (tile, t)
            rows.append(line)
            tiles = "  ".join(f"{k.replace(' ', '')} {v:.3f}" if isinstance(v, float) else f"{k.replace(' ', '')} X"
                              for k, v in line.items() if k.startswith("("))
            print(f"{shape} R {R:6d} N {N:5d}: eager {t_e:.3f} ms ({flops / t_e / 1e9:.0f} TFLOP/s)  best {best[0]} "
                  f"{best[1]:.3f} ms ({flops / best[1] / 1e9:.0f} TFLOP/s) | {tiles}", flush=True)
            for k, v in line.items():
                if isinstance(v, str) and v.startswith("failed"):
                    print(f"   {k}: {v}")
    print("JSON " + json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
