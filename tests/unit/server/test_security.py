"""API keys (constant-time, on gRPC metadata), TLS and mTLS on a gRPC server, and the gRPC limits from the settings."""

from __future__ import annotations

import hmac
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from infer.api import pb, pb_grpc
from infer.clients.channel import ClientTls, channel, read_keys, with_api_key
from infer.engine import InputProcessor, Prompt, SamplingParams
from infer.server import security
from infer.server.app import InferenceServer, grpc_options
from infer.server.gateway.app import _ssl_options
from infer.server.limits import RequestLimits
from infer.server.security import ApiKeys, TlsFiles, server_credentials
from infer.server.settings import ServerConfig
from tests.helpers.fake_engine import tiny_tokenizer
from tests.unit.server.gateway.gateway_helpers import LoopThread
from tests.unit.server.security_helpers import Certs, guarded

KEYS = ("key-one", "key-two-longer")


def _info(address: str, tls: ClientTls | None = None, api_key: str | None = None) -> pb.GetModelInfoResponse:
    with channel(address, tls) as ch:
        stub = pb_grpc.InferenceServiceStub(ch)  # type: ignore[no-untyped-call]
        return stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10, metadata=with_api_key((), api_key))


def _code(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


# keys


def test_keys_from_a_flag_and_a_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# ops\nfile-key\n\n  other-key  \n")
    keys = ApiKeys.from_settings("a, b", str(path))
    assert keys is not None and len(keys) == 4
    assert all(keys.is_valid(k) for k in ("a", "b", "file-key", "other-key"))
    assert not keys.is_valid("# ops") and not keys.is_valid("") and not keys.is_valid("a, b")
    assert ApiKeys.from_settings(None, None) is None
    for bad in ("", " , "):
        with pytest.raises(ValueError, match="api_key"):
            ApiKeys.from_settings(bad, None)
    path.write_text("# nothing\n")
    with pytest.raises(ValueError, match="api_keys_file"):
        ApiKeys.from_settings(None, str(path))
    with pytest.raises(OSError, match="api_keys_file: cannot read"):
        ApiKeys.from_settings(None, str(tmp_path / "missing"))


def test_a_keys_file_names_tenants(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# team keys\nteam-a: sk-a\nteam-a:   sk-a-rotated\nsk:with:colons\nteam-b: sk-b\n")
    keys = ApiKeys.from_settings("flag-key", str(path))
    assert keys is not None and len(keys) == 5
    assert [keys.tenant_of(k) for k in ("sk-a", "sk-a-rotated", "sk-b")] == ["team-a", "team-a", "team-b"]
    unnamed = {keys.tenant_of("sk:with:colons"), keys.tenant_of("flag-key")}  # a one-word line is a key, colons and all
    assert all(t is not None and t.startswith("key-") and len(t) == 12 for t in unnamed) and len(unnamed) == 2
    assert keys.tenant_of("team-a:") is None and not keys.is_valid("team-a: sk-a")
    assert read_keys(str(path), "api_key_file")[0] == "sk-a"  # what `infer client --api-key-file` sends


@pytest.mark.parametrize("line", ["team-a sk-a", "team-a: sk-a extra", ": sk-a", "a: b: c"])
def test_a_keys_file_line_that_is_neither_is_refused_naming_the_line_not_the_key(tmp_path: Path, line: str) -> None:
    path = tmp_path / "keys"
    path.write_text(f"good-key\n{line}\n")
    with pytest.raises(ValueError, match=r"api_keys_file: .*keys line 2: expected a key, or 'name: key'") as e:
        ApiKeys.from_settings(None, str(path))
    assert "sk-a" not in str(e.value)


def test_every_key_is_compared_in_constant_time_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    original = hmac.compare_digest

    def compare_digest(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return original(a, b)

    monkeypatch.setattr(security.hmac, "compare_digest", compare_digest)
    keys = ApiKeys(KEYS)
    for offered, valid in ((KEYS[0], True), (KEYS[1], True), ("k", False), ("x" * 500, False)):
        calls.clear()
        assert keys.is_valid(offered) is valid
        assert len(calls) == len(KEYS)  # no early exit on a match
        assert all(len(a) == len(b) == 32 for a, b in calls)  # digests: the offered key's length is never compared


def test_refusal_reads_the_bearer_header() -> None:
    keys = ApiKeys(KEYS)
    assert keys.refusal(f"Bearer {KEYS[0]}") is None and keys.refusal(f"bearer {KEYS[1]}") is None
    assert keys.refusal(None) == keys.refusal("") == keys.refusal(f"Basic {KEYS[0]}") == security.MISSING_KEY
    assert keys.refusal("Bearer nope") == keys.refusal(f"Bearer {KEYS[0]}x") == security.INVALID_KEY


def test_grpc_needs_a_key_except_health(loop: LoopThread) -> None:
    with guarded(loop, keys=ApiKeys(KEYS)) as server:
        assert _info(server.address, api_key=KEYS[1]).model_id == "fake-model"
        code, details = _code(lambda: _info(server.address))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "authorization: Bearer" in details
        code, details = _code(lambda: _info(server.address, api_key="wrong"))
        assert code == grpc.StatusCode.UNAUTHENTICATED and details == "invalid API key"
        with channel(server.address) as ch:
            stream = pb_grpc.InferenceServiceStub(ch).Generate(pb.GenerateRequest(prompt="Hi"))  # type: ignore[no-untyped-call]
            assert _code(lambda: list(stream))[0] == grpc.StatusCode.UNAUTHENTICATED
            health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            reflect = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(iter([request]), timeout=10)
            assert _code(lambda: list(reflect))[0] == grpc.StatusCode.UNAUTHENTICATED
    assert not server.servicer.requests  # refused before the servicer


# TLS


def test_tls_settings_come_in_pairs() -> None:
    assert TlsFiles.from_settings(None, None, None) is None
    with pytest.raises(ValueError, match="tls_cert and tls_key"):
        ServerConfig(tls_cert="cert.pem")
    with pytest.raises(ValueError, match="tls_client_ca"):
        ServerConfig(tls_client_ca="ca.pem")


def test_grpc_over_tls(loop: LoopThread, certs: Certs) -> None:
    with guarded(loop, tls=TlsFiles(certs.server_cert, certs.server_key)) as server:
        assert _info(server.address, ClientTls(ca_file=certs.ca)).model_id == "fake-model"
        assert _code(lambda: _info(server.address))[0] == grpc.StatusCode.UNAVAILABLE  # plaintext
        assert _code(lambda: _info(server.address, ClientTls(ca_file=certs.other_ca)))[0] == grpc.StatusCode.UNAVAILABLE


def test_mtls_refuses_a_client_without_a_certificate(loop: LoopThread, certs: Certs) -> None:
    with guarded(loop, tls=TlsFiles(certs.server_cert, certs.server_key, certs.ca)) as server:
        code, _ = _code(lambda: _info(server.address, ClientTls(ca_file=certs.ca)))
        assert code == grpc.StatusCode.UNAVAILABLE
        with_cert = ClientTls(ca_file=certs.ca, cert_file=certs.client_cert, key_file=certs.client_key)
        assert _info(server.address, with_cert).model_id == "fake-model"


def test_unreadable_tls_files_name_the_setting(tmp_path: Path) -> None:
    with pytest.raises(OSError, match=r"tls_key: cannot read .*nope\.key"):
        server_credentials(TlsFiles(str(tmp_path / "nope.pem"), str(tmp_path / "nope.key")))


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (lambda c, junk: (junk, c.server_key, None), r"tls_cert: .*junk\.pem holds no PEM certificate"),
        (lambda c, junk: (c.server_key, c.server_key, None), r"tls_cert: .*server\.key holds no PEM certificate"),
        (lambda c, junk: (c.server_cert, junk, None), r"tls_key: .*junk\.pem holds no PEM private key"),
        (lambda c, junk: (c.server_cert, c.client_key, None), r"tls_key: .*client\.key is not the private key of"),
        (lambda c, junk: (c.server_cert, c.server_key, junk), r"tls_client_ca: .*junk\.pem holds no PEM certificate"),
    ],
)
def test_a_bad_certificate_is_named_before_listening(
    loop: LoopThread, certs: Certs, tmp_path: Path, files: Any, message: str
) -> None:
    """Not "cannot listen on 0.0.0.0:50051 (in use?)", which grpc's failure to listen with it used to read as."""
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    cert, key, client_ca = files(certs, str(junk))
    config = ServerConfig(grpc_port=0, http_port=None, metrics_port=None, tls_cert=cert, tls_key=key,
                          tls_client_ca=client_ca)  # fmt: skip
    server = InferenceServer(config)
    with pytest.raises(ValueError, match=message):
        loop.call(server.start())
    assert server.port == 0  # nothing listened
    with pytest.raises(ValueError, match=message):  # `infer gateway`'s HTTPS too
        _ssl_options(TlsFiles(cert, key, client_ca))


# limits


def test_request_limits_name_the_setting() -> None:
    """The limits the engine's input processor checks carry the server setting that sets each."""
    limits = RequestLimits(max_prompt_tokens=10, max_output_tokens=5).bounds(2048).engine
    processor = InputProcessor(tiny_tokenizer(), 2048, 330)
    processor.process(Prompt(token_ids=[5] * 10), SamplingParams(max_tokens=5), limits)
    with pytest.raises(ValueError, match=r"^prompt: 11 tokens exceeds max_prompt_tokens \(10; .*--max-prompt-tokens"):
        processor.process(Prompt(token_ids=[5] * 11), SamplingParams(max_tokens=5), limits)
    with pytest.raises(ValueError, match=r"^sampling.max_tokens: 6 exceeds max_output_tokens \(5; .*INFER_MAX_OUT"):
        processor.process(Prompt(token_ids=[5] * 10), SamplingParams(max_tokens=6), limits)
    unbounded = RequestLimits().bounds(2048).engine
    processor.process(Prompt(token_ids=[5] * 1000), SamplingParams(max_tokens=1048), unbounded)


def test_grpc_refuses_messages_over_max_request_bytes(loop: LoopThread) -> None:
    options = grpc_options(ServerConfig(max_request_bytes=4096))
    with guarded(loop, options=options) as server, channel(server.address) as ch:
        stub = pb_grpc.InferenceServiceStub(ch)  # type: ignore[no-untyped-call]
        assert len(list(stub.Generate(pb.GenerateRequest(prompt="x" * 4000), timeout=10))) == 4
        code, _ = _code(lambda: list(stub.Generate(pb.GenerateRequest(prompt="x" * 5000), timeout=10)))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_streams_past_the_per_connection_limit_wait(loop: LoopThread) -> None:
    options = grpc_options(ServerConfig(max_streams_per_connection=1))
    with guarded(loop, options=options) as server, channel(server.address) as ch:
        stub = pb_grpc.InferenceServiceStub(ch)  # type: ignore[no-untyped-call]
        endless = stub.Generate(pb.GenerateRequest(prompt="endless", request_id="first"), timeout=30)
        next(endless)  # the first stream is open
        second: list[pb.GenerateResponse] = []
        done = threading.Event()

        def run_second() -> None:
            second.extend(stub.Generate(pb.GenerateRequest(prompt="Hi", request_id="second"), timeout=30))
            done.set()

        threading.Thread(target=run_second, daemon=True).start()
        assert not done.wait(1.0)  # held back while the first stream is open
        assert [r.request_id for r in server.servicer.requests] == ["first"]
        endless.cancel()
        assert done.wait(20) and len(second) == 4
