"""Incremental split of Qwen3.6 output text into reasoning, content and XML tool calls.

Rules (qwen3_6.md section 8; vLLM `qwen3` reasoning and `qwen3_coder` tool parsers):
- When the prompt opened `<think>`, text before `</think>` is reasoning and the tag is dropped;
  a `<tool_call>` before `</think>` also ends reasoning and starts a tool call. Without an
  opened `<think>` everything is content. With parse_reasoning off, reasoning text (and the
  `</think>` tag) goes to content.
- `<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n...</function>\\n</tool_call>`
  becomes an OpenAI-style call; one leading and one trailing newline of V are dropped and V is
  typed by the tool's schema (tool_args.py). Streaming: a first delta carries index, id and
  name; each complete parameter appends `{"K": V` / `, "K": V`; `</function>` appends `}`. The
  concatenated fragments are the final arguments text (json.dumps formatting).
- Whitespace right after a `</tool_call>` is dropped (between calls and at the end). A
  `<tool_call>` not followed by `<function=NAME>` is content. With `trim_answer` (a constrained
  answer) the whitespace before the answer (after `</think>`, or at the start) is dropped too, so
  that the content is exactly the text the constraint matched.
- Text that may be the start of a tag is held back until it is decided; finish() flushes it.

The parser is a small copyable state machine: OutputSession copies it to preview and keeps the
copy on commit.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from .tool_args import convert_value, tool_properties
from ninfer.contract.frontend import ToolCall, ToolCallDelta

THINK_END = "</think>"
TOOL_START = "<tool_call>"
TOOL_END = "</tool_call>"
FUNC_START = "<function="
FUNC_END = "</function>"
PARAM_START = "<parameter="
PARAM_END = "</parameter>"
_BAD_NAME_CHARS = set("{}<>\"' \t\n\r")

REASONING, CONTENT, TOOL = "reasoning", "content", "tool"


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    thinking: bool              # the prompt opened <think>
    parse_reasoning: bool
    parse_tool_calls: bool
    tools: tuple[dict, ...] = ()
    trim_answer: bool = False   # drop the whitespace before the answer (a constrained answer)


@dataclass(slots=True)
class ChannelOutput:
    """What one feed/finish produced (appended to by the parser)."""
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_deltas: list[ToolCallDelta] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)


def _held_prefix_len(buf: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of buf that is a proper prefix of one of the tags."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(buf)), best, -1):
            if buf.endswith(tag[:n]):
                best = n
                break
    return best


@dataclass(slots=True)
class ChannelParser:
    cfg: ChannelConfig
    mode: str = CONTENT
    buf: str = ""
    after_tool: bool = False            # drop whitespace here (after a </tool_call>; before a trimmed answer)
    num_tool_calls: int = 0             # started (header sent) calls
    num_complete: int = 0               # calls closed by </function> or </tool_call>
    num_closed: int = 0                 # calls whose </tool_call> (or end) was consumed
    # current call
    phase: str = "open"                 # open | body | close
    call_id: str = ""
    call_name: str = ""
    call_args: str = ""                 # arguments text streamed so far
    call_params: int = 0

    @classmethod
    def start(cls, cfg: ChannelConfig) -> "ChannelParser":
        return cls(cfg=cfg, mode=REASONING if cfg.thinking else CONTENT,
                   after_tool=cfg.trim_answer and not cfg.thinking)

    def copy(self) -> "ChannelParser":
        return ChannelParser(self.cfg, self.mode, self.buf, self.after_tool, self.num_tool_calls,
                             self.num_complete, self.num_closed, self.phase, self.call_id, self.call_name,
                             self.call_args, self.call_params)

    @property
    def in_reasoning(self) -> bool:
        return self.mode == REASONING

    # ---------------------------------------------------------------------------------------
    def feed(self, text: str, out: ChannelOutput) -> None:
        self.buf += text
        while self.buf:
            before = (self.mode, len(self.buf), self.phase)
            if self.mode == REASONING:
                self._reasoning(out)
            elif self.mode == CONTENT:
                self._content(out)
            else:
                self._tool(out, final=False)
            if (self.mode, len(self.buf), self.phase) == before:
                break                       # waiting for more text

    def finish(self, out: ChannelOutput) -> None:
        """End of output: flush held text and close an open tool call."""
        while True:
            self.feed("", out)
            if self.mode != TOOL:
                break
            self._tool(out, final=True)
        if self.buf:
            if self.mode == REASONING:
                self._emit_reasoning(self.buf, out)
            else:
                self._emit_content(self.buf, out)
            self.buf = ""

    # ---------------------------------------------------------------------------------------
    def _emit_reasoning(self, s: str, out: ChannelOutput) -> None:
        if s:
            (out.reasoning if self.cfg.parse_reasoning else out.text).append(s)

    def _emit_content(self, s: str, out: ChannelOutput) -> None:
        if self.after_tool:
            s = s.lstrip()
            if not s:
                return
            self.after_tool = False
        if s:
            out.text.append(s)

    def _reasoning(self, out: ChannelOutput) -> None:
        buf = self.buf
        end = buf.find(THINK_END)
        tool = buf.find(TOOL_START)
        if end >= 0 and (tool < 0 or end < tool):
            self._emit_reasoning(buf[:end], out)
            if not self.cfg.parse_reasoning:
                out.text.append(THINK_END)
            self.buf = buf[end + len(THINK_END):]
            self.mode = CONTENT
            self.after_tool = self.cfg.trim_answer
        elif tool >= 0:
            self._emit_reasoning(buf[:tool], out)
            self.buf = buf[tool:]
            self.mode = CONTENT             # the content parser opens the tool call
        else:
            keep = _held_prefix_len(buf, (THINK_END, TOOL_START))
            self._emit_reasoning(buf[:len(buf) - keep], out)
            self.buf = buf[len(buf) - keep:]

    def _content(self, out: ChannelOutput) -> None:
        buf = self.buf
        if not self.cfg.parse_tool_calls:
            self._emit_content(buf, out)
            self.buf = ""
            return
        start = buf.find(TOOL_START)
        if start >= 0:
            self._emit_content(buf[:start], out)
            self.buf = buf[start + len(TOOL_START):]
            self.mode, self.phase = TOOL, "open"
            self.call_id = self.call_name = self.call_args = ""
            self.call_params = 0
            return
        keep = _held_prefix_len(buf, (TOOL_START,))
        self._emit_content(buf[:len(buf) - keep], out)
        self.buf = buf[len(buf) - keep:]

    # ---------------------------------------------------------------------------------------
    def _args(self, piece: str, out: ChannelOutput) -> None:
        self.call_args += piece
        out.tool_deltas.append(ToolCallDelta(index=self.num_tool_calls - 1, arguments=piece))

    def _add_param(self, name: str, value: str, out: ChannelOutput) -> None:
        if value.startswith("\n"):
            value = value[1:]
        if value.endswith("\n"):
            value = value[:-1]
        typed = convert_value(value, name, tool_properties(self.cfg.tools, self.call_name))
        sep = "{" if self.call_params == 0 else ", "
        self.call_params += 1
        self._args(sep + json.dumps(name, ensure_ascii=False) + ": "
                   + json.dumps(typed, ensure_ascii=False), out)

    def _close_call(self, out: ChannelOutput) -> None:
        self._args("}" if self.call_params else "{}", out)
        out.tool_calls.append(ToolCall(id=self.call_id, name=self.call_name, arguments=self.call_args))
        self.num_complete += 1
        self.phase = "close"

    def _not_a_call(self, out: ChannelOutput) -> None:
        self.mode = CONTENT
        self._emit_content(TOOL_START, out)
        out_text = self.buf
        self.buf = ""
        self._emit_content(out_text, out)

    def _tool(self, out: ChannelOutput, final: bool) -> None:
        if self.phase == "open":
            s = self.buf.lstrip()
            if s.startswith(FUNC_START):
                j = s.find(">", len(FUNC_START))
                name = s[len(FUNC_START):j] if j >= 0 else s[len(FUNC_START):]
                if (not name and j >= 0) or _BAD_NAME_CHARS & set(name):
                    self._not_a_call(out)
                elif j >= 0:
                    self.num_tool_calls += 1
                    self.call_id = f"call_{uuid.uuid4().hex[:24]}"
                    self.call_name = name
                    out.tool_deltas.append(ToolCallDelta(index=self.num_tool_calls - 1,
                                                         id=self.call_id, name=name))
                    self.buf = s[j + 1:]
                    self.phase = "body"
                elif final:
                    self._not_a_call(out)
            elif not FUNC_START.startswith(s) or final:
                self._not_a_call(out)
            return
        if self.phase == "body":
            s = self.buf.lstrip()
            if s.startswith(PARAM_START):
                j = s.find(">", len(PARAM_START))
                if j < 0:
                    if final:
                        self.buf = ""
                        self._close_call(out)
                    return
                name = s[len(PARAM_START):j]
                rest = s[j + 1:]
                end = rest.find(PARAM_END)
                fend = rest.find(FUNC_END)
                if end >= 0 and (fend < 0 or end < fend):
                    self._add_param(name, rest[:end], out)
                    self.buf = rest[end + len(PARAM_END):]
                elif fend >= 0:             # missing </parameter>
                    self._add_param(name, rest[:fend], out)
                    self.buf = rest[fend:]
                elif final:
                    self._add_param(name, rest[:len(rest) - _held_prefix_len(rest, (PARAM_END,))], out)
                    self.buf = ""
                    self._close_call(out)
                return
            if s.startswith(FUNC_END):
                self.buf = s[len(FUNC_END):]
                self._close_call(out)
                return
            if s.startswith(TOOL_END):      # missing </function>
                self.buf = s
                self._close_call(out)
                return
            if not s or any(t.startswith(s) for t in (PARAM_START, FUNC_END, TOOL_END)):
                self.buf = s
                if final:
                    self.buf = ""
                    self._close_call(out)
                return
            nxt = s.find("<", 1)            # stray text inside the function body is dropped
            self.buf = s[nxt:] if nxt > 0 else ""
            if final and not self.buf:
                self._close_call(out)
            return
        # phase == "close": expect </tool_call>
        s = self.buf.lstrip()
        if s.startswith(TOOL_END):
            self.buf = s[len(TOOL_END):]
        elif TOOL_END.startswith(s):
            self.buf = s
            if not final:
                return
            self.buf = ""
        self.mode, self.after_tool = CONTENT, True
        self.num_closed += 1
