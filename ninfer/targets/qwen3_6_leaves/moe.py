"""Post-mixer leaf: sparse MoE with a sigmoid-gated shared expert (fused expert weights)."""
from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F

from ninfer.ops.mlp import silu_mul
from ninfer.ops.moe import moe_experts, route_topk, sparse_moe_block
from ninfer.targets.qwen3_6.dims import Qwen36Dims


class SparseMoE:
    # NOTE: the schedule passes its OpSet (`ops=`): the routed experts follow the op selection (the
    #       fast grouped GEMV on CUDA has no host sync, so decode with it is CUDA-graph capturable).
    takes_ops = True

    def __init__(self, dims: Qwen36Dims) -> None:
        if not dims.is_moe:
            raise ValueError("SparseMoE needs MoE dimensions (num_experts > 0)")
        self.top_k = dims.num_experts_per_tok

    def __call__(self, mlp: Mapping[str, torch.Tensor], h: torch.Tensor, ops: Any = None) -> torch.Tensor:
        """h [N, H] -> [N, H]."""
        fused = mlp.get("shared_in.weight")
        if fused is not None:
            # NOTE: one GEMM for everything that reads h: [shared gate | shared up | shared gate
            #       scalar | router] rows (model_view fuses them); then the same math as sparse_moe_block.
            shape = h.shape
            x2 = h.reshape(-1, shape[-1])
            Is = mlp["shared_expert.gate_proj.weight"].shape[0]
            y = F.linear(x2, fused)
            routing = route_topk(y[:, 2 * Is + 1:], self.top_k)
            routed = (ops.moe_experts if ops is not None else moe_experts)(
                x2, routing, mlp["experts.gate_up_proj"], mlp["experts.down_proj"])
            shared = F.linear(silu_mul(y[:, :Is], y[:, Is:2 * Is]), mlp["shared_expert.down_proj.weight"])
            shared = torch.sigmoid(y[:, 2 * Is:2 * Is + 1]) * shared
            return (routed + shared).reshape(shape)
        return sparse_moe_block(
            h, mlp["gate.weight"], mlp["experts.gate_up_proj"], mlp["experts.down_proj"], self.top_k,
            mlp["shared_expert.gate_proj.weight"], mlp["shared_expert.up_proj.weight"],
            mlp["shared_expert.down_proj.weight"], mlp["shared_expert_gate.weight"],
            experts=ops.moe_experts if ops is not None else None)
