"""TLS files and API keys: how `infer serve` and `infer gateway` guard their doors.

Keys are compared in constant time: the SHA-256 of the offered key against the SHA-256 of every
configured key with `hmac.compare_digest`, all of them every time (no early exit on a match, no
length check that could answer faster).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from infer.api import API_KEY_METADATA, bearer, bearer_key
from infer.api.credentials import read_file, read_keys

# NOTE: probes carry no key: health stays open (it tells only SERVING or not); reflection and the API do not
OPEN_GRPC_PREFIXES = ("/grpc.health.v1.Health/",)
MISSING_KEY = f"missing API key: send the header '{API_KEY_METADATA}: {bearer('<key>')}'"
INVALID_KEY = "invalid API key"


@dataclass(frozen=True)
class TlsFiles:
    """A server's certificate chain and key (PEM); with client_ca_file, clients must show a certificate (mTLS)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    @classmethod
    def from_settings(cls, cert: str | None, key: str | None, client_ca: str | None) -> TlsFiles | None:
        """None when TLS is off; ValueError naming the setting when only a part is given."""
        if cert is None and key is None:
            if client_ca is not None:
                raise ValueError("tls_client_ca: needs tls_cert and tls_key (mTLS is TLS with client certificates)")
            return None
        if cert is None or key is None:
            raise ValueError("tls_cert and tls_key: give both, or neither")
        return cls(cert, key, client_ca)


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """gRPC server credentials; client certificates required when a client CA is given."""
    pair = (read_file(tls.key_file, "tls_key"), read_file(tls.cert_file, "tls_cert"))
    client_ca = read_file(tls.client_ca_file, "tls_client_ca") if tls.client_ca_file else None
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=client_ca is not None)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


class ApiKeys:
    """The accepted API keys; `is_valid` in constant time."""

    def __init__(self, keys: Iterable[str]) -> None:
        keys = [k.strip() for k in keys]
        if not keys or any(not k or any(c.isspace() for c in k) for k in keys):
            raise ValueError("api_key: keys must be non-empty and contain no whitespace")
        self._digests = tuple(_digest(k) for k in keys)

    def __len__(self) -> int:
        return len(self._digests)

    @classmethod
    def from_settings(cls, api_key: str | None, api_keys_file: str | None) -> ApiKeys | None:
        """`api_key`: one key or several, comma-separated; `api_keys_file`: one a line (# comments). None: open."""
        keys = [k for k in (api_key or "").split(",") if k.strip()]
        if api_key is not None and not keys:
            raise ValueError("api_key: no key given")
        if api_keys_file is not None:
            keys += read_keys(api_keys_file, "api_keys_file")
        return cls(keys) if keys else None

    def is_valid(self, key: str) -> bool:
        offered = _digest(key)
        found = False
        for digest in self._digests:  # NOTE: every key, every time: the time taken tells nothing
            found |= hmac.compare_digest(digest, offered)
        return found

    def refusal(self, authorization: str | None) -> str | None:
        """None when the `Authorization` value carries a valid key, else why not."""
        key = bearer_key(authorization)
        if key is None:
            return MISSING_KEY
        return None if self.is_valid(key) else INVALID_KEY


Behaviour = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


def _refuse(message: str) -> Behaviour:
    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return refuse


def _refusing_handler(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that ends the call UNAUTHENTICATED, its request unread."""
    refuse = _refuse(message)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc ships no stubs
    """Every RPC but health needs `authorization: Bearer <key>` metadata, else UNAUTHENTICATED."""

    def __init__(self, keys: ApiKeys) -> None:
        self.keys = keys

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or method.startswith(OPEN_GRPC_PREFIXES):
            return handler
        metadata = handler_call_details.invocation_metadata or ()
        authorization = next((str(v) for k, v in metadata if k == API_KEY_METADATA), None)
        refusal = self.keys.refusal(authorization)
        return handler if refusal is None else _refusing_handler(handler, refusal)
