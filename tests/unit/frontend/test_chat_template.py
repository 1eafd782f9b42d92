"""Chat-template rendering equals transformers' apply_chat_template; template errors are PromptErrors."""
from __future__ import annotations

import copy
import functools
import json

import pytest

from ninfer.targets.qwen3_6.frontend import PromptError, Qwen36Frontend
from ninfer.targets.qwen3_6.frontend import vocab

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city — «quoted» & <escaped>?",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "opts": {"type": "object"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}, "k": {"type": "number"}}}}}


def _call(name, args, wrap=True):
    fn = {"name": name, "arguments": args}
    return {"type": "function", "id": "c1", "function": fn} if wrap else fn


SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "What's the weather in Paris?"}
U2 = {"role": "user", "content": "And tomorrow? 日本語 😀"}
A_PLAIN = {"role": "assistant", "content": "It is sunny."}
A_THINK_INLINE = {"role": "assistant", "content": "<think>\nLet me think.\n</think>\n\nIt is sunny."}
A_REASONING = {"role": "assistant", "content": "  It is sunny.  ", "reasoning_content": "  Check weather.\n"}
A_REASONING_ALIAS = {"role": "assistant", "content": "Sunny.", "reasoning": "alias field"}
A_TOOL = {"role": "assistant", "content": "Let me check.", "reasoning_content": "Need a tool.",
          "tool_calls": [_call("get_weather", {"city": "Paris", "days": 2, "metric": True,
                                               "opts": {"a": [1, 2], "b": None}, "tags": ["x", "ü"]})]}
A_TOOL_NOCONTENT = {"role": "assistant", "content": "",
                    "tool_calls": [_call("get_weather", {"city": "Paris"}, wrap=False),
                                   _call("search", {"q": "paris weather", "k": 2.5})]}
A_TOOL_NONE_CONTENT = {"role": "assistant", "content": None,
                       "tool_calls": [_call("search", {"q": "x"})]}
T1 = {"role": "tool", "content": '{"temp": 21}'}
T2 = {"role": "tool", "content": "rainy"}
U_MULTI = {"role": "user", "content": [
    {"type": "text", "text": "Look at "}, {"type": "image", "image": "http://x/a.png"},
    {"type": "text", "text": " and "}, {"type": "video", "video": "v.mp4"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}
SYS_MULTI = {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}
U_TOOLRESP = {"role": "user", "content": "<tool_response>\nmanual\n</tool_response>"}

CONVERSATIONS = [
    ([U1], None, {}),
    ([SYS, U1], None, {}),
    ([SYS, U1], None, {"enable_thinking": False}),
    ([U1, A_PLAIN, U2], None, {}),
    ([SYS, U1, A_THINK_INLINE, U2], None, {}),
    ([SYS, U1, A_THINK_INLINE, U2], None, {"preserve_thinking": True}),
    ([U1, A_REASONING, U2], None, {}),
    ([U1, A_REASONING, U2], None, {"preserve_thinking": True}),
    ([U1, A_REASONING], None, {}),
    ([U1, A_REASONING_ALIAS, U2], None, {"preserve_thinking": True}),
    ([U1], [WEATHER], {}),
    ([SYS, U1], [WEATHER, SEARCH], {}),
    ([SYS, U1], [WEATHER, SEARCH], {"enable_thinking": False}),
    ([SYS, U1, A_TOOL, T1], [WEATHER], {}),
    ([SYS, U1, A_TOOL, T1, T2], [WEATHER], {}),
    ([U1, A_TOOL, T1, {"role": "assistant", "content": "21 degrees."}, U2], [WEATHER], {}),
    ([U1, A_TOOL, T1, {"role": "assistant", "content": "21 degrees."}, U2], [WEATHER],
     {"preserve_thinking": True}),
    ([U1, A_TOOL_NOCONTENT, T1, T2], [WEATHER, SEARCH], {}),
    ([U1, A_TOOL_NOCONTENT, T1, T2], [WEATHER, SEARCH], {"enable_thinking": False}),
    ([U1, A_TOOL_NONE_CONTENT, T1], [SEARCH], {}),
    ([U1, A_TOOL, T1, U_TOOLRESP], [WEATHER], {}),
    ([U_MULTI], None, {}),
    ([U_MULTI], None, {"add_vision_id": True}),
    ([SYS_MULTI, U_MULTI, A_PLAIN, U_MULTI], None, {"add_vision_id": True}),
    ([SYS_MULTI, U1], [SEARCH], {}),
    ([{"role": "system", "content": ""}, U1], [WEATHER], {}),
    ([{"role": "user", "content": "  spaces around  \n"}], None, {}),
    ([U1, {"role": "assistant", "content": "multi\nline\n\n answer"}, U2, A_REASONING, U1], None, {}),
    ([U1, A_PLAIN, U2, A_REASONING, U1], None, {"preserve_thinking": True, "enable_thinking": False}),
    ([U1, {"role": "assistant", "content": "<think>only reasoning</think>"}, U2], None,
     {"preserve_thinking": True}),
    ([U1], None, {"enable_thinking": True}),
    ([U1, A_PLAIN], None, {}),                                   # add_generation_prompt=False below
    ([SYS, U1, A_TOOL, T1], [WEATHER], {"enable_thinking": False}),
    ([U1, {"role": "assistant", "content": "x", "tool_calls": [
        _call("get_weather", {"city": "A"}), _call("get_weather", {"city": "B", "days": -1})]},
      T1, T2, U2], [WEATHER], {}),
]


@functools.cache
def frontend() -> Qwen36Frontend:
    return Qwen36Frontend.builtin()


@functools.cache
def hf_tokenizer():
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer

    cfg = vocab.tokenizer_config()
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(vocab.tokenizer_json_bytes().decode()),
        chat_template=vocab.chat_template(), eos_token=cfg["eos_token"], pad_token=cfg["pad_token"])


@pytest.mark.parametrize("case", range(len(CONVERSATIONS)))
def test_render_equals_transformers(case):
    messages, tools, kwargs = CONVERSATIONS[case]
    add_gen = case != 31
    before = copy.deepcopy(messages)
    ours = frontend().render_chat(messages, tools=tools, chat_template_kwargs=kwargs,
                                  add_generation_prompt=add_gen)
    theirs = hf_tokenizer().apply_chat_template(copy.deepcopy(messages), tools=tools, tokenize=False,
                                                add_generation_prompt=add_gen, **kwargs)
    assert ours == theirs
    assert messages == before                      # the caller's messages are not modified
    prompt = frontend().prepare_chat(messages, tools=tools, chat_template_kwargs=kwargs,
                                     add_generation_prompt=add_gen)
    assert list(prompt.token_ids) == hf_tokenizer().encode(theirs, add_special_tokens=False)


def test_token_ids_equal_transformers_tokenize():
    messages, tools, kwargs = CONVERSATIONS[14]
    out = hf_tokenizer().apply_chat_template(copy.deepcopy(messages), tools=tools, tokenize=True,
                                             add_generation_prompt=True, return_dict=True, **kwargs)
    assert list(frontend().prepare_chat(messages, tools=tools).token_ids) == list(out["input_ids"])


def test_known_prompt_and_thinking_flag():
    fe = frontend()
    p = fe.prepare_chat([{"role": "user", "content": "Hi"}])
    assert p.token_ids == (248045, 846, 198, 12675, 248046, 198, 248045, 74455, 198, 248068, 198)
    assert p.enable_thinking and p.reconstruction_prefix == 9
    off = fe.prepare_chat([{"role": "user", "content": "Hi"}], chat_template_kwargs={"enable_thinking": False})
    assert not off.enable_thinking
    assert off.token_ids[-4:] == (248068, 271, 248069, 271)
    assert off.reconstruction_prefix == 9
    assert fe.prepare_text("Hi").reconstruction_prefix is None
    assert fe.prepare_tokens(list(p.token_ids)).enable_thinking


def test_tool_call_arguments_given_as_json_text():
    fe = frontend()
    as_obj = [U1, A_TOOL, T1]
    as_text = copy.deepcopy(as_obj)
    for c in as_text[1]["tool_calls"]:
        c["function"]["arguments"] = json.dumps(c["function"]["arguments"])
    assert fe.render_chat(as_text, tools=[WEATHER]) == fe.render_chat(as_obj, tools=[WEATHER])
    bad = copy.deepcopy(as_text)
    bad[1]["tool_calls"][0]["function"]["arguments"] = "{not json"
    with pytest.raises(PromptError, match="not JSON"):
        fe.render_chat(bad, tools=[WEATHER])


@pytest.mark.parametrize("messages, match", [
    ([], "No messages"),
    ([SYS], "No user query"),
    ([{"role": "assistant", "content": "hi"}], "No user query"),
    ([U1, SYS], "System message must be at the beginning"),
    ([{"role": "developer", "content": "x"}, U1], "Unexpected message role"),
    ([U1, {"role": "critic", "content": "x"}], "Unexpected message role"),
    ([U_TOOLRESP], "No user query"),
    ([{"role": "system", "content": [{"type": "image", "image": "a"}]}, U1], "cannot contain images"),
    ([{"role": "user", "content": [{"type": "audio", "audio": "a"}]}], "Unexpected item type"),
    (["just a string"], "must be an object"),
    ("hello", "list of message"),
    ([{"content": "no role"}], "no role"),
    ([{"role": "user", "content": 5}], "content must be a string"),
    ([{"role": "user", "content": ["bare string part"]}], "parts must be objects"),
])
def test_template_errors_are_prompt_errors(messages, match):
    with pytest.raises(PromptError, match=match):
        frontend().prepare_chat(messages)


def test_bad_kwargs_and_tools():
    fe = frontend()
    with pytest.raises(PromptError):
        fe.prepare_chat([U1], chat_template_kwargs={"messages": []})
    with pytest.raises(PromptError):
        fe.prepare_chat([U1], tools=["not a schema"])
    assert issubclass(PromptError, ValueError)


def test_media_placeholders_and_content_id():
    fe = frontend()
    p = fe.prepare_chat([U_MULTI])
    kinds = [(m.kind, m.length) for m in p.media]
    assert kinds == [("image", 1), ("video", 1), ("image", 1)]
    for m in p.media:
        assert p.token_ids[m.offset] == (248056 if m.kind == "image" else 248057)
        assert len(m.content_digest) == 64
    other = copy.deepcopy(U_MULTI)
    other["content"][1]["image"] = "http://x/b.png"
    q = fe.prepare_chat([other])
    assert q.token_ids == p.token_ids and q.content_id != p.content_id
    assert fe.prepare_chat([U_MULTI]).content_id == p.content_id
    assert fe.prepare_text("a").content_id != fe.prepare_text("b").content_id


def test_prepare_tokens_validates_range():
    fe = frontend()
    assert fe.prepare_tokens([1, 2, 248076]).token_ids == (1, 2, 248076)
    for bad in ([248077], [-1], [1.5], [True]):
        with pytest.raises(PromptError):
            fe.prepare_tokens(bad)
    with pytest.raises(PromptError):
        fe.prepare_tokens([])


def test_from_resources_template_inside_tokenizer_config():
    cfg = vocab.tokenizer_config()
    cfg["chat_template"] = vocab.chat_template()
    fe = Qwen36Frontend.from_resources({
        "tokenizer.json": vocab.tokenizer_json_bytes(),
        "tokenizer_config.json": json.dumps(cfg).encode(),
        "generation_config.json": json.dumps({"eos_token_id": [248046, 248044]}).encode()})
    assert fe.render_chat([U1]) == frontend().render_chat([U1])
    assert fe.eos_token_ids == (248046, 248044)
    assert fe.vocab_size == 248077
    assert fe.tokenizer.decode([248045, 846, 248068, 248046]) == "user<think>"
    assert fe.tokenizer.decode([248045, 846], skip_special_tokens=False) == "<|im_start|>user"
