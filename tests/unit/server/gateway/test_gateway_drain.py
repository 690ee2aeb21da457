"""The gateway drains like the model server: while a response is open, a new request gets 503 with Retry-After
(its connection closed, so a retry may reach another replica) until the listener closes, rather than a reset
connection (issue 38)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from infer.server.gateway.errors import RETRY_AFTER_S
from tests.unit.server.gateway.gateway_helpers import (
    COMPLETIONS,
    FakeUpstream,
    LoopThread,
    completion_body,
    error_of,
    running_gateway,
    wait_for,
)


def test_a_request_mid_drain_is_503_with_retry_after_until_the_open_one_ends(
    upstream: FakeUpstream, loop: LoopThread
) -> None:
    with running_gateway(upstream.address, loop, shutdown_grace_s=30) as gateway:
        with httpx.Client(base_url=gateway.url, timeout=10) as http:
            endless = completion_body(prompt="endless", stream=True)
            with http.stream("POST", COMPLETIONS, json=endless) as open_one:
                lines = open_one.iter_lines()
                assert next(line for line in lines if line.startswith("data:"))
                stopping = asyncio.run_coroutine_threadsafe(gateway.server.stop(), loop.loop)
                wait_for(lambda: gateway.server.drain.is_draining)
                with httpx.Client(base_url=gateway.url, timeout=10) as late:  # a new connection
                    refused = late.post(COMPLETIONS, json=completion_body())
                    health = late.get("/health")
                assert not stopping.done()  # the open response holds the drain
            error = error_of(refused, 503)
            assert error["code"] == "service_unavailable" and "shutting down" in error["message"]
            assert refused.headers["retry-after"] == str(RETRY_AFTER_S[503])
            assert refused.headers["connection"] == "close"
            assert health.status_code == 503
            start = time.monotonic()
            stopping.result(10)  # the open one's client left: the drain is over at once
            assert time.monotonic() - start < 5
        with pytest.raises(httpx.ConnectError):  # then the listener closed
            httpx.get(f"{gateway.url}/health", timeout=5)
