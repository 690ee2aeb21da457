"""`infer gateway`: the OpenAI-compatible HTTP API in front of a running gRPC server."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any

from infer.server.gateway.app import DEFAULT_TIMEOUT_S, GatewayConfig, GatewayServer


def _optional_seconds(text: str) -> float | None:
    return None if text.lower() in ("", "none", "0") else float(text)


def _flag(parser: argparse.ArgumentParser, flag: str, env: str, default: str, help: str, parse: Any = str) -> None:
    """A flag whose default comes from `env`, else `default`.

    NOTE: the default stays text, which argparse converts only when `infer gateway` is what runs: other
    commands read the same variables their own way (`INFER_HTTP_PORT=off infer serve`).
    """
    raw = os.environ.get(env, default)
    parser.add_argument(flag, type=parse, default=raw or None, help=f"{help} [env {env}; default: {default or 'none'}]")


def add_gateway_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `infer gateway --upstream HOST:PORT [--host 127.0.0.1] [--http-port 8000] ...`."""
    p = sub.add_parser(
        "gateway",
        help="serve the OpenAI HTTP API (/v1/completions, /v1/chat/completions, ...) over a gRPC server",
        description="Each flag is also read from its INFER_* environment variable; a flag wins.",
    )
    _flag(p, "--upstream", "INFER_UPSTREAM", "127.0.0.1:50051", "the infer gRPC server, host:port")
    _flag(p, "--host", "INFER_HOST", "127.0.0.1", "address to listen on (0.0.0.0 for all interfaces)")
    _flag(p, "--http-port", "INFER_HTTP_PORT", "8000", "HTTP port (0 = any free port)", int)
    _flag(p, "--model-id", "INFER_MODEL_ID", "", "the model name clients send (default: the server's model id)")
    timeout = f"{DEFAULT_TIMEOUT_S:g}"
    _flag(
        p,
        "--timeout-s",
        "INFER_GATEWAY_TIMEOUT_S",
        timeout,
        "deadline of each generation (none = no deadline)",
        _optional_seconds,
    )
    _flag(
        p,
        "--shutdown-grace-s",
        "INFER_SHUTDOWN_GRACE_S",
        "30",
        "on SIGTERM, how long open responses may take to finish",
        float,
    )
    p.add_argument("--access-log", action="store_true", help="log every HTTP request")
    p.set_defaults(func=run_gateway_command)


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    return GatewayConfig(
        upstream=args.upstream,
        host=args.host,
        http_port=args.http_port,
        model_id=args.model_id or None,
        timeout_s=args.timeout_s,
        shutdown_grace_s=args.shutdown_grace_s,
        access_log=args.access_log,
    )


async def serve_gateway(config: GatewayConfig) -> None:
    """Serve until SIGTERM or SIGINT, then stop gracefully."""
    server = GatewayServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    serving = asyncio.create_task(server.wait())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    await server.stop()


def run_gateway_command(args: argparse.Namespace) -> int:
    try:
        asyncio.run(serve_gateway(config_from_args(args)))
    except OSError as e:  # a busy port
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
