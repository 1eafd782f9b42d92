"""Post-mixer leaf: sparse MoE with a sigmoid-gated shared expert (fused expert weights)."""
from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F

from ninfer.ops.mlp import silu_mul
from ninfer.ops.moe import route_topk
from ninfer.targets.qwen3_6.dims import Qwen36Dims


class SparseMoE:
    # NOTE: the schedule passes its OpSet (`ops`): the routed experts follow the op selection (the
    #       fast grouped GEMV on CUDA has no host sync, so decode with it is CUDA-graph capturable).

    def __init__(self, dims: Qwen36Dims) -> None:
        if not dims.is_moe:
            raise ValueError("SparseMoE needs MoE dimensions (num_experts > 0)")
        self.top_k = dims.num_experts_per_tok

    def __call__(self, mlp: Mapping[str, torch.Tensor], h: torch.Tensor, ops: Any) -> torch.Tensor:
        """h [N, H] -> [N, H]: the math of `ninfer.ops.moe.sparse_moe_block`, with one GEMM for
        everything that reads h: [shared gate | shared up | shared gate scalar | router] rows
        (`shared_in.weight`, fused by model_view)."""
        shape = h.shape
        x2 = h.reshape(-1, shape[-1])
        Is = mlp["shared_expert.gate_proj.weight"].shape[0]
        y = F.linear(x2, mlp["shared_in.weight"])
        routing = route_topk(y[:, 2 * Is + 1:], self.top_k)
        routed = ops.moe_experts(x2, routing, mlp["experts.gate_up_proj"], mlp["experts.down_proj"])
        shared = F.linear(silu_mul(y[:, :Is], y[:, Is:2 * Is]), mlp["shared_expert.down_proj.weight"])
        shared = torch.sigmoid(y[:, 2 * Is:2 * Is + 1]) * shared
        return (routed + shared).reshape(shape)
