"""Chat-template rendering with jinja2, replicating transformers' `apply_chat_template` environment.

transformers (5.24) renders with an ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True) with the loop-controls extension; `tojson` is json.dumps (ensure_ascii=False,
optional indent/separators/sort_keys, no HTML escaping); globals raise_exception (TemplateError),
strftime_now, a `dict` constructor and a namespace that refuses underscore names. Messages are
normalised first: objects become dicts, keys whose value is None are dropped, reasoning given as
`reasoning`/`thinking` is also exposed as `reasoning_content` (and `thinking`). The template gets
messages, tools, documents=None, add_generation_prompt, the special tokens (bos/eos/pad/unk) and
the caller's kwargs.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ninfer.contract.frontend import PromptError

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    def __init__(*args, **kwargs):       # same signature trick as jinja2's Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes, got {name!r}")


def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ValueError(f"invalid chat template: {e}") from e


def _plain(value: Any) -> Any:
    """Plain JSON-like data (what transformers lets a template see)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def normalize_messages(messages: Any) -> list[dict]:
    """transformers' message normalisation; raises PromptError for shapes no template accepts."""
    if isinstance(messages, (str, bytes)) or not hasattr(messages, "__iter__"):
        raise PromptError("messages must be a list of message objects")
    out = []
    for i, message in enumerate(messages):
        message = _plain(message)
        if not isinstance(message, dict):
            raise PromptError(f"messages[{i}] must be an object, got {type(message).__name__}")
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


class ChatTemplate:
    """A compiled chat template plus the special tokens transformers passes to it."""

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None):
        self.source = source
        self.template = compile_template(source)
        self.special_tokens = dict(special_tokens or {})

    def render(self, messages: Any, tools: Any = None, add_generation_prompt: bool = True,
               **kwargs: Any) -> str:
        msgs = normalize_messages(messages)
        if tools is not None:
            if isinstance(tools, (str, bytes, Mapping)) or not hasattr(tools, "__iter__"):
                raise PromptError("tools must be a list of tool definitions")
            tools = [_plain(t) for t in tools]
            if not all(isinstance(t, dict) for t in tools):
                raise PromptError("each tool must be a JSON schema object")
        variables = {**self.special_tokens, **_plain(kwargs)}
        try:
            return self.template.render(messages=msgs, tools=tools, documents=None,
                                        add_generation_prompt=add_generation_prompt, **variables)
        except jinja2.exceptions.TemplateError as e:
            raise PromptError(f"chat template error: {e.message or e}") from e
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
            raise PromptError(f"messages do not fit the chat template: {e}") from e
