"""In-process A/B of decode-step variants on the real decode step: one Program (synthetic weights) per
identity; each variant gets its own set of decode graphs, captured with the variant applied, and the
variants' replays and rounds are timed interleaved (variant order repeated `--reps` times), so machine
and process drift (0.2-0.5 ms between processes, bench/NOTES.md pass 5) falls on every variant alike.
Each variant's logits are checked against the base graphs' (relative RMS, argmax).

A variant is a '+'-joined list of items, each either a `bench/gemv.py --out FILE` result overlaid on
the committed GEMV tables (`load_tuning`, what $NINFER_GEMV_CONFIGS does at import) or a built-in:
    post-mixer-nofold the post-mixer leaf (MoE, dense MLP) takes a materialised norm, returns the plain sum
    moe=A,B,C,...     the MoE decode tiles for one token (`ninfer.ops.triton.moe.DECODE_CONFIG`, DecodeConfig fields)
    op:NAME=FILE      the OpSet's op NAME replaced by the function NAME in the module file FILE (e.g. an
                      older tree's copy of a fast-op module: before/after of a kernel in one process)
    set:MOD.ATTR=V    module attribute MOD.ATTR set to the int V while the variant's graphs are captured
                      and run (a fusion switch read at call time, e.g. set:ninfer.ops.triton.gdn_decode.FUSE_NORM=0);
                      for a NamedTuple attribute V is its fields, e.g. set:ninfer.ops.triton.moe.PERSISTENT_CONFIG=1,512,4,8

    PYTHONPATH=$PWD python3 bench/step_ab.py --identity qwen3_6-35b-a3b --variants post-mixer-nofold F F+post-mixer-nofold

(Pass 6 used an earlier form of this script, bench/gemv_ab.py, to measure two GEMV folds since removed:
bench/NOTES.md.)
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import statistics

import torch

from ninfer.bench.common import graph_replay_ms
from ninfer.bench.kernels import rel_rms
from ninfer.ops.triton import gemv as G
from ninfer.ops.triton import moe as M
from ninfer.contract.program import SamplingParams, SequenceRequest
from ninfer.targets.dummy_weights import DummyWeights
from ninfer.targets.qwen3_6.program.config import ProgramConfig
from ninfer.targets.qwen3_6.program.cuda_graphs import DecodeGraphs

from bench.decode_round import rounds_ms

TABLES = (G.CONFIGS, G.USE_TRITON, G.USE_TRITON_SWIGLU)


@contextlib.contextmanager
def applied(spec: str, prog):
    """The variant `spec` in force (GEMV tables, module and leaf switches), undone on exit."""
    snapshot = [dict(t) for t in TABLES]
    leaf = prog.model.leaves.post_mixer
    saved = leaf.__dict__.get("folds_residual")
    ops = prog.model.ops
    moe_cfg = M.DECODE_CONFIG
    attrs = []                                   # (module, name, value before)
    try:
        for item in filter(None, spec.split("+")):
            if item == "post-mixer-nofold":
                leaf.folds_residual = False
            elif item.startswith("moe="):
                M.DECODE_CONFIG = M.DecodeConfig(*(int(v) for v in item[4:].split(",")))
            elif item.startswith("set:"):
                target, value = item[4:].split("=", 1)
                mod_name, attr = target.rsplit(".", 1)
                mod = importlib.import_module(mod_name)
                if not hasattr(mod, attr):
                    raise SystemExit(f"step_ab: {mod_name} has no attribute {attr}")
                attrs.append((mod, attr, getattr(mod, attr)))
                orig = attrs[-1][2]
                # a NamedTuple of ints (e.g. a tile config) takes V as comma-separated fields
                setattr(mod, attr, type(orig)(*map(int, value.split(","))) if isinstance(orig, tuple)
                        else float(value) if isinstance(orig, float) else type(orig)(int(value)))
            elif item.startswith("op:"):
                name, path = item[3:].split("=", 1)
                prog.model.ops = prog.model.ops._replace(**{name: getattr(module_from(path), name)})
            else:
                G.load_tuning(item)
        yield
    finally:
        for mod, attr, before in reversed(attrs):
            setattr(mod, attr, before)
        prog.model.ops = ops
        M.DECODE_CONFIG = moe_cfg
        for t, s in zip(TABLES, snapshot):
            t.clear()
            t.update(s)
        if saved is None:
            leaf.__dict__.pop("folds_residual", None)
        else:
            leaf.folds_residual = saved


def module_from(path: str):
    """The module in the file `path`, imported under a private name (its imports resolve as usual)."""
    spec = importlib.util.spec_from_file_location(f"step_ab_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--identity", nargs="+", default=["qwen3_6-27b"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--variants", nargs="+", required=True, metavar="SPEC",
                    help="'+'-joined bench/gemv.py --out files and built-ins (post-mixer-nofold, moe=..., op:NAME=FILE)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-model-len", type=int, default=1088, help="the block-table width of the decode graphs")
    a = ap.parse_args()
    B = a.batch
    for ident in a.identity:
        w = DummyWeights(ident, device="cuda", dtype=torch.bfloat16, seed=1)
        pkg = importlib.import_module(w.package.module)
        cfg = ProgramConfig(device="cuda", dtype="bf16", page_size=64, num_pages=max(64, 17 * B + 8), num_slots=8,
                            max_model_len=max(a.max_model_len, 1088), max_batch=B, max_steps=1)
        prog = pkg.create_program(w, cfg)
        graphs = {"base": prog.graphs}
        ops_of = {"base": prog.model.ops}
        for spec in a.variants:     # captured before any sequence exists (the warm-up writes KV at page 0)
            with applied(spec, prog):
                graphs[spec] = DecodeGraphs(prog.model, prog._state, B, cfg.max_model_len, cfg.page_size,
                                            torch.device("cuda"))
                graphs[spec].capture()
                # NOTE: a variant's rounds run with the op set its graphs were captured with: with any
                #       other, `DecodeGraphs.run` declines and the round runs eagerly, leaving the graph's
                #       static inputs at their capture values (context 1, one token copied to every row).
                ops_of[spec] = prog.model.ops
        hs = []
        for r in range(B):
            req = SequenceRequest(prompt_token_ids=tuple(range(10 + r, 1010 + r)), max_output_tokens=64,
                                  sampling=SamplingParams(temperature=0.0))
            h = prog.start_materialize(prog.plan_materialize(req)).sequence
            prog.commit(prog.prefill(h, 1000).pending, [1])
            hs.append(h)
        logits = {}
        for v, dg in graphs.items():
            prog.graphs, prog.model.ops = dg, ops_of[v]
            b, lg = prog.decode_with_logits(hs)
            prog.abort_pending(b)
            logits[v] = lg.float()
        res = {v: {"replay": [], "round": []} for v in graphs}
        for _ in range(a.reps):
            for v, dg in graphs.items():
                prog.graphs, prog.model.ops = dg, ops_of[v]
                replays = dg.replays
                prog.abort_pending(prog.decode(hs))          # this round's inputs into the static buffers
                assert dg.replays > replays, f"variant {v}: the round did not replay its graph"
                res[v]["replay"].append(graph_replay_ms(dg._graphs[B].graph, n=30))
                res[v]["round"].append(rounds_ms(prog, hs, 15))
        print(f"[{ident} B={B} ctx 1000 max_model_len {cfg.max_model_len}] variant: replay median (min..max of {a.reps} reps) | round median | "
              f"logits vs base", flush=True)
        ref = logits["base"]
        for v in graphs:
            rp, rd = res[v]["replay"], res[v]["round"]
            same = bool((logits[v].argmax(-1) == ref.argmax(-1)).all())
            print(f"  {v:24s} replay {statistics.median(rp):7.3f} ms ({min(rp):.3f}..{max(rp):.3f}) | "
                  f"round {statistics.median(rd):7.3f} ms | rel RMS {rel_rms(logits[v], ref):.2e}, "
                  f"argmax same {same}", flush=True)
        del prog, w, graphs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
