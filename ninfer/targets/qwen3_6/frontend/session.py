"""OutputSession: one request's output semantics, previewed purely and advanced only on commit.

Per token: stop token ids end the row (the token is accepted, never shown); ordinary tokens are
decoded byte-wise (incomplete UTF-8 is held); the text goes through the stop-string matcher
(stops.py) and then the reasoning/content/tool-call parser (channels.py).

    preview(tokens) -> Preview     pure; Preview.state carries the would-be state
    commit(preview)                adopts it (only a preview of the current state is accepted)
    forced_control()               `\\n</think>\\n\\n` once the thinking budget is spent
    preview(ids, control=True)     feeds those forced tokens after Program.control ran them
    finish(reason)                 external end (length, cancelled, error): flushes held text
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from . import stops
from .channels import ChannelConfig, ChannelOutput, ChannelParser
from .reconstruction import reproduced_output_tokens
from ninfer.contract.frontend import (FinalOutput, FinishReason, OutputDelta, OutputOptions, PreparedPrompt,
                    Preview, SessionError, ToolCall, ToolCallDelta)

if TYPE_CHECKING:
    from .frontend import Qwen36Frontend

FORCED_THINK_END = "\n</think>\n\n"
_IM_END_ID = 248046


@dataclass(slots=True)
class _State:
    pending: bytes = b""                # incomplete UTF-8 tail
    held: str = ""                      # text that may start a stop string
    parser: ChannelParser | None = None
    num_tokens: int = 0
    num_reasoning: int = 0
    terminal: bool = False
    finish_reason: FinishReason | None = None

    def copy(self) -> "_State":
        return _State(self.pending, self.held, self.parser.copy(), self.num_tokens,
                      self.num_reasoning, self.terminal, self.finish_reason)


@dataclass(frozen=True, slots=True)
class _PreviewState:
    session: "OutputSession"
    version: int
    state: _State
    tokens: tuple[int, ...]
    tool_calls: tuple[ToolCall, ...]


def _merge_tool_deltas(deltas: list[ToolCallDelta]) -> tuple[ToolCallDelta, ...]:
    merged: list[ToolCallDelta] = []
    for d in deltas:
        if merged and merged[-1].index == d.index:
            m = merged[-1]
            merged[-1] = ToolCallDelta(m.index, m.id or d.id, m.name or d.name, m.arguments + d.arguments)
        else:
            merged.append(d)
    return tuple(merged)


class OutputSession:
    def __init__(self, frontend: "Qwen36Frontend", prompt: PreparedPrompt, options: OutputOptions):
        tok = frontend.tokenizer
        for t in options.stop_token_ids:
            if not (0 <= t < tok.vocab_size):
                raise ValueError(f"stop_token_ids: {t} is outside the vocabulary [0, {tok.vocab_size})")
        if any(not s for s in options.stop):
            raise ValueError("stop strings must be non-empty")
        if options.thinking_budget is not None and options.thinking_budget < 0:
            raise ValueError(f"thinking_budget must be >= 0, got {options.thinking_budget}")
        self._frontend = frontend
        self._tok = tok
        self.prompt = prompt
        self.options = options
        eos = () if options.ignore_eos else frontend.eos_token_ids
        self._stop_ids = frozenset(eos) | frozenset(options.stop_token_ids)
        self._stops = tuple(options.stop)
        self._hidden = tok.special_ids if options.skip_special_tokens else frozenset()
        cfg = ChannelConfig(thinking=prompt.enable_thinking, parse_reasoning=options.parse_reasoning,
                            parse_tool_calls=options.parse_tool_calls and bool(options.tools),
                            tools=tuple(options.tools), trim_answer=options.constraint is not None)
        self._state = _State(parser=ChannelParser.start(cfg))
        self._version = 0
        self._tokens: list[int] = []
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._tool_calls: list[ToolCall] = []
        self._final: FinalOutput | None = None
        self._force_ids = tuple(tok.encode(FORCED_THINK_END))
        rp = prompt.reconstruction_prefix
        self._gen_tail = prompt.token_ids[rp - 3:] if rp is not None and rp >= 3 else None
        # NOTE: the grammar state the Program masks the sampler with (None: free output); compiled here,
        #       on the submitting thread (a cache hit when the Gateway compiled it up front).
        self.token_constraint = (frontend.new_token_constraint(prompt, options.constraint)
                                 if options.constraint is not None else None)

    # ------------------------------------------------------------------------------------------
    @property
    def terminal(self) -> bool:
        return self._state.terminal or self._final is not None

    @property
    def num_output_tokens(self) -> int:
        return len(self._tokens)

    @property
    def num_reasoning_tokens(self) -> int:
        return self._state.num_reasoning

    @property
    def final(self) -> FinalOutput | None:
        return self._final

    def forced_control(self) -> tuple[int, ...] | None:
        budget = self.options.thinking_budget
        st = self._state
        if (budget is None or self.terminal or not self.prompt.enable_thinking
                or not st.parser.in_reasoning or st.num_reasoning < budget):
            return None
        return self._force_ids

    # ------------------------------------------------------------------------------------------
    def _decode(self, st: _State, tok: int) -> str:
        piece = self._tok.token_piece(tok)
        if isinstance(piece, bytes):
            st.pending += piece
            text, n = codecs.utf_8_decode(st.pending, "replace", False)
            st.pending = st.pending[n:]
            return text
        if tok in self._hidden:
            return ""
        return self._flush_bytes(st) + piece

    @staticmethod
    def _flush_bytes(st: _State) -> str:
        text = st.pending.decode("utf-8", "replace") if st.pending else ""
        st.pending = b""
        return text

    def _drain(self, st: _State, out: ChannelOutput) -> None:
        """End of output: release held bytes and text, close the parser."""
        tail = self._flush_bytes(st)
        res, st.held = stops.feed(st.held, tail, self._stops, self.options.include_stop_str)
        st.parser.feed(res.text + st.held, out)
        st.held = ""
        st.parser.finish(out)

    def preview(self, tokens: Sequence[int], *, control: bool = False) -> Preview:
        if self.terminal:
            raise SessionError("preview after the session terminated")
        tokens = tuple(int(t) for t in tokens)
        if control and tokens != self.forced_control():
            raise SessionError(f"control tokens {tokens} are not the pending forced control "
                               f"{self.forced_control()}")
        st = self._state.copy()
        out = ChannelOutput()
        vocab = self._tok.vocab_size
        accepted = 0
        candidates: list[int] = []          # accepted counts right after a closed tool call
        for tok in tokens:
            if not (0 <= tok < vocab):
                raise ValueError(f"output token {tok} is outside the vocabulary [0, {vocab})")
            accepted += 1
            if not control and tok in self._stop_ids:
                self._drain(st, out)
                st.terminal, st.finish_reason = True, FinishReason.STOP
                break
            if st.parser.in_reasoning and not control:
                # NOTE: the forced close of a thinking budget is not the model's reasoning: a budget of N
                #       leaves exactly N reasoning tokens.
                st.num_reasoning += 1
            text = self._decode(st, tok)
            res, st.held = stops.feed(st.held, text, self._stops, self.options.include_stop_str)
            closed = st.parser.num_closed
            st.parser.feed(res.text, out)
            if res.matched:
                st.pending = b""
                st.parser.finish(out)
                st.terminal, st.finish_reason = True, FinishReason.STOP
                break
            if st.parser.num_closed > closed:
                candidates.append(accepted)
        st.num_tokens += accepted
        calls = tuple(out.tool_calls)
        if st.terminal and (self._tool_calls or calls):
            st.finish_reason = FinishReason.TOOL_CALLS
        delta = OutputDelta(text="".join(out.text), reasoning="".join(out.reasoning),
                            tool_calls=_merge_tool_deltas(out.tool_deltas))
        boundary = self._boundary(tokens[:accepted], delta, calls, candidates, st)
        return Preview(accepted_tokens=accepted, delta=delta, terminal=st.terminal,
                       finish_reason=st.finish_reason, boundary=boundary,
                       num_reasoning_tokens=st.num_reasoning - self._state.num_reasoning,
                       state=_PreviewState(self, self._version, st, tokens[:accepted], calls))

    def _boundary(self, span: tuple[int, ...], delta: OutputDelta, calls: tuple[ToolCall, ...],
                  candidates: list[int], st: _State) -> int | None:
        if self._gen_tail is None:
            return None
        points = list(candidates)
        if st.terminal and (self._tool_calls or calls or self.prompt.preserve_thinking):
            points.append(len(span))
        if not points:
            return None
        before = len(self._tokens)
        output = self._tokens + list(span)
        content = "".join(self._text) + delta.text
        reasoning = ("".join(self._reasoning) + delta.reasoning
                     if self.prompt.enable_thinking and self.options.parse_reasoning else None)
        n = reproduced_output_tokens(
            self._frontend.chat_template, self._tok, self._gen_tail, output,
            content=content, reasoning=reasoning, tool_calls=self._tool_calls + list(calls),
            ends_with_im_end=st.terminal and bool(span) and span[-1] == _IM_END_ID)
        # NOTE: only the points where the turn could end are meaningful; report the latest one
        # that the re-render reproduces completely.
        for p in reversed(points):
            if before + p <= n:
                return p
        return None

    def commit(self, preview: Preview) -> None:
        ps = preview.state
        if not isinstance(ps, _PreviewState) or ps.session is not self:
            raise SessionError("commit of a preview from another session")
        if ps.version != self._version:
            raise SessionError(f"stale preview (made at version {ps.version}, session is at "
                               f"{self._version})")
        if self._final is not None:
            raise SessionError("commit after finish")
        self._state = ps.state
        self._version += 1
        self._tokens.extend(ps.tokens)
        if preview.delta.text:
            self._text.append(preview.delta.text)
        if preview.delta.reasoning:
            self._reasoning.append(preview.delta.reasoning)
        self._tool_calls.extend(ps.tool_calls)

    def finish(self, reason: FinishReason | None = None) -> tuple[OutputDelta, FinalOutput]:
        """Final output. After a terminal commit the committed reason stands; otherwise `reason`
        (length, cancelled, error) ends the row and held-back text is flushed."""
        if self._final is not None:
            raise SessionError("finish called twice")
        st = self._state
        delta = OutputDelta()
        if not st.terminal:
            if reason is None:
                raise SessionError("finish of a running session needs a reason")
            if reason is FinishReason.TOOL_CALLS:
                raise ValueError("TOOL_CALLS is decided by the Frontend, not passed to finish")
            st = st.copy()
            out = ChannelOutput()
            self._drain(st, out)
            st.terminal, st.finish_reason = True, FinishReason(reason)
            delta = OutputDelta(text="".join(out.text), reasoning="".join(out.reasoning),
                                tool_calls=_merge_tool_deltas(out.tool_deltas))
            self._state = st
            self._version += 1
            if delta.text:
                self._text.append(delta.text)
            if delta.reasoning:
                self._reasoning.append(delta.reasoning)
            self._tool_calls.extend(out.tool_calls)
        self._final = FinalOutput(text="".join(self._text), reasoning="".join(self._reasoning),
                                  tool_calls=tuple(self._tool_calls),
                                  finish_reason=st.finish_reason, token_ids=tuple(self._tokens),
                                  num_reasoning_tokens=st.num_reasoning)
        return delta, self._final
