"""The gateway's limits: body size (413), slow headers and bodies (408, closed, no ERROR log), max_tokens cap."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator

import httpx
import pytest

from infer.server.gateway.guard import HttpLimits
from tests.unit.server.gateway.gateway_helpers import (
    COMPLETIONS,
    FakeInference,
    FakeUpstream,
    LoopThread,
    RunningGateway,
    completion_body,
    error_of,
    running_gateway,
    wait_for,
)

JSON_HEAD = f"POST {COMPLETIONS} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
LIMITS = HttpLimits(max_request_bytes=2048, header_timeout_s=0.5, body_timeout_s=0.5)
READ_TIMEOUT_S = 10  # a bound on every socket read: the server must answer long before


@pytest.fixture(scope="module")
def limited(upstream: FakeUpstream, loop: LoopThread) -> Iterator[RunningGateway]:
    with running_gateway(upstream.address, loop, limits=LIMITS) as gateway:
        yield gateway


@pytest.fixture
def errors(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """The captured logs; the test fails if anything logged an ERROR."""
    caplog.set_level(logging.INFO)
    yield caplog
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def _connect(gateway: RunningGateway) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", gateway.server.port), timeout=READ_TIMEOUT_S)
    sock.settimeout(READ_TIMEOUT_S)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _timeout_error(response: bytes, setting: str) -> None:
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), response
    assert b"connection: close" in head.lower()
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout" and setting in error["message"], error


def test_a_body_over_the_limit_is_refused_by_its_length(limited: RunningGateway, fake: FakeInference) -> None:
    with httpx.Client(base_url=limited.url, timeout=30) as http:
        error = error_of(http.post(COMPLETIONS, json=completion_body(prompt="x" * 3000)), 413)
        assert error["code"] == "request_too_large" and "max_request_bytes" in str(error["message"])
        chunks = (b"x" * 1000 for _ in range(3))  # no Content-Length: chunked
        response = http.post(COMPLETIONS, content=chunks, headers={"Content-Type": "application/json"})
        assert error_of(response, 413)["code"] == "request_too_large"
        assert http.post(COMPLETIONS, json=completion_body(prompt="x" * 1500)).status_code == 200
    assert [len(r.prompt) for r in fake.requests] == [1500]


def test_a_body_shorter_than_its_length_times_out(limited: RunningGateway, errors: pytest.LogCaptureFixture) -> None:
    with _connect(limited) as sock:
        sock.sendall(f"{JSON_HEAD}Content-Length: 100\r\n\r\n".encode() + b'{"model": ')
        _timeout_error(_read_until_closed(sock), "http_body_timeout_s")
    assert "408" in errors.text


def test_partial_headers_time_out(limited: RunningGateway, errors: pytest.LogCaptureFixture) -> None:
    with _connect(limited) as sock:
        sock.sendall(f"POST {COMPLETIONS} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode())
        _timeout_error(_read_until_closed(sock), "http_header_timeout_s")
    wait_for(lambda: "partial request headers" in errors.text)


def test_an_idle_connection_is_closed_without_a_word(limited: RunningGateway, errors: pytest.LogCaptureFixture) -> None:
    with _connect(limited) as sock:
        assert _read_until_closed(sock) == b""


def test_partial_headers_of_a_second_request_time_out(limited: RunningGateway) -> None:
    with _connect(limited) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = b""
        while b'"upstream"' not in first:
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        _timeout_error(_read_until_closed(sock), "http_header_timeout_s")


def test_a_client_gone_mid_body_logs_one_info_line(limited: RunningGateway, errors: pytest.LogCaptureFixture) -> None:
    with _connect(limited) as sock:
        sock.sendall(f"{JSON_HEAD}Content-Length: 100\r\n\r\n".encode() + b'{"model": ')
    wait_for(lambda: "left before sending its whole body" in errors.text)


def test_content_length_with_transfer_encoding_is_400_and_closed(limited: RunningGateway, fake: FakeInference) -> None:
    # NOTE: RFC 9112 6.3: a request smuggling attempt; answer it, then close the connection
    body = json.dumps(completion_body()).encode()
    with _connect(limited) as sock:
        head = f"{JSON_HEAD}Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n\r\n"
        sock.sendall(head.encode() + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
        response = _read_until_closed(sock)  # returns once the server closes
    head, _, error = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"connection: close" in head.lower()
    assert "Transfer-Encoding" in json.loads(error)["error"]["message"]
    assert fake.requests == []


def test_a_large_head_in_pieces_is_431_like_one_in_one_piece(limited: RunningGateway, fake: FakeInference) -> None:
    """h11 alone refuses a head that arrives in pieces past 16 KiB (400, plain text) and takes one that arrives
    whole: its bound is raised past the guard's, which answers 431 either way."""
    head = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: {'a' * 40_000}\r\n\r\n".encode()
    with _connect(limited) as sock:
        for start in range(0, len(head), 8192):
            sock.sendall(head[start : start + 8192])
        response = _read_until_closed(sock)
    assert response.startswith(b"HTTP/1.1 431"), response[:200]


def test_the_metrics_port_times_out_like_the_others(upstream: FakeUpstream, loop: LoopThread) -> None:
    # NOTE: prometheus_client's own server held an idle or slowloris connection (and a thread) for ever
    with running_gateway(upstream.address, loop, limits=LIMITS, metrics_port=0) as gateway:
        port = gateway.server.metrics_port
        assert port is not None
        with socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT_S) as sock:
            assert _read_until_closed(sock) == b""
        with socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT_S) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")
            assert _read_until_closed(sock).startswith(b"HTTP/1.0 408")
        assert "infer_gateway_requests_total" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
