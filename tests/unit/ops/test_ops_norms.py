import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm, Qwen3_5RMSNormGated
from transformers.models.qwen3_5.modeling_qwen3_5 import l2norm as hf_l2norm

from ninfer.ops.reference.norms import gated_rms_norm, l2norm, rms_norm
from support.ops_util import DEVICES
from support.numerics import rel_rms


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_hf(device, dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(5, 3, 64, generator=g) * 3).to(device, dtype)
    w = (torch.randn(64, generator=g) * 0.1).to(device, dtype)
    ref = Qwen3_5RMSNorm(64).to(device, dtype)
    with torch.no_grad():
        ref.weight.copy_(w)
        expected = ref(x)
    y = rms_norm(x, w)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    # (1 + w), not w: a zero weight is the identity normalisation
    xd = x.double()
    plain = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert rel_rms(rms_norm(x, torch.zeros_like(w)), plain) < (1e-6 if dtype == torch.float32 else 5e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,wdtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                          (torch.bfloat16, torch.float32)])
def test_gated_rms_norm_matches_hf(device, dtype, wdtype):
    g = torch.Generator().manual_seed(1)
    o = torch.randn(7, 4, 32, generator=g).to(device, dtype)
    z = torch.randn(7, 4, 32, generator=g).to(device, dtype)
    w = (1 + 0.1 * torch.randn(32, generator=g)).to(device, wdtype)
    ref = Qwen3_5RMSNormGated(32).to(device)
    with torch.no_grad():
        ref.weight.data = w.clone()
        expected = ref(o, z)
    y = gated_rms_norm(o, z, w)
    assert y.dtype == dtype
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    od, zd, wd = o.double(), z.double(), w.double()
    exact = wd * od * torch.rsqrt(od.pow(2).mean(-1, keepdim=True) + 1e-6) * torch.nn.functional.silu(zd)
    assert rel_rms(y, exact) < (1e-6 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_l2norm(dtype):
    x = torch.randn(3, 9, 128, generator=torch.Generator().manual_seed(2)).to(dtype)
    y = l2norm(x)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, hf_l2norm(x.float()), rtol=0, atol=0)
    torch.testing.assert_close(y.norm(dim=-1), torch.ones(3, 9), rtol=1e-5, atol=1e-5)
    assert torch.all(l2norm(torch.zeros(2, 4)) == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gdn_output_projection_is_the_hf_order(dtype):
    """The GDN leaf's output step with the reference op set == the HF order: gated RMSNorm per head,
    heads flattened, then the projection; a z view into a wider row; zero rows keep their shape."""
    from types import SimpleNamespace

    from ninfer.ops.opset import reference_ops
    from ninfer.targets.qwen3_6.layers.gdn import GDNProjection
    g = torch.Generator().manual_seed(3)
    o = torch.randn(5, 4, 32, generator=g).to(dtype)
    row = torch.randn(5, 3 * 128, generator=g).to(dtype)
    z = row[:, 128:256].view(5, 4, 32)
    w = (1 + 0.1 * torch.randn(32, generator=g)).to(dtype)
    proj = (0.1 * torch.randn(24, 128, generator=g)).to(dtype)
    leaf = GDNProjection(SimpleNamespace(linear_num_value_heads=4, linear_value_head_dim=32, rms_norm_eps=1e-6))
    weights = SimpleNamespace(norm=w, out_proj=proj)
    ref = Qwen3_5RMSNormGated(32)
    with torch.no_grad():
        ref.weight.data = w.clone()
        expected = torch.nn.functional.linear(ref(o, z).reshape(5, 128), proj)
    torch.testing.assert_close(leaf.output(weights, o, z, reference_ops()), expected, rtol=0, atol=0)
    assert leaf.output(weights, o[:0], z[:0], reference_ops()).shape == (0, 24)
