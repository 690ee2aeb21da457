"""The gateway's ASGI app, and a uvicorn server for it that runs in any asyncio loop and stops on cancel."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from infer.api import DEFAULT_ADDRESS
from infer.clients.channel import ClientTls
from infer.server.gateway.errors import APIError, handle_api_error, handle_http_exception, handle_unexpected
from infer.server.gateway.guard import INCOMPLETE_HEAD_BYTES, Drain, Guard, HttpLimits
from infer.server.gateway.metrics import GatewayMetrics, MetricsMiddleware
from infer.server.gateway.origins import BrowserPolicy, cors, is_loopback_address
from infer.server.gateway.protocol import with_header_timeout
from infer.server.gateway.routes import Routes
from infer.server.gateway.upstream import Upstream
from infer.server.metrics_http import start_metrics_server
from infer.server.security import ApiKeys, TlsFiles, check_tls, header_problem

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 600.0  # gRPC deadline of one generation; DEADLINE_EXCEEDED -> HTTP 504
DEFAULT_MAX_STREAMS = 100  # `infer serve`'s max_streams_per_connection default


def create_app(upstream: str, *, model_id: str | None = None, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> ASGIApp:
    """The OpenAI-compatible ASGI app in front of the infer.v1 gRPC server at `upstream` (host:port).

    `model_id`: the model name clients use (default: the server's model id); `timeout_s`: the deadline
    of each generation (None = none). `app_for` takes the whole GatewayConfig (TLS upstream, keys, limits).
    """
    return app_for(GatewayConfig(upstream=upstream, model_id=model_id, timeout_s=timeout_s))


def app_for(config: GatewayConfig) -> ASGIApp:
    """The ASGI app of a GatewayConfig (its listener settings aside: those are GatewayServer's)."""
    client = Upstream(config.upstream, config.timeout_s, config.upstream_tls, config.upstream_max_streams)
    metrics = GatewayMetrics()
    routes = Routes(client, metrics, config.model_id, config.tenant_header)
    policy = BrowserPolicy(config.allowed_origins, config.api_keys is None, is_loopback_address(config.host))
    drain = Drain()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await client.close()

    metrics_route = (
        [Route("/metrics", _metrics_endpoint(config.metrics), methods=["GET"])] if config.metrics is not None else []
    )
    app = Starlette(
        routes=[
            *metrics_route,
            Route("/v1/completions", routes.completions, methods=["POST"]),
            Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
            Route("/v1/completions/render", routes.render_completions, methods=["POST"]),
            Route("/v1/chat/completions/render", routes.render_chat_completions, methods=["POST"]),
            Route("/v1/models", routes.models, methods=["GET"]),
            Route("/v1/models/{model:path}", routes.model, methods=["GET"]),
            Route("/health", routes.health, methods=["GET"]),
        ],
        middleware=[
            Middleware(MetricsMiddleware, metrics=metrics),
            *cors(config.allowed_origins),
            Middleware(Guard, keys=config.api_keys, limits=config.limits, policy=policy, drain=drain),
        ],
        exception_handlers={
            APIError: handle_api_error,
            HTTPException: handle_http_exception,
            Exception: handle_unexpected,
        },
        lifespan=lifespan,
    )
    app.state.metrics, app.state.upstream, app.state.drain = metrics, client, drain
    return app


def _metrics_endpoint(registry: CollectorRegistry) -> Callable[[Request], Awaitable[Response]]:
    async def metrics(request: Request) -> Response:
        """GET /metrics (`metrics`): the registry in Prometheus' text format, rendered off the event loop."""
        body = await asyncio.to_thread(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return metrics


@dataclass(frozen=True)
class GatewayConfig:
    upstream: str = DEFAULT_ADDRESS  # the gRPC server, host:port
    host: str = "127.0.0.1"
    http_port: int = 8000  # 0 = any free port
    model_id: str | None = None
    timeout_s: float | None = DEFAULT_TIMEOUT_S
    shutdown_grace_s: float = 30.0  # on stop: how long open responses may take to finish
    metrics_port: int | None = None  # Prometheus /metrics on its own port (0 = any free one); None: none
    access_log: bool = False
    tls: TlsFiles | None = None  # HTTPS; with a client CA, clients must show a certificate
    upstream_tls: ClientTls | None = None  # reach the gRPC server over TLS
    # the gRPC server's streams per connection (its max_streams_per_connection): past them, another connection
    upstream_max_streams: int = DEFAULT_MAX_STREAMS
    api_keys: ApiKeys | None = field(default=None, repr=False)  # None: open (the upstream may still check)
    limits: HttpLimits = field(default_factory=HttpLimits)
    allowed_origins: tuple[str, ...] = ()  # browser origins let in without a key, and given CORS (origins.py)
    tenant_header: str | None = None  # forwarded to the upstream, which reads the tenant from it (`infer serve`'s)
    # also served at GET /metrics on the HTTP port, open like /health (`infer serve --http-metrics`); None: not
    metrics: CollectorRegistry | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.http_port < 65536:
            raise ValueError("http_port: must be in [0, 65535]")
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise ValueError("metrics_port: must be in [0, 65535]")
        if self.metrics_port and self.metrics_port == self.http_port:
            raise ValueError("metrics_port: must differ from http_port (/metrics stays off the public port)")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError("timeout_s: must be > 0")
        if self.shutdown_grace_s < 0:
            raise ValueError("shutdown_grace_s: must be >= 0")
        if self.upstream_max_streams < 1:
            raise ValueError("upstream_max_streams: must be >= 1")
        BrowserPolicy(self.allowed_origins)  # ValueError naming allowed_origins
        if self.tenant_header is not None and (problem := header_problem(self.tenant_header)):
            raise ValueError(f"tenant_header: {problem}")


def local_upstream(grpc_host: str, grpc_port: int) -> str:
    """The address to reach a gRPC server listening on grpc_host:grpc_port from the same machine."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(grpc_host, grpc_host)
    return f"[{host}]:{grpc_port}" if ":" in host else f"{host}:{grpc_port}"


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, handshake_timeout_s: float) -> None:
        super().__init__(config)
        self.handshake_timeout_s = handshake_timeout_s

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup, with the TLS handshake bounded like the request headers (asyncio's default: 60 s)."""
        if self.config.ssl is None or sockets is None:
            await super().startup(sockets)
            return
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            raise RuntimeError("the gateway's startup failed")
        config, loop = self.config, asyncio.get_running_loop()

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )

        self.servers = [
            await loop.create_server(protocol, sock=sock, ssl=config.ssl, backlog=config.backlog,
                                     ssl_handshake_timeout=self.handshake_timeout_s)
            for sock in sockets
        ]  # fmt: skip
        self.started = True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # NOTE: signals belong to whoever runs the loop (`infer serve` also runs the gRPC server); we stop on cancel
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        reaper = asyncio.create_task(self._abort_closed_tls())
        try:
            await super().shutdown(sockets)
        finally:
            reaper.cancel()

    async def _abort_closed_tls(self) -> None:
        """Drop TLS connections that uvicorn has closed once their bytes are out.

        A closed TLS transport waits for the peer's close_notify (asyncio: up to 30 s), which a client idling
        on a kept-alive connection never sends; shutdown would wait for it until the grace ran out.
        """
        while True:
            for connection in list(self.server_state.connections):
                transport = getattr(connection, "transport", None)
                if isinstance(transport, asyncio.Transport) and transport.is_closing() and _flushed_tls(transport):
                    transport.abort()
            await asyncio.sleep(0.05)


def _flushed_tls(transport: asyncio.Transport) -> bool:
    if transport.get_extra_info("sslcontext") is None:
        return False
    # NOTE: asyncio keeps the TCP transport under the TLS one private; without it, the TLS buffer alone
    raw = getattr(getattr(transport, "_ssl_protocol", None), "_transport", None)
    pending = transport.get_write_buffer_size() + (raw.get_write_buffer_size() if raw is not None else 0)
    return pending == 0


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port} (in use?): {e}") from None
    return sock


def _ssl_options(tls: TlsFiles | None) -> dict[str, Any]:
    if tls is None:
        return {}
    check_tls(tls)  # NOTE: an error naming the setting (OSError, ValueError), not ssl's bare errno or PEM lib
    required = {"ssl_ca_certs": tls.client_ca_file, "ssl_cert_reqs": ssl.CERT_REQUIRED} if tls.client_ca_file else {}
    return {"ssl_certfile": tls.cert_file, "ssl_keyfile": tls.key_file, **required}


class GatewayServer:
    """The gateway on uvicorn, in the running asyncio loop: `start`, then `stop` (graceful)."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.app = app_for(config)
        self.metrics: GatewayMetrics = self.app.state.metrics  # type: ignore[attr-defined]
        self.drain: Drain = self.app.state.drain  # type: ignore[attr-defined]
        self.port = 0
        self.metrics_port: int | None = None
        self._metrics_http: Any = None
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Listen on host:http_port (its port in `port`) and serve until `stop`."""
        cfg = self.config
        sock = _listen(cfg.host, cfg.http_port)
        self.port = int(sock.getsockname()[1])
        uv_config = uvicorn.Config(
            self.app, log_config=None, lifespan="on", access_log=cfg.access_log,
            timeout_graceful_shutdown=max(int(cfg.shutdown_grace_s), 1),
            http=with_header_timeout(cfg.limits.header_timeout_s), h11_max_incomplete_event_size=INCOMPLETE_HEAD_BYTES,
            **_ssl_options(cfg.tls),
        )  # fmt: skip
        self._server = _Server(uv_config, cfg.limits.header_timeout_s)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="gateway")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it failed
                raise RuntimeError("the gateway stopped while starting")
            await asyncio.sleep(0.01)
        scheme = "https" if cfg.tls else "http"
        logger.info("OpenAI gateway on %s://%s:%d/v1 -> gRPC %s", scheme, cfg.host, self.port, cfg.upstream)
        if cfg.metrics_port is not None:
            try:
                self._serve_metrics(cfg.host, cfg.metrics_port)
            except OSError:
                await self.stop()
                raise

    def _serve_metrics(self, host: str, port: int) -> None:
        try:
            # NOTE: bounded like the other doors (metrics_http.py): prometheus_client's own server has no timeouts
            header_timeout_s = self.config.limits.header_timeout_s
            self._metrics_http = start_metrics_server(self.metrics.registry, host, port, header_timeout_s)
        except OSError as e:
            raise OSError(f"cannot serve the gateway's metrics on {host}:{port} (in use?): {e}") from None
        self.metrics_port = int(self._metrics_http.server_port)
        logger.info("gateway metrics on http://%s:%d/metrics", host, self.metrics_port)

    async def wait(self) -> None:
        """Until the server stops."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def run(self) -> None:
        """Start, serve until cancelled (or until uvicorn stops by itself), then stop gracefully."""
        await self.start()
        try:
            await self.wait()
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Drain: new requests get 503 with Retry-After while open responses finish (up to shutdown_grace_s, then
        they are cancelled); then the listener closes."""
        if self._server is None or self._task is None:
            return
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + self.config.shutdown_grace_s
        if not await self.drain.drain(self.config.shutdown_grace_s):
            logger.warning("gateway drain: %d requests still open after %.1f s; cancelling them",
                           self.drain.num_in_flight, self.config.shutdown_grace_s)  # fmt: skip
        # NOTE: uvicorn's own wait for open responses gets what is left of the grace
        self._server.config.timeout_graceful_shutdown = math.ceil(max(0.0, deadline_s - loop.time()))
        self._server.should_exit = True
        await self._task
        self._server = self._task = None
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
            self._metrics_http = None
        logger.info("gateway stopped")


async def run_gateway(
    host: str,
    port: int,
    upstream: str,
    *,
    model_id: str | None = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    shutdown_grace_s: float = 30.0,
) -> None:
    """Serve the gateway until cancelled (`asyncio.run` cancels on SIGINT), then stop gracefully."""
    await GatewayServer(GatewayConfig(upstream, host, port, model_id, timeout_s, shutdown_grace_s)).run()
