"""Tenants through `infer serve`'s doors (a fake engine): a named API key's tenant, or the tenant header's on a
keyless server, reaches the engine from gRPC and from the OpenAI gateway; the tenants file's weights reach the
engine's config; a tenants file that does not parse stops the server before it listens, naming the line; a spent
token budget is RESOURCE_EXHAUSTED / 429 with Retry-After; per-tenant metrics keep to a bounded set of labels."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client import generate_latest

from infer.api import ERROR_REASON_KEY, INVALID_FIELD_KEY, RETRY_AFTER_KEY, ErrorReason, pb, pb_grpc
from infer.engine import DEFAULT_TENANT
from infer.engine.async_engine import AsyncEngine
from infer.server.app import InferenceServer, start_gateway
from infer.server.cli import main
from infer.server.gateway.app import GatewayServer
from infer.server.settings import ServerConfig
from tests.helpers.fake_engine import fake_core
from tests.unit.server.gateway.gateway_helpers import LoopThread


@dataclass
class Serving:
    server: InferenceServer
    gateway: GatewayServer | None
    tenants: list[str | None] = field(default_factory=list)  # what the engine core was given, in order

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def http(self) -> str:
        assert self.gateway is not None
        return f"http://127.0.0.1:{self.gateway.port}"

    def generate(self, metadata: tuple[tuple[str, str], ...] = ()) -> list[pb.GenerateResponse]:
        with grpc.insecure_channel(self.grpc_address) as ch:
            stub = pb_grpc.InferenceServiceStub(ch)  # type: ignore[no-untyped-call]
            request = pb.GenerateRequest(prompt="Hello", sampling=pb.SamplingParams(max_tokens=2))
            return list(stub.Generate(request, timeout=30, metadata=metadata))

    def complete(self, headers: dict[str, str]) -> httpx.Response:
        body = {"model": "fake", "prompt": "Hello", "max_tokens": 2}
        return httpx.post(f"{self.http}/v1/completions", json=body, headers=headers, timeout=30)


@contextlib.contextmanager
def serving(loop: LoopThread, monkeypatch: pytest.MonkeyPatch, **settings: Any) -> Iterator[Serving]:
    """`infer serve` around a fake engine whose core records each request's tenant; its gateway when http_port."""
    core, _ = fake_core()
    config = ServerConfig(engine=core.config, grpc_port=0, metrics_port=None, warmup=False,
                          **{"http_port": None, **settings})  # fmt: skip
    server = InferenceServer(config)
    serving = Serving(server, None)
    submit = core.submit

    def recording(request_id: str, processed: Any, sink: Any, tenant: str | None = None) -> None:
        serving.tenants.append(tenant)
        submit(request_id, processed, sink, tenant)

    monkeypatch.setattr(core, "submit", recording)
    loop.call(server.start())
    try:
        loop.call(server.load(AsyncEngine(core)))
        serving.gateway = loop.call(start_gateway(server))
        yield serving
    finally:
        if serving.gateway is not None:
            loop.call(serving.gateway.stop())
        loop.call(server.stop(grace_s=0))


def _status(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value


def test_a_named_key_is_the_tenant_the_engine_sees_and_the_header_is_ignored(
    loop: LoopThread, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("team-a: sk-a\nsk-anon\n")
    with serving(loop, monkeypatch, api_keys_file=str(keys), tenant_header="x-tenant") as s:
        s.generate((("authorization", "Bearer sk-a"),))
        s.generate((("authorization", "Bearer sk-a"), ("x-tenant", "team-b")))  # the key decides
        s.generate((("authorization", "Bearer sk-anon"), ("x-tenant", "bad value")))  # ignored, not refused
    assert s.tenants[:2] == ["team-a", "team-a"]
    anon = s.tenants[2]
    assert anon is not None and anon.startswith("key-") and "sk-anon" not in anon


def test_a_keyless_server_takes_the_tenant_from_the_header(loop: LoopThread, monkeypatch: pytest.MonkeyPatch) -> None:
    with serving(loop, monkeypatch, tenant_header="x-tenant") as s:
        s.generate((("x-tenant", "team-b"),))
        s.generate()
        error = _status(lambda: s.generate((("x-tenant", "x" * 65),)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "x-tenant" in error.details()
        assert (INVALID_FIELD_KEY, "x-tenant") in tuple(error.trailing_metadata() or ())
    assert s.tenants == ["team-b", DEFAULT_TENANT]  # the refused one never reached the engine


def test_two_tenants_through_the_gateway_by_header(loop: LoopThread, monkeypatch: pytest.MonkeyPatch) -> None:
    with serving(loop, monkeypatch, tenant_header="x-tenant", http_port=0) as s:
        for tenant in ("light", "heavy", "light"):
            assert s.complete({"X-Tenant": tenant}).status_code == 200
        refused = s.complete({"x-tenant": "two words"})
        assert refused.status_code == 422 and refused.json()["error"]["param"] == "x-tenant"
    assert s.tenants == ["light", "heavy", "light"]


def test_two_tenants_through_the_gateway_by_named_key(
    loop: LoopThread, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("chat: sk-chat\nbatch: sk-batch\n")
    with serving(loop, monkeypatch, api_keys_file=str(keys), http_port=0) as s:
        for key in ("sk-chat", "sk-batch"):
            assert s.complete({"Authorization": f"Bearer {key}", "x-tenant": "ignored"}).status_code == 200
    assert s.tenants == ["chat", "batch"]


def test_the_tenants_file_weights_reach_the_engine(tmp_path: Path, loop: LoopThread) -> None:
    path = tmp_path / "tenants"
    path.write_text("gold 3\nfree 1\n")
    server = InferenceServer(ServerConfig(grpc_port=0, http_port=None, metrics_port=None, tenants_file=str(path)))
    loop.call(server.start())
    try:
        assert server.engine_config.tenant_weights == (("gold", 3.0),)
    finally:
        loop.call(server.stop(grace_s=0))
    with pytest.raises(ValueError, match="tenants_file: give the weights in the tenants file or in tenant_weights"):
        ServerConfig(engine=server.config.engine.__class__(tenant_weights=(("gold", 2.0),)), tenants_file=str(path))


def test_a_tenants_file_that_does_not_parse_stops_the_server_naming_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tenants"
    path.write_text("gold 3\nfree one\n")
    argv = ["serve", "--tenants", str(path), "--tenant-header", "X-Tenant", "--grpc-port", "0", "--http-port", "off",
            "--metrics-port", "off", "--scheduling-policy", "fair"]  # fmt: skip
    assert main(argv) == 2
    assert f"error: tenants_file: {path} line 2: weight 'one': not a number" in capsys.readouterr().err


# budgets and metrics


def _spend(s: Serving, tenant: str) -> grpc.RpcError:
    """Requests of `tenant` until its budget refuses one; that refusal."""
    for _ in range(50):
        try:
            s.generate((("x-tenant", tenant),))
        except grpc.RpcError as e:
            return e
    raise AssertionError(f"{tenant}: never refused")


def test_a_spent_budget_is_resource_exhausted_then_429_with_retry_after_and_no_kv_leak(
    loop: LoopThread, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "tenants"
    path.write_text("light 1 30  # 30 tokens a minute: a few requests\nheavy 2 none\n")
    with serving(loop, monkeypatch, tenant_header="x-tenant", tenants_file=str(path), http_port=0) as s:
        refused = _spend(s, "light")
        metadata = dict(refused.trailing_metadata() or ())
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert metadata[ERROR_REASON_KEY] == ErrorReason.BUDGET_EXCEEDED
        assert 1 <= int(metadata[RETRY_AFTER_KEY]) <= 60
        assert "tenant 'light' is over its token budget of 30 tokens per minute" in refused.details()
        num_admitted = len(s.tenants)
        for stream in (False, True):
            body = {"model": "fake", "prompt": "Hello", "max_tokens": 2, "stream": stream}
            response = httpx.post(f"{s.http}/v1/completions", json=body, headers={"x-tenant": "light"}, timeout=30)
            assert response.status_code == 429, response.text
            assert 1 <= int(response.headers["retry-after"]) <= 60
            error = response.json()["error"]
            assert error["code"] == "rate_limit_exceeded" and "30 tokens per minute" in error["message"]
        for _ in range(5):
            s.generate((("x-tenant", "heavy"),))  # no budget: never refused
        assert s.tenants.count("light") == num_admitted  # the refused ones never reached the engine
        stats = s.server.engine.stats() if s.server.engine else None
        assert stats is not None and stats.num_blocks_used == stats.num_running == stats.num_waiting == 0


def test_the_default_budget_covers_the_tenants_the_file_gives_none(
    loop: LoopThread, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "tenants"
    path.write_text("vip 1 none\n")
    with serving(loop, monkeypatch, tenant_header="x-tenant", tenants_file=str(path), tenant_tokens_per_minute=20) as s:
        for tenant in ("stranger", DEFAULT_TENANT):
            assert _spend(s, tenant).code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # each its own bucket
        for _ in range(10):
            s.generate((("x-tenant", "vip"),))


def test_per_tenant_metrics_label_the_named_tenants_and_other(
    loop: LoopThread, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "tenants"
    path.write_text("light 1 30\n")
    with serving(loop, monkeypatch, tenant_header="x-tenant", tenants_file=str(path)) as s:
        _spend(s, "light")
        for i in range(5):
            s.generate((("x-tenant", f"caller-{i}"),))  # five tenants the file does not name: one label
        s.generate()
        scrape = generate_latest(s.server.telemetry.registry).decode()
    samples = {line for line in scrape.splitlines() if line.startswith("infer_tenant_")}
    tenants = {label for line in samples for label in re.findall(r'tenant="([^"]*)"', line)}
    assert tenants == {"light", "other", DEFAULT_TENANT}, sorted(samples)
    assert 'infer_tenant_requests_total{code="OK",tenant="other"} 5.0' in samples
    assert 'infer_tenant_requests_total{code="RESOURCE_EXHAUSTED",tenant="light"} 1.0' in samples
    assert 'infer_tenant_budget_refusals_total{tenant="light"} 1.0' in samples
    assert 'infer_tenant_generation_tokens_total{tenant="other"} 10.0' in samples  # max_tokens 2, five requests
    prompt = next(line for line in samples if line.startswith('infer_tenant_prompt_tokens_total{tenant="default"}'))
    assert float(prompt.split()[-1]) > 0
    assert any(line.startswith('infer_tenant_queue_time_seconds_count{tenant="light"}') for line in samples)
