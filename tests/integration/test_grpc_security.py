"""`infer serve` with TLS, API keys and limits on the default model: both doors, the in-process hop, the clients."""

from __future__ import annotations

import argparse
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import openai
import pytest

from infer.clients.channel import ClientTls
from infer.clients.cli import add_client_parser
from infer.clients.cli import run as run_client
from infer.clients.client import InferClient
from infer.clients.types import InferError, Sampling
from infer.server.app import start_gateway
from infer.server.gateway import GatewayServer
from infer.server.settings import ServerConfig
from tests.integration.grpc_helpers import ServerThread, engine_config
from tests.unit.server.security_helpers import Certs, make_certs

KEY = "sk-integration"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def secure(default_model_dir: Path, certs: Certs) -> Iterator[tuple[ServerThread, GatewayServer]]:
    config = ServerConfig(
        engine=engine_config(default_model_dir), grpc_port=0, metrics_port=0, http_port=0,
        tls_cert=certs.server_cert, tls_key=certs.server_key, api_key=f"{KEY},second",
        max_prompt_tokens=32, max_output_tokens=8,
    )  # fmt: skip
    server = ServerThread(config)
    assert server.server.local_address is not None
    gateway = server.call(start_gateway(server.server))
    assert gateway is not None
    try:
        yield server, gateway
    finally:
        server.call(gateway.stop())
        server.stop()


def _client(server: ServerThread, certs: Certs, api_key: str | None = KEY) -> InferClient:
    return InferClient(server.address, tls=ClientTls(ca_file=certs.ca), api_key=api_key, timeout_s=60)


def test_grpc_over_tls_with_a_key(secure: tuple[ServerThread, GatewayServer], certs: Certs) -> None:
    server, _ = secure
    with _client(server, certs) as client:
        assert client.complete("Hello", Sampling(max_tokens=4, temperature=0)).text
    with _client(server, certs, api_key=None) as client:
        assert client.health() == "SERVING"  # probes need no key
        with pytest.raises(InferError) as e:
            client.model_info()
        assert e.value.code is grpc.StatusCode.UNAUTHENTICATED
    with InferClient(server.address, api_key=KEY) as plaintext, pytest.raises(InferError) as e:
        plaintext.model_info()
    assert e.value.code is grpc.StatusCode.UNAVAILABLE


def test_grpc_limits_name_their_setting(secure: tuple[ServerThread, GatewayServer], certs: Certs) -> None:
    server, _ = secure
    with _client(server, certs) as client:
        for prompt, sampling, setting in (
            ("word " * 40, Sampling(max_tokens=4), "max_prompt_tokens"),
            ("Hello", Sampling(max_tokens=9), "max_output_tokens"),
        ):
            with pytest.raises(InferError) as e:
                client.complete(prompt, sampling)
            assert e.value.code is grpc.StatusCode.INVALID_ARGUMENT and setting in e.value.details
    server.wait_idle()


def test_the_openai_client_over_https_through_the_in_process_hop(
    secure: tuple[ServerThread, GatewayServer], certs: Certs
) -> None:
    server, gateway = secure
    http = httpx.Client(verify=ssl.create_default_context(cafile=certs.ca), timeout=60)
    client = openai.OpenAI(base_url=f"https://127.0.0.1:{gateway.port}/v1", api_key=KEY, http_client=http)
    model = client.models.list().data[0].id
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert chat.choices[0].message.content and chat.usage is not None and chat.usage.completion_tokens <= 4
    messages = [{"role": "user", "content": "Count."}]  # rendered with the system prompt: within 32 tokens
    default = client.chat.completions.create(model=model, messages=messages, temperature=0)  # type: ignore[arg-type]
    assert default.usage is not None and default.usage.completion_tokens == 8  # the context left, capped at 8
    assert default.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=model, prompt="word " * 40, max_tokens=4)
    assert too_long.value.code == "context_length_exceeded" and "max_prompt_tokens" in str(too_long.value)
    with pytest.raises(openai.UnprocessableEntityError) as too_many:
        client.completions.create(model=model, prompt="Hi", max_tokens=9)
    assert too_many.value.body["param"] == "max_tokens"  # type: ignore[index]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=client.base_url, api_key="wrong", http_client=http, max_retries=0).models.list()
    assert http.get(f"https://127.0.0.1:{gateway.port}/health").status_code == 200
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{server.server.metrics_port}/metrics", timeout=10)
    assert metrics.status == 200  # the Prometheus endpoint needs no key
    server.wait_idle()


def test_infer_client_with_a_key_and_a_ca(
    secure: tuple[ServerThread, GatewayServer], certs: Certs, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    add_client_parser(parser.add_subparsers())
    common = ["client", "--address", secure[0].address, "--tls-ca", certs.ca]
    assert run_client(parser.parse_args([*common, "--api-key", KEY, "info"])) == 0
    assert '"model_id"' in capsys.readouterr().out
    assert run_client(parser.parse_args([*common, "info"])) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err
