"""load_model_view's fused matrices: the parts stay row views of one matrix, and shared_in is padded with
zero rows to a multiple of 8 (aligned GEMM output rows for cuBLAS) while the mixers' in_proj are not."""
from __future__ import annotations

import torch

from ninfer.targets.dummy_weights import DummyWeights
from ninfer.targets.qwen3_6.program.model_view import ROW_MULTIPLE, load_model_view
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


def test_each_layer_is_fused_before_the_next_layers_tensors_are_loaded(monkeypatch):
    # Fusing right after a layer's load lets the next layer's same-shaped parts reuse the blocks the fusion
    # freed; loading every tensor first kept them all cached beside the fused copies (~21 GiB on the 27B).
    import ninfer.targets.qwen3_6.program.model_view as mv
    ident = "qwen3_6-tiny-moe"
    dims = lookup(ident).dims
    w = DummyWeights(ident, device="cpu", dtype=torch.float32, seed=1)
    events: list[tuple[str, int]] = []

    class Recording:
        def tensor(self, name):
            if name.startswith("layers."):
                events.append(("load", int(name.split(".")[1])))
            return w.tensor(name)

    real_fuse = mv.fuse_rows

    def fuse(t, names, fused_name=""):
        events.append(("fuse", int(names[0].split(".")[1])))
        return real_fuse(t, names, fused_name)

    monkeypatch.setattr(mv, "fuse_rows", fuse)
    view = load_model_view(dims, Recording(), "cpu", torch.float32)
    assert len(view.layers) == dims.num_hidden_layers >= 2
    for i in range(dims.num_hidden_layers - 1):
        first_next = events.index(("load", i + 1))
        assert ("fuse", i) in events[:first_next]
        assert ("load", i) not in events[first_next:] and ("fuse", i) not in events[first_next:]
