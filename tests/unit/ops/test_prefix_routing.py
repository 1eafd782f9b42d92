"""The routing of a prompt chunk's attention over its prefix and the cuDNN call shapes the serve warmup
plans (`ninfer.ops.reference.prefix_routing`; the forms themselves run on CUDA: tests/gpu/test_prefill_ops_gpu.py)."""
import pytest

from ninfer.ops.reference import prefix_routing as pr
from ninfer.ops.reference.attention import sdpa_rows


def _stages(n: int, stage: int):
    """(L, C) of each stage after the first of an uncached n-token prompt in `stage`-token stages."""
    return [(min(stage, n - P), P + min(stage, n - P)) for P in range(stage, n, stage)]


def test_prefix_form_picks_each_form():
    H, D = 24, 256
    assert pr.prefix_form(H, D, 500, 500) == "self"
    assert pr.prefix_form(H, D, 4096, 8192) == "pad"             # 1.33x the chunk's own work
    assert pr.prefix_form(H, D, 8192, 32768) == "split"          # 4.1e12 FLOPs
    assert pr.prefix_form(H, D, 64, 3000) == "flash"             # a short chunk far from its start
    assert pr.prefix_form(H, D, 8192, 32768, cudnn=False) == "flash"
    assert pr.prefix_form(H, D, 4096, 8192, cudnn=False) == "flash"


def test_prefix_form_without_cudnn_split(monkeypatch):
    monkeypatch.setattr(pr, "cudnn_split_ok", False)
    assert pr.prefix_form(24, 256, 8192, 32768) == "flash"
    assert pr.prefix_form(24, 256, 4096, 8192) == "pad"


def test_cudnn_calls_name_each_plan():
    H, D = 24, 256
    assert pr.cudnn_calls(H, D, 64, 3000) == ()
    assert pr.cudnn_calls(H, D, 4096, 8192) == (("causal", sdpa_rows(8192)),)
    P0, rem = pr.split_bounds(8000, 8000 + 20000)
    assert (P0, rem) == (18432, 1568)
    assert pr.cudnn_calls(H, D, 8000, 28000) == (("cross", sdpa_rows(8000), 18432),
                                                 ("causal_lse", sdpa_rows(1568 + 8000)))


@pytest.mark.parametrize("stage,max_prompt,grain,min_flops", [
    (512, 4000, 128, 2e8), (512, 4000, 2048, 2e8), (256, 3000, 128, 1e9), (8192, 40000, 2048, 1e12)])
def test_plan_shapes_cover_every_uncached_prompt(monkeypatch, stage, max_prompt, grain, min_flops):
    """Every cuDNN call of every stage after the first of every uncached prompt up to max_prompt tokens is
    among the planned shapes' calls; each planned shape brings a call no earlier one made, and they come in
    the order of their prefixes (shortest contexts first: what a warmup budget keeps)."""
    monkeypatch.setattr(pr, "SPLIT_GRAIN", grain)
    monkeypatch.setattr(pr, "SPLIT_MIN_FLOPS", min_flops)
    H, D = 8, 128
    shapes = pr.prefix_plan_shapes(H, D, stage, max_prompt)
    planned, forms = set(), set()
    for L, C in shapes:
        new = set(pr.cudnn_calls(H, D, L, C)) - planned
        assert new, (L, C)
        planned |= new
        forms.add(pr.prefix_form(H, D, L, C))
    assert "split" in forms and any(c[0] == "causal" for c in planned)     # both cuDNN forms occur
    assert [C - L for L, C in shapes] == sorted(C - L for L, C in shapes)
    step = 1 if max_prompt <= 4000 else 97
    for n in range(1, max_prompt + 1, step):
        for L, C in _stages(n, stage):
            assert set(pr.cudnn_calls(H, D, L, C)) <= planned, (n, L, C)
    # a prompt of one stage meets none of them (the one-stage warmup lengths plan its own)
    assert all(C > stage for _, C in shapes)


def test_plan_shapes_none_within_one_stage():
    assert pr.prefix_plan_shapes(24, 256, 8192, 8192) == []
    assert pr.prefix_plan_shapes(24, 256, 8192, 100) == []
