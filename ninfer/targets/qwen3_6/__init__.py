"""The Qwen3.6 family: everything the identities of the family share.

    dims.py, schema.py   dimension facts and the canonical weight names of a checkpoint
    frontend/            the Frontend: chat template, tokenizer, stops, tool calls, reconstruction
    program/             the Program: resources, sequences, transactions, the forward schedule, graphs,
                         checkpoints, sampling, scoring (program.py has the map); leaves.py holds the
                         protocols of the per-layer leaves
    layers/              the leaves' implementations (attention, GDN, dense MLP, MoE)

An identity package (`ninfer.targets.qwen3_6_27b`, ...) names its dims and post-mixer and builds its
Program with `build_program`.
"""


def build_program(dims, post_mixer, weights, config):
    """The family Program over a package's dims with the shared attention and GDN leaves and the
    package's post-mixer leaf (DenseMLP or SparseMoE)."""
    from ninfer.targets.qwen3_6.layers.attention import GatedAttentionProjection
    from ninfer.targets.qwen3_6.layers.gdn import GDNProjection
    from ninfer.targets.qwen3_6.program.leaves import LeafSet
    from ninfer.targets.qwen3_6.program.program import Qwen36Program

    leaves = LeafSet(attention=GatedAttentionProjection(dims), gdn=GDNProjection(dims), post_mixer=post_mixer)
    return Qwen36Program(dims, leaves, weights, config)
