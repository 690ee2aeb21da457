"""The OpenAI-compatible REST/SSE gateway: a pure gRPC client of the infer.v1 service (no engine import).

app = create_app("127.0.0.1:50051")                    # any ASGI server
await run_gateway("127.0.0.1", 8000, "127.0.0.1:50051")  # uvicorn in this loop, until cancelled
"""

from infer.server.gateway.app import (
    DEFAULT_TIMEOUT_S,
    GatewayConfig,
    GatewayServer,
    create_app,
    local_upstream,
    run_gateway,
)
from infer.server.gateway.cli import add_gateway_parser

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "GatewayConfig",
    "GatewayServer",
    "add_gateway_parser",
    "create_app",
    "local_upstream",
    "run_gateway",
]
