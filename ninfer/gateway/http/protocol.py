"""OpenAI-compatible request schemas (pydantic). Validation errors name the offending field.

Unknown fields are ignored (clients send many optional OpenAI fields we have no use for) and logged
with a warning once per field name and model, as vLLM does; fields whose meaning we cannot honour are
rejected by name in `convert.py`.
"""
from __future__ import annotations

import logging
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator,
                      model_validator)

log = logging.getLogger("ninfer.gateway.http")

MAX_STOP_STRINGS = 16
MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_WARNED_FIELDS = 256                   # distinct unknown field names logged per process
MAX_LOGGED_NAME = 64


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")
    # NOTE: process-wide, so that a client sending the same extra field on every request logs it once;
    # bounded, so that a client inventing names can neither grow it nor flood the log
    _warned_fields: ClassVar[set[str]] = set()

    @model_validator(mode="wrap")
    @classmethod
    def _log_unknown_fields(cls, data: Any, handler):
        value = handler(data)
        if isinstance(data, dict) and cls.model_config.get("extra") == "ignore":
            known = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
            warned = _Model._warned_fields
            for key in data.keys() - known:
                name = f"{cls.__name__}.{key[:MAX_LOGGED_NAME]}"
                if name in warned or len(warned) > MAX_WARNED_FIELDS:
                    continue
                warned.add(name)
                if len(warned) > MAX_WARNED_FIELDS:
                    log.warning("more than %d unknown request field names: no more are logged", MAX_WARNED_FIELDS)
                else:
                    log.warning("ignoring the unknown request field %r of %s (logged once per field name)",
                                key[:MAX_LOGGED_NAME], cls.__name__)
        return value


# ---------------------------------------------------------------------------------------------
# Chat
# ---------------------------------------------------------------------------------------------
class TextPart(_Model):
    type: Literal["text"]
    text: str


class OtherPart(_Model):
    """Any non-text content part: `image_url` and `video_url` are fetched and decoded by media_parts.py,
    any other type is rejected with a clear message during conversion."""
    model_config = ConfigDict(extra="allow")
    type: str


def _part_discriminator(v: Any) -> str:
    t = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return "TextPart" if t == "text" else "OtherPart"


ContentPart = Annotated[Union[Annotated[TextPart, Tag("TextPart")], Annotated[OtherPart, Tag("OtherPart")]],
                        Discriminator(_part_discriminator)]


class FunctionCall(_Model):
    name: str
    arguments: str | dict = "{}"


class ToolCallIn(_Model):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Model):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None            # vLLM's newer name for reasoning_content
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _content_required(self) -> "ChatMessage":
        if self.content is None and self.role != "assistant":
            raise ValueError(f"content is required for role {self.role!r}")
        return self


class FunctionDef(_Model):
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(_Model):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(_Model):
    name: str


class NamedToolChoice(_Model):
    type: Literal["function"] = "function"
    function: NamedFunction


class JSONSchemaFormat(_Model):
    name: str | None = Field(default=None, max_length=64)
    description: str | None = None
    # NOTE: `schema` shadows a BaseModel attribute; the field is `schema_` and the JSON key "schema".
    schema_: dict | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Model):
    """OpenAI's response_format: free text, any JSON object, or JSON valid against a schema."""
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None      # with type "json_schema" (its schema required)


class StructuredOutputs(_Model):
    """vLLM's `structured_outputs` (exactly one of json, regex, choice, grammar, json_object)."""
    json_: dict | bool | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: Any = None
    whitespace_pattern: str | None = None
    # accepted and without effect: JSON output never has free whitespace, and nothing falls back
    disable_fallback: bool | None = None
    disable_any_whitespace: bool | None = None
    disable_additional_properties: bool | None = None


class StreamOptions(_Model):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Model):
    """Fields shared by both completion endpoints (OpenAI plus vLLM's common extensions)."""
    model: str | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    logit_bias: dict[str, float] | None = None
    seed: int | None = Field(default=None, ge=-(2 ** 63), le=2 ** 64 - 1)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # context cache: the conversation this request continues (a lookup hint; shared prefixes are
    # found without it too). NInfer extension, like vLLM's extra request fields.
    session_id: str | None = Field(default=None, min_length=1, max_length=256)
    # controlled output (convert.py `output_constraint`): OpenAI's response_format and vLLM's extras;
    # at most one of them constrains a request
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict | bool | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None     # refused: JSON output has no free whitespace

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> list[str]:
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")
        if any(s == "" for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (v or {}).items():
            if not key.lstrip("-").isdigit():
                raise ValueError(f"logit_bias keys must be token ids, got {key!r}")
            if not (-100.0 <= bias <= 100.0):
                raise ValueError(f"logit_bias for token {key} must be in [-100, 100], got {bias}")
        return v

    @model_validator(mode="after")
    def _stream_options(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    chat_template_kwargs: dict[str, Any] | None = None
    # the reasoning's length cap in tokens: when spent, the reasoning is closed and the answer follows
    # (also accepted as chat_template_kwargs.thinking_budget). NInfer extension.
    thinking_budget: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _check(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        return self


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=0)      # 0 only with echo (prompt scoring)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1)

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list):
            if not v:
                raise ValueError("prompt must not be empty")
            if isinstance(v[0], list) and any(not p for p in v):
                raise ValueError("token-id prompts must not be empty")
        return v


# ---------------------------------------------------------------------------------------------
# Tokenizer endpoints
# ---------------------------------------------------------------------------------------------
class TokenizeRequest(_Model):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


class DetokenizeRequest(_Model):
    model: str | None = None
    tokens: list[int]
