"""The prefill GEMMs of one long prompt, alone and in the model's order: where the GEMM time of the 27B
8k TTFT goes against the card's matmul rate (CUDA events; warm-up first).

    PYTHONPATH=$PWD python3 bench/prefill_gemms.py [--identity qwen3_6-27b] [--tokens 8192] [--seq-reps 3]

Per projection shape (M = tokens, weight [N, K] as the model stores it): TFLOP/s of F.linear (what the
fast OpSet runs at M > 8), of x @ W^T with W stored [K, N] ("nn"), and with N padded to a multiple of
256 where it is not one ("pad"). Then the whole model's GEMM sequence in layer order (one weight per
shape; compute bound, so distinct weights would not change the rate) timed end to end, against the sum
of the shapes' isolated times, with the SM clock and board power sampled through NVML while it runs.
The 8192^3 product before and after is the ceiling. Prints a table and one JSON line; exits 0 without
CUDA.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ninfer.bench.common import bench_ms, env_record, json_line, print_table  # noqa: E402


def _dims(identity: str):
    from ninfer.targets.registry import lookup
    return lookup(identity).dims


def shapes(identity: str) -> list[tuple[str, int, int, int]]:
    """(name, N, K, layers) of the dense projections of one prefill (MoE experts excluded)."""
    d = _dims(identity)
    H = d.hidden_size
    nk, nv = d.linear_num_key_heads, d.linear_num_value_heads
    dk, dv = d.linear_key_head_dim, d.linear_value_head_dim
    gdn_in = 2 * nk * dk + 2 * nv * dv + 2 * nv                 # [qkv | b | a | z]
    gdn_out = nv * dv
    attn_in = 2 * d.num_attention_heads * d.head_dim + 2 * d.num_key_value_heads * d.head_dim
    attn_out = d.num_attention_heads * d.head_dim
    n_gdn, n_attn = len(d.gdn_layers), len(d.attention_layers)
    out = [("gdn_in", gdn_in, H, n_gdn), ("gdn_out", H, gdn_out, n_gdn),
           ("attn_in", attn_in, H, n_attn), ("attn_out", H, attn_out, n_attn)]
    if not d.is_moe:
        out += [("gate_up", 2 * d.intermediate_size, H, d.num_hidden_layers),
                ("down", H, d.intermediate_size, d.num_hidden_layers)]
    return out


def tflops(M: int, N: int, K: int, ms: float) -> float:
    return 2.0 * M * N * K / (ms * 1e-3) / 1e12


class _Nvml:
    """SM clock (MHz) and power (W) sampled every 5 ms in a thread while `with` runs."""

    def __init__(self) -> None:
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nv, self._h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        except Exception:
            self._nv = None
        self.clocks: list[int] = []
        self.power: list[float] = []

    def __enter__(self):
        self._stop = threading.Event()
        if self._nv is not None:
            self._t = threading.Thread(target=self._run, daemon=True)
            self._t.start()
        return self

    def _run(self) -> None:
        nv = self._nv
        while not self._stop.is_set():
            self.clocks.append(nv.nvmlDeviceGetClockInfo(self._h, nv.NVML_CLOCK_SM))
            self.power.append(nv.nvmlDeviceGetPowerUsage(self._h) / 1e3)
            time.sleep(0.005)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._nv is not None:
            self._t.join()

    def summary(self) -> str:
        if not self.clocks:
            return "no NVML samples"
        return (f"SM clock MHz min/median/max {min(self.clocks)}/{statistics.median(self.clocks):.0f}/"
                f"{max(self.clocks)}, power W median/max {statistics.median(self.power):.0f}/{max(self.power):.0f}"
                f" ({len(self.clocks)} samples)")


def ceiling() -> float:
    A = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    B = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    return tflops(8192, 8192, 8192, bench_ms(lambda: A @ B))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--identity", default="qwen3_6-27b")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--seq-reps", type=int, default=3)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("prefill_gemms: no CUDA device; nothing measured")
        return 0
    print(env_record(), flush=True)
    M = args.tokens
    before = ceiling()
    print(f"matmul 8192^3 before: {before:.1f} TFLOP/s", flush=True)
    x = torch.randn(M, 17408, dtype=torch.bfloat16, device="cuda")
    rows, weights, iso = [], {}, {}
    for name, N, K, layers in shapes(args.identity):
        W = torch.randn(N, K, dtype=torch.bfloat16, device="cuda") * 0.02
        xs = x[:, :K].contiguous()
        weights[name] = (xs, W)
        ms = bench_ms(lambda: F.linear(xs, W), warmup_ms=50, rep_ms=200)
        Wt = W.t().contiguous()
        nn = bench_ms(lambda: xs @ Wt, warmup_ms=50, rep_ms=200)
        Np = -(-N // 256) * 256
        pad = "-"
        if Np != N:
            Wp = torch.cat([W, W.new_zeros(Np - N, K)])
            pad = f"{tflops(M, N, K, bench_ms(lambda: F.linear(xs, Wp), warmup_ms=50, rep_ms=200)):.0f}"
            del Wp
        iso[name] = ms
        rows.append([name, N, K, layers, f"{ms:.3f}", f"{tflops(M, N, K, ms):.0f}", f"{tflops(M, N, K, nn):.0f}", pad,
                     f"{ms * layers:.1f}"])
        del Wt
    print_table(["shape", "N", "K", "layers", "ms", "TFLOP/s", "nn", "pad", "ms x layers"], rows)
    iso_total = sum(iso[n] * layers for n, _, _, layers in shapes(args.identity))
    flops = sum(2.0 * M * N * K * layers for _, N, K, layers in shapes(args.identity))

    d = _dims(args.identity)
    order = []
    for li in range(d.num_hidden_layers):
        kind = "attn" if li in set(d.attention_layers) else "gdn"
        order += [f"{kind}_in", f"{kind}_out"]
        if "gate_up" in weights:
            order += ["gate_up", "down"]

    def sequence() -> None:
        for name in order:
            xs, W = weights[name]
            F.linear(xs, W)

    sequence()
    torch.cuda.synchronize()
    seq = []
    with _Nvml() as nv:
        for _ in range(args.seq_reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            sequence()
            e.record()
            e.synchronize()
            seq.append(s.elapsed_time(e))
    after = ceiling()
    seq_ms = statistics.median(seq)
    print(f"sequence of {len(order)} GEMMs: {' / '.join(f'{t:.1f}' for t in seq)} ms (median {seq_ms:.1f}, "
          f"{flops / (seq_ms * 1e-3) / 1e12:.0f} TFLOP/s) vs isolated sum {iso_total:.1f} ms "
          f"({flops / (iso_total * 1e-3) / 1e12:.0f} TFLOP/s); {nv.summary()}")
    print(f"matmul 8192^3 after: {after:.1f} TFLOP/s; the sequence at the 'before' rate would take "
          f"{flops / (before * 1e12) * 1e3:.1f} ms")
    json_line("prefill_gemms", {"identity": args.identity, "tokens": M, "before_TFLOPs": round(before, 1),
               "after_TFLOPs": round(after, 1), "sequence_ms": round(seq_ms, 2), "isolated_ms": round(iso_total, 2),
               "shapes": {r[0]: float(r[5]) for r in rows}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
