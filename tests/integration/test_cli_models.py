"""Finding and loading a model from the command line: `ninfer --version`, `ninfer identities` (and
`convert --list`), `--model` as the positional MODEL's alias, and a Hugging Face checkpoint directory
given as the model: `inspect` tells what it is, the first use converts it into the user cache
(atomically, with the umask's mode), then loads the `.ninfer` file it became; a second start
converts nothing."""
from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

import ninfer
from ninfer.gateway.cli.main import build_parser, main
from ninfer.targets.registry import REGISTRY

REPO = Path(__file__).resolve().parents[2]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_version_and_the_identities_table(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["--version"])
    assert ei.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"ninfer {ninfer.__version__} (torch ")
    assert ninfer.__version__ == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]

    code, out, _ = _run(capsys, "identities")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split()[:2] == ["IDENTITY", "PARAMS"]
    for ident, package in REGISTRY.items():
        [row] = [r for r in rows if r.startswith(ident + " ")]
        d = package.dims
        assert f" {d.hidden_size} " in row and f"{d.num_hidden_layers} (" in row and " 262144 " in row
        assert (f"MoE {d.num_experts}x" in row) == d.is_moe
    big = [r for r in rows if r.startswith("qwen3_6-27b ")][0]
    assert "27.8B" in big and "64 (48 GDN + 16 attn)" in big and "24q/4kv x 256" in big and "27 blocks" in big
    code, listed, _ = _run(capsys, "convert", "--list")
    assert code == 0 and listed.splitlines() == [header, *rows[:len(REGISTRY)]]
    code, out, _ = _run(capsys, "identities", "--json")
    infos = {i["identity"]: i for i in map(json.loads, out.splitlines())}
    assert infos.keys() == REGISTRY.keys()
    assert infos["qwen3_6-35b-a3b"]["num_experts"] == 256 and infos["qwen3_6-35b-a3b"]["params_text"] > 34e9


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "score"])
def test_model_flag_is_the_positional_models_alias(command, capsys):
    parser, _ = build_parser()
    extra = {"generate": ["-p", "x"], "score": ["-i", "doc.txt"]}.get(command, [])
    assert parser.parse_args([command, "--model", "m.ninfer", *extra]).model == "m.ninfer"
    assert parser.parse_args([command, "m.ninfer", *extra]).model == "m.ninfer"
    assert parser.parse_args([command, *extra]).model is None
    assert parser.parse_args([command, "m.ninfer", "--model", "m.ninfer", *extra]).model == "m.ninfer"
    with pytest.raises(SystemExit) as ei:
        parser.parse_args([command, "a.ninfer", "--model", "b.ninfer", *extra])
    assert ei.value.code == 2 and "the model is given twice" in capsys.readouterr().err


def test_a_checkpoint_directory_is_converted_once_then_loaded_from_the_cache(tiny_checkpoint_dir, tmp_path,
                                                                            monkeypatch, capsys):
    src = tiny_checkpoint_dir("dense", "text")
    monkeypatch.setenv("NINFER_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["-p", "Hello", "--max-tokens", "2", "--temperature", "0", "--device", "cpu", "--max-model-len", "32"]
    code, out, _ = _run(capsys, "inspect", str(src))       # what it is, without converting it
    assert code == 0 and "identity:    qwen3_6-tiny-dense" in out and "converted:   not yet" in out
    old = os.umask(0o022)
    try:
        code, first, err = _run(capsys, "generate", str(src), *argv)
    finally:
        os.umask(old)
    assert code == 0, err
    assert "converting the checkpoint" in err and "convert qwen3_6-tiny-dense" in err    # notice, progress bar
    [converted] = list((tmp_path / "cache" / "converted").glob("*/*.ninfer"))
    assert converted.stat().st_mode & 0o777 == 0o644
    stamp = converted.stat().st_mtime_ns

    code, second, err = _run(capsys, "generate", "--model", str(src), *argv)
    assert code == 0, err
    assert "converting" not in err and f"using {converted}" in err
    assert second == first and converted.stat().st_mtime_ns == stamp
    assert list((tmp_path / "cache" / "converted").glob("*/*.ninfer")) == [converted]
    assert f"converted:   {converted}" in _run(capsys, "inspect", str(src))[1]


def test_the_cache_key_follows_the_checkpoints_content(tmp_path):
    """What the converter reads changes the key (a config or tokenizer edit, a re-saved shard); the
    directory's content left as it is keeps it."""
    import torch
    from safetensors.torch import save_file

    from ninfer.convert.cache import source_key
    from ninfer.convert.source import ConvertError

    src = tmp_path / "ckpt"
    src.mkdir()
    with pytest.raises(ConvertError, match="no config.json"):
        source_key(src)
    (src / "config.json").write_text('{"model_type": "qwen3_5_text"}')
    (src / "tokenizer.json").write_text("{}")
    save_file({"model.embed_tokens.weight": torch.zeros(4, 2)}, src / "model.safetensors")
    key = source_key(src)
    assert source_key(src) == key and source_key(src, dtype="bf16") != key
    (src / "tokenizer.json").write_text('{"x": 1}')
    assert source_key(src) != key
    key = source_key(src)
    save_file({"model.embed_tokens.weight": torch.ones(4, 2)}, src / "model.safetensors")
    os.utime(src / "model.safetensors", ns=(1, 1))
    assert source_key(src) != key


def test_a_directory_that_is_no_checkpoint_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NINFER_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mine.ninfer").touch()
    code, out, err = _run(capsys, "generate", str(tmp_path / "models"), "-p", "x")
    assert code == 2 and out == ""
    assert err.splitlines() == [f"ninfer generate: error: {tmp_path / 'models'}: not a Hugging Face checkpoint "
                                "directory (no config.json); it holds mine.ninfer: pass that file"]
    assert not (tmp_path / "cache").exists()
