"""load_model_view's fused matrices: the parts stay row views of one matrix, and shared_in is padded with
zero rows to a multiple of 8 (aligned GEMM output rows for cuBLAS) while the mixers' in_proj are not."""
from __future__ import annotations

import torch

from ninfer.targets.dummy_weights import DummyWeights
from ninfer.targets.qwen3_6.runtime.model_view import ROW_MULTIPLE, load_model_view
from ninfer.targets.registry import lookup


def test_shared_in_is_padded_with_zero_rows_and_its_parts_are_views():
    ident = "qwen3_6-tiny-moe"
    dims = lookup(ident).dims
    w = DummyWeights(ident, device="cpu", dtype=torch.float32, seed=1, std=0.2)
    view = load_model_view(dims, w, "cpu", torch.float32)
    E, Is = dims.num_experts, dims.shared_expert_intermediate_size
    parts = 2 * Is + 1 + E
    assert parts % 8 != 0                       # the tiny identity exercises the padding
    for layer in view.layers:
        p = f"layers.{layer.index}.mlp."
        fused = layer.mlp["shared_in.weight"]
        assert fused.shape[0] % ROW_MULTIPLE["shared_in.weight"] == 0 and fused.shape[0] - parts < 8
        assert torch.count_nonzero(fused[parts:]) == 0
        want = torch.cat([w.tensor(p + n) for n in ("shared_expert.gate_proj.weight", "shared_expert.up_proj.weight",
                                                    "shared_expert_gate.weight", "gate.weight")])
        torch.testing.assert_close(fused[:parts], want, rtol=0, atol=0)
        gate = layer.mlp["shared_expert.gate_proj.weight"]
        assert gate.data_ptr() == fused.data_ptr() and gate.shape[0] == Is
        mixer = layer.mixer
        assert mixer.in_proj.shape[0] == sum(t.shape[0] for t in mixer_parts(mixer))


def mixer_parts(m) -> tuple[torch.Tensor, ...]:
    if hasattr(m, "in_proj_qkv"):
        return m.in_proj_qkv, m.in_proj_b, m.in_proj_a, m.in_proj_z
    return m.q_rows, m.k_proj, m.v_proj, m.gate_rows
