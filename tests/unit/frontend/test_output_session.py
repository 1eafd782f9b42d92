"""OutputSession: preview/commit purity, stop tokens and strings, UTF-8 safety, finish reasons,
thinking budget and the reconstruction boundary."""
from __future__ import annotations

import functools
import json
import unicodedata

import pytest
from hypothesis import assume, given, settings, strategies as st

from ninfer.targets.qwen3_6.frontend import (FinishReason, OutputDelta, OutputOptions, Qwen36Frontend,
                                             SessionError)

IM_END, EOT = 248046, 248044


@functools.cache
def fe() -> Qwen36Frontend:
    return Qwen36Frontend.builtin()


def enc(text: str) -> list[int]:
    return fe().tokenizer.encode(text)


def drive(session, ids, chunk=1, end=FinishReason.LENGTH):
    """Feed ids in chunks of `chunk`; returns (deltas, previews, final)."""
    deltas, previews = [], []
    i = 0
    while i < len(ids) and not session.terminal:
        pv = session.preview(ids[i:i + chunk])
        session.commit(pv)
        previews.append(pv)
        deltas.append(pv.delta)
        i += pv.accepted_tokens
    d, final = session.finish(None if session.terminal else end)
    deltas.append(d)
    return deltas, previews, final


def plain(**kw):
    return fe().new_session(fe().prepare_text("x"), OutputOptions(**kw))


def joined(deltas):
    return "".join(d.text for d in deltas)


# ---------------------------------------------------------------------------------------------
def test_preview_is_pure_and_commit_advances():
    s = plain()
    ids = enc("Hello world")
    a = s.preview(ids)
    b = s.preview(ids)
    assert a.delta == b.delta and a.accepted_tokens == b.accepted_tokens == len(ids)
    assert s.num_output_tokens == 0
    s.commit(a)
    assert s.num_output_tokens == len(ids)
    with pytest.raises(SessionError, match="stale"):
        s.commit(b)                              # made before the commit of a
    other = plain()
    with pytest.raises(SessionError):
        other.commit(other.preview([]).__class__(0, OutputDelta(), False, None))
    with pytest.raises(SessionError, match="another session"):
        other.commit(s.preview(ids))
    _, final = s.finish(FinishReason.LENGTH)
    assert final.text == "Hello world" and final.finish_reason is FinishReason.LENGTH
    with pytest.raises(SessionError):
        s.preview(ids)
    with pytest.raises(SessionError):
        s.finish(FinishReason.LENGTH)


def test_stop_token_inside_span_ends_it_early():
    ids = enc("Hi there") + [IM_END] + enc(" ignored")
    s = plain()
    pv = s.preview(ids)
    assert pv.accepted_tokens == len(enc("Hi there")) + 1
    assert pv.terminal and pv.finish_reason is FinishReason.STOP
    assert pv.delta.text == "Hi there"
    s.commit(pv)
    d, final = s.finish()
    assert d.empty and final.text == "Hi there" and final.token_ids == tuple(ids[:pv.accepted_tokens])
    with pytest.raises(SessionError):
        s.preview([1])


def test_eos_set_ignore_eos_and_request_stop_token_ids():
    ids = enc("a b") + [EOT] + enc("c") + [IM_END]
    _, _, f = drive(plain(), ids)
    assert f.text == "a b" and f.finish_reason is FinishReason.STOP
    _, _, f = drive(plain(ignore_eos=True), ids)
    assert f.text == "a bc" and f.finish_reason is FinishReason.LENGTH   # special tokens never shown
    stop_c = enc("c")[0]
    _, _, f = drive(plain(ignore_eos=True, stop_token_ids=(stop_c,)), ids)
    assert f.text == "a b" and f.finish_reason is FinishReason.STOP
    with pytest.raises(ValueError):
        plain(stop_token_ids=(10**6,))


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 100])
def test_stop_string_across_token_boundaries(chunk):
    text = "The quick brown fox jumps over the lazy dog"
    ids = enc(text)
    assert len(ids) > 5
    deltas, previews, f = drive(plain(stop=("fox jum",)), ids, chunk)
    assert f.text == "The quick brown " and f.finish_reason is FinishReason.STOP
    assert joined(deltas) == f.text
    assert all("fox" not in d.text for d in deltas)
    # the accepted tokens end with the token that completed the stop string
    assert fe().tokenizer.decode(f.token_ids).endswith("jumps") or "fox jum" in fe().tokenizer.decode(f.token_ids)
    assert len(f.token_ids) < len(ids)
    deltas, _, f = drive(plain(stop=("fox jum",), include_stop_str=True), ids, chunk)
    assert f.text == "The quick brown fox jum" and joined(deltas) == f.text


def test_stop_string_earliest_wins_and_partial_is_held_then_flushed():
    ids = enc("abc xyz")
    s = plain(stop=("z!", "c x"))
    _, _, f = drive(s, ids)
    assert f.text == "ab"
    # "xy" might start "xyz!", so it is held back until finish(length) flushes it
    s = plain(stop=("xyz!",))
    deltas, previews, f = drive(s, enc("abc xyz"), 1, FinishReason.LENGTH)
    assert "".join(d.text for d in deltas[:-1]) == "abc "
    assert deltas[-1].text == "xyz" and f.text == "abc xyz" and f.finish_reason is FinishReason.LENGTH


@pytest.mark.parametrize("reason", [FinishReason.LENGTH, FinishReason.CANCELLED, FinishReason.ERROR])
def test_external_finish_reasons(reason):
    s = plain()
    s.commit(s.preview(enc("partial answer")))
    d, f = s.finish(reason)
    assert f.finish_reason is reason and f.text == "partial answer" and d.empty
    with pytest.raises(ValueError):
        plain().finish(FinishReason.TOOL_CALLS)
    with pytest.raises(SessionError):
        plain().finish()


def test_utf8_split_across_tokens_is_never_emitted_in_halves():
    text = "a𝔘b𪚥c😀"
    ids = enc(text)
    assert len(ids) > len(text)                  # some characters span several tokens
    deltas, _, f = drive(plain(), ids, 1)
    assert f.text == text
    assert all("\ufffd" not in d.text for d in deltas)
    lone = fe().tokenizer.encode("𝔘")
    s = plain()
    pv = s.preview(lone[:1])
    assert pv.delta.text == "" and pv.accepted_tokens == 1
    s.commit(pv)
    d, f = s.finish(FinishReason.LENGTH)         # an incomplete character at the end is replaced
    assert f.text == "\ufffd" and d.text == "\ufffd"


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40), st.integers(1, 6))
def test_streaming_any_text_in_any_chunks(text, chunk):
    # NOTE: the text of a special token encodes to that token, which the output skips: such texts are not
    #       "any text" here (not only the "<|...|>" ones: Hypothesis found "<tts_text_bos>").
    tok = fe().tokenizer
    assume(not any(tok.added_tokens[i] in text for i in tok.special_ids))
    ids = enc(text)
    deltas, _, f = drive(plain(), ids, chunk)
    assert f.text == unicodedata.normalize("NFC", text) == fe().tokenizer.decode(ids)
    assert joined(deltas) == f.text and f.finish_reason is FinishReason.LENGTH
    assert all("\ufffd" not in d.text for d in deltas) or "\ufffd" in text


def test_special_tokens_never_in_text_unless_asked():
    ids = enc("a<|vision_start|>b<|im_start|>c") + [IM_END]
    _, _, f = drive(plain(), ids)
    assert f.text == "abc"
    _, _, f = drive(plain(skip_special_tokens=False), ids)
    assert f.text == "a<|vision_start|>b<|im_start|>c"          # the stop token is never text


# ---------------------------------------------------------------------------------------------
def _thinking_session(budget=None, **kw):
    p = fe().prepare_chat([{"role": "user", "content": "q"}])
    return fe().new_session(p, OutputOptions(thinking_budget=budget, **kw))


def test_thinking_budget_forces_end_of_reasoning():
    s = _thinking_session(budget=3)
    assert s.forced_control() is None
    ids = enc("one two three four five")
    s.commit(s.preview(ids[:2]))
    assert s.forced_control() is None
    s.commit(s.preview(ids[2:3]))
    forced = s.forced_control()
    assert forced == (198, 248069, 271)
    with pytest.raises(SessionError):
        s.preview([198, 198], control=True)
    pv = s.preview(list(forced), control=True)
    assert pv.accepted_tokens == 3 and not pv.terminal
    s.commit(pv)
    assert s.forced_control() is None
    deltas, _, f = drive(s, enc("Answer.") + [IM_END])
    assert f.reasoning == "one two three\n" and f.text == "\n\nAnswer."
    # NOTE: the budget's forced "\n</think>" is not counted as reasoning: a budget of N gives N reasoning tokens
    assert f.finish_reason is FinishReason.STOP and f.num_reasoning_tokens == 3
    assert _thinking_session(budget=0).forced_control() == (198, 248069, 271)
    off = fe().new_session(fe().prepare_chat([{"role": "user", "content": "q"}],
                                             chat_template_kwargs={"enable_thinking": False}),
                           OutputOptions(thinking_budget=0))
    assert off.forced_control() is None


# ---------------------------------------------------------------------------------------------
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]


def _next_turn_ids(messages, final, follow, tools=None, **kwargs):
    assistant = {"role": "assistant", "content": final.text}
    if final.reasoning:
        assistant["reasoning_content"] = final.reasoning
    if final.tool_calls:
        assistant["tool_calls"] = [{"type": "function", "id": c.id, "function": {
            "name": c.name, "arguments": c.arguments}} for c in final.tool_calls]
    return fe().prepare_chat(messages + [assistant] + follow, tools=tools,
                             chat_template_kwargs=kwargs).token_ids


@pytest.mark.parametrize("thinking", [True, False])
def test_boundary_tool_call_turn_is_reproduced_by_next_turn(thinking):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    kw = {"enable_thinking": thinking}
    p = fe().prepare_chat(messages, tools=TOOLS, chat_template_kwargs=kw)
    body = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>")
    out = ("I need the tool.\n</think>\n\nChecking.\n\n" if thinking else "Checking.\n\n") + body
    ids = enc(out) + [IM_END]
    s = fe().new_session(p, OutputOptions(tools=tuple(TOOLS)))
    _, previews, f = drive(s, ids, 1)
    assert f.finish_reason is FinishReason.TOOL_CALLS
    marks = [i for i, pv in enumerate(previews) if pv.boundary is not None]
    assert marks and all(previews[i].boundary == 1 for i in marks)
    frontier = marks[-1] + 1                    # output tokens reproduced
    assert frontier == len(ids)                 # through </tool_call> and <|im_end|>
    nxt = _next_turn_ids(messages, f, [{"role": "tool", "content": "21C"}], tools=TOOLS, **kw)
    reused = p.token_ids + tuple(ids[:frontier])
    assert nxt[:len(reused)] == reused
    # the boundary after </tool_call> (one token earlier) was reported too
    assert marks[-2] + 1 == len(ids) - 1


def test_boundary_plain_turn_is_the_prompt_prefix():
    messages = [{"role": "user", "content": "Hi"}]
    p = fe().prepare_chat(messages)
    ids = enc("Greeting.\n</think>\n\nHello!") + [IM_END]
    _, previews, f = drive(fe().new_session(p, OutputOptions()), ids, 4)
    assert all(pv.boundary is None for pv in previews)
    nxt = _next_turn_ids(messages, f, [{"role": "user", "content": "More"}])
    rp = p.reconstruction_prefix
    assert nxt[:rp] == p.token_ids[:rp] and nxt[rp] != p.token_ids[rp]


def test_boundary_with_preserve_thinking_covers_the_whole_output():
    messages = [{"role": "user", "content": "Hi"}]
    kw = {"preserve_thinking": True}
    p = fe().prepare_chat(messages, chat_template_kwargs=kw)
    assert p.preserve_thinking
    ids = enc("Greeting.\n</think>\n\nHello!") + [IM_END]
    _, previews, f = drive(fe().new_session(p, OutputOptions()), ids, 3)
    assert previews[-1].terminal and previews[-1].boundary == previews[-1].accepted_tokens
    nxt = _next_turn_ids(messages, f, [{"role": "user", "content": "More"}], **kw)
    reused = p.token_ids + tuple(ids)
    assert nxt[:len(reused)] == reused


def test_boundary_not_reported_when_rerender_differs():
    # a number parameter written as 2.0 re-renders as 2: the output is not reproduced past it
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "number"}}}}}]
    p = fe().prepare_chat([{"role": "user", "content": "go"}], tools=tools,
                          chat_template_kwargs={"enable_thinking": False})
    ids = enc("<tool_call>\n<function=f>\n<parameter=x>\n2.0\n</parameter>\n</function>\n</tool_call>") + [IM_END]
    _, previews, f = drive(fe().new_session(p, OutputOptions(tools=tuple(tools))), ids, 1)
    assert json.loads(f.tool_calls[0].arguments) == {"x": 2}
    assert all(pv.boundary is None for pv in previews)
