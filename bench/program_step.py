"""Program-level step timing (a developer tool): the decode step and the prefill TTFT of one identity's
Program, with synthetic weights, without the Engine. `ninfer bench decode|prefill` time the same work
through the public Engine; this script times the Program's own calls, for A/Bs of the model code.

    python3 bench/program_step.py decode  [--identity qwen3_6-27b qwen3_6-35b-a3b] [--lengths 1024 8192]
        [--batches 1 2 4 8] [--reps 10] [--max-model-len N] [--no-ref] [--prefill-ref-gdn] [--device cuda|cpu]
    python3 bench/program_step.py prefill [--identity ...] [--lengths 1024 8192 32768] [--reps 3] [--long-reps 1]
        [--chunk 0] [--enforce-eager] [--device cuda|cpu]
    (both: [--out DIR] [--step-timeout S]; --ctx is --lengths and --batch is --batches for `decode`)

The Program comes from the identity's package (`ninfer.targets.registry.lookup(identity).module`, its
`create_program`) over `DummyWeights` (seed 0), with the family's `ProgramConfig`; everything runs
through the Program protocol (ninfer/contract/program.py) and the Program's documented benchmark
switches (`graphs_enabled`, `step_ahead_enabled`, `step_ahead_counts`, `model.ops`).

decode, per context length: 8 prompts are materialized and prefilled one by one (their prefill times
are reported: the first apart, the median of the others). Then per batch B one decode round =
`decode(rows)` followed by `abort_pending`, so every round runs at the same context: host wall clock
around each round with a device synchronize before and after, median of --reps after 3 warm-ups;
graphs off (eager) and on, and at the smallest length (unless --no-ref) the reference ops at B = 1 and
8. Then the serving loop at the smallest and largest B: `decode` + `commit` back to back with the
decode step-ahead off and on (ms per round from the start of round 4 to the return of the last).
--prefill-ref-gdn prefills with the PyTorch chunk delta rule (skips fla's first-call compile).

prefill, per prompt length L: a fresh random prompt; `plan_materialize` + `start_materialize`, then
`prefill` until the prompt is consumed (in one call, or in --chunk-token stages), which samples the
first token; then `commit` and `release`. Host wall clock around it, synchronized. One untimed warm-up
prompt per chunk configuration first; the first timed repetition is reported apart, the median of
the others is the TTFT; lengths > 8192 run --long-reps times.

Floors as `ninfer bench` prints them (ninfer/bench/common.py). Prints tables and one JSON line
(`bench`: program_step_decode | program_step_prefill); --out DIR also writes DIR/<bench>.json.
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from ninfer.bench.args import MAX_BATCH, float_in, int_in  # noqa: E402
from ninfer.bench.common import (Recorder, decode_floor_ms, default_device, free_model,  # noqa: E402
                                 measure_ceilings, prefill_flops, print_prefill_rows, print_table, run_step,
                                 start_run, sync)
from ninfer.contract.program import Refusal, SamplingParams, SequenceRequest  # noqa: E402
from ninfer.ops.opset import reference_ops  # noqa: E402
from ninfer.targets.dummy_weights import DummyWeights  # noqa: E402
from ninfer.targets.qwen3_6.program.config import ProgramConfig  # noqa: E402
from ninfer.targets.registry import lookup  # noqa: E402

PAGE = 64
LOOP_BUDGET = 512        # output tokens each decode row may commit (the serving-loop rounds commit theirs)


def create(identity: str, device: str, cfg: ProgramConfig):
    """(Program, weights) of the identity's package over synthetic weights (bf16 on CUDA, fp32 on the CPU)."""
    dt = torch.bfloat16 if device.startswith("cuda") else torch.float32
    w = DummyWeights(identity, device=device, dtype=dt, seed=0)
    return importlib.import_module(lookup(identity).module).create_program(w, cfg), w


def greedy_request(prompt: tuple[int, ...], max_output_tokens: int) -> SequenceRequest:
    return SequenceRequest(prompt_token_ids=prompt, max_output_tokens=max_output_tokens,
                           sampling=SamplingParams(temperature=0.0))


# ---------------------------------------------------------------------------------------------
# decode
# ---------------------------------------------------------------------------------------------
def model_len(requested: int, ctxs: list[int]) -> int:
    """The Program's max_model_len (the decode graphs' block-table width): `requested` (--max-model-len),
    at least the largest context + 64 (the serving-loop rounds commit tokens within what is left)."""
    return max(requested, max(ctxs) + 64)


def decode_identity(identity: str, ctxs: list[int], bw: float, reps: int, ref_compare: bool, device: str,
                    batches: list[int], prefill_ref_gdn: bool = False, on_row=None,
                    max_model_len: int = 0) -> list[dict]:
    cuda = device.startswith("cuda")
    pages = sum(8 * ((c + LOOP_BUDGET) // PAGE + 2) for c in ctxs) + 16
    # max_steps 1: each round is one step per row; the Program adds the step-ahead's entries itself.
    cfg = ProgramConfig(device=device, dtype="bf16" if cuda else "fp32", page_size=PAGE, num_pages=pages,
                        num_slots=8 * len(ctxs), max_model_len=model_len(max_model_len, ctxs), max_batch=8,
                        max_steps=1)
    t0 = time.perf_counter()
    prog, w = create(identity, device, cfg)
    sync(device)
    load_s = time.perf_counter() - t0
    dims = w.dims
    cap = prog.graphs.capture_s if prog.graphs is not None else 0.0
    print(f"[{identity}] synthetic weights generated and Program created in {load_s:.1f} s "
          f"(of which decode graph capture B=1..8: {cap:.1f} s); ops={prog.model.ops.name}; max_model_len "
          f"{cfg.max_model_len}; GPU memory {(torch.cuda.memory_allocated() if cuda else 0) / 2**30:.1f} GiB",
          flush=True)
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
            h = prog.start_materialize(prog.plan_materialize(greedy_request(prompt, budget))).sequence
            sync(device)
            t0 = time.perf_counter()
            step = prog.prefill(h, ctx)
            sync(device)
            pre_ms.append((time.perf_counter() - t0) * 1e3)
            prog.commit(step.pending, [1])
            handles.append(h)
        prog.model.ops = main_ops
        print(f"[{identity}] ctx {ctx}: prefill ms per prompt {[round(x, 1) for x in pre_ms]}", flush=True)
        out.append(dict(identity=identity, kind="prefill", ctx=ctx, first_ms=pre_ms[0],
                        median_ms=statistics.median(pre_ms[1:]), gemm_flops=prefill_flops(dims, ctx)))
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
                    sync(device)
                    t0 = time.perf_counter()
                    batch = prog.decode(hs)
                    sync(device)
                    dt = time.perf_counter() - t0
                    prog.abort_pending(batch)
                    if i >= 3:
                        times.append(dt * 1e3)
                # from the dimension facts (the view's fused matrices and their row views would count twice)
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
    sync in between), graphs on, with the decode step-ahead off and on; ms per round = wall from the
    start of round 4 to the return of the last / the rounds timed (up to 3 x reps). Largest B first:
    rows past B are released (a step-ahead is launched only when every live sequence is in the round).
    budget: the rows' max_output_tokens (the rounds commit within it)."""
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
            # timed to the last round's return, not to a device sync: the step that round launched ahead
            # is never adopted here, and waiting for it would add a whole step to the rounds.
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


def run_decode(args: argparse.Namespace) -> int:
    device = args.device or default_device()
    cuda = device.startswith("cuda")
    env, ceil = start_run(lambda: measure_ceilings(device))
    bw, peak = ceil["copy_TBps"] * 1e12, ceil["matmul_8192_TFLOPs"] * 1e12
    rec = Recorder("program_step_decode", args.out,
                   {"env": env, "ceilings": ceil, "device": device, "dtype": "bf16" if cuda else "fp32",
                    "page_size": PAGE, "weights": "dummy (synthetic)", "identities": args.identity,
                    "ctx": args.lengths, "batches": args.batches,
                    "max_model_len": model_len(args.max_model_len, args.lengths)})
    for ident in args.identity:
        run_step(rec, args.step_timeout, f"{ident} decode",
                 lambda: decode_identity(ident, args.lengths, bw, args.reps, not args.no_ref, device,
                                         args.batches, args.prefill_ref_gdn, rec.add, args.max_model_len))
        free_model(device)
    results = rec.results
    print()
    rows = [[r["identity"], r["ops"], r["graphs"], r["ctx"], r["batch"], r["step_ms"], r["floor_ms"],
             r["step_ms"] / r["floor_ms"], 1000 * r["batch"] / r["step_ms"]] for r in results if r["kind"] == "decode"]
    print_table(["identity", "ops", "graphs", "ctx", "B", "step_ms", "floor_ms", "x_floor", "tok/s"], rows)
    print()
    loops: dict = {}
    for r in results:
        if r["kind"] == "loop":
            loops.setdefault((r["identity"], r["ctx"], r["batch"]), {}).setdefault(r["step_ahead"], []).append(
                r["round_ms"])
    rows = [[i, c, b, min(v.get(False, [float("nan")])), min(v.get(True, [float("nan")]))]
            for (i, c, b), v in loops.items()]
    if rows:
        print_table(["identity", "ctx", "B", "loop_ms (step-ahead off)", "loop_ms (on)"], rows)
        print()
    print_prefill_rows(results, peak)
    rec.finish()
    return 1 if rec.errors and not rec.results else 0


# ---------------------------------------------------------------------------------------------
# prefill
# ---------------------------------------------------------------------------------------------
def prefill_once(prog, prompt: tuple[int, ...], chunk: int, device: str, prefix: int = 0) -> float:
    """ms from materialize to the first sampled token; the sequence is released afterwards. prefix > 0:
    a first stage of that many tokens runs untimed, and the clock starts after it (a stage over a cached
    prefix: a chat's next turn)."""
    sync(device)
    t0 = time.perf_counter()
    plan = prog.plan_materialize(greedy_request(prompt, 2))
    if isinstance(plan, Refusal):
        raise RuntimeError(f"prompt of {len(prompt)} tokens refused: {plan.reason}")
    h = prog.start_materialize(plan).sequence
    step = None
    try:
        if prefix:
            prog.prefill(h, prefix)
            sync(device)
            t0 = time.perf_counter()
        while True:
            step = prog.prefill(h, chunk or len(prompt))
            if step.pending is not None:
                break
        sync(device)
        ms = (time.perf_counter() - t0) * 1e3
        prog.commit(step.pending, [1])
    finally:
        # a step timeout can interrupt the prefill; give the sequence back so later lengths fit.
        if step is not None and step.pending is not None and not step.pending.consumed:
            prog.abort_pending(step.pending)
        prog.release(h)
    return ms


def warmup_lengths(lengths: list[int], chunk: int) -> list[int]:
    """One prompt length per chunk configuration among `lengths`: a single stage (L <= chunk, or chunk 0)
    warms with the shortest such L; staged prefill (L > chunk) with the shortest such L capped at two
    stages (first stage, then a stage over cached pages)."""
    single = [L for L in lengths if not chunk or L <= chunk]
    staged = [L for L in lengths if chunk and L > chunk]
    return ([min(single)] if single else []) + ([min(min(staged), 2 * chunk)] if staged else [])


def prefill_identity(identity: str, lengths: list[int], reps: int, long_reps: int, chunk: int,
                     peak: tuple[float, float], device: str, rec: Recorder, step_timeout: float | None,
                     enforce_eager: bool = False) -> None:
    cuda = device.startswith("cuda")
    max_len = max(lengths)
    cfg = ProgramConfig(device=device, dtype="bf16" if cuda else "fp32", page_size=PAGE,
                        num_pages=max_len // PAGE + 8, num_slots=2, max_model_len=max_len + 16, max_batch=1,
                        max_steps=1, enforce_eager=enforce_eager)
    t0 = time.perf_counter()
    prog, w = create(identity, device, cfg)
    sync(device)
    dims = w.dims
    print(f"[{identity}] synthetic weights generated and Program created in {time.perf_counter() - t0:.1f} s; "
          f"ops={prog.model.ops.name}", flush=True)
    wrng = torch.Generator().manual_seed(1)
    t0 = time.perf_counter()
    for L in warmup_lengths(lengths, chunk):
        prompt = tuple(torch.randint(0, dims.vocab_size, (L,), generator=wrng).tolist())
        ms = prefill_once(prog, prompt, chunk, device)
        print(f"[{identity}] warm-up prompt {L} (chunk {chunk or L}): {ms / 1e3:.1f} s", flush=True)
    warmup_s = time.perf_counter() - t0
    print(f"[{identity}] warm-up (compiles, autotuning) {warmup_s:.1f} s", flush=True)
    rng = torch.Generator().manual_seed(0)
    for L in lengths:
        n = long_reps if L > 8192 else reps

        def measure(L=L, n=n) -> dict:
            times = []
            for _ in range(max(1, n)):
                prompt = tuple(torch.randint(0, dims.vocab_size, (L,), generator=rng).tolist())
                times.append(prefill_once(prog, prompt, chunk, device))
                print(f"[{identity}] prompt {L}: {times[-1]:.1f} ms", flush=True)
            ms = statistics.median(times[1:]) if len(times) > 1 else times[0]
            flops = prefill_flops(dims, L)
            return dict(identity=identity, kind="prefill", prompt=L, chunk=min(chunk or L, L), reps=len(times),
                        warmup_s=warmup_s, first_ms=times[0], ttft_ms=ms, tokens_per_s=L / ms * 1e3, flops=flops,
                        floor_ms=flops / peak[0] * 1e3, x_floor=ms / (flops / peak[0] * 1e3),
                        floor_sustained_ms=flops / peak[1] * 1e3 if peak[1] else None,
                        tflops=flops / (ms * 1e-3) / 1e12, all_ms=times)

        row = run_step(rec, step_timeout, f"{identity} prefill {L}", measure)
        if row is not None:
            rec.add(row)


def run_prefill(args: argparse.Namespace) -> int:
    device = args.device or default_device()
    cuda = device.startswith("cuda")
    env, ceil = start_run(lambda: measure_ceilings(device))
    peak = (ceil["matmul_8192_TFLOPs"] * 1e12, (ceil.get("matmul_sustained_TFLOPs") or 0.0) * 1e12)
    rec = Recorder("program_step_prefill", args.out,
                   {"env": env, "ceilings": ceil, "device": device, "dtype": "bf16" if cuda else "fp32", "batch": 1,
                    "page_size": PAGE, "weights": "dummy (synthetic)", "identities": args.identity,
                    "lengths": args.lengths, "enforce_eager": args.enforce_eager})
    lengths = sorted(args.lengths)
    for ident in args.identity:
        run_step(rec, None, f"{ident} prefill",
                 lambda: prefill_identity(ident, lengths, args.reps, args.long_reps, args.chunk, peak, device, rec,
                                          args.step_timeout, args.enforce_eager))
        free_model(device)
    print()
    rows = [[r["identity"], r["prompt"], r["chunk"], r["first_ms"], r["ttft_ms"], r["floor_ms"], r["x_floor"],
             r.get("floor_sustained_ms"), r["tokens_per_s"], r["tflops"]] for r in rec.results]
    print_table(["identity", "prompt", "chunk", "first_ms", "ttft_ms", "floor_ms", "x_floor", "floor_sustained_ms",
                 "prefill_tok/s", "TFLOP/s"], rows)
    rec.finish()
    return 1 if rec.errors and not rec.results else 0


# ---------------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bench/program_step.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", metavar="decode|prefill", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--identity", nargs="+", default=["qwen3_6-27b", "qwen3_6-35b-a3b"],
                        help="registered identities, synthetic weights")
        sp.add_argument("--device", default=None, help="cuda | cpu (default: cuda when available)")
        sp.add_argument("--out", default=None, metavar="DIR", help="also write <DIR>/<bench>.json")
        sp.add_argument("--step-timeout", type=float_in(0.0), default=0.0, metavar="S",
                        help="give up a step after S seconds (0 = none)")

    d = sub.add_parser("decode", help="decode step time per batch B and context length")
    common(d)
    d.add_argument("--lengths", "--ctx", dest="lengths", nargs="+", type=int_in(1), default=[1024, 8192],
                   help="context lengths")
    d.add_argument("--batches", "--batch", dest="batches", nargs="+", type=int_in(1, MAX_BATCH),
                   default=list(range(1, 9)))
    d.add_argument("--reps", type=int_in(1), default=10)
    d.add_argument("--max-model-len", type=int_in(0), default=0, metavar="N",
                   help="the Program's max_model_len (default: largest length + 64)")
    d.add_argument("--no-ref", action="store_true", help="skip the reference-ops comparison at the smallest length")
    d.add_argument("--prefill-ref-gdn", action="store_true",
                   help="prefill with the PyTorch chunk delta rule (skips fla's first-call compile)")
    p = sub.add_parser("prefill", help="TTFT of one prompt per length")
    common(p)
    p.add_argument("--lengths", nargs="+", type=int_in(1), default=[1024, 8192, 32768], help="prompt lengths")
    p.add_argument("--reps", type=int_in(1), default=3, help="repetitions per length <= 8192 (first one apart)")
    p.add_argument("--long-reps", type=int_in(1), default=1, help="repetitions per length > 8192")
    p.add_argument("--chunk", type=int_in(0, 65536), default=0, help="prefill stage size (0 = whole prompt)")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    for ident in args.identity:
        try:
            lookup(ident)
        except ValueError as e:
            ap.error(str(e))
    return run_decode(args) if args.what == "decode" else run_prefill(args)


if __name__ == "__main__":
    sys.exit(main())
