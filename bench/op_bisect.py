"""Which fast op moves a Program's logits away from the reference op set: a tiny identity (fp32,
synthetic weights) prefilled in two chunks and decoded three steps with (a) the reference OpSet,
(b) the fast OpSet, (c) the fast OpSet with one field swapped back to its reference, for every field.
Prints the relative RMS error of each variant against (a), largest first.

    PYTHONPATH=$PWD python3 bench/op_bisect.py [--identity qwen3_6-tiny-dense] [--std 0.2]
"""
from __future__ import annotations

import argparse
import importlib

import torch

from ninfer.ops.fast import fast_ops, reference_ops
from ninfer.runtime.contract.types import SamplingParams, SequenceRequest
from ninfer.targets.dummy_weights import DummyWeights
from ninfer.targets.qwen3_6.runtime.config import ProgramConfig


def logits_of(w, pkg, ops, device: str) -> torch.Tensor:
    prog = pkg.create_program(w, ProgramConfig(device=device, dtype="fp32", page_size=16, num_pages=64,
                                               enforce_eager=True))
    prog.model.ops = ops
    prompt = tuple(int(t) for t in torch.randint(0, w.dims.vocab_size, (70,), generator=torch.Generator().manual_seed(1)))
    h = prog.start_materialize(prog.plan_materialize(SequenceRequest(
        prompt_token_ids=prompt, sampling=SamplingParams(temperature=0.0), max_output_tokens=8))).sequence
    _, pl = prog.prefill_with_logits(h, 40)
    step, pl2 = prog.prefill_with_logits(h, 100)
    prog.commit(step.pending, [1])
    outs = [pl, pl2]
    for _ in range(3):
        batch, dl = prog.decode_with_logits([h], 1)
        prog.commit(batch, [1])
        outs.append(dl[:, 0])
    return torch.cat(outs).double()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--identity", default="qwen3_6-tiny-dense")
    ap.add_argument("--std", type=float, default=0.2)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    w = DummyWeights(a.identity, device=a.device, dtype=torch.float32, seed=3, std=a.std)
    pkg = importlib.import_module(w.package.module)
    ref, fast = reference_ops(), fast_ops()
    base = logits_of(w, pkg, ref, a.device)
    rows = [("fast (all)", rel(logits_of(w, pkg, fast, a.device), base))]
    for f in fast._fields[1:]:
        rows.append((f"fast, {f} = reference", rel(logits_of(w, pkg, fast._replace(**{f: getattr(ref, f)}), a.device),
                                                  base)))
    for name, err in sorted(rows, key=lambda r: -r[1]):
        print(f"{name:55s} rel RMS vs reference {err:.3e}", flush=True)


if __name__ == "__main__":
    main()
