"""A prompt chunk's attention over its prefix (a long prompt's later prefill stages), three ways, 27B heads
(Hq 24, Hkv 4, D 256), bf16, one sequence:

    flash    what chunk_paged_attention runs now: SDPA with the lower-right causal mask (flash-attention)
    split    cuDNN twice: the chunk against the prefix's keys (no mask) and against its own keys (causal),
             merged by their log-sum-exps (`torch.ops.aten._scaled_dot_product_cudnn_attention`)
    padded   cuDNN once, causal over the whole context, the prefix's query rows zero (wasted work)

Prints ms per call (CUDA events, median of --reps after 2 untimed; the first call's wall time apart) and each form's rel. RMS error against
an fp32 reference on a subsample of rows. Without CUDA it prints that nothing was measured.

    PYTHONPATH=$PWD python3 bench/prefix_attn_probe.py --cases 4096:8192 8192:16384 8192:32768
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def _flash(q, k, v, scale):
    from torch.nn.attention.bias import causal_lower_right
    L, C = q.shape[2], k.shape[2]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(L, C), scale=scale, enable_gqa=True)


def _cudnn(q, k, v, scale, causal):
    out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)
    return out[0], out[1]


def _split(q, k, v, scale):
    L, C = q.shape[2], k.shape[2]
    P = C - L
    o2, l2 = _cudnn(q, k[:, :, P:], v[:, :, P:], scale, True)
    if P == 0:
        return o2
    o1, l1 = _cudnn(q, k[:, :, :P], v[:, :, :P], scale, False)
    l1, l2 = l1.reshape(q.shape[:3]).float(), l2.reshape(q.shape[:3]).float()
    m = torch.maximum(l1, l2)
    w1, w2 = torch.exp(l1 - m), torch.exp(l2 - m)
    s = w1 + w2
    return ((o1.float() * (w1 / s).unsqueeze(-1) + o2.float() * (w2 / s).unsqueeze(-1))).to(q.dtype)


def _split_rep(q, k, v, scale):
    """split with K / V repeated to the query heads (for a cuDNN build without GQA)."""
    rep = q.shape[1] // k.shape[1]
    return _split(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), scale)


def _padded(q, k, v, scale):
    L, C = q.shape[2], k.shape[2]
    qp = F.pad(q, (0, 0, C - L, 0))
    return F.scaled_dot_product_attention(qp, k, v, is_causal=True, scale=scale, enable_gqa=True)[:, :, C - L:]


def _reference(q, k, v, scale, rows):
    """fp32 attention of the given query rows (lower-right causal), GQA by repeat."""
    L, C = q.shape[2], k.shape[2]
    rep = q.shape[1] // k.shape[1]
    kk = k.float().repeat_interleave(rep, 1)
    vv = v.float().repeat_interleave(rep, 1)
    qq = q[:, :, rows].float()
    s = (qq @ kk.transpose(-1, -2)) * scale
    pos = torch.as_tensor(rows, device=q.device) + (C - L)
    s = s.masked_fill(torch.arange(C, device=q.device)[None, :] > pos[:, None], float("-inf"))
    return torch.softmax(s, -1) @ vv


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=["2048:8192", "4096:8192", "8192:16384", "8192:24576", "8192:32768"],
                    help="L:C = chunk tokens : context tokens (prefix + chunk)")
    ap.add_argument("--heads", default="24:4:256", help="Hq:Hkv:D")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--forms", nargs="+", default=["flash", "split", "splitrep", "padded"])
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("prefix_attn_probe: no CUDA device; nothing measured")
        return 0
    hq, hkv, d = (int(x) for x in a.heads.split(":"))
    scale = d ** -0.5
    fns = {"flash": _flash, "split": _split, "splitrep": _split_rep, "padded": _padded}
    g = torch.Generator(device="cuda").manual_seed(0)
    for case in a.cases:
        L, C = (int(x) for x in case.split(":"))
        q = torch.randn(1, hq, L, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(1, hkv, C, d, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(1, hkv, C, d, device="cuda", dtype=torch.bfloat16, generator=g)
        rows = sorted({0, 1, L // 3, L // 2, L - 2, L - 1} | set(range(0, L, max(1, L // 64))))
        ref = _reference(q, k, v, scale, rows)
        flops = 4 * hq * d * L * (C - L + (L + 1) / 2)
        line = [f"L {L:6d} C {C:6d}"]
        for f in a.forms:
            try:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                o = fns[f](q, k, v, scale)
                torch.cuda.synchronize()
                first = (time.perf_counter() - t0) * 1e3
                o = fns[f](q, k, v, scale)
                ts = []
                for _ in range(a.reps):
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    o = fns[f](q, k, v, scale)
                    e1.record()
                    torch.cuda.synchronize()
                    ts.append(e0.elapsed_time(e1))
                ms = statistics.median(ts)
                err = ((o[:, :, rows].float() - ref).norm() / ref.norm()).item()
                line.append(f"{f} {ms:7.3f} ms ({flops / ms / 1e9:5.0f} TFLOP/s, err {err:.1e}, first {first:.0f} ms)")
            except Exception as e:  # noqa: BLE001 - a probe: report the form's failure and go on
                line.append(f"{f} failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        print("  ".join(line), flush=True)
        del q, k, v
    return 0


if __name__ == "__main__":
    sys.exit(main())
