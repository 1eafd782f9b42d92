"""Fast MoE ops (CUDA, Triton): the op set's `route_topk`, `moe_experts` and `route_moe_experts`, with the
signatures and results of `ninfer.ops.reference.moe` (the oracle) up to rounding; no host sync on any path.

    moe_routing   route_topk: one program per token, one launch
    moe_decode    T·k <= MAX_PAIRS (token, expert) pairs: a grouped GEMV in two launches, all k experts of
                  a token in one program, the shared expert folded into the second
    moe_prefill   more pairs: a grouped GEMM over the pairs sorted by expert, then one combine launch

`route_moe_experts` is routing + experts in one op: for one token the routing runs inside the first
decode kernel (two launches in all); from ROUTE_APART_TOKENS tokens in its own kernel before them.
"""
from __future__ import annotations

import torch

from ninfer.ops.reference.moe import MoeRouting, SharedExpert
from ninfer.ops.triton.moe_decode import DecodeConfig, decode, rows
from ninfer.ops.triton.moe_prefill import prefill
from ninfer.ops.triton.moe_routing import route_topk

__all__ = ["route_topk", "moe_experts", "route_moe_experts", "MAX_PAIRS", "ROUTE_APART_TOKENS"]

MAX_PAIRS = 128          # (token, expert) pairs up to which the grouped GEMV (decode) path runs
# NOTE: the token count from which the routing runs in its own kernel, once per token, instead of in every
#       gate|up program (docs/performance.md, "Decision log").
ROUTE_APART_TOKENS = 2


def moe_experts(x: torch.Tensor, routing: MoeRouting, gate_up: torch.Tensor, down: torch.Tensor,
                *, shared: SharedExpert | None = None, config: DecodeConfig | None = None,
                residual: torch.Tensor | None = None):
    """See `ninfer.ops.reference.moe.moe_experts`. x [T, H]; routing ids/weights [T, k]; gate_up [E, 2I, H];
    down [E, H, I]; shared: optional `SharedExpert` (gate_up [T, 2Is], gate [T, 1], down [H, Is]).
    Returns [T, H] in x.dtype. config: the decode tiles (default: the tuning table's; bench/moe_decode.py
    sweeps them). residual [T, H] (the schedule's residual stream, `ninfer.ops.reference.fused`): at prefill
    sizes the combine adds the result into it in place and `Residual(residual, None)` is returned; at decode
    sizes, or when it cannot (dtype, shape, layout), the plain result, the add left to the caller."""
    T, H = x.shape
    k = routing.ids.shape[1]
    if T == 0:
        return torch.zeros_like(x)
    x = rows(x)
    gate_up, down = rows(gate_up), rows(down)
    ids, weights = routing.ids.contiguous(), routing.weights.contiguous()
    if T * k <= MAX_PAIRS:
        return decode(x, gate_up, down, shared, k, ids=ids, weights=weights, config=config)[0]
    return prefill(x, ids, weights, gate_up, down, shared, residual=residual)


def route_moe_experts(x: torch.Tensor, router_logits: torch.Tensor, top_k: int, gate_up: torch.Tensor,
                      down: torch.Tensor, *, shared: SharedExpert | None = None,
                      config: DecodeConfig | None = None, residual: torch.Tensor | None = None):
    """See `ninfer.ops.reference.moe.route_moe_experts`: `moe_experts(x, route_topk(router_logits, top_k), ...)`.
    router_logits [T, E] (rows may be strided). For one token the routing runs inside the first expert
    kernel (two launches in all), for 2..MAX_PAIRS / top_k tokens in its own kernel before them
    (ROUTE_APART_TOKENS). residual: as in `moe_experts` (folded at prefill sizes only)."""
    T, E = router_logits.shape
    if not 0 < top_k <= E:
        raise ValueError(f"top_k must be in 1..{E}, got {top_k}")
    if T == 0 or T * top_k > MAX_PAIRS or T >= ROUTE_APART_TOKENS:
        return moe_experts(x, route_topk(router_logits, top_k), gate_up, down, shared=shared, config=config,
                           residual=residual)
    lg = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
    return decode(rows(x), rows(gate_up), rows(down), shared, top_k, logits=lg, config=config)[0]
