"""Program-level timing of speculative rounds with the MTP layer (a developer tool): what one round costs
against the plain decode step, and its parts, with synthetic weights, without the Engine.

    python3 bench/spec_step.py [--identity qwen3_6-27b qwen3_6-35b-a3b] [--k 3] [--ctx 1024]
        [--batches 1 4 8] [--reps 20] [--out DIR] [--step-timeout S]

Per identity one Program with speculative_method "mtp" and K = --k (its round graphs captured at start),
8 prompts of --ctx tokens prefilled. Then, per batch B, each timed with CUDA events (`graph_replay_ms`
over --reps replays; `bench_ms` for the plain step), all at the same context (nothing is committed):
  plain     the plain decode graph of B (cuda_graphs.DecodeGraphs, captured here on the same Program): one
            token per row, the reference a round is compared with
  draft     the K chained MTP steps alone (a graph of their part of spec_graphs.round_body)
  verify    the verify forward of K+1 tokens per row and its lm_head alone (a graph of that part)
  round     `decode(rows)` + `abort_pending`: the round graph, the host's wait and acceptance (host clock)
and the serving loop: `decode` + `commit` back to back with every row keeping exactly L tokens per round
(`force_accept_len` = L, L = 1..K+1), ms per round; TPOT = ms per round / L.

Prints tables and one JSON line (`bench`: spec_step); --out DIR also writes DIR/spec_step.json.
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

from ninfer.bench.common import (Recorder, bench_ms, decode_floor_ms, free_model, graph_replay_ms,  # noqa: E402
                                 measure_ceilings, print_table, run_step, start_run)
from ninfer.contract.program import SamplingParams, SequenceRequest  # noqa: E402
from ninfer.targets.dummy_weights import DummyWeights  # noqa: E402
from ninfer.targets.qwen3_6.program.config import ProgramConfig  # noqa: E402
from ninfer.targets.qwen3_6.program.cuda_graphs import DecodeGraphs  # noqa: E402
from ninfer.targets.registry import lookup  # noqa: E402

PAGE = 64
LOOP_ROUNDS = 24


def _capture(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


def spec_identity(identity: str, K: int, ctx: int, batches: list[int], reps: int, bw: float, on_row,
                  draft_vocab: int = 0) -> list[dict]:
    budget = len(batches) * LOOP_ROUNDS * (K + 1) * (K + 2) // 2 + 64     # the loops' commits, every B
    cfg = ProgramConfig(device="cuda", dtype="bf16", page_size=PAGE,
                        num_pages=8 * ((ctx + budget + K) // PAGE + 2) + 16, num_slots=8,
                        max_model_len=ctx + budget + K + 64, max_batch=8, max_steps=K + 1,
                        speculative_method="mtp", num_speculative_tokens=K, draft_vocab_size=draft_vocab)
    t0 = time.perf_counter()
    w = DummyWeights(identity, device="cuda", dtype=torch.bfloat16, seed=0)
    prog = importlib.import_module(lookup(identity).module).create_program(w, cfg)
    torch.cuda.synchronize()
    print(f"[{identity}] Program with MTP K={K}, draft vocabulary {prog.drafter.vocab} created in "
          f"{time.perf_counter() - t0:.1f} s (round graphs B=1..8 captured in {prog.spec_graphs.capture_s:.1f} s); "
          f"GPU memory "
          f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB", flush=True)
    plain = DecodeGraphs(prog.model, prog._state, max(batches), cfg.max_model_len, PAGE, torch.device("cuda"))
    plain.capture()
    rng = torch.Generator().manual_seed(1)
    greedy = SamplingParams(temperature=0.0)
    handles = []
    for _ in range(max(batches)):
        prompt = tuple(torch.randint(0, w.dims.vocab_size, (ctx,), generator=rng).tolist())
        h = prog.start_materialize(prog.plan_materialize(
            SequenceRequest(prompt, budget, greedy, lookahead=prog.lookahead))).sequence
        st = prog.prefill(h, ctx)
        prog.commit(st.pending, [1])
        handles.append(h)
    out = []
    model, state, T = prog.model, prog._state, K + 1
    for B in batches:
        seqs = [prog._seq(h) for h in handles[:B]]
        for s in seqs:
            s.holding.table.ensure(s.frontier + T)
        ph = state.phys
        scratch = prog._pending.hold(B * T)
        try:
            dst = [ph(state.scratch_entry(e)) for e in scratch]
            src = [ph(s.slot) for s in seqs]
            tables = [s.holding.table.pages for s in seqs]
            last = [s.tokens[-1] for s in seqs]
            front = [s.frontier for s in seqs]
            plain_ms = bench_ms(lambda: plain.run(last, front, src, dst[:B], tables))
            # the round graph's own inputs, then its draft part and its verify part as graphs of their own
            g = prog.spec_graphs._graphs[B]
            g.fill(last, front, src, dst, tables)
            g.copy_in()
            plane = state.planes["mtp_hidden"][0]
            vocab = prog.drafter.vocab
            drafts_buf = torch.zeros(B, K, dtype=torch.long, device="cuda")

            def draft():
                anchor = plane.index_select(0, g.src)
                drafts_buf.copy_(model.mtp_draft_chain(anchor, g.last, g.frontier - 1, g.block_tables, g.rows, K,
                                                       vocab))

            def verify():
                ids = torch.cat([g.last[:, None], drafts_buf], dim=1).flatten()
                pos = (g.frontier[:, None] + g.offsets[None, :]).flatten()
                hidden = model.verify_static(ids, pos, g.token_rows, g.src, g.dst.view(B, T), g.block_tables)
                model.logits(hidden)

            draft_ms = graph_replay_ms(_capture(draft), n=reps)
            verify_ms = graph_replay_ms(_capture(verify), n=reps)
        finally:
            prog._pending.unhold(scratch)
        times = []
        hs = handles[:B]
        for i in range(3 + reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            batch = prog.decode(hs)
            torch.cuda.synchronize()
            if i >= 3:
                times.append((time.perf_counter() - t0) * 1e3)
            prog.abort_pending(batch)
        round_ms = statistics.median(times)
        floor = decode_floor_ms(w.dims, B, ctx, bw / 1e12, 2)
        row = dict(identity=identity, kind="parts", K=K, draft_vocab=prog.drafter.vocab, ctx=ctx, batch=B,
                   plain_ms=plain_ms, draft_ms=draft_ms, draft_ms_per_token=draft_ms / K, verify_ms=verify_ms,
                   round_ms=round_ms, floor_ms=floor,
                   verify_x_plain=verify_ms / plain_ms, round_x_plain=round_ms / plain_ms)
        out.append(row)
        on_row(row)
        print(f"[{identity}] B={B}: plain {plain_ms:.3f} ms, draft {draft_ms:.3f} ({draft_ms / K:.3f}/token), verify "
              f"{verify_ms:.3f} ({verify_ms / plain_ms:.2f}x plain), round {round_ms:.3f} "
              f"({round_ms / plain_ms:.2f}x plain), floor {floor:.3f}", flush=True)
        for L in range(1, K + 2):
            prog.force_accept_len = L
            torch.cuda.synchronize()
            for i in range(LOOP_ROUNDS):
                if i == 4:
                    t0 = time.perf_counter()
                batch = prog.decode(hs)
                prog.commit(batch, [r.produced_tokens for r in batch.rows])
            ms = (time.perf_counter() - t0) * 1e3 / (LOOP_ROUNDS - 4)
            row = dict(identity=identity, kind="loop", K=K, draft_vocab=prog.drafter.vocab, ctx=ctx, batch=B,
                       accept_len=L, round_ms=ms,
                       tpot_ms=ms / L, plain_ms=plain_ms)
            out.append(row)
            on_row(row)
            print(f"[{identity}] B={B} L={L}: loop {ms:.3f} ms/round, TPOT {ms / L:.3f} ms "
                  f"(plain step {plain_ms:.3f})", flush=True)
        prog.force_accept_len = 0
    for h in handles:
        prog.release(h)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--identity", nargs="+", default=["qwen3_6-27b", "qwen3_6-35b-a3b"])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--draft-vocab", type=int, nargs="+", default=[0],
                    help="draft vocabulary sizes to run (0 = the whole vocabulary), one Program each")
    ap.add_argument("--out", default=None)
    ap.add_argument("--step-timeout", type=float, default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("spec_step: needs CUDA", file=sys.stderr)
        return 2
    env, ceil = start_run(lambda: measure_ceilings("cuda"))
    rec = Recorder("spec_step", args.out, {"env": env, "ceilings": ceil, "k": args.k, "ctx": args.ctx,
                                           "batches": args.batches, "weights": "dummy (synthetic)"})
    for ident in args.identity:
        for dv in args.draft_vocab:
            run_step(rec, args.step_timeout, f"{ident} spec (draft vocabulary {dv or 'all'})",
                     lambda: spec_identity(ident, args.k, args.ctx, args.batches, args.reps,
                                           ceil["copy_TBps"] * 1e12, rec.add, dv))
            free_model("cuda")
    rows = [[r["identity"], r["draft_vocab"], r["batch"], r["plain_ms"], r["draft_ms_per_token"], r["verify_ms"],
             r["verify_x_plain"],
             r["round_ms"], r["round_x_plain"]] for r in rec.results if r["kind"] == "parts"]
    print()
    print_table(["identity", "draft_vocab", "B", "plain_ms", "draft_ms/tok", "verify_ms", "verify/plain", "round_ms",
                 "round/plain"], rows)
    rows = [[r["identity"], r["draft_vocab"], r["batch"], r["accept_len"], r["round_ms"], r["tpot_ms"]]
            for r in rec.results if r["kind"] == "loop"]
    print()
    print_table(["identity", "draft_vocab", "B", "accept_len", "loop ms/round", "TPOT ms"], rows)
    rec.finish()
    return 1 if rec.errors and not rec.results else 0


if __name__ == "__main__":
    sys.exit(main())
