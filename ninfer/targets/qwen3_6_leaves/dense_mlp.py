"""Post-mixer leaf: dense SwiGLU MLP (`layers.{i}.mlp.{gate,up,down}_proj.weight`)."""
from __future__ import annotations

from typing import Mapping

import torch

from ninfer.ops.mlp import swiglu_mlp


class DenseMLP:
    def __call__(self, mlp: Mapping[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        """h [N, H] -> [N, H]."""
        return swiglu_mlp(h, mlp["gate_proj.weight"], mlp["up_proj.weight"], mlp["down_proj.weight"])
