"""A Program run with forced tokens, for comparing op sets (tests): one random
prompt prefilled in stages, each sampled token replaced by a fixed id, then single-token decode
rounds; returns every logits row the run produced."""
from __future__ import annotations

import importlib
from typing import Any, Sequence

import torch

from ninfer.contract.program import SamplingParams, SequenceRequest
from ninfer.targets.qwen3_6.program.config import ProgramConfig

__all__ = ["forced_logits"]


def forced_logits(weights: Any, ops: Any, device: str, *, prompt_len: int = 70, stages: Sequence[int] = (40, 100),
                  decode_steps: int = 3, forced_token: int = 1, seed: int = 1, **config: Any) -> torch.Tensor:
    """weights: a DummyWeights (or any package weights with .package and .dims); ops: the OpSet the
    model runs. The prompt (`prompt_len` ids from `seed`) is prefilled in `stages` (token budgets per
    call until it is consumed), then `decode_steps` rounds; every sampled token is `forced_token`.
    Returns the fp32 logits [len(stages) + decode_steps, V] (prefill stages that sample contribute
    their last row). `config` overrides ProgramConfig fields (default fp32, page 16, 64 pages)."""
    pkg = importlib.import_module(weights.package.module)
    cfg = dict(device=device, dtype="fp32", page_size=16, num_pages=64) | config
    prog = pkg.create_program(weights, ProgramConfig(**cfg))
    prog.model.ops = ops
    prompt = tuple(int(t) for t in torch.randint(0, weights.dims.vocab_size, (prompt_len,),
                                                 generator=torch.Generator().manual_seed(seed)))
    h = prog.start_materialize(prog.plan_materialize(SequenceRequest(
        prompt_token_ids=prompt, sampling=SamplingParams(temperature=0.0), max_output_tokens=decode_steps + 2))).sequence
    outs, step = [], None
    for budget in stages:
        step, pl = prog.prefill_with_logits(h, budget)
        outs.append(pl)
    if step is None or step.pending is None:
        raise ValueError(f"stages {tuple(stages)} do not consume a prompt of {prompt_len} tokens")
    prog.commit(step.pending, [forced_token])
    for _ in range(decode_steps):
        batch, dl = prog.decode_with_logits([h], 1)
        prog.commit(batch, [forced_token])
        outs.append(dl[:, 0])
    prog.release(h)
    return torch.cat(outs)
