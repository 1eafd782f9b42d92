"""Post-mixer leaf: dense SwiGLU MLP (`layers.{i}.mlp.{gate,up,down}_proj.weight`)."""
from __future__ import annotations

from typing import Any, Mapping

import torch


class DenseMLP:
    # NOTE: takes `NormedRows` for h and a `residual` to fold (see `ninfer.ops.reference.fused`); a post-mixer
    #       without this flag gets the normed rows as a tensor and returns the plain delta.
    folds_residual = True

    def __call__(self, mlp: Mapping[str, torch.Tensor], h: Any, ops: Any, residual: torch.Tensor | None = None
                 ) -> Any:
        """h [N, H] (or NormedRows) -> [N, H] (or the op's Residual when it folds `residual`) with the
        schedule's OpSet `ops`."""
        gu = ops.linear(h, mlp["gate_up_proj.weight"])          # one GEMM: [gate | up] (model_view fuses them)
        return ops.linear_swiglu(gu, mlp["down_proj.weight"], residual=residual)
