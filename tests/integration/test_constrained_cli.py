"""`ninfer generate --json-schema FILE | --regex RE | --choice TEXT` on the demo model (through the CLI's
`main` in this process): the answer matches, on a chat with thinking on (the constraint applies after
the reasoning, closed by a budget); a bad constraint is one line and exit code 2. (Plain prompts, regexes
and choices: test_constrained_http.py.)"""
from __future__ import annotations

import functools
import json

import jsonschema

from support.serve_util import ninfer_in_process

SCHEMA = {"type": "object", "required": ["n", "ok"], "additionalProperties": False,
          "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}}}


def test_generate_with_a_constraint(capsys, monkeypatch, tmp_path):
    ninfer = functools.partial(ninfer_in_process, capsys, monkeypatch)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    base = ("generate", "-p", "Hello", "--max-tokens", "60", "--json", "--temperature", "1", "--seed", "1")
    r = ninfer(*base, "--chat", "--thinking-budget", "2", "--json-schema", str(schema))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["finish_reason"] == "stop" and out["usage"]["reasoning_tokens"] == 2
    jsonschema.validate(json.loads(out["text"]), SCHEMA)


def test_bad_constraints_are_one_line(capsys, monkeypatch, tmp_path):
    ninfer = functools.partial(ninfer_in_process, capsys, monkeypatch)
    for args, message in [
        (("--regex", "(ab"), "--regex: "),
        (("--json-schema", str(tmp_path / "missing.json")), "--json-schema "),
        (("--regex", "a", "--choice", "a"), "give one of --json-schema, --regex, --choice"),
    ]:
        r = ninfer("generate", "-p", "x", "--max-tokens", "2", *args)
        assert r.returncode == 2 and r.stdout == "", (args, r.stderr)
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("ninfer generate: error: ")]
        assert len(lines) == 1 and message in lines[0], (args, r.stderr)
