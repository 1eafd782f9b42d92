"""The op set: the named structure of ops the family schedule calls, built in one place.

`select_ops(device)` returns the `OpSet` a model should use: the fast set (`ninfer.ops.triton`) on a
CUDA device when Triton is importable, the reference set (`ninfer.ops.reference`) otherwise. Both
sets have the reference signatures and results; the fast ones are tested against them
(tests/gpu/). Nothing of the fast set is imported on the CPU path (no Triton, no fla-core needed).
The sampler is not part of a model's op set: `sample` makes the same choice per call, from the
logits' device.

The fast set's members:

    chunk_gated_delta_rule            fla-core chunk kernel, states via StateImage slots
    fused_recurrent_gated_delta_rule  Triton, slot-indexed, state updated in place
    chunk_causal_conv1d / causal_conv1d_update   Triton, slot-indexed conv state
    decode_paged_attention            Triton split-K paged GQA decode
    chunk_paged_attention             paged gather + PyTorch SDPA (flash / cuDNN), no [L, C] matrix
    prefix_attention_rows             Triton paged flash attention of a padded stage over its prefix,
                                      start and length as device data (prefill graphs)
    gated_rms_norm                    Triton row kernel
    add_rms_norm, qk_norm_rope, silu_mul_halves, sigmoid_gate_mul, gdn_gates, write_kv_paged,
    qk_norm_rope_write_kv             one Triton kernel per fused step
    route_topk / moe_experts          Triton routing (one kernel) and routed experts: grouped GEMV at
                                      decode (shared expert folded in), grouped GEMM over pairs sorted by
                                      expert at prefill; no host sync
    route_moe_experts                 routing + experts; for one token the routing runs inside the first
                                      decode kernel, for more in its own kernel before them
    linear                            skinny GEMM for M <= 8 on the shapes its tuning table marks, else cuBLAS
    linear_swiglu                     the same with the SwiGLU in its x load where the table says so
    gdn_conv_recurrent                GDN decode state step (conv + delta rule) in one launch
    gdn_conv_recurrent_steps          T such steps per row in one launch, the states after every token kept
"""
from __future__ import annotations

import functools
import os
from typing import Callable, NamedTuple

import torch

__all__ = ["OpSet", "reference_ops", "fast_ops", "fast_available", "select_ops", "sample", "apply_token_bitmask_"]


class OpSet(NamedTuple):
    """The ops the family schedule calls, with the reference signatures. In the fast set the
    stateful ops update slot pools in place and skip the gather of the returned state (None)."""
    name: str
    gated_rms_norm: Callable
    chunk_causal_conv1d: Callable
    causal_conv1d_update: Callable
    chunk_gated_delta_rule: Callable
    fused_recurrent_gated_delta_rule: Callable
    write_kv_paged: Callable
    chunk_paged_attention: Callable
    decode_paged_attention: Callable
    moe_experts: Callable              # routed experts (MoE post-mixer); the fast one has no host sync
    # NOTE: the fused steps of the leaves and the schedule (`ninfer.ops.reference.fused` has their references).
    add_rms_norm: Callable             # (x, delta, w, eps) -> (rms_norm(x + delta), x + delta)
    qk_norm_rope: Callable             # (q, k, wq, wk, cos, sin, eps) -> (q', k') per-head norm + rotary
    silu_mul_halves: Callable          # gu [N, 2I] -> silu(gate) * up [N, I]
    sigmoid_gate_mul: Callable         # (o, gate) -> o * sigmoid(gate)  (gated attention output)
    gdn_gates: Callable                # (a, b, A_log, dt_bias) -> (g fp32, beta)
    route_topk: Callable               # (router_logits, k) -> MoeRouting
    linear: Callable                   # (x, w) -> x @ w.T
    gdn_conv_recurrent: Callable       # GDN decode state step (conv update + delta rule), src -> dst entries
    linear_swiglu: Callable            # (gu, w) -> silu_mul_halves(gu) @ w.T
    route_moe_experts: Callable        # (x, router_logits, k, gate_up, down, *, shared, residual) -> moe_experts(
    #                                    x, route_topk(..)), or a Residual when the fast set folds `residual`
    qk_norm_rope_write_kv: Callable    # (q, k, v, wq, wk, cos, sin, eps, kc, vc, bt, pos, rows) -> q'; k', v into pages
    prefix_attention_rows: Callable    # (q, kc, vc, bt, start, length) a padded stage over its prefix (prefill graphs)
    gdn_conv_recurrent_steps: Callable  # T GDN decode steps per row (speculative verify): src -> dst[:, 0] -> ..
    #                                     dst[:, T-1], the states after every token kept at their dst entry


@functools.cache
def reference_ops() -> OpSet:
    from ninfer.ops.reference import attention, conv, fused, gated_delta, moe, norms
    return OpSet("reference", norms.gated_rms_norm, conv.chunk_causal_conv1d,
                 conv.causal_conv1d_update, gated_delta.chunk_gated_delta_rule,
                 gated_delta.fused_recurrent_gated_delta_rule, attention.write_kv_paged,
                 attention.chunk_paged_attention, attention.decode_paged_attention, moe.moe_experts,
                 fused.add_rms_norm, fused.qk_norm_rope, fused.silu_mul_halves, attention.attention_output_gate,
                 gated_delta.gdn_gates, moe.route_topk, fused.linear, fused.gdn_conv_recurrent, fused.linear_swiglu,
                 moe.route_moe_experts, attention.qk_norm_rope_write_kv, attention.prefix_attention_rows,
                 fused.gdn_conv_recurrent_steps)


@functools.cache
def fast_available() -> bool:
    """True when CUDA is usable and Triton imports."""
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


@functools.cache
def fast_ops() -> OpSet:
    """The fast set (needs Triton; fla-core is optional and imported at the first prefill call)."""
    # NOTE: fla-core's chunk kernels autotune on the first use of each shape key (minutes for the 27B on a
    #       fresh machine), and Triton keeps the picks in its disk cache only when asked to. Asked here,
    #       before fla-core can be imported (its autotuners read the switch when they are built), so a
    #       restarted server reuses them; TRITON_CACHE_AUTOTUNING=0 in the environment turns it off.
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    from ninfer.ops.triton import attention, conv, fused, gated_delta, gdn_decode, gemv, moe, norms
    nog = dict(gather_final_state=False)
    return OpSet(
        "fast", norms.gated_rms_norm,
        functools.partial(conv.chunk_causal_conv1d, **nog), functools.partial(conv.causal_conv1d_update, **nog),
        functools.partial(gated_delta.chunk_gated_delta_rule, **nog),
        functools.partial(gated_delta.fused_recurrent_gated_delta_rule, **nog),
        fused.write_kv_paged, attention.chunk_paged_attention, attention.decode_paged_attention,
        moe.moe_experts, fused.add_rms_norm, fused.qk_norm_rope, fused.silu_mul_halves, fused.sigmoid_gate_mul,
        fused.gdn_gates, moe.route_topk, gemv.linear, gdn_decode.gdn_conv_recurrent, gemv.linear_swiglu,
        moe.route_moe_experts, fused.qk_norm_rope_write_kv, attention.prefix_attention_rows,
        gdn_decode.gdn_conv_recurrent_steps)


def select_ops(device: torch.device | str) -> OpSet:
    """Fast ops on a CUDA device when available, the references otherwise (always on the CPU)."""
    if torch.device(device).type == "cuda" and fast_available():
        return fast_ops()
    return reference_ops()


def sample(logits: torch.Tensor, *args, **kwargs):
    """`ninfer.ops.reference.sampling.sample` (same arguments and results): on CUDA logits, when the fast
    kernels can run, `ninfer.ops.triton.sampling.sample` (its steps 6-9 in Triton); else the reference."""
    if logits.is_cuda and fast_available():
        from ninfer.ops.triton import sampling as fast
        return fast.sample(logits, *args, **kwargs)
    from ninfer.ops.reference import sampling as ref
    return ref.sample(logits, *args, **kwargs)


def apply_token_bitmask_(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`ninfer.ops.reference.sampling.apply_token_bitmask_` (in place, same result): on CUDA, when the fast
    kernels can run, one Triton pass (`ninfer.ops.triton.sampling.apply_token_bitmask_`)."""
    if logits.is_cuda and fast_available():
        from ninfer.ops.triton import sampling as fast
        return fast.apply_token_bitmask_(logits, mask)
    from ninfer.ops.reference import sampling as ref
    return ref.apply_token_bitmask_(logits, mask)
