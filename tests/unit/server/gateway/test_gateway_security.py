"""API keys on the gateway (401 in OpenAI's shape, forwarded upstream, the openai client), HTTPS, mTLS, TLS upstream."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from infer.clients.channel import ClientTls
from infer.server.gateway import GatewayConfig, GatewayServer
from infer.server.gateway.guard import HttpLimits
from infer.server.security import ApiKeys, TlsFiles
from tests.unit.server.gateway.gateway_helpers import (
    COMPLETIONS,
    FAKE_MODEL,
    FakeInference,
    FakeUpstream,
    LoopThread,
    completion_body,
    error_of,
    running_gateway,
)
from tests.unit.server.security_helpers import Certs, guarded

KEY = "sk-test-key"


@pytest.fixture(scope="module")
def keyed_url(upstream: FakeUpstream, loop: LoopThread) -> Iterator[str]:
    with running_gateway(upstream.address, loop, api_keys=ApiKeys([KEY, "another"])) as gateway:
        yield gateway.url


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _is_401(response: httpx.Response, code: str = "invalid_api_key") -> dict[str, object]:
    error = error_of(response, 401)
    assert error["code"] == code and error["type"] == "invalid_request_error" and error["param"] is None
    assert response.headers["WWW-Authenticate"] == "Bearer"
    return error


def test_a_key_is_needed_but_not_for_probes(keyed_url: str, fake: FakeInference) -> None:
    with httpx.Client(base_url=keyed_url, timeout=30) as http:
        assert "authorization" in _is_401(http.post(COMPLETIONS, json=completion_body()))["message"]  # type: ignore[operator]
        assert _is_401(http.get("/v1/models", headers=_bearer("wrong")))["message"] == "invalid API key"
        assert _is_401(http.get("/v1/models", headers={"Authorization": KEY}))  # no Bearer scheme
        assert not fake.requests
        assert http.get("/health").status_code == 200
        assert http.get("/metrics", headers=_bearer(KEY)).status_code == 404  # on the metrics port, not here
        assert http.get("/v1/models", headers=_bearer(KEY)).json()["data"][0]["id"] == FAKE_MODEL
        assert http.post(COMPLETIONS, json=completion_body(), headers=_bearer(KEY)).status_code == 200
    assert fake.metadata[-1]["authorization"] == f"Bearer {KEY}"  # forwarded: the model server checks it too


def test_the_openai_client_with_an_api_key(keyed_url: str) -> None:
    client = openai.OpenAI(base_url=f"{keyed_url}/v1", api_key=KEY, max_retries=0)
    completion = client.completions.create(model=FAKE_MODEL, prompt="Hi", max_tokens=2)
    assert completion.choices[0].text == "Hello world"
    chat = client.chat.completions.create(model=FAKE_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert chat.choices[0].message.content == "Hello world"
    wrong = openai.OpenAI(base_url=f"{keyed_url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.models.list()
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"


def test_a_gateway_without_keys_forwards_the_callers_key(loop: LoopThread) -> None:
    with (
        guarded(loop, keys=ApiKeys([KEY])) as upstream,
        running_gateway(upstream.address, loop) as gateway,
        httpx.Client(base_url=gateway.url, timeout=30) as http,
    ):
        assert http.post(COMPLETIONS, json=completion_body(), headers=_bearer(KEY)).status_code == 200
        assert _is_401(http.post(COMPLETIONS, json=completion_body(), headers=_bearer("wrong")))
        assert _is_401(http.post(COMPLETIONS, json=completion_body()))
        assert http.get("/health").status_code == 200  # health is open upstream too


def test_https_in_front_of_a_tls_upstream(loop: LoopThread, certs: Certs) -> None:
    tls = TlsFiles(certs.server_cert, certs.server_key)
    with (
        guarded(loop, tls=tls) as upstream,
        running_gateway(upstream.address, loop, tls=tls, upstream_tls=ClientTls(ca_file=certs.ca)) as gateway,
    ):
        url = f"https://127.0.0.1:{gateway.server.port}"
        with httpx.Client(base_url=url, verify=_verify(certs.ca), timeout=30) as http:
            assert http.post(COMPLETIONS, json=completion_body()).json()["choices"][0]["text"]
            assert http.get("/health").json()["upstream"] == "SERVING"
        with pytest.raises(httpx.ConnectError), httpx.Client(verify=_verify(certs.other_ca)) as http:
            http.get(f"{url}/health")


def test_mtls_on_http_refuses_a_client_without_a_certificate(loop: LoopThread, certs: Certs) -> None:
    tls = TlsFiles(certs.server_cert, certs.server_key, certs.ca)
    with guarded(loop) as upstream, running_gateway(upstream.address, loop, tls=tls) as gateway:
        url = f"https://127.0.0.1:{gateway.server.port}/health"
        with pytest.raises(httpx.TransportError), httpx.Client(verify=_verify(certs.ca), timeout=10) as http:
            http.get(url)
        context = _verify(certs.ca)
        context.load_cert_chain(certs.client_cert, certs.client_key)
        with httpx.Client(verify=context, timeout=10) as http:
            assert http.get(url).status_code == 200


def _verify(ca_file: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca_file)


def test_an_idle_https_client_does_not_hold_the_shutdown(loop: LoopThread, certs: Certs) -> None:
    tls = TlsFiles(certs.server_cert, certs.server_key)
    with guarded(loop) as upstream:
        gateway = GatewayServer(GatewayConfig(upstream.address, http_port=0, shutdown_grace_s=30, tls=tls))
        loop.call(gateway.start())
        with httpx.Client(base_url=f"https://127.0.0.1:{gateway.port}", verify=_verify(certs.ca), timeout=30) as http:
            assert http.post(COMPLETIONS, json=completion_body()).status_code == 200  # then idle, kept alive
            started = time.monotonic()
            loop.call(gateway.stop())
            # NOTE: this was the whole 30 s grace: the TLS close waited for the idle client's close_notify
            assert time.monotonic() - started < 10


@pytest.mark.parametrize("hello", [b"", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"])  # nothing; half a ClientHello
def test_a_stalled_tls_handshake_is_closed_by_the_header_timeout(loop: LoopThread, certs: Certs, hello: bytes) -> None:
    tls, limits = TlsFiles(certs.server_cert, certs.server_key), HttpLimits(header_timeout_s=0.5)
    with guarded(loop) as upstream, running_gateway(upstream.address, loop, tls=tls, limits=limits) as gateway:
        with socket.create_connection(("127.0.0.1", gateway.server.port), timeout=10) as sock:
            sock.sendall(hello)
            with contextlib.suppress(ConnectionResetError):  # closed the hard way: as good
                # NOTE: asyncio's default handshake timeout held this for 60 s: the read timed out first
                assert sock.recv(1024) == b""
        with httpx.Client(verify=_verify(certs.ca), timeout=10) as http:  # a real handshake still works
            assert http.get(f"https://127.0.0.1:{gateway.server.port}/health").status_code == 200
