"""Post-mixer leaf: dense SwiGLU MLP (`layers.{i}.mlp.{gate,up,down}_proj.weight`)."""
from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F

from ninfer.ops.mlp import silu_mul


class DenseMLP:
    def __call__(self, mlp: Mapping[str, torch.Tensor], h: torch.Tensor, ops: Any = None) -> torch.Tensor:
        """h [N, H] -> [N, H] (the schedule's OpSet `ops` is not needed here)."""
        gu = F.linear(h, mlp["gate_up_proj.weight"])            # one GEMM: [gate | up] (model_view fuses them)
        I = gu.shape[-1] // 2
        return F.linear(silu_mul(gu[..., :I], gu[..., I:]), mlp["down_proj.weight"])
