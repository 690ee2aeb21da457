"""The HTTP endpoints: parse and check the body, call the model server, answer in OpenAI's format."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from infer.api import API_KEY_METADATA, REQUEST_ID, pb
from infer.server.gateway import prompts, translate
from infer.server.gateway.errors import RETRY_AFTER_S, APIError, body_field, from_validation
from infer.server.gateway.metrics import GatewayMetrics
from infer.server.gateway.render import ChatFormat, Choice, CompletionFormat, Format, Json, Meta
from infer.server.gateway.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    IgnoredFieldLog,
    Sampling,
    ignored_fields,
)
from infer.server.gateway.streams import (
    SHUTTING_DOWN,
    ClientDisconnectedError,
    EventStreamResponse,
    collect,
    sse_events,
    start,
    unless_disconnected,
)
from infer.server.gateway.upstream import Metadata, Upstream

logger = logging.getLogger(__name__)

# forwarded as gRPC metadata: the caller's API key (the model server checks it), W3C trace context
FORWARDED_HEADERS = (API_KEY_METADATA, "traceparent", "tracestate")
_METADATA_VALUE = re.compile(r"[ -~]*")  # what gRPC takes in a text metadata value: visible ASCII and space
# the forwarded headers in all, well inside gRPC's default bound on a call's metadata (8 KiB with gRPC's own headers:
# past it a server may refuse the call RESOURCE_EXHAUSTED, which would read as 429 "server busy"; past 16 KiB it does)
MAX_FORWARDED_BYTES = 4 * 1024
Handler = Callable[[Request, str], Awaitable[Response]]
M = TypeVar("M", bound=BaseModel)


def _request_id(request: Request) -> str:
    """X-Request-Id, or a random id when it is absent or empty; 400 when sent twice (which one would be meant?)."""
    values = request.headers.getlist("x-request-id")
    if len(values) > 1:
        message = f"X-Request-Id: sent {len(values)} times; send it once"
        raise APIError(400, message, code="invalid_value", param="X-Request-Id")
    if not values or not values[0]:
        return uuid.uuid4().hex
    if not REQUEST_ID.match(values[0]):
        raise APIError(422, "X-Request-Id: must be 1 to 128 visible ASCII characters", param="X-Request-Id")
    return values[0]


# JSON escapes of UTF-16 surrogates: json.loads takes an unpaired one, which no later UTF-8 encoding can
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _check_unicode(raw: bytes, data: Any) -> None:
    """400 for an unpaired surrogate (`"\\ud800"`): valid JSON, yet not text."""
    if not _SURROGATE_ESCAPE.search(raw):
        return
    try:
        json.dumps(data, ensure_ascii=False).encode()
    except UnicodeEncodeError as e:
        bad = e.object[e.start : e.end].encode("unicode_escape").decode()
        message = f"invalid JSON body: an unpaired UTF-16 surrogate ({bad}) is not a character"
        raise APIError(400, message, code="invalid_json") from None


def _decode(raw: bytes) -> dict[str, Any]:
    """The body's JSON object; 400 when it is not one (or not text)."""
    try:
        data = json.loads(raw)
    except ValueError as e:  # also UnicodeDecodeError
        raise APIError(400, f"invalid JSON body: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "the body must be a JSON object", code="invalid_json")
    _check_unicode(raw, data)
    return data


async def _parse(request: Request, schema: type[M]) -> M:
    """400 for a body that is not a JSON object (or not text), 422 when it does not fit the schema (size,
    time and Content-Type: guard.py)."""
    raw = await request.body()
    try:
        data = _decode(raw)
        return schema.model_validate(data)
    except ValidationError as e:
        raise from_validation(e) from None
    except RecursionError:  # NOTE: `[[[[...` thousands deep: json's decoder (or an encoder after it) gives up
        raise APIError(400, "invalid JSON body: nested too deeply", code="invalid_json") from None


def _metadata(request: Request, tenant_header: str | None = None) -> Metadata:
    """The forwarded headers, less those gRPC cannot carry (a tab, a byte past ASCII): dropped, not a 500; and the
    tenant header (`tenant_header`), which the model server reads: sent twice, or a value gRPC cannot carry, 422.
    More than MAX_FORWARDED_BYTES of them: 431.

    NOTE: a dropped `authorization` reaches the model server as no key: with keys there, a 401.
    """
    metadata = []
    for name in FORWARDED_HEADERS:
        value = request.headers.get(name)
        if value is None:
            continue
        if _METADATA_VALUE.fullmatch(value):
            metadata.append((name, value))
        else:
            logger.debug("%s: dropped the header %s: not visible ASCII", request.url.path, name)
    if tenant_header is not None and (values := request.headers.getlist(tenant_header)):
        if len(values) > 1 or not _METADATA_VALUE.fullmatch(values[0]):
            message = f"{tenant_header}: send it once, in visible ASCII"
            raise APIError(422, message, code="invalid_value", param=tenant_header)
        metadata.append((tenant_header, values[0]))
    if (num_bytes := sum(len(name) + len(value) for name, value in metadata)) > MAX_FORWARDED_BYTES:
        names = ", ".join(name for name, _ in metadata)
        message = (
            f"headers {names}: {num_bytes} bytes, more than the {MAX_FORWARDED_BYTES} forwarded to the model server"
        )
        raise APIError(431, message, code="request_header_fields_too_large")
    return metadata


class Routes:
    def __init__(
        self, upstream: Upstream, metrics: GatewayMetrics, model_id: str | None, tenant_header: str | None = None
    ) -> None:
        self.upstream, self.metrics, self.model_id = upstream, metrics, model_id
        self.tenant_header = tenant_header  # forwarded: the model server's tenant header (`--tenant-header`)
        self.ignored_fields = IgnoredFieldLog()  # unknown fields seen: each is logged once
        self.created = int(time.time())

    def _forwarded(self, request: Request) -> Metadata:
        return _metadata(request, self.tenant_header)

    async def _parse(self, request: Request, schema: type[M]) -> M:
        body = await _parse(request, schema)
        self.ignored_fields.log(request.url.path, ignored_fields(body))
        return body

    async def _served_model(self, metadata: Metadata) -> str:
        return self.model_id or (await self.upstream.model_info(metadata)).model_id

    async def _check_model(self, name: str, metadata: Metadata) -> str:
        served = await self._served_model(metadata)
        if name != served:
            message = f"model {name!r} not found: this server serves {served!r}"
            raise APIError(404, message, code="model_not_found", param="model")
        return served

    async def _with_request_id(self, request: Request, handler: Handler) -> Response:
        """Run a generate handler; its errors, too, carry the request id header."""
        request_id = _request_id(request)
        headers = {"X-Request-Id": request_id}
        try:
            response = await handler(request, request_id)
        except APIError as e:
            self.metrics.record_error(e)
            if e.status >= 500:
                logger.warning("%s %s -> %d: %s", request.method, request.url.path, e.status, e.message)
            return e.response(headers)
        except asyncio.CancelledError:
            # NOTE: the server stops past its grace period (the gRPC calls are cancelled by now): answer, not crash
            return SHUTTING_DOWN.response(headers)
        except ClientDisconnectedError:
            self.metrics.disconnects.inc()
            return Response(status_code=499, headers=headers)  # nobody reads it; counted as 499 (client closed)
        response.headers.update(headers)
        return response

    async def completions(self, request: Request) -> Response:
        """POST /v1/completions"""
        return await self._with_request_id(request, self._completions)

    async def _completions(self, request: Request, request_id: str) -> Response:
        body = await self._parse(request, CompletionRequest)
        model = await self._check_model(body.model, self._forwarded(request))
        meta = Meta(f"cmpl-{request_id}", model, int(time.time()), body.n, body.include_usage,
                    has_logprobs=body.logprobs is not None)  # fmt: skip
        requests = translate.completion_requests(body, request_id)
        return await self._generate(request, body, requests, CompletionFormat(meta))

    async def chat_completions(self, request: Request) -> Response:
        """POST /v1/chat/completions"""
        return await self._with_request_id(request, self._chat_completions)

    async def _chat_completions(self, request: Request, request_id: str) -> Response:
        body = await self._parse(request, ChatCompletionRequest)
        model = await self._check_model(body.model, self._forwarded(request))
        meta = Meta(f"chatcmpl-{request_id}", model, int(time.time()), body.n, body.include_usage, body.logprobs)
        # NOTE: no max_tokens: the model server fills in what the context leaves after the rendered chat
        requests = translate.chat_requests(body, request_id, body.max_new_tokens)
        return await self._generate(request, body, requests, ChatFormat(meta))

    async def render_completions(self, request: Request) -> Response:
        """POST /v1/completions/render: each prompt's token ids as /v1/completions would run it (prompts.py)"""
        return await self._with_request_id(request, self._render_completions)

    async def _render_completions(self, request: Request, request_id: str) -> Response:
        body = await self._parse(request, CompletionRequest)
        requests = translate.completion_requests(body, request_id)[:: body.n]  # one per prompt
        ids = [f"cmpl-{request_id}"] if len(requests) == 1 else [f"cmpl-{request_id}-{i}" for i in range(len(requests))]
        return JSONResponse(await self._render(request, body, requests, ids))

    async def render_chat_completions(self, request: Request) -> Response:
        """POST /v1/chat/completions/render: the chat's token ids as /v1/chat/completions would run it"""
        return await self._with_request_id(request, self._render_chat_completions)

    async def _render_chat_completions(self, request: Request, request_id: str) -> Response:
        body = await self._parse(request, ChatCompletionRequest)
        requests = translate.chat_requests(body, request_id, body.max_new_tokens)[:1]
        (rendered,) = await self._render(request, body, requests, [f"chatcmpl-{request_id}"])
        return JSONResponse(rendered)

    async def _render(
        self, request: Request, body: Sampling, requests: Sequence[pb.GenerateRequest], ids: Sequence[str]
    ) -> list[Json]:
        metadata = self._forwarded(request)
        model = await self._check_model(body.model, metadata)
        try:
            tokenized = await prompts.tokenize(self.upstream, requests, metadata)
        except APIError as e:
            raise body_field(e, body.constraint_param) from None
        return [prompts.rendered(i, model, body, r, p) for i, r, p in zip(ids, requests, tokenized, strict=True)]

    async def _generate(
        self, request: Request, body: Sampling, requests: Sequence[pb.GenerateRequest], fmt: Format
    ) -> Response:
        try:
            return await self._stream_or_gather(request, body, requests, fmt)
        except APIError as e:
            raise body_field(e, body.constraint_param) from None

    async def _stream_or_gather(
        self, request: Request, body: Sampling, requests: Sequence[pb.GenerateRequest], fmt: Format
    ) -> Response:
        metadata, started_s = self._forwarded(request), time.monotonic()
        await self._check_queue_bound(len(requests), metadata)
        if body.stream:
            opened = await unless_disconnected(request.receive, start(self.upstream, requests, metadata))
            self.metrics.ttft.labels(request.url.path).observe(time.monotonic() - started_s)
            on_done = functools.partial(self.metrics.record_usage, n=body.n)
            events = sse_events(opened, fmt, on_done, self.metrics.record_error)
            return EventStreamResponse(events, {}, on_disconnect=self.metrics.disconnects.inc)
        choices = await unless_disconnected(request.receive, self._complete(requests, metadata))
        self.metrics.record_usage(choices, body.n)
        return JSONResponse(fmt.body(choices))

    async def _check_queue_bound(self, num_streams: int, metadata: Metadata) -> None:
        """400 when the server could never queue this many streams at once: a retry would not help."""
        bound = (await self.upstream.model_info(metadata)).max_waiting_requests
        if bound and num_streams > bound:
            message = (f"n: prompts × n = {num_streams} generations, more than the server ever queues at once "
                       f"({bound}, its max_waiting_requests)")  # fmt: skip
            raise APIError(400, message, code="invalid_value", param="n")

    async def _complete(self, requests: Sequence[pb.GenerateRequest], metadata: Metadata) -> list[Choice]:
        return await collect(await start(self.upstream, requests, metadata))

    async def _model_card(self, metadata: Metadata) -> Json:
        info = await self.upstream.model_info(metadata)
        return {"id": self.model_id or info.model_id, "object": "model", "created": self.created,
                "owned_by": "infer", "max_model_len": info.max_model_len,
                "eos_token_ids": list(info.eos_token_ids)}  # fmt: skip  # every id that ends a generation

    async def models(self, request: Request) -> Response:
        """GET /v1/models"""
        return JSONResponse({"object": "list", "data": [await self._model_card(self._forwarded(request))]})

    async def model(self, request: Request) -> Response:
        """GET /v1/models/{model}"""
        card = await self._model_card(self._forwarded(request))
        if request.path_params["model"] != card["id"]:
            raise APIError(404, f"model {request.path_params['model']!r} not found", code="model_not_found")
        return JSONResponse(card)

    async def health(self, request: Request) -> Response:
        """GET /health: 200 while the model server reports SERVING, else 503."""
        status = await self.upstream.health()
        if status == "SERVING":
            return JSONResponse({"status": "ok", "upstream": status})
        return JSONResponse(
            {"status": "unavailable", "upstream": status},
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_S[503])},
        )
