"""Post-mixer leaf: dense SwiGLU MLP (`layers.{i}.mlp.{gate,up,down}_proj.weight`)."""
from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F

from ninfer.ops.mlp import silu_mul, swiglu_mlp


class DenseMLP:
    def __call__(self, mlp: Mapping[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        """h [N, H] -> [N, H]."""
        if "gate_up_proj.weight" not in mlp:
            return swiglu_mlp(h, mlp["gate_proj.weight"], mlp["up_proj.weight"], mlp["down_proj.weight"])
        gu = F.linear(h, mlp["gate_up_proj.weight"])            # one GEMM: [gate | up] (model_view fuses them)
        I = gu.shape[-1] // 2
        return F.linear(silu_mul(gu[..., :I], gu[..., I:]), mlp["down_proj.weight"])
