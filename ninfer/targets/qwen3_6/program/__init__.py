"""The Qwen3.6 family Program: `program.Qwen36Program` (its module docstring maps the concerns to their
modules), the forward schedule (`model`), its weights (`model_view`), CUDA graphs, sampling and scoring."""
