"""Which fast op moves a Program's logits away from the reference op set: a tiny identity (fp32,
synthetic weights) prefilled in two chunks and decoded three steps with (a) the reference OpSet,
(b) the fast OpSet, (c) the fast OpSet with one field swapped back to its reference, for every field,
(d) the reference OpSet with one field swapped to its fast op, for every field.
Prints the relative RMS error of each variant against (a), largest first.

    PYTHONPATH=$PWD python3 bench/op_bisect.py [--identity qwen3_6-tiny-dense] [--std 0.2]
"""
from __future__ import annotations

import argparse

import torch

from ninfer.ops.triton import fast_ops, reference_ops
from ninfer.targets.dummy_weights import DummyWeights
from ninfer.testing.forced_run import forced_logits


def logits_of(w, ops, device: str) -> torch.Tensor:
    return forced_logits(w, ops, device, enforce_eager=True).double()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--identity", default="qwen3_6-tiny-dense")
    ap.add_argument("--std", type=float, default=0.2)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    w = DummyWeights(a.identity, device=a.device, dtype=torch.float32, seed=3, std=a.std)
    ref, fast = reference_ops(), fast_ops()
    base = logits_of(w, ref, a.device)
    rows = [("fast (all)", rel(logits_of(w, fast, a.device), base))]
    for f in fast._fields[1:]:
        rows.append((f"fast, {f} = reference", rel(logits_of(w, fast._replace(**{f: getattr(ref, f)}), a.device),
                                                  base)))
        rows.append((f"reference, {f} = fast", rel(logits_of(w, ref._replace(**{f: getattr(fast, f)}), a.device),
                                                  base)))
    for name, err in sorted(rows, key=lambda r: -r[1]):
        print(f"{name:55s} rel RMS vs reference {err:.3e}", flush=True)


if __name__ == "__main__":
    main()
