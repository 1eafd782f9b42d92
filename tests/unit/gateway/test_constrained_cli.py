"""`ninfer generate --json-schema FILE | --regex RE | --choice TEXT`: the flags become the request's
OutputConstraint (on a chat with thinking on it applies after the reasoning); a file that cannot be read,
two flags, or a constraint that does not compile is one CLIError line. (The constrained generation
itself runs end to end in tests/integration/test_constrained_http.py.)"""
from __future__ import annotations

import json

import pytest

from ninfer.contract.frontend import OutputConstraint
from ninfer.gateway.cli import cmd_generate
from ninfer.gateway.cli.main import CLIError, build_parser, main
from ninfer.targets.qwen3_6.frontend import Qwen36Frontend

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}


def _args(*argv):
    parser, _ = build_parser()
    return parser.parse_args(list(argv))


class _Engine:
    frontend = Qwen36Frontend.builtin()


def test_the_flags_become_the_output_constraint(tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    args = _args("generate", "-p", "x", "--chat", "--json-schema", str(schema))
    constraint = cmd_generate.output_constraint(args)
    assert constraint == OutputConstraint("json_schema", json.dumps(SCHEMA), "--json-schema")
    prompt, output = cmd_generate._prompt(_Engine(), args, constraint=constraint)
    assert output.constraint == constraint and prompt.enable_thinking      # after the reasoning
    args = _args("generate", "-p", "x", "--regex", "[a-z]+")
    constraint = cmd_generate.output_constraint(args)
    assert constraint == OutputConstraint("regex", "[a-z]+", "--regex")
    prompt, output = cmd_generate._prompt(_Engine(), args, constraint=constraint)
    assert output.constraint == constraint and not prompt.enable_thinking
    assert cmd_generate.output_constraint(_args("generate", "-p", "x", "--choice", "a", "--choice", "b")) == \
        OutputConstraint("choice", '["a", "b"]', "--choice")
    assert cmd_generate.output_constraint(_args("generate", "-p", "x")) is None


def test_bad_constraints_are_one_line(tmp_path, capsys):
    with pytest.raises(CLIError, match=r"^--regex: .*unclosed group"):
        cmd_generate.compile_constraint(_Engine.frontend, OutputConstraint("regex", "(ab", "--regex"))
    with pytest.raises(CLIError, match=r"^--json-schema: Invalid type: banana"):
        cmd_generate.compile_constraint(_Engine.frontend, OutputConstraint("json_schema", '{"type": "banana"}',
                                                                           "--json-schema"))
    # refused before the model loads: one line on stderr, exit code 2
    for args, message in [(("--json-schema", str(tmp_path / "missing.json")), "--json-schema "),
                          (("--regex", "a", "--choice", "a"), "give one of --json-schema, --regex, --choice"),
                          (("--json-schema", "-", "-p", "-"), "cannot both read stdin")]:
        code = main(["generate", "-p", "x", *args])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and err.startswith("ninfer generate: error: ") and message in err
