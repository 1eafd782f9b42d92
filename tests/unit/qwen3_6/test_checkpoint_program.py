"""Program checkpoints on the tiny dense model: exact page ids, refcounts, slots, copy-on-write,
publication targets, host replicas, eviction victims, and hit == miss greedy parity."""
from __future__ import annotations

import pytest
import torch

from support.program_util import GREEDY, decode_n, prefill_all, prompt, tiny_program
from ninfer.contract.program import (InvariantError, Placement, Refusal, RefusalKind, ResourcePlan,
                                           SequenceRequest, StalePlanError, prefix_digest)


def _start(prog, ids, max_out=8, source=None, evictable=(), **kw):
    plan = prog.plan_materialize(SequenceRequest(tuple(ids), max_out, GREEDY, **kw), source, evictable)
    assert isinstance(plan, ResourcePlan), plan
    res = prog.start_materialize(plan)
    assert res.ok
    prog.check_integrity()
    return res


def _prefill_to(prog, seq, n):
    """Non-final prefill stages up to frontier n."""
    s = prog._seq(seq)
    while s.frontier < n:
        step = prog.prefill(seq, n - s.frontier)
        assert step.pending is None
        prog.check_integrity()


def _capture(prog, seq, evictable=()):
    plan = prog.plan_capture(seq, evictable)
    assert isinstance(plan, ResourcePlan), plan
    res = prog.start_capture(plan)
    prog.check_integrity()
    return res


def _reference(prog, ids, n):
    seq = _start(prog, ids, n).sequence
    first, _ = prefill_all(prog, seq)
    out = [first] + decode_n(prog, [seq], n - 1)[0]
    prog.release(seq)
    return out


def _refs(prog):
    return [prog._ledger.pages.refcount(p) for p in range(prog._ledger.pages.total)]


def test_capture_shares_pages_and_copies_the_slot(tiny_artifact_path):
    prog = tiny_program(tiny_artifact_path, "dense", page_size=4, num_pages=16, num_slots=4, max_model_len=64)
    ids = prompt(11, seed=1)
    seq = _start(prog, ids, 5).sequence
    assert prog._ledger.holding(seq.seq_id).slot == 0
    _prefill_to(prog, seq, 10)
    assert prog._ledger.holding(seq.seq_id).table.pages == [0, 1, 2]
    res = _capture(prog, seq)
    ck = res.checkpoint
    assert ck.frontier == 10 and ck.digest == prefix_digest(ids[:10]) and ck.placement is Placement.DEVICE
    c = prog._ledger.checkpoint(ck.checkpoint_id)
    assert c.pages == [0, 1, 2] and c.slot == 1
    assert _refs(prog)[:4] == [2, 2, 2, 0]
    for t in prog._state.planes.values():
        assert torch.equal(t[:, 1], t[:, 0])
    # the sequence goes on; the checkpoint's slot and its prefix positions stay untouched
    snap = {n: t[:, 1].clone() for n, t in prog._state.planes.items()}
    kv = prog._kv.k[:, 2, :2].clone()
    first, _ = prefill_all(prog, seq)
    decode_n(prog, [seq], 3)
    assert all(torch.equal(prog._state.planes[n][:, 1], v) for n, v in snap.items())
    assert torch.equal(prog._kv.k[:, 2, :2], kv)
    prog.release(seq)
    prog.check_integrity()
    assert _refs(prog)[:4] == [1, 1, 1, 0]
    cap = prog.capacity()
    assert (cap.pages_free, cap.slots_free) == (13, 3)
    usage = prog.cache_usage()
    assert usage.num_device == 1 and usage.device_bytes == prog._slot_bytes + 3 * prog._page_bytes
    prog.delete_checkpoint(ck.checkpoint_id)
    prog.check_integrity()
    cap = prog.capacity()
    assert (cap.pages_free, cap.slots_free) == (16, 4) and _refs(prog) == [0] * 16


@pytest.mark.parametrize("frontier", [1, 3, 4, 5, 9])
def test_materialize_from_checkpoint_equals_root(tiny_artifact_path, frontier):
    """Greedy output from a checkpoint at any frontier (inside the first page too) == from root."""
    prog = tiny_program(tiny_artifact_path, "dense", page_size=4, num_pages=32, num_slots=4, max_model_len=64)
    ids = prompt(12, seed=2)
    ref = _reference(prog, ids, 6)
    seq = _start(prog, ids, 6).sequence
    _prefill_to(prog, seq, frontier)
    cid = _capture(prog, seq).checkpoint.checkpoint_id
    prog.release(seq)
    src_pages = list(prog._ledger.checkpoint(cid).pages)
    res = _start(prog, ids, 6, source=cid)
    assert res.num_reused_tokens == frontier
    table = prog._ledger.holding(res.sequence.seq_id).table
    full = frontier // 4
    assert table.pages[:full] == src_pages[:full]            # full pages shared
    if frontier % 4:
        assert table.pages[full] not in src_pages            # the partial page is a private copy
    refs = _refs(prog)
    assert all(refs[p] == 2 for p in src_pages[:full])
    assert all(refs[p] == 1 for p in src_pages[full:])
    first, _ = prefill_all(prog, res.sequence, stage=5)
    out = [first] + decode_n(prog, [res.sequence], 5)[0]
    assert out == ref
    prog.release(res.sequence)
    prog.check_integrity()
    assert prog.capacity().slots_free == 3


def test_source_must_prove_a_strict_prefix(tiny_artifact_path):
    prog = tiny_program(tiny_artifact_path, "dense", page_size=4, num_pages=32, num_slots=4, max_model_len=64)
    ids = prompt(8, seed=3)
    seq = _start(prog, ids, 4).sequence
    _prefill_to(prog, seq, 6)
    cid = _capture(prog, seq).checkpoint.checkpoint_id
    prog.release(seq)
    with pytest.raises(InvariantError):                       # diverges inside the proven prefix
        prog.plan_materialize(SequenceRequest(tuple(ids[:5]) + (7,) + tuple(ids[6:]), 4), cid)
    with pytest.raises(InvariantError):                       # no prompt token left to compute
        prog.plan_materialize(SequenceRequest(tuple(ids[:6]), 4), cid)
    with pytest.raises(InvariantError):                       # prompt log-probs are never reused
        prog.plan_materialize(SequenceRequest(tuple(ids), 4, prompt_logprobs=0), cid)
    assert prog.plan_materialize(SequenceRequest(tuple(ids[:7]), 4), cid).num_reused_tokens == 6


def test_eviction_victims_and_pinned_source(tiny_artifact_path):
    prog = tiny_program(tiny_artifact_path, "dense", page_size=4, num_pages=8, num_slots=3, max_model_len=32)
    a, b = prompt(8, seed=4), prompt(8, seed=5)
    ids = []
    for p in (a, b):
        seq = _start(prog, p, 1).sequence
        _prefill_to(prog, seq, 7)
        ids.append(_capture(prog, seq).checkpoint.checkpoint_id)
        prog.release(seq)
    ca, cb = ids
    assert prog._ledger.checkpoint(ca).pages == [0, 1] and prog._ledger.checkpoint(cb).pages == [2, 3]
    assert (prog.capacity().pages_free, prog.capacity().slots_free) == (4, 1)
    big = tuple(a[:7]) + tuple(prompt(13, seed=6))                     # 20 + 4 = 24 tokens: 6 pages
    # root: needs 6 pages, 4 available -> the least valuable offered victim goes first
    plan = prog.plan_materialize(SequenceRequest(big, 4), None, [cb, ca])
    assert plan.victims == (cb,) and plan.source is None
    assert prog.plan_materialize(SequenceRequest(big, 4), None, [ca, cb]).victims == (ca,)
    # from ca: its 1 full page is shared, so 5 pages are needed; ca itself is never a victim
    plan = prog.plan_materialize(SequenceRequest(big, 4), ca, [ca, cb])
    assert plan.victims == (cb,) and plan.num_reused_tokens == 7 and plan.pages == 5
    r = prog.plan_materialize(SequenceRequest(big, 4), ca, [ca])
    assert isinstance(r, Refusal) and r.kind is RefusalKind.SHORT_NOW
    # a stale plan starts nothing
    stale = prog.plan_materialize(SequenceRequest(big, 4), ca, [cb])
    res = _start(prog, big, 4, source=ca, evictable=[cb])
    assert res.evicted == (cb,) and res.num_reused_tokens == 7
    with pytest.raises(StalePlanError):
        prog.start_materialize(stale)
    table = prog._ledger.holding(res.sequence.seq_id).table
    assert table.pages == [0, 2]                                        # shared page 0, partial copy in 2
    assert _refs(prog) == [2, 1, 1, 0, 0, 0, 0, 0]
    with pytest.raises(InvariantError):
        prog._ledger.pin(ca) and prog.delete_checkpoint(ca)
    prog._ledger.unpin(ca)
    first, _ = prefill_all(prog, res.sequence)
    prog.release(res.sequence)
    prog.check_integrity()
    assert _refs(prog) == [1, 1, 0, 0, 0, 0, 0, 0]


def test_host_replica_roundtrip(tiny_artifact_path):
    prog = tiny_program(tiny_artifact_path, "dense", page_size=4, num_pages=16, num_slots=3, max_model_len=64)
    ids = prompt(14, seed=7)
    ref = _reference(prog, ids, 5)
    seq = _start(prog, ids, 5).sequence
    _prefill_to(prog, seq, 9)
    cid = _capture(prog, seq).checkpoint.checkpoint_id
    prog.release(seq)
    nbytes = prog.checkpoint_info(cid).nbytes
    res = prog.offload_checkpoint(cid)
    assert res.offloaded == (cid,)
    prog.check_integrity()
    assert prog.checkpoint_info(cid).placement is Placement.HOST
    cap = prog.capacity()
    assert (cap.pages_free, cap.slots_free) == (16, 3)
    assert prog.cache_usage() == (0, 1, 0, nbytes)
    res = _start(prog, ids, 5, source=cid)
    assert res.num_reused_tokens == 9
    assert prog._ledger.holding(res.sequence.seq_id).table.pages == [0, 1, 2]   # all copied back
    first, _ = prefill_all(prog, res.sequence)
    assert [first] + decode_n(prog, [res.sequence], 4)[0] == ref
    prog.release(res.sequence)
    # a plan may move victims to host memory instead of deleting them
    seq = _start(prog, ids, 5).sequence
    _prefill_to(prog, seq, 9)
    c2 = _capture(prog, seq).checkpoint.checkpoint_id
    prog.release(seq)
    plan = prog.plan_materialize(SequenceRequest(tuple(prompt(50, seed=8)), 14), None, [c2], host_bytes_free=nbytes)
    assert plan.victims == (c2,) and plan.offload == (c2,)
    res = prog.start_materialize(plan)
    assert res.offloaded == (c2,) and res.evicted == ()
    prog.check_integrity()
    prog.release(res.sequence)
    prog.delete_checkpoint(cid)
    prog.delete_checkpoint(c2)
    prog.check_integrity()
    assert prog.cache_usage() == (0, 0, 0, 0)


def test_publication_slot_keeps_the_prompt_reconstruction_prefix(tiny_artifact_path):
    """retain publishes the state at the reconstruction prefix; reusing it == computing from root."""
    prog = tiny_program(tiny_artifact_path, "dense", page_size=4, num_pages=32, num_slots=4, max_model_len=64)
    ids = prompt(12, seed=9)
    seq = _start(prog, ids, 4, publication=True, reconstruction_prefix=6).sequence
    h = prog._ledger.holding(seq.seq_id)
    assert (h.slot, h.pub_slot) == (0, 1)
    _prefill_to(prog, seq, 6)
    prefill_all(prog, seq)
    decode_n(prog, [seq], 3)
    res = prog.retain(seq)
    prog.check_integrity()
    ck = res.checkpoint
    assert ck.frontier == 6 and ck.digest == prefix_digest(ids[:6]) and ck.provenance.kind == "terminal"
    assert prog._ledger.checkpoint(ck.checkpoint_id).slot == 1 and prog.capacity().slots_free == 3
    assert prog._ledger.checkpoint(ck.checkpoint_id).pages == [0, 1]
    nxt = ids[:6] + prompt(5, seed=10)
    ref = _reference(prog, nxt, 4)
    res = _start(prog, nxt, 4, source=ck.checkpoint_id)
    first, _ = prefill_all(prog, res.sequence)
    assert [first] + decode_n(prog, [res.sequence], 3)[0] == ref
    prog.release(res.sequence)
    prog.check_integrity()


@pytest.mark.parametrize("steps", [1, 3])
def test_output_boundary_publishes_prompt_plus_output(tiny_artifact_path, steps):
    """A boundary after the last sampled token: the terminal step runs that token into the
    publication slot; the checkpoint proves prompt + output and a continuation matches root."""
    prog = tiny_program(tiny_artifact_path, "dense", page_size=4, num_pages=48, num_slots=4, max_model_len=96,
                        max_steps=3)
    ids = prompt(7, seed=11)
    seq = _start(prog, ids, 12, publication=True, reconstruction_prefix=5).sequence
    step = prog.prefill(seq, 100)
    prog.commit(step.pending, [1], [None])
    out = [step.pending.rows[0].tokens[0]]
    boundary_at = None
    for i in range(3):
        b = prog.decode([seq], steps)
        bnd = 1 if i == 1 else None                     # a boundary after the first token of round 1
        prog.commit(b, [steps], [bnd])
        if bnd is not None:
            boundary_at = len(ids) + len(out) + bnd
        out.extend(b.rows[0].tokens)
        prog.check_integrity()
    s = prog._seq(seq)
    assert s.pub_target == boundary_at
    b = prog.decode([seq], 1)                           # a final boundary covering the last token
    prog.commit(b, [1], [1])
    out.extend(b.rows[0].tokens)
    full = ids + out
    assert s.pub_target == len(full) and s.frontier == len(full) - 1
    res = prog.retain(seq)
    prog.check_integrity()
    assert res.checkpoint.frontier == len(full) and res.checkpoint.digest == prefix_digest(full)
    nxt = full + prompt(4, seed=12)
    ref = _reference(prog, nxt, 4)
    r2 = _start(prog, nxt, 4, source=res.checkpoint.checkpoint_id)
    assert r2.num_reused_tokens == len(full)
    first, _ = prefill_all(prog, r2.sequence)
    assert [first] + decode_n(prog, [r2.sequence], 3)[0] == ref
    prog.release(r2.sequence)
    prog.check_integrity()


def test_retain_releases_when_no_complete_state(tiny_artifact_path):
    prog = tiny_program(tiny_artifact_path, "dense", page_size=4, num_pages=32, num_slots=4, max_model_len=64)
    ids = prompt(10, seed=13)
    # materialized beyond its reconstruction prefix: that state is gone, nothing to publish
    seq = _start(prog, ids, 4).sequence
    _prefill_to(prog, seq, 8)
    cid = _capture(prog, seq).checkpoint.checkpoint_id
    prog.release(seq)
    res = _start(prog, ids, 4, source=cid, publication=True, reconstruction_prefix=6)
    prefill_all(prog, res.sequence)
    out = prog.retain(res.sequence)
    assert out.ok and out.checkpoint is None
    prog.check_integrity()
    # a plain prompt (no reconstruction prefix) publishes its committed frontier
    res = _start(prog, ids, 4, publication=True)
    prefill_all(prog, res.sequence)
    decode_n(prog, [res.sequence], 2)
    out = prog.retain(res.sequence)
    assert out.checkpoint.frontier == 12 and out.checkpoint.provenance.kind == "terminal"
    prog.check_integrity()
    assert prog.capacity().slots_free == 2
