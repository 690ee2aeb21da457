"""The in-process gateway never queues calls behind the server's cap on one connection's streams
(`max_streams_per_connection`): more HTTP streams than the cap from one tenant, and another tenant's request still
gets its first token at once (issue 38: 284 s over HTTP where gRPC took 4.5 s)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import httpx

from infer.engine.async_engine import AsyncEngine
from infer.server.app import InferenceServer, start_gateway
from infer.server.gateway import GatewayConfig
from infer.server.settings import ServerConfig
from tests.helpers.fake_engine import fake_core
from tests.unit.server.gateway.gateway_helpers import LoopThread

CAP, HEAVY_STREAMS = 4, 10


async def _stream(http: httpx.AsyncClient, body: dict[str, object], tenant: str, first: asyncio.Event) -> None:
    """One streamed completion read to its end; `first` set at its first token."""
    async with http.stream("POST", "/v1/completions", json=body, headers={"x-tenant": tenant}) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data:") and '"text"' in line and json.loads(line[5:])["choices"][0]["text"]:
                first.set()


async def _flood_then_light(port: int) -> tuple[float, int]:
    """HEAVY_STREAMS long streams of one tenant, then one short request of another: its time to the first token,
    and how many heavy streams had their first token by then."""
    body = {"model": "fake", "prompt": "Hello", "max_tokens": 200, "ignore_eos": True, "stream": True}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10, limits=limits) as http:
        started = [asyncio.Event() for _ in range(HEAVY_STREAMS)]
        heavy = [asyncio.ensure_future(_stream(http, body, "heavy", first)) for first in started]
        with contextlib.suppress(TimeoutError):  # NOTE: before the fix, only CAP of them started
            await asyncio.wait_for(asyncio.gather(*(first.wait() for first in started)), 2)
        light_first, start = asyncio.Event(), time.monotonic()
        light = asyncio.ensure_future(_stream(http, body | {"max_tokens": 2}, "light", light_first))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(light_first.wait(), 3)
        light_s = time.monotonic() - start
        num_started = sum(first.is_set() for first in started)
        for task in (*heavy, light):
            task.cancel()
        await asyncio.gather(*heavy, light, return_exceptions=True)
        return light_s, num_started


def test_more_http_streams_than_the_connection_cap_do_not_queue_another_tenant(loop: LoopThread) -> None:
    core, runner = fake_core(max_num_seqs=32, scheduling_policy="fair")
    runner.step_s = 0.05  # a heavy stream: 200 steps, 10 s, still running when the light request comes
    config = ServerConfig(
        engine=core.config, grpc_port=0, http_port=0, metrics_port=None, warmup=False,
        max_streams_per_connection=CAP, tenant_header="x-tenant",
    )  # fmt: skip
    server = InferenceServer(config)
    loop.call(server.start())
    gateway = None
    try:
        loop.call(server.load(AsyncEngine(core)))
        gateway = loop.call(start_gateway(server))
        assert gateway is not None
        light_s, num_started = loop.call(_flood_then_light(gateway.port), timeout_s=30)
    finally:
        if gateway is not None:
            loop.call(gateway.stop())
        loop.call(server.stop(grace_s=0))
    assert num_started == HEAVY_STREAMS  # every heavy stream reached the engine, not CAP of them
    assert light_s < 1.0, light_s


def test_the_standalone_gateway_assumes_the_servers_default_cap() -> None:
    assert GatewayConfig().upstream_max_streams == ServerConfig().max_streams_per_connection
