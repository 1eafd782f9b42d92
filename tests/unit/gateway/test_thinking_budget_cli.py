"""`--thinking-budget` on `ninfer generate` (with --chat and thinking on) and `ninfer chat`: the value reaches the
request's OutputOptions; a bad combination is a one-line error."""
from __future__ import annotations

import pytest

from ninfer.gateway.cli import cmd_generate
from ninfer.gateway.cli.main import CLIError, build_parser
from ninfer.targets.qwen3_6.frontend import Qwen36Frontend


def _args(*argv):
    parser, _ = build_parser()
    return parser.parse_args(list(argv))


def test_generate_passes_the_budget_into_the_output_options():
    class _Engine:
        frontend = Qwen36Frontend.builtin()
    args = _args("generate", "-p", "Why?", "--chat", "--thinking-budget", "7")
    prompt, output = cmd_generate._prompt(_Engine(), args)
    assert output.thinking_budget == 7 and prompt.enable_thinking
    assert _args("chat", "--thinking-budget", "5").thinking_budget == 5


@pytest.mark.parametrize("extra", [("--think", "off"), (), ("--thinking-budget", "-1")])
def test_generate_refuses_a_budget_it_cannot_apply(extra):
    argv = ["generate", "-p", "x", "--thinking-budget", "4", *extra]
    if extra != ():
        argv.append("--chat")
    with pytest.raises(CLIError, match="--thinking-budget needs --chat with --think on"):
        cmd_generate.run(_args(*argv))
