"""The OpenAI-compatible REST/SSE gateway: a pure gRPC client of the infer.v1 service (no engine import).

app = create_app("127.0.0.1:50051")                    # any ASGI server
await run_gateway("127.0.0.1", 8000, "127.0.0.1:50051")  # uvicorn in this loop, until cancelled

NOTE: the names below are imported on first use (PEP 562): a module of the package (the settings read
`gateway.origins`) must not load the app, its web framework and its schemas into a server that serves no HTTP.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infer.server.gateway.app import (
        DEFAULT_TIMEOUT_S,
        GatewayConfig,
        GatewayServer,
        create_app,
        local_upstream,
        run_gateway,
    )
    from infer.server.gateway.cli import add_gateway_parser

# public name -> the module that defines it
_HOMES = {
    "DEFAULT_TIMEOUT_S": "app",
    "GatewayConfig": "app",
    "GatewayServer": "app",
    "create_app": "app",
    "local_upstream": "app",
    "run_gateway": "app",
    "add_gateway_parser": "cli",
}

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "GatewayConfig",
    "GatewayServer",
    "add_gateway_parser",
    "create_app",
    "local_upstream",
    "run_gateway",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
