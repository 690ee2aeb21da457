"""Errors in OpenAI's JSON shape, and the upstream's refusals mapped onto HTTP: by the gRPC code and the reason
in the trailing metadata (`infer.api.ErrorReason`), never by the message's words."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from pydantic import ValidationError
from pydantic_core import ErrorDetails
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from infer.api import BEARER, CONSTRAINT_FIELDS, ErrorReason
from infer.clients import InferError

RETRY_AFTER_S = {429: 1, 503: 2}  # the Retry-After header of a refused request
_TYPES = {  # OpenAI's error types by HTTP status; the rest are server_error
    **dict.fromkeys((400, 401, 403, 404, 405, 408, 409, 413, 415, 422, 431), "invalid_request_error"),
    429: "rate_limit_error",
    504: "timeout_error",
}
_PYDANTIC_CODES = {"extra_forbidden": "unknown_parameter", "missing": "missing_required_parameter",
                   "unsupported_value": "unsupported_value"}  # fmt: skip
_UNION_TAG = re.compile(r"^(str|int|float|bool|list|dict|none|.*\[.*)$")  # pydantic's union member labels
# the model server's request fields (INVALID_FIELD_KEY) that a body names otherwise
_UPSTREAM_PARAMS: dict[str, str | None] = {"token_ids": "prompt", "input": None}
_UPSTREAM_TOOL = re.compile(r"^tools(\[\d+\])?(?:\.(name|parameters))?$")  # tools, tools[0], tools[0].parameters


class APIError(Exception):
    """End the HTTP request with this status and OpenAI error body."""

    def __init__(
        self, status: int, message: str, *, code: str | None = None, param: str | None = None, type: str = ""
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.type = type or _TYPES.get(status, "server_error")
        self.is_upstream = False  # True when the model server refused or failed the call (`from_grpc`)
        self.upstream_field: str | None = None  # the request field the model server refused (INVALID_ARGUMENT)
        self.upstream_reason: ErrorReason | None = None  # why (the trailing metadata's ErrorReason)
        self.retry_after_s: int | None = None  # Retry-After, when the upstream said (else RETRY_AFTER_S's)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        if self.status == 401:
            return {"WWW-Authenticate": BEARER}
        retry_after_s = self.retry_after_s or RETRY_AFTER_S.get(self.status)
        return {} if retry_after_s is None else {"Retry-After": str(retry_after_s)}

    def response(self, headers: Mapping[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers() | dict(headers or {}))


def _param(loc: tuple[int | str, ...]) -> str | None:
    """`messages[0].content[0]` from pydantic's location, without its union member labels."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif not _UNION_TAG.match(part):
            text += f".{part}" if text else part
    return text or None


def _union_root(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """The location up to its first union member label: where the alternatives of a union part ways."""
    for i, part in enumerate(loc):
        if isinstance(part, str) and _UNION_TAG.match(part):
            return loc[:i]
    return loc


def _is_type_mismatch(error: ErrorDetails) -> bool:
    return error["type"].endswith("_type") or error["type"] in ("none_required", "is_instance_of")


def _telling(errors: Sequence[ErrorDetails]) -> list[ErrorDetails]:
    """One error per field, the one that says the most.

    A union (`content: str | list[TextPart]`) fails once per alternative; the alternative that got furthest
    says what is wrong (`messages[0].content[0]: 'image_url' parts are not supported`), not the first one
    tried (`Input should be a valid string`). Preferred: a wrong value over a wrong type, then the deepest.
    """
    best: dict[tuple[int | str, ...], ErrorDetails] = {}
    for e in errors:
        root = _union_root(e["loc"])
        seen = best.get(root)
        if seen is None or (_is_type_mismatch(seen), -len(seen["loc"])) > (_is_type_mismatch(e), -len(e["loc"])):
            best[root] = e
    return list(best.values())


def from_validation(error: ValidationError) -> APIError:
    """422: the first problems, each naming its field; `param` is the first one's."""
    errors = _telling(error.errors(include_url=False))
    problems: dict[str | None, str] = {}
    for e in errors:
        problems.setdefault(_param(e["loc"]), e["msg"])
    first = errors[0]
    message = "; ".join(f"{p}: {m}" if p else m for p, m in list(problems.items())[:3])
    return APIError(422, message, code=_PYDANTIC_CODES.get(first["type"], "invalid_value"), param=_param(first["loc"]))


def unsupported(param: str, message: str) -> APIError:
    return APIError(422, f"{param}: {message}", code="unsupported_value", param=param)


def _body_param(field: str) -> str | None:
    """The body field of the model server's request field: `sampling.top_p` -> `top_p`, `token_ids` -> `prompt`,
    `tools[0].parameters` -> `tools[0].function.parameters`."""
    if field in _UPSTREAM_PARAMS:
        return _UPSTREAM_PARAMS[field]
    if match := _UPSTREAM_TOOL.match(field):
        index, part = match.group(1) or "", match.group(2)
        return f"tools{index}" + (f".function.{part}" if part else "")
    return field.removeprefix("sampling.")


def _invalid_argument(details: str, field: str | None, reason: ErrorReason | None) -> APIError:
    param = None if field is None else _body_param(field)
    if reason is ErrorReason.CONTEXT_LENGTH_EXCEEDED:  # as OpenAI answers a prompt over the context
        return APIError(400, details, code="context_length_exceeded", param="messages" if param is None else param)
    if reason is ErrorReason.CHAT_TEMPLATE_FAILED:  # the template's doing or the messages': a client error
        return APIError(400, details, code="chat_template_error", param="messages")
    if reason is ErrorReason.DUPLICATE_REQUEST_ID:
        return APIError(409, details, code="duplicate_request_id", param="X-Request-Id")
    if field == "request_id":
        return APIError(422, details, code="invalid_value", param="X-Request-Id")
    return APIError(422, details, code="invalid_value", param=param)


_UPSTREAM_CONSTRAINTS = {f"sampling.{kind}" for kind in CONSTRAINT_FIELDS}  # "sampling.regex", ...


def body_field(error: APIError, constraint_param: str | None) -> APIError:
    """An upstream refusal of the request's constraint or tools, pointed at the body field that carried it
    (`response_format`, `guided_regex`, `tools[0].function.parameters`): 400 for one that does not compile,
    as OpenAI answers an invalid schema. Other errors are returned as they are."""
    field = error.upstream_field
    if not error.is_upstream or error.status != 422 or field is None:
        return error
    param = (
        constraint_param
        if field in _UPSTREAM_CONSTRAINTS
        else _body_param(field)
        if _UPSTREAM_TOOL.match(field)
        else None
    )
    if param is None:
        return error
    detail = error.message.removeprefix(f"{field}: ")
    status = 400 if error.upstream_reason is ErrorReason.DOES_NOT_COMPILE else 422
    renamed = APIError(status, f"{param}: {detail}", code="invalid_value", param=param)
    renamed.is_upstream, renamed.upstream_field, renamed.upstream_reason = True, field, error.upstream_reason
    return renamed


def from_grpc(error: InferError) -> APIError:
    """The HTTP error for a failed upstream call, by its code and reason; an INVALID_ARGUMENT's field
    (`error.field`) names the body's."""
    api_error = _from_status(error.code, error.details, error.field, error.reason)
    api_error.is_upstream, api_error.upstream_field, api_error.upstream_reason = True, error.field, error.reason
    api_error.retry_after_s = error.retry_after_s
    return api_error


def _from_status(code: grpc.StatusCode, details: str, field: str | None, reason: ErrorReason | None) -> APIError:
    """(code, reason) -> HTTP status. Only INVALID_ARGUMENT's reasons pick among statuses (400, 409, 422; and
    `body_field`'s 400 for DOES_NOT_COMPILE); every other code maps alone (a reason may change the words)."""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return _invalid_argument(details, field, reason)
    if code == grpc.StatusCode.UNAUTHENTICATED:  # the gateway forwards the caller's key: the caller's error
        return APIError(401, details, code="invalid_api_key")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        busy = "" if reason is ErrorReason.BUDGET_EXCEEDED else "server busy: "  # a tenant's budget: its own doing
        return APIError(429, f"{busy}{details}", code="rate_limit_exceeded")
    if code == grpc.StatusCode.UNAVAILABLE:
        return APIError(503, f"model server unavailable: {details}", code="service_unavailable")
    if code == grpc.StatusCode.CANCELLED:
        return APIError(503, f"the model server cancelled the request: {details}", code="service_unavailable")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return APIError(504, f"deadline exceeded: {details}", code="deadline_exceeded")
    if code == grpc.StatusCode.INTERNAL:
        return APIError(500, details, code="internal_error")
    return APIError(502, f"model server error {code.name}: {details}", code="upstream_error")


async def handle_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return exc.response()


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 / 405 / 413, in the OpenAI shape."""
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
    error = APIError(exc.status_code, str(exc.detail), code=codes.get(exc.status_code), type="invalid_request_error")
    return error.response(exc.headers)


INTERNAL_ERROR = "internal error (the gateway's log has the details)"


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    """500 without the exception's text: it may hold internals (object reprs, addresses, paths).

    Starlette logs the traceback once this answer is out."""
    return APIError(500, INTERNAL_ERROR, code="internal_error").response()
