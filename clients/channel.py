"""Channels to an infer server: plaintext or TLS (with a client certificate for mTLS), and the API key header.

secure = ClientTls(ca_file="ca.pem")               # trust this CA; ClientTls() trusts the system's roots
with InferClient("infer.example:50051", tls=secure, api_key="...") as client: ...
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

Metadata = Sequence[tuple[str, str]]


def read_file(path: str, what: str) -> bytes:
    """The bytes of a TLS or keys file; OSError naming the setting when it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise OSError(f"{what}: cannot read {path}: {e.strerror or e}") from None


def read_keys(path: str, what: str) -> list[str]:
    """The API keys of a keys file: one a line; blank lines and `#` comments skipped; ValueError when none."""
    lines = [line.strip() for line in read_file(path, what).decode("utf-8").splitlines()]
    keys = [line for line in lines if line and not line.startswith("#")]
    if not keys:
        raise ValueError(f"{what}: no key in {path}")
    return keys


def _read(path: str | None, what: str) -> bytes | None:
    return None if path is None else read_file(path, what)


@dataclass(frozen=True)
class ClientTls:
    """TLS to the server: trust ca_file (PEM; None = the system's roots); cert_file + key_file for mTLS."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None  # the name the server's certificate must carry, when not the address's host

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls cert_file and key_file: give both, or neither")

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file, "tls ca_file"),
            private_key=_read(self.key_file, "tls key_file"),
            certificate_chain=_read(self.cert_file, "tls cert_file"),
        )

    def options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def channel(address: str, tls: ClientTls | None = None) -> grpc.Channel:
    """A blocking channel: plaintext unless `tls`."""
    if tls is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, tls.credentials(), options=tls.options())


def aio_channel(
    address: str, tls: ClientTls | None = None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.aio.Channel:
    """An asyncio channel (belongs to the running loop): plaintext unless `tls`; `options`: gRPC channel args."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=list(options))
    return grpc.aio.secure_channel(address, tls.credentials(), options=[*tls.options(), *options])


def with_api_key(metadata: Metadata, api_key: str | None) -> Metadata:
    """`metadata` plus `authorization: Bearer <api_key>`, unless it carries one already or there is no key."""
    if api_key is None or any(name == "authorization" for name, _ in metadata):
        return metadata
    return [*metadata, ("authorization", f"Bearer {api_key}")]
