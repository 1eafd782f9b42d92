"""MoE decode layer bench and tuner (35B-A3B shapes, bf16) of the decode expert kernels' tiles.

    PYTHONPATH=$PWD python3 bench/moe_decode.py [--layers 40] [--sweep [--write | --out FILE]]   (about a minute)
    NINFER_PDL=0 PYTHONPATH=$PWD python3 bench/moe_decode.py ...                                  without PDL
    python3 bench/moe_decode.py --dry-run                       the shapes, the sweep and the table entry (no GPU)

One MoE layer step at decode, T = 1, 2, 4, 8 tokens:

    y   = ops.fast linear(x, shared_in)                     [T, 1288] (shared gate|up, shared gate, router, 7 zero rows)
    new = route_moe_experts(x, y[:, 1025:], 8, ...)                 the default: 2 launches (routing in the
                                                                     first) for 1 token; from ROUTE_APART_TOKENS
                                                                     the same path as split
    fixed = moe_experts(x, <routing computed before the capture>)    the 2 expert kernels reading ids: what
                                                                     routing elsewhere could save at most
    split = moe_experts(x, route_topk(y[:, 1025:], 8), ...)         3 launches: the routing kernel, then those

Each variant is captured in one CUDA graph of `--layers` copies of the layer, every copy with its own
weights (E=256 experts: gate_up [256, 1024, 2048], down [256, 2048, 512], shared_in [1281 + 7 zero rows, 2048],
shared down [2048, 512]; 1.5 GiB per layer, 60 GiB for 40), so no weight stays in L2; the graph is
replayed and timed with CUDA events: us per layer. "gemv" is the same graph with the shared_in GEMV
only, so expert time = layer - gemv. Floor: the bytes a layer reads (shared_in, the distinct selected
experts of this routing, the shared down) at 4.3 TB/s. err: relative RMS of fixed and split vs new over
all layers' outputs. --sweep also times alternative `DecodeConfig`s (one knob set at a time, or
--configs) on the --paths variants and reports the best; with --write it updates this device kind's entry
of the tuning table ninfer/ops/configs/moe_decode.json (--out FILE: of that table file; --kind: another
entry, e.g. default): one_token = the best tiles of "new" at T=1, many_tokens = the tiles of "new" with the
least total time over the swept T >= many_from (the sweep must include T=1 and such a T).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

E, K, H, I, IS = 256, 8, 2048, 512, 512
NS = 2 * IS + 1 + E                        # shared_in rows
NS_PAD = -(-NS // 8) * 8                   # stored with zero rows up to a multiple of 8, as model_view does
R = slice(2 * IS + 1, 2 * IS + 1 + E)      # its router rows
TBS = 4.3e12
SWEEP = [  # (up_bn, up_bk, up_warps, down_bn, down_bk, down_warps), the default first
    None, (1, 256, 2, 2, 512, 4), (1, 512, 4, 2, 512, 4), (1, 512, 8, 2, 512, 4), (1, 1024, 8, 2, 512, 4),
    (2, 512, 4, 2, 512, 4), (2, 1024, 8, 2, 512, 4), (1, 2048, 8, 2, 512, 4), (2, 256, 4, 2, 512, 4),
    (4, 256, 8, 2, 512, 4), (1, 1024, 4, 1, 512, 2), (1, 1024, 4, 4, 512, 4), (1, 1024, 4, 4, 512, 8),
    (1, 1024, 4, 8, 512, 16),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--tokens", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=20, help="graph replays timed per variant")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--configs", default=None,
                    help="the sweep's DecodeConfigs instead of SWEEP: ';'-separated comma lists of 6 fields")
    ap.add_argument("--pad", type=int, default=0,
                    help="elements between consecutive experts' weight blocks (0: contiguous, as the model "
                         "stores them)")
    ap.add_argument("--paths", default="new", help="the variants each sweep config is timed on: new,split,fixed")
    ap.add_argument("--write", action="store_true",
                    help="with --sweep: update this device kind's entry of ninfer/ops/configs/moe_decode.json")
    ap.add_argument("--out", default=None, help="the tuning-table file to update instead (implies --write)")
    ap.add_argument("--kind", default=None, help="the table entry to update (default: this device's kind)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the table entry; no GPU needed")
    args = ap.parse_args(argv)
    configs = ([tuple(int(v) for v in c.split(",")) for c in args.configs.split(";") if c] if args.configs
               else SWEEP[1:])
    if any(len(c) != 6 for c in configs):
        ap.error("--configs: each DecodeConfig has 6 fields (up_bn, up_bk, up_warps, down_bn, down_bk, down_warps)")
    if (args.write or args.out) and not args.sweep:
        ap.error("--write / --out need --sweep")
    if args.dry_run:
        return dry_run(args, configs)
    if not torch.cuda.is_available():
        print("bench/moe_decode.py: CUDA is not available; this bench needs an NVIDIA GPU (nothing measured).")
        return 2
    from ninfer.bench.common import env_record, json_line, print_table
    from ninfer.ops.reference.moe import SharedExpert
    from ninfer.ops.triton import gemv, pdl
    from ninfer.ops.triton import moe as fm
    from ninfer.ops.triton import moe_decode as md

    t_start = time.time()
    dev, dt, L = torch.device("cuda"), torch.bfloat16, args.layers
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, scale):
        return (torch.randn(*shape, generator=g, device=dev, dtype=dt) * scale)

    def experts(rows, cols, scale):
        """[E, rows, cols] with each expert's block args.pad elements apart (a stride that is not a power of two)."""
        flat = rnd(E, rows * cols + args.pad, scale=scale)
        return flat[:, :rows * cols].view(E, rows, cols)

    layers = [dict(gu=experts(2 * I, H, H ** -0.5), dn=experts(H, I, I ** -0.5),
                   si=torch.cat([rnd(2 * IS + 1, H, scale=H ** -0.5), rnd(E, H, scale=3 * H ** -0.5),
                                 torch.zeros(NS_PAD - NS, H, device=dev, dtype=dt)]),
                   sd=rnd(H, IS, scale=IS ** -0.5)) for _ in range(L)]
    torch.cuda.synchronize()
    t_alloc = time.time() - t_start

    def layer_fn(variant, x, w, cfg=None):
        y = gemv.linear(x, w["si"])
        if variant == "gemv":
            return y
        shared = SharedExpert(y[:, :2 * IS], y[:, 2 * IS:2 * IS + 1], w["sd"])
        if variant == "fixed":
            return fm.moe_experts(x, w["routing"], w["gu"], w["dn"], shared=shared, config=cfg)
        if variant == "split":
            return fm.moe_experts(x, fm.route_topk(y[:, R], K), w["gu"], w["dn"], shared=shared, config=cfg)
        return fm.route_moe_experts(x, y[:, R], K, w["gu"], w["dn"], shared=shared, config=cfg)

    def timed(variant, x, cfg=None):
        """(us per layer, outputs of the last replay)."""
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for w in layers[:2]:
                layer_fn(variant, x, w, cfg)                 # compile / counters outside the capture
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = [layer_fn(variant, x, w, cfg) for w in layers]
        graph.replay()
        torch.cuda.synchronize()
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(args.reps):
            t0.record()
            graph.replay()
            t1.record()
            t1.synchronize()
            times.append(t0.elapsed_time(t1) * 1e3 / L)
        times.sort()
        del graph
        return times[len(times) // 2], outs

    def floor_us():
        """Needs each layer's routing of this x (w["routing"])."""
        n = 0
        for w in layers:
            n += torch.unique(w["routing"].ids).numel()
        distinct = n / L
        nbytes = 2 * (NS * H + distinct * 3 * I * H + H * IS)
        return nbytes / TBS * 1e6, distinct

    rows, results = [], []
    for T in [int(t) for t in args.tokens.split(",")]:
        x = torch.randn(T, H, generator=g, device=dev, dtype=dt)
        for w in layers:
            w["routing"] = fm.route_topk(gemv.linear(x, w["si"])[:, R], K)
        fl, distinct = floor_us()
        t_gemv, _ = timed("gemv", x)
        t_new, o_new = timed("new", x)
        t_fixed, o_fixed = timed("fixed", x)
        t_split, o_split = timed("split", x)
        b = torch.stack(o_new).double()
        finite = bool(torch.isfinite(b).all())
        best = None
        if args.sweep:
            sweep = []
            for c in configs:
                cfg = md.DecodeConfig(*c)
                for path in args.paths.split(","):
                    tc, oc = timed(path, x, cfg)
                    ec = ((torch.stack(oc).double() - b).norm() / b.norm()).item()
                    sweep.append({"config": list(cfg), "path": path, "us": tc, "err": ec})
            sweep.append({"config": list(md.decode_config(T)), "path": "new", "us": t_new, "err": 0.0})
            best = min(sweep, key=lambda r: r["us"])
            for r in sweep:
                print(f"  T={T} config {r['config']} {r['path']}: {r['us']:.2f} us/layer, err {r['err']:.2e}")
        err_alt = max(((torch.stack(o).double() - b).norm() / b.norm()).item() for o in (o_fixed, o_split))
        rows.append([T, round(distinct, 1), t_gemv, t_new, t_fixed, t_split, t_new - t_gemv, t_fixed - t_gemv, fl,
                     t_new / fl, err_alt, finite])
        results.append({"T": T, "distinct_experts": distinct, "gemv_us": t_gemv, "new_us": t_new,
                        "new_experts_us": t_new - t_gemv, "fixed_us": t_fixed, "fixed_experts_us": t_fixed - t_gemv,
                        "split_us": t_split, "err_fixed_split_rel_rms": err_alt, "floor_us": fl, "finite": finite,
                        "best": best, "sweep": sweep if args.sweep else None, "config": list(md.decode_config(T))})
    table = md.decode_table()
    print(f"\nMoE decode layer, 35B-A3B shapes, bf16, {L} layers per graph, PDL={'on' if pdl.enabled() else 'off'}, "
          f"new = the table's tiles (T=1 {tuple(table.one_token)}, from {table.many_from} "
          f"{tuple(table.many_tokens)}); us per layer (median of {args.reps} replays)")
    print_table(["T", "experts", "gemv", "new", "fixed", "split", "new-gemv", "fixed-gemv", "floor", "new/floor",
                 "err", "finite"], rows)
    payload = {"dtype": "bf16", "model": "35B-A3B MoE layer (E=256, k=8, H=2048, I=512, Is=512)", "layers": L,
               "pad": args.pad, "pdl": pdl.enabled(), "table": table_dict(table._asdict()), "floor_tbs": TBS / 1e12,
               "results": results, "env": env_record(), "alloc_s": round(t_alloc, 1),
               "wall_s": round(time.time() - t_start, 1)}
    if args.sweep and (args.write or args.out):
        payload["written"] = write_table(args, results)
        print(f"wrote {payload['written']}")
    json_line("moe_decode", payload)
    return 0


FIELDS = ("up_bn", "up_bk", "up_warps", "down_bn", "down_bk", "down_warps")


def table_dict(t: dict) -> dict:
    """A DecodeTable's fields as a moe_decode.json entry."""
    return {"one_token": dict(zip(FIELDS, t["one_token"])), "many_tokens": dict(zip(FIELDS, t["many_tokens"])),
            "many_from": int(t["many_from"])}


def table_entry(base: dict, results: list[dict]) -> dict:
    """`base` with one_token = the fastest "new" tiles at T=1 and many_tokens = the "new" tiles with the least
    total time over the swept T >= base's many_from (each kept from base when not swept)."""
    entry = {**base}
    many_from = int(base["many_from"])

    def new_rows(r):
        return [s for s in r.get("sweep") or [] if s["path"] == "new"]
    one = [r for r in results if r["T"] < many_from and new_rows(r)]
    if one:
        entry["one_token"] = dict(zip(FIELDS, min(new_rows(one[0]), key=lambda s: s["us"])["config"]))
    many = [r for r in results if r["T"] >= many_from and new_rows(r)]
    if many:
        totals: dict[tuple, float] = {}
        for r in many:
            for s in new_rows(r):
                totals[tuple(s["config"])] = totals.get(tuple(s["config"]), 0.0) + s["us"]
        counts = {c: sum(1 for r in many for s in new_rows(r) if tuple(s["config"]) == c) for c in totals}
        full = [c for c in totals if counts[c] == len(many)]
        entry["many_tokens"] = dict(zip(FIELDS, min(full, key=lambda c: totals[c])))
    return entry


def write_table(args, results: list[dict]) -> str:
    """Update the --kind entry of the table file (--out, or the package's moe_decode.json)."""
    from ninfer.ops import tuning
    from ninfer.ops.triton.moe_decode import parse_table
    path = args.out or str(tuning.table_path("moe_decode"))
    kind = args.kind or tuning.device_kind()
    try:
        data = tuning.read_table_file(path)
    except ValueError:
        data = tuning.read_table_file(tuning.table_path("moe_decode"))
    entry = table_entry(data.get(kind, data["default"]), results)
    parse_table(entry)                                               # refuse to write what would not load
    if not os.path.exists(path):
        tuning.write_entry(path, "default", data["default"])
    tuning.write_entry(path, kind, entry)
    return f"{path} [{kind}]"


def dry_run(args, configs) -> int:
    """The plan without a GPU: shapes, tokens, the sweep's configs and the table entry in effect."""
    from ninfer.ops import tuning
    kind = args.kind or tuning.device_kind()
    entry = tuning.load_entry("moe_decode", kind, path=args.out)
    gib = L_BYTES / 2 ** 30
    print(f"35B-A3B MoE layer: E={E} k={K} H={H} I={I} Is={IS}, shared_in {NS_PAD} x {H}; "
          f"{gib:.2f} GiB per layer, {gib * args.layers:.1f} GiB for {args.layers} layers")
    print(f"tokens {args.tokens}; sweep {'on' if args.sweep else 'off'}: {len(configs)} configs on {args.paths}")
    for c in configs:
        print(f"  {dict(zip(FIELDS, c))}")
    print(f"table entry [{kind}]: {json.dumps(entry, sort_keys=True)}")
    return 0


L_BYTES = 2 * (E * 3 * I * H + NS_PAD * H + H * IS)


if __name__ == "__main__":
    sys.exit(main())
