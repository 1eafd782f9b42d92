"""Device ops of the Qwen3.6 forward pass.

reference/   plain PyTorch: the oracle and the CPU path (any device, fp32 or bf16); imports nothing else
triton/      the CUDA implementations (Triton, fla-core), each tested against its reference
opset.py     the op set a model calls (`select_ops`: fast on CUDA, the references otherwise) and the
             sampler's per-call choice (`sample`)
tuning.py    the fast kernels' tuning tables, configs/<table>.json per device kind
"""
