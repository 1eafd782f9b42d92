"""Device ops of the Qwen3.6 forward pass.

reference/   plain PyTorch: the oracle and the CPU path (any device, fp32 or bf16)
triton/      the CUDA implementations (Triton, fla-core), each tested against its reference
"""
