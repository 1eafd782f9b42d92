"""Speculative rounds with the MTP layer on the GPU (tiny identities, synthetic weights): the fast MTP step
equals the reference ops, the round's CUDA graph equals the eager round, greedy output with speculation
equals the plain decode graphs' (fp32), and nothing leaks. (The CPU twins: tests/unit/qwen3_6/
test_speculative_program.py.)"""
from __future__ import annotations

import importlib

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from support.numerics import rel_rms  # noqa: E402
from support.program_util import materialize, run_rows  # noqa: E402
from ninfer.contract.program import SamplingParams  # noqa: E402
from ninfer.ops.opset import reference_ops  # noqa: E402
from ninfer.targets.dummy_weights import DummyWeights  # noqa: E402
from ninfer.targets.qwen3_6.program.config import ProgramConfig  # noqa: E402
from ninfer.targets.qwen3_6.program.model import Qwen36Model  # noqa: E402

IDS = ["qwen3_6-tiny-dense", "qwen3_6-tiny-moe"]
GREEDY = SamplingParams(temperature=0.0)


def _program(identity, dtype, K=0, **kw):
    w = DummyWeights(identity, device="cuda", dtype=dtype, seed=7, std=0.2)
    pkg = importlib.import_module(w.package.module)
    spec = dict(speculative_method="mtp", num_speculative_tokens=K) if K else {}
    cfg = ProgramConfig(device="cuda", dtype="fp32" if dtype == torch.float32 else "bf16", page_size=16,
                        num_pages=200, num_slots=8, max_model_len=1024, max_batch=4, max_steps=max(K + 1, 2),
                        **spec, **kw)
    return w, pkg.create_program(w, cfg)


def _prompts(w, n, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, w.dims.vocab_size, (5 + 7 * i,), generator=g).tolist() for i in range(n)]


@pytest.mark.parametrize("identity", IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_mtp_step_equals_the_reference_ops(identity, dtype):
    w, prog = _program(identity, dtype, K=3)
    ref = Qwen36Model(prog.model.view, prog.model.leaves, prog._kv, prog._state, ops=reference_ops())
    p = _prompts(w, 1)[0]
    s = materialize(prog, p, 8, GREEDY, lookahead=3)
    st = prog.prefill(s, len(p))
    prog.commit(st.pending, [1])
    ls = prog._seq(s)
    tables, rows = prog.block_tables([ls]), torch.zeros(1, dtype=torch.long, device="cuda")
    outs, fed = {}, []
    # NOTE: the reference chain first; the fast one is fed the reference's drafts (a bf16 near-tie may pick
    #       another draft, after which the chains are not comparable).
    for name, model in (("ref", ref), ("fast", prog.model)):
        h = prog.anchors([ls.slot])
        x = torch.tensor([ls.tokens[-1]], device="cuda")
        lgs = []
        for i in range(3):
            h = model.mtp_step(h, x, torch.tensor([ls.frontier - 1 + i], device="cuda"), tables, rows)
            lg = model.logits(h)
            if name == "ref":
                fed.append(lg.argmax(-1))
            x = fed[i]
            lgs.append(lg.float())
        outs[name] = lgs
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for a, b in zip(outs["fast"], outs["ref"]):
        assert rel_rms(a, b) < tol
    prog.release(s)


@pytest.mark.parametrize("identity", IDS)
def test_graph_round_equals_eager_round(identity):
    # NOTE: every draft kept (force_accept_len K+1), so the whole commit path runs; fp32.
    K = 3
    w, prog = _program(identity, torch.float32, K=K, force_accept_len=K + 1)
    assert prog.spec_graphs is not None and prog.graphs is not None   # the decode graphs: last prompt tokens
    prompts = _prompts(w, 3)
    r0 = prog.spec_graphs.replays
    graph = run_rows(prog, prompts, 33)[0]
    assert prog.spec_graphs.replays > r0
    prog.graphs_enabled = False
    r1 = prog.spec_graphs.replays
    eager = run_rows(prog, prompts, 33)[0]
    assert prog.spec_graphs.replays == r1
    same = sum(a == b for g, e in zip(graph, eager) for a, b in zip(g, e))
    assert same >= 0.95 * sum(len(g) for g in graph), (graph, eager)


@pytest.mark.parametrize("identity", IDS)
@pytest.mark.parametrize("K", [1, 3])
def test_speculative_greedy_equals_plain_decode_graphs(identity, K):
    w, plain = _program(identity, torch.float32)
    prompts = _prompts(w, 4, seed=K)
    ref = run_rows(plain, prompts, 40)[0]
    del plain
    _, prog = _program(identity, torch.float32, K=K)
    out = run_rows(prog, prompts, 40)[0]
    # NOTE: fp32; the verify's GEMMs run at B * (K+1) rows where the decode graph's run at B: a row may fork at
    #       a near-tie of its logits, nowhere else.
    for o, r in zip(out, ref):
        first = next((i for i, (a, b) in enumerate(zip(o, r)) if a != b), len(r))
        assert first >= 20, (o, r)
