"""GDN projection/control leaf of the Gated DeltaNet layers (the conv and the delta rule on the
sequence's state are run by the family schedule)."""
from __future__ import annotations

from typing import Any

import torch

from ninfer.targets.qwen3_6.dims import Qwen36Dims
from ninfer.targets.qwen3_6.layers import main_and_gate
from ninfer.targets.qwen3_6.program.model_view import GDNWeights


class GDNProjection:
    def __init__(self, dims: Qwen36Dims) -> None:
        self.nv, self.dv = dims.linear_num_value_heads, dims.linear_value_head_dim
        self.eps = dims.rms_norm_eps

    def project(self, w: GDNWeights, h: torch.Tensor, ops: Any, gates: bool = True, side: Any = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """h [N, H] (or `NormedRows`: the op applies the norm) -> qkv [N, C] (pre-conv), z [N, nv, dv],
        g [N, nv] fp32, beta [N, nv].
        gates=False: the raw projections a, b [N, nv] instead of (g, beta), for an op that computes
        the gates itself (`ops.gdn_conv_recurrent`, from w.A_log and w.dt_bias).
        side: a `SideGemv` (CUDA): z's rows are a second GEMV on its stream, beside what the caller
        runs next; the caller joins the stream before reading z."""
        N = h.shape[0]
        C, nv = w.in_proj_qkv.shape[0], self.nv
        y, z = main_and_gate(ops, h, w.in_proj, C + 2 * nv, side)          # in_proj [qkv | b | a | z]
        z = z.view(N, self.nv, self.dv)
        qkv, b, a = y[:, :C], y[:, C:C + nv], y[:, C + nv:C + 2 * nv]
        if not gates:
            return qkv, z, a, b
        g, beta = ops.gdn_gates(a, b, w.A_log, w.dt_bias)
        return qkv, z, g, beta

    def output(self, w: GDNWeights, o: torch.Tensor, z: torch.Tensor, ops: Any, residual: torch.Tensor | None = None
               ) -> Any:
        """o [N, nv, dv], z [N, nv, dv] -> [N, H] (or the op's Residual when it folds `residual`, see
        `ninfer.ops.reference.fused`)."""
        y = ops.gated_rms_norm(o, z, w.norm, self.eps)
        return ops.linear(y.reshape(o.shape[0], self.nv * self.dv), w.out_proj, residual=residual)
