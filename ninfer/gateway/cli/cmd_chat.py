"""`ninfer chat [MODEL]`: an interactive terminal chat.

The conversation is one context-cache session (`--session NAME`, default: a fresh name per chat),
so each turn reuses the previous one's checkpoint instead of computing the history again
(`--no-prefix-cache` turns the cache off).

Commands: /reset (forget the conversation), /system TEXT (set the system message and reset),
/think on|off (thinking mode), /image PATH and /video PATH (attach a file to the next message),
/help, /exit. Reasoning is shown dimmed before the answer.
Ctrl-C cancels the answer being generated (the turn is dropped) and returns to the prompt;
Ctrl-D (end of input) exits.

On a terminal (chat_tty.py): line editing, history across runs and multi-line input (prompt_toolkit),
answers rendered as Markdown (rich). Piped input is read line by line and the answer streams as text.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
import uuid

from ninfer.gateway.cli.chat_tty import (EDIT_HELP, EditingReader, MarkdownAnswer, PlainReader, history_path,
                                        terminal_console)
from ninfer.gateway.cli.common import (CLIError, add_engine_args, add_model_arg, add_sampling_args, check_max_tokens,
                               dim, engine_config, open_engine, output_room, resolve_model, room_note,
                               sampling_params, use_color)

HELP = ("commands: /reset  /system TEXT  /think on|off  /image PATH  /video PATH  /help  /exit    "
        "(Ctrl-C cancels an answer, Ctrl-D exits)")


def add_parser(p: argparse.ArgumentParser) -> None:
    add_model_arg(p)
    p.add_argument("--system", default=None, help="initial system message")
    p.add_argument("--think", choices=("on", "off"), default="on", help="thinking mode (default: on)")
    p.add_argument("--thinking-budget", type=int, default=None, metavar="N",
                   help="close each answer's reasoning after N tokens (default: no cap)")
    p.add_argument("--session", default=None, metavar="NAME",
                   help="context-cache session key of this conversation (default: a fresh one per chat)")
    add_sampling_args(p, max_tokens=1024)
    add_engine_args(p)


class ChatSession:
    """One conversation. `console`: a rich Console to render answers as Markdown on (None: plain text)."""

    def __init__(self, engine, args, console=None):
        self.engine = engine
        self.console = console
        self.args = args
        self.system: str | None = args.system
        self.think = args.think == "on"
        self.history: list[dict] = []
        self.color = use_color(sys.stdout)
        self.session_base = args.session or f"chat-{uuid.uuid4().hex[:12]}"
        self.resets = 0
        self.attached: list[dict] = []        # image/video parts for the next user message

    @property
    def session_id(self) -> str:
        # NOTE: /reset starts a new conversation, so a new session key (the old one stays valid).
        return self.session_base if not self.resets else f"{self.session_base}#{self.resets}"

    def messages(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.history

    def command(self, line: str) -> bool:
        """Handle a /command; False means exit."""
        cmd, _, rest = line.partition(" ")
        rest = rest.strip()
        if cmd in ("/exit", "/quit"):
            return False
        if cmd == "/reset":
            self.history.clear()
            self.attached.clear()
            self.resets += 1
            print("[conversation reset]")
        elif cmd == "/system":
            self.system = rest or None
            self.history.clear()
            self.resets += 1
            print("[system message set; conversation reset]" if rest else "[system message cleared; conversation reset]")
        elif cmd == "/think":
            if rest not in ("on", "off"):
                print("usage: /think on|off")
            else:
                self.think = rest == "on"
                print(f"[thinking {rest}]")
        elif cmd in ("/image", "/video"):
            self.attach(cmd[1:], rest)
        elif cmd == "/help":
            print(HELP)
        else:
            print(f"unknown command {cmd}; {HELP}")
        return True

    def attach(self, kind: str, path: str) -> None:
        from ninfer.gateway.cli.cmd_generate import media_parts
        from ninfer.gateway.cli.main import CLIError
        from ninfer.gateway.media import MEDIA_KEY

        if not path:
            print(f"usage: /{kind} PATH")
            return
        try:
            part = media_parts([path] if kind == "image" else [], [path] if kind == "video" else [])[0]
        except CLIError as e:
            print(f"error: {str(e).removeprefix(f'--{kind} {path}: ')}", file=sys.stderr)
            return
        self.attached.append(part)
        w, h = part[MEDIA_KEY].size
        print(f"[{kind} attached to the next message: {path} ({w}x{h})]")

    def answer(self, text: str) -> None:
        from ninfer.config import (EngineRequestError, GenerationDelta, GenerationError, GenerationResult,
                                  OutputOptions)

        content = [*self.attached, {"type": "text", "text": text}] if self.attached else text
        turn = self.history + [{"role": "user", "content": content}]
        self.attached = []                    # NOTE: attachments belong to this message, sent or not
        head = [{"role": "system", "content": self.system}] if self.system else []
        try:
            prompt = self.engine.frontend.prepare_chat(head + turn,
                                                       chat_template_kwargs={"enable_thinking": self.think})
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return
        room = output_room(self.engine, prompt.num_prompt_tokens)
        if room < 1:
            print(f"error: the conversation has {prompt.num_prompt_tokens} tokens, over max_model_len "
                  f"{self.engine.max_model_len}{room_note(self.engine)}; /reset to start over", file=sys.stderr)
            return
        try:
            handle = self.engine.submit(prompt, sampling_params(self.args, self.engine.frontend.sampling_defaults),
                                        max_tokens=min(self.args.max_tokens, room),
                                        output=OutputOptions(thinking_budget=self.args.thinking_budget),
                                        session_id=self.session_id)
        except EngineRequestError as e:
            print(f"error: {e}", file=sys.stderr)
            return
        out = sys.stdout
        in_reasoning = False
        markdown = None                       # the answer's MarkdownAnswer while it streams to a console
        result = None
        ctrl_c = _CtrlC(handle)
        try:
            for ev in handle:
                if isinstance(ev, GenerationDelta):
                    if ev.delta.reasoning:
                        if markdown is not None:
                            markdown.close()
                            markdown = None
                        out.write(dim(ev.delta.reasoning, self.color))
                        in_reasoning = True
                    if ev.delta.text:
                        if in_reasoning:
                            out.write("\n\n")
                            in_reasoning = False
                        if self.console is not None:
                            out.flush()
                            markdown = markdown or MarkdownAnswer(self.console)
                            markdown.write(ev.delta.text)
                        else:
                            out.write(ev.delta.text)
                    out.flush()
                elif isinstance(ev, GenerationResult):
                    result = ev
                elif isinstance(ev, GenerationError):
                    print(f"\nerror ({ev.kind.value}): {ev.message}", file=sys.stderr)
        except KeyboardInterrupt:
            ctrl_c.pressed = True
        finally:
            ctrl_c.restore()
            handle.close()
            if markdown is not None:
                markdown.close()
        if ctrl_c.pressed:
            handle.cancel()
            print("\n[cancelled]")
            return
        if markdown is None:                  # NOTE: rendered Markdown ends with its own newline
            out.write("\n")
        out.flush()
        if result is None:
            return
        if result.finish_reason.value == "length":
            print("[answer cut at --max-tokens]")
        msg = {"role": "assistant", "content": result.text}
        if result.reasoning:
            msg["reasoning_content"] = result.reasoning
        self.history = turn + [msg]


class _CtrlC:
    """Ctrl-C while an answer streams: the handler cancels the request itself before raising
    KeyboardInterrupt. Python runs a signal handler at the next bytecode of the main thread, which may
    be inside a finalizer that swallows the exception; the cancellation then still ends the stream,
    and `pressed` still says why."""

    def __init__(self, handle) -> None:
        self.pressed = False
        self._handle = handle
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum, frame) -> None:
        self.pressed = True
        self._handle.cancel()
        raise KeyboardInterrupt

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


def run(args: argparse.Namespace) -> int:
    check_max_tokens(args.max_tokens)
    if args.thinking_budget is not None and args.thinking_budget < 0:
        raise CLIError(f"--thinking-budget must be >= 0, got {args.thinking_budget}")
    sampling_params(args)                 # NOTE: a bad sampling flag fails before the model loads
    config = engine_config(args)
    path, name, _ = resolve_model(args.model, config=config)
    engine = open_engine(path, config)
    try:
        editing = hasattr(sys.stdin, "isatty") and sys.stdin.isatty()
        reader = EditingReader(history_path()) if editing else PlainReader()
        session = ChatSession(engine, args, console=terminal_console())
        print(f"chatting with {name}. {HELP}" + (f"\n{EDIT_HELP}" if editing else ""))
        return chat_loop(session, reader)
    finally:
        engine.close()


def chat_loop(session: ChatSession, reader) -> int:
    """Read messages and /commands until end of input or /exit."""
    while True:
        try:
            line = reader.read("> ")
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print()
            continue
        line = line.strip()
        if not line:
            continue
        if line.startswith("/"):
            if not session.command(line):
                return 0
            continue
        session.answer(line)
