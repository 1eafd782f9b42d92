"""Request -> Engine inputs: (PreparedPrompt, SamplingParams, OutputOptions, max_tokens) per choice.

The Gateway owns this translation: OpenAI messages become the Frontend's message dicts, OpenAI
sampling fields become `SamplingParams`, stop/tool/reasoning semantics become `OutputOptions`.
`n` > 1 becomes n independent engine requests (seeds seed, seed+1, ...).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from ninfer.gateway.http.errors import APIError, bad_request
from ninfer.gateway.http.media_parts import PART_KINDS
from ninfer.gateway.media import MEDIA_KEY
from ninfer.gateway.http.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest, _Sampling
from ninfer.gateway.http.structured import conflict, request_constraint
from ninfer.gateway.http.tools import ToolPlan, plan_tools
from ninfer.config import OutputOptions, PreparedPrompt, SamplingParams

SEED_MODULUS = 2 ** 63


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """Facts of the served model the Gateway validates against."""
    max_model_len: int
    vocab_size: int
    sampling_defaults: Mapping[str, float] = field(default_factory=dict)   # generation_config.json
    lookahead: int = 0        # positions each request reserves for speculative decoding (in max_model_len)


@dataclass(frozen=True, slots=True)
class EngineCall:
    """One engine request: choice `index` of prompt `prompt_index`."""
    index: int
    prompt_index: int
    prompt: PreparedPrompt
    sampling: SamplingParams
    output: OutputOptions
    max_tokens: int
    prompt_logprobs: int | None = None    # echo + logprobs: log-probs of the prompt tokens (gateway/http/echo.py)
    discard_output: bool = False          # max_tokens 0 with echo: one token is run, none is returned
    session_id: str | None = None         # context-cache session key (request field `session_id`)


@dataclass(frozen=True, slots=True)
class ChatPlan:
    calls: tuple[EngineCall, ...]
    tools: ToolPlan
    logprobs: bool


@dataclass(frozen=True, slots=True)
class CompletionPlan:
    calls: tuple[EngineCall, ...]
    echo_texts: tuple[str, ...]      # per prompt; "" unless echo


# ---------------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------------
def _text_of(msg: ChatMessage, i: int) -> str:
    if msg.content is None:
        return ""
    if isinstance(msg.content, str):
        return msg.content
    texts = []
    for j, part in enumerate(msg.content):
        if part.type != "text":
            raise bad_request(f"content parts of type {part.type!r} are not supported; only 'text'",
                              param=f"messages[{i}].content[{j}].type")
        texts.append(part.text)
    return "\n".join(texts)


def _parts_with_media(msg: ChatMessage, i: int, media: Mapping) -> list[dict]:
    """Content parts in order: text parts as they are, each image/video part as the Frontend's
    `{"type": kind, kind: source, MEDIA_KEY: MediaItem}` (the template renders its placeholder)."""
    out = []
    for j, part in enumerate(msg.content):
        if part.type == "text":
            out.append({"type": "text", "text": part.text})
        elif part.type in PART_KINDS and (i, j) in media:
            item = media[(i, j)]
            out.append({"type": item.kind, item.kind: item.source, MEDIA_KEY: item})
        else:
            supported = "'text', 'image_url', 'video_url'" if part.type not in PART_KINDS else "'text'"
            raise bad_request(f"content parts of type {part.type!r} are not supported; only {supported}",
                              param=f"messages[{i}].content[{j}].type")
    return out


def _content(msg: ChatMessage, i: int, media: Mapping | None):
    """A string (text parts joined by newlines), or with media the list of parts."""
    if media and not isinstance(msg.content, (str, type(None))) and \
            any(p.type in PART_KINDS for p in msg.content):
        return _parts_with_media(msg, i, media)
    return _text_of(msg, i)


def _arguments(args: str | dict, param: str) -> dict:
    if isinstance(args, dict):
        return args
    try:
        value = json.loads(args or "{}")
    except json.JSONDecodeError as e:
        raise bad_request(f"tool call arguments are not valid JSON: {e.msg}", param=param) from None
    if not isinstance(value, dict):
        raise bad_request("tool call arguments must be a JSON object", param=param)
    return value


def frontend_messages(messages: list[ChatMessage], instruction: str | None = None,
                      media: Mapping | None = None) -> list[dict]:
    """OpenAI messages -> the chat template's message dicts (arguments as JSON objects).

    media: (message index, part index) -> MediaItem from `media_parts.acquire`; without it an
    image or video part is refused."""
    out: list[dict] = []
    for i, m in enumerate(messages):
        role = "system" if m.role == "developer" else m.role
        d: dict = {"role": role, "content": _content(m, i, media)}
        if role == "assistant":
            reasoning = m.reasoning_content if m.reasoning_content is not None else m.reasoning
            if reasoning is not None:
                d["reasoning_content"] = reasoning
            if m.tool_calls:
                d["tool_calls"] = [
                    {"id": tc.id, "type": "function",
                     "function": {"name": tc.function.name,
                                  "arguments": _arguments(tc.function.arguments,
                                                          f"messages[{i}].tool_calls[{j}].function.arguments")}}
                    for j, tc in enumerate(m.tool_calls)]
        if role == "tool":
            if m.tool_call_id is not None:
                d["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    if instruction:
        if out and out[0]["role"] == "system" and isinstance(out[0]["content"], str):
            out[0] = {**out[0], "content": (out[0]["content"] + "\n\n" + instruction).lstrip()}
        else:
            out.insert(0, {"role": "system", "content": instruction})
    return out


# ---------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------
def _token_ids(ids: list[int], limits: ModelLimits, param: str) -> None:
    for j, t in enumerate(ids):
        if not (0 <= t < limits.vocab_size):
            raise bad_request(f"token id {t} is outside the vocabulary (0..{limits.vocab_size - 1})",
                              param=f"{param}[{j}]")


def sampling_params(req: _Sampling, limits: ModelLimits, logprobs: int | None, index: int) -> SamplingParams:
    def pick(name: str, fallback):
        value = getattr(req, name)
        if value is not None:
            return value
        return limits.sampling_defaults.get(name, fallback)

    bias = []
    for key, value in (req.logit_bias or {}).items():
        tok = int(key)
        if not (0 <= tok < limits.vocab_size):
            raise bad_request(f"logit_bias token id {tok} is outside the vocabulary", param="logit_bias")
        bias.append((tok, float(value)))
    top_k = pick("top_k", 0)
    seed = None if req.seed is None else (req.seed + index) % SEED_MODULUS
    try:
        return SamplingParams(
            temperature=float(pick("temperature", 1.0)), top_p=float(pick("top_p", 1.0)),
            top_k=0 if top_k in (-1, None) else int(top_k), min_p=float(pick("min_p", 0.0)),
            repetition_penalty=float(pick("repetition_penalty", 1.0)),
            presence_penalty=float(pick("presence_penalty", 0.0)),
            frequency_penalty=float(pick("frequency_penalty", 0.0)),
            logit_bias=tuple(sorted(bias)), seed=seed, logprobs=logprobs)
    except ValueError as e:
        raise bad_request(str(e)) from None


def _max_tokens(requested: int | None, prompt: PreparedPrompt, limits: ModelLimits, param: str) -> int:
    n, look = prompt.num_prompt_tokens, limits.lookahead
    # NOTE: speculative decoding reserves `lookahead` positions past every request's output, inside max_model_len.
    reserved = f" ({look} of them reserved for speculative decoding)" if look else ""
    if n + look >= limits.max_model_len:
        raise APIError(400, f"This model's maximum context length is {limits.max_model_len} tokens{reserved}. "
                            f"However, your prompt has {n} tokens; no room is left for output.",
                       param=param, code="context_length_exceeded")
    room = limits.max_model_len - look - n
    if requested is None:
        return room
    if requested > room:
        raise APIError(400, f"This model's maximum context length is {limits.max_model_len} tokens{reserved}. "
                            f"However, you requested {n + requested} tokens ({n} in the prompt, "
                            f"{requested} for the completion). Reduce the prompt or max_tokens.",
                       param="max_tokens", code="context_length_exceeded")
    return requested


def _output_options(req: _Sampling, limits: ModelLimits, **kw) -> OutputOptions:
    _token_ids(req.stop_token_ids or [], limits, "stop_token_ids")
    return OutputOptions(stop=tuple(req.stop or ()), stop_token_ids=tuple(req.stop_token_ids or ()),
                         include_stop_str=req.include_stop_str_in_output, ignore_eos=req.ignore_eos,
                         skip_special_tokens=req.skip_special_tokens, **kw)


# ---------------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------------
def frontend_call(fn, *args, param: str, what: str = "cannot prepare the prompt", **kw):
    """Run a Frontend preparation; its input errors become a 400 naming `param`.

    NOTE: the Frontend raises PromptError (a ValueError) for what the chat template refuses
    (e.g. "System message must be at the beginning.").
    """
    try:
        return fn(*args, **kw)
    except APIError:
        raise
    except (ValueError, TypeError, KeyError) as e:
        raise bad_request(f"{what}: {e}", param=param) from None


def _thinking_budget(req: ChatCompletionRequest, in_kwargs) -> int | None:
    """The request's thinking budget: the top-level field, else chat_template_kwargs.thinking_budget."""
    if in_kwargs is not None and (isinstance(in_kwargs, bool) or not isinstance(in_kwargs, int) or in_kwargs < 0):
        raise bad_request(f"thinking_budget must be an integer >= 0, got {in_kwargs!r}",
                          param="chat_template_kwargs.thinking_budget")
    return req.thinking_budget if req.thinking_budget is not None else in_kwargs


def plan_chat(frontend, req: ChatCompletionRequest, limits: ModelLimits, media: Mapping | None = None) -> ChatPlan:
    constraint = request_constraint(req)
    tools = plan_tools(req, frontend)
    if constraint is not None and tools.constraint is not None:
        raise conflict([constraint.param, "tool_choice"])
    messages = frontend_messages(req.messages, tools.instruction, media)
    kwargs = dict(req.chat_template_kwargs or {})
    budget = _thinking_budget(req, kwargs.pop("thinking_budget", None))
    prompt = frontend_call(frontend.prepare_chat, messages, tools=list(tools.tools) or None,
                            chat_template_kwargs=kwargs or None, param="messages")
    max_tokens = _max_tokens(req.max_completion_tokens or req.max_tokens, prompt, limits, "messages")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    output = _output_options(req, limits, tools=tools.tools, parse_tool_calls=tools.parse,
                             parse_reasoning=True, thinking_budget=budget,
                             constraint=constraint or tools.constraint)
    calls = tuple(EngineCall(i, 0, prompt, sampling_params(req, limits, logprobs, i), output, max_tokens,
                             session_id=req.session_id)
                  for i in range(req.n))
    return ChatPlan(calls, tools, req.logprobs)


def plan_completion(frontend, req: CompletionRequest, limits: ModelLimits) -> CompletionPlan:
    constraint = request_constraint(req)
    if req.suffix:
        raise bad_request("suffix is not supported", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request("best_of other than n is not supported", param="best_of")
    if req.max_tokens == 0 and not req.echo:
        raise bad_request("max_tokens 0 is only allowed with echo", param="max_tokens")
    prompt_logprobs = req.logprobs if req.echo else None
    if prompt_logprobs is not None and req.stream:
        raise bad_request("echo with logprobs is not supported with stream", param="stream")
    p = req.prompt
    if isinstance(p, str):
        raw: list = [p]
    elif isinstance(p[0], int):
        raw = [p]
    else:
        raw = list(p)
    prompts: list[PreparedPrompt] = []
    echo: list[str] = []
    for k, item in enumerate(raw):
        param = "prompt" if len(raw) == 1 else f"prompt[{k}]"
        if isinstance(item, str):
            prompts.append(frontend_call(frontend.prepare_text, item, param=param))
            echo.append(item if req.echo else "")
        else:
            _token_ids(item, limits, param)
            prompts.append(frontend_call(frontend.prepare_tokens, list(item), param=param))
            echo.append(frontend.tokenizer.decode(list(item)) if req.echo else "")
    output = _output_options(req, limits, parse_tool_calls=False, parse_reasoning=False,
                             constraint=constraint)
    calls = []
    for k, prompt in enumerate(prompts):
        discard = req.max_tokens == 0
        max_tokens = _max_tokens(1 if discard else req.max_tokens, prompt, limits,
                                 "prompt" if len(raw) == 1 else f"prompt[{k}]")
        for i in range(req.n):
            calls.append(EngineCall(k * req.n + i, k, prompt,
                                    sampling_params(req, limits, req.logprobs, i), output, max_tokens,
                                    prompt_logprobs, discard, session_id=req.session_id))
    return CompletionPlan(tuple(calls), tuple(echo))
