"""Prefill: TTFT and prefill throughput through the public Engine, real sizes with synthetic (dummy) weights.

    ninfer bench prefill [--identity qwen3_6-27b qwen3_6-35b-a3b] [--lengths 1024 8192 32768]
        [--reps 3] [--chunk 0] [--out DIR] [--step-timeout S] [--hf-baseline | --no-hf-baseline]
    (or: python3 -m ninfer.bench.prefill ...)

Per identity one Engine (`Engine.from_config(EngineConfig(load_format="dummy", identity=...))`,
max_concurrency 1, prefill stages of --chunk tokens, or the whole prompt when --chunk is 0) with a trace
callback that stamps its model units (ninfer/bench/engine_clock.py). One measurement = a fresh random
prompt of L tokens submitted as one greedy request (max_tokens 1) to the idle engine; TTFT = from
just before `submit` to the commit of the prefill stage that sampled the first token (queueing,
admission, every stage and the first-token sampling; not HTTP, not the event's delivery).
Before any timed step, each identity warms up (`warmup_s`, reported apart and not under
--step-timeout): one untimed prompt per chunk configuration the timed lengths use (one stage: the
shortest such length; several stages: the shortest such length, at most two stages), so the
first-call Triton compiles and fla-core autotuning (long for the 27B on a fresh machine) are
outside every timed TTFT. The first timed repetition of each length is still reported apart
(`first_ms`: what is left is length-dependent, e.g. a kernel block size picked from the row count, or
the capture of a prefill graph: CUDA graphs are on as `ninfer serve` runs them unless --enforce-eager);
the median is of the others. Lengths > 8192 run --long-reps times (default 1: that one run is the
figure). The Program-level prefill timer (no Engine) is `python3 bench/program_step.py prefill`.

--hf-baseline (default on for CUDA): Hugging Face transformers' Qwen3_5(Moe)ForCausalLM with the
identity's dims and random weights on the same device, after the Engine is closed (`common.hf_model`):
one forward over the whole prompt with its cache (`logits_to_keep=1`) and the first token's argmax,
synchronized, the same lengths and repetitions (a fresh random prompt each), after one untimed prompt
of the shortest length (fla-core's autotuning, when transformers uses it). Rows `kind: hf_prefill`.

Floor (performance.md): 2 x active matrix params x tokens (lm_head once) + causal attention
(2 x T^2 x heads x head_dim per attention layer), at the bf16 matmul rate measured in this run; beside
it the same FLOPs at the rate the card sustains once its power limit holds the clocks down (CUDA).
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch

from ninfer.bench.args import hf_baseline_on, prefill_args
from ninfer.bench.common import (default_device, free_model, hf_model, measure_ceilings_apart, prefill_flops,
                                 print_table, Recorder, run_step, start_run, sync)
from ninfer.bench.engine_clock import UnitClock, random_prompt, start_engine, ttft_ms
from ninfer.config import EngineConfig
from ninfer.targets.registry import lookup

PAGE_SIZE = EngineConfig().page_size     # the Engine's KV page size (as `ninfer serve` runs)
MAX_STAGE = 65536                        # EngineConfig.prefill_chunk_tokens' upper bound


def stage_tokens(lengths: list[int], chunk: int) -> int:
    """The Engine's prefill stage size: --chunk, or (0) the longest prompt, capped at what the Engine allows."""
    return min(chunk or max(lengths), MAX_STAGE)


def warmup_lengths(lengths: list[int], chunk: int) -> list[int]:
    """One prompt length per chunk configuration among `lengths`: a single stage (L <= chunk, or
    chunk 0) warms with the shortest such L; staged prefill (L > chunk) with the shortest such L
    capped at two stages (first stage, then a stage over cached pages)."""
    single = [L for L in lengths if not chunk or L <= chunk]
    staged = [L for L in lengths if chunk and L > chunk]
    return ([min(single)] if single else []) + ([min(min(staged), 2 * chunk)] if staged else [])


def run_identity(identity: str, lengths: list[int], reps: int, long_reps: int, chunk: int, peak: tuple[float, float],
                 device: str, rec: Recorder, step_timeout: float | None, enforce_eager: bool = False) -> None:
    dims = lookup(identity).dims
    stage = stage_tokens(lengths, chunk)
    clock = UnitClock()
    engine, ready_s = start_engine(identity, device, clock, max_concurrency=1, max_model_len=max(lengths) + 16,
                                   prefill_chunk_tokens=stage, enforce_eager=enforce_eager)
    try:
        print(f"[{identity}] synthetic weights generated and Engine ready in {ready_s:.1f} s; prefill stage "
              f"{stage} tokens", flush=True)
        rng = random.Random(0)
        wrng = random.Random(1)
        t0 = time.perf_counter()
        for L in warmup_lengths(lengths, chunk):
            ms = ttft_ms(engine, clock, random_prompt(wrng, L), lambda: sync(device))
            print(f"[{identity}] warm-up prompt {L} (chunk {chunk or L}): {ms / 1e3:.1f} s", flush=True)
        warmup_s = time.perf_counter() - t0
        print(f"[{identity}] warm-up (compiles, autotuning) {warmup_s:.1f} s", flush=True)
        for L in lengths:
            n = long_reps if L > 8192 else reps

            def measure(L=L, n=n) -> dict:
                times = []
                for _ in range(max(1, n)):
                    times.append(ttft_ms(engine, clock, random_prompt(rng, L), lambda: sync(device)))
                    print(f"[{identity}] prompt {L}: {times[-1]:.1f} ms", flush=True)
                return prefill_row(identity, "prefill", "ninfer", dims, L, min(chunk or L, L), times, warmup_s, peak)

            row = run_step(rec, step_timeout, f"{identity} prefill {L}", measure)
            if row is not None:
                rec.add(row)
    finally:
        engine.close()


def prefill_row(identity: str, kind: str, impl: str, dims, L: int, chunk: int, times: list[float], warmup_s: float,
                peak: tuple[float, float]) -> dict:
    """One result row: the first repetition apart, the median of the others (the only one when reps = 1)."""
    flops = prefill_flops(dims, L)
    ms = statistics.median(times[1:]) if len(times) > 1 else times[0]
    floor = flops / peak[0] * 1e3
    return dict(identity=identity, kind=kind, impl=impl, prompt=L, chunk=chunk, reps=len(times), warmup_s=warmup_s,
                first_ms=times[0], ttft_ms=ms, tokens_per_s=L / ms * 1e3, flops=flops, floor_ms=floor,
                x_floor=ms / floor, floor_sustained_ms=flops / peak[1] * 1e3 if peak[1] else None,
                tflops=flops / (ms * 1e-3) / 1e12, all_ms=times)


def hf_baseline(identity: str, lengths: list[int], reps: int, long_reps: int, peak: tuple[float, float], device: str,
                rec: Recorder, step_timeout: float | None) -> None:
    """transformers over the same prompt lengths (see the module docstring); each length is its own step
    (a length that fails, e.g. out of memory, is recorded and the next one still runs)."""
    model, dims, _, hf_version = hf_model(identity, device)
    rng = torch.Generator().manual_seed(2)

    def once(L: int) -> float:
        ids = torch.randint(0, dims.vocab_size, (1, L), generator=rng).to(device)
        sync(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            res = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            tok = res.logits[:, -1].argmax(-1)
        sync(device)
        ms = (time.perf_counter() - t0) * 1e3
        del res, tok
        return ms

    t0 = time.perf_counter()
    once(min(lengths))
    warmup_s = time.perf_counter() - t0
    print(f"[hf {identity}] warm-up prompt {min(lengths)}: {warmup_s:.1f} s", flush=True)
    for L in lengths:
        def measure(L=L) -> dict:
            times = []
            for _ in range(max(1, long_reps if L > 8192 else reps)):
                times.append(once(L))
                print(f"[hf {identity}] prompt {L}: {times[-1]:.1f} ms", flush=True)
            return prefill_row(identity, "hf_prefill", f"transformers {hf_version}", dims, L, L, times, warmup_s,
                               peak)

        row = run_step(rec, step_timeout, f"{identity} transformers prefill {L}", measure)
        if row is not None:
            rec.add(row)
        else:
            free_model(device)          # the failed length's activations; the model stays for the next


add_args = prefill_args


def run(args: argparse.Namespace) -> int:
    device = args.device or default_device()
    cuda = device.startswith("cuda")
    env, ceil = start_run(lambda: measure_ceilings_apart(device))   # the Engine runs without the ceilings' buffers
    # NOTE: (burst rate, sustained rate): the floor is at the burst rate (performance.md); a long prompt's
    #       GEMMs run at the power-limited sustained rate, so its floor is printed beside it.
    peak = (ceil["matmul_8192_TFLOPs"] * 1e12, (ceil.get("matmul_sustained_TFLOPs") or 0.0) * 1e12)
    hf = hf_baseline_on(args, cuda)
    rec = Recorder("prefill", args.out, {"env": env, "ceilings": ceil, "device": device,
                                         "dtype": "bf16" if cuda else "fp32", "batch": 1, "page_size": PAGE_SIZE,
                                         "path": "engine",
                                         "weights": "dummy (synthetic)", "identities": args.identity,
                                         "lengths": args.lengths, "enforce_eager": args.enforce_eager,
                                         "hf_baseline": hf})
    lengths = sorted(args.lengths)
    for ident in args.identity:
        run_step(rec, None, f"{ident} prefill",
                 lambda: run_identity(ident, lengths, args.reps, args.long_reps, args.chunk, peak,
                                      device, rec, args.step_timeout, args.enforce_eager))
        free_model(device)              # each step's Engine is closed and freed here, however the step ended
        if hf:
            run_step(rec, None, f"{ident} transformers baseline",
                     lambda: hf_baseline(ident, lengths, args.reps, args.long_reps, peak, device, rec,
                                         args.step_timeout))
            free_model(device)
    print()
    rows = [[r["identity"], r["impl"], r["prompt"], r["chunk"], r["first_ms"], r["ttft_ms"], r["floor_ms"],
             r["x_floor"], r.get("floor_sustained_ms"), r["tokens_per_s"], r["tflops"]] for r in rec.results]
    print_table(["identity", "impl", "prompt", "chunk", "first_ms", "ttft_ms", "floor_ms", "x_floor",
                 "floor_sustained_ms", "prefill_tok/s", "TFLOP/s"], rows)
    ours = {(r["identity"], r["prompt"]): r["ttft_ms"] for r in rec.results if r["kind"] == "prefill"}
    rows = [[r["identity"], r["prompt"], ours[(r["identity"], r["prompt"])], r["ttft_ms"],
             r["ttft_ms"] / ours[(r["identity"], r["prompt"])]]
            for r in rec.results if r["kind"] == "hf_prefill" and (r["identity"], r["prompt"]) in ours]
    if rows:
        print()
        print_table(["identity", "prompt", "ninfer_ttft_ms", "transformers_ttft_ms", "speedup"], rows)
    rec.finish()
    return 1 if rec.errors and not rec.results else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ninfer bench prefill", description=__doc__.split("\n\n")[0])
    add_args(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
