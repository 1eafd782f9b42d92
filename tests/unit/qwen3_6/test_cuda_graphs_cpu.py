"""CPU checks of the CUDA-graph decode body (no CUDA needed): the static decode forward equals the
eager forward, and the captured region does no host sync and builds no tensor from host data
(`.item()`, `.tolist()`, `.cpu()`, `bool(t)`, `torch.tensor(...)` raise inside it). The ops
themselves are excluded from the guard (the CPU references loop on the host; the fast CUDA ops
are checked on the GPU by tests/gpu/test_cuda_graphs_gpu.py, whose capture fails on any sync)."""
from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch

from ninfer.ops.opset import reference_ops
from ninfer.contract.program import SamplingParams, SequenceRequest
from ninfer.targets.dummy_weights import DummyWeights
from ninfer.targets.qwen3_6.program.config import ProgramConfig
from ninfer.targets.qwen3_6.program.cuda_graphs import decode_body

from support.eager_graphs import EagerGraphs
from support.host_guard import dense_moe, guarded_ops, no_host_data


def _program(identity, **spec):
    w = DummyWeights(identity, device="cpu", dtype=torch.float32, seed=5, std=0.2)
    pkg = importlib.import_module(w.package.module)
    prog = pkg.create_program(w, ProgramConfig(device="cpu", dtype="fp32", page_size=16, num_pages=64,
                                               num_slots=4, max_model_len=256, max_batch=4, max_steps=2, **spec))
    assert prog.graphs is None                      # CPU: eager only
    return w, prog


@pytest.mark.parametrize("mtp", [False, True])
@pytest.mark.parametrize("identity", ["qwen3_6-tiny-dense", "qwen3_6-tiny-moe"])
def test_decode_body_matches_eager_and_never_touches_the_host(identity, mtp):
    # NOTE: with the MTP layer (speculation on) the body also writes the MTP KV of position - 1 and the anchors
    #       at dst, as the eager step does (speculate.py).
    w, prog = _program(identity, **(dict(speculative_method="mtp", num_speculative_tokens=1) if mtp else {}))
    from ninfer.ops.reference.moe import route_topk
    ops = reference_ops()._replace(
        moe_experts=dense_moe,
        route_moe_experts=lambda x, lg, k, gu, dn, *, shared=None, residual=None:
            dense_moe(x, route_topk(lg, k), gu, dn, shared=shared))
    prog.model.ops = ops
    g = torch.Generator().manual_seed(2)
    hs = []
    for n in (5, 19, 33):
        req = SequenceRequest(prompt_token_ids=tuple(torch.randint(0, 1000, (n,), generator=g).tolist()),
                              sampling=SamplingParams(temperature=0.0), max_output_tokens=8)
        h = prog.start_materialize(prog.plan_materialize(req)).sequence
        prog.commit(prog.prefill(h, n).pending, [1])
        hs.append(h)
    seqs = [prog._seq(h) for h in hs]
    B = len(seqs)
    # eager reference of one decode step (no commit: abort leaves the slots as they were)
    batch, ref_logits = prog.decode_with_logits(hs, 1)
    prog.abort_pending(batch)
    if mtp:                  # what the eager step wrote (its scratch entries are the ones `dst` names below)
        mkv = [(prog._kv.k[-1, s.holding.table.pages[(s.frontier - 1) // 16], (s.frontier - 1) % 16].clone())
               for s in seqs]
        st0 = prog._state
        anchors = st0.planes["mtp_hidden"][0, [st0.phys(st0.scratch_entry(i)) for i in range(len(seqs))]].clone()
    W = -(-prog.config.max_model_len // prog.config.page_size)
    tables = torch.zeros(B, W, dtype=torch.long)
    for r, s in enumerate(seqs):
        tables[r, :len(s.holding.table.pages)] = torch.tensor(s.holding.table.pages)
    pos = torch.tensor([s.frontier for s in seqs])
    st = prog._state                                 # kernels take physical images (commits relabel them)
    dst = torch.tensor([st.phys(st.scratch_entry(i)) for i in range(B)])      # free scratch entries
    buf = SimpleNamespace(input_ids=torch.tensor([s.tokens[-1] for s in seqs]), positions=pos,
                          src=torch.tensor([st.phys(s.slot) for s in seqs]), dst=dst,
                          context_lens=pos + 1, delta=torch.zeros(B, dtype=torch.long), block_tables=tables,
                          rows=torch.arange(B),
                          fed=torch.zeros(B, dtype=torch.long))
    if mtp:                  # so that only the body's own writes can make them equal again
        prog._kv.k[-1].zero_()
        prog._state.planes["mtp_hidden"][0, dst] = 0
    with no_host_data() as saved:
        prog.model.ops = guarded_ops(ops, saved)
        logits = decode_body(prog.model, prog._state, buf)
    prog.model.ops = ops
    torch.testing.assert_close(logits, ref_logits[:, 0], rtol=1e-5, atol=1e-5)
    if mtp:
        torch.testing.assert_close(prog._state.planes["mtp_hidden"][0, dst], anchors, rtol=1e-5, atol=1e-5)
        for s, k in zip(seqs, mkv):
            torch.testing.assert_close(prog._kv.k[-1, s.holding.table.pages[(s.frontier - 1) // 16],
                                                  (s.frontier - 1) % 16], k, rtol=1e-5, atol=1e-5)
    # the provisional entries hold the stepped state; the committed slots are untouched by the copy
    assert torch.equal(prog._state.planes["recurrent"][:, dst].isfinite().all(), torch.tensor(True))


def test_static_inputs_fill_the_graph_layout():
    """The host buffer of a decode graph gets ids, positions, src, dst, context lengths, rope deltas and
    each row's pages at its row offset; entries past a row's pages are left as they were (never read)."""
    from ninfer.targets.qwen3_6.program.cuda_graphs import fill_static_inputs

    B, W = 3, 5
    host = torch.full((6 * B + B * W,), -7, dtype=torch.long)
    fill_static_inputs(host, W, [11, 12, 13], [4, 70, 0], [1, 2, 3], [9, 8, 7], [[5], [6, 2], [4, 4, 4, 4, 4]],
                       [0, -3, 5])
    assert host[:6 * B].tolist() == [11, 12, 13, 4, 70, 0, 1, 2, 3, 9, 8, 7, 5, 71, 1, 0, -3, 5]
    tables = host[6 * B:].view(B, W).tolist()
    assert tables == [[5, -7, -7, -7, -7], [6, 2, -7, -7, -7], [4, 4, 4, 4, 4]]
    with pytest.raises(ValueError, match="6 pages"):
        fill_static_inputs(host, W, [1], [1], [1], [1], [[0] * 6])


@pytest.mark.parametrize("identity", ["qwen3_6-tiny-dense", "qwen3_6-tiny-moe"])
def test_final_one_token_prefill_stage_runs_the_decode_graph(identity):
    """A prompt's final prefill stage of one token (what the context cache's P - 1 capture leaves) goes
    through the decode graph of B=1 when graphs apply: same first token, logits and state as eager
    (the following decode steps agree too); a stage of more tokens, or one asking for prompt log-probs,
    stays eager."""
    _, eager = _program(identity)
    _, graphed = _program(identity)
    graphed.graphs = EagerGraphs(graphed, max_batch=1)
    g = torch.Generator().manual_seed(3)
    for n, split, plp in ((9, 8, None), (1, 0, None), (12, 11, 2), (7, 5, None)):
        prompt = tuple(torch.randint(0, 1000, (n,), generator=g).tolist())
        out = []
        for prog in (eager, graphed):
            req = SequenceRequest(prompt_token_ids=prompt, sampling=SamplingParams(temperature=0.0),
                                  max_output_tokens=8, prompt_logprobs=plp)
            h = prog.start_materialize(prog.plan_materialize(req)).sequence
            n0 = prog.graphs.replays if prog.graphs is not None else 0
            if split:
                assert prog.prefill(h, split).pending is None
            st, lg = prog.prefill_with_logits(h, n - split)
            replayed = (prog.graphs.replays - n0) if prog.graphs is not None else 0
            prog.commit(st.pending, [1])
            b, dl = prog.decode_with_logits([h], 2)
            prog.commit(b, [2])
            out.append((st.pending.rows[0].tokens, lg[-1:], b.rows[0].tokens, dl, replayed, st.prompt_logprobs))
            prog.release(h)
        (t0, l0, d0, dl0, _, p0), (t1, l1, d1, dl1, replayed, p1) = out
        assert t0 == t1 and d0 == d1
        torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(dl1, dl0, rtol=1e-5, atol=1e-5)
        assert p0 == p1
        one = n - split == 1 and plp is None
        assert replayed == (1 if one else 0), (n, split, plp, replayed)


_DRAWN = dict(temperature=0.8, top_k=50, top_p=0.9)
_SAMPLING = {"greedy": [{}, {}, {}],
             "drawn": [dict(_DRAWN, seed=1), dict(_DRAWN, seed=2, min_p=0.05), dict(_DRAWN, seed=3)],
             "mixed": [{}, dict(_DRAWN, seed=2), dict(_DRAWN, seed=3, temperature=1.3)]}


@pytest.mark.parametrize("identity,kind", [("qwen3_6-tiny-dense", "greedy"), ("qwen3_6-tiny-moe", "greedy"),
                                           ("qwen3_6-tiny-dense", "drawn"), ("qwen3_6-tiny-moe", "mixed")])
def test_step_ahead_rounds_equal_plain_rounds(identity, kind):
    """Rounds of plain rows (greedy or drawn) through the decode graphs launch the next step before
    reading their tokens (step_ahead.py). Against an eager Program running the same calls: every
    round's tokens are equal, and so are the logits and the rng states at the end (the committed
    state, KV and generators); a step-ahead is adopted only by the exact next round of its rows after a
    full commit, and discarded by a partial commit, a cancelled row, an abort, a changed batch or a
    release; none is launched when another live sequence is outside the round or when the round
    spends a row's budget; nothing stays held."""
    _, ref = _program(identity)
    _, prog = _program(identity)
    prog.graphs = EagerGraphs(prog, max_batch=4)
    assert prog.step_ahead_enabled
    g = torch.Generator().manual_seed(11)
    prompts = [tuple(torch.randint(0, 1000, (n,), generator=g).tolist()) for n in (9, 14, 6)]
    budgets = (14, 6, 8)
    hs = {p: [] for p in (ref, prog)}

    def both(fn):
        out = [fn(p, hs[p]) for p in (ref, prog)]
        prog.check_integrity()
        return out

    def start(k):
        def f(p, h):
            req = SequenceRequest(prompt_token_ids=prompts[k],
                                  sampling=SamplingParams(**{"temperature": 0.0, **_SAMPLING[kind][k]}),
                                  max_output_tokens=budgets[k])
            h.append(p.start_materialize(p.plan_materialize(req)).sequence)
        both(f)

    def prefill(k, n=None):
        def f(p, h):
            st = p.prefill(h[k], n or len(prompts[k]))
            if st.pending is not None:
                p.commit(st.pending, [1])
                return st.pending.rows[0].tokens
        a, b = both(f)
        assert a == b

    def round_(rows, steps, accepted, abort=False):
        def f(p, h):
            batch = p.decode([h[k] for k in rows], steps)
            toks = [r.tokens for r in batch.rows]
            p.abort_pending(batch) if abort else p.commit(batch, accepted)
            return toks
        n0, a0 = prog.graphs.replays, prog.step_ahead_counts["adopted"]
        a, b = both(f)
        assert a == b, (rows, steps, a, b)
        return prog.graphs.replays - n0, prog.step_ahead_counts["adopted"] - a0 == 1

    start(0), start(1)
    prefill(0), prefill(1)
    assert round_([0, 1], 1, [1, 1]) == (2, False)       # its step + the step-ahead
    assert round_([0, 1], 1, [1, 1]) == (1, True)        # adopted; only the next step-ahead replays
    assert round_([0, 1], 2, [2, 1]) == (2, True)        # adopted step 0, step 1, step-ahead; partial commit drops it
    assert round_([0, 1], 1, [1, 0]) == (2, False)       # recomputed; row 1 cancelled: dropped again
    both(lambda p, h: p.release(h[1]))
    assert round_([0], 1, [1]) == (2, False)
    assert round_([0], 1, [1], abort=True) == (1, True)  # the abort drops the next one
    assert round_([0], 1, [1]) == (2, False)
    start(2)                                             # a third sequence, in prefill: A's pending step stays
    prefill(2, 4)
    assert round_([0], 1, [1]) == (0, True)              # adopted; no new one while sequence 2 is outside
    prefill(2)
    assert round_([0, 2], 1, [1, 1]) == (2, False)
    assert round_([0, 2], 1, [1, 1]) == (1, True)
    both(lambda p, h: p.release(h[2]))                   # release drops the pending step of its rows
    s0 = prog._seq(hs[prog][0])
    assert len(s0.tokens) - s0.num_prompt == 11
    assert round_([0], 1, [1]) == (2, False)
    assert round_([0], 1, [1]) == (1, True)
    assert round_([0], 1, [1])[0] == 0                   # the last token of the budget: adopted, nothing after
    assert prog.step_ahead.pending is None
    for p in (ref, prog):
        s = p._seq(hs[p][0])
        assert len(s.tokens) - s.num_prompt == budgets[0]
    assert torch.equal(prog._seq(hs[prog][0]).rng_state, ref._seq(hs[ref][0]).rng_state)
    # the committed KV and state agree: one more (eager-compared) step from the reservation's last position
    bl = [p.decode_with_logits([hs[p][0]], 1) for p in (ref, prog)]
    torch.testing.assert_close(bl[1][1], bl[0][1], rtol=1e-5, atol=1e-5)
    for p, (b, _) in zip((ref, prog), bl):
        p.abort_pending(b)
        p.release(hs[p][0])
        p.check_integrity()
    assert prog._pending.num_free_scratch == prog._pending._scratch.total


def test_rows_with_penalties_are_not_pipelined():
    """A row whose draw needs its token history (a penalty) keeps the per-step sampler: no step is fed
    on the device and none is launched ahead; its tokens equal the eager Program's."""
    _, ref = _program("qwen3_6-tiny-dense")
    _, prog = _program("qwen3_6-tiny-dense")
    prog.graphs = EagerGraphs(prog, max_batch=4)
    toks = []
    for p in (ref, prog):
        req = SequenceRequest(prompt_token_ids=(5, 6, 7, 8), max_output_tokens=8,
                              sampling=SamplingParams(temperature=0.7, seed=4, repetition_penalty=1.3))
        h = p.start_materialize(p.plan_materialize(req)).sequence
        p.commit(p.prefill(h, 4).pending, [1])
        out = []
        for _ in range(3):
            b = p.decode([h], 2)
            out.append(b.rows[0].tokens)
            p.commit(b, [2])
        toks.append(out)
    assert toks[0] == toks[1]
    assert prog.step_ahead_counts == {"launched": 0, "adopted": 0} and prog.graphs.replays == 6
