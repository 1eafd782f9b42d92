"""Output constraints in the Frontend: compile errors name the request field, the compile cache, and the
per-request grammar state (free reasoning until </think>, leading whitespace, EOS once complete, rollback)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ninfer.contract.frontend import ConstraintError, OutputConstraint, OutputOptions
from ninfer.targets.qwen3_6.frontend import Qwen36Frontend
from ninfer.targets.qwen3_6.frontend.constraints import MAX_CHOICES, MAX_LEADING_WS_TOKENS, MAX_SPEC_CHARS

IM_END = 248046


@pytest.fixture(scope="module")
def fe():
    return Qwen36Frontend.builtin()


def _allowed(tc, vocab: int) -> set[int]:
    words = (vocab + 31) // 32
    buf = np.zeros(words + 2, dtype=np.int32)          # wider than the vocabulary: the tail must be zeroed
    buf[:] = -1
    tc.fill_mask(buf.ctypes.data, buf.nbytes)
    bits = np.unpackbits(buf.view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits).tolist())


def test_compile_errors_name_the_field(fe):
    bad = [
        ("json_schema", "{", "not valid JSON"),
        ("json_schema", "[1]", "must be an object"),
        ("json_schema", '{"type": "strin"}', "strin"),
        ("json_schema", '{"type": "object", "if": {}}', "if"),                 # unsupported keyword
        ("json_schema", '{"type": "string", "format": "nonsense"}', "nonsense"),
        ("regex", "(ab", "unclosed group"),
        ("regex", "", "empty"),
        ("choice", "[]", "non-empty array"),
        ("choice", '["a", 1]', "non-empty array"),
        ("choice", "yes", "not a JSON array"),
        ("ebnf", "root ::= (", "does not parse"),
        ("lark", "start: undefined_rule", "undefined_rule"),
        ("regex", "a" * (MAX_SPEC_CHARS + 1), "characters"),                  # too large
        ("choice", json.dumps([f"c{i}" for i in range(MAX_CHOICES + 1)]), "at most"),
    ]
    for kind, spec, words in bad:
        param = f"field.{kind}"
        with pytest.raises(ConstraintError) as e:
            fe.compile_constraint(OutputConstraint(kind, spec, param))
        assert e.value.param == param and str(e.value).startswith(param + ":"), (kind, spec, str(e.value))
        assert words in str(e.value), (kind, spec, str(e.value))
    with pytest.raises(ConstraintError) as e:
        OutputConstraint("xml", "", "response_format.type")
    assert e.value.param == "response_format.type"
    # a grammar too large for the parser's limits
    huge = {"type": "object", "properties": {f"k{i}": {"enum": [f"v{j}" for j in range(300)]} for i in range(400)}}
    with pytest.raises(ConstraintError) as e:
        fe.compile_constraint(OutputConstraint("json_schema", json.dumps(huge), "response_format.json_schema"))
    assert e.value.param == "response_format.json_schema"
    # good ones compile, once per (kind, spec)
    for kind, spec in [("json_object", ""), ("regex", "[a-c]{2}"), ("choice", '["yes", "no"]'),
                       ("ebnf", 'root ::= "x" [0-9]+'), ("lark", 'start: "a" | %json{"type": "integer"}')]:
        g = fe.compile_constraint(OutputConstraint(kind, spec, "p"))
        assert fe.compile_constraint(OutputConstraint(kind, spec, "other")) is g


def test_grammar_state_follows_tokens(fe):
    tok = fe.tokenizer
    V = tok.vocab_size
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    c = OutputConstraint("json_schema", json.dumps(schema), "rf")
    off = fe.prepare_chat([{"role": "user", "content": "x"}], chat_template_kwargs={"enable_thinking": False})
    tc = fe.new_session(off, OutputOptions(constraint=c)).token_constraint
    assert not tc.free and not tc.done
    first = _allowed(tc, V)
    assert tok.encode('{"')[0] in first and tok.encode("\n\n")[0] in first and IM_END not in first
    assert tok.encode("hello")[0] not in first
    body = tok.encode('{"a": 12}')
    assert tc.validate(body + [IM_END]) == len(body) + 1 and tc.num_consumed == 0
    # leading whitespace: at most MAX_LEADING_WS_TOKENS tokens, then the grammar's first token
    ws = tok.encode("\n\n")[0]
    assert tc.advance([ws] * (MAX_LEADING_WS_TOKENS + 1)) == MAX_LEADING_WS_TOKENS
    assert ws not in _allowed(tc, V)
    assert tc.advance(body) == len(body)
    assert _allowed(tc, V) == {IM_END}
    assert tc.advance([IM_END, IM_END, 5]) == 2 and tc.done          # after the end: only EOS again
    assert _allowed(tc, V) == {IM_END}
    tc.rollback(2 + 2)                                                # back to '{"a": 1'
    assert not tc.done and tok.encode("}")[0] in _allowed(tc, V)
    tc.rollback(tc.num_consumed)
    assert _allowed(tc, V) == first
    with pytest.raises(ValueError):
        tc.rollback(1)
    # thinking on: free until </think> (forced close included), then the grammar
    on = fe.prepare_chat([{"role": "user", "content": "x"}], chat_template_kwargs={"enable_thinking": True})
    tc = fe.new_session(on, OutputOptions(constraint=OutputConstraint("choice", '["yes", "no"]', "p"))
                        ).token_constraint
    assert tc.free and len(_allowed(tc, V)) >= V
    forced = tok.encode("hmm\n</think>\n\n")
    assert tc.advance(forced) == len(forced) and not tc.free
    allowed = _allowed(tc, V)
    assert tok.encode("yes")[0] in allowed and tok.encode("maybe")[0] not in allowed
    tc.rollback(3)                                                     # back inside the reasoning
    assert tc.free
    # after_reasoning=False: constrained from the first token even with thinking on
    tc = fe.new_session(on, OutputOptions(constraint=OutputConstraint("regex", "[0-9]+", "p", after_reasoning=False))
                        ).token_constraint
    assert not tc.free and tok.encode("7")[0] in _allowed(tc, V)
    # a `<tool_call>` inside the reasoning (where the output parser ends the reasoning too) opens an enforced
    # tool call's grammar; for a grammar that does not start with it, the reasoning stays free
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}]
    call = tok.encode("<tool_call>")
    assert len(call) == 1
    tc = fe.new_session(on, OutputOptions(constraint=fe.tool_call_constraint(tools))).token_constraint
    assert tc.free and tc.advance(tok.encode("hmm") + call) == len(tok.encode("hmm")) + 1 and not tc.free
    assert tok.encode("hmm")[0] not in _allowed(tc, V)             # inside the call: only the grammar
    tc.rollback(1)
    assert tc.free and tc.advance(call) == 1 and not tc.free
    tc = fe.new_session(on, OutputOptions(constraint=OutputConstraint("choice", '["yes"]', "p"))).token_constraint
    assert tc.advance(call) == 1 and tc.free


def test_random_walks_take_every_masked_token(fe):
    """Any token the mask allows is one advance takes (the Program relies on it), through rollbacks too."""
    import random
    rng = random.Random(3)
    V = fe.tokenizer.vocab_size
    prompt = fe.prepare_chat([{"role": "user", "content": "x"}], chat_template_kwargs={"enable_thinking": False})
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"enum": ["x", 1, None]}, "maxItems": 3},
                                               "b": {"type": "number", "minimum": -5, "maximum": 5},
                                               "c": {"type": "object", "properties": {"d": {"type": "string"}}}},
              "required": ["a"], "additionalProperties": False}
    specs = [OutputConstraint("json_schema", json.dumps(schema), "s"), OutputConstraint("json_object", "", "o"),
             OutputConstraint("regex", r"(foo|bar)+\d{1,3}", "r"),
             OutputConstraint("lark", 'start: "say " %json{"type": "array", "items": {"type": "integer"}}', "l")]
    for c in specs:
        tc = fe.new_session(prompt, OutputOptions(constraint=c)).token_constraint
        taken: list[int] = []
        for _ in range(40):
            allowed = sorted(_allowed(tc, V))
            assert allowed and all(t < V for t in allowed)
            t = rng.choice(allowed)
            assert tc.advance([t]) == 1, (c.kind, taken, t)
            taken.append(t)
            if t == IM_END:
                break
            if rng.random() < 0.15:
                k = rng.randint(1, len(taken))
                tc.rollback(k)
                del taken[-k:]
        assert tc.num_consumed == len(taken)


def test_batched_masks_equal_row_masks(fe, monkeypatch):
    """GrammarConstraint.fill_masks (llguidance's thread pool) writes what fill_mask writes row by row: free
    rows, rows in their leading whitespace, rows inside the grammar, rows wider than the vocabulary."""
    from ninfer.targets.qwen3_6.frontend.constraints import GrammarConstraint
    import random
    monkeypatch.setattr(fe._constraints, "parallel", True)
    rng = random.Random(5)
    V = fe.tokenizer.vocab_size
    prompts = [fe.prepare_chat([{"role": "user", "content": "x"}], chat_template_kwargs={"enable_thinking": t})
               for t in (False, True)]
    c = OutputConstraint("json_schema", json.dumps({"type": "object", "properties": {
        "s": {"type": "string"}, "n": {"type": "integer"}}, "required": ["s", "n"]}), "s")
    tcs = [fe.new_token_constraint(prompts[r % 2], c) for r in range(5)]
    for words in ((V + 31) // 32, (V + 31) // 32 + 7):
        for step in range(12):
            one = np.zeros((5, words), dtype=np.int32)
            many = np.full((5, words), 7, dtype=np.int32)
            for r, tc in enumerate(tcs):
                tc.fill_mask(one[r].ctypes.data, 4 * words)
            GrammarConstraint.fill_masks([(tc, r) for r, tc in enumerate(tcs)], many.ctypes.data, 4 * words)
            assert np.array_equal(one, many), step
            for r, tc in enumerate(tcs):
                allowed = np.flatnonzero(np.unpackbits(one[r].view(np.uint8), bitorder="little"))
                t = 248069 if (r % 2 and step == 2 and tc.free) else int(rng.choice(allowed.tolist()))
                assert tc.advance([t]) == 1
