"""Product errors of the HTTP Gateway, in the OpenAI error envelope.

Every failure a client can see is an `APIError` with an HTTP status and the envelope
`{"error": {"message", "type", "param", "code"}}`. Engine errors (`ninfer.config.ErrorKind`) map to
statuses here and nowhere else.
"""
from __future__ import annotations

from pydantic import ValidationError

from ninfer.config import ErrorKind, GenerationError


class APIError(Exception):
    """A client-visible error: status, message, OpenAI `type`, offending `param` and `code`."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def unauthorized() -> APIError:
    return APIError(401, "Incorrect or missing API key: pass it as `Authorization: Bearer <key>`.",
                    type="authentication_error", code="invalid_api_key")


def model_not_found(model: str) -> APIError:
    return APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")


def body_too_large(limit: int) -> APIError:
    return APIError(413, f"Request body is larger than the limit of {limit} bytes.",
                    code="request_too_large")


def unsupported_media_type(content_type: str | None) -> APIError:
    got = f"Unsupported Content-Type `{content_type}`" if content_type else "Missing Content-Type"
    return APIError(415, f"{got}: send the body as JSON with `Content-Type: application/json`.",
                    code="unsupported_media_type")


def not_ready(reason: str) -> APIError:
    return APIError(503, f"The engine is not ready: {reason}", type="service_unavailable_error",
                    code="not_ready")


def internal_error() -> APIError:
    # NOTE: never put exception text or a traceback in the body; the server log has them.
    return APIError(500, "Internal server error.", type="server_error", code="internal_error")


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _is_branch_name(part) -> bool:
    """Union-branch names pydantic inserts into locations ("str", "list[...]", "NamedToolChoice")."""
    return isinstance(part, str) and ("[" in part or part[:1].isupper()
                                      or part in ("str", "int", "float", "bool", "list", "dict"))


def from_validation_error(err: ValidationError) -> APIError:
    """400 naming the most specific offending field (e.g. `messages[0].content[0].text`)."""
    errors = err.errors(include_url=False)
    located = [(_loc(tuple(p for p in e.get("loc", ()) if not _is_branch_name(p))), e) for e in errors]
    param = max((loc for loc, _ in located), key=len)
    msgs: list[str] = []
    for loc, e in located:
        msg = e.get("msg", "invalid value")
        msg = msg[len("Value error, "):] if msg.startswith("Value error, ") else msg
        if loc == param and msg not in msgs:
            msgs.append(msg)
    where = f"`{param}`: " if param else ""
    return bad_request(f"Invalid request: {where}{'; or '.join(msgs)}", param=param or None)


_STATUS = {
    ErrorKind.OVERLOADED: (429, "rate_limit_error", "queue_full"),
    ErrorKind.QUEUE_TIMEOUT: (503, "service_unavailable_error", "queue_timeout"),
    ErrorKind.INVALID_REQUEST: (400, "invalid_request_error", "invalid_request"),
    ErrorKind.NOT_READY: (503, "service_unavailable_error", "not_ready"),
    ErrorKind.ENGINE_FAILED: (500, "server_error", "engine_failed"),
}


def from_engine_error(err: GenerationError) -> APIError:
    status, type_, code = _STATUS.get(err.kind, (500, "server_error", "internal_error"))
    message = err.message or err.kind.value
    return APIError(status, message, type=type_, code=code)
