"""L2 prefetch hints (`ninfer.ops.fast.l2_prefetch`, the MoE gate|up kernel's down-weight prefetch):
they change no result.

GPU test (`pytest -m gpu`), skipped without CUDA and in Triton's interpreter (the hint is inline PTX,
sm_90+). Checks: the op runs on odd shapes and strides and in a CUDA graph and writes nothing; the
decode step's logits through the decode graphs are bitwise equal with the hints on and off (dense
and MoE tiny identities, PDL on as in production); the MoE decode kernels' output at the 35B-A3B
sizes is bitwise equal with the down prefetch on and off; a kernel after the prefetch kernel sees
its predecessor's writes (PDL ordering through the hint kernel).
"""
from __future__ import annotations

import importlib

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
if torch.cuda.get_device_capability()[0] < 9:
    pytest.skip("cp.async.bulk.prefetch needs sm_90", allow_module_level=True)

from ninfer.ops.fast import l2_prefetch as L2  # noqa: E402
from ninfer.ops.fast import moe as M  # noqa: E402


@pytest.fixture
def budget(monkeypatch):
    def set_mb(mb: float):
        monkeypatch.setattr(L2, "BUDGET_BYTES", int(mb * (1 << 20)))
    return set_mb


@pytest.mark.parametrize("shape", [(1, 8), (33, 1000), (5120, 6144), (70001, 24)])
def test_prefetch_rows_writes_nothing(shape, budget):
    budget(4)
    w = torch.randn(*shape, device="cuda").to(torch.bfloat16)
    wide = torch.randn(shape[0], shape[1] + 8, device="cuda").to(torch.bfloat16)
    before, before_wide = w.clone(), wide.clone()
    assert L2.prefetch_rows(w, 1) is None
    assert L2.prefetch_rows(wide[:, :shape[1]], 8) is None          # strided rows
    L2.prefetch_rows(w, 9)                                           # prefill rows: nothing launched
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        L2.prefetch_rows(w, 1)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(w, before) and torch.equal(wide, before_wide)


def test_kernel_after_the_hint_sees_the_writes_before_it(budget):
    """A PDL kernel writes h, the hint kernel runs, a PDL kernel reads h: with graphs replayed many
    times (any ordering bug shows as a stale read)."""
    from ninfer.ops.fast.fused import add_rms_norm
    budget(16)
    w = torch.randn(4096, 2048, device="cuda").to(torch.bfloat16)
    norm_w = torch.randn(2048, device="cuda").to(torch.bfloat16)
    x = torch.randn(1, 2048, device="cuda").to(torch.bfloat16)
    outs = []

    def chain():
        h = x
        for _ in range(20):
            h, _x = add_rms_norm(h, x, norm_w, 1e-6)
            L2.prefetch_rows(w, 1)
        outs.append(h)

    chain()
    want = outs.pop()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        chain()
    got = outs.pop()
    for _ in range(50):
        got.zero_()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(got, want)


@pytest.mark.parametrize("identity", ["qwen3_6-tiny-dense", "qwen3_6-tiny-moe"])
def test_decode_graphs_bitwise_equal_with_and_without_hints(identity, budget, monkeypatch):
    from ninfer.runtime.contract.types import SamplingParams, SequenceRequest
    from ninfer.targets.dummy_weights import DummyWeights
    from ninfer.targets.qwen3_6.runtime.config import ProgramConfig

    w = DummyWeights(identity, device="cuda", dtype=torch.bfloat16, seed=3)
    pkg = importlib.import_module(w.package.module)
    runs = []
    for on in (False, True):
        budget(8 if on else 0)
        monkeypatch.setattr(M, "PREFETCH_DOWN", on)
        cfg = ProgramConfig(device="cuda", dtype="bf16", page_size=16, num_pages=64, num_slots=4, max_model_len=96,
                            max_batch=2, max_steps=1)
        prog = pkg.create_program(w, cfg)
        assert prog.graphs is not None
        hs = []
        for r in range(2):
            req = SequenceRequest(prompt_token_ids=tuple(range(5 + r, 25 + 3 * r)), max_output_tokens=16,
                                  sampling=SamplingParams(temperature=0.0))
            h = prog.start_materialize(prog.plan_materialize(req)).sequence
            prog.commit(prog.prefill(h, len(req.prompt_token_ids)).pending, [1])
            hs.append(h)
        logits = []
        for step in range(6):
            batch, lg = prog.decode_with_logits(hs[: 1 + step % 2])
            prog.commit(batch, [1] * len(batch.rows))
            logits.append(lg)
        assert prog.graphs.replays >= 6
        runs.append(logits)
        del prog
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("with_shared", [False, True])
def test_moe_down_prefetch_changes_nothing(with_shared, monkeypatch):
    from ninfer.ops.moe import SharedExpert
    E, k, H, I = 256, 8, 2048, 512
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(1, H, device="cuda", generator=g).to(torch.bfloat16)
    logits = torch.randn(1, E, device="cuda", generator=g).to(torch.bfloat16)
    gate_up = (torch.randn(E, 2 * I, H, device="cuda", generator=g) * H ** -0.5).to(torch.bfloat16)
    down = (torch.randn(E, H, I, device="cuda", generator=g) * I ** -0.5).to(torch.bfloat16)
    shared = None
    if with_shared:
        y = torch.randn(1, 2 * I + 1, device="cuda", generator=g).to(torch.bfloat16)
        shared = SharedExpert(y[:, :2 * I], y[:, 2 * I:], (torch.randn(H, I, device="cuda", generator=g) * I ** -0.5)
                              .to(torch.bfloat16))
    outs = []
    for on in (False, True):
        monkeypatch.setattr(M, "PREFETCH_DOWN", on)
        assert (M._down_prefetch(down, 1, I, 8, M.DECODE_CONFIG.up_warps) is not None) == on
        outs.append(M.route_moe_experts(x, logits, k, gate_up, down, shared=shared))
    assert torch.equal(outs[0], outs[1])
