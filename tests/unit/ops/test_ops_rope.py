import pytest
import torch
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding, apply_rotary_pos_emb

from ninfer.ops.reference.rope import apply_rotary, apply_rotary_qk, mrope_axis_of_freq, mrope_cos_sin
from support.ops_util import DEVICES
from support.numerics import rel_rms

ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10], "mrope_interleaved": True}


def _hf_rotary(device, head_dim=256):
    cfg = Qwen3_5TextConfig(head_dim=head_dim, rope_parameters=dict(ROPE))
    return Qwen3_5TextRotaryEmbedding(cfg).to(device)


def test_axis_assignment_interleaved():
    axis = mrope_axis_of_freq(32, (11, 11, 10))
    assert axis[:6] == [0, 1, 2, 0, 1, 2]
    assert axis[30] == 0 and axis[31] == 1 and axis[29] == 2
    assert axis.count(1) == 11 and axis.count(2) == 10 and axis.count(0) == 11
    assert mrope_axis_of_freq(8, (3, 3, 2), interleaved=False) == [0, 0, 0, 1, 1, 1, 2, 2]
    with pytest.raises(ValueError):
        mrope_axis_of_freq(32, (11, 11, 11))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_3d_positions_match_hf(device, dtype):
    g = torch.Generator().manual_seed(0)
    T = 65
    pos3 = torch.randint(0, 5000, (3, 1, T), generator=g).to(device)
    x = torch.randn(1, T, 256, device=device, dtype=dtype)
    cos_hf, sin_hf = _hf_rotary(device)(x, pos3)                      # [1, T, 64] in dtype
    cos, sin = mrope_cos_sin(pos3[:, 0], head_dim=256, **{k: ROPE[k] for k in ("mrope_section",)},
                             rope_theta=1e7)
    assert cos.shape == (T, 64) and cos.dtype == torch.float32
    torch.testing.assert_close(cos.to(dtype), cos_hf[0], rtol=0, atol=0)
    torch.testing.assert_close(sin.to(dtype), sin_hf[0], rtol=0, atol=0)
    q = torch.randn(1, 6, T, 256, generator=g).to(device, dtype)    # HF layout [B, H, T, D]
    k = torch.randn(1, 2, T, 256, generator=g).to(device, dtype)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos_hf, sin_hf)
    q_n, k_n = apply_rotary_qk(q[0].transpose(0, 1), k[0].transpose(0, 1), cos, sin)  # ours [T, H, D]
    torch.testing.assert_close(q_n, q_hf[0].transpose(0, 1), rtol=0, atol=0)
    torch.testing.assert_close(k_n, k_hf[0].transpose(0, 1), rtol=0, atol=0)
    assert torch.equal(q_n[..., 64:], q[0].transpose(0, 1)[..., 64:])


def test_text_positions_are_plain_partial_rope():
    T, D, rot = 500, 256, 64
    pos = torch.arange(T) + 3
    cos, sin = mrope_cos_sin(pos, head_dim=D)
    cos3, sin3 = mrope_cos_sin(pos.expand(3, T), head_dim=D)
    assert torch.equal(cos, cos3) and torch.equal(sin, sin3)
    # float64 explicit rotation of the first rot dims by angle pos * theta^(-2j/rot), NeoX halves
    x = torch.randn(T, 4, D, dtype=torch.float64)
    inv = 1e7 ** (-torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ang = pos.double()[:, None] * inv                                  # [T, 32]
    c, s = ang.cos()[:, None], ang.sin()[:, None]
    x1, x2 = x[..., :rot // 2], x[..., rot // 2:rot]
    exp = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, x[..., rot:]], -1)
    got = apply_rotary(x.float(), cos, sin)
    assert rel_rms(got, exp) < 1e-6
    # batched positions [3, B, T] broadcast over [B, T, H, D]
    cb, sb = mrope_cos_sin(torch.stack([pos, pos])[None].expand(3, 2, T), head_dim=D)
    xb = torch.stack([x.float(), x.float()])
    torch.testing.assert_close(apply_rotary(xb, cb, sb)[1], got)


def test_rejects_bad_positions():
    with pytest.raises(ValueError):
        mrope_cos_sin(torch.zeros(2, 5, dtype=torch.long), head_dim=256)
