"""Qwen36Frontend: the family's input and output semantics over an artifact's frontend resources.

    fe = Qwen36Frontend.from_resources(artifact.frontend_resources())
    prompt = fe.prepare_chat(messages, tools=tools, chat_template_kwargs={"enable_thinking": False})
    session = fe.new_session(prompt, OutputOptions(tools=tuple(tools)))

It owns no queue and no model state; Engine drives the OutputSession.
"""
from __future__ import annotations

import array
import dataclasses
import functools
import hashlib
import json
from typing import Any, Mapping, Sequence

from .chat_template import ChatTemplate, normalize_messages
from .constraints import CompiledGrammar, ConstraintCompiler, GrammarConstraint
from .media_prompt import MediaPromptError, expand_media, has_pixels, raw_media_parts
from .session import OutputSession
from .tool_grammar import tool_call_grammar
from .tokenizer import Qwen36Tokenizer
from .vision_preprocess import VisionPreprocessConfig
from ninfer.contract.frontend import MediaPlaceholder, OutputConstraint, OutputOptions, PreparedPrompt, PromptError

IM_START_ID = 248045
IM_END_ID = 248046
ASSISTANT_HEADER = (IM_START_ID, 74455, 198)        # <|im_start|> assistant \n
THINK_ID, THINK_END_ID = 248068, 248069
TOOL_CALL_ID = 248058                   # `<tool_call>`
IMAGE_PAD_ID, VIDEO_PAD_ID = 248056, 248057
DEFAULT_EOS = (248046, 248044)
_RESERVED_KWARGS = ("messages", "tools", "documents", "add_generation_prompt")


def _json(resources: Mapping[str, bytes], name: str) -> dict:
    raw = resources.get(name)
    if raw is None:
        return {}
    data = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    if not isinstance(data, dict):
        raise ValueError(f"{name} must hold a JSON object")
    return data


def _template_source(resources: Mapping[str, bytes], config: dict) -> str | None:
    raw = resources.get("chat_template.jinja")
    if raw is not None:
        return raw.decode("utf-8") if isinstance(raw, bytes) else raw
    tpl = config.get("chat_template")
    if isinstance(tpl, list):            # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default")
    return tpl if isinstance(tpl, str) else None


_SAMPLING_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def _sampling_defaults(gen: Mapping[str, Any]) -> dict[str, float]:
    """The model's own sampling defaults from generation_config.json (for fields a request omits).

    `do_sample: false` means greedy. Only numeric values of the known fields are taken.
    """
    if gen.get("do_sample") is False:
        return {"temperature": 0.0}
    return {k: gen[k] for k in _SAMPLING_DEFAULT_KEYS
            if isinstance(gen.get(k), (int, float)) and not isinstance(gen.get(k), bool)}


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)


def _media_parts(messages: list[dict]) -> list[tuple[str, dict]]:
    """Image/video content parts in template order (the template's own tests)."""
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            for item in content:
                if not isinstance(item, dict):
                    continue
                if "image" in item or "image_url" in item or item.get("type") == "image":
                    parts.append(("image", item))
                elif "video" in item or item.get("type") == "video":
                    parts.append(("video", item))
    return parts


def _digest_part(item: dict) -> str:
    data = json.dumps(item, sort_keys=True, ensure_ascii=False, default=repr).encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def _tool_call_arguments_as_objects(messages: list[dict]) -> list[dict]:
    """OpenAI clients send tool-call arguments as JSON text; the template iterates a mapping."""
    out = []
    for i, m in enumerate(messages):
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            new_calls = []
            for call in calls:
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    try:
                        args = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
                    except ValueError as e:
                        raise PromptError(f"messages[{i}].tool_calls: arguments are not JSON: {e}") from e
                    if not isinstance(args, dict):
                        raise PromptError(f"messages[{i}].tool_calls: arguments must be a JSON object")
                    call = {**call, "function": {**fn, "arguments": args}}
                new_calls.append(call)
            m = {**m, "tool_calls": new_calls}
        out.append(m)
    return out


class Qwen36Frontend:
    def __init__(self, tokenizer: Qwen36Tokenizer, chat_template: ChatTemplate | None,
                 eos_token_ids: Sequence[int], sampling_defaults: Mapping[str, float] | None = None,
                 vision_config: VisionPreprocessConfig | None = None):
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos_token_ids))
        # NOTE: generation_config.json's sampling fields; Gateways use them for fields a request omits.
        self.sampling_defaults: dict[str, float] = dict(sampling_defaults or {})
        # NOTE: the image/video preprocessing (the artifact's preprocessor configs, else the family's values).
        self.vision_config = vision_config or VisionPreprocessConfig.from_dicts()
        self._constraints = ConstraintCompiler(tokenizer, IM_END_ID, THINK_END_ID, TOOL_CALL_ID)

    @classmethod
    def from_resources(cls, resources: Mapping[str, bytes]) -> "Qwen36Frontend":
        if "tokenizer.json" not in resources:
            raise ValueError("frontend resources lack tokenizer.json")
        config = _json(resources, "tokenizer_config.json")
        gen = _json(resources, "generation_config.json")
        tokenizer = Qwen36Tokenizer(resources["tokenizer.json"], config)
        special = {k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")
                   if isinstance(config.get(k), str)}
        source = _template_source(resources, config)
        template = ChatTemplate(source, special) if source is not None else None
        eos = list(_ids(gen.get("eos_token_id")))
        if isinstance(config.get("eos_token"), str):
            tid = tokenizer.token_to_id(config["eos_token"])
            if tid is not None and tid not in eos:
                eos.insert(0, tid)
        return cls(tokenizer, template, eos or DEFAULT_EOS, _sampling_defaults(gen),
                   VisionPreprocessConfig.from_resources(resources))

    @classmethod
    @functools.cache
    def builtin(cls) -> "Qwen36Frontend":
        """The real Qwen3.6 vocabulary and template (for the built-in demo model and tests)."""
        from . import vocab
        resources = {
            "tokenizer.json": vocab.tokenizer_json_bytes(),
            "tokenizer_config.json": json.dumps(vocab.tokenizer_config()).encode(),
            "chat_template.jinja": vocab.chat_template().encode(),
            "generation_config.json": json.dumps({"eos_token_id": list(DEFAULT_EOS)}).encode(),
        }
        return cls.from_resources(resources)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    # ------------------------------------------------------------------------------------------
    def _chat_inputs(self, messages, tools, chat_template_kwargs) -> tuple[list[dict], dict]:
        if self.chat_template is None:
            raise PromptError("this model has no chat template")
        kwargs = dict(chat_template_kwargs or {})
        if not isinstance(chat_template_kwargs or {}, Mapping):
            raise PromptError("chat_template_kwargs must be an object")
        for k in _RESERVED_KWARGS:
            if k in kwargs:
                raise PromptError(f"chat_template_kwargs may not set {k!r}")
        msgs = _tool_call_arguments_as_objects(normalize_messages(messages))
        for i, m in enumerate(msgs):
            if not isinstance(m.get("role"), str):
                raise PromptError(f"messages[{i}] has no role")
            c = m.get("content")
            if c is not None and not isinstance(c, (str, list)):
                raise PromptError(f"messages[{i}].content must be a string or a list of parts")
            if isinstance(c, list) and not all(isinstance(p, dict) for p in c):
                raise PromptError(f"messages[{i}].content parts must be objects")
        return msgs, kwargs

    def render_chat(self, messages, tools=None, chat_template_kwargs=None,
                    add_generation_prompt: bool = True) -> str:
        msgs, kwargs = self._chat_inputs(messages, tools, chat_template_kwargs)
        return self.chat_template.render(msgs, tools=tools, add_generation_prompt=add_generation_prompt,
                                         **kwargs)

    def prepare_chat(self, messages, tools=None, chat_template_kwargs=None,
                     add_generation_prompt: bool = True) -> PreparedPrompt:
        raw = raw_media_parts(messages)
        msgs, kwargs = self._chat_inputs(messages, tools, chat_template_kwargs)
        text = self.chat_template.render(msgs, tools=tools, add_generation_prompt=add_generation_prompt,
                                         **kwargs)
        ids = tuple(self.tokenizer.encode(text))
        rope = None
        if raw and has_pixels(raw):
            try:
                ids, media, rope, delta = expand_media(ids, raw, self.vision_config, self.tokenizer.encode)
            except MediaPromptError as e:
                raise PromptError(str(e)) from None
        else:
            media = self._placeholders(ids, _media_parts(msgs))
        rp = None
        if add_generation_prompt:
            start = len(ids) - 1 - ids[::-1].index(IM_START_ID) if IM_START_ID in ids else -1
            if start >= 0 and ids[start:start + 3] == ASSISTANT_HEADER:
                rp = start + 3
        prompt = self._prompt(ids, media, reconstruction_prefix=rp,
                              preserve_thinking=kwargs.get("preserve_thinking") is True)
        return prompt if rope is None else dataclasses.replace(prompt, rope_positions=rope, rope_delta=delta)

    def prepare_text(self, text: str) -> PreparedPrompt:
        if not isinstance(text, str):
            raise PromptError("prompt text must be a string")
        return self._prompt(tuple(self.tokenizer.encode(text)), ())

    def prepare_tokens(self, ids: Sequence[int]) -> PreparedPrompt:
        out = []
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, int):
                raise PromptError(f"prompt token {i} is not an integer: {t!r}")
            if not (0 <= t < self.vocab_size):
                raise PromptError(f"prompt token {i} = {t} is outside the vocabulary [0, {self.vocab_size})")
            out.append(int(t))
        return self._prompt(tuple(out), ())

    def new_session(self, prompt: PreparedPrompt, options: OutputOptions = OutputOptions()) -> OutputSession:
        return OutputSession(self, prompt, options)

    def compile_constraint(self, constraint: OutputConstraint) -> CompiledGrammar:
        """Compile (cached per kind and spec) an output constraint; ConstraintError names its param.
        The first call builds the grammar library's view of the vocabulary (about a second): call it off
        an event loop."""
        return self._constraints.compile(constraint)

    def new_token_constraint(self, prompt: PreparedPrompt, constraint: OutputConstraint) -> GrammarConstraint:
        """A fresh per-request grammar state for `prompt` (free until `</think>` when the prompt opened
        the reasoning and the constraint applies after it)."""
        return self._constraints.new_state(self._constraints.compile(constraint), prompt.enable_thinking)

    def tool_call_constraint(self, tools: Sequence[dict], *, name: str | None = None,
                             parallel: bool = True) -> OutputConstraint:
        """The constraint of an enforced tool choice: tool calls of `tools` in the template's format with
        arguments valid against each tool's schema (tool_grammar.py); `name`: exactly one call of it.
        ValueError when a tool cannot be written in that format."""
        return OutputConstraint("lark", tool_call_grammar(tools, name=name, parallel=parallel), "tool_choice")

    # ------------------------------------------------------------------------------------------
    @staticmethod
    def _placeholders(ids: tuple[int, ...], parts: list[tuple[str, dict]]) -> tuple[MediaPlaceholder, ...]:
        runs: list[MediaPlaceholder] = []
        i, k = 0, 0
        while i < len(ids):
            if ids[i] in (IMAGE_PAD_ID, VIDEO_PAD_ID):
                pad = ids[i]
                j = i
                while j < len(ids) and ids[j] == pad:
                    j += 1
                kind = "image" if pad == IMAGE_PAD_ID else "video"
                digest = _digest_part(parts[k][1]) if k < len(parts) and parts[k][0] == kind else ""
                runs.append(MediaPlaceholder(kind=kind, offset=i, length=j - i, content_digest=digest))
                k += 1
                i = j
            else:
                i += 1
        return tuple(runs)

    def _prompt(self, ids: tuple[int, ...], media: tuple[MediaPlaceholder, ...], *,
                reconstruction_prefix: int | None = None, preserve_thinking: bool = False) -> PreparedPrompt:
        if not ids:
            raise PromptError("the prompt is empty")
        h = hashlib.sha256()
        h.update(array.array("i", ids).tobytes())
        for m in media:
            h.update(f"|{m.kind}:{m.offset}:{m.length}:{m.content_digest}".encode())
        start = len(ids) - 1 - ids[::-1].index(IM_START_ID) if IM_START_ID in ids else -1
        last_think = len(ids) - 1 - ids[::-1].index(THINK_ID) if THINK_ID in ids else -1
        last_end = len(ids) - 1 - ids[::-1].index(THINK_END_ID) if THINK_END_ID in ids else -1
        thinking = last_think > max(start, last_end)
        return PreparedPrompt(token_ids=ids, media=media, content_id=h.hexdigest(),
                              enable_thinking=thinking, reconstruction_prefix=reconstruction_prefix,
                              preserve_thinking=preserve_thinking)
