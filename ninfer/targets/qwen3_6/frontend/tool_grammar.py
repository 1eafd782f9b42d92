"""The grammar of enforced Qwen3.6 tool calls (`tool_choice` "required" or a named function), in
llguidance's Lark dialect.

The grammar admits exactly the output the chat template renders for an assistant's tool calls and
channels.py parses back, one call or several:

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    ...
    </function>
    </tool_call>

Calls are separated by up to two newlines (the template writes one); the whitespace the model writes
before the first call (its "\\n\\n" after `</think>`) is the constraint machinery's to allow
(constraints.py). `<tool_call>` and `</tool_call>` are text here: the added tokens of that text
match them, as do their byte pieces. Each function lists its declared parameters in schema order,
every required one present. A VALUE is written the way tool_args.py types it back (by the type of
the property's schema, a local `$ref` resolved):

  a string-like type   raw text: an `enum`/`const` of strings is one of its literals; `pattern`,
                       `minLength`, `maxLength` bound the text (`format` is not enforced); otherwise
                       any text without `</parameter>` or `</function>` (where channels.py would cut
                       the value)
  any other type       a JSON value valid against the property's schema (`%json`, with the
                       parameters' `$defs`/`definitions`), laid out as json.dumps writes it

A function whose parameters declare no `properties` takes any parameters as raw text (none when
`additionalProperties` is false).
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from .tool_args import _STRING_TYPES, _schema_type, tool_properties

# NOTE: the value text ends at the first "\n</parameter>" (lazy); it may not hold either closing
#       tag, at which channels.py would end the parameter early.
_TEXT = r"/(?s:.*)/ & ~/(?s:.*<\/(parameter|function)>.*)/"
_BAD_NAME_CHARS = set("<>\n\r")
# NOTE: JSON values are laid out as json.dumps writes them (the template's `tojson`), with no
#       other whitespace: free whitespace lets a weak model pad a value without end. `lenient`: a
#       keyword llguidance cannot enforce (uniqueItems, contains, if/then, ...) is left unenforced
#       rather than refusing the tool (tool schemas come from frameworks, unlike a response_format).
_JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}


class ToolGrammarError(ValueError):
    """The tools cannot be turned into a grammar (a name the format cannot carry)."""


def _literal(text: str) -> str:
    """A Lark string literal of `text` (JSON escapes)."""
    return json.dumps(text, ensure_ascii=False)


def _functions(tools: Sequence[dict]) -> list[dict]:
    out = []
    for tool in tools:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ToolGrammarError("every tool needs a function with a name")
        if _BAD_NAME_CHARS & set(fn["name"]) or not fn["name"]:
            raise ToolGrammarError(f"function name {fn['name']!r} cannot be written in a <function=...> tag")
        out.append(fn)
    return out


def _string_literals(schema: Any) -> str | None:
    """The alternatives of an `enum`/`const` of strings (None for other schemas)."""
    if not isinstance(schema, dict):
        return None
    options = schema.get("enum") if "enum" in schema else ([schema["const"]] if "const" in schema else None)
    if isinstance(options, list) and options and all(isinstance(o, str) for o in options):
        return " | ".join(_literal(o) for o in dict.fromkeys(options))
    return None


def _string_value(schema: Any) -> str:
    """The terminal of a raw-text value (ended by the lazy suffix "\\n</parameter>")."""
    if isinstance(schema, dict):
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and pattern:
            body = pattern[1:] if pattern.startswith("^") else pattern
            body = body[:-1] if body.endswith("$") and not body.endswith("\\$") else body
            return "/" + body.replace("/", "\\/") + "/ & ~/(?s:.*<\\/(parameter|function)>.*)/"
        lo, hi = schema.get("minLength"), schema.get("maxLength")
        if isinstance(lo, int) or isinstance(hi, int):
            lo = lo if isinstance(lo, int) and lo > 0 else 0
            hi = str(hi) if isinstance(hi, int) and hi >= lo else ""
            return f"/(?s:.{{{lo},{hi}}})/ & ~/(?s:.*<\\/(parameter|function)>.*)/"
    return _TEXT


def _json_value(schema: Any, params: dict) -> str:
    schema = dict(schema) if isinstance(schema, dict) else {}
    schema.setdefault("x-guidance", _JSON_LAYOUT)
    for key in ("$defs", "definitions"):
        if key in params and key not in schema:
            schema[key] = params[key]
    return "%json " + json.dumps(schema, ensure_ascii=False)


def _function_rules(fn: dict, rule: str) -> list[str]:
    """Rules of one `<function=NAME>...</function>` block, the block's rule named `rule`."""
    params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    props = tool_properties([fn], fn["name"]) if isinstance(params.get("properties"), dict) else None
    head = _literal(f"<function={fn['name']}>\n")
    lines: list[str] = []
    if not isinstance(props, dict):
        if params.get("additionalProperties") is False:
            return [f"{rule}: {head} \"</function>\""]
        lines.append(f"{rule}: {head} {rule}_any* \"</function>\"")
        lines.append(f"{rule}_any: \"<parameter=\" {rule}_key \">\\n\" {rule}_anyv \"\\n\"")
        lines.append(f"{rule}_key: /[^<>\\n\\r]+/")
        lines.append(f"{rule}_anyv[suffix=\"\\n</parameter>\"]: {_TEXT}")
        return lines
    required = set(params.get("required") or ())
    parts = []
    for i, (key, schema) in enumerate(props.items()):
        if _BAD_NAME_CHARS & set(key) or not key:
            if key in required:
                raise ToolGrammarError(f"parameter name {key!r} of function {fn['name']!r} cannot be written "
                                       "in a <parameter=...> tag")
            continue
        p = f"{rule}_p{i}"
        ptype, _ = _schema_type(schema)
        open_tag = _literal(f"<parameter={key}>\n")
        literals = _string_literals(schema) if ptype in _STRING_TYPES else None
        if literals:
            lines.append(f"{p}: {open_tag} ({literals}) \"\\n</parameter>\\n\"")
        elif ptype in _STRING_TYPES:
            lines.append(f"{p}: {open_tag} {p}_v \"\\n\"")
            lines.append(f"{p}_v[suffix=\"\\n</parameter>\"]: {_string_value(schema)}")
        else:
            lines.append(f"{p}: {open_tag} {p}_v \"\\n</parameter>\\n\"")
            lines.append(f"{p}_v: {_json_value(schema, params)}")
        parts.append(p if key in required else f"{p}?")
    lines.insert(0, f"{rule}: {head} {' '.join(parts)} \"</function>\"".replace("  ", " "))
    return lines


def tool_call_grammar(tools: Sequence[dict], *, name: str | None = None, parallel: bool = True) -> str:
    """Lark text (llguidance) of one or more tool calls of `tools` (OpenAI tool definitions).

    name: only that function, called exactly once (a named `tool_choice`); otherwise any of the
    tools, once, or one or more times with `parallel`.
    """
    fns = _functions(tools)
    if name is not None:
        fns = [f for f in fns if f["name"] == name]
        if not fns:
            raise ToolGrammarError(f"no tool is named {name!r}")
    if not fns:
        raise ToolGrammarError("at least one tool is needed")
    repeat = "" if name is not None or not parallel else " (SEP? call)*"
    lines = [f"start: call{repeat}",
             "SEP: /\\n{1,2}/",
             "call: \"<tool_call>\\n\" fn \"\\n</tool_call>\"",
             "fn: " + " | ".join(f"f{i}" for i in range(len(fns)))]
    for i, fn in enumerate(fns):
        lines.extend(_function_rules(fn, f"f{i}"))
    return "\n".join(lines) + "\n"
