"""The vision tower on the GPU: the bf16 fast path (sdpa attention: flash / memory-efficient kernels, frames
of an entry as one batch) against the fp32 reference form, at the tiny and the real tower sizes; fp32 on CUDA
against transformers' model.visual; no full [L, L] score matrix in memory for a 1024 x 1024 image.

The rotary kernel (ninfer.ops.triton.vision_rope) against the PyTorch form also runs in Triton's CPU
interpreter (TRITON_INTERPRET=1 NINFER_FAST_TEST_DEVICE=cpu, support/fast_env.py).

Weights: unit-scale random tensors (LayerNorms 1 + 0.1 N(0, 1), small biases, matrices N(0, 1/fan_in)), so
every part of the block moves the output (the HF initialisation's and DummyWeights' near-zero LayerNorm
weights would not)."""
from __future__ import annotations

import pytest
import torch

from support.fast_env import DEV, INTERPRET
from support.numerics import rel_rms
from ninfer.targets.qwen3_6.program.vision import VisionTower, _rotate, load_vision_view
from ninfer.targets.qwen3_6.schema import tensor_specs
from ninfer.targets.registry import lookup
from ninfer.testing.tiny_hf import hf_vision_config_kwargs

pytestmark = [pytest.mark.gpu]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

BF16_TOL = 5e-2          # bf16 against fp32, the same bound as the Program's bf16 logits (test_program_cuda)
GRIDS = [(1, 6, 10), (1, 14, 8), (2, 4, 6)]


@pytest.fixture(autouse=True)
def no_tf32():
    """fp32 comparisons at 1e-4 need full fp32 GEMMs (TF32 keeps 10 mantissa bits)."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def unit_weights(dims, device, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for s in tensor_specs(dims, ("vision",)):
        if s.name.endswith(("norm1.weight", "norm2.weight", "norm.weight")):
            t = 1 + 0.1 * torch.randn(s.shape, generator=g, device=device)
        elif s.name.endswith("bias"):
            t = 0.02 * torch.randn(s.shape, generator=g, device=device)
        elif s.name.endswith("pos_embed.weight"):
            t = 0.5 * torch.randn(s.shape, generator=g, device=device)
        else:
            fan_in = 1
            for d in s.shape[1:]:
                fan_in *= d
            t = torch.randn(s.shape, generator=g, device=device) / fan_in ** 0.5
        out[s.name] = t
    return out


def pixels(dims, grids, device, seed: int = 1) -> torch.Tensor:
    v = dims.vision
    n = sum(t * h * w for t, h, w in grids)
    width = v.in_channels * v.temporal_patch_size * v.patch_size ** 2
    return torch.randn(n, width, generator=torch.Generator(device=device).manual_seed(seed), device=device)


@cuda
@pytest.mark.parametrize("identity, grids", [
    ("qwen3_6-tiny-dense", GRIDS),
    ("qwen3_6-tiny-moe", GRIDS),
    ("qwen3_6-27b", [(1, 32, 32), (2, 16, 24), (1, 4, 60)]),
    ("qwen3_6-35b-a3b", [(1, 20, 28), (3, 8, 8)]),
])
def test_bf16_fast_path_equals_the_fp32_reference(identity, grids):
    dims = lookup(identity).dims
    w = unit_weights(dims, "cuda")
    pv = pixels(dims, grids, "cuda")
    ref = VisionTower(load_vision_view(dims, w, "cuda", torch.float32), dims, "cuda", torch.float32,
                      attention="reference")(pv, grids)
    fast = VisionTower(load_vision_view(dims, w, "cuda", torch.bfloat16), dims, "cuda", torch.bfloat16)
    assert fast.attention == "sdpa"
    got = fast(pv.bfloat16(), grids)
    assert got.dtype == torch.bfloat16 and got.shape == ref.shape
    assert rel_rms(got.float(), ref) < BF16_TOL
    # fp32 sdpa on CUDA equals the fp32 reference form
    got32 = VisionTower(load_vision_view(dims, w, "cuda", torch.float32), dims, "cuda", torch.float32)(pv, grids)
    assert rel_rms(got32, ref) < 1e-4


@cuda
@pytest.mark.parametrize("option", [dict(gelu_epilogue=True), dict(sdpa_backends=["cudnn_attention"]),
                                    dict(sdpa_backends=["flash_attention"]),
                                    dict(sdpa_backends=["efficient_attention"])])
def test_the_towers_kernel_options_equal_the_fp32_reference(option):
    """The bf16 tower with fc1's cuBLASLt GELU epilogue, or under one SDPA kernel (a kernel this build or card
    lacks is skipped, saying so), equals the fp32 reference form at the 27B tower's size."""
    dims = lookup("qwen3_6-27b").dims
    grids = [(1, 32, 32), (2, 16, 24)]
    w = unit_weights(dims, "cuda")
    pv = pixels(dims, grids, "cuda")
    ref = VisionTower(load_vision_view(dims, w, "cuda", torch.float32), dims, "cuda", torch.float32,
                      attention="reference")(pv, grids)
    tower = VisionTower(load_vision_view(dims, w, "cuda", torch.bfloat16), dims, "cuda", torch.bfloat16, **option)
    try:
        got = tower(pv.bfloat16(), grids)
    except RuntimeError as e:
        if "sdpa_backends" in option and "No available kernel" in str(e):
            pytest.skip(f"{option['sdpa_backends'][0]} cannot run here: {str(e).splitlines()[0]}")
        raise
    assert rel_rms(got.float(), ref) < BF16_TOL


@cuda
@pytest.mark.parametrize("moe", [False, True])
def test_fp32_on_cuda_equals_hf_visual(moe):
    import transformers as tf
    dims = lookup("qwen3_6-tiny-moe" if moe else "qwen3_6-tiny-dense").dims
    cfg_cls = tf.Qwen3_5MoeVisionConfig if moe else tf.Qwen3_5VisionConfig
    model_cls = tf.Qwen3_5MoeVisionModel if moe else tf.Qwen3_5VisionModel
    w = unit_weights(dims, "cuda", seed=2)
    model = model_cls(cfg_cls(**hf_vision_config_kwargs(dims))).eval().cuda()
    model.load_state_dict({k[len("visual."):]: v for k, v in w.items()})
    pv = pixels(dims, GRIDS, "cuda")
    with torch.no_grad():
        ref = model(pv, grid_thw=torch.tensor(GRIDS, device="cuda")).pooler_output
    got = VisionTower(load_vision_view(dims, w, "cuda", torch.float32), dims, "cuda", torch.float32)(pv, GRIDS)
    assert rel_rms(got, ref) < 1e-4


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_patch_rows_looked_up_on_cuda_equal_the_host_rows(dtype):
    import numpy as np

    from ninfer.targets.qwen3_6.frontend.video_preprocess import preprocess_video
    from ninfer.targets.qwen3_6.frontend.vision_preprocess import (FAMILY_IMAGE_CONFIG, FAMILY_VIDEO_CONFIG,
                                                                    VisionPreprocessConfig, preprocess_image)
    from ninfer.targets.qwen3_6.program.vision import patch_rows_tensor
    cfg = VisionPreprocessConfig.from_dicts(FAMILY_IMAGE_CONFIG, FAMILY_VIDEO_CONFIG)
    rng = np.random.default_rng(3)
    for x in (preprocess_image(rng.integers(0, 256, (1024, 1024, 3), dtype=np.uint8), cfg),
              preprocess_video(rng.integers(0, 256, (7, 448, 448, 3), dtype=np.uint8), cfg, 2.0)):
        got = patch_rows_tensor(x.rows, "cuda", dtype)
        assert got.is_cuda and torch.equal(got.cpu(), torch.from_numpy(x.pixel_values).to(dtype))


@cuda
@pytest.mark.parametrize("grid", [(1, 64, 64), (15, 28, 28)])     # a 1024 x 1024 image, a 30-frame 448 x 448 video
def test_peak_memory_within_activation_bytes_and_no_score_matrix(grid):
    dims = lookup("qwen3_6-27b").dims
    tower = VisionTower(load_vision_view(dims, unit_weights(dims, "cuda"), "cuda", torch.bfloat16), dims, "cuda",
                        torch.bfloat16)
    pv = pixels(dims, [grid], "cuda").bfloat16()
    tower(pv, [grid])
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = tower(pv, [grid])
    torch.cuda.synchronize()
    added = torch.cuda.max_memory_allocated() - base
    t, h, w = grid
    L = h * w
    assert out.shape == (t * L // 4, dims.vision.out_hidden_size) and torch.isfinite(out).all()
    if t == 1:                                                 # one bf16 [heads, L, L] score matrix: 512 MiB
        assert added < dims.vision.num_heads * L * L * 2 // 2, f"{added / 2**20:.0f} MiB over the weights"
    assert added <= tower.activation_bytes([grid]), (added / 2**20, tower.activation_bytes([grid]) / 2**20)


@pytest.mark.parametrize("n, heads, dim, dtype", [(1, 2, 16, torch.float32), (37, 2, 16, torch.bfloat16),
                                                  (200, 16, 72, torch.bfloat16), (65, 16, 72, torch.float32)])
@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.skipif(not (torch.cuda.is_available() or INTERPRET), reason="needs CUDA or the Triton interpreter")
def test_vision_rope_kernel_equals_the_torch_form(n, heads, dim, dtype, strided):
    from ninfer.ops.triton.vision_rope import vision_rope_
    g = torch.Generator(device=DEV).manual_seed(n)
    base = torch.randn(n, 3 * heads * dim + (8 if strided else 0), generator=g, device=DEV).to(dtype)
    qkv = base[:, :3 * heads * dim].view(n, 3, heads, dim)
    ang = torch.rand(n, dim // 2, generator=g, device=DEV) * 40
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    want = _rotate(qkv[:, :2], cos, sin).to(dtype)
    v_before, tail_before = qkv[:, 2].clone(), base[:, 3 * heads * dim:].clone()
    vision_rope_(qkv, cos, sin)
    tol = 0 if dtype == torch.float32 else 2 ** -7        # a bf16 rounding step of the stored value
    torch.testing.assert_close(qkv[:, :2].float(), want.float(), rtol=tol, atol=tol + 1e-6)
    assert torch.equal(qkv[:, 2], v_before) and torch.equal(base[:, 3 * heads * dim:], tail_before)
