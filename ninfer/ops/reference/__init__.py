"""Semantic ops of the Qwen3.6 forward pass: plain PyTorch references (any device, fp32 or bf16).

One concept per module; tensor shapes are in each function's docstring. Stateful ops (conv,
gated delta rule) share the state-passing convention of `ninfer.ops.reference._state`.
Fast implementations (Triton / fla) live beside these and are tested against them.
"""

from ninfer.ops.reference.attention import (
    attention_output_gate,
    chunk_paged_attention,
    decode_paged_attention,
    gather_kv_paged,
    kv_slot_mapping,
    qk_norm_rope_write_kv,
    write_kv_paged,
)
from ninfer.ops.reference.conv import causal_conv1d_update, chunk_causal_conv1d
from ninfer.ops.reference.gated_delta import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule, gdn_gates
from ninfer.ops.reference.logprobs import TokenLogprobs, chunked_logprobs, logprobs_from_logits
from ninfer.ops.reference.mlp import silu_mul, swiglu_mlp
from ninfer.ops.reference.moe import MoeRouting, gated_shared_expert, moe_experts, route_topk, sparse_moe_block
from ninfer.ops.reference.norms import gated_rms_norm, l2norm, rms_norm
from ninfer.ops.reference.rope import apply_rotary, apply_rotary_qk, mrope_axis_of_freq, mrope_cos_sin, rope_inv_freq
from ninfer.ops.reference.sampling import SampleResult, SamplingTensors, apply_penalties, rng_state_from_seed, sample

__all__ = [
    "attention_output_gate", "chunk_paged_attention", "decode_paged_attention", "gather_kv_paged",
    "kv_slot_mapping", "qk_norm_rope_write_kv", "write_kv_paged",
    "causal_conv1d_update", "chunk_causal_conv1d",
    "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "gdn_gates",
    "TokenLogprobs", "chunked_logprobs", "logprobs_from_logits",
    "silu_mul", "swiglu_mlp",
    "MoeRouting", "gated_shared_expert", "moe_experts", "route_topk", "sparse_moe_block",
    "gated_rms_norm", "l2norm", "rms_norm",
    "apply_rotary", "apply_rotary_qk", "mrope_axis_of_freq", "mrope_cos_sin", "rope_inv_freq",
    "SampleResult", "SamplingTensors", "apply_penalties", "rng_state_from_seed", "sample",
]
