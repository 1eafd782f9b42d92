"""Execution leaves shared by the Qwen3.6 packages (each package selects its own set).

attention.GatedAttentionProjection   attention projection leaf (q/gate, k, v, q/k norm, rotary; output gate, o_proj)
gdn.GDNProjection                    GDN projection/control leaf (qkv/z/a/b projections, gates; gated norm, out_proj)
dense_mlp.DenseMLP                   post-mixer leaf: SwiGLU MLP (27B and the tiny dense identity)
moe.SparseMoE                        post-mixer leaf: routed experts + gated shared expert (35B-A3B, tiny MoE)
"""


def build_program(dims, post_mixer, weights, config):
    """The family Program over a package's dims with the shared attention and GDN leaves and the
    package's post-mixer leaf (DenseMLP or SparseMoE)."""
    from ninfer.targets.qwen3_6.program.leaves import LeafSet
    from ninfer.targets.qwen3_6.program.program import Qwen36Program
    from ninfer.targets.qwen3_6.layers.attention import GatedAttentionProjection
    from ninfer.targets.qwen3_6.layers.gdn import GDNProjection

    leaves = LeafSet(attention=GatedAttentionProjection(dims), gdn=GDNProjection(dims), post_mixer=post_mixer)
    return Qwen36Program(dims, leaves, weights, config)
