"""Shared pytest fixtures (owned by the artifact/converter area; append your own below).

Tiny models, built once per test session and cached (each build takes ~1-2 s):

    def test_something(tiny_artifact_path):
        path = tiny_artifact_path("dense")                 # -> Path of a .ninfer file
        path = tiny_artifact_path("moe", dtype="bf16")     # dtype "fp32" (default) | "bf16"
        with ninfer.artifact.open_artifact(path) as art: ...

    def test_other(tiny_checkpoint_dir):
        src = tiny_checkpoint_dir("moe", "official")       # HF checkpoint dir incl. tokenizer files

  kind    "dense" (identity qwen3_6-tiny-dense) | "moe" (qwen3_6-tiny-moe)
  layout  "official" (default for artifacts: multimodal names, vision tower, MTP, fused MoE
          main experts) | "vl" | "text" (no vision group). All layouts carry `mtp.*`.
  seed    0 by default. The weights equal those of
          `ninfer.testing.tiny_hf.build_hf_model(kind, "vl" or "text", seed=seed)` (same seed),
          so that HF model is the reference for parity tests. NOTE: "vl" and "text" builds of
          the same seed draw different random weights: compare a "text"-layout artifact with
          `build_hf_model(kind, "text")`, any other layout with the "vl" model. With dtype="bf16" the artifact holds the bf16-rounded weights, except
          `linear_attn.A_log` / `linear_attn.norm.weight`, which stay fp32.

The artifacts hold the real Qwen3.6 tokenizer files (frontend `write_tokenizer_files`).
"""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_checkpoint_dir(tmp_path_factory):
    cache: dict[tuple, Path] = {}

    def get(kind: str, layout: str = "official", *, seed: int = 0, shards: int = 1) -> Path:
        key = (kind, layout, seed, shards)
        if key not in cache:
            from ninfer.targets.qwen3_6.frontend.vocab import write_tokenizer_files
            from ninfer.testing.tiny_hf import write_tiny_checkpoint

            out = tmp_path_factory.mktemp(f"hf-{kind}-{layout}-s{seed}-x{shards}")
            write_tiny_checkpoint(out, kind, layout, seed=seed, shards=shards)
            write_tokenizer_files(out)
            cache[key] = out
        return cache[key]

    return get


@pytest.fixture(scope="session")
def tiny_artifact_path(tmp_path_factory, tiny_checkpoint_dir):
    cache: dict[tuple, Path] = {}

    def get(kind: str, dtype: str = "fp32", *, layout: str = "official", seed: int = 0) -> Path:
        key = (kind, dtype, layout, seed)
        if key not in cache:
            from ninfer.convert import convert

            src = tiny_checkpoint_dir(kind, layout, seed=seed)
            out = tmp_path_factory.mktemp("ninfer") / f"tiny-{kind}-{layout}-{dtype}-s{seed}.ninfer"
            cache[key] = convert(src, out, dtype=dtype)
        return cache[key]

    return get
