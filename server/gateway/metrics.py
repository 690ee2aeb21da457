"""The gateway's own request metrics, in its own Prometheus registry (several gateways may share a process).

They are served off the public HTTP port: `infer gateway --metrics-port`, or, in `infer serve`, with the
server's metrics on its metrics port."""

from __future__ import annotations

import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infer.server.gateway.errors import APIError
from infer.server.gateway.render import Choice

ENDPOINTS = (
    "/v1/completions", "/v1/chat/completions", "/v1/completions/render", "/v1/chat/completions/render", "/v1/models",
    "/health",
)  # fmt: skip
LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "infer_gateway_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=r
        )
        self.in_flight = Gauge("infer_gateway_requests_in_flight", "HTTP requests being served", registry=r)
        self.duration = Histogram(
            "infer_gateway_request_duration_seconds", "request start to the end of its response (whole stream)",
            ["endpoint"], buckets=LATENCY_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            "infer_gateway_time_to_first_token_seconds", "streaming requests: request start to the first token",
            ["endpoint"], buckets=LATENCY_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter("infer_gateway_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.completion_tokens = Counter(
            "infer_gateway_completion_tokens", "tokens generated for finished requests", registry=r
        )
        self.upstream_errors = Counter(
            "infer_gateway_upstream_errors", "calls the model server refused or failed, by the HTTP status answered",
            ["status"], registry=r,
        )  # fmt: skip
        self.disconnects = Counter(
            "infer_gateway_client_disconnects", "clients gone before their response ended", registry=r
        )

    def record_error(self, error: APIError) -> None:
        if error.is_upstream:
            self.upstream_errors.labels(str(error.status)).inc()

    def record_usage(self, choices: Sequence[Choice], n: int) -> None:
        self.prompt_tokens.inc(sum(c.usage.prompt_tokens for c in choices[::n] if c.usage is not None))
        self.completion_tokens.inc(sum(c.usage.completion_tokens for c in choices if c.usage is not None))


class MetricsMiddleware:
    """Counts every HTTP request and times it to the last byte of its response."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = scope["path"] if scope["path"] in ENDPOINTS else "other"
        status = 500
        started_s = time.monotonic()

        async def send_counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_counted)
        finally:
            self.metrics.in_flight.dec()
            self.metrics.requests.labels(endpoint, str(status)).inc()
            self.metrics.duration.labels(endpoint).observe(time.monotonic() - started_s)
