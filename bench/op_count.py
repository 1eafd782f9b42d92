"""Host-side op count of one decode round through the Program (a proxy for eager launch overhead).

    PYTHONPATH=$PWD python bench/op_count.py [--identity qwen3_6-tiny-dense] [--device cpu] [--batch 1]

Counts the top-level aten calls of one `Program.decode` + `abort_pending` round with torch.profiler,
and how many of them run inside `model.forward`. Synthetic weights; prints a table and one JSON line.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import env_record, json_line, print_table  # noqa: E402
from ninfer.contract.program import SamplingParams, SequenceRequest  # noqa: E402
from ninfer.targets.dummy_weights import DummyWeights  # noqa: E402
from ninfer.targets.qwen3_6.program.config import ProgramConfig  # noqa: E402


def _inside(e, name: str) -> bool:
    while e.cpu_parent is not None:
        e = e.cpu_parent
        if e.name == name:
            return True
    return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--identity", default="qwen3_6-tiny-dense")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    dt = torch.float32 if args.device == "cpu" else torch.bfloat16
    w = DummyWeights(args.identity, device=args.device, dtype=dt)
    prog = importlib.import_module(w.package.module).create_program(
        w, ProgramConfig(device=args.device, dtype=dt, page_size=16, num_pages=64, num_slots=args.batch))
    hs = []
    for r in range(args.batch):
        req = SequenceRequest(prompt_token_ids=tuple(range(1 + r, 40 + r)), max_output_tokens=8,
                              sampling=SamplingParams(temperature=0.0))
        h = prog.start_materialize(prog.plan_materialize(req)).sequence
        step = prog.prefill(h, 100)
        prog.commit(step.pending, [1])
        hs.append(h)
    prog.abort_pending(prog.decode(hs))                       # warm-up
    forward = prog.model.forward

    def traced(fb):
        with record_function("model.forward"):
            return forward(fb)

    prog.model.forward = traced
    with profile(activities=[ProfilerActivity.CPU]) as p:
        prog.abort_pending(prog.decode(hs))
    top = [e for e in p.events() if e.name.startswith("aten::")
           and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    inside = sum(1 for e in top if _inside(e, "model.forward"))
    L = w.dims.num_hidden_layers
    print_table(["identity", "ops", "device", "B", "layers", "aten_calls", "in_forward", "per_layer"],
                [[args.identity, prog.model.ops.name, args.device, args.batch, L, len(top), inside, inside / L]])
    json_line("op_count", {"env": env_record(), "identity": args.identity, "ops": prog.model.ops.name,
                           "device": args.device, "batch": args.batch, "aten_calls": len(top),
                           "in_forward": inside, "layers": L})
    return 0


if __name__ == "__main__":
    sys.exit(main())
