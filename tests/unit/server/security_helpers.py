"""TLS and key tests: certificates made on the spot (a CA, a server certificate for 127.0.0.1, a client one),
and the fake inference service behind the real server's interceptor, TLS and options."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from infer.api import pb_grpc
from infer.server.security import ApiKeyInterceptor, ApiKeys, TlsFiles, server_credentials
from tests.unit.server.gateway.gateway_helpers import FakeUpstream, LoopThread


@dataclass(frozen=True)
class Certs:
    ca: str  # PEM files
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str  # a CA that signed none of them


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: str, issuer: str, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None = None) -> str:
    path.with_suffix(".pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        path.with_suffix(".key").write_bytes(pem)
    return str(path.with_suffix(".pem"))


def _ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(name, name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    name: str, ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], is_server: bool
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if is_server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        _builder(name, "test-ca", key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if is_server:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca[1], hashes.SHA256()), key


def make_certs(folder: Path) -> Certs:
    ca = _ca("test-ca")
    server = _leaf("localhost", ca, is_server=True)
    client = _leaf("test-client", ca, is_server=False)
    return Certs(
        ca=_write(folder / "ca", ca[0]),
        server_cert=_write(folder / "server", *server),
        server_key=str(folder / "server.key"),
        client_cert=_write(folder / "client", *client),
        client_key=str(folder / "client.key"),
        other_ca=_write(folder / "other-ca", _ca("other-ca")[0]),
    )


class GuardedUpstream(FakeUpstream):
    """The fake inference service, health and reflection behind the server's interceptor, TLS and options."""

    def __init__(self, keys: ApiKeys | None = None, tls: TlsFiles | None = None, options: Any = ()) -> None:
        super().__init__()
        self.keys, self.tls, self.options = keys, tls, list(options)

    async def start(self) -> None:
        interceptors = [ApiKeyInterceptor(self.keys)] if self.keys else []
        server = grpc.aio.server(interceptors=interceptors, options=self.options)
        pb_grpc.add_InferenceServiceServicer_to_server(self.servicer, server)  # type: ignore[no-untyped-call]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(("infer.v1.InferenceService", reflection.SERVICE_NAME), server)
        if self.tls:
            self.port = server.add_secure_port("127.0.0.1:0", server_credentials(self.tls))
        else:
            self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._server = server
        await self.set_serving(True)


@contextlib.contextmanager
def guarded(loop: LoopThread, **kwargs: Any) -> Iterator[GuardedUpstream]:
    upstream = GuardedUpstream(**kwargs)
    loop.call(upstream.start())
    try:
        yield upstream
    finally:
        loop.call(upstream.stop())
