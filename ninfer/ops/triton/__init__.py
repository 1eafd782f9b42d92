"""Fast (CUDA) implementations of the ops: Triton kernels and fla-core's chunked delta rule.

Each module mirrors its reference in `ninfer.ops.reference` (same signatures, same results up to
rounding) and is tested against it (tests/gpu/). The op set that picks between the two is
`ninfer.ops.opset`; nothing here is imported on the CPU path. `common` and `pdl` hold what the
kernel modules share.
"""
