"""The controlled-output fields of a request -> one OutputConstraint (gateway/http/structured.py) and the
tool-call constraint of tool_choice (tools.py). No model, no compile: the kinds, specs and params."""
from __future__ import annotations

import json

import pytest

from ninfer.contract.frontend import OutputConstraint
from ninfer.gateway.http.errors import APIError
from ninfer.gateway.http.protocol import ChatCompletionRequest, CompletionRequest
from ninfer.gateway.http.structured import request_constraint
from ninfer.gateway.http.tools import plan_tools
from ninfer.targets.qwen3_6.frontend.tool_grammar import tool_call_grammar

USER = [{"role": "user", "content": "Hello"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
GBNF = 'root ::= "a" | "b"'
LARK = 'start: "a" | "b"'


@pytest.mark.parametrize("fields,kind,spec,param", [
    ({"response_format": {"type": "json_object"}}, "json_object", "", "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
     "json_schema", json.dumps(SCHEMA), "response_format.json_schema.schema"),
    ({"guided_json": SCHEMA}, "json_schema", json.dumps(SCHEMA), "guided_json"),
    ({"guided_json": json.dumps(SCHEMA)}, "json_schema", json.dumps(SCHEMA), "guided_json"),
    ({"guided_json": True}, "json_schema", "true", "guided_json"),
    ({"guided_regex": "[0-9]+"}, "regex", "[0-9]+", "guided_regex"),
    ({"guided_choice": ["a", "é"]}, "choice", '["a", "é"]', "guided_choice"),
    ({"guided_grammar": GBNF}, "ebnf", GBNF, "guided_grammar"),
    ({"guided_grammar": LARK}, "lark", LARK, "guided_grammar"),
    ({"structured_outputs": {"json": SCHEMA}}, "json_schema", json.dumps(SCHEMA), "structured_outputs.json"),
    ({"structured_outputs": {"regex": "x+"}}, "regex", "x+", "structured_outputs.regex"),
    ({"structured_outputs": {"choice": ["a"]}}, "choice", '["a"]', "structured_outputs.choice"),
    ({"structured_outputs": {"grammar": GBNF}}, "ebnf", GBNF, "structured_outputs.grammar"),
    ({"structured_outputs": {"json_object": True, "disable_any_whitespace": True}}, "json_object", "",
     "structured_outputs.json_object"),
])
def test_each_field_becomes_one_constraint(fields, kind, spec, param):
    for req in (ChatCompletionRequest.model_validate({"messages": USER, **fields}),
                CompletionRequest.model_validate({"prompt": "x", **fields})):
        assert request_constraint(req) == OutputConstraint(kind, spec, param)


def test_free_output_and_conflicts():
    assert request_constraint(ChatCompletionRequest.model_validate({"messages": USER})) is None
    assert request_constraint(ChatCompletionRequest.model_validate(
        {"messages": USER, "response_format": {"type": "text"}})) is None
    with pytest.raises(APIError) as e:
        request_constraint(ChatCompletionRequest.model_validate(
            {"messages": USER, "response_format": {"type": "json_object"}, "guided_choice": ["a"]}))
    assert e.value.status == 400 and e.value.param == "guided_choice"
    assert "response_format, guided_choice" in e.value.message


class _ToolFrontend:
    """The one Frontend method plan_tools uses."""

    @staticmethod
    def tool_call_constraint(tools, *, name=None, parallel=True) -> OutputConstraint:
        return OutputConstraint("lark", tool_call_grammar(tools, name=name, parallel=parallel), "tool_choice")


def test_tool_choice_required_and_named_are_constraints():
    tool = {"type": "function", "function": {"name": "f", "parameters": SCHEMA}}
    other = {"type": "function", "function": {"name": "g"}}

    def plan(**kw):
        return plan_tools(ChatCompletionRequest.model_validate({"messages": USER, "tools": [tool, other], **kw}),
                          _ToolFrontend())

    assert plan(tool_choice="auto").constraint is None and plan(tool_choice="none").constraint is None
    required = plan(tool_choice="required").constraint
    assert required.param == "tool_choice" and "(SEP? call)*" in required.spec and "<function=g>" in required.spec
    single = plan(tool_choice="required", parallel_tool_calls=False).constraint
    assert "(SEP? call)*" not in single.spec
    named = plan(tool_choice={"type": "function", "function": {"name": "g"}}).constraint
    assert "<function=g>" in named.spec and "<function=f>" not in named.spec and "(SEP? call)*" not in named.spec
    with pytest.raises(APIError) as e:
        plan_tools(ChatCompletionRequest.model_validate({"messages": USER, "tool_choice": "required", "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"<a>": {"type": "string"}}, "required": ["<a>"]}}}]}),
            _ToolFrontend())
    assert e.value.status == 400 and e.value.param == "tools"
