"""Reconstruction boundary: how much of a model output the history renderer reproduces.

When a conversation continues, the template re-renders this turn's assistant message from what
the client sends back (content, reasoning_content, tool_calls). Reasoning is kept when the turn
lies after the last real user query (a tool-call turn followed by tool responses) or with
`preserve_thinking`; then the re-rendered turn is
`<|im_start|>assistant\\n<think>\\n{reasoning}\\n</think>\\n\\n{content}{tool calls}<|im_end|>\\n`.
We render exactly that with the artifact's own template and compare token ids with the
generation prompt's tail plus the output, so a reported boundary is never a guess.
"""
from __future__ import annotations

import json
from typing import Sequence

from .chat_template import ChatTemplate
from .tokenizer import Qwen36Tokenizer
from ninfer.contract.frontend import PromptError, ToolCall

_PROBE = "."
IM_END = "<|im_end|>"


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def reproduced_output_tokens(template: ChatTemplate, tokenizer: Qwen36Tokenizer,
                             gen_tail: Sequence[int], output_ids: Sequence[int], *,
                             content: str, reasoning: str | None,
                             tool_calls: Sequence[ToolCall], ends_with_im_end: bool) -> int:
    """How many leading output tokens a reasoning-keeping re-render reproduces (0 if none).

    gen_tail: the prompt from its last `<|im_start|>` (the generation prompt).
    """
    calls = []
    for call in tool_calls:
        try:
            args = json.loads(call.arguments)
        except ValueError:
            return 0
        if not isinstance(args, dict):
            return 0
        calls.append({"type": "function", "id": call.id,
                      "function": {"name": call.name, "arguments": args}})
    assistant: dict = {"role": "assistant", "content": content}
    if reasoning is not None:
        assistant["reasoning_content"] = reasoning
    if calls:
        assistant["tool_calls"] = calls
    user = {"role": "user", "content": _PROBE}
    try:
        head = template.render([user], add_generation_prompt=False)
        full = template.render([user, assistant, user], add_generation_prompt=False,
                               preserve_thinking=True)
    except PromptError:
        return 0
    tail = template.render([user], add_generation_prompt=False)
    if not (full.startswith(head) and full.endswith(tail)):
        return 0
    segment = full[len(head):len(full) - len(tail)]
    suffix = "\n" if ends_with_im_end else IM_END + "\n"
    if not segment.endswith(IM_END + "\n"):
        return 0
    segment = segment[:len(segment) - len(suffix)]
    expected = tokenizer.encode(segment)
    actual = list(gen_tail) + list(output_ids)
    return max(0, _common_prefix(expected, actual) - len(gen_tail))
