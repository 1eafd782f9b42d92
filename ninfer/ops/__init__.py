"""Semantic ops of the Qwen3.6 forward pass: plain PyTorch references (any device, fp32 or bf16).

One concept per module; tensor shapes are in each function's docstring. Stateful ops (conv,
gated delta rule) share the state-passing convention of `ninfer.ops._state`.
Fast implementations (Triton / fla) live beside these and are tested against them.
"""
