"""Controlled output: the request fields that constrain what a completion may say -> one OutputConstraint.

  field                                         kind          param named in errors
  response_format {"type": "json_object"}       json_object   response_format
  response_format {"type": "json_schema", ...}  json_schema   response_format.json_schema.schema
  structured_outputs.json | guided_json         json_schema   structured_outputs.json | guided_json
  structured_outputs.json_object: true          json_object   structured_outputs.json_object
  structured_outputs.regex | guided_regex       regex         structured_outputs.regex | guided_regex
  structured_outputs.choice | guided_choice     choice        structured_outputs.choice | guided_choice
  structured_outputs.grammar | guided_grammar   ebnf (GBNF, with `::=`) or lark (llguidance's Lark)

At most one of them per request (400 naming the fields); `tool_choice` "required" or a named function
is a constraint too (tools.py). `check_constraints` compiles each distinct constraint off the event loop
before anything is submitted, so that an invalid schema, a regex that cannot compile or a grammar too
large is a 400 naming the field. On a chat with thinking on the reasoning stays free and the constraint
applies to the answer after `</think>`.
"""
from __future__ import annotations

import asyncio
import json

from ninfer.contract.frontend import ConstraintError, OutputConstraint
from ninfer.gateway.http.errors import bad_request
from ninfer.gateway.http.protocol import _Sampling


def _json_spec(value: dict | bool | str) -> str:
    """A schema given as an object, a boolean or JSON text -> JSON text (parsed by the compiler)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _grammar_kind(text: str) -> str:
    """GBNF / EBNF rules are written `name ::= ...`; anything else is read as llguidance's Lark."""
    return "ebnf" if "::=" in text else "lark"


def _structured_outputs(req: _Sampling) -> list[OutputConstraint]:
    so = req.structured_outputs
    if so is None:
        return []
    if so.structural_tag is not None:
        raise bad_request("structured_outputs.structural_tag is not supported", param="structured_outputs.structural_tag")
    if so.whitespace_pattern is not None:
        raise bad_request("structured_outputs.whitespace_pattern is not supported (JSON output has no free "
                          "whitespace)", param="structured_outputs.whitespace_pattern")
    found = _guided(so.json_, so.regex, so.choice, so.grammar, lambda name: f"structured_outputs.{name}")
    if so.json_object:
        found.append(OutputConstraint("json_object", "", "structured_outputs.json_object"))
    if not found:
        raise bad_request("structured_outputs needs one of json, regex, choice, grammar or json_object",
                          param="structured_outputs")
    return found


def _guided(json_, regex, choice, grammar, param) -> list[OutputConstraint]:
    """The constraints of vLLM's four guided fields, given as `guided_*` or inside `structured_outputs`
    (param(name): the request field of one of them)."""
    found = []
    if json_ is not None:
        found.append(OutputConstraint("json_schema", _json_spec(json_), param("json")))
    if regex is not None:
        found.append(OutputConstraint("regex", regex, param("regex")))
    if choice is not None:
        found.append(OutputConstraint("choice", json.dumps(choice, ensure_ascii=False), param("choice")))
    if grammar is not None:
        found.append(OutputConstraint(_grammar_kind(grammar), grammar, param("grammar")))
    return found


def request_constraint(req: _Sampling) -> OutputConstraint | None:
    """The request's output constraint (None: free output); a 400 naming the fields when it gives two."""
    if req.guided_whitespace_pattern is not None:
        raise bad_request("guided_whitespace_pattern is not supported (JSON output has no free whitespace)",
                          param="guided_whitespace_pattern")
    found: list[OutputConstraint] = []
    rf = req.response_format
    if rf is not None and rf.type == "json_object":
        found.append(OutputConstraint("json_object", "", "response_format"))
    elif rf is not None and rf.type == "json_schema":
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise bad_request("response_format of type 'json_schema' needs json_schema.schema",
                              param="response_format.json_schema.schema")
        found.append(OutputConstraint("json_schema", _json_spec(rf.json_schema.schema_),
                                      "response_format.json_schema.schema"))
    found.extend(_structured_outputs(req))
    found.extend(_guided(req.guided_json, req.guided_regex, req.guided_choice, req.guided_grammar,
                         lambda name: f"guided_{name}"))
    if len(found) > 1:
        raise conflict([c.param for c in found])
    return found[0] if found else None


def conflict(params: list[str]):
    """The 400 of a request with more than one output constraint."""
    return bad_request(f"only one output constraint is allowed per request; got {', '.join(params)}",
                       param=params[-1], code="conflicting_constraints")


async def check_constraints(frontend, calls) -> None:
    """Compile each distinct constraint of the engine calls (cached by the Frontend, off the event loop);
    a constraint that does not compile is a 400 naming its field."""
    seen: set[tuple[str, str]] = set()
    for call in calls:
        c = call.output.constraint
        if c is None or (c.kind, c.spec) in seen:
            continue
        seen.add((c.kind, c.spec))
        try:
            await asyncio.to_thread(frontend.compile_constraint, c)
        except ConstraintError as e:
            raise bad_request(str(e), param=e.param, code="invalid_constraint") from None
