"""Execution leaves shared by the Qwen3.6 packages (each package selects its own set).

attention.GatedAttentionProjection   attention projection leaf (q/gate, k, v, q/k norm, rotary; output gate, o_proj)
gdn.GDNProjection                    GDN projection/control leaf (qkv/z/a/b projections, gates; gated norm, out_proj)
dense_mlp.DenseMLP                   post-mixer leaf: SwiGLU MLP (27B and the tiny dense identity)
moe.SparseMoE                        post-mixer leaf: routed experts + gated shared expert (35B-A3B, tiny MoE)
"""
