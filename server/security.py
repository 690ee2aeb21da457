"""TLS files and API keys: how `infer serve` and `infer gateway` guard their doors.

Keys are compared in constant time: the SHA-256 of the offered key against the SHA-256 of every
configured key with `hmac.compare_digest`, all of them every time (no early exit on a match, no
length check that could answer faster).

A key is a tenant (server/tenants.py): the name it has in the keys file (`name: key`), else a label of its own
that does not tell the key, `key-` and the first 8 hex digits of its SHA-256.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import ssl
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from infer.api import API_KEY_METADATA, bearer, bearer_key
from infer.api.credentials import read_file, read_named_keys

# NOTE: probes carry no key: health stays open (it tells only SERVING or not); reflection and the API do not
OPEN_GRPC_PREFIXES = ("/grpc.health.v1.Health/",)
MISSING_KEY = f"missing API key: send the header '{API_KEY_METADATA}: {bearer('<key>')}'"
INVALID_KEY = "invalid API key"
MAX_TENANT_CHARS = 64
TENANT_NAME = re.compile(rf"[\x21-\x7e]{{1,{MAX_TENANT_CHARS}}}\Z")  # a tenant's name: visible ASCII, no space

# a gRPC metadata key that carries text: lowercase, not gRPC's own, not binary (-bin), not the API key's
HEADER_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}\Z")
RESERVED_HEADERS = (API_KEY_METADATA, "te", "content-type", "user-agent", "host", "traceparent", "tracestate")


def check_tenant_name(what: str, name: str) -> None:
    """ValueError naming `what` when `name` cannot be a tenant's."""
    if not TENANT_NAME.match(name):
        raise ValueError(f"{what}: tenant name {name[:80]!r}: must be 1 to {MAX_TENANT_CHARS} visible ASCII characters")


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


def _no_password() -> bytes:
    return b""  # NOTE: an encrypted key fails to load, rather than OpenSSL asking for a password on the terminal


def check_tls(tls: TlsFiles) -> None:
    """ValueError naming the setting when a file holds no PEM certificate or key, or the key is not the
    certificate's (OSError when one cannot be read). Checked before listening: grpc and uvicorn report a bad
    certificate only as a failure to listen."""
    pems = {what: read_file(path, what) for what, path in (("tls_key", tls.key_file), ("tls_cert", tls.cert_file))}
    if tls.client_ca_file is not None:
        pems["tls_client_ca"] = read_file(tls.client_ca_file, "tls_client_ca")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    for what in ("tls_cert", "tls_client_ca"):
        if what in pems:
            try:
                context.load_verify_locations(cadata=pems[what].decode("ascii", errors="replace"))
            except (ssl.SSLError, ValueError):
                path = tls.cert_file if what == "tls_cert" else tls.client_ca_file
                raise ValueError(f"{what}: {path} holds no PEM certificate") from None
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file, password=_no_password)
    except ssl.SSLError as e:
        if e.reason == "KEY_VALUES_MISMATCH":
            raise ValueError(f"tls_key: {tls.key_file} is not the private key of tls_cert {tls.cert_file}") from None
        problem = "holds no PEM private key (or one that needs a password, which the server cannot give)"
        raise ValueError(f"tls_key: {tls.key_file} {problem}") from None


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """gRPC server credentials (the files checked first: `check_tls`); client certificates required when a
    client CA is given."""
    check_tls(tls)
    pair = (read_file(tls.key_file, "tls_key"), read_file(tls.cert_file, "tls_cert"))
    client_ca = read_file(tls.client_ca_file, "tls_client_ca") if tls.client_ca_file else None
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=client_ca is not None)


def header_problem(name: str) -> str | None:
    """Why `name` cannot be the tenant header, or None."""
    if not HEADER_NAME.match(name):
        return "must be a lowercase header name: letters, digits, '-', '_', '.' (at most 64)"
    if name.startswith("grpc-") or name.endswith("-bin") or name in RESERVED_HEADERS:
        return f"{name!r} is reserved (gRPC's own, binary, or another meaning)"
    return None


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def key_label(digest: bytes) -> str:
    """The tenant of a key without a name: stable, and no help in guessing the key."""
    return f"key-{digest.hex()[:8]}"


class ApiKeys:
    """The accepted API keys and their tenants; `is_valid` and `tenant_of` in constant time. A key is a string
    (no name: its own tenant) or a (name, key) pair; several keys may share a name (one tenant)."""

    def __init__(self, keys: Iterable[str | tuple[str | None, str]]) -> None:
        pairs = [(None, k.strip()) if isinstance(k, str) else (k[0], k[1].strip()) for k in keys]
        if not pairs or any(not k or any(c.isspace() for c in k) for _, k in pairs):
            raise ValueError("api_key: keys must be non-empty and contain no whitespace")
        for name, _ in pairs:
            if name is not None:
                check_tenant_name("api_keys_file", name)
        self._digests = tuple(_digest(k) for _, k in pairs)
        self._tenants = tuple(name or key_label(d) for (name, _), d in zip(pairs, self._digests, strict=True))
        self.names = frozenset(name for name, _ in pairs if name is not None)  # the tenants the keys file names

    def __len__(self) -> int:
        return len(self._digests)

    @classmethod
    def from_settings(cls, api_key: str | None, api_keys_file: str | None) -> ApiKeys | None:
        """`api_key`: one key or several, comma-separated (no names); `api_keys_file`: one a line, `name: key` to
        name its tenant (# comments). None: open."""
        keys: list[str | tuple[str | None, str]] = [k for k in (api_key or "").split(",") if k.strip()]
        if api_key is not None and not keys:
            raise ValueError("api_key: no key given")
        if api_keys_file is not None:
            keys += read_named_keys(api_keys_file, "api_keys_file")
        return cls(keys) if keys else None

    def is_valid(self, key: str) -> bool:
        return self.tenant_of(key) is not None

    def tenant_of(self, key: str) -> str | None:
        """The tenant of a valid key (its name, else its label); None for a key that is not one of these."""
        offered = _digest(key)
        tenant = None
        for digest, name in zip(self._digests, self._tenants, strict=True):  # NOTE: every key, every time
            if hmac.compare_digest(digest, offered):
                tenant = name
        return tenant

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
