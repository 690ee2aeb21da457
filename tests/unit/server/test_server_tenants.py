"""Tenants through `infer serve`'s doors (a fake engine): a named API key's tenant, or the tenant header's on a
keyless server, reaches the engine from gRPC and from the OpenAI gateway; the tenants file's weights reach the
engine's config; a tenants file that does not parse stops the server before it listens, naming the line."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from infer.api import INVALID_FIELD_KEY, pb, pb_grpc
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
