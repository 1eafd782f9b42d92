"""The vision tower (ninfer.targets.qwen3_6.program.vision) against transformers' `model.visual`, fp32 on the CPU.

Inputs: one call with several grids, two images of different sizes (one larger than the tiny 8 x 8 position
table, one smaller in a dimension: both interpolation directions) and one video of 2 temporal groups (two
attention segments); random pixel values of the right shape.

  - the tiny VL artifacts (converted from the checkpoints transformers wrote) against
    `Qwen3_5(Moe)ForConditionalGeneration.model.visual` of the same seed, both attention forms;
  - sharpened random weights (unit-scale LayerNorms, biases, a unit-scale position table), where a wrong
    segment, rotary axis, position order or GELU form moves the output by far more than the tolerance
    (the HF initialisation's near-zero weights hide some of them);
  - input checks, and the bench script on the tiny identity.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from support.bench_scripts import json_line, load_bench_script
from support.numerics import rel_rms
from ninfer.artifact import open_artifact
from ninfer.targets.qwen3_6.program.vision import VisionTower, load_vision_view, vision_output_rows
from ninfer.targets.registry import lookup
from ninfer.testing.tiny_hf import KINDS, build_hf_model, hf_vision_config_kwargs

GRIDS = [(1, 6, 10), (1, 14, 8), (2, 4, 6)]      # image, image, video of 2 temporal groups
TOL = 1e-5


def pixels(dims, grids=GRIDS, seed: int = 0) -> torch.Tensor:
    v = dims.vision
    n = sum(t * h * w for t, h, w in grids)
    width = v.in_channels * v.temporal_patch_size * v.patch_size ** 2
    return torch.randn(n, width, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def hf_vl():
    cache = {}

    def get(kind):
        if kind not in cache:
            cache[kind] = build_hf_model(kind, "vl", seed=0)
        return cache[kind]
    return get


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_tower_equals_hf_visual_on_the_tiny_artifact(kind, tiny_artifact_path, hf_vl):
    dims = lookup(KINDS[kind]).dims
    model = hf_vl(kind)
    pv = pixels(dims)
    with torch.no_grad():
        out = model.model.visual(pv, grid_thw=torch.tensor(GRIDS))
        # what the language model takes: the merged rows per entry (get_image_features' split), nothing else
        per_entry = model.model.get_image_features(pv, torch.tensor(GRIDS)).pooler_output
    ref = out.pooler_output
    m = dims.vision.spatial_merge_size
    assert out.last_hidden_state.shape[0] == pv.shape[0]           # the pre-merger states, unused by the LM
    assert [e.shape[0] for e in per_entry] == vision_output_rows(GRIDS, m) == [15, 28, 12]
    with open_artifact(tiny_artifact_path(kind)) as art:
        view = load_vision_view(dims, art, "cpu", torch.float32)
        for attention in ("reference", "sdpa"):
            got = VisionTower(view, dims, "cpu", torch.float32, attention=attention).forward(pv, GRIDS)
            assert got.shape == (sum(vision_output_rows(GRIDS, m)), dims.vision.out_hidden_size)
            assert got.dtype == torch.float32
            assert rel_rms(got, ref) < TOL, attention


def sharp_hf_visual(kind: str, seed: int):
    """transformers' vision model of the identity's dims (the MoE identity's is Qwen3_5MoeVisionModel), its
    weights redrawn at unit scale."""
    import transformers as tf
    dims = lookup(KINDS[kind]).dims
    cfg_cls = tf.Qwen3_5MoeVisionConfig if dims.is_moe else tf.Qwen3_5VisionConfig
    model_cls = tf.Qwen3_5MoeVisionModel if dims.is_moe else tf.Qwen3_5VisionModel
    model = model_cls(cfg_cls(**hf_vision_config_kwargs(dims))).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm1.weight", "norm2.weight", "norm.weight")):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name == "pos_embed.weight":
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)
    weights = {"visual." + k: v for k, v in model.state_dict().items()}
    return dims, model, weights


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_tower_equals_hf_visual_with_sharp_weights(kind):
    dims, model, weights = sharp_hf_visual(kind, seed=3)
    grids = GRIDS + [(1, 2, 2), (3, 8, 8)]       # a 2 x 2 image (one merge block), the table's own size
    pv = pixels(dims, grids, seed=1)
    with torch.no_grad():
        ref = model(pv, grid_thw=torch.tensor(grids)).pooler_output
    view = load_vision_view(dims, weights, "cpu", torch.float32)
    for attention in ("reference", "sdpa"):
        got = VisionTower(view, dims, "cpu", torch.float32, attention=attention)(pv, grids)
        assert rel_rms(got, ref) < TOL, attention
    # entries do not interact: each alone gives its rows of the joint call
    tower = VisionTower(view, dims, "cpu", torch.float32)
    rows = vision_output_rows(grids, dims.vision.spatial_merge_size)
    start, r0 = 0, 0
    for g, r in zip(grids, rows):
        n = g[0] * g[1] * g[2]
        alone = tower(pv[start:start + n], [g])
        assert rel_rms(alone, ref[r0:r0 + r]) < TOL
        start, r0 = start + n, r0 + r


def test_grid_as_tensor_and_bf16_view():
    dims, _, weights = sharp_hf_visual("dense", seed=4)
    view = load_vision_view(dims, weights, "cpu", torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in (view.patch_weight, view.pos_embed, view.blocks[0].qkv_weight))
    assert view.patch_weight.shape == (dims.vision.hidden_size, 1536)
    pv = pixels(dims)
    tower = VisionTower(view, dims, "cpu", torch.bfloat16)
    a = tower(pv, torch.tensor(GRIDS))
    b = tower(pv.bfloat16(), GRIDS)
    assert a.dtype == torch.bfloat16 and torch.equal(a, b)
    ref = VisionTower(load_vision_view(dims, weights, "cpu", torch.float32), dims, "cpu", torch.float32)(pv, GRIDS)
    assert rel_rms(a.float(), ref) < 5e-2


def test_bad_inputs_are_refused_with_a_clear_error():
    dims, _, weights = sharp_hf_visual("dense", seed=5)
    tower = VisionTower(load_vision_view(dims, weights, "cpu", torch.float32), dims, "cpu", torch.float32)
    pv = pixels(dims)
    with pytest.raises(ValueError, match=r"describes 220"):
        tower(pv[:-1], GRIDS)
    with pytest.raises(ValueError, match=r"\[patches, 1536\]"):
        tower(pv[:, :-1], GRIDS)
    with pytest.raises(ValueError, match=r"multiples of the merge size 2"):
        tower(pixels(dims, [(1, 3, 4)]), [(1, 3, 4)])
    with pytest.raises(ValueError, match=r"must be positive"):
        tower(pv, [(0, 6, 10)])
    with pytest.raises(ValueError, match=r"must be \(t, h, w\)"):
        tower(pv, [(6, 10)])
    with pytest.raises(ValueError, match=r"empty"):
        tower(pv, [])
    with pytest.raises(ValueError, match="attention must be"):
        VisionTower(tower.view, dims, "cpu", torch.float32, attention="flash")
    with pytest.raises(ValueError, match="unknown SDPA backend 'fast'"):
        VisionTower(tower.view, dims, "cpu", torch.float32, attention="sdpa", sdpa_backends=["math", "fast"])
    with pytest.raises(ValueError, match="sdpa_backends is empty"):
        VisionTower(tower.view, dims, "cpu", torch.float32, attention="sdpa", sdpa_backends=[])
    # the sdpa form under a chosen kernel order equals the reference form
    chosen = VisionTower(tower.view, dims, "cpu", torch.float32, attention="sdpa", sdpa_backends=["math"])
    assert rel_rms(chosen(pv, GRIDS), tower(pv, GRIDS)) < 1e-5
    with pytest.raises(ValueError, match="no vision tower"):
        load_vision_view(dataclasses.replace(dims, vision=None), weights, "cpu", torch.float32)

    class TextOnly:
        def has_group(self, group):
            return group != "vision"

        def tensor(self, name):
            raise AssertionError("not read")
    with pytest.raises(ValueError, match="store no vision tower"):
        load_vision_view(dims, TextOnly(), "cpu", torch.float32)
    bad = dict(weights)
    bad["visual.pos_embed.weight"] = bad["visual.pos_embed.weight"][:-1]
    with pytest.raises(ValueError, match="visual.pos_embed.weight has shape"):
        load_vision_view(dims, bad, "cpu", torch.float32)


def test_vision_encode_bench_runs_on_the_cpu(capsys):
    rc = load_bench_script("vision_encode").main([
        "--device", "cpu", "--identity", "qwen3_6-tiny-dense", "qwen3_6-tiny-moe", "--image", "64x96",
        "--video", "4x32x64", "--reps", "1", "--no-ceilings", "--sdpa-backends", "math"])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json_line(out)
    rows = data["results"]
    assert [(r["identity"], r["media"]) for r in rows] == [
        ("qwen3_6-tiny-dense", "image 64x96"), ("qwen3_6-tiny-dense", "video 4x32x64"),
        ("qwen3_6-tiny-moe", "image 64x96"), ("qwen3_6-tiny-moe", "video 4x32x64")]
    assert rows[0]["grid"] == [1, 4, 6] and rows[1]["grid"] == [2, 2, 4] and rows[1]["tokens"] == 4
    assert all(r["ninfer_ms"] > 0 and r["hf_ms"] > 0 and r["rel_rms_vs_hf"] < 1e-5 for r in rows)
    assert all(r["ninfer_math_ms"] > 0 for r in rows)
    assert not data["errors"]


def test_activation_bytes_grows_with_the_media_and_counts_the_reference_scores():
    dims = lookup("qwen3_6-27b").dims
    view = None                                               # the bound reads dims only
    sdpa = VisionTower(view, dims, "cpu", torch.bfloat16, attention="sdpa")
    ref = VisionTower(view, dims, "cpu", torch.bfloat16, attention="reference")
    image, video = [(1, 64, 64)], [(15, 28, 28)]
    assert 0 < sdpa.activation_bytes([(1, 32, 32)]) < sdpa.activation_bytes(image) < sdpa.activation_bytes(video)
    # the reference form holds a [heads, L, L] fp32 score matrix (and its softmax): over 1 GiB for the image
    assert ref.activation_bytes(image) - sdpa.activation_bytes(image) > 2 * 16 * 4096 ** 2 * 4
    with pytest.raises(ValueError, match="multiples of the merge size"):
        sdpa.activation_bytes([(1, 3, 3)])
