"""The checks every POST route shares: readiness, content type (415 unless JSON), body size, JSON,
schema (400 naming the field), model (404)."""
from __future__ import annotations

import json

from fastapi import Request
from pydantic import BaseModel, ValidationError

from ninfer.gateway.http.errors import (bad_request, body_too_large, from_validation_error, model_not_found,
                                        unsupported_media_type)
from ninfer.gateway.http.state import GatewayState


def is_json_content_type(value: str | None) -> bool:
    """`application/json` or any `application/*+json`, with any parameters.

    NOTE: a body without a Content-Type is refused too, as FastAPI does by default: a browser page
    may post one (or a text/plain one) to a loopback server without a CORS preflight."""
    if not value:
        return False
    media = value.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def read_json(request: Request, limit: int) -> object:
    content_type = request.headers.get("content-type")
    if not is_json_content_type(content_type):
        raise unsupported_media_type(content_type)
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise body_too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"Malformed JSON body: {e}", code="invalid_json") from None


def validate(model: type[BaseModel], obj: object) -> BaseModel:
    if not isinstance(obj, dict):
        raise bad_request("The request body must be a JSON object")
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise from_validation_error(e) from None


def check_model(state: GatewayState, name: str | None) -> None:
    if name is not None and name != state.model_name:
        raise model_not_found(name)


async def parse(state: GatewayState, request: Request, schema: type[BaseModel]):
    """(engine, request): readiness, body, schema and model checks shared by every POST route."""
    engine = state.ready_engine()
    req = validate(schema, await read_json(request, state.max_body_bytes))
    check_model(state, req.model)
    return engine, req
