"""Post-mixer leaf: sparse MoE with a sigmoid-gated shared expert (fused expert weights)."""
from __future__ import annotations

from typing import Any, Mapping

import torch

from ninfer.ops.reference.fused import Residual, materialize
from ninfer.ops.reference.moe import SharedExpert
from ninfer.targets.qwen3_6.dims import Qwen36Dims


class SparseMoE:
    # NOTE: the schedule passes its OpSet (`ops`): routing and the routed experts follow the op
    #       selection (the fast ones have no host sync, so decode is CUDA-graph capturable). Routing and
    #       the shared expert's down projection and gate run inside `ops.route_moe_experts` (the fast
    #       one routes inside its first kernel), so a decode step is one GEMM and two expert kernels.

    def __init__(self, dims: Qwen36Dims) -> None:
        if not dims.is_moe:
            raise ValueError("SparseMoE needs MoE dimensions (num_experts > 0)")
        self.top_k = dims.num_experts_per_tok
        self.num_experts = dims.num_experts     # the router's columns (shared_in may end in zero rows)

    # NOTE: folds like DenseMLP: h may come as NormedRows (the mixer folded its residual add), normed here
    #       (`ninfer.ops.reference.fused.materialize`), since the expert kernels read the normed rows themselves; the
    #       residual goes to `ops.route_moe_experts`, which the fast set adds in its prefill combine
    #       (decode sizes return the plain delta, as before).
    folds_residual = True

    def __call__(self, mlp: Mapping[str, torch.Tensor], h: Any, ops: Any, residual: torch.Tensor | None = None
                 ) -> Any:
        """h [N, H] (or NormedRows) -> [N, H] (or the op's Residual when it folds `residual`): the math of
        `ninfer.ops.reference.moe.sparse_moe_block`, with one GEMM for everything that reads h: [shared gate |
        shared up | shared gate scalar | router] rows (`shared_in.weight`, fused by model_view, maybe with
        zero rows after them)."""
        h = materialize(h, ops)
        shape = h.shape
        x2 = h.reshape(-1, shape[-1])
        Is = mlp["shared_expert.gate_proj.weight"].shape[0]
        y = ops.linear(x2, mlp["shared_in.weight"])
        shared = SharedExpert(y[:, :2 * Is], y[:, 2 * Is:2 * Is + 1], mlp["shared_expert.down_proj.weight"])
        r0 = 2 * Is + 1
        out = ops.route_moe_experts(x2, y[:, r0:r0 + self.num_experts], self.top_k, mlp["experts.gate_up_proj"],
                                    mlp["experts.down_proj"], shared=shared,
                                    residual=None if residual is None else residual.reshape(x2.shape))
        if isinstance(out, Residual):
            return Residual(out.h.view(shape), out.parts)
        return out.reshape(shape)
