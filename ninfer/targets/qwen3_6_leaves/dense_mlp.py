"""Post-mixer leaf: dense SwiGLU MLP (`layers.{i}.mlp.{gate,up,down}_proj.weight`)."""
from __future__ import annotations

from typing import Any, Mapping

import torch


class DenseMLP:
    def __call__(self, mlp: Mapping[str, torch.Tensor], h: torch.Tensor, ops: Any) -> torch.Tensor:
        """h [N, H] -> [N, H] with the schedule's OpSet `ops`."""
        gu = ops.linear(h, mlp["gate_up_proj.weight"])          # one GEMM: [gate | up] (model_view fuses them)
        return ops.linear_swiglu(gu, mlp["down_proj.weight"])
