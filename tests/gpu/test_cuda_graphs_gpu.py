"""Decode CUDA graphs (one per exact B) == eager, on the tiny identities (fp32, synthetic weights).

Two Programs over the same weights, one `enforce_eager`, run the same schedule: rows of different
context lengths join and leave, B goes through 1..4, rounds of 1 and 2 steps, full commits,
prefix commits (accepted < produced), cancelled rows (accepted 0) and aborts. Greedy tokens must be
equal round by round, and the logits equal within fp32 tolerance. A third Program with the
reference op set (eager) bounds the fast path's error. Prompts are prefilled in 1-token stages
(the decode kernels; no fla compile in this file); with graphs, each prompt's final stage replays the
B=1 decode graph, and its first token and logits must equal the eager stage's.
"""
from __future__ import annotations

import importlib

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from ninfer.ops.opset import reference_ops  # noqa: E402
from support.numerics import rel_rms  # noqa: E402
from ninfer.contract.program import SamplingParams, SequenceRequest  # noqa: E402
from ninfer.targets.dummy_weights import DummyWeights  # noqa: E402
from ninfer.targets.qwen3_6.program.config import ProgramConfig  # noqa: E402


# (round, active row ids, steps, decision per row: "all" | "prefix" | "cancel", or "abort" for the batch)
SCHEDULE = [
    ([0], 1, "all"), ([0, 1], 1, "all"), ([0, 1, 2], 2, ["all", "prefix", "all"]), ([1, 2], 1, "abort"),
    ([0, 1, 2, 3], 1, "all"), ([3, 0, 2, 1], 2, ["prefix", "all", "cancel", "all"]), ([2], 2, "prefix"),
    ([3, 2], 1, "all"), ([4, 3, 2], 1, "all"), ([4], 2, "all"), ([1, 4, 3, 0], 1, "abort"), ([1, 4, 3, 0], 1, "all"),
    ([4, 0], 2, ["cancel", "prefix"]), ([0, 4, 1], 1, "all"),
]
PROMPT_LENS = [3, 17, 9, 30, 5]


def _run(identity, mode):
    w = DummyWeights(identity, device="cuda", dtype=torch.float32, seed=7, std=0.2)
    pkg = importlib.import_module(w.package.module)
    cfg = ProgramConfig(device="cuda", dtype="fp32", page_size=16, num_pages=128, num_slots=6, max_model_len=96,
                        max_batch=4, max_steps=2, enforce_eager=(mode != "graphs"))
    prog = pkg.create_program(w, cfg)
    if mode == "graphs":
        assert prog.graphs is not None
    else:
        assert prog.graphs is None
    if mode == "reference":
        prog.model.ops = reference_ops()
    g = torch.Generator().manual_seed(4)
    hs, firsts = [], []
    for n in PROMPT_LENS:
        prompt = tuple(torch.randint(0, w.dims.vocab_size, (n,), generator=g).tolist())
        req = SequenceRequest(prompt_token_ids=prompt, sampling=SamplingParams(temperature=0.0), max_output_tokens=40)
        h = prog.start_materialize(prog.plan_materialize(req)).sequence
        while True:
            step, lg = prog.prefill_with_logits(h, 1)
            if step.pending is not None:                 # the final 1-token stage: a graph replay too
                firsts.append((step.pending.rows[0].tokens, lg))
                prog.commit(step.pending, [1])
                break
        hs.append(h)
    tokens, logits = [], []
    for rows, steps, decision in SCHEDULE:
        batch, lg = prog.decode_with_logits([hs[r] for r in rows], steps)
        tokens.append([row.tokens for row in batch.rows])
        logits.append(lg)
        if decision == "abort":
            prog.abort_pending(batch)
            continue
        ds = [decision] * len(rows) if isinstance(decision, str) else decision
        acc = [{"all": steps, "prefix": steps - 1 if steps > 1 else 1, "cancel": 0}[d] for d in ds]
        prog.commit(batch, acc)
        prog.check_integrity()
    replays = prog.graphs.replays if prog.graphs is not None else 0
    return tokens, logits, replays, firsts


@pytest.mark.parametrize("identity", ["qwen3_6-tiny-dense", "qwen3_6-tiny-moe"])
def test_graph_decode_equals_eager(identity):
    tg, lg, replays, fg = _run(identity, "graphs")
    te, le, _, fe = _run(identity, "eager")
    # every decode step and every prompt's final 1-token prefill stage replayed a graph
    assert replays == sum(steps for _, steps, _ in SCHEDULE) + len(PROMPT_LENS)
    assert [t for t, _ in fg] == [t for t, _ in fe]
    for (_, a), (_, b) in zip(fg, fe):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert tg == te
    for a, b in zip(lg, le):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    # NOTE: fast vs reference ops differ by rounding, which can flip a greedy choice; after the
    #       first differing token the two runs decode different text. Compare up to that round
    #       (its first step's logits precede the flip).
    tr, lr, _, _ = _run(identity, "reference")
    compared = 0
    for a, b, ta, tb in zip(lg, lr, tg, tr):
        same = ta == tb
        a, b = (a, b) if same else (a[:, :1], b[:, :1])
        assert rel_rms(a, b) < 5e-3, (compared, rel_rms(a, b))
        compared += 1
        if not same:
            break
    assert compared >= 3, compared


def test_graphs_off_switch_and_ops_swap_run_eagerly():
    w = DummyWeights("qwen3_6-tiny-dense", device="cuda", dtype=torch.float32, seed=1, std=0.2)
    pkg = importlib.import_module(w.package.module)
    prog = pkg.create_program(w, ProgramConfig(device="cuda", dtype="fp32", page_size=16, num_pages=32,
                                               max_model_len=64, max_batch=2, max_steps=1))
    req = SequenceRequest(prompt_token_ids=(1, 2, 3), sampling=SamplingParams(temperature=0.0), max_output_tokens=8)
    h = prog.start_materialize(prog.plan_materialize(req)).sequence
    for _ in range(3):
        st = prog.prefill(h, 1)
    prog.commit(st.pending, [1])
    out = {}
    for name in ("graph", "off", "ref"):
        prog.graphs_enabled = name != "off"
        fast = prog.model.ops
        if name == "ref":
            prog.model.ops = reference_ops()
        n0 = prog.graphs.replays
        b, lg = prog.decode_with_logits([h], 1)
        prog.abort_pending(b)
        out[name] = lg
        assert (prog.graphs.replays - n0) == (1 if name == "graph" else 0)
        prog.model.ops = fast
    torch.testing.assert_close(out["graph"], out["off"], rtol=1e-4, atol=1e-4)
    assert rel_rms(out["graph"], out["ref"]) < 5e-3


@pytest.mark.skipif(torch.cuda.get_device_capability()[0] < 9, reason="PDL needs compute capability >= 9")
@pytest.mark.parametrize("identity", ["qwen3_6-tiny-dense", "qwen3_6-tiny-moe"])
def test_graph_decode_with_pdl_equals_eager(identity, monkeypatch):
    """Programmatic dependent launch (on by default on sm_90+): every PDL-aware kernel waits for its
    predecessor before touching what earlier kernels write, so the captured decode (and eager) give the
    same tokens and logits as without it."""
    from ninfer.ops.triton import pdl
    monkeypatch.setattr(pdl, "enabled", lambda: False)
    te, le, _, fe = _run(identity, "eager")
    monkeypatch.setattr(pdl, "enabled", lambda: True)
    tg, lg, replays, fg = _run(identity, "graphs")
    tp, lp, _, _ = _run(identity, "eager")
    assert replays == sum(steps for _, steps, _ in SCHEDULE) + len(PROMPT_LENS)
    assert tg == te and tp == te and [t for t, _ in fg] == [t for t, _ in fe]
    for a, b, c in zip(lg, lp, le):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(b, c, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("side", [True, False, "serial"])
@pytest.mark.parametrize("identity", ["qwen3_6-tiny-dense", "qwen3_6-tiny-moe"])
def test_graph_decode_side_gate_equals_eager(identity, side, monkeypatch):
    """The mixers' gate rows (GDN z, attention gate) as a second GEMV on a side stream inside the decode
    graph of one row (on by default; B > 1 keeps the one in_proj GEMV), and the switch off: the join
    before each read of the gate orders it after its write, so the graphs give the eager tokens and
    logits either way, and the B=1 capture asked for the pair at every mixer layer, or at none.
    "serial": the pair with a half that may not run beside another GEMV (`gemv.concurrent_ok` False, as
    for a split-K half): both on the current stream, the fork and join ordering nothing."""
    from ninfer.ops.triton import gemv
    from ninfer.targets.qwen3_6.program import model as M
    te, le, _, fe = _run(identity, "eager")
    calls, beside = [], []
    pair = M.SideGemv.pair
    monkeypatch.setattr(M.SideGemv, "pair", lambda self, *a: calls.append(a[-1]) or pair(self, *a))
    monkeypatch.setattr(M, "SIDE_GATE", bool(side))
    if side == "serial":
        monkeypatch.setattr(gemv, "concurrent_ok", lambda n, k, m: beside.append(n) and False)
    tg, lg, replays, fg = _run(identity, "graphs")
    # warm-up (2) + capture (1) of the B=1 graph, one fork per mixer layer
    layers = len(DummyWeights(identity).dims.layer_types)
    assert len(calls) == (3 * layers if side else 0)
    assert len(beside) == (3 * layers if side == "serial" else 0)     # the first half's check stops the all()
    assert replays == sum(steps for _, steps, _ in SCHEDULE) + len(PROMPT_LENS)
    assert tg == te and [t for t, _ in fg] == [t for t, _ in fe]
    for a, b in zip(lg, le):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


# (active row ids, steps, decision per row) for the step-ahead schedule: every live sequence decodes, so
# rounds launch their rows' next step ahead; releases (None) drop rows; partial commits and cancels in between
AHEAD_SCHEDULE = [([0, 1, 2], 1, "all")] * 4 + [([0, 1, 2], 2, ["all", "prefix", "all"]), ([0, 1, 2], 1, "all"),
                  ([0, 1, 2], 1, ["all", "all", "cancel"]), (2, None, None)] + [([0, 1], 1, "all")] * 3 + [
                  ([0, 1], 1, "abort"), ([0, 1], 2, "all"), (1, None, None)] + [([0], 1, "all")] * 24


def _run_ahead(identity, mode, drawn=False):
    """The schedule through `decode` (plain rounds: pipelined and launched ahead with graphs); drawn:
    seeded temperature / top-k / top-p rows instead of greedy ones."""
    w = DummyWeights(identity, device="cuda", dtype=torch.float32, seed=9, std=0.2)
    pkg = importlib.import_module(w.package.module)
    cfg = ProgramConfig(device="cuda", dtype="fp32", page_size=16, num_pages=128, num_slots=4, max_model_len=96,
                        max_batch=4, max_steps=2, enforce_eager=(mode != "graphs"))
    prog = pkg.create_program(w, cfg)
    g = torch.Generator().manual_seed(5)
    hs = []
    for i, n in enumerate((4, 21, 11)):
        prompt = tuple(torch.randint(0, w.dims.vocab_size, (n,), generator=g).tolist())
        sp = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=10 + i) if drawn else SamplingParams(temperature=0.0)
        req = SequenceRequest(prompt_token_ids=prompt, sampling=sp, max_output_tokens=48)
        h = prog.start_materialize(prog.plan_materialize(req)).sequence
        while True:
            step = prog.prefill(h, 1)
            if step.pending is not None:
                prog.commit(step.pending, [1])
                break
        hs.append(h)
    tokens = []
    for rows, steps, decision in AHEAD_SCHEDULE:
        if steps is None:
            prog.release(hs[rows])
            continue
        batch = prog.decode([hs[r] for r in rows], steps)
        tokens.append([row.tokens for row in batch.rows])
        if decision == "abort":
            prog.abort_pending(batch)
            continue
        ds = [decision] * len(rows) if isinstance(decision, str) else decision
        prog.commit(batch, [{"all": steps, "prefix": steps - 1 if steps > 1 else 1, "cancel": 0}[d] for d in ds])
        prog.check_integrity()
    b, logits = prog.decode_with_logits([hs[0]], 1)        # the committed state and KV, compared as logits
    prog.abort_pending(b)
    rng = prog._seq(hs[0]).rng_state
    prog.release(hs[0])
    prog.check_integrity()
    assert prog._pending.num_free_scratch == prog._state.num_scratch      # every entry back (incl. the step-ahead's)
    return tokens, logits, prog.step_ahead_counts["adopted"], rng


@pytest.mark.parametrize("identity,drawn", [("qwen3_6-tiny-dense", False), ("qwen3_6-tiny-moe", False),
                                            ("qwen3_6-tiny-dense", True)])
def test_step_ahead_decode_equals_eager(identity, drawn):
    """Plain rounds through the graphs feed each step from the previous step's tokens on the device and
    launch the next round's first step before reading their tokens (runtime/step_ahead.py): tokens equal
    to the eager Program's round by round (24 B=1 rounds in a row at the end: the step-ahead of one round
    runs while the host finishes it), greedy or drawn, and the committed state and rng equal at the end."""
    tg, lg, adopted, rg = _run_ahead(identity, "graphs", drawn)
    te, le, _, re_ = _run_ahead(identity, "eager", drawn)
    assert tg == te
    torch.testing.assert_close(lg, le, rtol=1e-4, atol=1e-4)
    assert torch.equal(rg, re_)
    assert adopted >= 24, adopted
