"""Browsers and the keyless default: the cross-site requests the gateway refuses, CORS for the listed origins.

Without an API key, whatever reaches the port may use the API, and a web page open in a browser on the same
machine reaches 127.0.0.1. Browsers mark what a page sends: `Origin` on every cross-origin request and on
every POST (curl and the SDKs send none). So, with no API key configured:

- `Origin` not in allowed_origins: 403. CORS alone would not do: a "simple" cross-site POST
  (`Content-Type: text/plain`) runs before the browser hides its answer.
- Listening on a loopback address, a `Host` that does not name this machine: 403. DNS rebinding (evil.example
  re-resolved to 127.0.0.1) makes a page same-origin with the server, so its GETs carry no `Origin`; they do
  carry `Host: evil.example`.

With a key, the key is the guard (a page cannot know it). Listed origins get CORS answers either way.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from infer.server.gateway.errors import APIError

ANY_ORIGIN = "*"
_DEFAULT_PORTS = {"http": 80, "https": 443}  # a browser leaves the default port out of `Origin`
CORS_MAX_AGE_S = 600


def normal_origin(text: str) -> str:
    """`scheme://host[:port]`, as a browser writes it in `Origin` (lower case, no default port); else ValueError."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        raise ValueError(f"allowed_origins: {text!r} is not an origin (scheme://host[:port])") from None
    is_bare = parts.path in ("", "/") and not (parts.query or parts.fragment or parts.username)
    if parts.scheme.lower() not in _DEFAULT_PORTS or not parts.hostname or not is_bare:
        raise ValueError(f"allowed_origins: {text!r} is not an origin (scheme://host[:port])")
    scheme, host = parts.scheme.lower(), parts.hostname.lower()
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}" if port in (None, _DEFAULT_PORTS[scheme]) else f"{scheme}://{host}:{port}"


def parse_origins(text: str | None) -> tuple[str, ...]:
    """The allowed_origins setting: origins, comma-separated, or `*` for any."""
    names = [name.strip() for name in (text or "").split(",") if name.strip()]
    return tuple(name if name == ANY_ORIGIN else normal_origin(name) for name in names)


def _is_loopback_ip(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def is_loopback_address(host: str) -> bool:
    """Whether a listen address (`127.0.0.1`, `::1`, `localhost`) takes connections from this machine only."""
    return host.lower() == "localhost" or _is_loopback_ip(host.strip("[]"))


def is_loopback_name(host_header: str) -> bool:
    """Whether a `Host` value names this machine: localhost, *.localhost (RFC 6761), a loopback IP."""
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")]
    elif host.count(":") == 1:
        host = host.split(":")[0]
    host = host.rstrip(".")
    return host == "localhost" or host.endswith(".localhost") or _is_loopback_ip(host)


@dataclass(frozen=True)
class BrowserPolicy:
    """What the gateway's Guard asks of a request's `Origin` and `Host`."""

    allowed_origins: tuple[str, ...] = ()  # normal_origin()s, or ANY_ORIGIN
    is_keyless: bool = True  # no API key configured: Origin (and on loopback, Host) are checked
    is_loopback: bool = False  # listening on a loopback address

    def __post_init__(self) -> None:
        for origin in self.allowed_origins:
            if origin != ANY_ORIGIN and normal_origin(origin) != origin:
                raise ValueError(f"allowed_origins: write {origin!r} as {normal_origin(origin)!r}")

    def refusal(self, origin: str | None, host: str | None) -> APIError | None:
        if not self.is_keyless:
            return None
        if self.is_loopback and host is not None and not is_loopback_name(host):
            message = (f"Host {host[:100]!r} refused: a server on a loopback address without an API key answers "
                       "only requests for localhost or a loopback IP (DNS rebinding). Configure an API key to "
                       "serve other names")  # fmt: skip
            return APIError(403, message, code="host_not_allowed")
        if origin is not None and not self.allows(origin):
            message = (f"cross-origin request from {origin[:100]!r} refused: this server has no API key; list "
                       "the origin in allowed_origins (--allowed-origins) to let its pages call the API")  # fmt: skip
            return APIError(403, message, code="origin_not_allowed")
        return None

    def allows(self, origin: str) -> bool:
        return ANY_ORIGIN in self.allowed_origins or origin.lower() in self.allowed_origins


def cors(allowed_origins: Sequence[str]) -> list[Middleware]:
    """CORS for the listed origins (preflights answered, X-Request-Id readable); none when none is listed."""
    if not allowed_origins:
        return []
    return [
        Middleware(
            CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["GET", "POST"],
            allow_headers=["*"], expose_headers=["X-Request-Id"], max_age=CORS_MAX_AGE_S,
        )
    ]  # fmt: skip
