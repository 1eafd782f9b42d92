"""The OpenAPI description served at /openapi.json (and read by FastAPI's Swagger UI at /docs).

The POST routes read and validate their bodies themselves (parsing.py: content type, size limit, 400
naming the field), so FastAPI sees no body parameter; this module adds each route's request model
(protocol.py, with the NInfer and vLLM extension fields) as its JSON request body, the streaming
media type of the completion routes, the OpenAI error envelope of the failures, and the Bearer
scheme when the server has an API key.
"""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from ninfer.gateway.http.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                          TokenizeRequest)

REQUEST_MODELS: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
}
STREAMING = ("/v1/chat/completions", "/v1/completions")
REF = "#/components/schemas/{model}"

ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}
ERRORS = {
    "400": "invalid request (the `param` names the field)", "401": "missing or wrong API key",
    "404": "unknown model", "413": "body over --max-body-bytes", "415": "body not sent as application/json",
    "429": "queue full", "500": "internal error", "503": "not ready, draining or queue timeout",
}


def _version() -> str:
    try:
        return version("ninfer")
    except PackageNotFoundError:
        return "unknown"


def _any_of(schema):
    # NOTE: pydantic writes a tagged union as oneOf; a text part also matches the open "any other part"
    # schema, so a strict JSON Schema validator would refuse valid bodies. anyOf says what is accepted.
    if isinstance(schema, dict):
        return {("anyOf" if k == "oneOf" else k): _any_of(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_any_of(v) for v in schema]
    return schema


def build_openapi(app: FastAPI, api_key: bool, open_paths: tuple[str, ...] = ()) -> dict:
    doc = get_openapi(title=app.title, version=_version(), description=app.description, routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas["ErrorResponse"] = ERROR_SCHEMA
    error_ref = {"content": {"application/json": {"schema": {"$ref": REF.format(model="ErrorResponse")}}}}
    for path, model in REQUEST_MODELS.items():
        op = doc["paths"].get(path, {}).get("post")
        if op is None:
            continue
        schema = _any_of(model.model_json_schema(ref_template=REF, mode="validation"))
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
        op["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}}}
        if path in STREAMING:
            op["responses"]["200"]["content"]["text/event-stream"] = {
                "schema": {"type": "string", "description": "server-sent events when `stream` is true"}}
        for status, why in ERRORS.items():
            op["responses"].setdefault(status, {"description": why, **error_ref})
    if api_key:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
        for path in open_paths:
            for op in doc["paths"].get(path, {}).values():
                op["security"] = []
    return doc


def serve_openapi(app: FastAPI, api_key: bool, open_paths: tuple[str, ...]) -> None:
    """Replace FastAPI's generator with `build_openapi` (built once, on the first request); the
    routes in `open_paths` need no key."""
    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app, api_key, open_paths)
        return app.openapi_schema
    app.openapi = openapi
