"""Where the wall time of one graph decode round goes beyond the graph replay: per identity and B, the
replay alone (CUDA events), the whole `Program.decode` round (host wall, synchronized), and the host
functions of a few rounds under torch.profiler (CPU self time, top entries); with programmatic
dependent launch on and off (graphs re-captured in the same process), and the host time of the
replay call alone. The replay is timed after one round, so the graph's static inputs hold that
round's tokens, pages and state entries (right after capture they hold B copies of token 0: at
B > 1 the MoE then reads one row's experts, which made the 35B B=8 replay ~1.5 ms too fast).

    PYTHONPATH=$PWD python3 bench/decode_round.py --identity qwen3_6-35b-a3b --batches 1 8
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from ninfer.contract.program import SamplingParams, SequenceRequest
from ninfer.bench.common import graph_replay_ms
from ninfer.targets.dummy_weights import DummyWeights
from ninfer.targets.qwen3_6.program.config import ProgramConfig
from ninfer.targets.qwen3_6.program.cuda_graphs import DecodeGraphs

from bench.round_timeline import timed


def rounds_ms(prog, hs, n: int = 25) -> float:
    ts = []
    for i in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        b = prog.decode(hs)
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
        prog.abort_pending(b)
    return statistics.median(ts[5:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--identity", nargs="+", default=["qwen3_6-35b-a3b"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    from ninfer.ops.triton import _pdl
    for ident in a.identity:
        w = DummyWeights(ident, device="cuda", dtype=torch.bfloat16, seed=1)
        pkg = importlib.import_module(w.package.module)
        cfg = ProgramConfig(device="cuda", dtype="bf16", page_size=64, num_pages=64, num_slots=8,
                            max_model_len=1088, max_batch=max(a.batches), max_steps=1)
        prog = pkg.create_program(w, cfg)
        hs = []
        for r in range(max(a.batches)):
            req = SequenceRequest(prompt_token_ids=tuple(range(10 + r, 74 + r)), max_output_tokens=64,
                                  sampling=SamplingParams(temperature=0.0))
            h = prog.start_materialize(prog.plan_materialize(req)).sequence
            st = prog.prefill(h, 64)
            prog.commit(st.pending, [1])
            hs.append(h)
        first = _pdl.enabled()
        graphs = {first: prog.graphs}
        os.environ["NINFER_PDL"] = "0" if first else "1"
        _pdl.enabled.cache_clear()
        other = DecodeGraphs(prog.model, prog._state, cfg.max_batch, cfg.max_model_len, cfg.page_size,
                             torch.device("cuda"))
        other.capture()
        graphs[_pdl.enabled()] = other
        for B in a.batches:
            for pdl in (True, False):
                prog.graphs = graphs[pdl]
                prog.abort_pending(prog.decode(hs[:B]))          # the round's inputs into the static buffers
                g = prog.graphs._graphs[B].graph
                rep = graph_replay_ms(g)
                rnd = rounds_ms(prog, hs[:B])
                host = timed(g.replay, n=20)                     # the replay call alone, GPU idle before
                print(f"[{ident} B={B} PDL={pdl}] replay {rep:.3f} ms, decode round {rnd:.3f} ms, "
                      f"round - replay {rnd - rep:.3f} ms, replay call on the host {host:.3f} ms", flush=True)
            prog.graphs = graphs[first]
            with profile(activities=[ProfilerActivity.CPU]) as p:
                for _ in range(5):
                    b = prog.decode(hs[:B])
                    prog.abort_pending(b)
                torch.cuda.synchronize()
            print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.top), flush=True)
        prog.graphs = graphs[first]
        del prog, w, graphs, other
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
