"""Post-mixer leaf: sparse MoE with a sigmoid-gated shared expert (fused expert weights)."""
from __future__ import annotations

from typing import Any, Mapping

import torch

from ninfer.ops.fused import NormedRows, Residual
from ninfer.ops.moe import SharedExpert
from ninfer.targets.qwen3_6.dims import Qwen36Dims


class SparseMoE:
    # NOTE: the schedule passes its OpSet (`ops`): routing and the routed experts follow the op
    #       selection (the fast ones have no host sync, so decode is CUDA-graph capturable). Routing and
    #       the shared expert's down projection and gate run inside `ops.route_moe_experts` (the fast
    #       one routes inside its first kernel), so a decode step is one GEMM and two expert kernels.
    #       Takes `NormedRows` for h and a `residual` to fold (`ninfer.ops.fused`): the GEMM applies the
    #       pending norm and hands the normed rows to the expert kernels (no norm launch), and the down
    #       kernel may add the residual (no add + norm launch before the next layer's first projection).
    folds_residual = True

    def __init__(self, dims: Qwen36Dims) -> None:
        if not dims.is_moe:
            raise ValueError("SparseMoE needs MoE dimensions (num_experts > 0)")
        self.top_k = dims.num_experts_per_tok

    def __call__(self, mlp: Mapping[str, torch.Tensor], h: Any, ops: Any, residual: torch.Tensor | None = None
                 ) -> Any:
        """h [N, H] (or NormedRows) -> [N, H] (or the op's Residual when it folds `residual`): the math
        of `ninfer.ops.moe.sparse_moe_block`, with one GEMM for everything that reads h: [shared gate |
        shared up | shared gate scalar | router] rows (`shared_in.weight`, fused by model_view)."""
        shape = h.shape
        x2 = h if isinstance(h, NormedRows) else h.reshape(-1, shape[-1])
        Is = mlp["shared_expert.gate_proj.weight"].shape[0]
        y, xn = ops.linear(x2, mlp["shared_in.weight"], return_normed=True)
        shared = SharedExpert(y[:, :2 * Is], y[:, 2 * Is:2 * Is + 1], mlp["shared_expert.down_proj.weight"])
        out = ops.route_moe_experts(xn, y[:, 2 * Is + 1:], self.top_k, mlp["experts.gate_up_proj"],
                                    mlp["experts.down_proj"], shared=shared, residual=residual)
        return out if isinstance(out, Residual) else out.reshape(shape)
