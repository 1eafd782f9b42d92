"""Output constraints: an OutputConstraint compiled with llguidance into a grammar over the Qwen3.6
vocabulary, and the per-request grammar state (`GrammarConstraint`) the Program masks its sampler with.

    compiler = ConstraintCompiler(tokenizer, eos_id, think_end_id)
    grammar = compiler.compile(OutputConstraint("json_schema", schema_text, "response_format"))  # cached
    state = compiler.new_state(grammar, thinking=True)     # a TokenConstraint (ninfer.contract.program)

The library choice (llguidance over xgrammar) and its numbers: docs/performance.md, "Constrained decoding".

A GrammarConstraint's positions, one record per consumed token (what rollback undoes):

    thinking on:   reasoning tokens (free) ... </think> | leading whitespace (<= 1) | grammar tokens | EOS
    thinking off:                                       | leading whitespace (<= 1) | grammar tokens | EOS

Once the grammar can take nothing more only the end-of-turn token is allowed; tokens consumed after the
matcher stopped (an ignore_eos request) are recorded as tail and leave the matcher alone.
"""
from __future__ import annotations

import ctypes
import json
import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Sequence

import llguidance as llg
import numpy as np
from llguidance.gbnf_to_lark import GbnfToLarkError, gbnf_to_lark

from ninfer.contract.frontend import ConstraintError, OutputConstraint

if TYPE_CHECKING:
    from .tokenizer import Qwen36Tokenizer

MAX_SPEC_CHARS = 1 << 20                 # a constraint's text (schema, regex, grammar) at most 1 MiB
MAX_CHOICES = 10_000                     # the grammar's build time grows faster than the number of choices
MAX_GRAMMAR_SIZE = 200_000               # grammar symbols llguidance may build from one constraint
MAX_LEADING_WS_TOKENS = 1                # whitespace tokens allowed before the grammar's first token
CACHE_SIZE = 128                         # compiled grammars kept (LRU over (kind, spec))
# NOTE: compact JSON with the separators json.dumps writes; flexible whitespace lets a model pad forever.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

_REASON, _THINK_END, _WS, _GRAMMAR, _TAIL, _OPEN = range(6)


class CompiledGrammar:
    """One constraint compiled against the tokenizer: a validated prototype matcher (copied per request)."""
    __slots__ = ("constraint", "prototype")

    def __init__(self, constraint: OutputConstraint, prototype: llg.LLMatcher):
        self.constraint = constraint
        self.prototype = prototype


class ConstraintCompiler:
    """Compiles OutputConstraints over one tokenizer (thread-safe; the llguidance tokenizer is built on
    first use, a second or so for the Qwen3.6 vocabulary)."""

    def __init__(self, tokenizer: "Qwen36Tokenizer", eos_id: int, think_end_id: int, tool_call_id: int | None = None):
        self._tok = tokenizer
        self.eos_id = eos_id
        self.think_end_id = think_end_id
        # NOTE: the output parser ends the reasoning at `<tool_call>` as well as at `</think>`: where the grammar
        #       starts with it (an enforced tool call), that token opens the grammar instead of staying free.
        self.tool_call_id = tool_call_id
        self.vocab_size = tokenizer.vocab_size
        self.words = (self.vocab_size + 31) // 32
        self._lock = threading.Lock()
        self._ll: llg.LLTokenizer | None = None
        self._ws_mask: np.ndarray | None = None
        self._cache: OrderedDict[tuple[str, str], CompiledGrammar] = OrderedDict()
        self._executor: llg.LLExecutor | None = None
        # NOTE: several rows' masks in llguidance's thread pool only where there are cores to spare (on two
        #       cores the hand-off cost more than it saved).
        self.parallel = (os.cpu_count() or 1) >= 4

    @property
    def executor(self) -> llg.LLExecutor:
        """llguidance's thread pool that computes several rows' masks at once (outside the GIL)."""
        if self._executor is None:
            with self._lock:
                if self._executor is None:
                    self._executor = llg.LLExecutor()
        return self._executor

    # ------------------------------------------------------------------------------------------
    def _llg_tokenizer(self) -> llg.LLTokenizer:
        if self._ll is None:
            ll, ws = _vocabulary_view(self._tok, self.eos_id)
            self._ws_mask = ws                # NOTE: before _ll: a reader that sees _ll sees the mask
            self._ll = ll
        return self._ll

    def compile(self, constraint: OutputConstraint) -> CompiledGrammar:
        """The grammar of `constraint` (cached per kind and spec); ConstraintError naming its param."""
        if not isinstance(constraint, OutputConstraint):
            raise TypeError(f"expected an OutputConstraint, got {type(constraint).__name__}")
        key = (constraint.kind, constraint.spec)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        grammar = _grammar_text(constraint)
        limits = llg.LLParserLimits(max_grammar_size=MAX_GRAMMAR_SIZE)
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, None, limits=limits)
        if is_error:
            raise ConstraintError(f"{constraint.param}: {_first_line(messages[0])}", constraint.param)
        matcher = llg.LLMatcher(self._llg_tokenizer(), grammar, log_level=0, limits=limits)
        if matcher.is_error():
            raise ConstraintError(f"{constraint.param}: {_first_line(matcher.get_error())}", constraint.param)
        compiled = CompiledGrammar(constraint, matcher)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def new_state(self, grammar: CompiledGrammar, thinking: bool) -> "GrammarConstraint":
        """A fresh per-request grammar state. thinking: the prompt opened a <think> block, so the
        constraint starts after `</think>` (when the constraint asks for after_reasoning)."""
        free = thinking and grammar.constraint.after_reasoning
        return GrammarConstraint(grammar.prototype.deep_copy(), self, free)


_VIEWS: dict[tuple[str, int], tuple[llg.LLTokenizer, np.ndarray]] = {}
_VIEWS_LOCK = threading.Lock()


def _vocabulary_view(tok: "Qwen36Tokenizer", eos_id: int) -> tuple[llg.LLTokenizer, np.ndarray]:
    """llguidance's tokenizer over the vocabulary and the bitmask of the whitespace-only tokens, built once
    per vocabulary (tokenizer digest) and EOS in the process: a second or more for the Qwen3.6 vocabulary."""
    key = (tok.digest, eos_id)
    with _VIEWS_LOCK:
        view = _VIEWS.get(key)
        if view is None:
            pieces = _token_bytes(tok)
            ws = np.zeros((tok.vocab_size + 31) // 32 * 32, dtype=bool)
            ws[[i for i, b in enumerate(pieces) if b.isspace()]] = True
            ws[list(tok.added_tokens)] = False
            ll = llg.LLTokenizer(llg.TokenizerWrapper(_Encoder(tok, pieces, eos_id)), n_vocab=tok.vocab_size,
                                 eos_token=eos_id)
            view = _VIEWS[key] = (ll, np.packbits(ws, bitorder="little").view(np.int32))
        return view


def _token_bytes(tok: "Qwen36Tokenizer") -> list[bytes]:
    """Every token's bytes as llguidance reads them: an ordinary token's raw bytes, an added token's text
    (a special one behind llguidance's 0xFF mark, so that grammar text never produces it)."""
    vocab = tok.backend.get_vocab(with_added_tokens=False)
    # NOTE: byte-level BPE pieces are text over 256 stand-in characters: one translate turns them into bytes.
    table = {ord(c): chr(b) for c, b in tok._byte_decoder.items()}
    pieces = [b""] * tok.vocab_size
    for text, i in vocab.items():
        if 0 <= i < tok.vocab_size:
            pieces[i] = text.translate(table).encode("latin-1")
    for i, text in tok.added_tokens.items():
        if 0 <= i < tok.vocab_size:
            pieces[i] = (b"\xff" if i in tok.special_ids else b"") + text.encode()
    return pieces


class _Encoder:
    """The tokenizer as llguidance's TokenizerWrapper reads it."""

    def __init__(self, tok: "Qwen36Tokenizer", pieces: list[bytes], eos_id: int):
        self._tok = tok
        self.tokens = pieces
        self.eos_token_id = eos_id
        self.bos_token_id = None
        self.special_token_ids = sorted(tok.special_ids)

    def __call__(self, text: bytes | str) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return self._tok.encode(text)


def _first_line(msg: str, limit: int = 300) -> str:
    """A library message on one line: its lines joined (the source excerpts and carets dropped)."""
    lines = [ln.strip() for ln in msg.strip().splitlines()]
    text = " ".join(ln for ln in lines if ln and not ln.startswith("^") and not ln[:1].isdigit()
                    and not ln.startswith("|"))
    text = text or "invalid grammar"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _grammar_text(c: OutputConstraint) -> str:
    """llguidance's grammar text of one constraint (not yet validated)."""
    if len(c.spec) > MAX_SPEC_CHARS:
        raise ConstraintError(f"{c.param}: the {c.kind} is {len(c.spec)} characters, over the "
                              f"{MAX_SPEC_CHARS} allowed", c.param)
    if c.kind in ("json_schema", "json_object"):
        if c.kind == "json_object":
            schema: object = {"type": "object"}
        else:
            try:
                schema = json.loads(c.spec)
            except ValueError as e:
                raise ConstraintError(f"{c.param}: the JSON schema is not valid JSON: {e}", c.param) from None
            if isinstance(schema, bool):
                schema = {} if schema else {"not": {}}
            if not isinstance(schema, dict):
                raise ConstraintError(f"{c.param}: a JSON schema must be an object, got "
                                      f"{type(schema).__name__}", c.param)
        try:
            return llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_OPTIONS)
        except ValueError as e:
            raise ConstraintError(f"{c.param}: {e}", c.param) from None
    if c.kind == "regex":
        if not c.spec:
            raise ConstraintError(f"{c.param}: the regex is empty", c.param)
        return llg.LLMatcher.grammar_from_regex(c.spec)
    if c.kind == "choice":
        try:
            choices = json.loads(c.spec)
        except ValueError as e:
            raise ConstraintError(f"{c.param}: the choices are not a JSON array: {e}", c.param) from None
        if (not isinstance(choices, list) or not choices
                or not all(isinstance(s, str) and s for s in choices)):
            raise ConstraintError(f"{c.param}: the choices must be a non-empty array of non-empty strings",
                                  c.param)
        if len(choices) > MAX_CHOICES:
            raise ConstraintError(f"{c.param}: {len(choices)} choices, at most {MAX_CHOICES} allowed", c.param)
        alts = " | ".join(json.dumps(s, ensure_ascii=True) for s in dict.fromkeys(choices))
        return llg.LLMatcher.grammar_from_lark(f"start: {alts}\n")
    if c.kind == "ebnf":
        try:
            lark = gbnf_to_lark(c.spec)
        # NOTE: the converter raises a bare Exception for some errors (a rule used but never defined)
        except (GbnfToLarkError, Exception) as e:  # noqa: BLE001 - any converter failure is the grammar's fault
            raise ConstraintError(f"{c.param}: the grammar does not parse: {_first_line(str(e))}", c.param) from None
        return llg.LLMatcher.grammar_from_lark(lark)
    if c.kind == "lark":
        return llg.LLMatcher.grammar_from_lark(c.spec)
    raise ConstraintError(f"{c.param}: unknown constraint kind {c.kind!r}", c.param)


class GrammarConstraint:
    """One request's grammar state (implements ninfer.contract.program.TokenConstraint). Driven by one
    thread at a time: created on the submitting thread, then only the Engine worker's Program uses it."""

    def __init__(self, matcher: llg.LLMatcher, compiler: ConstraintCompiler, free: bool):
        self._m = matcher
        self._c = compiler
        self._records: list[int] = []
        self._reasoning = free               # the reasoning is open: every token allowed
        self._num_ws = 0                     # leading whitespace tokens consumed
        self._num_grammar = 0                # tokens the matcher consumed

    @property
    def free(self) -> bool:
        return self._reasoning

    @property
    def done(self) -> bool:
        return not self._reasoning and (self._m.is_stopped() or self._m.is_error())

    @property
    def num_words(self) -> int:
        return self._c.words

    # ------------------------------------------------------------------------------------------
    def fill_mask(self, ptr: int, nbytes: int) -> None:
        words = self._c.words
        if nbytes < 4 * words:
            raise ValueError(f"a mask row of {nbytes} bytes is smaller than the vocabulary's {4 * words}")
        if self._reasoning:
            ctypes.memset(ptr, 0xFF, nbytes)
            return
        if nbytes > 4 * words:
            ctypes.memset(ptr + 4 * words, 0, nbytes - 4 * words)
        m = self._m
        if m.is_error() or m.is_stopped():
            ctypes.memset(ptr, 0, 4 * words)
            eos = self._c.eos_id
            ctypes.c_int32.from_address(ptr + 4 * (eos // 32)).value = np.int32(np.uint32(1 << (eos % 32)))
            return
        m.unsafe_compute_mask_ptr(ptr, 4 * words)
        if self._num_grammar == 0 and self._num_ws < MAX_LEADING_WS_TOKENS:
            row = np.ctypeslib.as_array((ctypes.c_int32 * words).from_address(ptr))
            np.bitwise_or(row, self._c._ws_mask, out=row)

    @classmethod
    def fill_masks(cls, rows: Sequence[tuple["GrammarConstraint", int]], ptr: int, row_bytes: int) -> None:
        """fill_mask of several rows at once: row (c, i) at ptr + i * row_bytes. The rows inside their grammar
        are computed in parallel by llguidance's executor (one compiler's rows at a time)."""
        groups: dict[int, list[tuple[GrammarConstraint, int]]] = {}
        for c, i in rows:
            if c._reasoning or c._m.is_stopped() or c._m.is_error():
                c.fill_mask(ptr + i * row_bytes, row_bytes)
            else:
                groups.setdefault(id(c._c), []).append((c, i))
        for group in groups.values():
            comp = group[0][0]._c
            if len(group) == 1 or not comp.parallel:
                for c, i in group:
                    c.fill_mask(ptr + i * row_bytes, row_bytes)
                continue
            words = comp.words
            if row_bytes < 4 * words:
                raise ValueError(f"a mask row of {row_bytes} bytes is smaller than the vocabulary's {4 * words}")
            if row_bytes == 4 * words:
                comp.executor.unsafe_compute_mask_ptr([(c._m, i) for c, i in group], ptr, row_bytes,
                                                      max(i for _, i in group) + 1)
            else:
                staged = np.empty((len(group), words), dtype=np.int32)
                comp.executor.unsafe_compute_mask_ptr([(c._m, k) for k, (c, _) in enumerate(group)],
                                                      staged.ctypes.data, 4 * words, len(group))
                for k, (_, i) in enumerate(group):
                    row = np.ctypeslib.as_array((ctypes.c_int32 * (row_bytes // 4)).from_address(ptr + i * row_bytes))
                    row[:words] = staged[k]
                    row[words:] = 0
            for c, i in group:
                if c._num_grammar == 0 and c._num_ws < MAX_LEADING_WS_TOKENS:
                    row = np.ctypeslib.as_array((ctypes.c_int32 * words).from_address(ptr + i * row_bytes))
                    np.bitwise_or(row, comp._ws_mask, out=row)

    def _is_ws(self, tok: int) -> bool:
        ws = self._c._ws_mask
        return 0 <= tok < self._c.vocab_size and bool((int(ws[tok // 32]) >> (tok % 32)) & 1)

    def advance(self, tokens: Sequence[int]) -> int:
        n = 0
        m, eos = self._m, self._c.eos_id
        for tok in tokens:
            tok = int(tok)
            if self._reasoning:
                kind = _THINK_END if tok == self._c.think_end_id else _REASON
                if kind == _THINK_END:
                    self._reasoning = False
                elif tok == self._c.tool_call_id and m.try_consume_tokens([tok]) == 1:
                    kind = _OPEN
                    self._reasoning = False
                    self._num_grammar += 1
            elif m.is_stopped():
                if tok != eos:
                    break
                kind = _TAIL
            elif m.try_consume_tokens([tok]) == 1:        # NOTE: a refused token leaves the matcher as it was
                kind = _GRAMMAR
                self._num_grammar += 1
            elif self._num_grammar == 0 and self._num_ws < MAX_LEADING_WS_TOKENS and self._is_ws(tok):
                kind = _WS
                self._num_ws += 1
            else:
                break
            self._records.append(kind)
            n += 1
        return n

    def validate(self, tokens: Sequence[int]) -> int:
        n = self.advance(tokens)
        self.rollback(n)
        return n

    def rollback(self, n: int) -> None:
        if not 0 <= n <= len(self._records):
            raise ValueError(f"rollback of {n} tokens; {len(self._records)} consumed")
        grammar = 0
        for _ in range(n):
            kind = self._records.pop()
            if kind == _THINK_END:
                self._reasoning = True
            elif kind == _OPEN:
                self._reasoning = True
                grammar += 1
            elif kind == _WS:
                self._num_ws -= 1
            elif kind == _GRAMMAR:
                grammar += 1
        if grammar:
            self._m.rollback(grammar)
            self._num_grammar -= grammar

    @property
    def num_consumed(self) -> int:
        return len(self._records)
