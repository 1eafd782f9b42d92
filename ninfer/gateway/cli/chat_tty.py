"""The terminal side of `ninfer chat`: line editing with a persistent history (prompt_toolkit) when
stdin is a terminal, and answers rendered as Markdown (rich) when stdout is one. Piped use reads
lines with `input()` and writes the answer's text as it streams, unchanged.

Multi-line input: a paste arrives as one message (bracketed paste); Esc+Enter (or Alt+Enter) and a
line ending in a backslash start a new line instead of sending.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

EDIT_HELP = "(arrow keys: edit and history; Esc+Enter or a trailing \\ : new line; pasted lines stay one message)"
REFRESH_S = 0.05


def history_path() -> Path | None:
    """$NINFER_CHAT_HISTORY ("" = keep no history file), else $XDG_STATE_HOME/ninfer/chat_history,
    else ~/.local/state/ninfer/chat_history."""
    env = os.environ.get("NINFER_CHAT_HISTORY")
    if env is not None:
        return Path(env).expanduser() if env else None
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "ninfer" / "chat_history"


class PlainReader:
    """Lines from a pipe or file, exactly as `input()` reads them."""

    def read(self, prompt: str) -> str:
        return input(prompt)


class EditingReader:
    """prompt_toolkit's line editor: Emacs keys, history recall with the arrow keys, bracketed paste.
    Raises EOFError on Ctrl-D and KeyboardInterrupt on Ctrl-C, as `input()` does."""

    def __init__(self, history_file: Path | None) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.filters import Condition
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from prompt_toolkit.key_binding import KeyBindings

        history = InMemoryHistory()
        if history_file is not None:
            try:
                history_file.parent.mkdir(parents=True, exist_ok=True)
                # NOTE: a conversation is private: the history file is the user's alone, like a shell's
                os.close(os.open(history_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
                history = FileHistory(str(history_file))
            except OSError as e:
                print(f"warning: no chat history across runs ({e.filename or history_file}: {e.strerror})",
                      file=sys.stderr)
        keys = KeyBindings()

        @keys.add("escape", "enter")
        def _newline(event) -> None:
            event.current_buffer.insert_text("\n")

        @Condition
        def _continued() -> bool:
            from prompt_toolkit.application import get_app
            return get_app().current_buffer.document.text_before_cursor.endswith("\\")

        @keys.add("enter", filter=_continued)
        def _continue(event) -> None:
            event.current_buffer.delete_before_cursor(1)
            event.current_buffer.insert_text("\n")

        self.session = PromptSession(history=history, key_bindings=keys, prompt_continuation=". ")

    def read(self, prompt: str) -> str:
        return self.session.prompt(prompt)


def split_finished(text: str) -> tuple[str, str]:
    """(the finished Markdown blocks, the block still being written): cut after the last blank line
    or closing code fence outside a code block. The line being written is never cut."""
    cut = pos = 0
    fenced = False
    for line in text.splitlines(keepends=True):
        pos += len(line)
        if not line.endswith("\n"):
            break
        s = line.strip()
        if s.startswith(("```", "~~~")):
            fenced = not fenced
            if not fenced:
                cut = pos
        elif not s and not fenced:
            cut = pos
    return text[:cut], text[cut:]


class _Lines:
    """Rendered lines as a rich renderable."""

    def __init__(self, lines) -> None:
        self.lines = lines

    def __rich_console__(self, console, options):
        from rich.segment import Segment
        for line in self.lines:
            yield from line
            yield Segment.line()


class MarkdownAnswer:
    """An answer streamed to a terminal as Markdown. The rendering of the finished blocks is printed
    once, line by line as blocks finish; below it, the rest is re-rendered in place (its last screenful
    while it is taller than the terminal). What stays on screen is the rendering of the whole answer."""

    def __init__(self, console) -> None:
        from rich.live import Live

        self.console = console
        self.text = ""
        self.finished = ""                # the finished blocks, a prefix of `text`
        self.num_printed = 0              # lines of the finished blocks' rendering printed so far
        self._last = 0.0
        self.live = Live(console=console, auto_refresh=False, transient=True)
        self.live.start()

    def _render(self, text: str) -> list:
        from rich.markdown import Markdown
        return self.console.render_lines(Markdown(text), pad=False) if text.strip() else []

    def write(self, delta: str) -> None:
        self.text += delta
        finished = self.text[:len(self.finished)] + split_finished(self.text[len(self.finished):])[0]
        grew = finished != self.finished
        if grew:
            self.finished = finished
            lines = self._render(finished)
            self.console.print(_Lines(lines[self.num_printed:]), end="")
            self.num_printed = max(self.num_printed, len(lines))
        now = time.monotonic()
        if grew or now - self._last >= REFRESH_S:
            self._last = now
            rest = self._render(self.text[len(self.finished):])
            self.live.update(_Lines(rest[-max(1, self.console.size.height - 2):]), refresh=True)

    def close(self) -> None:
        self.live.stop()                  # NOTE: transient: the in-place part is erased, then printed once
        self.console.print(_Lines(self._render(self.text)[self.num_printed:]), end="")
        self.text = self.finished = ""
        self.num_printed = 0


def terminal_console():
    """A rich Console on stdout when it is a terminal, else None (plain streaming text)."""
    if not (hasattr(sys.stdout, "isatty") and sys.stdout.isatty()):
        return None
    from rich.console import Console
    return Console(file=sys.stdout)
