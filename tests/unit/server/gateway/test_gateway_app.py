"""Running the gateway: no engine import, run_gateway stops on cancel, graceful stop, the `infer gateway` command."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from infer.api import pb
from infer.server.gateway import GatewayConfig, add_gateway_parser, local_upstream, run_gateway
from infer.server.gateway.cli import config_from_args
from infer.server.gateway.render import Choice, usage
from infer.server.gateway.schemas import CompletionRequest
from infer.server.gateway.translate import completion_requests
from tests.unit.server.gateway.gateway_helpers import FakeUpstream, LoopThread, running_gateway, wait_for

ROOT = Path(__file__).resolve().parents[4]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_gateway_does_not_import_the_engine() -> None:
    code = (
        "import sys, infer.server.gateway; "
        "bad = sorted(m for m in sys.modules if m.startswith(('infer.engine', 'torch'))); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_run_gateway_serves_until_cancelled() -> None:
    port = _free_port()

    async def main() -> None:
        task = asyncio.create_task(run_gateway("127.0.0.1", port, "127.0.0.1:1", shutdown_grace_s=1))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            for _ in range(500):
                try:
                    response = await http.get("/health")
                    break
                except httpx.ConnectError:
                    await asyncio.sleep(0.02)
            else:
                raise AssertionError("the gateway never listened")
            assert response.status_code == 503  # nothing at the upstream address
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()

    asyncio.run(main())


def test_stop_ends_responses_that_outlive_the_grace() -> None:
    loop, fake = LoopThread(), FakeUpstream()
    loop.call(fake.start())
    try:
        with running_gateway(fake.address, loop, shutdown_grace_s=1) as gateway:
            url, body = f"{gateway.url}/v1/completions", {"model": "fake-model", "prompt": "endless"}
            with (
                concurrent.futures.ThreadPoolExecutor(1) as pool,
                httpx.stream("POST", url, json=body | {"stream": True}, headers={"X-Request-Id": "long"}) as stream,
            ):
                whole = pool.submit(httpx.post, url, json=body, headers={"X-Request-Id": "whole"})
                lines = stream.iter_lines()
                next(lines)
                wait_for(lambda: len(fake.servicer.requests) == 2)
                started_s = time.monotonic()
                loop.call(gateway.server.stop())
                assert 1 <= time.monotonic() - started_s < 5  # the responses had their grace period
                events = [line for line in lines if line]
                assert whole.result().status_code == 503 and whole.result().headers["retry-after"] == "2"
        assert events[-2:] == ['data: {"error":{"message":"the gateway is shutting down","type":"server_error",'
                               '"param":null,"code":"service_unavailable"}}', "data: [DONE]"]  # fmt: skip
        wait_for(lambda: {"long", "whole"} <= fake.servicer.cancelled)
    finally:
        loop.call(fake.stop())
        loop.close()


def test_busy_port_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        async def main() -> None:
            await run_gateway("127.0.0.1", port, "127.0.0.1:1")

        with pytest.raises(OSError, match="cannot listen"):
            asyncio.run(main())


def test_cli_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFER_HTTP_PORT", "9000")
    monkeypatch.setenv("INFER_GATEWAY_TIMEOUT_S", "none")
    parser = argparse.ArgumentParser()
    add_gateway_parser(parser.add_subparsers())
    config = config_from_args(parser.parse_args(["gateway", "--upstream", "10.0.0.1:50051", "--model-id", "m"]))
    expected = GatewayConfig(upstream="10.0.0.1:50051", http_port=9000, metrics_port=9465, model_id="m", timeout_s=None)
    assert config == expected
    args = parser.parse_args(["gateway", "--http-port", "0", "--timeout-s", "5", "--metrics-port", "off"])
    assert (args.http_port, args.timeout_s, args.upstream, args.metrics_port) == (0, 5.0, "127.0.0.1:50051", None)
    with pytest.raises(ValueError, match="http_port"):
        GatewayConfig(http_port=70000)
    capped = parser.parse_args(["gateway", "--max-streams-per-connection", "7"])
    assert config_from_args(capped).upstream_max_streams == 7
    assert config.upstream_max_streams == 100  # `infer serve`'s default (test_server_stream_cap.py)
    with pytest.raises(ValueError, match="upstream_max_streams"):
        GatewayConfig(upstream_max_streams=0)
    with pytest.raises(ValueError, match="metrics_port: must differ from http_port"):
        GatewayConfig(http_port=8000, metrics_port=8000)


def test_gateway_command_serves_metrics_on_its_own_port_and_stops_on_sigterm() -> None:
    port, metrics_port = _free_port(), _free_port()
    code = (
        "import argparse, sys; from infer.server.gateway import add_gateway_parser; "
        "p = argparse.ArgumentParser(); add_gateway_parser(p.add_subparsers()); "
        "a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))"
    )
    argv = [sys.executable, "-c", code, "gateway", "--upstream", "127.0.0.1:1", "--http-port", str(port),
            "--metrics-port", str(metrics_port)]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": "."})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 503
                break
            except httpx.ConnectError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
        assert httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 404
        scrape = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        assert 'infer_gateway_requests_total{endpoint="/health",status="503"} 1.0' in scrape
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_local_upstream_reaches_any_interface() -> None:
    assert local_upstream("0.0.0.0", 50051) == "127.0.0.1:50051"
    assert local_upstream("::", 1) == "[::1]:1"
    assert local_upstream("10.0.0.5", 2) == "10.0.0.5:2"


def test_usage_counts_each_prompt_once() -> None:
    choices = [
        Choice(i, usage=pb.Usage(prompt_tokens=10 + i // 2, completion_tokens=3, cached_tokens=4)) for i in range(4)
    ]
    assert usage(choices, n=2) == {"prompt_tokens": 10 + 11, "completion_tokens": 12, "total_tokens": 33,
                                   "prompt_tokens_details": {"cached_tokens": 8}}  # fmt: skip


def test_seeds_of_n_choices_wrap_around() -> None:
    body = CompletionRequest.model_validate({"model": "m", "prompt": "x", "n": 2, "seed": 2**63 - 1})
    assert [r.sampling.seed for r in completion_requests(body, "id")] == [2**63 - 1, 0]
