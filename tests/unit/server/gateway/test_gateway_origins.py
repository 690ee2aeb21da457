"""Browsers and the keyless default: JSON bodies only (415), foreign origins refused (403) unless listed, CORS for the
listed ones, and Host checked on a loopback address (DNS rebinding)."""

from __future__ import annotations

import argparse
import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from infer.server.gateway.cli import add_gateway_parser, config_from_args
from infer.server.gateway.origins import BrowserPolicy, normal_origin, parse_origins
from infer.server.security import ApiKeys
from infer.server.settings import ServerConfig
from tests.unit.server.gateway.gateway_helpers import (
    CHAT,
    COMPLETIONS,
    FakeInference,
    FakeUpstream,
    LoopThread,
    RunningGateway,
    chat_body,
    completion_body,
    error_of,
    running_gateway,
)

APP = "http://localhost:3000"
JSON = "application/json"
EVIL = "http://evil.example"


@pytest.fixture(scope="module")
def listed(upstream: FakeUpstream, loop: LoopThread) -> Iterator[httpx.Client]:
    with (
        running_gateway(upstream.address, loop, allowed_origins=(APP,)) as gateway,
        httpx.Client(base_url=gateway.url, timeout=30) as http,
    ):
        yield http


@pytest.fixture(scope="module")
def keyed(upstream: FakeUpstream, loop: LoopThread) -> Iterator[httpx.Client]:
    with (
        running_gateway(upstream.address, loop, api_keys=ApiKeys(["sk-1"])) as gateway,
        httpx.Client(base_url=gateway.url, timeout=30, headers={"Authorization": "Bearer sk-1"}) as http,
    ):
        yield http


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          "application/jsonp", None])  # fmt: skip
def test_a_body_that_is_not_json_is_415(http: httpx.Client, fake: FakeInference, content_type: str | None) -> None:
    headers = {} if content_type is None else {"Content-Type": content_type}
    response = http.post(CHAT, content=json.dumps(chat_body()), headers=headers)
    error = error_of(response, 415)
    assert error["code"] == "unsupported_media_type" and "application/json" in error["message"]
    assert fake.requests == []


def _response(sock: socket.socket) -> bytes:
    """One response with a Content-Length body, read from a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or b"<closed>"
        assert not data.endswith(b"<closed>"), data
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:"))[15:])
    while len(body) < length:
        body += sock.recv(65536) or b"<closed>"
        assert not body.endswith(b"<closed>"), body
    return head


def test_a_refused_body_is_read_before_the_answer(gateway: RunningGateway) -> None:
    # NOTE: answering and closing before the body came made the kernel reset the connection when the rest of the
    # body arrived: the client could get ECONNRESET instead of the answer
    body = json.dumps(chat_body()).encode()
    with socket.create_connection(("127.0.0.1", gateway.server.port), timeout=10) as sock:
        for content_type in ("text/plain", JSON):
            origin = "" if content_type != JSON else f"Origin: {EVIL}\r\n"
            head = f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n{origin}"
            sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])
            sock.sendall(body[10:])
            assert _response(sock).startswith(b"HTTP/1.1 415" if content_type != JSON else b"HTTP/1.1 403")
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # kept alive
        assert _response(sock).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON"])
def test_json_in_any_spelling_is_served(http: httpx.Client, content_type: str) -> None:
    response = http.post(COMPLETIONS, content=json.dumps(completion_body()), headers={"Content-Type": content_type})
    assert response.status_code == 200


def test_a_foreign_page_is_refused_without_a_key(http: httpx.Client, fake: FakeInference) -> None:
    # NOTE: what a page on evil.example could send to 127.0.0.1 with fetch(): before, a 200
    for content_type in ("text/plain", "application/json"):
        headers = {"Origin": EVIL, "Content-Type": content_type}
        error = error_of(http.post(CHAT, content=json.dumps(chat_body()), headers=headers), 403)
        assert error["code"] == "origin_not_allowed" and "allowed_origins" in error["message"]
    assert error_of(http.get("/v1/models", headers={"Origin": EVIL}), 403)["code"] == "origin_not_allowed"
    assert error_of(http.post(CHAT, json=chat_body(), headers={"Origin": "null"}), 403)
    assert fake.requests == []
    assert http.post(CHAT, json=chat_body()).status_code == 200  # curl, SDKs: no Origin


def test_a_listed_origin_gets_cors_answers(listed: httpx.Client) -> None:
    preflight = {"Origin": APP, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type, authorization, x-request-id"}  # fmt: skip
    response = listed.options(CHAT, headers=preflight)
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == APP
    assert "POST" in response.headers["access-control-allow-methods"]
    assert "authorization" in response.headers["access-control-allow-headers"].lower()
    response = listed.post(CHAT, json=chat_body(), headers={"Origin": APP})
    assert response.status_code == 200 and response.headers["access-control-allow-origin"] == APP
    assert "x-request-id" in response.headers["access-control-expose-headers"].lower()
    refused = listed.options(CHAT, headers=preflight | {"Origin": EVIL})
    assert refused.status_code >= 400 and "access-control-allow-origin" not in refused.headers
    assert error_of(listed.post(CHAT, json=chat_body(), headers={"Origin": EVIL}), 403)


def test_with_a_key_the_key_is_the_guard(keyed: httpx.Client) -> None:
    assert keyed.post(CHAT, json=chat_body(), headers={"Origin": EVIL}).status_code == 200
    assert keyed.post(CHAT, json=chat_body(), headers={"Host": "evil.example:8000"}).status_code == 200
    assert error_of(keyed.post(CHAT, json=chat_body(), headers={"Authorization": "Bearer no"}), 401)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "10.0.0.1:8000", "[2001:db8::1]:8000"])
def test_a_foreign_host_on_loopback_is_refused_without_a_key(http: httpx.Client, host: str) -> None:
    # NOTE: DNS rebinding: a page on evil.example, re-resolved to 127.0.0.1, is same-origin: its GETs carry no Origin
    error = error_of(http.get("/v1/models", headers={"Host": host}), 403)
    assert error["code"] == "host_not_allowed"


@pytest.mark.parametrize("host", ["localhost", "localhost:8000", "127.0.0.1:8000", "127.1.2.3", "[::1]:8000",
                                  "app.localhost:8000", "LOCALHOST."])  # fmt: skip
def test_loopback_names_are_served(http: httpx.Client, host: str) -> None:
    assert http.get("/v1/models", headers={"Host": host}).status_code == 200


def test_a_non_loopback_bind_does_not_check_the_host() -> None:
    policy = BrowserPolicy((), is_keyless=True, is_loopback=False)
    assert policy.refusal(None, "my-server.internal:8000") is None
    assert policy.refusal(EVIL, "my-server.internal:8000") is not None


@pytest.mark.parametrize(
    ("text", "origins"),
    [
        ("http://localhost:3000, https://App.Example/", ("http://localhost:3000", "https://app.example")),
        ("http://a.example:80,https://b.example:443", ("http://a.example", "https://b.example")),
        ("http://[::1]:3000", ("http://[::1]:3000",)),
        ("*", ("*",)),
        ("", ()),
    ],
)
def test_allowed_origins_are_read_as_browsers_write_them(text: str, origins: tuple[str, ...]) -> None:
    assert parse_origins(text) == origins


@pytest.mark.parametrize("text", ["localhost:3000", "ftp://a.example", "http://a.example/path", "http://", "null",
                                  "http://a.example:99999"])  # fmt: skip
def test_a_bad_allowed_origin_is_refused_naming_the_setting(text: str) -> None:
    with pytest.raises(ValueError, match="allowed_origins"):
        normal_origin(text)
    with pytest.raises(ValueError, match="allowed_origins"):
        ServerConfig(allowed_origins=text)


def test_the_flag_reaches_the_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFER_ALLOWED_ORIGINS", "http://localhost:5173")
    parser = argparse.ArgumentParser()
    add_gateway_parser(parser.add_subparsers())
    assert config_from_args(parser.parse_args(["gateway"])).allowed_origins == ("http://localhost:5173",)
    args = parser.parse_args(["gateway", "--allowed-origins", "https://a.example,*"])
    assert config_from_args(args).allowed_origins == ("https://a.example", "*")
