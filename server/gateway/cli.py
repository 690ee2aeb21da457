"""`infer gateway`: the OpenAI-compatible HTTP API in front of a running gRPC server."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from infer.api import DEFAULT_ADDRESS
from infer.clients.channel import ClientTls
from infer.server.gateway.app import DEFAULT_MAX_STREAMS, DEFAULT_TIMEOUT_S, GatewayConfig, GatewayServer
from infer.server.gateway.guard import HttpLimits
from infer.server.gateway.origins import parse_origins
from infer.server.security import ApiKeys, TlsFiles
from infer.server.signals import run_until_signal

DEFAULT_METRICS_PORT = 9465  # NOTE: not infer serve's 9464, so that both run on one host with their defaults


def _port_or_off(text: str) -> int | None:
    return None if text.lower() in ("off", "none") else int(text)


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
    _flag(p, "--upstream", "INFER_UPSTREAM", DEFAULT_ADDRESS, "the infer gRPC server, host:port")
    _flag(p, "--host", "INFER_HOST", "127.0.0.1", "address to listen on (0.0.0.0 for all interfaces)")
    _flag(p, "--http-port", "INFER_HTTP_PORT", "8000", "HTTP port (0 = any free port)", int)
    _flag(p, "--metrics-port", "INFER_METRICS_PORT", str(DEFAULT_METRICS_PORT),
          "Prometheus /metrics port, never the HTTP one (0 = any free port, off = none)", _port_or_off)  # fmt: skip
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
    _add_security_flags(p)
    _add_limit_flags(p)
    p.set_defaults(func=run_gateway_command)


def _add_security_flags(p: argparse.ArgumentParser) -> None:
    """TLS on the HTTP listener and to the upstream; API keys (the same INFER_* variables as `infer serve`)."""
    _flag(p, "--tls-cert", "INFER_TLS_CERT", "", "HTTPS: certificate chain (PEM); needs --tls-key")
    _flag(p, "--tls-key", "INFER_TLS_KEY", "", "HTTPS: private key (PEM)")
    _flag(p, "--tls-client-ca", "INFER_TLS_CLIENT_CA", "", "mTLS: require client certificates signed by this CA")
    _flag(p, "--api-key", "INFER_API_KEY", "", "API key(s), comma-separated (also forwarded: the upstream checks)")
    _flag(p, "--api-keys-file", "INFER_API_KEYS_FILE", "", "a file of API keys, one a line (# comments)")
    _flag(p, "--allowed-origins", "INFER_ALLOWED_ORIGINS", "",
          "browser origins that may call the API (CORS), comma-separated, * = any; without an API key, "
          "requests from other origins are refused")  # fmt: skip
    _flag(p, "--tenant-header", "INFER_TENANT_HEADER", "",
          "forward this header (lowercase) to the upstream, whose --tenant-header it must be: the tenant of a "
          "keyless upstream")  # fmt: skip
    _flag(p, "--upstream-tls-ca", "INFER_UPSTREAM_TLS_CA", "", "TLS to the upstream, trusting this CA (PEM)")
    p.add_argument("--upstream-tls", action="store_true", help="TLS to the upstream, trusting the system's roots")
    _flag(p, "--upstream-tls-cert", "INFER_UPSTREAM_TLS_CERT", "", "mTLS to the upstream: client certificate")
    _flag(p, "--upstream-tls-key", "INFER_UPSTREAM_TLS_KEY", "", "mTLS to the upstream: client private key")
    _flag(p, "--upstream-tls-server-name", "INFER_UPSTREAM_TLS_SERVER_NAME", "",
          "the name the upstream's certificate carries, when not the --upstream host")  # fmt: skip


def _add_limit_flags(p: argparse.ArgumentParser) -> None:
    d = HttpLimits()
    _flag(p, "--max-request-bytes", "INFER_MAX_REQUEST_BYTES", str(d.max_request_bytes), "largest body (413)", int)
    _flag(p, "--http-header-timeout-s", "INFER_HTTP_HEADER_TIMEOUT_S", f"{d.header_timeout_s:g}",
          "a request's headers must arrive within this (408)", float)  # fmt: skip
    _flag(p, "--http-body-timeout-s", "INFER_HTTP_BODY_TIMEOUT_S", f"{d.body_timeout_s:g}",
          "a request's body must arrive within this (408)", float)  # fmt: skip
    _flag(p, "--max-streams-per-connection", "INFER_MAX_STREAMS_PER_CONNECTION", str(DEFAULT_MAX_STREAMS),
          "the upstream's --max-streams-per-connection: when every connection to it carries this many streams, "
          "another is opened (streams never wait behind the cap, ahead of its scheduler)", int)  # fmt: skip


def _upstream_tls(args: argparse.Namespace) -> ClientTls | None:
    if not (args.upstream_tls or args.upstream_tls_ca or args.upstream_tls_cert):
        return None
    return ClientTls(args.upstream_tls_ca, args.upstream_tls_cert, args.upstream_tls_key, args.upstream_tls_server_name)


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    return GatewayConfig(
        upstream=args.upstream,
        host=args.host,
        http_port=args.http_port,
        model_id=args.model_id or None,
        timeout_s=args.timeout_s,
        shutdown_grace_s=args.shutdown_grace_s,
        metrics_port=args.metrics_port,
        access_log=args.access_log,
        tls=TlsFiles.from_settings(args.tls_cert, args.tls_key, args.tls_client_ca),
        upstream_tls=_upstream_tls(args),
        upstream_max_streams=args.max_streams_per_connection,
        api_keys=ApiKeys.from_settings(args.api_key, args.api_keys_file),
        limits=HttpLimits(args.max_request_bytes, args.http_header_timeout_s, args.http_body_timeout_s),
        allowed_origins=parse_origins(args.allowed_origins),
        tenant_header=args.tenant_header.strip().lower() if args.tenant_header else None,
    )


async def serve_gateway(config: GatewayConfig) -> None:
    """Serve until SIGTERM or SIGINT, then stop gracefully."""
    await run_until_signal(GatewayServer(config).run())


def run_gateway_command(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except (OSError, ValueError) as e:  # an unreadable keys file, half a key pair
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve_gateway(config))
    except OSError as e:  # a busy port, an unreadable certificate
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # a certificate or key that is not one, a key not the certificate's
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
