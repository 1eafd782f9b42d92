"""Decode through the public Engine: the time of one decode round (TPOT) with B = 1..8 requests
decoding together at context 1k and 8k, real sizes with synthetic (dummy) weights, bf16.

    ninfer bench decode [--identity qwen3_6-27b qwen3_6-35b-a3b] [--ctx 1024 8192] [--batches 1 2 4 8]
        [--reps 10] [--max-model-len N] [--enforce-eager] [--host-overhead] [--hf-baseline | --no-hf-baseline]
        [--speculative-method mtp --num-speculative-tokens K [--force-accept-len L ...] [--with-plain]]
        [--json-schema-mask]
    (or: python3 -m ninfer.bench.decode ...)

Per identity one Engine (`Engine.from_config(EngineConfig(load_format="dummy", identity=...))`,
max_concurrency = the largest B, CUDA graphs as `ninfer serve` runs them unless --enforce-eager) with
a trace callback that stamps its model units (ninfer/bench/engine_clock.py). Per context length:
first the TTFT of single prompts on the idle engine (rows `kind: prefill`: the first apart, the median
of the others); then per B, B greedy requests of that prompt length submitted together with
`ignore_eos` and a budget that keeps every row decoding for 3 warm-up + --reps rounds. A round's time
is the time between the commits of two consecutive decode units that held all B rows; `step_ms` is
the median of --reps of them after 3 warm-ups, the time between two tokens of one stream (TPOT) while
B streams decode, Engine work and the Program's decode step-ahead included. Column `ops` is `engine`.

Floor = bytes read per step / copy bandwidth measured in this run: weights read once (MoE: the
distinct experts B rows can touch, at most min(E, k*B) per layer, plus router, shared expert and
attention/GDN), plus per row the KV of its context and the GDN recurrent state read + written, plus
the Program's slot -> provisional state copy (read + write).

--host-overhead: the tiny dense identity on the GPU (fp32) through the Engine, B = 1, 4, 8, graphs
off and on: the round time, nearly all of it host work at that model size.
--no-ref and --prefill-ref-gdn are accepted and do nothing here: the eager/graphs/reference-ops A/B of
the Program's decode step, without the Engine, is `python3 bench/program_step.py decode`.

Speculative decoding (--speculative-method mtp --num-speculative-tokens K): each decode unit is one
speculative round (K drafts, one verify); `step_ms` is then the round time, `mean_acceptance_length`
the tokens a round produced per row (from the Engine's spec_decode counters over the B requests), and
`tpot_ms` = step_ms / mean_acceptance_length. Synthetic weights accept almost no draft:
--force-accept-len L keeps exactly L tokens per round (the verify and commit run in full), so the
rows measure the round time and TPOT at acceptance length L. The request budget covers the rounds
at L (or K+1) tokens each, plus the K positions every request reserves. Several values
(--force-accept-len 1 2 3 4) run one Engine each, and --with-plain first times plain decoding too,
all in the same run (rows carry K and L; plain rows K = L = 0).

--json-schema-mask: also the compile time of a 50-field JSON schema (bench/constrained.py) and, per ctx and B,
the round with that schema's mask on every row (rows `kind: decode_masked`, `mask_ratio` = masked / plain).

--hf-baseline (default on for CUDA): Hugging Face transformers' Qwen3_5(Moe)ForCausalLM with the
identity's dims and random weights on the same device, its per-token decode with its own cache at
the smallest ctx and --hf-batches (after the Engine is closed: 27B bf16 is ~54 GB each).
--out DIR writes DIR/decode.json after every row; --step-timeout S bounds each identity.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch

from ninfer.bench import constrained
from ninfer.bench.args import decode_args, hf_baseline_on
from ninfer.bench.common import (decode_floor_ms, default_device, free_model, hf_model, measure_ceilings_apart,
                                 prefill_flops, print_prefill_rows, print_table, Recorder, run_step, start_run,
                                 sync)
from ninfer.bench.engine_clock import (UnitClock, acceptance_length, decode_budget, decode_rounds, random_prompt,
                                       spec_fields, spec_header, spec_label, start_engine, tokens_per_round,
                                       ttft_ms)
from ninfer.config import EngineConfig, SpeculativeConfig
from ninfer.targets.registry import lookup

WARMUP_ROUNDS = 3
PAGE_SIZE = EngineConfig().page_size     # the Engine's KV page size (as `ninfer serve` runs)
PREFILL_PROMPTS = 4        # single prompts timed per context length (the first reported apart)


def model_len(requested: int, ctxs: list[int], reps: int = 10, batches: list[int] = [8],
              spec: SpeculativeConfig | None = None) -> int:
    """The Engine's max_model_len: `requested` (--max-model-len), at least the largest context + 64 and
    room for the decode budget of the largest B (at `tokens_per_round` tokens a round) and the speculative
    lookahead."""
    budget = decode_budget(max(batches), WARMUP_ROUNDS + reps + 1) * tokens_per_round(spec)
    return max(requested, max(ctxs) + (spec.lookahead if spec else 0) + max(64, budget))


def gpu_gib(device: str) -> float:
    return torch.cuda.memory_allocated() / 2**30 if device.startswith("cuda") else 0.0


def run_identity(identity: str, ctxs: list[int], bw: float, reps: int, device: str = "cuda",
                 batches: list[int] = list(range(1, 9)), on_row=None, max_model_len: int = 0,
                 enforce_eager: bool = False, spec: SpeculativeConfig | None = None,
                 json_schema_mask: bool = False) -> list[dict]:
    cuda = device.startswith("cuda")
    dims = lookup(identity).dims
    dtype_bytes = 2 if cuda else 4
    mml = model_len(max_model_len, ctxs, reps, batches, spec)
    look, per_round = (spec.lookahead if spec else 0), tokens_per_round(spec)
    clock = UnitClock()
    engine, ready_s = start_engine(identity, device, clock, max_concurrency=max(batches), max_model_len=mml,
                                   enforce_eager=enforce_eager, speculative=spec)
    out = []

    def add(row: dict) -> None:
        out.append(row)
        if on_row:
            on_row(row)

    try:
        graphs = cuda and not enforce_eager
        spec_note = "" if spec is None else (f"; speculative {spec.method} K={spec.num_speculative_tokens}"
                                             f"{f' forced L={spec.force_accept_len}' if spec.force_accept_len else ''}")
        print(f"[{identity}] synthetic weights generated and Engine ready in {ready_s:.1f} s; max_concurrency "
              f"{max(batches)}; max_model_len {mml}; graphs {graphs}; GPU memory {gpu_gib(device):.1f} GiB"
              f"{spec_note}", flush=True)
        rng = random.Random(0)
        if json_schema_mask:
            row = constrained.compile_row(engine.frontend)
            add(dict(identity=identity, **row))
            print(f"[{identity}] 50-field JSON schema: compile {row['compile_ms']:.2f} ms (max "
                  f"{row['compile_max_ms']:.2f}; the first, with the vocabulary's grammar view, {row['first_ms']:.0f} "
                  f"ms; a cache hit {row['cache_hit_ms']:.3f} ms)", flush=True)
        for ctx in ctxs:
            pre_ms = [ttft_ms(engine, clock, random_prompt(rng, ctx), lambda: sync(device))
                      for _ in range(PREFILL_PROMPTS)]
            print(f"[{identity}] ctx {ctx}: TTFT ms per prompt {[round(x, 1) for x in pre_ms]}", flush=True)
            add(dict(identity=identity, kind="prefill", ctx=ctx, first_ms=pre_ms[0],
                     median_ms=statistics.median(pre_ms[1:]), gemm_flops=prefill_flops(dims, ctx)))
            for B in batches:
                budget = min(decode_budget(B, WARMUP_ROUNDS + reps + 1) * per_round, mml - ctx - look)
                before = engine.metrics()
                res = decode_rounds(engine, clock, B, ctx, reps, WARMUP_ROUNDS, rng, budget)
                accept = acceptance_length(before, engine.metrics())
                times = res["times_ms"]
                floor_ms = decode_floor_ms(dims, B, ctx, bw / 1e12, dtype_bytes)
                step = statistics.median(times)
                tpot = step if spec is None or not accept else step / accept
                add(dict(identity=identity, kind="decode", ops="engine", graphs=graphs, ctx=ctx, batch=B,
                         step_ms=step, min_ms=min(times), floor_ms=floor_ms, tpot_ms=tpot, rounds=len(times),
                         output_tokens=budget, **spec_fields(spec), mean_acceptance_length=accept))
                accept_note = "" if spec is None else (f"; acceptance length {_num(accept)}, TPOT {tpot:.2f} ms")
                print(f"[{identity}] engine graphs={graphs} ctx {ctx} B={B}: {step:.2f} ms per round "
                      f"(min {min(times):.2f}, floor {floor_ms:.2f}; {len(times)} rounds timed{accept_note})",
                      flush=True)
                if json_schema_mask:
                    masked = decode_rounds(engine, clock, B, ctx, reps, WARMUP_ROUNDS, rng, budget,
                                           constraint=constrained.constraint(0))["times_ms"]
                    m_step = statistics.median(masked)
                    add(dict(identity=identity, kind="decode_masked", ops="engine", graphs=graphs, ctx=ctx, batch=B,
                             step_ms=m_step, min_ms=min(masked), plain_step_ms=step, mask_ratio=m_step / step,
                             rounds=len(masked), **spec_fields(spec)))
                    print(f"[{identity}] engine graphs={graphs} ctx {ctx} B={B} with a 50-field JSON-schema mask on "
                          f"every row: {m_step:.2f} ms per round ({m_step / step:.3f}x the plain round)", flush=True)
    finally:
        engine.close()
    return out


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def host_overhead(reps: int = 50) -> list[dict]:
    """Tiny dense identity on the GPU through the Engine: the round time at B = 1, 4, 8, graphs off and on."""
    out = []
    ctx = 8
    for graphs in (False, True):
        clock = UnitClock()
        mml = ctx + decode_budget(8, WARMUP_ROUNDS + reps + 1) + 16
        engine, _ = start_engine("qwen3_6-tiny-dense", "cuda", clock, max_concurrency=8, max_model_len=mml,
                                 dtype="fp32", enforce_eager=not graphs)
        try:
            rng = random.Random(0)
            for B in (1, 4, 8):
                res = decode_rounds(engine, clock, B, ctx, reps, WARMUP_ROUNDS, rng,
                                    decode_budget(B, WARMUP_ROUNDS + reps + 1))
                wall = statistics.median(res["times_ms"])
                out.append(dict(kind="host", graphs=graphs, batch=B, round_ms=wall))
                print(f"[host] graphs={graphs} B={B}: round {wall:.3f} ms", flush=True)
        finally:
            engine.close()
    return out


# ---------------------------------------------------------------------------------------------
# transformers baseline: the same dims, random weights, on the same device
# ---------------------------------------------------------------------------------------------
def hf_baseline(identity: str, ctx: int, batches: list[int], reps: int, bw: float, device: str,
                on_row=None) -> list[dict]:
    """Hugging Face `Qwen3_5(Moe)ForCausalLM` built from the identity's dims (`common.hf_model`; run after
    our Program is freed). Per batch: prefill `ctx` random tokens with its cache, then time single-token
    forwards (`logits_to_keep=1`) with that cache, host wall clock, median of `reps` after 2 warm-ups
    (the context grows by one per step)."""
    model, dims, dtype, hf_version = hf_model(identity, device)
    cuda = device.startswith("cuda")
    sync = (lambda: torch.cuda.synchronize()) if cuda else (lambda: None)
    out = []
    rng = torch.Generator().manual_seed(1)
    for B in batches:
        ids = torch.randint(0, dims.vocab_size, (B, ctx), generator=rng).to(device)
        with torch.no_grad():
            sync()
            t0 = time.perf_counter()
            res = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            sync()
            pre_ms = (time.perf_counter() - t0) * 1e3
            cache = res.past_key_values
            nxt = res.logits[:, -1].argmax(-1, keepdim=True)
            times = []
            for i in range(2 + reps):
                sync()
                t0 = time.perf_counter()
                res = model(input_ids=nxt, past_key_values=cache, use_cache=True, logits_to_keep=1)
                nxt = res.logits[:, -1].argmax(-1, keepdim=True)
                sync()
                if i >= 2:
                    times.append((time.perf_counter() - t0) * 1e3)
                cache = res.past_key_values
        floor = decode_floor_ms(dims, B, ctx, bw / 1e12, dtype.itemsize)
        row = dict(identity=identity, kind="hf_decode", ops=f"transformers {hf_version}", graphs=False,
                   ctx=ctx, batch=B, step_ms=statistics.median(times), min_ms=min(times), floor_ms=floor,
                   hf_prefill_ms=pre_ms)
        out.append(row)
        print(f"[hf {identity}] ctx {ctx} B={B}: {row['step_ms']:.2f} ms (floor {floor:.2f}); "
              f"prefill {pre_ms:.0f} ms", flush=True)
        if on_row:
            on_row(row)
        del cache, res
    return out


# ---------------------------------------------------------------------------------------------
add_args = decode_args


def run(args: argparse.Namespace) -> int:
    from ninfer.bench.args import speculative_configs
    specs = speculative_configs(args)
    speculative = any(s is not None for s in specs)
    device = args.device or default_device()
    cuda = device.startswith("cuda")
    hf = hf_baseline_on(args, cuda)
    env, ceil = start_run(lambda: measure_ceilings_apart(device))   # the Engine runs without the ceilings' buffers
    bw, peak = ceil["copy_TBps"] * 1e12, ceil["matmul_8192_TFLOPs"] * 1e12
    rec = Recorder("decode", args.out, {"env": env, "ceilings": ceil, "device": device,
                                        "dtype": "bf16" if cuda else "fp32", "path": "engine",
                                        "page_size": PAGE_SIZE, "weights": "dummy (synthetic)",
                                        "identities": args.identity, "ctx": args.ctx, "batches": args.batches,
                                        "enforce_eager": args.enforce_eager,
                                        "max_model_len": max(model_len(args.max_model_len, args.ctx, args.reps,
                                                                       args.batches, spec) for spec in specs),
                                        **spec_header(specs)})
    if args.host_overhead and cuda:
        run_step(rec, args.step_timeout, "host overhead", lambda: host_overhead_rows(rec))
        free_model(device)
    for ident in args.identity:
        for spec in specs:              # NOTE: one Engine each: the speculative settings are fixed at start
            run_step(rec, args.step_timeout, f"{ident} decode{spec_label(spec)}",
                     lambda spec=spec: run_identity(ident, args.ctx, bw, args.reps, device=device,
                                                    batches=args.batches, on_row=rec.add,
                                                    max_model_len=args.max_model_len,
                                                    enforce_eager=args.enforce_eager, spec=spec,
                                                    json_schema_mask=args.json_schema_mask))
            free_model(device)          # each step's Engine is closed and freed here, however the step ended
        if hf:
            run_step(rec, args.step_timeout, f"{ident} transformers baseline",
                     lambda: hf_baseline(ident, min(args.ctx), args.hf_batches, args.reps, bw, device, on_row=rec.add))
            free_model(device)
    results = rec.results
    print()
    rows = [[r["graphs"], r["batch"], r["round_ms"]] for r in results if r["kind"] == "host"]
    if rows:
        print_table(["graphs", "B", "round_ms"], rows)
        print()
    rows = []
    for r in results:
        if r["kind"] in ("decode", "hf_decode"):
            per_row = r.get("tpot_ms") or r["step_ms"]
            row = [r["identity"], r["ops"], r["graphs"], r["ctx"], r["batch"], r["step_ms"], r["floor_ms"],
                   r["step_ms"] / r["floor_ms"], 1000 * r["batch"] / per_row]
            if speculative:
                row[5:5] = [r.get("num_speculative_tokens"), r.get("force_accept_len"),
                            r.get("mean_acceptance_length"), r.get("tpot_ms")]
            rows.append(row)
    headers = ["identity", "ops", "graphs", "ctx", "B", "step_ms", "floor_ms", "x_floor", "tok/s"]
    if speculative:
        headers[5:5] = ["K", "L", "accept_len", "tpot_ms"]
    print_table(headers, rows)
    print()
    rows = [[r["identity"], r["fields"], r["compile_ms"], r["compile_max_ms"], r["first_ms"], r["cache_hit_ms"]]
            for r in results if r["kind"] == "compile"]
    if rows:
        print_table(["identity", "schema_fields", "compile_ms", "max_ms", "first_ms", "cache_hit_ms"], rows)
        print()
    rows = [[r["identity"], r["graphs"], r["ctx"], r["batch"], r["plain_step_ms"], r["step_ms"], r["mask_ratio"]]
            for r in results if r["kind"] == "decode_masked"]
    if rows:
        print_table(["identity", "graphs", "ctx", "B", "plain_ms", "masked_ms", "ratio"], rows)
        print()
    print_prefill_rows(results, peak)
    rec.finish()
    return 1 if rec.errors and not rec.results else 0


def host_overhead_rows(rec: Recorder) -> list[dict]:
    rows = host_overhead()
    rec.add(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ninfer bench decode", description=__doc__.split("\n\n")[0])
    add_args(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
