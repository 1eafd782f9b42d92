"""`tools` / `tool_choice` of a chat request -> what the prompt shows and how output is parsed.

What is enforced:
  none       tools are left out of the prompt and output is never parsed for tool calls.
  auto       tools are rendered by the chat template; `<tool_call>` blocks in the output are parsed
             into typed `tool_calls` (finish_reason "tool_calls"). The model may answer in text.
  required   as auto, plus an instruction in the system message to call at least one tool, and the
             answer is constrained (after the reasoning) to one or more tool calls whose arguments
             are valid against each tool's parameter schema (the Frontend's tool-call grammar);
             exactly one call with `parallel_tool_calls=false`.
  named      only the named tool is rendered, plus an instruction to call exactly that tool, and the
             answer is constrained to exactly one call of it.
A constrained answer that runs out of max_tokens ends with finish_reason "length" and whatever calls
were complete; with `parallel_tool_calls=false` only the first parsed call is returned.
"""
from __future__ import annotations

from dataclasses import dataclass

from ninfer.contract.frontend import OutputConstraint
from ninfer.gateway.http.errors import bad_request
from ninfer.gateway.http.protocol import ChatCompletionRequest, NamedToolChoice


@dataclass(frozen=True, slots=True)
class ToolPlan:
    tools: tuple[dict, ...]          # OpenAI tool definitions shown to the template and the parser
    parse: bool                      # parse <tool_call> blocks in the output
    instruction: str | None          # appended to the system message (required / named)
    max_calls: int | None            # 1 when parallel_tool_calls is false
    constraint: OutputConstraint | None = None   # "required" / named: the tool-call grammar


def required_instruction(names: list[str]) -> str:
    listed = ", ".join(f"`{n}`" for n in names)
    return ("You must respond with at least one function call (one of: " + listed + "), in the "
            "<tool_call> format described above, and no other answer.")


def named_instruction(name: str) -> str:
    return (f"You must respond by calling the function `{name}` exactly once, in the <tool_call> "
            "format described above, and no other answer.")


def _enforced(frontend, tools: list[dict], name: str | None, parallel: bool) -> OutputConstraint:
    """The Frontend's grammar of tool calls of `tools` (a 400 naming `tools` when one cannot be written)."""
    try:
        return frontend.tool_call_constraint(tools, name=name, parallel=parallel)
    except ValueError as e:
        raise bad_request(f"cannot enforce tool_choice: {e}", param="tools") from None


def plan_tools(req: ChatCompletionRequest, frontend=None) -> ToolPlan:
    """frontend: builds the tool-call constraint of "required" / named (None: nothing enforced)."""
    tools = [t.model_dump(exclude_none=True) for t in req.tools or ()]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise bad_request("tool function names must be unique", param="tools")
    choice = req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    max_calls = None if req.parallel_tool_calls else 1
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in names:
            raise bad_request(f"tool_choice names function {name!r}, which is not in tools",
                              param="tool_choice.function.name")
        chosen = tuple(t for t in tools if t["function"]["name"] == name)
        constraint = None if frontend is None else _enforced(frontend, list(chosen), name, False)
        return ToolPlan(chosen, True, named_instruction(name), max_calls, constraint)
    if choice in ("required", "auto") and not tools:
        if choice == "required":
            raise bad_request('tool_choice "required" needs at least one tool in tools',
                              param="tool_choice")
        return ToolPlan((), False, None, max_calls)
    if choice == "none":
        return ToolPlan((), False, None, max_calls)
    if choice == "required":
        constraint = None if frontend is None else _enforced(frontend, tools, None, req.parallel_tool_calls)
        return ToolPlan(tuple(tools), True, required_instruction(names), max_calls, constraint)
    return ToolPlan(tuple(tools), True, None, max_calls)
