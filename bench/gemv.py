"""Decode GEMV bench: cuBLAS (F.linear) vs the Triton skinny GEMM (ninfer/ops/triton/gemv.py) at every
weight shape of one Qwen3.6 decode step (27B and 35B-A3B, from the dimension facts), M = 1, 2, 4, 8.

    PYTHONPATH=$PWD python3 bench/gemv.py [--write | --out FILE]          sweep (a few minutes)
    PYTHONPATH=$PWD python3 bench/gemv.py --graph [--write]               sweep, then the 27B step graph
    PYTHONPATH=$PWD python3 bench/gemv.py --graph --no-sweep [--configs TABLE]   graph only
    python3 bench/gemv.py --dry-run                                       shapes and sweep sizes (no GPU)
    TRITON_INTERPRET=1 python3 bench/gemv.py --device cpu --models '' --shapes 40x96 --m 1,3 --out /tmp/g.json

Sweep: per (N, K, M) the median device time (CUDA events, L2 flushed before every run) of F.linear
and of every config of `gemv.sweep_space`; a config counts only if its relative RMS error vs the
fp32 product is < 1e-2. Prints a table, the copy ceiling of this run and one JSON line (every result).
`--write` updates this device kind's entry of the tuning table ninfer/ops/configs/gemv.json (`--out FILE`:
of the table file FILE instead; `--kind` names another entry, e.g. default): each swept shape gets its
best config, is marked for the Triton kernel where that beats cuBLAS by >= --min-speedup (unmarked
otherwise), and, for MLP down shapes, marked `swiglu` where the SwiGLU folded into the GEMV beats the
SwiGLU kernel + the product by as much. Shapes not swept keep their entries (a new kind starts from a
copy of "default").

Graph: all weight GEMMs of one 27B decode step (each layer its own weight buffer, 51.2 GB, so
nothing stays in L2) captured in one CUDA graph and replayed: cuBLAS, Triton for every GEMM, and
"table" (per shape the faster of the two, what `gemv.linear` does with the table); ms and x the
floor (weight bytes / copy bandwidth of this run).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ninfer.targets.qwen3_6.dims import Qwen36Dims  # noqa: E402
from ninfer.targets.qwen3_6.program.model_view import stored_rows  # noqa: E402

TOL = 1e-2
DEVICE = "cuda"


def decode_gemms(dims: Qwen36Dims) -> list[tuple[str, int, int, int]]:
    """(name, N, K, layers) of the dense weight GEMMs of one decode step (routed experts excluded)."""
    H = dims.hidden_size
    nv = dims.linear_num_value_heads
    vdim = nv * dims.linear_value_head_dim
    qdim = dims.num_attention_heads * dims.head_dim
    n_gdn, n_att, n_all = len(dims.gdn_layers), len(dims.attention_layers), dims.num_hidden_layers
    out = [("gdn.in_proj", dims.conv_dim + vdim + 2 * nv, H, n_gdn), ("gdn.out_proj", H, vdim, n_gdn),
           ("attn.in_proj", 2 * qdim + 2 * dims.num_key_value_heads * dims.head_dim, H, n_att),
           ("attn.o_proj", H, qdim, n_att)]
    if dims.is_moe:
        Is = dims.shared_expert_intermediate_size
        rows = stored_rows("shared_in.weight", 2 * Is + 1 + dims.num_experts)     # as model_view stores it
        out += [("moe.shared_in", rows, H, n_all), ("moe.shared_down", H, Is, n_all)]
    else:
        out += [("mlp.gate_up", 2 * dims.intermediate_size, H, n_all), ("mlp.down", H, dims.intermediate_size, n_all)]
    out.append(("lm_head", dims.vocab_size, H, 1))
    return out


def model_dims(name: str) -> Qwen36Dims:
    if name == "27b":
        from ninfer.targets.qwen3_6_27b import DIMS
    elif name == "35b":
        from ninfer.targets.qwen3_6_35b_a3b import DIMS
    else:
        raise SystemExit(f"unknown model {name!r} (27b, 35b)")
    return DIMS


def unique_shapes(models: list[str], extra: list[tuple[int, int]] = (), extra_down: bool = False
                  ) -> list[tuple[int, int, list[str]]]:
    """(N, K, uses) of every decode GEMM of the models plus the extra shapes (labelled `--shapes`, or
    `--shapes:mlp.down` with extra_down: then the SwiGLU-folded variant is timed for them too)."""
    tag = "--shapes:mlp.down" if extra_down else "--shapes"
    seen: dict[tuple[int, int], list[str]] = {(n, k): [tag] for n, k in extra}
    for mdl in models:
        for name, n, k, count in decode_gemms(model_dims(mdl)):
            seen.setdefault((n, k), []).append(f"{mdl}:{name}x{count}")
    return [(n, k, names) for (n, k), names in seen.items()]


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    a = a.float()
    if not torch.isfinite(a).all():
        return math.inf
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def fp32_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return torch.cat([F.linear(xf, w[i:i + 32768].float()) for i in range(0, w.shape[0], 32768)], dim=1)


_FLUSH: list[torch.Tensor] = []


def time_us(fn, warmup_ms: int, rep_ms: int, max_reps: int = 100) -> float:
    """Median device time of fn in us, as triton.testing.do_bench (a 256 MB write flushes L2 before
    every run and keeps the GPU busy while the host queues the next call), with the repetitions
    capped so that microsecond kernels do not take thousands of flushes."""
    if DEVICE == "cpu":                                    # NOTE: the smoke path (Triton interpreter)
        t0 = time.perf_counter()
        fn()
        return 1e6 * (time.perf_counter() - t0)
    if not _FLUSH:
        _FLUSH.append(torch.empty(256 << 20, dtype=torch.int8, device="cuda"))
    cache = _FLUSH[0]
    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(3):
        cache.zero_()
        fn()
    e1.record()
    torch.cuda.synchronize()
    est_ms = max(e0.elapsed_time(e1) / 3, 1e-3)
    for _ in range(min(max(1, int(warmup_ms / est_ms)), 10)):
        fn()
    reps = min(max(10, int(rep_ms / est_ms)), max_reps)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        cache.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return 1e3 * statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


# ------------------------------------------------------------------------------------------------
# sweep
# ------------------------------------------------------------------------------------------------
def sweep(args, gemv, num_sms: int) -> list[dict]:
    t_start = time.perf_counter()
    results = []
    shapes = unique_shapes(args.models, args.shapes, args.shapes_down)
    total = len(shapes) * len(args.m)
    done = 0
    for n, k, names in shapes:
        w = torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16)
        for m in args.m:
            done += 1
            x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
            ref = fp32_reference(x, w)
            nbytes = 2 * (n * k + m * k + m * n)
            t_cublas = time_us(lambda: F.linear(x, w), args.warmup_ms, args.rep_ms)
            over = time.perf_counter() - t_start > args.budget_s
            space = gemv.sweep_space(n, k, m, num_sms)
            if over:                                        # NOTE: keep the whole run inside its budget
                space = [gemv.default_config(n, k, m, num_sms)]
            best, best_us, best_err, tried, bad = None, math.inf, None, [], []
            for cfg in space:
                try:
                    err = rel_rms(gemv.gemv(x, w, cfg), ref)
                    if not err < TOL:
                        bad.append([list(cfg), f"rel RMS {err:.3g}"])
                        continue
                    us = time_us(lambda: gemv.gemv(x, w, cfg), args.warmup_ms, args.rep_ms)
                except Exception as e:  # noqa: BLE001 - a config that does not compile is skipped, reported
                    bad.append([list(cfg), f"{type(e).__name__}: {str(e)[:200]}"])
                    continue
                tried.append([list(cfg), round(us, 2)])
                if us < best_us:
                    best, best_us, best_err = cfg, us, err
            r = {"shape": f"{n}x{k}", "N": n, "K": k, "M": m, "uses": names, "bytes": nbytes,
                 "cublas_us": round(t_cublas, 2), "cublas_TBps": round(nbytes / t_cublas / 1e6, 3),
                 "best": list(best) if best else None, "triton_us": round(best_us, 2) if best else None,
                 "triton_TBps": round(nbytes / best_us / 1e6, 3) if best else None,
                 "speedup": round(t_cublas / best_us, 3) if best else None, "err": best_err,
                 "tried": tried, "failed": bad, "budget_cut": over}
            results.append(r)
            tb = f"{r['triton_TBps']:.2f}" if best else "-"
            print(f"[{done}/{total} {time.perf_counter() - t_start:5.0f}s] {n}x{k} M={m}: cuBLAS "
                  f"{t_cublas:8.1f} us {r['cublas_TBps']:.2f} TB/s | triton {best_us:8.1f} us {tb} TB/s "
                  f"{tuple(best) if best else None} ({len(tried)} ok, {len(bad)} failed"
                  f"{', budget cut' if over else ''})", flush=True)
            for cfg, why in bad[:2]:
                print(f"    failed {tuple(cfg)}: {why}", flush=True)
            x = ref = None
        w = None
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return results


def swiglu_sweep(results: list[dict], gemv, min_speedup: float) -> list[dict]:
    """For the dense MLP down projections: the SwiGLU kernel + the product (what `linear_swiglu`
    does without the fold: `linear` picks Triton or cuBLAS) vs the SwiGLU folded into the GEMV's x load
    (`gemv(..., swiglu=True)` with the sweep's best config). Returns the rows ("fold": folded >= min_speedup
    faster and within the error bound)."""
    from ninfer.ops.triton.fused import silu_mul_halves
    rows = []
    for r in results:
        if not r["best"] or r["M"] not in (1, 2, 4, 8) or not any(".down" in u and "shared" not in u
                                                                 for u in r["uses"]):
            continue
        n, k, m = r["N"], r["K"], r["M"]
        cfg = gemv.GemvConfig(*r["best"])
        gu = torch.randn(m, 2 * k, device=DEVICE, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16)
        plain_triton = r["speedup"] is not None and r["speedup"] >= min_speedup

        def composed():
            x = silu_mul_halves(gu)
            return gemv.gemv(x, w, cfg) if plain_triton else F.linear(x, w)

        def folded():
            return gemv.gemv(gu, w, cfg, swiglu=True)
        ref = fp32_reference(silu_mul_halves(gu), w)
        err = rel_rms(folded(), ref)
        t_c, t_f = time_us(composed, 25, 100), time_us(folded, 25, 100)
        ok = err < 1e-2
        rows.append({"shape": f"{n}x{k}", "N": n, "K": k, "M": m, "composed_us": round(t_c, 2),
                     "folded_us": round(t_f, 2), "speedup": round(t_c / t_f, 3), "err": err, "ok": ok,
                     "fold": ok and t_c / t_f >= min_speedup})
        print(f"[swiglu] {n}x{k} M={m}: SwiGLU kernel + {'triton' if plain_triton else 'cuBLAS'} {t_c:.1f} us | "
              f"folded {t_f:.1f} us ({t_c / t_f:.3f}x, err {err:.1e})", flush=True)
    return rows


def print_sweep(results: list[dict], copy_tbs: float) -> None:
    from ninfer.bench.common import print_table
    rows = [[r["shape"], r["M"], f"{r['bytes'] / 1e6:.1f}", r["cublas_us"], r["cublas_TBps"],
             str(tuple(r["best"])) if r["best"] else "-", r["triton_us"], r["triton_TBps"], r["speedup"],
             f"{r['err']:.1e}" if r["err"] is not None else "-", " ".join(r["uses"])] for r in results]
    print(f"\ncopy ceiling {copy_tbs:.3f} TB/s; config = (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages, dot)")
    print_table(["shape", "M", "MB", "cuBLAS us", "TB/s", "best config", "triton us", "TB/s", "speedup", "err",
                 "uses"], rows)


def table_entry(base: dict, results: list[dict], swiglu: list[dict], min_speedup: float) -> dict:
    """A gemv.json entry: `base` (the entry the sweep updates) with every swept shape's best config and its
    Triton / SwiGLU marks set from the sweep. Keys "NxKxM" with M a row bucket (1, 2, 4, 8); rows measured
    at another M are left out."""
    from ninfer.ops.triton.gemv_configs import GemvConfig, shape_key
    configs = dict(base.get("configs", {}))
    use, fold = set(base.get("triton", ())), set(base.get("swiglu", ()))
    for r in results:
        if not r["best"] or r["M"] not in (1, 2, 4, 8):
            continue
        key = shape_key(r["N"], r["K"], r["M"])
        configs[key] = GemvConfig(*r["best"])._asdict()
        (use.add if r["speedup"] >= min_speedup else use.discard)(key)
    for r in swiglu:
        (fold.add if r["fold"] else fold.discard)(shape_key(r["N"], r["K"], r["M"]))

    def order(key: str) -> tuple[int, ...]:
        return tuple(int(v) for v in key.split("x"))
    return {"configs": {key: configs[key] for key in sorted(configs, key=order)},
            "triton": sorted(use, key=order), "swiglu": sorted(fold, key=order)}


def write_table(args, results: list[dict], swiglu: list[dict]) -> str:
    """Update the --kind entry of the table file (--out, or the package's gemv.json with --write)."""
    from ninfer.ops import tuning
    from ninfer.ops.triton.gemv_configs import parse_tables
    path = args.out or str(tuning.table_path("gemv"))
    kind = args.kind or tuning.device_kind(DEVICE)
    try:
        data = tuning.read_table_file(path)
    except ValueError:
        data = tuning.read_table_file(tuning.table_path("gemv"))      # a new file starts from the package's
    entry = table_entry(data.get(kind, data["default"]), results, swiglu, args.min_speedup)
    parse_tables(entry)                                               # refuse to write what would not load
    if not os.path.exists(path):
        tuning.write_entry(path, "default", data["default"])
    tuning.write_entry(path, kind, entry)
    return f"{path} [{kind}]"


# ------------------------------------------------------------------------------------------------
# 27B decode step in one CUDA graph
# ------------------------------------------------------------------------------------------------
def replay_ms(step, reps: int) -> float:
    """Median ms of one replay of `step` captured in a CUDA graph (warmed up on a side stream first:
    Triton compiles, split-K counters are allocated outside the capture)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for _ in range(3):
        g.replay()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    del g
    return statistics.median(times)


def step_graph(args, gemv, results: list[dict] | None, copy_tbs: float) -> dict:
    dims = model_dims("27b")
    gemms = decode_gemms(dims)
    total_bytes = sum(2 * n * k * c for _, n, k, c in gemms)
    print(f"\n[graph] allocating {total_bytes / 1e9:.1f} GB of distinct 27B weights", flush=True)
    weights = [(n, k, [torch.empty(n, k, device=DEVICE, dtype=torch.bfloat16).normal_() for _ in range(c)])
               for _, n, k, c in gemms]
    best = {(r["N"], r["K"], r["M"]): r for r in (results or [])}
    out: dict = {"total_bytes": total_bytes, "floor_ms": total_bytes / (copy_tbs * 1e9), "runs": []}
    for m in args.graph_m:
        xs = {k: torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16) for _, _, k, _ in gemms}

        def pick(n, k, mode):
            r = best.get((n, k, gemv.m_bucket(m)))
            cfg = gemv.GemvConfig(*r["best"]) if r and r["best"] else gemv.config_for(n, k, m)
            if mode == "triton":
                return cfg
            if mode == "table":
                fast = (r["speedup"] or 0) >= args.min_speedup if r and r["best"] else gemv.use_triton(n, k, m)
                return cfg if fast else None
            return None

        for mode in ("cublas", "triton", "table"):
            plan = [(k, ws, pick(n, k, mode)) for n, k, ws in weights]

            def step():
                for k, ws, cfg in plan:
                    for w in ws:
                        gemv.gemv(xs[k], w, cfg) if cfg is not None else F.linear(xs[k], w)

            try:
                ms = replay_ms(step, args.graph_reps)
            except Exception as e:  # noqa: BLE001 - report the mode that failed, time the others
                print(f"[graph] 27B step M={m} {mode}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                out["runs"].append({"M": m, "mode": mode, "error": f"{type(e).__name__}: {str(e)[:300]}"})
                continue
            n_tri = sum(len(ws) for _, ws, cfg in plan if cfg is not None)
            row = {"M": m, "mode": mode, "ms": round(ms, 3), "x_floor": round(ms / out["floor_ms"], 3),
                   "TBps": round(total_bytes / (ms * 1e9), 3), "triton_gemms": n_tri,
                   "gemms": sum(len(ws) for _, _, ws in weights)}
            out["runs"].append(row)
            print(f"[graph] 27B step M={m} {mode:6s}: {ms:7.3f} ms  {row['x_floor']:.3f} x floor "
                  f"({row['TBps']:.2f} TB/s, {n_tri}/{row['gemms']} GEMMs in Triton)", flush=True)
    print(f"[graph] floor {out['floor_ms']:.3f} ms = {total_bytes / 1e9:.2f} GB / {copy_tbs:.3f} TB/s", flush=True)
    weights = None
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return out


def load_configs(path: str, kind: str) -> list[dict]:
    """A table file's entry of `kind` as sweep results (best config, speedup 2 on Triton shapes, 0 else)."""
    from ninfer.ops import tuning
    from ninfer.ops.triton.gemv_configs import parse_tables
    t = parse_tables(tuning.load_entry("gemv", kind, path=path))
    return [{"N": n, "K": k, "M": m, "best": list(cfg), "speedup": 2.0 if (n, k, m) in t.triton else 0.0}
            for (n, k, m), cfg in t.configs.items()]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(v) for v in s.split(",") if v]  # noqa: E731
    p.add_argument("--models", type=lambda s: [v for v in s.split(",") if v], default=["27b", "35b"],
                   help="27b,35b (empty: only --shapes)")
    p.add_argument("--shapes", type=lambda s: [tuple(int(d) for d in v.split("x")) for v in s.split(",") if v],
                   default=[], help="extra NxK shapes (comma list), e.g. 52224x5120")
    p.add_argument("--shapes-down", action="store_true",
                   help="the --shapes are dense MLP down projections: also time the SwiGLU folded into the GEMV")
    p.add_argument("--device", default="cuda", help="cuda; cpu = smoke run under TRITON_INTERPRET=1 (tiny "
                   "--shapes, --models '', wall-clock times)")
    p.add_argument("--m", type=ints, default=[1, 2, 4, 8], help="rows (comma list; 1..8)")
    p.add_argument("--write", action="store_true",
                   help="update this device kind's entry of ninfer/ops/configs/gemv.json with the sweep")
    p.add_argument("--out", help="the tuning-table file to update instead of the package's (implies --write)")
    p.add_argument("--kind", help="the table entry to update (default: this device's kind; e.g. default)")
    p.add_argument("--graph", action="store_true", help="also time the 27B step GEMMs in one CUDA graph")
    p.add_argument("--graph-m", type=ints, default=[1], help="rows of the graph runs (comma list)")
    p.add_argument("--graph-reps", type=int, default=20)
    p.add_argument("--no-sweep", action="store_true", help="skip the sweep (with --graph)")
    p.add_argument("--configs", help="a tuning-table file: its configs (this kind's entry) for --graph --no-sweep")
    p.add_argument("--min-speedup", type=float, default=1.02, help="the Triton mark's threshold vs cuBLAS")
    p.add_argument("--budget-s", type=float, default=200.0,
                   help="sweep time after which only the default config is timed")
    p.add_argument("--warmup-ms", type=int, default=5)
    p.add_argument("--rep-ms", type=int, default=25)
    p.add_argument("--dry-run", action="store_true", help="print the shapes and sweep sizes; no GPU needed")
    a = p.parse_args(argv)
    if any(not 1 <= m <= 8 for m in a.m + a.graph_m):
        p.error("--m / --graph-m rows must be in 1..8")
    for mdl in a.models:
        model_dims(mdl)
    return a


def dry_run(args) -> int:
    try:
        from ninfer.ops.triton import gemv
    except ImportError as e:
        gemv = None
        print(f"(no Triton here: {e}; sweep sizes not shown)")
    for n, k, names in unique_shapes(args.models, args.shapes, args.shapes_down):
        sizes = [len(gemv.sweep_space(n, k, m)) for m in args.m] if gemv else "-"
        print(f"{n:>7} x {k:<6} {2 * n * k / 1e6:9.1f} MB  configs per M {sizes}  {' '.join(names)}")
    for mdl in args.models:
        gb = sum(2 * n * k * c for _, n, k, c in decode_gemms(model_dims(mdl))) / 1e9
        print(f"{mdl}: dense weight GEMMs of one decode step read {gb:.2f} GB")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1" or args.graph:
            print("--device cpu is a smoke run: needs TRITON_INTERPRET=1 and no --graph", file=sys.stderr)
            return 2
    elif not torch.cuda.is_available():
        print("bench/gemv.py needs a CUDA GPU (try --dry-run for the shapes)", file=sys.stderr)
        return 2
    try:
        from ninfer.ops.triton import gemv
    except ImportError as e:
        print(f"bench/gemv.py needs Triton: {e}", file=sys.stderr)
        return 2
    from ninfer.bench.common import env_record, json_line, measure_ceilings, print_ceilings
    env = env_record()
    print(f"{env['gpu']} torch {env['torch']} triton {env['triton']} commit {env['commit']}", flush=True)
    ceil = measure_ceilings(DEVICE)
    print_ceilings(ceil)
    copy_tbs = ceil["copy_TBps"]
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count if DEVICE == "cuda" else 132
    results = None
    if not args.no_sweep:
        results = sweep(args, gemv, num_sms)
        print_sweep(results, copy_tbs)
    elif args.configs:
        from ninfer.ops import tuning
        results = load_configs(args.configs, args.kind or tuning.device_kind(DEVICE))
    graph = step_graph(args, gemv, results, copy_tbs) if args.graph else None
    payload = {**env, "ceilings": ceil, "models": args.models, "rows": args.m, "results": results or [],
               "graph": graph}
    if results and not args.no_sweep:
        payload["swiglu"] = swiglu_sweep(results, gemv, args.min_speedup)
        if args.write or args.out:
            payload["written"] = write_table(args, results, payload["swiglu"])
            print(f"wrote {payload['written']}")
    json_line("gemv", payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
