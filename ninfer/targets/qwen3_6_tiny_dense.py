"""Target package: a tiny dense test identity run by the same family code as 27B."""
from ninfer.targets.package import StorageProfile, TargetPackage
from ninfer.targets.qwen3_6.dims import Qwen36Dims, VisionDims, hybrid_layer_types

IDENTITY = "qwen3_6-tiny-dense"

DIMS = Qwen36Dims(
    vocab_size=248320, hidden_size=64, num_hidden_layers=8, layer_types=hybrid_layer_types(8),
    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    partial_rotary_factor=0.25, rope_theta=10_000_000.0, mrope_section=(3, 3, 2), mrope_interleaved=True,
    linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_conv_kernel_dim=4, rms_norm_eps=1e-6, tie_word_embeddings=False, mtp_num_hidden_layers=1,
    max_position_embeddings=262144, intermediate_size=128,
    vision=VisionDims(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                      temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=64,
                      out_hidden_size=64),
)

PACKAGE = TargetPackage(identity=IDENTITY, family="qwen3_6", dims=DIMS,
                        storage=StorageProfile("bf16", "bf16 weights, A_log and norm weights as stored (as the real identities)"),
                        module=__name__)


def create_program(weights, config):
    """The package's Program: the family Program with this package's leaves.

    weights: an opened `.ninfer` Artifact or a Mapping[str, Tensor] of canonical names;
    config: `ninfer.targets.qwen3_6.program.config.ProgramConfig`.
    """
    from ninfer.targets.qwen3_6 import build_program
    from ninfer.targets.qwen3_6.layers.dense_mlp import DenseMLP

    return build_program(DIMS, DenseMLP(), weights, config)
