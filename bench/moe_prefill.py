"""The MoE prefill's kernels at the real sizes, swept over their tiles: the expert sort, the grouped
gate|up and down GEMMs (`ninfer.ops.triton.moe`), and the [shared gate | shared up | gate | router] GEMM
with its row count as stored and padded to a multiple of 8 (CUDA events, `triton.testing.do_bench`).

    PYTHONPATH=$PWD python3 bench/moe_prefill.py [--identity qwen3_6-35b-a3b] [--tokens 1024 8192] [--quick]

Per token count T (P = T x k pairs): every candidate's time and TFLOP/s against the committed tiles
(`prefill_tiles`), with a correctness gate: the routed output of a candidate against the committed
tiles' (rel. RMS < 1e-2; a different K blocking only reorders the fp32 sum). The byte floor is the
expert weights each kernel must read once (all experts at these sizes) at the copy rate; the FLOP
floor is at the sustained 8192^3 matmul rate measured in the same run. Prints tables and one JSON line; exits 0
without CUDA.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ninfer.bench.common import bench_ms, env_record, json_line, measure_ceilings, print_table  # noqa: E402

# (BN, BK, warps, stages) candidates of each grouped GEMM, per BM
GATE_UP = {64: [(64, 64, 4, 3), (64, 64, 4, 4), (64, 64, 8, 3), (128, 64, 4, 3), (128, 64, 8, 3), (64, 128, 4, 3),
                (128, 64, 8, 4), (64, 32, 4, 5)],
           128: [(64, 64, 8, 3), (64, 64, 8, 4), (128, 64, 8, 3), (128, 64, 8, 4), (64, 128, 8, 3), (128, 32, 8, 5),
                 (64, 64, 4, 3), (128, 64, 4, 3)]}
DOWN = {64: [(128, 64, 4, 3), (128, 64, 4, 4), (128, 64, 8, 3), (64, 64, 4, 3), (256, 64, 8, 3), (128, 128, 4, 3),
             (128, 128, 8, 2), (256, 64, 8, 4)],
        128: [(128, 64, 8, 3), (128, 64, 8, 4), (256, 64, 8, 3), (256, 64, 8, 4), (128, 128, 8, 3), (128, 32, 8, 5),
              (64, 64, 4, 3), (256, 128, 8, 2)]}
SORT = [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 16)]


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30))


def _sweep(name, cands, tiles_of, run, routed, ref, flops, floor_ms, BM, rec) -> None:
    """Time run(tiles) for each (BN, BK, warps, stages) candidate; gate: routed(run(tiles)) against ref.
    Prints one table; appends one record per candidate that compiled."""
    rows = []
    for bn, bk, wp, st in cands:
        c = tiles_of(bn, bk, wp, st)
        try:
            err = rel_rms(routed(run(c)), ref)
            ms = bench_ms(lambda: run(c), 25, 150)
        except Exception as e:  # noqa: BLE001 - a config that does not compile (shared memory) is a row
            rows.append([BM, bn, bk, wp, st, "-", "-", "-", f"{type(e).__name__}"])
            continue
        ok = err < 1e-2
        rows.append([BM, bn, bk, wp, st, f"{ms:.3f}", f"{flops / ms / 1e9:.0f}", f"{floor_ms / ms:.2f}",
                     f"{err:.1e}" + ("" if ok else " FAIL")])
        rec.append(dict(BM=BM, BN=bn, BK=bk, warps=wp, stages=st, ms=ms, err=err, ok=ok))
    print_table(["BM", "BN", "BK", "warps", "stages", f"{name} ms", "TFLOP/s", "floor/ms", "rel err"], rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--identity", default="qwen3_6-35b-a3b")
    ap.add_argument("--tokens", nargs="+", type=int, default=[1024, 8192])
    ap.add_argument("--quick", action="store_true", help="the committed tiles and the first two candidates only")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("moe_prefill: no CUDA device; nothing measured")
        return 0
    from ninfer.ops.triton import moe as fm
    from ninfer.targets.registry import lookup

    d = lookup(args.identity).dims
    if not d.is_moe:
        print(f"moe_prefill: {args.identity} has no MoE layers")
        return 2
    print(env_record(), flush=True)
    ceil = measure_ceilings("cuda")
    bw, mm = ceil["copy_TBps"] * 1e12, ceil["matmul_sustained_TFLOPs"] * 1e12
    E, H, I, k, Is = d.num_experts, d.hidden_size, d.moe_intermediate_size, d.num_experts_per_tok, \
        d.shared_expert_intermediate_size
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    gate_up = (torch.randn(E, 2 * I, H, device="cuda", generator=g) * 0.02).to(dt)
    down = (torch.randn(E, H, I, device="cuda", generator=g) * 0.02).to(dt)
    shared_rows = 2 * Is + 1 + E
    result: dict = {"identity": args.identity, "ceilings": ceil, "tokens": {}}
    for T in args.tokens:
        P = T * k
        x = torch.randn(T, H, device="cuda", generator=g).to(dt)
        logits = torch.randn(T, E, device="cuda", generator=g).to(dt)
        r = fm.route_topk(logits, k)
        ids, w = r.ids.contiguous(), r.weights.contiguous()
        base = fm.prefill_tiles(P, E)
        ref = fm._prefill_routed(x, ids, w, gate_up, down, base)
        gu_flops, dn_flops = 2.0 * P * H * 2 * I, 2.0 * P * I * H
        gu_floor = max(gate_up.numel() * 2 / bw, gu_flops / mm) * 1e3
        dn_floor = max(down.numel() * 2 / bw, dn_flops / mm) * 1e3
        print(f"\nT={T} P={P}: committed tiles {base}; floors gate|up {gu_floor:.3f} ms, down {dn_floor:.3f} ms",
              flush=True)
        rec = {"committed": base._asdict(), "gate_up": [], "down": [], "sort": []}
        for BM in sorted(GATE_UP):
            tiles0 = base._replace(BM=BM)
            srt = fm.sort_pairs(ids, w, E, BM, chunk=base.sort_chunk, warps=base.sort_warps)
            starts, table, order, tok, sw = srt
            cands = GATE_UP[BM][:2] if args.quick else GATE_UP[BM]
            down0 = base._replace(BM=BM)
            _sweep("gate|up", cands, lambda bn, bk, wp, st: tiles0._replace(BN1=bn, BK1=bk, warps1=wp, stages1=st),
                   lambda c: fm.grouped_gate_up(x, tok, table, starts, gate_up, c),
                   lambda act: fm.grouped_down(act, order, sw, table, starts, down, down0), ref,
                   gu_flops, gu_floor, BM, rec["gate_up"])
            act = fm.grouped_gate_up(x, tok, table, starts, gate_up, base._replace(BM=BM))
            cands = DOWN[BM][:2] if args.quick else DOWN[BM]
            _sweep("down", cands, lambda bn, bk, wp, st: tiles0._replace(BN2=bn, BK2=bk, warps2=wp, stages2=st),
                   lambda c: fm.grouped_down(act, order, sw, table, starts, down, c), lambda y: y, ref,
                   dn_flops, dn_floor, BM, rec["down"])
            rows = []
            # the one-launch scan at each (chunk, warps), then the chunked sort ("chunked"; what sort_pairs runs
            # from fm.CHUNKED_SORT_MIN_PAIRS pairs), each against the committed choice's result
            for ch, wp in [*(SORT[:2] if args.quick else SORT), ("chunked", "-")]:
                chunked = ch == "chunked"
                kw = dict(chunked=True) if chunked else dict(chunk=ch, warps=wp, chunked=False)
                got = fm.sort_pairs(ids, w, E, BM, **kw)
                same = all(torch.equal(a, b) for a, b in zip(got, srt))
                ms = bench_ms(lambda: fm.sort_pairs(ids, w, E, BM, **kw), 25, 150)
                rows.append([BM, ch, wp, f"{ms * 1e3:.1f}", "equal" if same else "DIFFERS"])
                rec["sort"].append(dict(BM=BM, chunk=ch, warps=wp, us=ms * 1e3, equal=same))
            print_table(["BM", "sort chunk", "warps", "sort us", "vs committed"], rows)
        rows = []
        for n in (shared_rows, -(-shared_rows // 8) * 8, -(-shared_rows // 64) * 64):
            W = (torch.randn(n, H, device="cuda", generator=g) * 0.02).to(dt)
            ms = bench_ms(lambda: F.linear(x, W), 25, 150)
            rows.append([n, f"{ms * 1e3:.1f}", f"{2.0 * T * n * H / ms / 1e9:.0f}"])
            rec.setdefault("shared_in", []).append(dict(rows=n, us=ms * 1e3))
        print_table(["shared_in rows", "F.linear us", "TFLOP/s"], rows)
        result["tokens"][T] = rec
    json_line("moe_prefill", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
