"""The built-in demo model: built on first use into the cache dir, reused, rebuilt when broken,
deterministic, without `transformers`."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.serve_util import shared_cache_dir
from ninfer.paths import user_cache_dir
from ninfer import demo as D


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("NINFER_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir() == tmp_path / "xdg" / "ninfer"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert user_cache_dir() == Path.home() / ".cache" / "ninfer"
    monkeypatch.setenv("NINFER_CACHE_DIR", str(tmp_path / "mine"))
    assert user_cache_dir() == tmp_path / "mine"
    assert D.demo_artifact_path().parent == tmp_path / "mine" / "demo"


def test_weights_are_deterministic_and_hf_like():
    a = dict(D.demo_tensors())
    b = dict(D.demo_tensors())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    w = a["layers.0.mlp.gate_proj.weight"]
    assert abs(w.std().item() - D.INIT_STD) < 0.002
    assert a["norm.weight"].abs().max() > 0          # norms perturbed around the (1 + w) centre
    head = a["lm_head.weight"]
    assert (head[D.TOKENIZER_VOCAB_SIZE:, 0] == D.PAD_ROW_WEIGHT).all()
    assert torch.all(a["embed_tokens.weight"][:, 0] > 0.2)


def test_built_once_reused_and_rebuilt_when_broken(tmp_path):
    env_dir = tmp_path / "cache"
    code = (
        "import os, sys\n"
        "os.umask(0o022)\n"
        "from ninfer.demo import ensure_demo_artifact\n"
        "built = []\n"
        "p = ensure_demo_artifact(on_build=built.append)\n"
        "assert 'transformers' not in sys.modules, 'transformers imported'\n"
        "print(p, len(built))\n")
    env = {**os.environ, "NINFER_CACHE_DIR": str(env_dir)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    path_text, n_built = out.stdout.split()
    path = Path(path_text)
    assert n_built == "1" and path.parent == env_dir / "demo" and path.exists()
    # written atomically, with the mode the umask gives (not the temporary file's 0600)
    for written in [path, *(env_dir / "tokenizers").iterdir()]:
        assert written.stat().st_mode & 0o777 == 0o644, written

    from ninfer.artifact import open_artifact
    art = open_artifact(path)
    try:
        assert art.identity == D.DEMO_IDENTITY
        res = art.frontend_resources()
        assert "<|im_start|>" in res["chat_template.jinja"].decode() and "tokenizer.json" in res
        assert set(D.EOS_TOKEN_IDS) <= set(art.eos_token_ids)
        assert torch.equal(art.tensor("layers.0.mlp.gate_proj.weight"),
                           dict(D.demo_tensors())["layers.0.mlp.gate_proj.weight"])
        # stored bf16 like the real checkpoints; A_log fp32 as the 35B-A3B stores it
        assert art.tensor("layers.0.mlp.gate_proj.weight").dtype == torch.bfloat16
        assert art.tensor("layers.0.linear_attn.A_log").dtype == torch.float32
    finally:
        art.close()

    mtime, size = path.stat().st_mtime_ns, path.stat().st_size
    built: list = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NINFER_CACHE_DIR", str(env_dir))
        assert D.ensure_demo_artifact(on_build=built.append) == path and built == []
        assert path.stat().st_mtime_ns == mtime
        with open(path, "r+b") as f:                  # break it: the next use rebuilds
            f.truncate(1000)
        assert D.ensure_demo_artifact(on_build=built.append) == path and built == [path]
        assert path.stat().st_size == size > 60_000_000          # whole again (bf16: ~75 MB)
    assert not list((env_dir / "demo").glob("*.tmp*"))


def test_the_prompt_shapes_the_output_under_the_family_defaults(monkeypatch):
    """The demo ships the Qwen3.6 checkpoints' sampling defaults (temperature 1.0, top-k 20, top-p
    0.95), and its weights carry the prompt into the state: two prompts draw different first tokens
    under the defaults with the same seed (two chat prompts, which end in the same tokens, different
    openings), and a seed repeats its draw."""
    from ninfer import Engine, EngineConfig, SamplingParams

    monkeypatch.setenv("NINFER_CACHE_DIR", str(shared_cache_dir()))
    engine = Engine(D.ensure_demo_artifact(), EngineConfig(device="cpu", max_model_len=64))
    try:
        engine.wait_ready()
        fe = engine.frontend
        assert fe.sampling_defaults == {"temperature": 1.0, "top_k": 20, "top_p": 0.95}

        def tokens(prompt, n: int, seed: int = 7) -> list[int]:
            params = SamplingParams(**fe.sampling_defaults, seed=seed)
            return list(engine.generate(prompt, params, max_tokens=n).token_ids)

        hello, sky = fe.prepare_text("Hello"), fe.prepare_text("Why is the sky blue?")
        assert tokens(hello, 1)[0] != tokens(sky, 1)[0]
        assert tokens(hello, 1) == tokens(hello, 1)
        chat = [fe.prepare_chat([{"role": "user", "content": text}]) for text in ("Hello", "Why is the sky blue?")]
        assert tokens(chat[0], 3) != tokens(chat[1], 3)
    finally:
        engine.close()
