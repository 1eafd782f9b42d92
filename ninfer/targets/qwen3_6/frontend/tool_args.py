"""Typing of Qwen XML tool-call parameter values by the tool's JSON schema (qwen3_coder rules).

The model writes every value as text (`<parameter=K>\\nVALUE\\n</parameter>`); the schema type of
K decides the JSON value: string-like types keep the text; integer -> int; number -> int when
integral else float; boolean -> `true`/`false` (anything else is false); object/array -> JSON,
falling back to a Python literal; unknown types try a Python literal. Nullable schemas and
non-string types map `null`/`None` to null. Any failed conversion keeps the text.
"""
from __future__ import annotations

import ast
import json
import math
from typing import Any

_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
_INT_PREFIXES = ("int", "uint", "long", "short", "unsigned")


def tool_properties(tools: tuple[dict, ...] | list[dict], name: str) -> dict[str, Any]:
    """The `properties` of the named function's parameter schema ({} when unknown), a property that is
    a local `$ref` ("#/$defs/X", "#/definitions/X") replaced by the schema it names."""
    for tool in tools:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, dict) else None
            if not isinstance(props, dict):
                return {}
            return {k: _resolve_ref(v, params) for k, v in props.items()}
    return {}


def _resolve_ref(schema: Any, params: dict) -> Any:
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    if not isinstance(ref, str):
        return schema
    for prefix in ("#/$defs/", "#/definitions/"):
        defs = params.get(prefix[2:-1])
        if ref.startswith(prefix) and isinstance(defs, dict) and isinstance(defs.get(ref[len(prefix):]), dict):
            return defs[ref[len(prefix):]]
    return schema


def _schema_type(schema: Any) -> tuple[str, bool]:
    """(primary type, allows null) of one property schema."""
    if not isinstance(schema, dict):
        return "string", False
    if "type" in schema:
        t = schema["type"]
        if isinstance(t, list):             # ["integer", "null"]
            types = [str(x).strip().lower() for x in t]
            non_null = [x for x in types if x != "null"]
            return (non_null[0] if non_null else "null"), "null" in types
        t = str(t).strip().lower()
        return t, t == "null"
    if "anyOf" in schema:
        primary, nullable = "string", False
        picked = False
        for option in schema["anyOf"]:
            if isinstance(option, dict) and "type" in option:
                t = str(option["type"]).strip().lower()
                if t == "null":
                    nullable = True
                elif not picked:
                    primary, picked = t, True
        return primary, nullable
    return "string", False


def convert_value(value: str, name: str, properties: dict[str, Any]) -> Any:
    """The JSON value of parameter `name` whose text is `value`."""
    if name not in properties:
        return value
    ptype, nullable = _schema_type(properties[name])
    if nullable and value.lower() in ("null", "none"):
        return None
    if ptype in _STRING_TYPES:
        return value
    if value.lower() in ("null", "none"):
        return None
    if ptype.startswith(_INT_PREFIXES):
        try:
            return int(value)
        except ValueError:
            return value
    if ptype.startswith(("num", "float")):
        try:
            f = float(value)
            if not math.isfinite(f):
                return value
            return int(f) if f.is_integer() else f
        except (ValueError, OverflowError):
            return value
    if ptype in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    container = ptype in ("object", "array", "arr") or ptype.startswith(("dict", "list"))
    if container:
        try:
            parsed = json.loads(value)
            if isinstance(parsed, str):
                try:
                    parsed = ast.literal_eval(parsed)
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    pass
            json.dumps(parsed, allow_nan=False)
            return parsed
        except (ValueError, TypeError, RecursionError):
            pass
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value
    if container and isinstance(parsed, str):
        try:
            parsed = ast.literal_eval(parsed)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    try:
        json.dumps(parsed, allow_nan=False)
    except (TypeError, ValueError, RecursionError):         # sets, bytes, complex: not JSON
        return value
    return parsed
