"""CPU checks of the whole-stage prefill graphs (runtime/prefill_graphs.py; no CUDA needed).

The graph body (`prefill_body`: `Qwen36Model.prefill_static` over a stage padded to its bucket) runs
here eagerly, on the reference ops, through the buffer layout the graphs fill, inside the host-data
guard of tests/support/host_guard.py. Against a Program that runs every stage eagerly it must give the same
first token, the same state and KV (the decode steps after it read them), and write nothing but the
sequence's own pages, its state entry and the spare page. The GPU twin is tests/gpu/test_prefill_graphs_gpu.py.
"""
from __future__ import annotations

import importlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ninfer.ops.opset import reference_ops
from ninfer.contract.program import SamplingParams, SequenceRequest
from ninfer.targets.dummy_weights import DummyWeights
from ninfer.targets.qwen3_6.program import prefill_graphs as pgm
from ninfer.targets.qwen3_6.program.config import ProgramConfig

from support.host_guard import dense_moe, guarded_ops, no_host_data


def test_buckets():
    assert [pgm.bucket(n, 2048) for n in (2, 8, 9, 16, 17, 100, 256, 257, 1000, 1025, 2048)] == [
        8, 8, 16, 16, 32, 128, 256, 512, 1024, 1280, 2048]
    assert pgm.bucket(2049, 2048) is None and pgm.bucket(0, 2048) is None
    assert pgm.bucket(300, 256) is None and pgm.bucket(200, 256) == 256
    assert pgm.bucket(1, 2048) is None and pgm.bucket(2, 2048) == 8 and pgm.bucket(5, 0) is None


def test_graph_tokens_stop_where_a_stage_stops_being_host_bound():
    from ninfer.targets.dummy_weights import DummyWeights as D
    assert pgm.graph_tokens(D("qwen3_6-27b").dims, 2048) == 512
    assert pgm.graph_tokens(D("qwen3_6-35b-a3b").dims, 2048) == 2048
    assert pgm.graph_tokens(D("qwen3_6-35b-a3b").dims, 1000) == 768
    assert pgm.graph_tokens(D("qwen3_6-tiny-dense").dims, 0) == 0


def test_fill_prefill_inputs_layout():
    N, W = 16, 4
    a = np.full(N + 4 + 2 * W, -7, dtype=np.int64)
    pgm.fill_prefill_inputs(a, N, W, [5, 6, 7], 11, [3, 9], 99, 20, 16, delta=-12)
    assert a[:N].tolist() == [5, 6, 7] + [0] * 13
    assert a[N:N + 4].tolist() == [3, 11, 20, -12]
    assert a[N + 4:].reshape(2, W).tolist() == [[3, 9, 99, 99], [99, 99, 99, 99]]
    pgm.fill_prefill_inputs(a, N, W, [5], 11, [3], 99, 48, 16)        # the padding's last position, 63
    assert a[N + 3] == 0
    with pytest.raises(ValueError, match="17 tokens"):
        pgm.fill_prefill_inputs(a, N, W, [1] * 17, 0, [], 99, 0, 16)
    with pytest.raises(ValueError, match="5 pages"):
        pgm.fill_prefill_inputs(a, N, W, [1], 0, [1] * 5, 99, 0, 16)
    with pytest.raises(ValueError, match="at 49 padded to 16 rows past tables of 4 pages"):
        pgm.fill_prefill_inputs(a, N, W, [1], 0, [1], 99, 49, 16)
    assert pgm.table_pages(16, 16, 100) == 8 and pgm.table_pages(8, 64, 8192) == 129


class _EagerPrefillGraphs:
    """`PrefillGraphs`' contract on the CPU: `fill_prefill_inputs` into the `_Graph` layout, then
    `prefill_body` eagerly on views of it, inside the host-data guard (no capture, no pinned memory)."""

    def __init__(self, prog, max_tokens: int) -> None:
        self.model, self.ops = prog.model, prog.model.ops
        self.page_size, self.dummy_page, self.max_tokens = prog.config.page_size, prog._spare_page, max_tokens
        self.max_model_len = prog.config.max_model_len
        self.buckets: set[int] = set()
        self.replays = 0
        self.deltas: list[int] = []

    def fits(self, L):
        return pgm.bucket(L, self.max_tokens) is not None

    def captured(self, L):
        return pgm.bucket(L, self.max_tokens) in self.buckets

    def capture(self, L, scratch_entry):
        assert 0 <= scratch_entry < self.model.state.num_slots + self.model.state.num_scratch
        self.buckets.add(pgm.bucket(L, self.max_tokens))
        return True

    def run(self, tokens, start, entry, pages, delta=0):
        N = pgm.bucket(len(tokens), self.max_tokens)
        W = pgm.table_pages(N, self.page_size, self.max_model_len)
        v = np.zeros(N + 4 + 2 * W, dtype=np.int64)
        pgm.fill_prefill_inputs(v, N, W, tokens, entry, pages[:-(-(start + len(tokens)) // self.page_size)],
                                self.dummy_page, start, self.page_size, delta)
        t = torch.from_numpy(v)
        g = SimpleNamespace(input_ids=t[:N], length=t[N:N + 1], entry=t[N + 1:N + 2], start=t[N + 2:N + 3],
                            delta=t[N + 3:N + 4], block_tables=t[N + 4:].view(2, W), positions=torch.arange(N),
                            zero=torch.zeros(1, dtype=torch.long))
        self.replays += 1
        self.deltas.append(delta)
        ops = self.model.ops
        with no_host_data() as saved:
            self.model.ops = guarded_ops(ops, saved)
            try:
                return pgm.prefill_body(self.model, g)
            finally:
                self.model.ops = ops


def _program(identity):
    w = DummyWeights(identity, device="cpu", dtype=torch.float32, seed=5, std=0.2)
    pkg = importlib.import_module(w.package.module)
    prog = pkg.create_program(w, ProgramConfig(device="cpu", dtype="fp32", page_size=16, num_pages=64,
                                               num_slots=4, max_model_len=256, max_batch=2, max_steps=2))
    assert prog.prefill_graphs is None and prog._spare_page == 64      # CPU: eager; one page past the ledger's
    from ninfer.ops.reference.moe import route_topk
    prog.model.ops = reference_ops()._replace(
        moe_experts=dense_moe,
        route_moe_experts=lambda x, lg, k, gu, dn, *, shared=None, residual=None:
            dense_moe(x, route_topk(lg, k), gu, dn, shared=shared))
    return prog


# (prompt length, its stages, prompt log-probs): every stage of 2..64 tokens (max_tokens 64 below) runs
# the graph, at position 0 or over the prefix of the stages before it (final or not); a 1-token stage,
# prompt log-probs or a stage past the largest bucket stay eager.
CASES = [(5, (5,), None), (9, (8, 1), None), (40, (40,), None), (70, (33, 37), None), (16, (16,), None),
         (12, (12,), 2), (12, (5, 7), 2), (80, (80,), None), (80, (20, 30, 30), None), (40, (39, 1), None),
         (90, (70, 20), None), (48, (16, 32), None), (100, (17, 64, 19), None)]


@pytest.mark.parametrize("identity", ["qwen3_6-tiny-dense", "qwen3_6-tiny-moe"])
def test_prefill_graph_stages_match_eager(identity):
    eager, graphed = _program(identity), _program(identity)
    graphed.prefill_graphs = fake = _EagerPrefillGraphs(graphed, max_tokens=64)
    kv = graphed._kv
    kv.k[:, graphed._spare_page] = float("nan")             # the padding's page: written, never read
    kv.v[:, graphed._spare_page] = float("nan")
    g = torch.Generator().manual_seed(3)
    for n, stages, plp in CASES:
        assert sum(stages) == n
        prompt = tuple(torch.randint(0, 1000, (n,), generator=g).tolist())
        out = []
        for prog in (eager, graphed):
            req = SequenceRequest(prompt_token_ids=prompt, sampling=SamplingParams(temperature=0.0),
                                  max_output_tokens=8, prompt_logprobs=plp)
            h = prog.start_materialize(prog.plan_materialize(req)).sequence
            r0 = fake.replays
            for size in stages:
                st = prog.prefill(h, size)
            replays = fake.replays - r0
            prog.commit(st.pending, [1])
            b, dl = prog.decode_with_logits([h], 2)
            prog.commit(b, [2])
            prog.check_integrity()
            s = prog._seq(h)
            assert prog._spare_page not in s.holding.table.pages
            k = prog._kv.k[:, s.holding.table.pages].flatten(1, 2)[:, :n]
            out.append((st.pending.rows[0].tokens, b.rows[0].tokens, dl, replays, st.prompt_logprobs, k.clone()))
            prog.release(h)
        (t0, d0, dl0, _, p0, k0), (t1, d1, dl1, replays, p1, k1) = out
        assert t0 == t1 and d0 == d1, (n, stages)
        torch.testing.assert_close(dl1, dl0, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(k1, k0, rtol=1e-4, atol=1e-4)
        assert p0 == p1
        assert replays == sum(plp is None and 2 <= size <= 64 for size in stages), (n, stages, replays)
    assert fake.buckets == {8, 16, 32, 64}


def _mrope_positions(n: int, jump_at: int, jump: int) -> np.ndarray:
    """[3, n] MRoPE positions of a prompt whose rotary positions fall behind its KV positions by `jump` from
    token jump_at on (as after an image, whose placeholders advance the rotary position by less than their
    count), with the three axes apart inside [jump_at - 4, jump_at) (the image's own rows)."""
    pos = np.tile(np.arange(n), (3, 1))
    pos[:, jump_at:] -= jump
    pos[1, jump_at - 4:jump_at] += np.arange(4) % 2
    pos[2, jump_at - 4:jump_at] += np.arange(4) // 2
    return pos


def test_a_text_stage_after_mrope_positions_runs_the_graph_at_its_delta():
    """A prompt with MRoPE positions (a chat turn after an image): its stages of text at one constant delta
    replay the prefill graph (the delta as data) or the decode graph's step, equal to the eager forward; a
    stage over the uneven positions stays eager."""
    eager, graphed = _program("qwen3_6-tiny-dense"), _program("qwen3_6-tiny-dense")
    graphed.prefill_graphs = fake = _EagerPrefillGraphs(graphed, max_tokens=64)
    n, jump_at, jump = 60, 20, 7
    prompt = tuple(torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(9)).tolist())
    rope = _mrope_positions(n, jump_at, jump)
    out = []
    for prog in (eager, graphed):
        req = SequenceRequest(prompt_token_ids=prompt, sampling=SamplingParams(temperature=0.0),
                              max_output_tokens=8, rope_positions=rope, rope_delta=-jump)
        h = prog.start_materialize(prog.plan_materialize(req)).sequence
        s = prog._seq(h)
        assert [prog.text_stage_delta(s, a, b) for a, b in ((0, 16), (0, 20), (10, 30), (20, 60), (59, 60))] == [
            0, None, None, -jump, -jump]
        for size in (16, 14, 30):           # 0..16 text at delta 0; 16..30 over the image's rows; then text
            st = prog.prefill(h, size)
        prog.commit(st.pending, [1])
        b, dl = prog.decode_with_logits([h], 2)
        prog.commit(b, [2])
        out.append((st.pending.rows[0].tokens, b.rows[0].tokens, dl))
        prog.release(h)
    assert fake.deltas == [0, -jump]
    assert out[0][:2] == out[1][:2]
    torch.testing.assert_close(out[1][2], out[0][2], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("start", [0, 19, 32])
def test_prefill_static_pads_without_touching_the_state_or_other_pages(start):
    """prefill_static's rows < L equal forward of the L tokens over the same prefix (none at start 0, run
    eagerly into both entries first); the state written at its entry equals the eager one; the padding rows'
    KV goes to the spare page only; every other entry and page is left as it was (NaN-poisoned)."""
    prog = _program("qwen3_6-tiny-dense")
    model, st, kv = prog.model, prog._state, prog._kv
    L, N, ps = 21, 32, 16
    ids = torch.randint(0, 1000, (start + L,), generator=torch.Generator().manual_seed(1 + start))
    for t in st.planes.values():
        t.fill_(float("nan"))
    kv.k.fill_(float("nan"))
    kv.v.fill_(float("nan"))
    e_eager, e_graph = st.phys(0), st.phys(1)
    st.zero_entry(0)
    st.zero_entry(1)
    from ninfer.targets.qwen3_6.program.model import ForwardBatch
    used = -(-(start + L) // ps)
    pages_e, pages_g = list(range(0, used)), list(range(8, 8 + used))
    spare = prog._spare_page

    def eager(entry, pages, a, b):
        return model.forward(ForwardBatch(ids[a:b], torch.arange(a, b), (b - a,), (a,), torch.tensor([entry]),
                                          torch.tensor([pages])))
    if start:
        eager(e_eager, pages_e, 0, start)
        eager(e_graph, pages_g, 0, start)
    ref = eager(e_eager, pages_e, start, start + L)
    padded = torch.cat([ids[start:], torch.zeros(N - L, dtype=torch.long)])
    valid = torch.arange(N) < L
    W = pgm.table_pages(N, ps, 64)
    table = torch.tensor([pages_g + [spare] * (W - used), [spare] * W])
    h = model.prefill_static(padded, start + torch.arange(N), (~valid).long(), valid, torch.tensor([0, L]),
                             torch.tensor([e_graph]), table, torch.tensor([start]))
    torch.testing.assert_close(h[:L], ref, rtol=1e-5, atol=1e-5)
    for name, t in st.planes.items():
        torch.testing.assert_close(t[:, e_graph], t[:, e_eager], rtol=1e-5, atol=1e-5, msg=name)
        others = [e for e in range(t.shape[1]) if e not in (e_eager, e_graph)]
        assert t[:, others].isnan().all(), name
    C = start + L
    for c in (kv.k, kv.v):
        got, want = c[:, pages_g].flatten(1, 2), c[:, pages_e].flatten(1, 2)
        torch.testing.assert_close(got[:, :C], want[:, :C], rtol=1e-4, atol=1e-4)
        assert got[:, C:].isnan().all() and want[:, C:].isnan().all()     # past the stage: not written
        rest = [p for p in range(spare) if p not in pages_e + pages_g]
        assert c[:, rest].isnan().all()
        assert c[:, spare, torch.arange(C, start + N) % ps].isfinite().all()         # the padding's rows


def test_eager_warm_rows_reach_every_graphed_chunk_length_once_over_the_buckets():
    chunk = (64, 128, 256, 384, 512, 768, 1024, 1536, 2048)
    per = {N: pgm.eager_warm_rows(N, [b - 1 for b in chunk]) for N in pgm.BUCKETS}
    assert all(N - 1 in rows for N, rows in per.items())
    warmed = [r for rows in per.values() for r in rows]
    assert len(warmed) == len(set(warmed))
    assert {b - 1 for b in chunk} <= set(warmed)
    assert per[512] == [383, 511] and per[8] == [7]


@pytest.mark.parametrize("cap, want", [(2048, (63, 127, 255, 383, 511, 767, 1023, 1535, 2047)),
                                       (300, (63, 127, 255, 300)), (64, (63,)), (0, ())])
def test_graphed_lengths_are_graphed_and_pad_to_every_bucket_a_graphed_stage_can(monkeypatch, cap, want):
    """One length per chunk-GDN bucket that a stage at most the cap pads to, each itself at most the cap.
    The module imports Triton, so this runs where Triton is installed (not on the CPU CI machine)."""
    pytest.importorskip("triton")
    from ninfer.ops.triton import gated_delta as gd
    monkeypatch.setattr(gd, "GRAPH_MAX_TOKENS", cap)
    got = gd.graphed_lengths()
    assert got == want
    padded = {min(b for b in gd.BUCKETS if b >= t) for t in got}
    assert padded == {min(b for b in gd.BUCKETS if b >= t) for t in range(1, min(cap, gd.BUCKETS[-1]) + 1)}

@pytest.mark.parametrize("identity", ["qwen3_6-tiny-dense", "qwen3_6-tiny-moe"])
def test_warm_eager_over_prefix_writes_only_its_image_and_the_spare_page(identity):
    """The warm passes run a stage over a prefix (start one page in) on a held scratch image and the spare
    page, both zeroed first: every other image and page stays as it was (NaN-poisoned here), and the
    image and the spare page end finite (the forward read and wrote them)."""
    prog = _program(identity)
    model, st, kv, spare = prog.model, prog._state, prog._kv, prog._spare_page
    for t in (*st.planes.values(), kv.k, kv.v):
        t.fill_(float("nan"))
    image = st.phys(st.scratch_entry(1))
    calls = []
    forward = model.forward
    model.forward = lambda fb: calls.append((fb.starts, fb.seqlens, fb.block_tables.unique().tolist())) or forward(fb)
    pgm.warm_eager_over_prefix(model, [7, 20], image, spare, prog.config.page_size)
    assert calls == [((16,), (7,), [spare]), ((16,), (20,), [spare])]
    for name, t in st.planes.items():
        assert t[:, image].isfinite().all() and t[:, image].abs().sum() > 0, name
        assert t[:, [e for e in range(t.shape[1]) if e != image]].isnan().all(), name
    for c in (kv.k, kv.v):
        assert c[:, spare].isfinite().all() and c[:, spare].abs().sum() > 0
        assert c[:, :spare].isnan().all()
