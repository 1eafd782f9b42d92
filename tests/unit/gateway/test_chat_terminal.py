"""`ninfer chat` on a terminal: the prompt_toolkit line editor driven through a pipe input (history
recall with the arrow keys, history kept across two runs in the file, multi-line input by Esc+Enter,
a trailing backslash and bracketed paste), and answers rendered as Markdown by rich when stdout is a
terminal (plain text otherwise). A scripted engine stands in for the model: the chat loop and
ChatSession are the real code."""
from __future__ import annotations

import io
import os
import re
import stat
from pathlib import Path

import pytest

from ninfer.config import FinishReason, GenerationDelta, GenerationResult, OutputDelta, Usage
from ninfer.gateway.cli import cmd_chat
from ninfer.gateway.cli.chat_tty import EditingReader, MarkdownAnswer, PlainReader, history_path, split_finished
from ninfer.gateway.cli.main import CLIError, build_parser

ANSWER = ["# Plan\n\nUse **bold** and `code`.", "\n\n```py", "thon\nprint('hi')\n", "```\n\n- one\n- two"]


class _Prompt:
    num_prompt_tokens = 3


class _Handle:
    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def __iter__(self):
        for p in self.pieces:
            yield GenerationDelta("r", OutputDelta(text=p), ())
        text = "".join(self.pieces)
        yield GenerationResult("r", text, "", (), (), FinishReason.STOP, Usage(3, len(self.pieces)))

    def close(self) -> None:
        pass

    def cancel(self) -> None:
        pass


class _Engine:
    """Answers every message with `pieces`; `asked` records the user messages it was sent."""
    max_model_len = 4096

    def __init__(self, pieces: list[str]) -> None:
        self.asked: list[str] = []
        self.pieces = pieces
        engine = self

        class _Frontend:
            sampling_defaults: dict = {}

            def prepare_chat(self, messages, chat_template_kwargs=None):
                engine.asked.append(messages[-1]["content"])
                return _Prompt()
        self.frontend = _Frontend()

    def submit(self, prompt, sampling, **kw):
        return _Handle(self.pieces)


def _session(engine, console=None) -> cmd_chat.ChatSession:
    parser, _ = build_parser()
    return cmd_chat.ChatSession(engine, parser.parse_args(["chat", "--think", "off"]), console=console)


class _Typed:
    """Types each chunk of keys when the chat asks for its next line (as a person would: the editor
    has loaded its history by then)."""

    def __init__(self, reader, pipe, chunks: list[str]) -> None:
        self.reader, self.pipe, self.chunks = reader, pipe, list(chunks)

    def read(self, prompt: str) -> str:
        self.pipe.send_text(self.chunks.pop(0))
        return self.reader.read(prompt)


def _drive(history_file, chunks: list[str], engine) -> int:
    from prompt_toolkit.application import create_app_session
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
        return cmd_chat.chat_loop(_session(engine), _Typed(EditingReader(history_file), pipe, chunks + ["\x04"]))


UP, ESC_ENTER, PASTE = "\x1b[A", "\x1b\r", "\x1b[200~{}\x1b[201~"


def test_history_recall_multiline_input_and_history_across_runs(tmp_path, capsys):
    hist = tmp_path / "state" / "chat_history"
    first = _Engine(["ok"])
    keys = ["first question\r", "/think on\r", UP + UP + "\r",            # recall past the command
            "line one\\\rline two\r",                                    # trailing backslash
            "a" + ESC_ENTER + "b\r",                                       # Esc+Enter
            PASTE.format("pasted 1\npasted 2\r\npasted 3") + "\r"]        # bracketed paste, one message
    assert _drive(hist, keys, first) == 0
    assert first.asked == ["first question", "first question", "line one\nline two", "a\nb",
                           "pasted 1\npasted 2\npasted 3"]
    assert "[thinking on]" in capsys.readouterr().out
    assert stat.S_IMODE(os.stat(hist).st_mode) == 0o600
    second = _Engine(["ok"])                                                 # a new run, the same file
    assert _drive(hist, [UP + "\r"], second) == 0
    assert second.asked == ["pasted 1\npasted 2\npasted 3"]
    unwritable = tmp_path / "file"
    unwritable.write_text("")
    third = _Engine(["ok"])                  # no history file possible: one warning, editing still works
    assert _drive(unwritable / "chat_history", ["hi\r", UP + "\r"], third) == 0
    assert third.asked == ["hi", "hi"] and "warning: no chat history across runs" in capsys.readouterr().err


def test_history_location(monkeypatch, tmp_path):
    monkeypatch.delenv("NINFER_CHAT_HISTORY", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert history_path() == tmp_path / "ninfer" / "chat_history"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert history_path() == Path.home() / ".local" / "state" / "ninfer" / "chat_history"
    monkeypatch.setenv("NINFER_CHAT_HISTORY", str(tmp_path / "h"))
    assert history_path() == tmp_path / "h"
    monkeypatch.setenv("NINFER_CHAT_HISTORY", "")
    assert history_path() is None


def test_answer_rendered_as_markdown_on_a_terminal(capsys):
    from rich.console import Console

    term = io.StringIO()
    engine = _Engine(ANSWER)
    session = _session(engine, Console(file=term, force_terminal=True, width=60, color_system="standard"))
    session.answer("plan it")
    shown = term.getvalue()
    assert "\x1b[" in shown                                       # styled
    screen = "\n".join(_screen(shown))
    for source in ("```", "**", "# Plan", "`code`", "- one"):
        assert source not in screen, source                       # the Markdown syntax is rendered
    for text in ("Plan", "Use bold and code.", "print('hi')", "• one", "• two"):
        assert text in screen, text
    assert session.history[-1]["content"] == "".join(ANSWER)      # the history keeps the Markdown source
    assert capsys.readouterr().out.count("```") == 0
    plain = _session(_Engine(ANSWER))                             # not a terminal: the text as it streams
    plain.answer("plan it")
    assert capsys.readouterr().out == "".join(ANSWER) + "\n"


def _screen(raw: str) -> list[str]:
    """The lines a terminal shows after `raw` (the controls rich's Live uses: CR, LF, cursor up, erase line)."""
    raw = re.sub(r"\x1b\[[0-9;]*m|\x1b\[\?25[lh]", "", raw)
    lines, row, col = [""], 0, 0
    for tok in re.findall(r"\x1b\[\d*[AK]|\r|\n|[^\x1b\r\n]+", raw):
        if tok == "\n":
            row, col = row + 1, 0
            lines += [""] * (row + 1 - len(lines))
        elif tok == "\r":
            col = 0
        elif tok.endswith("A"):
            row = max(0, row - int(tok[2:-1] or 1))
        elif tok.endswith("K"):
            lines[row] = ""
        else:
            line = lines[row].ljust(col)
            lines[row], col = line[:col] + tok + line[col + len(tok):], col + len(tok)
    return [line.rstrip() for line in lines]


def test_streamed_markdown_leaves_the_rendering_of_the_whole_answer():
    from rich.console import Console
    from rich.markdown import Markdown

    assert split_finished("a\n\nb") == ("a\n\n", "b")
    assert split_finished("```\nx\n\ny\n") == ("", "```\nx\n\ny\n")          # no cut inside a fence
    assert split_finished("```\nx\n```\nmore") == ("```\nx\n```\n", "more")
    doc = "".join(ANSWER) + "\n\n1. a\n\n2. b\n\nlast para\nline"
    whole = io.StringIO()
    Console(file=whole, force_terminal=True, width=50).print(Markdown(doc))
    for step in (1, 7, len(doc)):
        term = io.StringIO()
        md = MarkdownAnswer(Console(file=term, force_terminal=True, width=50))
        for k in range(0, len(doc), step):
            md.write(doc[k:k + step])
        md.close()
        assert _screen(term.getvalue()) == _screen(whole.getvalue()), step


def test_piped_input_reads_plain_lines(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("one\ntwo\n"))
    reader = PlainReader()
    assert reader.read("") == "one" and reader.read("") == "two"
    with pytest.raises(EOFError):
        reader.read("")


def test_bad_thinking_budget_is_a_one_line_error():
    parser, _ = build_parser()
    with pytest.raises(CLIError, match="--thinking-budget must be >= 0, got -1"):
        cmd_chat.run(parser.parse_args(["chat", "--thinking-budget", "-1"]))
