"""Prompts with media in the Qwen3.6 Program (media.py), fp32 on the CPU, with a stand-in vision encoder (seeded
rows per media digest): the media rows replace the placeholder tokens' embeddings, the prompt rotates at its
MRoPE positions and what follows at position + rope delta, whatever the prefill stages (a stage may split a
media run), through decode steps and speculative rounds alike; without an encoder media are refused."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ninfer.contract.program import MediaInput, Refusal, SamplingParams, SequenceRequest
from ninfer.targets.qwen3_6.program.model import ForwardBatch
from support.program_media import FakeEncoder, generate as _generate, media_request as _request
from support.numerics import rel_rms
from support.program_util import tiny_program

GREEDY = SamplingParams(temperature=0.0)


def _reference_logits(prog, req, out):
    """One forward over prompt + output[:-1] with the media rows and every rotary position given."""
    ids = list(req.prompt_token_ids) + out[:-1]
    P, N = len(req.prompt_token_ids), len(ids)
    rope = torch.zeros(3, N, dtype=torch.long)
    rope[:, :P] = torch.as_tensor(req.rope_positions)
    rope[:, P:] = torch.arange(P, N) + req.rope_delta
    enc = FakeEncoder(prog.dims.hidden_size)
    rows = torch.cat([torch.arange(m.offset, m.offset + m.length) for m in req.media])
    vals = torch.cat([enc.encode(m) for m in req.media])
    h = prog.start_materialize(prog.plan_materialize(SequenceRequest(tuple(ids), 1, GREEDY))).sequence
    s = prog._seq(h)
    s.holding.table.ensure(N)
    prog._state.zero_entry(s.slot)
    fb = ForwardBatch(torch.tensor(ids), torch.arange(N), (N,), (0,), torch.tensor([prog._state.phys(s.slot)]),
                      s.holding.table.as_tensor(len(s.holding.table.pages))[None], rope_positions=rope,
                      embeds=(rows, vals))
    logits = prog.model.logits(prog.model.forward(fb))
    prog.release(h)
    return logits[P - 1:]


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_prompt_with_media_equals_one_forward_with_its_rows_and_positions(tiny_artifact_path, kind):
    prog = tiny_program(tiny_artifact_path, kind)
    prog.vision = FakeEncoder(prog.dims.hidden_size)
    req = _request()
    one = _generate(prog, req, [len(req.prompt_token_ids)], 12)
    assert prog.vision.calls == ["img-a", "img-b"]
    split = _generate(prog, req, [5, 8, 5], 12)                  # stages end inside both images
    assert split == one
    ref = _reference_logits(prog, req, one)
    assert ref.argmax(-1).tolist() == one
    # the positions matter: as plain text (no media rows, no MRoPE) the output differs
    plain = _generate(prog, SequenceRequest(req.prompt_token_ids, 12, GREEDY), [len(req.prompt_token_ids)], 12)
    assert plain != one


def test_speculative_rounds_after_media_use_the_rope_delta(tiny_artifact_path):
    K = 2
    base = tiny_program(tiny_artifact_path, "dense")
    base.vision = FakeEncoder(base.dims.hidden_size)
    want = _generate(base, _request(14), [18], 14)
    prog = tiny_program(tiny_artifact_path, "dense", speculative_method="mtp", num_speculative_tokens=K,
                        max_steps=K + 1)
    prog.vision = FakeEncoder(prog.dims.hidden_size)
    assert _generate(prog, _request(14, K=K), [7, 11], 14) == want


def test_media_without_an_encoder_or_with_bad_runs_is_refused(tiny_artifact_path):
    prog = tiny_program(tiny_artifact_path, "dense")
    assert not prog.supports_media
    r = prog.plan_materialize(_request())
    assert isinstance(r, Refusal) and "no vision tower" in r.reason
    prog.vision = FakeEncoder(prog.dims.hidden_size)
    req = _request()
    bad = SequenceRequest(req.prompt_token_ids, 4, GREEDY, media=(MediaInput("image", 16, 6, "x", None, (1, 4, 6)),))
    assert "leaves the prompt" in prog.plan_materialize(bad).reason
    bad = SequenceRequest(req.prompt_token_ids, 4, GREEDY, rope_positions=np.zeros((3, 5), dtype=np.int64))
    assert "rope_positions must be [3, 18]" in prog.plan_materialize(bad).reason


def test_logits_agree_with_the_reference_forward(tiny_artifact_path):
    prog = tiny_program(tiny_artifact_path, "dense")
    prog.vision = FakeEncoder(prog.dims.hidden_size)
    req = _request()
    s = prog.start_materialize(prog.plan_materialize(req)).sequence
    st, lg = prog.prefill_with_logits(s, 18)
    prog.commit(st.pending, [1])
    out = list(st.pending.rows[0].tokens)
    b, dl = prog.decode_with_logits([s], 3)
    prog.commit(b, [3])
    out += b.rows[0].tokens
    prog.release(s)
    ref = _reference_logits(prog, req, out)
    assert rel_rms(lg[-1], ref[0]) < 1e-5
    assert rel_rms(dl[0], ref[1:4]) < 1e-5


def test_the_artifact_vision_tower_encodes_each_media_input(tiny_artifact_path):
    """A Program over an artifact with the vision group gets the tower as its encoder: a media input's rows are
    the tower's output for its pixel values and grid (one image of 4 x 6 patches: 6 rows after the merge)."""
    prog = tiny_program(lambda kind, layout="text": tiny_artifact_path(kind), "dense")
    assert prog.supports_media
    tower = prog.vision.tower
    pv = np.random.default_rng(0).standard_normal((24, tower.view.patch_weight.shape[1])).astype(np.float32)
    m = MediaInput("image", 3, 6, "img-a", pv, (1, 4, 6))
    rows = prog.vision.encode(m)
    assert rows.shape == (6, prog.dims.hidden_size) and torch.isfinite(rows).all()
    torch.testing.assert_close(rows, tower.forward(torch.as_tensor(pv), [(1, 4, 6)]))
    req = _request()
    media = tuple(MediaInput(x.kind, x.offset, x.length, x.digest, pv if x.length == 6 else pv[:16], x.grid_thw)
                  for x in req.media)
    out = _generate(prog, SequenceRequest(req.prompt_token_ids, 6, GREEDY, media=media,
                                          rope_positions=req.rope_positions, rope_delta=req.rope_delta), [18], 6)
    assert len(out) == 6


def test_decode_steps_after_media_through_the_decode_graph_contract(tiny_artifact_path):
    """The rope delta reaches the decode graphs as data: decode steps of a prompt with media through the graphs'
    run contract (`EagerGraphs`: the graph's input layout and body, run eagerly) equal the eager steps."""
    from support.eager_graphs import EagerGraphs
    prog = tiny_program(tiny_artifact_path, "dense")
    prog.vision = FakeEncoder(prog.dims.hidden_size)
    eager = _generate(prog, _request(10), [18], 10)
    prog.graphs = EagerGraphs(prog, max_batch=4)
    graphed = _generate(prog, _request(10), [18], 10)
    assert prog.graphs.replays >= 9 and graphed == eager
