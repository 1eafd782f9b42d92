import pytest
import torch
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5MLP
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeSparseMoeBlock

from ninfer.ops.reference.mlp import swiglu_mlp
from ninfer.ops.reference.moe import route_topk, sparse_moe_block
from support.ops_util import DEVICES
from support.numerics import rel_rms

H, E, K, I, IS = 32, 8, 2, 16, 24


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_matches_hf(dtype):
    torch.manual_seed(0)
    ref = Qwen3_5MLP(Qwen3_5TextConfig(hidden_size=H), intermediate_size=I).to(dtype)
    x = torch.randn(65, H).to(dtype)
    with torch.no_grad():
        expected = ref(x)
    y = swiglu_mlp(x, ref.gate_proj.weight, ref.up_proj.weight, ref.down_proj.weight)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    xd = x.double()
    g, u, d = (w.double() for w in (ref.gate_proj.weight, ref.up_proj.weight, ref.down_proj.weight))
    exact = (torch.nn.functional.silu(xd @ g.T) * (xd @ u.T)) @ d.T
    assert rel_rms(y, exact) < (1e-6 if dtype == torch.float32 else 2e-2)


def _hf_block(dtype, device):
    cfg = Qwen3_5MoeTextConfig(hidden_size=H, num_experts=E, num_experts_per_tok=K,
                               moe_intermediate_size=I, shared_expert_intermediate_size=IS)
    block = Qwen3_5MoeSparseMoeBlock(cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return block.to(device, dtype)


def _ours(block, x):
    return sparse_moe_block(
        x, block.gate.weight, block.experts.gate_up_proj, block.experts.down_proj, K,
        block.shared_expert.gate_proj.weight, block.shared_expert.up_proj.weight,
        block.shared_expert.down_proj.weight, block.shared_expert_gate.weight,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 65])
def test_moe_block_matches_hf(device, dtype, T):
    block = _hf_block(dtype, device)
    x = torch.randn(2, T, H, generator=torch.Generator().manual_seed(T)).to(device, dtype)
    with torch.no_grad():
        expected = block(x)
    y = _ours(block, x)
    assert y.shape == x.shape and y.dtype == dtype
    assert rel_rms(y, expected) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_moe_against_explicit_float64():
    block = _hf_block(torch.float32, "cpu")
    x = torch.randn(40, H, generator=torch.Generator().manual_seed(3))
    y = _ours(block, x)
    xd = x.double()
    p = torch.softmax(xd @ block.gate.weight.double().T, -1)
    out = torch.zeros_like(xd)
    gu, dn = block.experts.gate_up_proj.double(), block.experts.down_proj.double()
    for t in range(40):
        top = torch.argsort(p[t], descending=True)[:K]
        w = p[t, top] / p[t, top].sum()
        for wi, e in zip(w, top):
            h = gu[e] @ xd[t]
            out[t] += wi * (dn[e] @ (torch.nn.functional.silu(h[:I]) * h[I:]))
    se = block.shared_expert
    sh = (torch.nn.functional.silu(xd @ se.gate_proj.weight.double().T) * (xd @ se.up_proj.weight.double().T)) \
        @ se.down_proj.weight.double().T
    out += torch.sigmoid(xd @ block.shared_expert_gate.weight.double().T) * sh
    assert rel_rms(y, out) < 1e-6


def test_route_topk():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0], [5.0, 5.5, -3.0, 0.0]], dtype=torch.bfloat16)
    r = route_topk(logits, 2)
    assert r.ids.tolist() == [[1, 2], [1, 0]]
    assert r.weights.dtype == torch.bfloat16
    p = torch.softmax(logits.float(), -1)
    torch.testing.assert_close(r.weights.float(), (p[[[0], [1]], r.ids] / p[[[0], [1]], r.ids].sum(-1, keepdim=True)),
                               rtol=1e-2, atol=1e-2)


def test_sparse_moe_leaf_takes_normed_rows_and_leaves_the_residual_to_the_caller():
    """The SparseMoE leaf (fused shared_in rows, zero padding after them) on the reference ops ==
    sparse_moe_block on the normed rows, whether it is given them normed or as NormedRows (a mixer that
    folded its residual add); with a residual the reference returns the plain delta and leaves the residual
    untouched: only the fast set adds into it (tests/gpu/test_fast_moe_gpu.py)."""
    import dataclasses

    from ninfer.ops.opset import reference_ops
    from ninfer.ops.reference.fused import NormedRows, Residual
    from ninfer.ops.reference.norms import rms_norm
    from ninfer.targets.qwen3_6_35b_a3b import DIMS
    from ninfer.targets.qwen3_6.layers.moe import SparseMoE
    block = _hf_block(torch.float32, "cpu")
    se = block.shared_expert
    mlp = {"shared_in.weight": torch.cat([se.gate_proj.weight, se.up_proj.weight, block.shared_expert_gate.weight,
                                          block.gate.weight, torch.zeros(3, H)]).detach(),
           "shared_expert.gate_proj.weight": se.gate_proj.weight.detach(),
           "shared_expert.down_proj.weight": se.down_proj.weight.detach(),
           "experts.gate_up_proj": block.experts.gate_up_proj.detach(),
           "experts.down_proj": block.experts.down_proj.detach()}
    leaf = SparseMoE(dataclasses.replace(DIMS, num_experts=E, num_experts_per_tok=K))
    g = torch.Generator().manual_seed(7)
    raw, nw, r0 = torch.randn(65, H, generator=g), 0.1 * torch.randn(H, generator=g), torch.randn(65, H, generator=g)
    h = rms_norm(raw, nw, 1e-6)
    with torch.no_grad():
        want = _ours(block, h)
        ops = reference_ops()
        assert rel_rms(leaf(mlp, h, ops), want) < 1e-6
        r = r0.clone()
        out = leaf(mlp, NormedRows(raw, nw, 1e-6), ops, residual=r)
    assert not isinstance(out, Residual) and torch.equal(r, r0)
    assert rel_rms(out, want) < 1e-6
