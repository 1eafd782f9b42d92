"""Target package: Qwen3.6-35B-A3B (256-expert top-8 MoE with a shared expert)."""
from ninfer.targets.package import StorageProfile, TargetPackage
from ninfer.targets.qwen3_6.dims import Qwen36Dims, VisionDims, hybrid_layer_types

IDENTITY = "qwen3_6-35b-a3b"

DIMS = Qwen36Dims(
    vocab_size=248320, hidden_size=2048, num_hidden_layers=40, layer_types=hybrid_layer_types(40),
    num_attention_heads=16, num_key_value_heads=2, head_dim=256,
    partial_rotary_factor=0.25, rope_theta=10_000_000.0, mrope_section=(11, 11, 10), mrope_interleaved=True,
    linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, rms_norm_eps=1e-6, tie_word_embeddings=False, mtp_num_hidden_layers=1,
    max_position_embeddings=262144,
    num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
    vision=VisionDims(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16,
                      temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=2304,
                      out_hidden_size=2048),
)

PACKAGE = TargetPackage(identity=IDENTITY, family="qwen3_6", dims=DIMS,
                        storage=StorageProfile("bf16", "bf16 weights; A_log and norm weights as stored"),
                        module=__name__)


def create_program(weights, config):
    """The package's Program: the family Program with this package's leaves.

    weights: an opened `.ninfer` Artifact or a Mapping[str, Tensor] of canonical names;
    config: `ninfer.targets.qwen3_6.program.config.ProgramConfig`.
    """
    from ninfer.targets.qwen3_6 import build_program
    from ninfer.targets.qwen3_6.layers.moe import SparseMoE

    return build_program(DIMS, SparseMoE(DIMS), weights, config)
