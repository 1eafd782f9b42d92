"""Decode step time through the Program, B = 1..8 at context 1k and 8k, real sizes with synthetic
(dummy) weights, bf16, with the decode CUDA graphs off (eager) and on (column `graphs`).

    ninfer bench decode   (or: PYTHONPATH=$PWD python bench/decode.py) [--identity qwen3_6-27b qwen3_6-35b-a3b] [--ctx 1024 8192]
        [--batches 1 2 4 8] [--prefill-ref-gdn] [--host-overhead]

--prefill-ref-gdn prefills with the PyTorch chunk delta rule instead of fla-core's (skips fla's
first-call compile and autotuning, tens of seconds; the decode steps are unaffected).
--host-overhead: the tiny dense identity on the GPU (fp32), B = 1, 4, 8: wall time of a round,
the Python thread's CPU time per round (time.thread_time) and the GPU time of the forward alone
(graph replays timed with CUDA events); host overhead = round - GPU forward time.

One decode round = `Program.decode(rows)` (state image copy into the provisional entry, the
forward, lm_head, sampling, one host sync for the token ids) followed by `abort_pending`, so every
round runs at the same context. Host wall clock around each round, median of 10 after 3 warm-ups.
Then the serving loop at the smallest and largest B: `decode` + `commit` back to back, as a server
runs them, with the decode step-ahead off and on (`serving_loop`; ms per round).
Also the prefill time of each prompt (its median over the rows) and, at 1k, the same rounds with
the reference ops for comparison. Floor = bytes read per step / copy bandwidth measured in this
run: weights read once (MoE: the distinct experts B rows can touch, at most min(E, k*B) per layer,
plus router, shared expert and attention/GDN), plus per row the KV of its context and the GDN
recurrent state read + written, plus the Program's slot -> provisional state copy (read + write).

--hf-baseline (default on for CUDA): Hugging Face transformers' Qwen3_5(Moe)ForCausalLM with the
identity's dims and random weights on the same device, its per-token decode with its own cache at
the smallest ctx and --hf-batches (after our Program is freed: 27B bf16 is ~54 GB each).
--out DIR writes DIR/decode.json after every row; --step-timeout S bounds each identity.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time

import torch

from ninfer.bench.args import decode_args, hf_baseline_on
from ninfer.bench.common import (Recorder, decode_floor_ms, prefill_flops, default_device, env_record, free_model,
                                 hf_model, measure_ceilings, print_ceilings, print_table, run_step)
from ninfer.ops.opset import reference_ops
from ninfer.contract.program import SamplingParams, SequenceRequest
from ninfer.targets.dummy_weights import DummyWeights
from ninfer.targets.qwen3_6.program.config import ProgramConfig

PAGE = 64
LOOP_BUDGET = 512        # output tokens each bench row may commit (the serving-loop rounds commit theirs)


def model_len(requested: int, ctxs: list[int]) -> int:
    """The Program's max_model_len (the decode graphs' block-table width): `requested` (--max-model-len),
    at least the largest context + 64 (the serving-loop rounds commit tokens within what is left)."""
    return max(requested, max(ctxs) + 64)


def run_identity(identity: str, ctxs: list[int], bw: float, reps: int, ref_compare: bool, device: str = "cuda",
                 batches: list[int] = list(range(1, 9)), prefill_ref_gdn: bool = False,
                 on_row=None, max_model_len: int = 0) -> list[dict]:
    dt = torch.bfloat16 if device.startswith("cuda") else torch.float32
    w = DummyWeights(identity, device=device, dtype=dt, seed=0)
    sync = (lambda: torch.cuda.synchronize()) if device.startswith("cuda") else (lambda: None)
    pkg = importlib.import_module(w.package.module)
    dims = w.dims
    max_ctx = max(ctxs)
    pages = sum(8 * ((c + LOOP_BUDGET) // PAGE + 2) for c in ctxs) + 16
    # NOTE: max_steps 1: each round is one step per row; the Program adds the step-ahead's entries itself.
    cfg = ProgramConfig(device=device, dtype="bf16" if device.startswith("cuda") else "fp32", page_size=PAGE, num_pages=pages, num_slots=8 * len(ctxs),
                        max_model_len=model_len(max_model_len, ctxs), max_batch=8, max_steps=1)
    t0 = time.perf_counter()
    prog = pkg.create_program(w, cfg)
    sync()
    load_s = time.perf_counter() - t0
    cap = prog.graphs.capture_s if prog.graphs is not None else 0.0
    print(f"[{identity}] synthetic weights generated and Program created in {load_s:.1f} s "
          f"(of which decode graph capture B=1..8: {cap:.1f} s); ops={prog.model.ops.name}; max_model_len "
          f"{cfg.max_model_len}; GPU memory {(torch.cuda.memory_allocated() if device.startswith('cuda') else 0) / 2**30:.1f} GiB", flush=True)
    rng = torch.Generator().manual_seed(0)
    out = []
    main_ops = prog.model.ops
    for ctx in ctxs:
        handles, pre_ms = [], []
        budget = min(LOOP_BUDGET, cfg.max_model_len - ctx)      # output tokens per row
        if prefill_ref_gdn:
            prog.model.ops = main_ops._replace(chunk_gated_delta_rule=reference_ops().chunk_gated_delta_rule)
        for r in range(8):
            prompt = tuple(torch.randint(0, dims.vocab_size, (ctx,), generator=rng).tolist())
            req = SequenceRequest(prompt_token_ids=prompt, max_output_tokens=budget,
                                  sampling=SamplingParams(temperature=0.0))
            h = prog.start_materialize(prog.plan_materialize(req)).sequence
            sync()
            t0 = time.perf_counter()
            step = prog.prefill(h, ctx)
            sync()
            pre_ms.append((time.perf_counter() - t0) * 1e3)
            prog.commit(step.pending, [1])
            handles.append(h)
        prog.model.ops = main_ops
        pflops = prefill_flops(dims, ctx)
        print(f"[{identity}] ctx {ctx}: prefill ms per prompt {[round(x, 1) for x in pre_ms]}", flush=True)
        out.append(dict(identity=identity, kind="prefill", ctx=ctx, first_ms=pre_ms[0],
                        median_ms=statistics.median(pre_ms[1:]), gemm_flops=pflops))
        if on_row:
            on_row(out[-1])
        variants = [(main_ops.name, main_ops, False, False)]
        if prog.graphs is not None:
            variants.append((main_ops.name, main_ops, True, False))
        if ref_compare and ctx == min(ctxs) and main_ops.name != "reference":
            variants.append(("reference", reference_ops(), False, True))
        prog.step_ahead_enabled = False       # these rounds are aborted: a step-ahead would never be adopted
        for name, ops, graphs, compare in variants:
            prog.model.ops = ops
            prog.graphs_enabled = graphs
            for B in batches:
                if compare and B not in (1, 8):
                    continue
                hs = handles[:B]
                times = []
                for i in range(3 + reps):
                    sync()
                    t0 = time.perf_counter()
                    batch = prog.decode(hs)
                    sync()
                    dt = time.perf_counter() - t0
                    prog.abort_pending(batch)
                    if i >= 3:
                        times.append(dt * 1e3)
                # NOTE: from the dimension facts (the view's fused matrices and their row views would count twice)
                floor_ms = decode_floor_ms(dims, B, ctx, bw / 1e12, w.dtype.itemsize)
                out.append(dict(identity=identity, kind="decode", ops=name, graphs=graphs, ctx=ctx, batch=B,
                                step_ms=statistics.median(times), min_ms=min(times), floor_ms=floor_ms))
                if on_row:
                    on_row(out[-1])
                print(f"[{identity}] {name} graphs={graphs} ctx {ctx} B={B}: {statistics.median(times):.2f} ms "
                      f"(min {min(times):.2f}, floor {floor_ms:.2f})", flush=True)
            prog.model.ops = main_ops
            prog.graphs_enabled = True
        if prog.graphs is not None:
            out += serving_loop(prog, identity, ctx, handles, batches, reps, budget, on_row)
        for h in handles:
            prog.release(h)
    return out


def serving_loop(prog, identity: str, ctx: int, handles: list, batches: list[int], reps: int, budget: int,
                 on_row=None) -> list[dict]:
    """What a server's decode loop sees per round: `decode` + `commit` of every row, back to back (no
    sync in between), graphs on, with the decode step-ahead off and on (runtime/step_ahead.py); ms per
    round = wall from the start of round 4 to the return of the last / the rounds timed (up to 3 x reps).
    Largest B first: rows past B are released (a step-ahead is launched only when every live sequence is
    in the round). budget: the rows' max_output_tokens (the rounds commit within it)."""
    out = []
    live = list(handles)
    bs = sorted({min(batches), max(batches)}, reverse=True)
    room = budget - 3                    # each row has its first sampled token (the rounds before aborted); 2 spare
    n = min(3 + 3 * reps, room // (4 * len(bs)))          # rounds per variant: the rows' room holds them all
    if n < 6:
        print(f"[{identity}] serving loop skipped: the rows have room for {room} more tokens "
              f"(raise --max-model-len above ctx + {24 * len(bs) + 64})", flush=True)
        return out
    for B in bs:
        while len(live) > B:
            prog.release(live.pop())
        for ahead in (False, True, False, True):
            prog.step_ahead_enabled = ahead
            torch.cuda.synchronize()
            a0 = prog.step_ahead_counts["adopted"]
            for i in range(n):
                if i == 3:
                    t0 = time.perf_counter()
                batch = prog.decode(live)
                prog.commit(batch, [1] * B)
            # NOTE: timed to the last round's return, not to a device sync: the step that round launched
            #       ahead is never adopted here, and waiting for it would add a whole step to the rounds.
            ms = (time.perf_counter() - t0) * 1e3 / (n - 3)
            torch.cuda.synchronize()
            adopted = prog.step_ahead_counts["adopted"] - a0
            row = dict(identity=identity, kind="loop", ctx=ctx, batch=B, step_ahead=ahead, round_ms=ms,
                       rounds=n, adopted=adopted)
            out.append(row)
            if on_row:
                on_row(row)
            print(f"[{identity}] serving loop ctx {ctx}+ B={B} step_ahead={ahead}: {ms:.3f} ms per round "
                  f"({adopted} of {n} rounds adopted a step-ahead)", flush=True)
    prog.step_ahead_enabled = prog.config.decode_step_ahead
    handles[:] = live
    return out


def host_overhead(reps: int = 50) -> list[dict]:
    """Tiny dense identity on the GPU: per decode round, wall time, thread CPU time and the GPU
    time of the forward alone, graphs on and off."""
    from ninfer.targets.qwen3_6_tiny_dense import create_program
    w = DummyWeights("qwen3_6-tiny-dense", device="cuda", dtype=torch.float32, seed=0)
    prog = create_program(w, ProgramConfig(device="cuda", dtype="fp32", page_size=16, num_pages=256, num_slots=8,
                                           max_model_len=1024, max_batch=8, max_steps=1))
    handles = []
    for r in range(8):
        req = SequenceRequest(prompt_token_ids=tuple(range(1 + r, 9 + r)), max_output_tokens=32,
                              sampling=SamplingParams(temperature=0.0))
        h = prog.start_materialize(prog.plan_materialize(req)).sequence
        while True:
            st = prog.prefill(h, 1)           # 1-token stages: decode kernels, no fla compile
            if st.pending is not None:
                prog.commit(st.pending, [1])
                break
        handles.append(h)
    out = []
    for graphs in (False, True):
        prog.graphs_enabled = graphs
        for B in (1, 4, 8):
            hs = handles[:B]
            walls, cpus = [], []
            for i in range(10 + reps):
                torch.cuda.synchronize()
                c0, t0 = time.thread_time(), time.perf_counter()
                batch = prog.decode(hs)
                prog.abort_pending(batch)
                torch.cuda.synchronize()
                if i >= 10:
                    walls.append((time.perf_counter() - t0) * 1e3)
                    cpus.append((time.thread_time() - c0) * 1e3)
            gpu_ms = float("nan")
            if graphs:
                gr = prog.graphs._graphs[B].graph
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                gr.replay()
                e0.record()
                for _ in range(20):
                    gr.replay()
                e1.record()
                torch.cuda.synchronize()
                gpu_ms = e0.elapsed_time(e1) / 20
            wall = statistics.median(walls)
            out.append(dict(kind="host", graphs=graphs, batch=B, round_ms=wall, cpu_ms=statistics.median(cpus),
                            gpu_forward_ms=gpu_ms, host_ms=wall - gpu_ms))
            print(f"[host] graphs={graphs} B={B}: round {wall:.3f} ms, thread CPU {statistics.median(cpus):.3f} ms, "
                  f"GPU forward {gpu_ms:.4f} ms", flush=True)
    prog.graphs_enabled = True
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
    device = args.device or default_device()
    cuda = device.startswith("cuda")
    hf = hf_baseline_on(args, cuda)
    env = env_record()
    print(f"env: {env}", flush=True)
    ceil = measure_ceilings(device)
    print_ceilings(ceil)
    bw, peak = ceil["copy_TBps"] * 1e12, ceil["matmul_8192_TFLOPs"] * 1e12
    rec = Recorder("decode", args.out, {"env": env, "ceilings": ceil, "device": device,
                                        "dtype": "bf16" if cuda else "fp32", "page_size": PAGE,
                                        "weights": "dummy (synthetic)", "identities": args.identity,
                                        "ctx": args.ctx, "batches": args.batches,
                                        "max_model_len": model_len(args.max_model_len, args.ctx)})
    if args.host_overhead and cuda:
        run_step(rec, args.step_timeout, "host overhead", lambda: host_overhead_rows(rec))
        free_model(device)
    for ident in args.identity:
        run_step(rec, args.step_timeout, f"{ident} decode",
                 lambda: run_identity(ident, args.ctx, bw, args.reps, not args.no_ref, device=device,
                                      batches=args.batches, prefill_ref_gdn=args.prefill_ref_gdn, on_row=rec.add,
                                      max_model_len=args.max_model_len))
        free_model(device)              # NOTE: each step's model is freed here, however the step ended
        if hf:
            run_step(rec, args.step_timeout, f"{ident} transformers baseline",
                     lambda: hf_baseline(ident, min(args.ctx), args.hf_batches, args.reps, bw, device, on_row=rec.add))
            free_model(device)
    results = rec.results
    print()
    rows = [[r["graphs"], r["batch"], r["round_ms"], r["cpu_ms"], r["gpu_forward_ms"], r["host_ms"]]
            for r in results if r["kind"] == "host"]
    if rows:
        print_table(["graphs", "B", "round_ms", "thread_cpu_ms", "gpu_fwd_ms", "host_ms"], rows)
        print()
    rows = []
    for r in results:
        if r["kind"] in ("decode", "hf_decode"):
            rows.append([r["identity"], r["ops"], r["graphs"], r["ctx"], r["batch"], r["step_ms"], r["floor_ms"],
                         r["step_ms"] / r["floor_ms"], 1000 * r["batch"] / r["step_ms"]])
    print_table(["identity", "ops", "graphs", "ctx", "B", "step_ms", "floor_ms", "x_floor", "tok/s"], rows)
    print()
    loops = {}
    for r in results:
        if r["kind"] == "loop":
            loops.setdefault((r["identity"], r["ctx"], r["batch"]), {}).setdefault(r["step_ahead"], []).append(r["round_ms"])
    rows = [[i, c, b, min(v.get(False, [float("nan")])), min(v.get(True, [float("nan")]))]
            for (i, c, b), v in loops.items()]
    if rows:
        print_table(["identity", "ctx", "B", "loop_ms (step-ahead off)", "loop_ms (on)"], rows)
        print()
    rows = [[r["identity"], r["ctx"], r["first_ms"], r["median_ms"], r["gemm_flops"] / peak * 1e3,
             r["median_ms"] / (r["gemm_flops"] / peak * 1e3)] for r in results if r["kind"] == "prefill"]
    print_table(["identity", "prompt", "prefill_first_ms", "prefill_median_ms", "floor_ms", "x_floor"], rows)
    rec.finish()
    return 1 if rec.errors and not rec.results else 0


def host_overhead_rows(rec: Recorder) -> list[dict]:
    rows = host_overhead()
    rec.add(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/decode.py", description=__doc__.split("\n\n")[0])
    add_args(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
