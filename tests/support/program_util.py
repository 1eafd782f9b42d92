"""Helpers shared by the Program and model-parity tests (tiny identities, fp32 on CPU)."""
from __future__ import annotations

import functools
import importlib

import torch

from ninfer.artifact import open_artifact
from ninfer.contract.program import SamplingParams, SequenceHandle, SequenceRequest
from ninfer.targets.qwen3_6.program.config import ProgramConfig
from ninfer.targets.registry import lookup
from ninfer.testing.tiny_hf import KINDS
from support.numerics import rel_rms  # noqa: F401  (re-exported: the model tests import it from here)

GREEDY = SamplingParams(temperature=0.0)


@functools.lru_cache(maxsize=None)
def _artifact(path: str):
    return open_artifact(path)


@functools.lru_cache(maxsize=None)
def _fp32_weights(path: str) -> dict[str, torch.Tensor]:
    """The artifact's tensors in fp32 (exact: the tiny artifacts hold bf16 values), read once a process.
    A CPU Program computes in fp32 and, given an artifact, would cast the bf16 file's 248k-row embedding
    and head (~65 ms) again for every Program; given these, it takes them as they are, as it does from an
    fp32 file. The Program reads the groups present from the names (mtp.*, visual.*)."""
    art = _artifact(path)
    return {name: art.tensor(name).float() for name in art.tensor_names()}


def tiny_program(tiny_artifact_path, kind: str, **config):
    """A fresh Program of the tiny identity `kind` over the session's cached text-layout artifact
    (whose weights are those of `build_hf_model(kind, "text")`)."""
    weights = _fp32_weights(str(tiny_artifact_path(kind, layout="text")))
    pkg = importlib.import_module(lookup(KINDS[kind]).module)
    cfg = dict(device="cpu", dtype="fp32", page_size=16, num_pages=128, num_slots=8, max_model_len=1024)
    cfg.update(config)
    return pkg.create_program(weights, ProgramConfig(**cfg))


def tiny_parts(tiny_artifact_path, kind: str, **defaults):
    """(Frontend, make_program) over the session's cached tiny artifact (official layout):
    `make_program(**overrides)` builds a fresh fp32 CPU Program from `defaults` + overrides.
    As `Engine` does, the Program samples only ids of the tokenizer's vocabulary (the lm_head's
    padding rows are masked): an Engine test must not see padding ids the real Engine never emits."""
    from ninfer.targets.qwen3_6.frontend import Qwen36Frontend

    art = _artifact(str(tiny_artifact_path(kind)))
    weights = _fp32_weights(str(tiny_artifact_path(kind)))
    module = importlib.import_module(art.package.module)
    frontend = Qwen36Frontend.from_resources(art.frontend_resources())

    def make_program(**overrides):
        return module.create_program(weights, ProgramConfig(**{"device": "cpu", "dtype": "fp32",
                                                           "sampleable_vocab_size": frontend.vocab_size,
                                                           **defaults, **overrides}))
    return frontend, make_program


def greedy_reference(program, prompt, n: int) -> tuple[int, ...]:
    """Greedy tokens driven on Program directly: one-shot prefill, then single-row decode steps;
    the sequence is released and the integrity check must hold."""
    seq = materialize(program, prompt, n)
    step = program.prefill(seq, len(prompt))
    out = list(step.pending.rows[0].tokens)
    program.commit(step.pending, [1])
    while len(out) < n:
        batch = program.decode([seq])
        out.extend(batch.rows[0].tokens)
        program.commit(batch, [1])
    program.release(seq)
    program.check_integrity()
    return tuple(out)


@functools.lru_cache(maxsize=None)
def hf_model(kind: str):
    from ninfer.testing.tiny_hf import build_hf_model
    return build_hf_model(kind, "text")


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 248000, (n,), generator=g).tolist()


def materialize(prog, ids, max_output: int = 64, sampling: SamplingParams = GREEDY, **kw) -> SequenceHandle:
    plan = prog.plan_materialize(SequenceRequest(tuple(ids), max_output, sampling, **kw))
    res = prog.start_materialize(plan)
    assert res.ok
    prog.check_integrity()
    return res.sequence


def prefill_all(prog, seq, stage: int = 1 << 30) -> tuple[int, torch.Tensor]:
    """Prefill in stages of `stage`, commit the first token; return (first token, logits [P, V])."""
    parts = []
    while True:
        step, logits = prog.prefill_with_logits(seq, stage)
        parts.append(logits)
        prog.check_integrity()
        if step.pending is not None:
            prog.commit(step.pending, [1])
            prog.check_integrity()
            return step.pending.rows[0].tokens[0], torch.cat(parts)


def decode_n(prog, seqs, n: int) -> list[list[int]]:
    out = [[] for _ in seqs]
    for _ in range(n):
        b = prog.decode(seqs)
        prog.commit(b, [1] * len(seqs))
        for r, row in enumerate(b.rows):
            out[r].append(row.tokens[0])
    prog.check_integrity()
    return out


def extend_rows(out: list[list[int]], new: list[list[int]]) -> None:
    """Append each row's new tokens (decode_n's result) to its running output."""
    for o, t in zip(out, new):
        o.extend(t)


def force_tokens(prog, seq, ids: list[int], out: list[int]) -> None:
    """One control unit of forced ids for one row, committed whole; the row's output `out` gets them."""
    b = prog.control(seq, ids)
    prog.commit(b, [len(ids)])
    out.extend(ids)


def run_rows(prog, prompts, n, sampling=GREEDY, accept=None):
    """Drive B rows together: prefill each, then rounds over every unfinished row; each row commits what it
    produced up to n tokens (accept(r, produced) may cut it). Returns tokens per row and the rounds' rows."""
    seqs, out = [], []
    for p in prompts:
        s = materialize(prog, p, n, sampling, lookahead=prog.lookahead)
        st = prog.prefill(s, len(p))
        prog.commit(st.pending, [1])
        seqs.append(s)
        out.append(list(st.pending.rows[0].tokens))
    rounds = []
    while True:
        live = [r for r in range(len(seqs)) if len(out[r]) < n]
        if not live:
            break
        batch = prog.decode([seqs[r] for r in live])
        acc = []
        for r, row in zip(live, batch.rows):
            c = min(row.produced_tokens, n - len(out[r]))
            if accept is not None:
                c = accept(r, row, c)
            out[r].extend(row.tokens[:c])
            acc.append(c)
            rounds.append(row)
        prog.commit(batch, acc)
    for s in seqs:
        prog.release(s)
    prog.check_integrity()
    cap = prog.capacity()
    assert cap.pages_free == cap.pages_total and cap.slots_free == cap.slots_total
    assert prog._pending.num_free_scratch == prog._state.num_scratch
    return out, rounds


def commit_by_rule(prog, batch, decision, out: list[list[int]]) -> None:
    """Close a decode batch as a test schedule says: "abort", or per row ("all", "prefix" = 1 token, "cancel" = 0;
    one word for every row or a list) commit and extend each row's `out` with what it kept."""
    if decision == "abort":
        prog.abort_pending(batch)
        return
    rule = decision if isinstance(decision, list) else [decision] * len(batch.rows)
    acc = [row.produced_tokens if d == "all" else 1 if d == "prefix" else 0 for d, row in zip(rule, batch.rows)]
    prog.commit(batch, acc)
    for r, (row, a) in enumerate(zip(batch.rows, acc)):
        out[r].extend(row.tokens[:a])
