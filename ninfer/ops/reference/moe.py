"""Mixture-of-experts FFN of the 35B-A3B model (HF `Qwen3_5MoeSparseMoeBlock`).

    logits = x @ router.T                          [T, E] in x.dtype
    p      = softmax(logits.float())               over all E experts, fp32
    w, idx = topk(p, k);  w = (w / sum w).to(logits.dtype)     always renormalised
    routed = Σ_k w_k · down_e(silu(gate_e x) * up_e x)         fused weights, gate rows first
    out    = routed + sigmoid(x @ shared_expert_gate.T) · SwiGLU_shared(x)
Ties in top-k are broken by torch.topk (unspecified order, as HF).

`moe_experts(..., shared=SharedExpert(gate_up, gate, down))` adds the gated shared expert to the
routed sum (its gate|up rows and gate logit already projected, e.g. by the leaf's fused GEMM), so a
fast implementation can run it as one more expert inside the same kernels.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ninfer.ops.reference.fused import silu_mul_halves
from ninfer.ops.reference.mlp import silu_mul, swiglu_mlp

__all__ = ["MoeRouting", "SharedExpert", "route_topk", "moe_experts", "route_moe_experts", "gated_shared_expert",
           "sparse_moe_block"]


class MoeRouting(NamedTuple):
    weights: torch.Tensor   # [T, k] in the router logits' dtype, rows sum to ~1
    ids: torch.Tensor       # [T, k] int64 expert ids, by decreasing probability


class SharedExpert(NamedTuple):
    """The shared expert with its input projections done: contributes sigmoid(gate) · down(SwiGLU(gate_up))."""
    gate_up: torch.Tensor   # [T, 2Is] x @ [gate_proj | up_proj].T (gate columns first), x.dtype; may be a strided view
    gate: torch.Tensor      # [T, 1]   x @ shared_expert_gate.T (the logit, before the sigmoid)
    down: torch.Tensor      # [H, Is]  down_proj weight


def route_topk(router_logits: torch.Tensor, top_k: int) -> MoeRouting:
    """Softmax over all experts in fp32, top-k, renormalise, cast back. router_logits: [T, E]."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    w, ids = torch.topk(probs, top_k, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    return MoeRouting(w.to(router_logits.dtype), ids)


def moe_experts(
    x: torch.Tensor, routing: MoeRouting, gate_up: torch.Tensor, down: torch.Tensor,
    *, shared: SharedExpert | None = None,
) -> torch.Tensor:
    """Weighted sum of the routed experts' SwiGLU outputs (plus the gated shared expert if given).

    Args:
        x: [T, H];  routing: from `route_topk` (weights/ids [T, k]).
        gate_up: [E, 2I, H] (rows [0, I) = gate, [I, 2I) = up);  down: [E, H, I].
        shared: optional `SharedExpert`; adds sigmoid(shared.gate) · SwiGLU_halves(shared.gate_up) @ shared.down.T.
    Returns:
        [T, H] in x.dtype. Experts are visited in increasing id order and each contribution is
        multiplied by its weight and accumulated in x.dtype (HF's order, so bf16 rounding matches);
        the shared expert's term (x.dtype) is added last, as in HF.
    """
    out = torch.zeros_like(x)
    I = down.shape[-1]
    for e in torch.unique(routing.ids).tolist():
        tok, slot = torch.where(routing.ids == e)
        h = F.linear(x[tok], gate_up[e])
        h = F.linear(silu_mul(h[:, :I], h[:, I:]), down[e])
        out.index_add_(0, tok, (h * routing.weights[tok, slot, None]).to(x.dtype))
    if shared is not None:
        out = out + torch.sigmoid(shared.gate) * F.linear(silu_mul_halves(shared.gate_up), shared.down)
    return out


def route_moe_experts(
    x: torch.Tensor, router_logits: torch.Tensor, top_k: int, gate_up: torch.Tensor, down: torch.Tensor,
    *, shared: SharedExpert | None = None, residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """`moe_experts(x, route_topk(router_logits, top_k), gate_up, down, shared=shared)`: one op so that
    a fast implementation can fold the routing into its first expert kernel. router_logits: [T, E].
    residual: the schedule's residual stream, which a fast implementation may add the result into
    (returning `ninfer.ops.reference.fused.Residual`); the reference never folds it (the caller adds)."""
    return moe_experts(x, route_topk(router_logits, top_k), gate_up, down, shared=shared)


def gated_shared_expert(
    x: torch.Tensor,
    gate_proj: torch.Tensor,
    up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    shared_expert_gate: torch.Tensor,
) -> torch.Tensor:
    """sigmoid(x @ shared_expert_gate.T) * SwiGLU(x). x: [T, H]; gate/up: [Is, H]; down: [H, Is];
    shared_expert_gate: [1, H]. Returns [T, H] in x.dtype."""
    return torch.sigmoid(F.linear(x, shared_expert_gate)) * swiglu_mlp(x, gate_proj, up_proj, down_proj)


def sparse_moe_block(
    x: torch.Tensor,
    router: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    shared_gate_proj: torch.Tensor,
    shared_up_proj: torch.Tensor,
    shared_down_proj: torch.Tensor,
    shared_expert_gate: torch.Tensor,
    experts=None,
) -> torch.Tensor:
    """The whole MoE FFN. x: [..., H]; router: [E, H]; other weights as in `moe_experts` and
    `gated_shared_expert`; experts: a `moe_experts` implementation (default: this module's).
    Returns [..., H] in x.dtype."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    routing = route_topk(F.linear(x2, router), top_k)
    routed = (experts or moe_experts)(x2, routing, gate_up, down)
    shared = gated_shared_expert(x2, shared_gate_proj, shared_up_proj, shared_down_proj, shared_expert_gate)
    return (routed + shared).reshape(shape)
