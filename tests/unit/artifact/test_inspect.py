"""`ninfer convert` and `ninfer inspect` through the CLI entry point."""
from __future__ import annotations

import re

from ninfer.gateway.cli.main import main


def test_convert_and_inspect(tiny_checkpoint_dir, tmp_path, capsys):
    out = tmp_path / "m.ninfer"
    assert main(["convert", str(tiny_checkpoint_dir("moe", "official")), str(out), "--dtype", "bf16",
                 "--no-progress"]) == 0
    assert "qwen3_6-tiny-moe, bf16, 193 tensors" in capsys.readouterr().out
    assert main(["inspect", str(out), "--verify"]) == 0
    text = capsys.readouterr().out
    assert "identity:    qwen3_6-tiny-moe" in text
    assert "MoE 8 experts top-2" in text and "6 GDN + 2 attention" in text
    for group, count in (("embedding", 1), ("gdn", 54), ("attention", 12), ("experts", 16), ("vision", 33),
                         ("mtp", 19), ("head", 1)):
        assert re.search(rf"^  {group}\s+{count} tensors", text, re.M), group
    assert "tokenizer.json" in text and "chat_template.jinja" in text and "eos ids:     [248046, 248044]" in text
    assert "checksums OK" in text


def test_cli_errors_are_one_line(tiny_checkpoint_dir, tmp_path, capsys):
    out = tmp_path / "m.ninfer"
    rc = main(["convert", str(tiny_checkpoint_dir("dense", "text")), str(out), "--target", "qwen3_6-tiny-moe",
               "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "does not match qwen3_6-tiny-moe" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    bad = tmp_path / "bad.ninfer"
    bad.write_bytes(b"not an artifact")
    assert main(["inspect", str(bad)]) == 2
    assert "wrong magic" in capsys.readouterr().err
