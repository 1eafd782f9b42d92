"""The Qwen3.6 family Program: the forward schedule (`model`), the Program that owns sequences,
stores, transactions and sampling (`program`), checkpoints, CUDA graphs and causal scoring."""
