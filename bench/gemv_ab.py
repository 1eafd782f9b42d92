"""In-process A/B of the GEMV decision tables on the real decode step: one Program (synthetic weights)
per identity; for each variant the tables are rewritten, a fresh set of decode graphs is captured, and
the variants' replays and rounds are timed interleaved (variant order repeated `--reps` times), so
machine and process drift (0.2-0.5 ms between processes, bench/NOTES.md pass 5) falls on every
variant alike. Each variant's logits are checked against the committed tables' (relative RMS).

Variants (M=1 rows of the tables only; other rows untouched):
  base      the committed tables (plus $NINFER_GEMV_CONFIGS, read at import)
  early_pf  `early` on the rows whose config already prefetches
  early     `early` on every FMA row (prefetch implied)
  gated     the gated RMSNorm folded into the GDN out-projection (USE_TRITON_GATED on 5120x6144 /
            2048x4096 with the committed config)
  gated_early_pf   both

Also the wall time of a decode round split at the graph launch and the sampler (host stamps), to
name the round's time over the replay.

    PYTHONPATH=$PWD python3 bench/gemv_ab.py --identity qwen3_6-27b qwen3_6-35b-a3b
"""
from __future__ import annotations

import argparse
import importlib
import statistics

import torch

from ninfer.bench.common import graph_replay_ms
from ninfer.ops.fast import gemv as G
from ninfer.runtime.contract.types import SamplingParams, SequenceRequest
from ninfer.targets.dummy_weights import DummyWeights
from ninfer.targets.qwen3_6.runtime.config import ProgramConfig
from ninfer.targets.qwen3_6.runtime.cuda_graphs import DecodeGraphs

from bench.decode_round import rounds_ms
from bench.round_timeline import idle_replay_ms, round_breakdown

TABLES = (G.CONFIGS, G.USE_TRITON, G.USE_TRITON_SWIGLU, G.USE_TRITON_GATED)
GDN_OUT = ((5120, 6144, 1), (2048, 4096, 1))


def _set_early(pred) -> None:
    for key, c in list(G.CONFIGS.items()):
        cfg = G.GemvConfig(*c)
        if key[2] == 1 and not cfg.dot and pred(cfg):
            G.CONFIGS[key] = tuple(cfg._replace(prefetch=True, early=True))


def _gated() -> None:
    for key in GDN_OUT:
        G.USE_TRITON_GATED[key] = True


VARIANTS = {
    "base": lambda: None,
    "early_pf": lambda: _set_early(lambda c: c.prefetch),
    "early": lambda: _set_early(lambda c: True),
    "gated": _gated,
    "gated_early_pf": lambda: (_gated(), _set_early(lambda c: c.prefetch)),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--identity", nargs="+", default=["qwen3_6-27b"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    snapshot = [dict(t) for t in TABLES]

    def tables(name: str) -> None:
        for t, s in zip(TABLES, snapshot):
            t.clear()
            t.update(s)
        VARIANTS[name]()

    B = a.batch
    for ident in a.identity:
        w = DummyWeights(ident, device="cuda", dtype=torch.bfloat16, seed=1)
        pkg = importlib.import_module(w.package.module)
        cfg = ProgramConfig(device="cuda", dtype="bf16", page_size=64, num_pages=64, num_slots=8,
                            max_model_len=1088, max_batch=B, max_steps=1)
        tables("base")
        prog = pkg.create_program(w, cfg)
        graphs, logits = {}, {}
        for v in a.variants:        # captured before any sequence exists (the warm-up writes KV at page 0)
            tables(v)
            graphs[v] = DecodeGraphs(prog.model, prog._state, B, cfg.max_model_len, cfg.page_size,
                                     torch.device("cuda"))
            graphs[v].capture()
        tables("base")
        hs = []
        for r in range(B):
            req = SequenceRequest(prompt_token_ids=tuple(range(10 + r, 1010 + r)), max_output_tokens=64,
                                  sampling=SamplingParams(temperature=0.0))
            h = prog.start_materialize(prog.plan_materialize(req)).sequence
            st = prog.prefill(h, 1000)
            prog.commit(st.pending, [1])
            hs.append(h)
        for v in a.variants:
            prog.graphs = graphs[v]
            b, lg = prog.decode_with_logits(hs)
            prog.abort_pending(b)
            logits[v] = lg.float()
        ref = logits["base"]
        res = {v: {"replay": [], "round": []} for v in a.variants}
        for _ in range(a.reps):
            for v in a.variants:
                prog.graphs = graphs[v]
                prog.abort_pending(prog.decode(hs))          # this round's inputs into the static buffers
                g = graphs[v]._graphs[B].graph
                res[v]["replay"].append(graph_replay_ms(g, n=30))
                res[v]["round"].append(rounds_ms(prog, hs, 15))
        print(f"[{ident} B={B} ctx 1000] variant: replay median (min..max of {a.reps} reps) | round median | "
              f"logits rel RMS vs base", flush=True)
        for v in a.variants:
            rp, rd = res[v]["replay"], res[v]["round"]
            err = ((logits[v] - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
            same = bool((logits[v].argmax(-1) == ref.argmax(-1)).all())
            print(f"  {v:16s} replay {statistics.median(rp):7.3f} ms ({min(rp):.3f}..{max(rp):.3f}) | "
                  f"round {statistics.median(rd):7.3f} ms | rel RMS {err:.2e} argmax same {same}", flush=True)
        prog.graphs = graphs["base"]
        g = graphs["base"]._graphs[B].graph
        prog.abort_pending(prog.decode(hs))
        bd = round_breakdown(prog, hs)
        print(f"[{ident} B={B}] round breakdown (ms, medians): " +
              ", ".join(f"{k} {v:.3f}" for k, v in bd.items()) +
              f"; replay {graph_replay_ms(g):.3f}, replay+sync from idle (host) {idle_replay_ms(g):.3f}", flush=True)
        del prog, w, graphs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
